"""The phase sweeps behind the figures, measured on this machine and modelled for others.

Measured (microbench.phases, on a model several times the last-level cache, float32):
- `roofline`: every attention variant's prefill, decode attention, decode FFN and decode step
  at batch 1 -> one point each on the roofline;
- `batch`: decode FFN and the whole decode step vs batch, dense and MoE -> "throughput is free
  until the ridge" (FFN intensity ~ B; MoE's per-expert intensity ~ B A / E) and the
  throughput-vs-interactivity curve of this machine;
- `context`: decode attention vs context per variant beside decode FFN -> the context at
  which attention overtakes the FFN.
Modelled (refmodel.costs on spec-database devices, no timing): the same curves for a real
preset on datacenter chips, and KV-cache bytes vs context for real presets.

Everything lands in one result object (schema.KIND_PHASES) that the figures are drawn from.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable

import refmodel
from microbench import hardware
from microbench.phases import Budget, measure_point
from refmodel import costs

VARIANTS: dict[str, dict] = {
    "mha": dict(attention="mha"),
    "gqa": dict(attention="gqa"),
    "mqa": dict(attention="mqa"),
    "mla naive": dict(attention="mla", mla_absorb=False),
    "mla absorbed": dict(attention="mla", mla_absorb=True),
    "sliding": dict(attention="sliding"),
    "sparse": dict(attention="sparse"),
    "linear": dict(attention="linear"),
    "gqa moe": dict(attention="gqa", ffn="moe"),
}


@dataclasses.dataclass(frozen=True)
class PhasePlan:
    model: str = "bench"
    variants: tuple[str, ...] = tuple(VARIANTS)
    prefill_len: int = 256
    context: int = 1024  # roofline points' decode context
    batches: tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64)
    contexts: tuple[int, ...] = (256, 1024, 4096)
    context_variants: tuple[str, ...] = ("mha", "gqa", "mla absorbed", "sliding", "sparse",
                                         "linear")
    context_batch: int = 8
    timing: Budget = Budget()


QUICK = PhasePlan(variants=("gqa", "mla absorbed", "sliding", "linear", "gqa moe"),
                  prefill_len=128, context=512, batches=(1, 4, 16), contexts=(256, 2048),
                  context_variants=("gqa", "sliding"), context_batch=8,
                  timing=Budget(budget_s=0.3, min_samples=3))


def config(plan: PhasePlan, variant: str) -> refmodel.ModelConfig:
    if variant not in VARIANTS:
        raise ValueError(f"variant={variant!r} is not one of {sorted(VARIANTS)}")
    return dataclasses.replace(refmodel.presets.get(plan.model), **VARIANTS[variant])


def jobs(plan: PhasePlan) -> list[tuple[str, str, str, int, int]]:
    """(sweep, variant, phase, batch, context) of every point, grouped by variant so each
    model is built once."""
    out = []
    for v in plan.variants:
        out.append(("roofline", v, "prefill", 1, plan.prefill_len))
        out += [("roofline", v, p, 1, plan.context) for p in refmodel.PHASES[1:]]
    for v in ("gqa", "gqa moe"):
        for b in plan.batches:
            out += [("batch", v, "decode_ffn", b, plan.context),
                    ("batch", v, "decode", b, plan.context)]
    for v in plan.context_variants:
        out.append(("context", v, "decode_ffn", plan.context_batch, 0))
        out += [("context", v, "decode_attention", plan.context_batch, c)
                for c in plan.contexts]
    order = {v: i for i, v in enumerate(VARIANTS)}
    return sorted(out, key=lambda j: order[j[1]])


def measure(plan: PhasePlan, peaks: dict | None, progress: bool = True) -> list[dict]:
    """Every measured point of the plan, each tagged with its sweep and variant."""
    from tqdm import tqdm

    points, current, phases = [], None, None
    for sweep, variant, phase, batch, context in tqdm(jobs(plan), desc="phases",
                                                      disable=not progress, unit="pt"):
        if variant != current:
            phases = refmodel.Phases(refmodel.init(config(plan, variant), seed=0))
            current = variant
        point = measure_point(phases, phase, batch, context, peaks, plan.timing, label=variant)
        points.append({"sweep": sweep, "variant": variant, **point})
    return points


# Modelled: the cost model on spec-database devices ------------------------------------------

def step_time(cfg, device: hardware.Device, phase: str, batch: int, context: int,
              dtype: str = "bfloat16") -> dict:
    """Roofline time of one phase of a real preset on a spec device (weights and KV in dtype)."""
    c = costs.phase_costs(cfg, phase, batch, context, weight_dtype=dtype, kv_dtype=dtype,
                          act_dtype=dtype)
    peak = device.peak_flops.get(dtype) or max(device.peak_flops.values())
    bw = device.memory_bandwidth[device.main_memory]
    t = max(c["flops"] / peak, c["bytes"] / bw)
    return {"time_s": t, "flops": c["flops"], "bytes": c["bytes"],
            "bound": "compute" if c["flops"] / peak >= c["bytes"] / bw else "memory"}


def modelled_throughput(preset: str, devices: Iterable[str], batches: Iterable[int],
                        context: int) -> list[dict]:
    """Tokens/s per system and per user of a decode step vs batch, with the batch at which
    weights + KV cache stop fitting the device's memory marked."""
    cfg, out = refmodel.presets.get(preset), []
    weights = costs.param_counts(cfg)["total"] * 2
    for name in devices:
        dev = hardware.get(name)
        for b in batches:
            t = step_time(cfg, dev, "decode", b, context)
            fits = dev.memory_bytes is None or \
                weights + costs.kv_cache_bytes(cfg, context, b) <= dev.memory_bytes
            out.append({"device": name, "preset": preset, "batch": b, "context": context,
                        "step_s": t["time_s"], "bound": t["bound"],
                        "tokens_per_s_system": b / t["time_s"],
                        "tokens_per_s_user": 1 / t["time_s"], "fits_memory": fits})
    return out


def modelled_crossover(preset: str, device: str, batch: int, contexts: Iterable[int]
                       ) -> list[dict]:
    """Decode attention vs decode FFN time vs context for a real preset on a spec device."""
    cfg, dev = refmodel.presets.get(preset), hardware.get(device)
    ffn = step_time(cfg, dev, "decode_ffn", batch, 0)["time_s"]
    return [{"preset": preset, "device": device, "batch": batch, "context": c,
             "attention_s": step_time(cfg, dev, "decode_attention", batch, c)["time_s"],
             "ffn_s": ffn} for c in contexts]


def modelled_kv(presets: Iterable[str], contexts: Iterable[int]) -> list[dict]:
    """KV-cache bytes per sequence (bf16) vs context for real presets."""
    contexts = list(contexts)
    return [{"preset": p, "context": c,
             "kv_bytes": costs.kv_cache_bytes(refmodel.presets.get(p), c, 1, "bfloat16")}
            for p in presets for c in contexts]


MODEL_DEVICES = ("H100 SXM", "H200 SXM", "B200", "MI300X", "TPU v5e")
POWERS_OF_TWO = tuple(2**i for i in range(0, 10))
LONG_CONTEXTS = tuple(2**i for i in range(8, 18))  # 256 .. 128K
KV_PRESETS = ("llama3-70b", "llama3.1-405b", "deepseek-v3", "mistral-7b", "gemma3-27b",
              "gpt-oss-120b", "qwen3-next-80b-a3b", "nemotron-h-8b")


def modelled() -> dict:
    """Every modelled series the figures use (pure arithmetic: instant)."""
    devices = [d for d in MODEL_DEVICES if d in hardware.list_devices()]
    return {
        "throughput": modelled_throughput("llama3-8b", devices, POWERS_OF_TWO, 4096),
        "crossover": modelled_crossover("llama3-8b", devices[0], 16, LONG_CONTEXTS),
        "kv": modelled_kv([p for p in KV_PRESETS if p in refmodel.presets.PRESETS],
                          LONG_CONTEXTS),
    }
