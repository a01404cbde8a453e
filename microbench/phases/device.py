"""The phases on an accelerator: the same sweeps in bfloat16, on a model sized for the chip.

An accelerator serves weights and caches in bfloat16, so every point here runs in bfloat16
(the preset's fields, dtype replaced) on XLA's ops. The preset is chosen by the device's
memory (PRESETS_BY_MEMORY: the largest whose weights are many times the on-chip memory and fit
with room for the sweeps' caches); a run forced on a CPU uses "tiny" and a handful of points,
since only its logic is being checked there. Points are timed and predicted as on the CPU
(points.measure_point: cold decode calls, compile excluded), against the device roofs: the
decode points' memory bound is main memory's (HBM) read roof. The CPU path's drift probes and
speed report are not run here; the result says so under `skipped`.
"""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path

import refmodel
from microbench import harness
from microbench.phases import sweeps
from microbench.phases.points import measure_point, prediction_inputs
from microbench.phases.timing import Budget
from microbench.schema import KIND_PHASES, SCHEMA_VERSION, validate_result
from refmodel import backends, costs

DTYPE = "bfloat16"
# (device memory at least, preset): "medium" is ~317M parameters, 0.63 GB in bfloat16, ~13x
# a 50 MB L2; "bench" ~50M, 0.1 GB.
PRESETS_BY_MEMORY = ((40e9, "medium"), (8e9, "bench"), (0.0, "small"))
SKIPPED = (
    ("speed report and the PyTorch peer", "written for the CPU path's float32 targets"),
    ("drift probes around each point", "the probe reads with the host's C program"),
)


def preset_for(memory_bytes: float | None, forced: bool) -> str:
    """The preset of the phases: by device memory; "tiny" on a forced run (or unknown memory
    on a real device: "small")."""
    if forced:
        return "tiny"
    return next(name for floor, name in PRESETS_BY_MEMORY if (memory_bytes or 0) >= floor)


def plan_for(preset: str, quick: bool, forced: bool) -> sweeps.PhasePlan:
    """The sweeps for the device: a handful of points when forced, the quick or full set else."""
    dense = sweeps.DENSE
    if forced:
        # one context, batch 1 throughout: the sweeps share their points (sweeps.jobs)
        return sweeps.PhasePlan(model=preset, variants=(dense,), prefill_len=16, context=16,
                                batches=(1,), contexts=(16,), context_variants=(dense,),
                                context_batch=1, timing=Budget(budget_s=0.05, min_samples=3),
                                backend="xla")
    if quick:
        # about a dozen points: the script's five-minute budget pays for their compiles
        return sweeps.PhasePlan(model=preset, variants=(dense,), prefill_len=512,
                                context=1024, batches=(1, 16), contexts=(1024, 8192),
                                context_variants=(dense,), context_batch=8,
                                timing=Budget(budget_s=0.3, min_samples=3), backend="xla")
    return sweeps.PhasePlan(model=preset, prefill_len=1024, context=2048,
                            batches=(1, 2, 4, 8, 16, 32, 64, 128, 256),
                            contexts=(1024, 4096, 16384), backend="xla")


def config(plan: sweeps.PhasePlan, variant: str) -> refmodel.ModelConfig:
    """The variant's config of the plan's preset, in bfloat16, on the backend the plan asks."""
    cfg = dataclasses.replace(sweeps.config(dataclasses.replace(plan, backend="xla"), variant),
                              dtype=DTYPE)
    return dataclasses.replace(cfg, backend=backends.choose(plan.backend, cfg.dtype,
                                                          cfg.weight_format))


def measure_points(plan: sweeps.PhasePlan, peaks: dict, progress: bool = True) -> list[dict]:
    """Every point of the plan (sweeps.jobs), each model built once, in bfloat16."""
    from tqdm import tqdm

    points, current, phases = [], None, None
    for job in tqdm(sweeps.jobs(plan), desc="phases", disable=not progress, unit="pt"):
        if job.variant != current:
            phases = refmodel.Phases(refmodel.init(config(plan, job.variant), seed=0))
            current = job.variant
        point = measure_point(phases, job.phase, job.batch, job.context, peaks, plan.timing,
                              label=job.variant)
        points.append({**job.tags(), "variant": job.variant, **point})
    return points


def measure(plan: sweeps.PhasePlan, peaks: dict, quick: bool, out_dir,
            progress: bool = True) -> dict:
    """Run the device sweeps against the device roofs `peaks`, write phases.json, return it."""
    t0 = time.perf_counter()
    harness.check_writable_dir(out_dir)
    cfg = config(plan, sweeps.DENSE)
    result = {
        "schema_version": SCHEMA_VERSION, "kind": KIND_PHASES, "machine": peaks["machine"],
        "quick": quick, "environment": peaks["environment"], "platform": peaks["platform"],
        "model": {"preset": plan.model, "params": costs.param_counts(cfg)["total"],
                  "dtype": cfg.dtype, "config": dataclasses.asdict(cfg)},
        "peaks": prediction_inputs(peaks),
        "plan": dataclasses.asdict(plan),
        "points": measure_points(plan, peaks, progress),
        "modelled": sweeps.modelled(),
        "report": None,
        "skipped": [{"what": w, "why": y} for w, y in SKIPPED],
    }
    result["wall_s"] = time.perf_counter() - t0
    harness.write_json_atomic(Path(out_dir) / "phases.json", validate_result(result))
    return result
