"""The main job: measure this machine's roofs, the model's phases, and draw every figure.

`run(quick, out_dir)` is `python -m microbench run`: peaks (microbench.roofs.peaks), the phase
sweeps (microbench.phases.sweeps), the speed report (microbench.phases.report, default mode
only), then every figure (microbench.plots) and one summary table (markdown), all written into
out_dir. The figures and the summary are drawn by `microbench.plots.saved.draw_roofline`,
which also redraws them from saved results alone, without JAX (`python -m microbench figures`).
"""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path

import refmodel
from microbench import harness
from microbench.files import output_set
from microbench.phases import sweeps
from microbench.phases.points import make_probe, prediction_inputs
from microbench.plots.saved import draw_roofline
from microbench.schema import KIND_PHASES, SCHEMA_VERSION, validate_result
from refmodel import costs


def measure_phases(plan: sweeps.PhasePlan, peaks: dict, quick: bool, out_dir,
                   report: bool = False, peer: bool = True, progress: bool = True) -> dict:
    """Run the sweeps (and the report), write phases.json, return the result object."""
    t0 = time.perf_counter()
    harness.check_writable_dir(out_dir)
    cfg = refmodel.presets.get(plan.model)
    inputs = prediction_inputs(peaks)
    probe = make_probe(inputs)
    result = {
        "schema_version": SCHEMA_VERSION, "kind": KIND_PHASES, "machine": peaks["machine"],
        "quick": quick, "environment": harness.environment(),
        "model": {"preset": plan.model, "params": costs.param_counts(cfg)["total"],
                  "dtype": cfg.dtype, "config": dataclasses.asdict(cfg)},
        "peaks": inputs,
        "plan": dataclasses.asdict(plan),
        "points": sweeps.measure(plan, inputs, progress, probe=probe,
                                 explain_outside=not quick),
        "modelled": sweeps.modelled(),
        "report": None,
    }
    if report:
        from microbench.phases.report import measure_report

        result["report"] = measure_report(inputs, peer=peer, probe=probe,
                                          backend=plan.backend)
    result["wall_s"] = time.perf_counter() - t0
    harness.write_json_atomic(Path(out_dir) / "phases.json", validate_result(result))
    return result


def run(quick: bool, out_dir, peer: bool = True, progress: bool = True,
        backend: str = "auto", platform: str = "auto") -> dict:
    """The whole main job; returns {"peaks", "phases", "files"}. Every file of the run is
    written as one set (files.output_set): out_dir is checked before anything is measured,
    and an interrupted run leaves out_dir as it was. `backend` runs every
    timed point (refmodel.backends.choose). `platform` (roofs.platform.choose: "auto", "cpu",
    "gpu", "tpu") picks the CPU's path or an accelerator's (`run_device`)."""
    from microbench.roofs import platform as platforms
    from microbench.roofs.peaks import measure_peaks

    chosen = platforms.current(platform)
    if chosen.accelerator:
        return run_device(chosen, quick, out_dir, progress)
    with output_set(out_dir) as tmp:
        peaks = measure_peaks(quick, tmp, progress=progress)
        plan = dataclasses.replace(sweeps.quick_plan() if quick else sweeps.PhasePlan(),
                                   backend=backend)
        phases = measure_phases(plan, peaks, quick, tmp, report=not quick, peer=peer,
                                progress=progress)
        files = [Path(out_dir) / p.relative_to(tmp) for p in draw_roofline(tmp)]
    return {"peaks": peaks, "phases": phases, "files": files}


def run_device(platform, quick: bool, out_dir, progress: bool = True) -> dict:
    """The accelerator's main job (also forced on a CPU): device roofs (roofs.device), the
    bfloat16 phases on a preset sized for the chip (phases.device), every figure and the
    summary with what this path skipped; written as one set like `run`."""
    from microbench.phases import device as device_phases
    from microbench.roofs import device

    with output_set(out_dir) as tmp:
        peaks = device.measure(platform, quick, progress)
        harness.write_json_atomic(tmp / "peaks.json", peaks)
        memory = device.device_memory_bytes(peaks["environment"],
                                            (peaks.get("spec") or {}).get("memory_bytes"))
        preset = device_phases.preset_for(memory, platform.forced)
        plan = device_phases.plan_for(preset, quick, platform.forced)
        phases = device_phases.measure(plan, peaks, quick, tmp, progress)
        files = [Path(out_dir) / p.relative_to(tmp) for p in draw_roofline(tmp)]
    return {"peaks": peaks, "phases": phases, "files": files}
