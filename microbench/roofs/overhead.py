"""The per-call floor of a compiled phase: dispatch, plus a launch cost per kernel.

A roofline time is bytes / bandwidth or FLOPs / peak; a real call also pays a fixed cost to
be dispatched and a cost per kernel (per XLA thunk on a CPU, per launch on a GPU) that is
independent of the work. For a big phase it is noise; for decode attention at short context
it is most of the time. Both are measured here with the project's harness:

  * dispatch: a compiled `x + 1` on 16 floats, per call;
  * per kernel: a chain of N dependent 8x8 matrix products (each its own kernel, none fused
    with another) timed at N = 1 and N = 65; the slope is the cost of one kernel.

Both again cold: with the caches evicted before every call (`harness.Evictor`), as the
decode phases are timed (microbench.phases.points), the runtime's own code and data and each
kernel's code come from main memory, an order of magnitude slower than warm (`python -m
microbench peaks` saves both): a cold decode phase of a hundred kernels pays a cost that no
roof accounts for. A cold point's floor is the cold one.

`count_kernels(compiled)` counts the kernels of a compiled phase from its optimised HLO (the
ENTRY computation's instructions that launch work: fusions, dots, copies, custom calls ...;
parameters, constants, tuples and bitcasts launch nothing). A `while` loop counts as one
kernel plus its body once: the trip count is not in the text, so a loop's floor is a lower
bound.
"""

from __future__ import annotations

import re
from collections import Counter

import numpy as np

from microbench import harness

FREE_OPCODES = {"parameter", "constant", "get-tuple-element", "tuple", "bitcast",
                "after-all", "partition-id", "replica-id"}
CHAIN = 65
_INSTR = re.compile(r"=\s*(?:\([^=]*?\)|\S+)\s+([a-z][\w\-]*)\(")


def _computation(text: str, name: str | None) -> list[str]:
    """Lines of the ENTRY computation (name None) or of the computation `name`."""
    head = re.compile(r"^ENTRY " if name is None else rf"^%?{re.escape(name)} ")
    lines, inside = [], False
    for line in text.splitlines():
        if not inside and head.match(line):
            inside = True
            continue
        if inside:
            if line.startswith("}"):
                break
            lines.append(line)
    return lines


def count_kernels(compiled_or_text) -> dict:
    """{"kernels": n, "by_opcode": {opcode: n}} of the ENTRY computation (+ while bodies)."""
    text = compiled_or_text if isinstance(compiled_or_text, str) else compiled_or_text.as_text()
    counts: Counter = Counter()
    for line in _computation(text, None):
        m = _INSTR.search(line)
        if not m or m.group(1) in FREE_OPCODES:
            continue
        counts[m.group(1)] += 1
        body = re.search(r"body=%?([\w.\-]+)", line) if m.group(1) == "while" else None
        if body:
            for inner in _computation(text, body.group(1)):
                mi = _INSTR.search(inner)
                if mi and mi.group(1) not in FREE_OPCODES:
                    counts[mi.group(1)] += 1
    return {"kernels": int(sum(counts.values())), "by_opcode": dict(counts)}


def _chain(x, ws):
    for w in ws:
        x = x @ w
    return x


def measure(budget_s: float = 0.3, cold: bool = True) -> dict:
    """Dispatch seconds per call and launch seconds per kernel, with the method; with `cold`,
    both again with the caches evicted before every call (cold_dispatch_s, cold_per_kernel_s)."""
    import jax.numpy as jnp

    rng = np.random.default_rng(0)
    x = jnp.asarray(rng.standard_normal(16, dtype=np.float32))
    m = jnp.asarray(rng.standard_normal((8, 8), dtype=np.float32))
    ws = [jnp.asarray(0.3 * rng.standard_normal((8, 8), dtype=np.float32)) for _ in range(CHAIN)]

    def floor(before=None) -> tuple:
        kw = {"budget_s": budget_s, "min_samples": 5, "before": before}
        dispatch = harness.time_fn(lambda a: a + 1, x, **kw)
        one = harness.time_fn(_chain, m, ws[:1], **kw)
        many = harness.time_fn(_chain, m, ws, **kw)
        return dispatch.median, max(0.0, (many.median - one.median) / (CHAIN - 1)), one, many

    dispatch, per_op, one, many = floor()
    out = {"dispatch_s": dispatch, "per_kernel_s": per_op,
           "chain_kernels": CHAIN, "chain_1_s": one.median, "chain_n_s": many.median,
           "method": "dispatch: compiled x + 1 on 16 floats; per kernel: slope of a chain of "
                     f"dependent 8x8 products between 1 and {CHAIN} kernels"}
    if cold:
        evict = harness.Evictor()
        dispatch, per_op, one, many = floor(evict)
        out.update({"cold_dispatch_s": dispatch, "cold_per_kernel_s": per_op,
                    "cold_chain_1_s": one.median, "cold_chain_n_s": many.median})
        out["method"] += (f"; cold: the same with {evict.nbytes / 2**20:.0f} MiB read before "
                          "every call (the caches evicted, as a cold phase point is timed)")
        del evict
    return out


def floor_s(overhead: dict, kernels: int, cold: bool = False) -> float:
    """The per-call floor of a phase with `kernels` kernels; a `cold` call's (caches evicted
    before it) from the cold measurement where the file has one."""
    if cold and "cold_dispatch_s" in overhead:
        return overhead["cold_dispatch_s"] + kernels * overhead["cold_per_kernel_s"]
    return overhead["dispatch_s"] + kernels * overhead["per_kernel_s"]
