"""Communication in the cost model: the collectives each phase needs over a mesh, their bytes
per device and their time on a link; and one device's share of the FLOPs and bytes.

Per layer, for `batch` sequences split over data x expert (n tokens per device):

- tensor parallelism (Megatron, Shoeybi et al. 2019): an all-reduce of [n, D] activations
  over the tensor group after each split attention layer (the variants whose
  `tensor_config` is not None), each dense FFN and a MoE's shared experts; the LM head split
  by vocabulary ends in an all-gather of float32 logits [n, V];
- expert parallelism (`refmodel.moe.MoE.expert_parallel`): per MoE layer, all-to-alls of
  the dispatched rows, their expert ids (int32) and the outputs, each a buffer of
  [ep, C = n A, D] per device (static shapes, sized so no pair is dropped). An exact
  (ragged) all-to-all, as DeepEP does, moves n A rows each way: `count="engine"`.

Sizes follow nccl-tests' convention (doc/PERFORMANCE.md): an all-reduce's S is its buffer, an
all-gather's its output, a reduce-scatter's its input, an all-to-all's the buffer each device
holds. Time on a link of bandwidth b (one direction, per device) and latency l per message,
over p devices: ring all-reduce 2 (p - 1) (l + S / p / b) (Patarasuk & Yuan 2009; what
`refmodel.sim.cluster.Link.all_reduce` charges), ring all-gather and reduce-scatter
(p - 1) (l + S / p / b), pairwise all-to-all (p - 1) (l + S / p / b). Bytes sent per device
(`wire_bytes`) are the same formulas without the latencies: 2 (p - 1) / p S and (p - 1) / p S.

`refmodel.parallel.hlo` checks `collectives` against what XLA inserts in the compiled phases.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from refmodel import attention, costs
from refmodel.config import ModelConfig
from refmodel.counting import BYTES, Cost, total
from refmodel.layers import DenseFFN, norm_costs
from refmodel.moe import MoE
from refmodel.parallel.mesh import AXES

KINDS = ("all-reduce", "all-gather", "reduce-scatter", "all-to-all")
ID_BYTES = 4  # int32 expert ids sent beside the rows
EXPERT_OPS = ("ffn_up", "ffn_down")  # a MoE's routed experts (refmodel.moe.MoE.costs)
RING_STEPS = {"all-reduce": 2, "all-gather": 1, "reduce-scatter": 1, "all-to-all": 1}


@dataclass(frozen=True)
class Collective:
    """`count` identical collectives of `nbytes` per device over `group` devices of `axis`,
    after op `op` (the named scope it follows)."""

    kind: str
    axis: str
    group: int
    nbytes: float  # per device, nccl-tests' S
    op: str
    count: int = 1

    @property
    def wire_bytes(self) -> float:
        """Bytes each device sends, all `count` of them."""
        p = self.group
        return self.count * RING_STEPS[self.kind] * (p - 1) / p * self.nbytes

    def time(self, bandwidth: float, latency: float = 0.0) -> float:
        """Seconds of all `count` of them on a link (bytes/s one direction, s per message)."""
        p = self.group
        if p <= 1:
            return 0.0
        return self.count * RING_STEPS[self.kind] * (p - 1) * (latency + self.nbytes / p
                                                                 / bandwidth)

    def as_dict(self) -> dict:
        return {"kind": self.kind, "axis": self.axis, "group": self.group,
                "nbytes": self.nbytes, "op": self.op, "count": self.count,
                "wire_bytes": self.wire_bytes}


def _degrees(degrees) -> dict[str, int]:
    if hasattr(degrees, "axis_names"):
        degrees = dict(degrees.shape)
    out = {a: degrees.get(a, 1) for a in AXES}
    for a, n in out.items():
        if not isinstance(n, int) or isinstance(n, bool) or n < 1:
            raise ValueError(f"{a}={n!r}: a parallel degree must be a positive integer")
    unknown = set(degrees) - set(AXES)
    if unknown:
        raise ValueError(f"unknown mesh axes {sorted(unknown)}; allowed: {list(AXES)}")
    return out


def _tokens(cfg: ModelConfig, phase: str, batch: int, context: int, d: dict) -> float:
    costs._check_cfg(cfg)
    costs._check_phase(phase)
    costs._check_int("batch", batch, 1)
    costs._check_int("context", context, 1 if phase == "prefill" else 0)
    if cfg.ffn == "moe" or "moe" in cfg.layer_ffns:
        if cfg.n_experts % d["expert"]:
            raise ValueError(f"expert={d['expert']} does not divide n_experts={cfg.n_experts}")
    new = context if phase == "prefill" else 1
    return batch * new / (d["data"] * d["expert"])


def _head_split(cfg: ModelConfig, tp: int) -> bool:
    return tp > 1 and not cfg.tie_embeddings and cfg.vocab_size % tp == 0


def collectives(cfg: ModelConfig, phase: str, batch: int, context: int, degrees,
                act_dtype: str | None = None, count: str = "implementation") -> list[Collective]:
    """The collectives of one phase on one device (see the module docstring); `degrees`: a
    mesh or {axis: size}."""
    d = _degrees(degrees)
    costs._check_count(count)
    n = _tokens(cfg, phase, batch, context, d)
    tp, ep = d["tensor"], d["expert"]
    act = BYTES[act_dtype or cfg.dtype]
    rows = n * cfg.d_model * act
    seen: dict[tuple, int] = {}  # (kind, axis, group, nbytes, op) -> how many, in order

    def add(kind, axis, group, nbytes, op):
        key = (kind, axis, group, nbytes, op)
        seen[key] = seen.get(key, 0) + 1

    for kind, ffn in zip(cfg.layer_kinds, cfg.layer_ffns, strict=True):
        if kind != "none" and phase != "decode_ffn" and tp > 1 and \
                attention.get(kind).tensor_config(cfg, kind, tp) is not None:
            add("all-reduce", "tensor", tp, rows, "out_proj")
        if ffn == "none" or phase == "decode_attention":
            continue
        if ffn == "dense" and tp > 1:
            add("all-reduce", "tensor", tp, rows, "ffn_down")
        if ffn == "moe" and ep > 1:
            pairs = n * cfg.top_k
            if count == "engine":
                add("all-to-all", "expert", ep, pairs * cfg.d_model * act, "dispatch")
                add("all-to-all", "expert", ep, pairs * cfg.d_model * act, "combine")
            else:  # a buffer of C = n A rows for each of the ep devices
                add("all-to-all", "expert", ep, ep * pairs * cfg.d_model * act, "dispatch")
                add("all-to-all", "expert", ep, ep * pairs * ID_BYTES, "dispatch")
                add("all-to-all", "expert", ep, ep * pairs * cfg.d_model * act, "combine")
        if ffn == "moe" and cfg.n_shared_experts and tp > 1:
            add("all-reduce", "tensor", tp, rows, "shared_experts")
    if phase in ("prefill", "decode") and _head_split(cfg, tp):
        add("all-gather", "tensor", tp, n * cfg.vocab_size * BYTES["float32"], "lm_head")
    return [Collective(*key, count=c) for key, c in seen.items()]


def per_device(cfg: ModelConfig, phase: str, batch: int, context: int, degrees,
               weight_dtype: str | None = None, kv_dtype: str | None = None,
               act_dtype: str | None = None, count: str = "engine") -> dict:
    """One device's share of a phase: {"flops", "weight_bytes", "kv_bytes", "act_bytes",
    "collectives": [...]} as an engine splits the work (count="engine": a windowed ring's
    masked slots and the static all-to-all buffers left out). Tensor-split attention is its
    variant's `tensor_config` share; dense FFNs, shared experts and the LM head 1 / tensor;
    routed experts: the whole expert group's tokens (n x ep) spread over ep devices, each
    reading its share of the experts they touch; embedding, norms, routers and unsplit
    layers whole on every device. Tied embeddings stay whole too, as this code keeps them (an
    engine splitting the table by vocabulary reads 1 / tensor of it, plus an all-reduce after
    the embedding gather). The engine's all-to-all sends each of the n A pairs once (a
    device receiving several of a token's experts gets it several times; DeepEP sends it once
    per device, and FP8 dispatch halves its bytes again)."""
    d = _degrees(degrees)
    n = _tokens(cfg, phase, batch, context, d)
    tp, ep = d["tensor"], d["expert"]
    dt = costs.dtypes(cfg, weight_dtype, kv_dtype, act_dtype)
    new, cached = (context, 0) if phase == "prefill" else (1, context)
    seqs = n / new
    post = 2 if cfg.post_norms else 1
    D = cfg.d_model
    ops: list[Cost] = []
    whole = phase in ("prefill", "decode")
    if whole:
        ops.append(costs.embed_costs(cfg, n, dt))
    for kind, ffn in zip(cfg.layer_kinds, cfg.layer_ffns, strict=True):
        if kind != "none" and phase != "decode_ffn":
            cls = attention.get(kind)
            changes = cls.tensor_config(cfg, kind, tp) if tp > 1 else None
            local = cfg.replace(**changes) if changes else cfg
            layer = cls.costs(local, kind, seqs, new, cached, dt)
            drop = attention.implementation_only() if count == "engine" else ()
            ops += [c for op, c in layer.items() if op not in drop]
            ops += [post * norm_costs(cfg, D, n, dt), costs.residual_costs(cfg, n, dt)]
        if ffn != "none" and phase != "decode_attention":
            ops += [post * norm_costs(cfg, D, n, dt), costs.residual_costs(cfg, n, dt)]
            if ffn == "dense":
                ops += DenseFFN.costs(cfg, _split(cfg.d_ff, tp, "d_ff"), n, dt).values()
            else:
                # the experts: the group's n ep tokens spread over ep devices, each reading
                # its share of the experts they touch; routing and combining: n local tokens
                group, local = MoE.costs(cfg, n * ep, dt), MoE.costs(cfg, n, dt)
                shared = local.pop("shared_experts", None)
                ops += [(1 / ep) * group[op] if op in EXPERT_OPS else c
                        for op, c in local.items()]
                if shared is not None:
                    width = _split(cfg.n_shared_experts * cfg.expert_width, tp, "shared width")
                    ops += DenseFFN.costs(cfg, width, n, dt).values()
    if whole:
        ops.append(norm_costs(cfg, D, n, dt))
        head = costs.head_costs(cfg, n, dt)
        ops.append((1 / tp) * head if _head_split(cfg, tp) else head)
    t = total(dict(enumerate(ops)))
    comm = collectives(cfg, phase, batch, context, d, act_dtype, count)
    return {"flops": t.flops, "weight_bytes": t.weight_bytes, "kv_bytes": t.kv_bytes,
            "act_bytes": t.act_bytes, "bytes": t.bytes, "tokens": n,
            "collectives": [c.as_dict() for c in comm],
            "comm_bytes": sum(c.wire_bytes for c in comm)}


def _split(width: int, tp: int, name: str) -> int:
    if width % tp:
        raise ValueError(f"tensor={tp} does not divide {name}={width}: choose a tensor "
                         "degree that divides it")
    return width // tp


def step_time(share: dict, flops: float, bandwidth: float, link_bandwidth: float | None,
              link_latency: float = 0.0) -> dict:
    """Seconds of one device's share (`per_device`) on a roofline of `flops` FLOP/s and
    `bandwidth` bytes/s, plus its collectives on a link (not overlapped with compute: the
    all-reduce waits for the layer it sums): {"compute", "weights", "kv", "memory", "comm",
    "total"}, where the step takes max(compute, memory) + comm."""
    comm = 0.0
    for c in share["collectives"]:
        if link_bandwidth is None:
            raise ValueError("collectives need a link: give link_bandwidth")
        comm += Collective(**{k: c[k] for k in ("kind", "axis", "group", "nbytes", "op",
                                                "count")}).time(link_bandwidth, link_latency)
    compute = share["flops"] / flops
    memory = share["bytes"] / bandwidth
    return {"compute": compute, "weights": share["weight_bytes"] / bandwidth,
            "kv": share["kv_bytes"] / bandwidth, "act": share["act_bytes"] / bandwidth,
            "memory": memory, "comm": comm, "total": max(compute, memory) + comm}


def tensor_degrees(cfg: ModelConfig, up_to: int) -> list[int]:
    """Powers of two up to `up_to` that split this model's heads and FFN (for sweeps)."""
    out = []
    for tp in (2 ** i for i in range(int(math.log2(up_to)) + 1)):
        try:
            for kind in dict.fromkeys(cfg.layer_kinds):
                if kind != "none":
                    attention.get(kind).tensor_config(cfg, kind, tp)
            if "dense" in cfg.layer_ffns:
                _split(cfg.d_ff, tp, "d_ff")
        except ValueError:
            break
        out.append(tp)
    return out
