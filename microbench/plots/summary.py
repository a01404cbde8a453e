"""The text of a roofline run, from its saved results, without JAX: summary.md (the roofs,
the phase points beside their predictions, the band count) and the speed report's lines.
plots.saved draws it with the figures; `phases --report` and `run` print it.
"""

from __future__ import annotations

from microbench.plots.claims import BACKENDS, backends, reason_text
from microbench.plots.common import fmt_si
from microbench.plots.roofline import rate_unit, ridge_label
from microbench.roofline import BAND
from microbench.schema import point_sweeps

# What the speed report aims at: decode batch 1 at this fraction of the main-memory read roof,
# prefill at this fraction of the f32 GEMM roof, this speed-up over the Hugging Face peer.
TARGETS = {"decode_over_dram": 0.70, "prefill_over_gemm": 0.80, "speedup_over_peer": 1.5}


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


def roof_rows(peaks: dict) -> list[str]:
    lines = ["| roof | value | reached by | roof / best peer | rounds spread |",
             "|---|---|---|---|---|"]
    for r in peaks["roofs"]["compute"] + peaks["roofs"]["memory"]:
        unit = rate_unit(r)  # an integer GEMM does operations: OP/s
        flag = " (SUSPECT: " + r["reason"] + ")" if r.get("suspect") else ""
        ratio = r.get("ratio_roof_over_best_peer")
        spread = (f"{r['spread']:.0%}" + (" UNSTABLE" if r["unstable"] else "")
                  if "spread" in r else "-")
        lines.append(f"| {r['name']}{flag} | {fmt_si(r['value'], unit)} | {r['source']} | "
                     f"{f'{ratio:.3f}' if ratio is not None else '-'} | {spread} |")
    for r in peaks["roofs"].get("compiler", []):
        unit = rate_unit(r)
        lines.append(f"| compiler level: {r['name']} | {fmt_si(r['value'], unit)} | "
                     f"{r['source']} | - | - |")
    lines.append("")
    compute = {r["name"]: r for r in peaks["roofs"]["compute"]}
    lines += [f"- {ridge_label(ridge, compute.get(ridge['compute']))}"
              for ridge in peaks["roofs"].get("ridges", [])]
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
    pred = [p for p in points if p.get("measured_over_predicted") is not None]
    inside = [p for p in pred if BAND[0] <= p["measured_over_predicted"] <= BAND[1]]
    return {"n": len(pred), "inside": len(inside), "band": list(BAND),
            "suspect": sum(bool(p.get("suspect")) for p in pred),
            "outside": [p for p in pred if p not in inside]}


def probe_lines(phases: dict) -> list[str]:
    """The drift probes: which program, their reference in the rounds, the window a point's
    factor is taken over, and how well a point's probe before it agrees with the one after it
    (the correlation of their logs over the points): near 1, the bandwidth drifts slowly and
    the probes follow it; near 0, it moves within a point's time."""
    ref = (phases.get("peaks") or {}).get("probe_reference") or {}
    if not ref.get("probe") or not ref.get("read_bytes_per_s"):
        return []
    points = phases["points"]
    pairs = [(d["before"]["read_bytes_per_s"], d["after"]["read_bytes_per_s"])
             for d in (p.get("drift") or {} for p in points) if d.get("before") and d.get("after")]
    windows = sorted({(p.get("drift") or {}).get("window") for p in points} - {None})
    factors = [p["drift"]["memory"] for p in points if (p.get("drift") or {}).get("before")]
    line = (f"- drift probes: {ref['probe']}, reference {ref['read_bytes_per_s'] / 1e9:.1f} GB/s "
            f"(its median in the rounds); GEMM probe reference "
            f"{(ref.get('gemm_flops_per_s') or 0) / 1e9:.0f} GFLOP/s")
    if factors:
        line += (f"; memory factors {min(factors):.2f}-{max(factors):.2f}"
                 + (f", each the median over {windows[-1]} neighbouring points' probes"
                    if windows else ""))
    if len(pairs) >= 3:
        import numpy as np

        logs = np.log(np.array(pairs))
        r = float(np.corrcoef(logs[:, 0], logs[:, 1])[0, 1])
        line += (f"; a point's read probe before vs after it: correlation {r:.2f} over "
                 f"{len(pairs)} points (near 1: slow drift the probes follow; near 0: the "
                 "bandwidth moves within a point's time)")
    level = (phases.get("peaks") or {}).get("read_level")
    if level:
        line += (f"\n- predicted at the probe's program's read level: {level['program']} "
                 f"{level['value'] / 1e9:.1f} GB/s in the rounds, where the roof, "
                 f"{level['roof_program']}, read {level['roof_value'] / 1e9:.1f} "
                 f"({level['roof_value'] / level['value']:.2f}x): the probes scale the program "
                 "they measure")
    return [line]


def reasons(point: dict) -> str:
    """A point's measured reasons for the table: outside the band (its op clause said as a
    separate profile's, claims.reason_text), and above its roof."""
    outside = point.get("outside_reason")
    return "; ".join(filter(None, (
        reason_text(outside, point.get("measured_over_predicted")) if outside else None,
        point.get("reason"))))


def summary_markdown(peaks: dict, phases: dict) -> str:
    """Markdown: the roofs, the phase points with their predictions, and the band count."""
    lines = [f"# Roofline summary: {peaks['machine']}", "",
             f"Measured {peaks['environment'].get('date_utc', '?')[:10]}, jax "
             f"{peaks['environment'].get('jax_version', '?')}, "
             f"model '{phases['model']['preset']}' ({phases['model']['params'] / 1e6:.1f}M "
             f"params, {phases['model']['dtype']}); backend: "
             f"{backends(phases['points'])}.", ""]
    lines += roof_rows(peaks)
    lines += probe_lines(phases)
    band = band_summary(phases["points"])
    lines += ["", f"**{band['inside']} of {band['n']} phase points within "
              f"{band['band'][0]}-{band['band'][1]} of their prediction**; "
              f"{band['suspect']} flagged above their roof.", "",
              "| variant | phase | batch | context | FLOP/byte | GFLOP/s | GB/s | ms | "
              "bound | level | measured/predicted | reason (outside the band or above the "
              "roof) |",
              "|" + "---|" * 12]
    for p in phases["points"]:
        if "roofline" not in point_sweeps(p) and "outside_reason" not in p \
                and not p.get("suspect"):
            continue
        r = summary_row(p)
        ratio = f"{r['meas/pred']:.2f}" if r["meas/pred"] is not None else "-"
        flag = " SUSPECT" if p.get("suspect") else ""
        lines.append(f"| {r['label']} | {r['phase']} | {r['batch']} | {r['context']} | "
                     f"{r['FLOP/byte']:.2f} | {r['GFLOP/s']:.1f} | {r['GB/s']:.1f} | "
                     f"{r['ms']:.3f} | {r['bound']} | {r['level']} | {ratio}{flag} | "
                     f"{reasons(p)} |")
    if phases.get("report"):
        lines += ["", "## Speed report", "", "```", format_report(phases["report"]), "```"]
    lines += skipped_lines(peaks, phases)
    return "\n".join(lines) + "\n"


def moment_factor(point: dict, key: str, roof_value: float) -> float:
    """The roof of the point's moment (its prediction's, drift-scaled and capped at the best
    round, roofline.drift_cap) over the roof as measured in the rounds."""
    pred = point.get("predicted") or {}
    now = pred.get("memory_bytes_per_s" if key == "memory" else "compute_flops_per_s")
    return now / roof_value if now else 1.0


def above_moment(ratio: float, roof_spread: float | None) -> str:
    """A flag for a ratio to the roof of its moment above 1 by more than the roof's spread:
    the phase cannot outrun the hardware, so the short probe of its moment caught a dip that
    the phase did not see (the ratio to the rounds' roof is the one to read); else ""."""
    if roof_spread is None or ratio <= 1.0 + roof_spread:
        return ""
    return (f" [SUSPECT: above the roof of its moment by more than the roof's spread "
            f"({roof_spread:.0%}): its probe read low; read the rounds' ratio]")


def format_report(rep: dict) -> str:
    """The lines the `phases --report` command prints."""
    d = rep["decode"]
    lines = [
        f"model '{rep['model']}' ({rep['params'] / 1e6:.0f}M params, float32; backend: "
        f"{BACKENDS.get(rep.get('backend', 'xla'))})",
        f"decode  batch 1 @ context {d['context']}: {d['timing']['median'] * 1e3:.1f} ms/step, "
        f"{d['bytes_per_s']['median'] / 1e9:.1f} GB/s = {rep['decode_over_dram']:.2f} of the "
        f"'{rep['dram_roof']}' roof at its moment ({rep['dram_roof_bytes_per_s'] / 1e9:.1f} GB/s "
        f"x drift {rep['decode_drift']:.2f}; roof: {rep['dram_roof_program']}; target >= "
        f"{TARGETS['decode_over_dram']}); {rep['decode_over_dram_unscaled']:.2f} of the roof "
        f"as measured in the rounds; {rep['decode_over_best_dram']:.2f} of the best main-memory "
        f"roof ('{rep['dram_best']}', {rep['dram_best_bytes_per_s'] / 1e9:.1f} GB/s, reads + "
        "writes)" + above_moment(rep["decode_over_dram"], rep.get("dram_roof_spread")),
    ]
    for p, r, r0 in zip(rep["prefills"], rep["prefill_over_gemm"],
                        rep["prefill_over_gemm_unscaled"], strict=True):
        lines.append(
            f"prefill batch 1 x {p['context']} tokens: {p['timing']['median'] * 1e3:.0f} ms, "
            f"{p['flops_per_s']['median'] / 1e9:.0f} GFLOP/s = {r:.2f} of the f32 GEMM roof at "
            f"its moment ({rep['gemm_roof_flops_per_s'] / 1e9:.0f} GFLOP/s x drift "
            f"{moment_factor(p, 'compute', rep['gemm_roof_flops_per_s']):.2f}; roof: "
            f"{rep['gemm_roof_program']}; target >= "
            f"{TARGETS['prefill_over_gemm']}); {r0:.2f} of the roof as measured in the rounds"
            + above_moment(r, rep.get("gemm_roof_spread")))
    peer = rep.get("peer")
    if peer and peer.get("step_s"):
        lines.append(f"peer {peer['name']} (torch {peer['torch']}): "
                     f"{peer['step_s'] * 1e3:.1f} ms/step, {peer['bytes_per_s'] / 1e9:.1f} GB/s; "
                     f"ours is {rep['speedup_over_peer']:.2f}x faster "
                     f"(target >= {TARGETS['speedup_over_peer']})")
    elif peer:
        lines.append(f"peer {peer['name']}: {peer.get('error')}")
    return "\n".join(lines)


def skipped_lines(*results: dict | None) -> list[str]:
    """Markdown bullets for every `skipped` entry of the given results (once each)."""
    seen: dict[str, str] = {}
    for r in results:
        for s in (r or {}).get("skipped") or []:
            seen.setdefault(s["what"], s["why"])
    if not seen:
        return []
    return ["", "## Not measured on this path", ""] + [f"- skipped: {what}: {why}"
                                                       for what, why in seen.items()]
