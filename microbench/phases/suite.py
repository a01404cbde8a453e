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
        backend: str = "auto") -> dict:
    """The whole main job; returns {"peaks", "phases", "files"}. Every file of the run is
    written as one set (files.output_set): out_dir is checked before anything is measured,
    and an interrupted run leaves out_dir as it was. `backend` runs every
    timed point (refmodel.backends.choose)."""
    from microbench.roofs.peaks import measure_peaks

    with output_set(out_dir) as tmp:
        peaks = measure_peaks(quick, tmp, progress=progress)
        plan = dataclasses.replace(sweeps.quick_plan() if quick else sweeps.PhasePlan(),
                                   backend=backend)
        phases = measure_phases(plan, peaks, quick, tmp, report=not quick, peer=peer,
                                progress=progress)
        files = [Path(out_dir) / p.relative_to(tmp) for p in draw_roofline(tmp)]
    return {"peaks": peaks, "phases": phases, "files": files}
