"""The phase sweeps behind the figures, measured on this machine and modelled for others.

Measured (microbench.phases.points, on a model several times the last-level cache, float32):
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
import math
from collections.abc import Iterable

import refmodel
from microbench import hardware, roofline
from microbench.phases.points import (
    Budget,
    attach_breakdown,
    measure_point,
    memory_bytes,
    prediction_inputs,
    repredict,
)
from refmodel import attention, backends, costs, counting

DENSE = refmodel.ModelConfig.attention  # the config's default kind: the batch sweep's dense
MOE = f"{DENSE} moe"


def variants() -> dict[str, dict]:
    """{label: config changes}: every option set every registered attention variant declares,
    plus the default kind with an MoE FFN. Read from the registry on each call, so a variant
    registered later (a new file, or one inside a test) is swept without another edit."""
    return {**attention.option_sets(), MOE: dict(attention=DENSE, ffn="moe")}


@dataclasses.dataclass(frozen=True)
class PhasePlan:
    """What `microbench phases` measures. The variants of each sweep default to what each
    variant's `MEASURE` asks for (the roofline sweep: all of them)."""

    model: str = "bench"
    variants: tuple[str, ...] = dataclasses.field(default_factory=lambda: tuple(variants()))
    prefill_len: int = 256
    context: int = 1024  # roofline points' decode context
    batches: tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64)
    contexts: tuple[int, ...] = (256, 1024, 4096)
    context_variants: tuple[str, ...] = dataclasses.field(
        default_factory=lambda: attention.measured_in("context"))
    context_batch: int = 8
    timing: Budget = Budget()
    # The weight products every point runs (refmodel.backends.choose): "auto" is the project's
    # native kernels on a CPU where they build (the step a reader of this repo would run; XLA's
    # few-row products stream well below the read roof: `python -m microbench decode`), else
    # XLA's.
    backend: str = "auto"


def quick_plan() -> PhasePlan:
    """`--quick`: fewer variants, batches and contexts, a shorter timing budget."""
    return PhasePlan(variants=(*attention.measured_in("quick"), MOE),
                     prefill_len=128, context=512, batches=(1, 4, 16), contexts=(256, 2048),
                     context_variants=attention.measured_in("quick context"), context_batch=8,
                     timing=Budget(budget_s=0.3, min_samples=3))


def config(plan: PhasePlan, variant: str) -> refmodel.ModelConfig:
    known = variants()
    if variant not in known:
        raise ValueError(f"variant={variant!r} is not one of {sorted(known)}")
    cfg = dataclasses.replace(refmodel.presets.get(plan.model), **known[variant])
    return dataclasses.replace(cfg, backend=backends.choose(plan.backend, cfg.dtype,
                                                          cfg.weight_format))


@dataclasses.dataclass(frozen=True)
class Job:
    """One point to measure, and every sweep that uses it (`sweeps[0]` is the first).

    Iterates as the old tuple (sweep, variant, phase, batch, context) with the first sweep;
    `tags()` is what a measured point carries: {"sweep": first, "sweeps": [all]}."""

    sweeps: tuple[str, ...]
    variant: str
    phase: str
    batch: int
    context: int

    @property
    def sweep(self) -> str:
        return self.sweeps[0]

    def tags(self) -> dict:
        return {"sweep": self.sweeps[0], "sweeps": list(self.sweeps)}

    def __iter__(self):
        return iter((self.sweep, self.variant, self.phase, self.batch, self.context))


def effective_context(phase: str, context: int) -> int:
    """The context a phase's work depends on: none for decode_ffn (it sees one token per
    sequence and no cache), the given one otherwise."""
    return 0 if phase == "decode_ffn" else context


def jobs(plan: PhasePlan) -> list[Job]:
    """Every point of the plan, each unique (variant, phase, batch, effective context) once,
    with the sweeps that use it; grouped by variant so each model is built once.

    The same decode-FFN work at a given (variant, batch) appears in the batch, context and
    roofline sweeps; timing it once per run keeps one number per piece of work (copies of it
    timed separately differ by the machine's drift between them)."""
    wanted = []
    for v in (DENSE, MOE):
        for b in plan.batches:
            wanted += [("batch", v, "decode_ffn", b, plan.context),
                       ("batch", v, "decode", b, plan.context)]
    for v in plan.context_variants:
        wanted.append(("context", v, "decode_ffn", plan.context_batch, plan.context))
        wanted += [("context", v, "decode_attention", plan.context_batch, c)
                   for c in plan.contexts]
    for v in plan.variants:
        wanted.append(("roofline", v, "prefill", 1, plan.prefill_len))
        wanted += [("roofline", v, p, 1, plan.context) for p in refmodel.PHASES[1:]]
    shared: dict[tuple, dict] = {}
    for sweep, v, phase, b, c in wanted:
        key = (v, phase, b, effective_context(phase, c))
        job = shared.setdefault(key, {"sweeps": [], "context": c})
        if sweep not in job["sweeps"]:
            job["sweeps"].append(sweep)
    order = {v: i for i, v in enumerate(variants())}
    out = [Job(tuple(j["sweeps"]), v, phase, b, j["context"])
           for (v, phase, b, _), j in shared.items()]
    return sorted(out, key=lambda j: order[j.variant])


def plan_memory(plan: PhasePlan) -> tuple[float, Job]:
    """(bytes, job) of the plan's point that needs the most memory (`points.memory_bytes`),
    so a plan too big for the machine is refused before anything is allocated."""
    cfgs = {v: config(plan, v) for v in {job.variant for job in jobs(plan)}}
    return max(((memory_bytes(cfgs[job.variant], job.phase, job.batch, job.context), job)
                for job in jobs(plan)), key=lambda t: t[0])


def measure(plan: PhasePlan, peaks: dict | None, progress: bool = True,
            probe=None, explain_outside: bool = False) -> list[dict]:
    """Every measured point of the plan, each tagged with its sweep and variant; with a
    drift `probe` (microbench.roofs.probe.Probe) each point is predicted with its moment's roofs,
    once every point is measured, from the probes of the points around it (points.repredict;
    the probe's name saved as peaks.probe_reference.probe). With `explain_outside`, each
    point then outside the band gets its per-op breakdown (points.attach_breakdown)."""
    from tqdm import tqdm

    points, current, phases = [], None, None
    for job in tqdm(jobs(plan), desc="phases", disable=not progress, unit="pt"):
        if job.variant != current:
            phases = refmodel.Phases(refmodel.init(config(plan, job.variant), seed=0))
            current = job.variant
        point = measure_point(phases, job.phase, job.batch, job.context, peaks, plan.timing,
                              label=job.variant, probe=probe)
        points.append({**job.tags(), "variant": job.variant, **point})
    del phases
    if peaks is None:
        return points
    inputs = prediction_inputs(peaks)
    if probe is not None:
        inputs["probe_reference"]["probe"] = probe.name
        repredict(points, inputs)
    if explain_outside:
        outside = [p for p in points if "outside_reason" in p]
        for variant in dict.fromkeys(p["variant"] for p in outside):
            phases = refmodel.Phases(refmodel.init(config(plan, variant), seed=0))
            for p in (p for p in outside if p["variant"] == variant):
                attach_breakdown(p, phases, inputs)
            del phases
    return points


# Modelled: the cost model on spec-database devices ------------------------------------------

def step_time(cfg, device: hardware.Device, phase: str, batch: int, context: int,
              dtype: str = "bfloat16") -> dict:
    """Roofline time of one phase of a real preset on a spec device (weights and KV in dtype):
    roofline.predict on the device's roofs (roofline.spec_roofs), with no per-call floor.

    `bound` names the roof that sets the time ("compute" or "memory"); `memory_by` names the
    largest of the bytes moved (weights, KV cache, activations), what a memory-bound step
    waits on."""
    c = costs.phase_costs(cfg, phase, batch, context, weight_dtype=dtype, kv_dtype=dtype,
                          act_dtype=dtype, count="engine")  # what a real engine reads
    pred = roofline.predict(c["flops"], c["bytes"], *roofline.spec_roofs(device, dtype))
    moved = {"weights": c["weight_bytes"], "KV cache": c["kv_bytes"],
             "activations": c["act_bytes"]}
    return {"time_s": pred["time_s"], "flops": c["flops"], "bytes": c["bytes"],
            "weight_bytes": c["weight_bytes"], "kv_bytes": c["kv_bytes"],
            "bound": pred["bound"], "memory_by": max(moved, key=moved.get)}


def weight_fit(cfg, device: hardware.Device, dtype: str = "bfloat16") -> dict:
    """The preset's weights (all parameters, in dtype) against one device's memory: how many
    devices' worth of memory they need (1 when they fit one; None when memory is unknown)."""
    weights = costs.param_counts(cfg)["total"] * counting.BYTES[dtype]
    mem = device.memory_bytes
    return {"weight_bytes": weights, "memory_bytes": mem, "weights_dtype": dtype,
            "weight_devices": None if mem is None else max(1, math.ceil(weights / mem))}


def modelled_throughput(preset: str, devices: Iterable[str], batches: Iterable[int],
                        context: int) -> list[dict]:
    """Tokens/s per system and per user of a decode step vs batch, with the batch at which
    weights + KV cache stop fitting the device's memory marked, the roof that bounds each
    point, and how many devices' worth of memory the weights alone need."""
    cfg, out = refmodel.presets.get(preset), []
    for name in devices:
        dev = hardware.get(name)
        fit = weight_fit(cfg, dev)
        for b in batches:
            t = step_time(cfg, dev, "decode", b, context)
            fits = dev.memory_bytes is None or \
                fit["weight_bytes"] + costs.kv_cache_bytes(cfg, context, b) <= dev.memory_bytes
            out.append({"device": name, "preset": preset, "batch": b, "context": context,
                        "step_s": t["time_s"], "bound": t["bound"], "memory_by": t["memory_by"],
                        "tokens_per_s_system": b / t["time_s"],
                        "tokens_per_s_user": 1 / t["time_s"], "fits_memory": fits, **fit})
    return out


def modelled_crossover(preset: str, device: str, batch: int, contexts: Iterable[int]
                       ) -> list[dict]:
    """Decode attention vs decode FFN time vs context for a real preset on a spec device,
    with the roof that bounds each."""
    cfg, dev = refmodel.presets.get(preset), hardware.get(device)
    ffn = step_time(cfg, dev, "decode_ffn", batch, 0)
    out = []
    for c in contexts:
        att = step_time(cfg, dev, "decode_attention", batch, c)
        out.append({"preset": preset, "device": device, "batch": batch, "context": c,
                    "attention_s": att["time_s"], "attention_bound": att["bound"],
                    "attention_memory_by": att["memory_by"], "ffn_s": ffn["time_s"],
                    "ffn_bound": ffn["bound"], "ffn_memory_by": ffn["memory_by"],
                    **weight_fit(cfg, dev)})
    return out


def modelled_kv(presets: Iterable[str], contexts: Iterable[int], device: str = "H100 SXM"
                ) -> list[dict]:
    """KV-cache bytes per sequence (bf16) vs context for real presets, with the bf16 weights
    against one `device` and the dtype each release ships its weights in where it is not
    bf16 (SHIPPED_DTYPES)."""
    contexts, dev = list(contexts), hardware.get(device)
    out = []
    for p in presets:
        cfg = refmodel.presets.get(p)
        fit = {**weight_fit(cfg, dev), "device": device, "shipped_dtype": SHIPPED_DTYPES.get(p)}
        out += [{"preset": p, "context": c,
                 "kv_bytes": costs.kv_cache_bytes(cfg, c, 1, "bfloat16"), **fit}
                for c in contexts]
    return out


MODEL_DEVICES = ("H100 SXM", "H200 SXM", "B200", "MI300X", "TPU v5e")
POWERS_OF_TWO = tuple(2**i for i in range(0, 10))
LONG_CONTEXTS = tuple(2**i for i in range(8, 18))  # 256 .. 128K
KV_PRESETS = ("llama3-70b", "llama3.1-405b", "deepseek-v3", "mistral-7b", "gemma3-27b",
              "gpt-oss-120b", "qwen3-next-80b-a3b", "nemotron-h-8b")
# Releases whose weights ship in a narrower format than the bf16 the cost model counts here
# (DeepSeek-V3 report, arXiv:2412.19437: FP8 training and release; gpt-oss model card,
# arXiv:2508.10925: MoE weights in MXFP4).
SHIPPED_DTYPES = {"deepseek-v3": "fp8", "gpt-oss-120b": "MXFP4 (MoE experts)",
                  "gpt-oss-20b": "MXFP4 (MoE experts)"}


def modelled() -> dict:
    """Every modelled series the figures use (pure arithmetic: instant)."""
    devices = [d for d in MODEL_DEVICES if d in hardware.list_devices()]
    return {
        "throughput": modelled_throughput("llama3-8b", devices, POWERS_OF_TWO, 4096),
        "crossover": modelled_crossover("llama3-8b", devices[0], 16, LONG_CONTEXTS),
        "kv": modelled_kv([p for p in KV_PRESETS if p in refmodel.presets.PRESETS],
                          LONG_CONTEXTS),
    }
