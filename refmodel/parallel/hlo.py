"""The collectives XLA inserted, read from a compiled program's HLO, against `comms`.

`found(compiled_text)` lists every all-reduce, all-gather, reduce-scatter, all-to-all and
collective-permute (and their async -start forms) with its per-device bytes in nccl-tests'
convention (`refmodel.parallel.comms`): an all-reduce's or all-to-all's result (an
all-to-all of ep operands is one tuple: their sum), an all-gather's result (the gathered
output), a reduce-scatter's result times its group (the input). `check(model, phase, batch,
context)` compiles a sharded model's phase (the very callable the API runs) and compares
count and bytes per kind with `comms.collectives`: the cross-check of the communication
model, as `refmodel.compiler_check` is of the FLOPs.
"""

from __future__ import annotations

import math
import re

import refmodel
from refmodel.parallel import comms
from refmodel.parallel.mesh import degrees

ELEMENT_BYTES = {"pred": 1, "s8": 1, "u8": 1, "f8e4m3fn": 1, "f8e5m2": 1, "s16": 2, "u16": 2,
                 "f16": 2, "bf16": 2, "s32": 4, "u32": 4, "f32": 4, "s64": 8, "u64": 8,
                 "f64": 8}
OPS = ("all-reduce", "all-gather", "reduce-scatter", "all-to-all", "collective-permute")
_LINE = re.compile(r"=\s*(?P<shape>\(.*?\)|\S+)\s+(?P<op>" + "|".join(OPS)
                   + r")(?:-start)?\((?P<rest>.*)$")
_ARRAY = re.compile(r"([a-z0-9]+)\[([0-9,]*)\]")


def shape_bytes(shape: str) -> int:
    """Bytes of an HLO shape, 'f32[1,8,64]{2,1,0}' or a tuple of them."""
    out = 0
    for dtype, dims in _ARRAY.findall(shape):
        if dtype not in ELEMENT_BYTES:
            raise ValueError(f"HLO element type {dtype!r} not in {sorted(ELEMENT_BYTES)}")
        n = 1
        for d in filter(None, dims.split(",")):
            n *= int(d)
        out += n * ELEMENT_BYTES[dtype]
    return out


def group_size(rest: str) -> int:
    """Devices per replica group: `replica_groups={{0,1},{2,3}}`, the iota form
    `replica_groups=[2,2]<=[4]` (groups x size), or the mesh form
    `replica_groups=mesh['a'=2,'b'=2] {'b'}` (the product of the named axes)."""
    m = re.search(r"replica_groups=\{\{([0-9,]*)\}", rest)
    if m:
        return len(m.group(1).split(","))
    m = re.search(r"replica_groups=\[([0-9,]+)\]<=", rest)
    if m:
        return int(m.group(1).split(",")[-1])
    m = re.search(r"replica_groups=mesh\[([^\]]*)\]\s*\{([^}]*)\}", rest)
    if m:
        sizes = {k.strip("'"): int(v) for k, v in re.findall(r"('[^']*')=(\d+)", m.group(1))}
        return math.prod(sizes[a.strip().strip("'")] for a in m.group(2).split(",") if a.strip())
    return 1


def found(text: str) -> list[dict]:
    """[{kind, nbytes, group}] of every collective in a compiled program's HLO text (the
    -done halves of async pairs carry no new bytes and are skipped)."""
    out = []
    for line in text.splitlines():
        m = _LINE.search(line)
        if not m or "-done(" in line:
            continue
        nbytes, group = shape_bytes(m["shape"]), group_size(m["rest"])
        if m["op"] == "reduce-scatter":
            nbytes *= group
        out.append({"kind": m["op"], "nbytes": nbytes, "group": group})
    return out


def by_kind(items) -> dict[str, dict]:
    """{kind: {"count", "bytes"}} of `found` rows or `comms.Collective`s."""
    out: dict[str, dict] = {}
    for c in items:
        kind, nbytes, count = (c["kind"], c["nbytes"], 1) if isinstance(c, dict) \
            else (c.kind, c.nbytes, c.count)
        row = out.setdefault(kind, {"count": 0, "bytes": 0.0})
        row["count"] += count
        row["bytes"] += count * nbytes
    return out


def check(model, phase: str, batch: int, context: int) -> dict:
    """Compile a sharded model's phase at (batch, context) and return {"expected",
    "found"} by kind (count and bytes per device) and whether they agree."""
    if model.mesh is None:
        raise ValueError("check needs a sharded model: refmodel.parallel.shard(model, mesh)")
    phases = refmodel.Phases(model)
    args = phases.example_args(phase, batch, context)
    text = phases.jitted[phase].lower(*args).compile().as_text()
    expected = by_kind(comms.collectives(model.cfg, phase, batch, context,
                                         degrees(model.mesh)))
    rows = found(text)
    got = by_kind(rows)
    return {"phase": phase, "batch": batch, "context": context,
            "mesh": degrees(model.mesh), "expected": expected, "found": got,
            "groups": sorted({r["group"] for r in rows}), "agree": expected == got}
