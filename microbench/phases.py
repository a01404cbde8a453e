"""Measured phase points: prefill, decode attention, decode FFN and the whole decode step.

Regime: each phase of the reference model (`refmodel.Phases`) is compiled alone and timed with
the harness at a given batch and context; its FLOPs and bytes come from the analytic cost
model (`refmodel.costs.phase_costs`) of the very same phase, so the measured point (achieved
FLOP/s at the counted intensity) and the predicted point sit on one roofline. The prediction
uses the roofs measured on the same machine (`peaks.json`): the matrix roof of the model's
dtype, and the bandwidth of the smallest memory level that holds the phase's working set
(weights + cache + activations), which is DRAM for a model several times the last-level cache.

    t_predicted = max(FLOPs / compute roof, bytes / memory roof)
    measured / predicted = t_predicted / t_measured   (1.0 = on the roof; 0.5 = half of it)

The timed callable is `phases.jitted[phase]`, the object the compiler cross-check lowers too.
Arguments come from `Phases.example_args` (the same the cross-check lowers): decode phases run
on a cache of `context + 1` slots filled with random values at position `context`; the harness
feeds each call's cache into the next (donated, in place), so repeated calls keep writing the
last slot and every call does the work of one step at that context.
"""

from __future__ import annotations

import dataclasses

import refmodel
from microbench import harness
from refmodel import costs
from refmodel.phases import donation


@dataclasses.dataclass(frozen=True)
class Budget:
    """How long to spend on each point (passed through to harness.time_fn, whose result
    is a harness.Timing)."""

    budget_s: float = 1.0
    min_samples: int = 5
    target_cv: float = 0.03
    min_sample_s: float = 2e-3


def working_set_bytes(cfg: refmodel.ModelConfig, phase: str, batch: int, context: int,
                      counted: dict) -> float:
    """Bytes the phase keeps touching call after call: its weights, its cache and activations
    (the counted weight and activation bytes, and the cache's whole size)."""
    cache = 0.0
    if phase != "decode_ffn":
        slots = context if phase == "prefill" else context + 1
        cache = costs.kv_cache_bytes(cfg, slots, batch, counted["dtypes"]["kv"])
    return counted["weight_bytes"] + counted["act_bytes"] + cache


def memory_level(roofs: dict, capacities: list, working_set: float) -> dict:
    """The memory roof of the smallest cache level whose capacity holds the working set, else
    main memory's read-only roof (inference phases stream weights and caches: reads), else
    main memory's best roof. `capacities` is [[level, bytes], ...] smallest first."""
    by_level = {r["level"]: r for r in roofs["memory"] if not r.get("suspect")}
    for level, capacity in capacities:
        if working_set <= capacity and level in by_level:
            return by_level[level]
    main = [level for level in by_level if level not in dict(capacities)]
    if not main:
        raise ValueError("roofs.memory: no unflagged main-memory roof to predict with")
    read = [level for level in main if level.endswith(" read")]
    return by_level[(read or main)[0]]


def compute_roof(roofs: dict, dtype: str) -> dict:
    """The matrix (GEMM) roof of `dtype`, or the best unflagged compute roof if none."""
    ok = [r for r in roofs["compute"] if not r.get("suspect")]
    gemm = [r for r in ok if r.get("dtype") == dtype and r["name"].startswith("GEMM")]
    pool = gemm or [r for r in ok if r.get("dtype") == dtype] or ok
    if not pool:
        raise ValueError("roofs.compute: no unflagged compute roof to predict with")
    return max(pool, key=lambda r: r["value"])


def predict(flops: float, nbytes: float, compute: dict, memory: dict) -> dict:
    """Roofline time of a phase: the slower of its compute time and its memory time."""
    t_compute, t_memory = flops / compute["value"], nbytes / memory["value"]
    t = max(t_compute, t_memory)
    return {"time_s": t, "bound": "compute" if t_compute >= t_memory else "memory",
            "t_compute_s": t_compute, "t_memory_s": t_memory,
            "compute_roof": compute["name"], "compute_flops_per_s": compute["value"],
            "memory_level": memory["level"], "memory_bytes_per_s": memory["value"],
            "flops_per_s": flops / t if t else None}


def measure_point(phases: refmodel.Phases, phase: str, batch: int, context: int,
                  peaks: dict | None, timing: Budget = Budget(), label: str | None = None
                  ) -> dict:
    """Time one phase at (batch, context) and put it beside its counted and predicted cost."""
    cfg = phases.cfg
    counted = costs.phase_costs(cfg, phase, batch, context)
    args = phases.example_args(phase, batch, context, fill=True)
    donate, carry = donation(phase)
    compiled = phases.jitted[phase].lower(*args).compile()  # the callable the check lowers
    t = harness.time_fn(compiled, *args, donate_argnums=donate, carry=carry,
                        budget_s=timing.budget_s, min_samples=timing.min_samples,
                        target_cv=timing.target_cv, min_sample_s=timing.min_sample_s)
    tokens = batch * (context if phase == "prefill" else 1)
    point = {
        "label": label or describe(cfg), "model": cfg.name, "attention": cfg.attention,
        "layer_pattern": list(cfg.layer_pattern) if cfg.layer_pattern else None,
        "ffn": cfg.ffn, "mla_absorb": cfg.mla_absorb if "mla" in cfg.layer_kinds else None,
        "phase": phase, "batch": batch, "context": context, "tokens": tokens,
        "dtype": cfg.dtype, **{k: counted[k] for k in (
            "flops", "bytes", "weight_bytes", "kv_bytes", "act_bytes", "intensity")},
        "ops": counted["ops"], "timing": t.to_dict(),
        "flops_per_s": harness.rates(counted["flops"], t),
        "bytes_per_s": harness.rates(counted["bytes"], t),
        "tokens_per_s": harness.rates(tokens, t),
        "working_set_bytes": working_set_bytes(cfg, phase, batch, context, counted),
    }
    if peaks is not None:
        attach_prediction(point, peaks)
    return point


def attach_prediction(point: dict, peaks: dict) -> dict:
    """Add `predicted` and `measured_over_predicted` from a peaks result's roofs."""
    roofs = peaks["roofs"]
    capacities = peaks.get("sweep", {}).get("cache_capacities") or []
    mem = memory_level(roofs, capacities, point["working_set_bytes"])
    pred = predict(point["flops"], point["bytes"], compute_roof(roofs, point["dtype"]), mem)
    point["predicted"] = pred
    point["measured_over_predicted"] = pred["time_s"] / point["timing"]["median"]
    return point


def describe(cfg: refmodel.ModelConfig) -> str:
    """A short legend label: the attention kind (or pattern), the FFN, MLA's path."""
    kind = "+".join(dict.fromkeys(cfg.layer_kinds))
    if "mla" in cfg.layer_kinds:
        kind += " absorbed" if cfg.mla_absorb else " naive"
    return f"{kind} / {cfg.ffn}"


def summary_row(point: dict) -> dict:
    """The numbers a table shows for one point."""
    pred = point.get("predicted") or {}
    return {"label": point["label"], "phase": point["phase"], "batch": point["batch"],
            "context": point["context"], "FLOP/byte": point["intensity"],
            "GFLOP/s": point["flops_per_s"]["median"] / 1e9,
            "GB/s": point["bytes_per_s"]["median"] / 1e9,
            "ms": point["timing"]["median"] * 1e3,
            "bound": pred.get("bound"), "level": pred.get("memory_level"),
            "meas/pred": point.get("measured_over_predicted")}
