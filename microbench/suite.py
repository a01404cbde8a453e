"""The main job: measure this machine's roofs, the model's phases, and draw every figure.

`run(quick, out_dir)` is `python -m microbench run`: peaks (microbench.peaks), the phase sweeps
(microbench.sweeps), the speed report (microbench.report, default mode only), then every
figure and one summary table (markdown), all written into out_dir. `draw(out_dir, data_dir)`
redraws the figures from saved results alone (`python -m microbench figures`).
"""

from __future__ import annotations

import dataclasses
import json
import time
from pathlib import Path

import refmodel
from microbench import harness, plot, sweeps
from microbench.phases import summary_row
from microbench.schema import KIND_PHASES, SCHEMA_VERSION, validate_result
from refmodel import costs

PHASE_FIGURES = ("phases_roofline", "batch", "throughput", "crossover", "kv_cache", "gap")


def measure_phases(plan: sweeps.PhasePlan, peaks: dict, quick: bool, out_dir,
                   report: bool = False, peer: bool = True, progress: bool = True) -> dict:
    """Run the sweeps (and the report), write phases.json, return the result object."""
    t0 = time.perf_counter()
    cfg = refmodel.presets.get(plan.model)
    result = {
        "schema_version": SCHEMA_VERSION, "kind": KIND_PHASES, "machine": peaks["machine"],
        "quick": quick, "environment": harness.environment(),
        "model": {"preset": plan.model, "params": costs.param_counts(cfg)["total"],
                  "dtype": cfg.dtype, "config": dataclasses.asdict(cfg)},
        "peaks": {"machine": peaks["machine"], "roofs": peaks["roofs"],
                  "cache_capacities": peaks.get("sweep", {}).get("cache_capacities", [])},
        "plan": dataclasses.asdict(plan),
        "points": sweeps.measure(plan, peaks, progress),
        "modelled": sweeps.modelled(),
        "report": None,
    }
    if report:
        from microbench.report import measure_report

        result["report"] = measure_report(peaks, peer=peer)
    result["wall_s"] = time.perf_counter() - t0
    harness.write_json_atomic(Path(out_dir) / "phases.json", validate_result(result))
    return result


def summary_markdown(peaks: dict, phases: dict) -> str:
    """One markdown table of the roofs and every roofline phase point."""
    lines = [f"# Roofline summary: {peaks['machine']}", "",
             f"Measured {peaks['environment'].get('date_utc', '?')[:10]}, jax "
             f"{peaks['environment'].get('jax_version', '?')}, "
             f"model '{phases['model']['preset']}' ({phases['model']['params'] / 1e6:.1f}M "
             f"params, {phases['model']['dtype']}).", "", "| roof | value | source |",
             "|---|---|---|"]
    for r in peaks["roofs"]["compute"] + peaks["roofs"]["memory"]:
        unit = "FLOP/s" if r["kind"] == "compute" else "B/s"
        flag = " (SUSPECT)" if r.get("suspect") else ""
        lines.append(f"| {r['name']}{flag} | {plot.fmt_si(r['value'], unit)} | {r['source']} |")
    lines += ["", "| variant | phase | batch | context | FLOP/byte | GFLOP/s | GB/s | ms | "
              "bound | level | measured/predicted |", "|" + "---|" * 11]
    for p in phases["points"]:
        if p["sweep"] != "roofline":
            continue
        r = summary_row(p)
        ratio = f"{r['meas/pred']:.2f}" if r["meas/pred"] is not None else "-"
        lines.append(f"| {r['label']} | {r['phase']} | {r['batch']} | {r['context']} | "
                     f"{r['FLOP/byte']:.2f} | {r['GFLOP/s']:.1f} | {r['GB/s']:.1f} | "
                     f"{r['ms']:.3f} | {r['bound']} | {r['level']} | {ratio} |")
    if phases.get("report"):
        from microbench.report import format_report

        lines += ["", "## Speed report", "", "```", format_report(phases["report"]), "```"]
    return "\n".join(lines) + "\n"


def draw(out_dir, data_dir=None) -> list[Path]:
    """Every figure from saved peaks.json and phases.json (in data_dir, default out_dir)."""
    data, out = Path(data_dir or out_dir), Path(out_dir)
    peaks = validate_result(json.loads((data / "peaks.json").read_text()))
    written = [plot.save(plot.roofline_figure([peaks]), out / "roofline.png")]
    phases_file = data / "phases.json"
    if phases_file.exists():
        phases = validate_result(json.loads(phases_file.read_text()))
        for name in PHASE_FIGURES:
            written.append(plot.save(plot.FIGURES[name]([phases]), out / f"{name}.png"))
        summary = out / "summary.md"
        harness.write_text_atomic(summary, summary_markdown(peaks, phases))
        written.append(summary)
    return written


def run(quick: bool, out_dir, peer: bool = True, progress: bool = True) -> dict:
    """The whole main job; returns {"peaks", "phases", "files"}."""
    from microbench.peaks import measure_peaks

    peaks = measure_peaks(quick, out_dir, progress=progress)
    plan = sweeps.QUICK if quick else sweeps.PhasePlan()
    phases = measure_phases(plan, peaks, quick, out_dir, report=not quick, peer=peer,
                            progress=progress)
    return {"peaks": peaks, "phases": phases, "files": draw(out_dir)}
