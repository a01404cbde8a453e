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
from microbench.phases import make_probe, prediction_inputs, summary_row
from microbench.schema import KIND_PHASES, SCHEMA_VERSION, point_sweeps, validate_result
from refmodel import costs

PHASE_FIGURES = ("phases_roofline", "batch", "throughput", "crossover", "kv_cache", "gap")


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
        from microbench.report import measure_report

        result["report"] = measure_report(inputs, peer=peer, probe=probe)
    result["wall_s"] = time.perf_counter() - t0
    harness.write_json_atomic(Path(out_dir) / "phases.json", validate_result(result))
    return result


def _roof_rows(peaks: dict) -> list[str]:
    lines = ["| roof | value | reached by | roof / best peer | rounds spread |",
             "|---|---|---|---|---|"]
    for r in peaks["roofs"]["compute"] + peaks["roofs"]["memory"]:
        unit = "FLOP/s" if r["kind"] == "compute" else "B/s"
        flag = " (SUSPECT: " + r["reason"] + ")" if r.get("suspect") else ""
        ratio = r.get("ratio_roof_over_best_peer")
        spread = (f"{r['spread']:.0%}" + (" UNSTABLE" if r["unstable"] else "")
                  if "spread" in r else "-")
        lines.append(f"| {r['name']}{flag} | {plot.fmt_si(r['value'], unit)} | {r['source']} | "
                     f"{f'{ratio:.3f}' if ratio is not None else '-'} | {spread} |")
    for r in peaks["roofs"].get("compiler", []):
        unit = "FLOP/s" if r["kind"] == "compute" else "B/s"
        lines.append(f"| compiler level: {r['name']} | {plot.fmt_si(r['value'], unit)} | "
                     f"{r['source']} | - | - |")
    lines.append("")
    lines += [f"- {ridge['label']}" for ridge in peaks["roofs"].get("ridges", [])]
    for c in (peaks.get("hierarchy") or {}).get("checks", []):
        lines.append(f"- hierarchy {c['smaller']} >= {c['larger']}: "
                     f"{'ok' if c['ok'] else 'VIOLATED: ' + c['reason']}")
    for metric, d in (peaks.get("drift") or {}).items():
        vals = ", ".join(f"{p['value'] / 1e9:.3g}" for p in d["points"])
        lines.append(f"- drift of {metric} across the rounds: {vals} G/s (spread "
                     f"{d['spread']:.0%})")
    return lines


def band_summary(points: list[dict]) -> dict:
    """How many predicted points sit within the band, and which do not (with their reasons)."""
    from microbench.phases import BAND

    pred = [p for p in points if p.get("measured_over_predicted") is not None]
    inside = [p for p in pred if BAND[0] <= p["measured_over_predicted"] <= BAND[1]]
    return {"n": len(pred), "inside": len(inside), "band": list(BAND),
            "suspect": sum(bool(p.get("suspect")) for p in pred),
            "outside": [p for p in pred if p not in inside]}


def summary_markdown(peaks: dict, phases: dict) -> str:
    """Markdown: the roofs, the phase points with their predictions, and the band count."""
    lines = [f"# Roofline summary: {peaks['machine']}", "",
             f"Measured {peaks['environment'].get('date_utc', '?')[:10]}, jax "
             f"{peaks['environment'].get('jax_version', '?')}, "
             f"model '{phases['model']['preset']}' ({phases['model']['params'] / 1e6:.1f}M "
             f"params, {phases['model']['dtype']}).", ""]
    lines += _roof_rows(peaks)
    band = band_summary(phases["points"])
    lines += ["", f"**{band['inside']} of {band['n']} phase points within "
              f"{band['band'][0]}-{band['band'][1]} of their prediction**; "
              f"{band['suspect']} flagged above their roof.", "",
              "| variant | phase | batch | context | FLOP/byte | GFLOP/s | GB/s | ms | "
              "bound | level | measured/predicted | reason (outside the band) |",
              "|" + "---|" * 12]
    for p in phases["points"]:
        if "roofline" not in point_sweeps(p) and "outside_reason" not in p:
            continue
        r = summary_row(p)
        ratio = f"{r['meas/pred']:.2f}" if r["meas/pred"] is not None else "-"
        flag = " SUSPECT" if p.get("suspect") else ""
        lines.append(f"| {r['label']} | {r['phase']} | {r['batch']} | {r['context']} | "
                     f"{r['FLOP/byte']:.2f} | {r['GFLOP/s']:.1f} | {r['GB/s']:.1f} | "
                     f"{r['ms']:.3f} | {r['bound']} | {r['level']} | {ratio}{flag} | "
                     f"{p.get('outside_reason', '')} |")
    if phases.get("report"):
        from microbench.report import format_report

        lines += ["", "## Speed report", "", "```", format_report(phases["report"]), "```"]
    return "\n".join(lines) + "\n"


def draw(out_dir, data_dir=None) -> list[Path]:
    """Every figure from saved peaks.json and phases.json (in data_dir, default out_dir)."""
    data, out = Path(data_dir or out_dir), Path(out_dir)
    peaks = validate_result(json.loads((data / "peaks.json").read_text()))
    written = [plot.save(plot.roofline_figure([peaks]), out / "roofline.png"),
               plot.save(plot.hierarchy_figure([peaks]), out / "hierarchy.png")]
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
