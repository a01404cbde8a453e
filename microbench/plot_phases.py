"""The phase figures: drawn from a phases result (schema.KIND_PHASES) only, without JAX.

Part of the one plotting module (`microbench.plot`, which lists these in FIGURES and holds the
shared style helpers): measured points with their counted FLOPs and bytes and their roofline
prediction, the batch and context sweeps, and the modelled series of spec-database devices
(Williams, Waterman & Patterson, "Roofline", CACM 2009; the scaling book's inference chapter
for throughput vs interactivity).

Every title states what its plotted data show, computed from them (the pure `*_claim`
functions below); points are marked where the data say something about them: measured /
predicted outside BAND (circled, numbered, reasons as footnotes: a point's `outside_reason`,
or "unexplained"), measured above its roof (`suspect`: a red X), and, on modelled panels,
the roof that bounds each point (LIMITS). Ridge points come from `microbench.roofline.ridge`.
"""

from __future__ import annotations

import math
import textwrap
from collections import Counter
from collections.abc import Sequence

from matplotlib.figure import Figure

from microbench.plot import (
    PALETTE,
    SUSPECT_COLOR,
    _draw_compute,
    _draw_memory,
    _roof_ends,
    fmt_si,
    new_figure,
    styled,
)
from microbench.roofline import main_memory_name, ridge
from microbench.schema import KIND_PHASES, point_sweeps

PHASE_MARKERS = {"prefill": "s", "decode_attention": "o", "decode_ffn": "^", "decode": "D"}
BAND = (0.75, 1.25)  # measured / predicted inside this needs no note
SUSPECT_LABEL = "above its roof: measurement to explain"
OUTSIDE_LABEL = (f"circled n: measured/predicted outside [{BAND[0]}, {BAND[1]}] "
                 "(reason n below)")
# What bounds a modelled point: marker and legend text.
LIMITS = {"compute": ("s", "compute-bound"),
          "weights": ("o", "memory-bound: weight reads dominate"),
          "KV cache": ("v", "memory-bound: KV-cache reads dominate"),
          "activations": ("d", "memory-bound: activation traffic dominates"),
          "memory": ("o", "memory-bound (weights vs KV not recorded)")}


# ----------------------------------------------------------------------- selecting and roofs

def _phases_of(results: Sequence[dict]) -> list[dict]:
    out = [r for r in results if r.get("kind") == KIND_PHASES]
    if not out:
        raise ValueError("no phases result among the files (kind 'microbench.phases')")
    return out


def in_sweep(point: dict, sweep: str) -> bool:
    """True when a (possibly shared) point belongs to `sweep`."""
    return sweep in point_sweeps(point)


def _variant_colors(points: Sequence[dict]) -> dict:
    names = list(dict.fromkeys(p["variant"] for p in points))
    return {v: PALETTE[i % len(PALETTE)] for i, v in enumerate(names)}


def _gemm_roofs(result: dict) -> list[dict]:
    dtype = result["model"]["dtype"]
    return [r for r in result["peaks"]["roofs"]["compute"] if not r.get("suspect")
            and r["name"].startswith("GEMM") and r.get("dtype") == dtype]


def ridge_of(result: dict, memory_level: str | None = None) -> dict | None:
    """roofline.ridge of the model dtype's GEMM roof over a memory roof: the one named by
    `memory_level` (a point's predicted["memory_level"]), else main memory's read-only roof
    (level ending " read"), else main memory. None without both roofs."""
    gemm = _gemm_roofs(result)
    memory = [r for r in result["peaks"]["roofs"]["memory"] if not r.get("suspect")]
    caches = {level for level, _ in result["peaks"].get("cache_capacities") or []}
    main = [r for r in memory if r["level"] not in caches]
    main_name = main_memory_name(result.get("environment") or {})
    mem = (next((r for r in memory if r["level"] == memory_level), None)
           or next((r for r in main if r["level"].endswith(" read")), None)
           or next((r for r in main if r["level"] == main_name), None)
           or (main[0] if main else None))
    if not gemm or mem is None:
        return None
    return ridge(max(gemm, key=lambda r: r["value"]), mem)


def _machine_roofs(ax, result: dict, color: str = "0.4", prefix: str = "") -> list:
    """The measured roofs the predictions used (every memory level, the matrix roof of the
    model's dtype), each labelled on the line itself as well as in the legend. Returns the
    labels to place once the axes' limits are known (_place_roof_labels)."""
    roofs = result["peaks"]["roofs"]
    compute = _gemm_roofs(result)
    memory = [r for r in roofs["memory"] if not r.get("suspect")]
    bw_max, flops_max = _roof_ends(memory, compute)
    labels = []
    for roof in memory:
        _draw_memory(ax, roof, flops_max, color, prefix, dashed=False)
        labels.append(("memory", roof, f"{prefix}{roof['name']} {fmt_si(roof['value'], 'B/s')}"))
    for roof in compute:
        _draw_compute(ax, roof, bw_max, color, prefix, dashed=False)
        labels.append(("compute", roof,
                       f"{prefix}{roof['name']} {fmt_si(roof['value'], 'FLOP/s')}"))
    return labels


def _place_roof_labels(fig, ax, labels: list, color: str = "0.25") -> None:
    """Text along each memory diagonal (staggered so close lines stay legible) and above
    each compute roof at its right end. Called after the axes' limits are final."""
    fig.draw_without_rendering()  # settle the layout so the diagonals' angle is right
    x0, x1 = ax.get_xlim()
    memory = sorted((lb for lb in labels if lb[0] == "memory"), key=lambda lb: -lb[1]["value"])
    for n, (_, roof, text) in enumerate(memory):
        x = x0 * 2 ** (0.6 + 1.1 * n)
        (ax_, ay), (bx, by) = ax.transData.transform([(x, roof["value"] * x),
                                                       (2 * x, roof["value"] * 2 * x)])
        angle = math.degrees(math.atan2(by - ay, bx - ax_))
        ax.text(x, roof["value"] * x * 1.08, text, rotation=angle, rotation_mode="anchor",
                fontsize=8.5, color=color, ha="left", va="bottom", zorder=3,
                bbox={"facecolor": "white", "alpha": 0.75, "lw": 0, "pad": 0.6})
    for _, roof, text in (lb for lb in labels if lb[0] == "compute"):
        ax.text(x1 / 1.3, roof["value"] * 1.08, text, fontsize=8.5, color=color, ha="right",
                va="bottom")


# ----------------------------------------------------------------------- notes on points

MAX_NOTES = 14  # footnote lines a figure can hold; the rest are in summary.md


def short_reason(reason: str) -> str:
    """The most specific clause of a point's measured reason (the slowest op, else what the
    compiler's own kernel reaches, else the first clause), for a one-line footnote."""
    parts = [p.strip() for p in reason.split(";") if p.strip()]
    pick = (next((p for p in parts if p.startswith("slowest op")), None)
            or next((p for p in parts if p.startswith("XLA's own")), None)
            or (parts[0] if parts else reason))
    return textwrap.shorten(pick, 120)


class Notes:
    """Marks on measured points and the footnote that explains them: a circle and number for
    measured/predicted outside BAND (number = the point's reason: `outside_reason`, else
    "unexplained"), a red X for a point flagged `suspect` (measured above its roof)."""

    def __init__(self):
        self.reasons: dict[str, dict] = {}  # reason -> {point id: measured/predicted}
        self.suspects: dict[tuple, str] = {}

    @staticmethod
    def _id(point: dict) -> tuple:
        return (point.get("machine"), point["variant"], point["phase"], point["batch"],
                point["context"])

    def key(self, point: dict) -> int | None:
        """The footnote number of a point outside BAND (None inside it)."""
        ratio = point.get("measured_over_predicted")
        if ratio is None or BAND[0] <= ratio <= BAND[1]:
            return None
        reason = short_reason(point.get("outside_reason") or "unexplained")
        self.reasons.setdefault(reason, {})[self._id(point)] = ratio
        return list(self.reasons).index(reason) + 1

    def mark(self, ax, point: dict, x: float, y: float) -> None:
        k = self.key(point)
        if k is not None:
            ax.scatter([x], [y], s=230, facecolors="none", edgecolors="black", lw=1.0,
                       zorder=6)
            ax.annotate(str(k), (x, y), xytext=(7, -13), textcoords="offset points",
                        fontsize=8, fontweight="bold", zorder=7)
        if point.get("suspect"):
            ax.scatter([x], [y], marker="X", s=150, color=SUSPECT_COLOR, zorder=8)
            self.suspects[self._id(point)] = (
                f"{point['variant']} {point['phase']} B={point['batch']}: "
                f"{point.get('reason') or 'no reason recorded'}")

    def legend(self, ax) -> None:
        if self.reasons:
            ax.scatter([], [], s=120, facecolors="none", edgecolors="black", label=OUTSIDE_LABEL)
        if self.suspects:
            ax.scatter([], [], marker="X", s=80, color=SUSPECT_COLOR, label=SUSPECT_LABEL)

    def text(self) -> str:
        lines = [f"{k}: {reason} ({len(r)} point{'s' * (len(r) > 1)}, measured/predicted "
                 f"{min(r.values()):.2g}-{max(r.values()):.2g})" for k, (reason, r) in
                 enumerate(self.reasons.items(), 1)]
        lines += [f"X ({SUSPECT_LABEL}): {s}" for s in self.suspects.values()]
        if len(lines) > MAX_NOTES:
            more = len(lines) - MAX_NOTES + 1
            lines = lines[:MAX_NOTES - 1] + [f"... {more} more: every reason in full in "
                                             f"summary.md and phases.json (outside_reason)"]
        return "\n".join(textwrap.shorten(line, 175) for line in lines)

    def footnote(self, fig) -> None:
        if self.reasons or self.suspects:
            fig.supxlabel(self.text(), fontsize=9, ha="left", x=0.01)


# ----------------------------------------------------------------------- claims from data

def ratio_claim(what: str, series: dict[str, list[tuple[float, float]]]) -> str:
    """'step time x1.8 (gqa), x5.3 (gqa moe) from batch 1 to 8': last over first value of
    each series [(batch, value), ...]; the batch range is stated once when shared."""
    parts, ranges = [], set()
    for name, pts in series.items():
        pts = sorted(pts)
        if len(pts) < 2:
            continue
        (b0, v0), (b1, v1) = pts[0], pts[-1]
        parts.append(f"x{v1 / v0:.2g} ({name})")
        ranges.add((b0, b1))
    if not parts:
        return f"{what}: fewer than two batches"
    span = (f"from batch {min(ranges)[0]:g} to {min(ranges)[1]:g}" if len(ranges) == 1
            else "from the smallest to the largest batch")
    return f"{what} {', '.join(parts)} {span}"


def below_ridge_claim(series: dict[str, list[tuple[float, float, float]]],
                      ridge_x: float) -> str:
    """For each series [(batch, intensity, step time), ...]: how the step time grew from the
    smallest batch to the largest one still below the ridge, beside the batch's growth."""
    parts = []
    for name, pts in series.items():
        pts = sorted(pts)
        below = [p for p in pts if p[1] < ridge_x]
        if len(below) < 2:
            continue
        (b0, _, t0), (b1, _, t1) = below[0], below[-1]
        parts.append(f"{name}: step time x{t1 / t0:.2g} for x{b1 / b0:g} tokens "
                     f"(batch {b0:g} to {b1:g})")
    return ("below the ridge: " + "; ".join(parts)) if parts else \
        "fewer than two batches below the ridge"


def roofline_claim(points: Sequence[dict]) -> str:
    """Which roof the prediction puts each phase under, counted over the plotted points."""
    parts = []
    for phase in PHASE_MARKERS:
        bounds = Counter((p.get("predicted") or {}).get("bound") for p in points
                         if p["phase"] == phase)
        if bounds:
            parts.append(f"{phase} " + ", ".join(f"{b or 'unpredicted'} {n}/{bounds.total()}"
                                                 for b, n in bounds.most_common()))
    return "Predicted bound: " + " · ".join(parts)


def limit_runs(xs: Sequence[float], limits: Sequence[str], unit: str = "") -> str:
    """'weights at 256-1,024, KV cache at 2,048-131,072': consecutive runs of one limit."""
    runs: list[list] = []
    for x, lim in zip(xs, limits, strict=True):
        if runs and runs[-1][0] == lim:
            runs[-1][2] = x
        else:
            runs.append([lim, x, x])
    return ", ".join(f"{lim} at {unit}{a:,.0f}" + (f"-{b:,.0f}" if b != a else "")
                     for lim, a, b in runs)


def limit_of(bound: str | None, memory_by: str | None) -> str:
    """The LIMITS key of a modelled point: compute, or what dominates a memory-bound one."""
    return "compute" if bound == "compute" else (memory_by or "memory")


def fit_note(row: dict) -> str:
    """'' when the weights fit one device (or the row does not say), else
    "bf16 weights do not fit one H100 SXM: 2 devices' worth"."""
    n = row.get("weight_devices")
    if not n or n <= 1:
        return ""
    dtype = {"bfloat16": "bf16"}.get(row.get("weights_dtype"), row.get("weights_dtype"))
    return (f"{dtype + ' ' if dtype else ''}weights do not fit one "
            f"{row.get('device', 'device')}: {n} devices' worth")


def crossover(contexts: Sequence[float], attention: Sequence[float], ffn: float
              ) -> float | None:
    """The context where attention time first reaches the FFN time, interpolated in log-log
    between the two contexts around it; None if it never does from below in the range."""
    pairs = list(zip(contexts, attention, strict=True))
    for (c0, a0), (c1, a1) in zip(pairs, pairs[1:], strict=False):
        if a0 < ffn <= a1:
            f = (math.log(ffn) - math.log(a0)) / (math.log(a1) - math.log(a0))
            return math.exp(math.log(c0) + f * (math.log(c1) - math.log(c0)))
    return None


def crossover_decision(contexts: Sequence[float], attention: Sequence[dict], ffn: dict
                       ) -> dict:
    """Where attention overtakes the FFN, only as far as the noise allows.

    `attention` is one timing {median, p10, p90} per context (ascending), `ffn` one timing.
    Attention is above (below) the FFN at a context when its p10-p90 range lies wholly above
    (below) the FFN's. Returns {kind, context, label}: kind "above" (already above at the
    smallest context), "crossing" (below at some context, above at a later one: the medians'
    log-log crossing between the last resolved-below and first resolved-above contexts), or
    "none" (no crossing resolved within the noise)."""
    sides = [1 if a["p10"] > ffn["p90"] else -1 if a["p90"] < ffn["p10"] else 0
             for a in attention]
    if sides and sides[0] > 0:
        return {"kind": "above", "context": None,
                "label": f"already above at the smallest context ({contexts[0]:,.0f})"}
    first_above = next((i for i, s in enumerate(sides) if s > 0), None)
    below = [i for i, s in enumerate(sides[:first_above]) if s < 0] if first_above else []
    if first_above is None or not below:
        label = "no crossing resolved within the noise"
        if first_above is not None:
            label += f" (above from {contexts[first_above]:,.0f})"
        return {"kind": "none", "context": None, "label": label}
    i, j = below[-1], first_above
    x = crossover(contexts[i:j + 1], [a["median"] for a in attention[i:j + 1]], ffn["median"])
    return {"kind": "crossing", "context": x,
            "label": f"crosses at ~{float(f'{x:.2g}'):,.0f} (between {contexts[i]:,.0f} and "
                     f"{contexts[j]:,.0f})"}


def _timing_of(seconds: float) -> dict:
    return {"median": seconds, "p10": seconds, "p90": seconds}


# ----------------------------------------------------------------------- figures

def _draw_phase_points(ax, points: Sequence[dict], colors: dict, key: str, notes: Notes):
    """Measured points (filled, p10-p90 bars) and their predictions (hollow), joined."""
    for p in points:
        c, m = colors[p[key]], PHASE_MARKERS[p["phase"]]
        y, (lo, hi) = p["flops_per_s"]["median"], (p["flops_per_s"]["p10"],
                                                    p["flops_per_s"]["p90"])
        ax.errorbar([p["intensity"]], [y], yerr=[[y - lo], [hi - y]], fmt=m, color=c, ms=9,
                    mec="black", zorder=5)
        notes.mark(ax, p, p["intensity"], y)
        pred = p.get("predicted")
        if pred:
            ax.scatter([p["intensity"]], [pred["flops_per_s"]], marker=m, s=80,
                       facecolors="none", edgecolors=c, zorder=4)
            ax.plot([p["intensity"]] * 2, [y, pred["flops_per_s"]], color=c, lw=0.8, alpha=0.6)


@styled
def phases_roofline_figure(results: Sequence[dict], title: str | None = None) -> Figure:
    """Measured phase points (filled) and their predictions (hollow) on the measured roofs.

    One machine: colours are variants. Several machines (e.g. this CPU and a GPU): colours
    are machines, each with its own roofs."""
    runs = _phases_of(results)
    fig, ax = new_figure(17, 12)
    legend, notes, labels = {}, Notes(), []
    for i, result in enumerate(runs):
        points = [{**p, "machine": result["machine"]} for p in result["points"]
                  if in_sweep(p, "roofline")]
        if len(runs) == 1:
            labels += _machine_roofs(ax, result)
            colors, key = _variant_colors(points), "variant"
            r = ridge_of(result, Counter((p.get("predicted") or {}).get("memory_level")
                                         for p in points).most_common(1)[0][0])
            if r:
                ax.axvline(r["flops_per_byte"], color="0.3", ls=":", lw=1, label=r["label"])
        else:
            colors, key = {result["machine"]: PALETTE[i % len(PALETTE)]}, "machine"
            labels += _machine_roofs(ax, result, colors[result["machine"]],
                                     f"[{result['machine']}] ")
        _draw_phase_points(ax, points, colors, key, notes)
        legend.update(colors)
    for name, c in legend.items():
        ax.plot([], [], "s", color=c, label=f"{'variant' if len(runs) == 1 else 'machine'}: "
                f"{name}")
    for ph, m in PHASE_MARKERS.items():
        ax.plot([], [], m, color="0.3", mfc="0.6", label=f"phase: {ph}")
    ax.scatter([], [], marker="o", facecolors="none", edgecolors="0.3",
               label="hollow: roofline prediction of the same phase")
    notes.legend(ax)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("Arithmetic intensity (counted FLOP / counted byte)")
    ax.set_ylabel("Achieved performance (FLOP / s)")
    model = runs[0]["model"]
    points = [p for p in runs[0]["points"] if in_sweep(p, "roofline")]
    machines = ", ".join(r["machine"] for r in runs)
    fig.suptitle(title or f"Phases of the '{model['preset']}' model ({fmt_si(model['params'], '')}"
                 f"parameters, {model['dtype']}) on {machines}", fontsize=14)
    prefill = next((p["context"] for p in points if p["phase"] == "prefill"), "?")
    decode = next((p["context"] for p in points if p["phase"] != "prefill"), "?")
    ax.set_title(f"{roofline_claim(points)}\nBatch 1; prefill of {prefill} tokens; decode at "
                 f"context {decode}.  Error bars: p10-p90.", fontsize=10)
    fig.legend(*ax.get_legend_handles_labels(), loc="outside right upper", ncol=1,
               frameon=False, fontsize=8.5)
    notes.footnote(fig)
    _place_roof_labels(fig, ax, labels)
    return fig


def _series(points: Sequence[dict], variant: str) -> list[dict]:
    return sorted((p for p in points if p["variant"] == variant), key=lambda p: p["batch"])


@styled
def batch_figure(results: Sequence[dict], title: str | None = None) -> Figure:
    """Decode FFN vs batch, dense and MoE: intensity, step time and achieved FLOP/s."""
    result = _phases_of(results)[0]
    points = [p for p in result["points"] if in_sweep(p, "batch") and p["phase"] == "decode_ffn"]
    fig = Figure(figsize=(19, 6.6), layout="constrained")
    ax1, ax2, ax3 = fig.subplots(1, 3)
    level = Counter((p.get("predicted") or {}).get("memory_level")
                    for p in points).most_common(1)[0][0] if points else None
    r, notes = ridge_of(result, level), Notes()
    variants = list(dict.fromkeys(p["variant"] for p in points))
    for j, v in enumerate(variants):
        ps, c = _series(points, v), PALETTE[j % len(PALETTE)]
        b = [p["batch"] for p in ps]
        ax1.plot(b, [p["intensity"] for p in ps], "o-", color=c, label=v)
        t = [p["timing"]["median"] * 1e3 for p in ps]
        err = [[x - p["timing"]["p10"] * 1e3 for x, p in zip(t, ps, strict=True)],
               [p["timing"]["p90"] * 1e3 - x for x, p in zip(t, ps, strict=True)]]
        ax2.errorbar(b, t, yerr=err, fmt="o-", color=c, capsize=3, label=f"{v}: measured")
        ax3.plot(b, [p["flops_per_s"]["median"] for p in ps], "o-", color=c,
                 label=f"{v}: measured")
        for p, x, y2 in zip(ps, b, t, strict=True):
            notes.mark(ax2, p, x, y2)
            notes.mark(ax3, p, x, p["flops_per_s"]["median"])
        pred = [p["predicted"] for p in ps if p.get("predicted")]
        if len(pred) == len(ps):
            ax2.plot(b, [q["time_s"] * 1e3 for q in pred], "--", color=c,
                     label=f"{v}: roofline prediction")
            ax3.plot(b, [q["flops_per_s"] for q in pred], "--", color=c,
                     label=f"{v}: roofline prediction")
            for x, q in zip(b, pred, strict=True):
                ax2.scatter([x], [q["time_s"] * 1e3], marker="s" if q["bound"] == "compute"
                            else "o", s=45, facecolors="white", edgecolors=c, zorder=4)
    ax2.scatter([], [], marker="o", s=45, facecolors="white", edgecolors="0.3",
                label="hollow o / s: predicted memory- / compute-bound")
    if r:
        ax1.axhline(r["flops_per_byte"], color="0.3", ls=":", label=r["label"])
    notes.legend(ax2)
    for ax in (ax1, ax2, ax3):
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("Batch (tokens decoded per step)")
        ax.legend(frameon=False, fontsize=8.5)
    ax1.set_ylabel("Decode-FFN intensity (FLOP / byte)")
    ax2.set_ylabel("Time per decode-FFN step, all layers (ms)")
    ax3.set_ylabel("Achieved (FLOP / s)")
    by = {v: _series(points, v) for v in variants}
    ax1.set_title(ratio_claim("intensity", {v: [(p["batch"], p["intensity"]) for p in ps]
                                            for v, ps in by.items()}), fontsize=10)
    below = (below_ridge_claim({v: [(p["batch"], p["intensity"], p["timing"]["median"])
                                    for p in ps] for v, ps in by.items()}, r["flops_per_byte"])
             if r else "no ridge: no GEMM or main-memory roof in the file")
    ax2.set_title(textwrap.fill(ratio_claim("measured step time", {
        v: [(p["batch"], p["timing"]["median"]) for p in ps] for v, ps in by.items()}), 70)
        + "\n" + textwrap.fill(below, 70), fontsize=10)
    ax3.set_title(ratio_claim("measured FLOP/s", {
        v: [(p["batch"], p["flops_per_s"]["median"]) for p in ps] for v, ps in by.items()}),
        fontsize=10)
    fig.suptitle(title or f"Decode FFN vs batch on {result['machine']}", fontsize=14)
    notes.footnote(fig)
    return fig


def throughput_claim(steps: Sequence[dict]) -> str:
    """Per series: the batch with the most tokens/s per system, and what happened after it."""
    parts = []
    for name in dict.fromkeys(p["series"] for p in steps):
        ps = sorted((p for p in steps if p["series"] == name), key=lambda p: p["batch"])
        tps = [p["batch"] / p["timing"]["median"] for p in ps]
        k = max(range(len(ps)), key=tps.__getitem__)
        text = f"{name}: most tokens/s per system at batch {ps[k]['batch']} ({tps[k]:,.0f})"
        if k < len(ps) - 1:
            text += f", {tps[-1]:,.0f} at batch {ps[-1]['batch']}"
        parts.append(text)
    return "; ".join(parts)


@styled
def throughput_figure(results: Sequence[dict], title: str | None = None) -> Figure:
    """Tokens/s per system vs tokens/s per user across batch: measured here, modelled there."""
    runs = _phases_of(results)
    result = runs[0]
    fig = Figure(figsize=(14, 6.8), layout="constrained")
    ax1, ax2 = fig.subplots(1, 2)
    notes = Notes()
    steps = [{**p, "series": f"{p['variant']}" + (f" [{r['machine']}]" if len(runs) > 1 else "")}
             for r in runs for p in r["points"] if in_sweep(p, "batch") and p["phase"] == "decode"]
    for j, v in enumerate(dict.fromkeys(p["series"] for p in steps)):
        ps = sorted((p for p in steps if p["series"] == v), key=lambda p: p["batch"])
        user = [1 / p["timing"]["median"] for p in ps]
        system = [p["batch"] / p["timing"]["median"] for p in ps]
        ax1.plot(user, system, "o-", color=PALETTE[j % len(PALETTE)], label=v)
        for p, x, y in zip(ps, user, system, strict=True):
            ax1.annotate(f"B={p['batch']}", (x, y), fontsize=8, xytext=(3, 3),
                         textcoords="offset points")
            notes.mark(ax1, p, x, y)
    notes.legend(ax1)
    ax1.set_title(f"Measured: '{result['model']['preset']}' on "
                  f"{', '.join(r['machine'] for r in runs)}\n"
                  + textwrap.fill(throughput_claim(steps), 80), fontsize=10)
    rows = result["modelled"]["throughput"]
    for j, dev in enumerate(dict.fromkeys(r["device"] for r in rows)):
        rs, c = [r for r in rows if r["device"] == dev], PALETTE[j % len(PALETTE)]
        note = fit_note(rs[0])
        ax2.plot([r["tokens_per_s_user"] for r in rs], [r["tokens_per_s_system"] for r in rs],
                 ":" if note else "-", color=c, label=dev + (f" ({note})" if note else ""))
        for r in rs:
            marker = LIMITS[limit_of(r.get("bound"), r.get("memory_by"))][0]
            ax2.scatter([r["tokens_per_s_user"]], [r["tokens_per_s_system"]], marker=marker,
                        s=30, color=c if r["fits_memory"] else "white", edgecolors=c, zorder=4)
    if rows:
        seen = Counter(limit_of(r.get("bound"), r.get("memory_by")) for r in rows)
        for lim, n in seen.items():
            ax2.scatter([], [], marker=LIMITS[lim][0], color="0.4", label=f"{LIMITS[lim][1]} "
                        f"({n} of {len(rows)} points)")
        ax2.scatter([], [], marker="o", color="white", edgecolors="0.4",
                    label="hollow: weights + KV cache do not fit one device")
        batches = sorted({r["batch"] for r in rows})
        ax2.set_title(f"Modelled: {rows[0]['preset']} bf16, context {rows[0]['context']}, "
                      f"batch {batches[0]}..{batches[-1]}\n" + textwrap.fill(
                          "what bounds each step: " + ", ".join(
                              f"{LIMITS[lim][1]} {n}/{len(rows)}"
                              for lim, n in seen.most_common()), 80), fontsize=10)
    for ax in (ax1, ax2):
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("Interactivity (tokens / s per user)")
        ax.set_ylabel("Throughput (tokens / s per system)")
        ax.legend(frameon=False, fontsize=8.5)
    fig.suptitle(title or "Throughput vs interactivity across batch", fontsize=14)
    notes.footnote(fig)
    return fig


@styled
def crossover_figure(results: Sequence[dict], title: str | None = None) -> Figure:
    """Decode attention vs decode FFN time vs context: measured per variant, and modelled."""
    result = _phases_of(results)[0]
    fig = Figure(figsize=(14, 6.8), layout="constrained")
    ax1, ax2 = fig.subplots(1, 2)
    notes = Notes()
    pts = [p for p in result["points"] if in_sweep(p, "context")]
    for j, v in enumerate(dict.fromkeys(p["variant"] for p in pts)):
        c = PALETTE[j % len(PALETTE)]
        att = sorted((p for p in pts if p["variant"] == v and p["phase"] == "decode_attention"),
                     key=lambda p: p["context"])
        ffn = next((p for p in pts if p["variant"] == v and p["phase"] == "decode_ffn"), None)
        ctx = [p["context"] for p in att]
        t = [p["timing"]["median"] * 1e3 for p in att]
        err = [[x - p["timing"]["p10"] * 1e3 for x, p in zip(t, att, strict=True)],
               [p["timing"]["p90"] * 1e3 - x for x, p in zip(t, att, strict=True)]]
        label = f"{v}: attention"
        if ffn:
            d = crossover_decision(ctx, [p["timing"] for p in att], ffn["timing"])
            label += f"; vs its FFN: {d['label']}"
            ax1.axhspan(ffn["timing"]["p10"] * 1e3, ffn["timing"]["p90"] * 1e3, color=c,
                        alpha=0.12, lw=0)
            ax1.axhline(ffn["timing"]["median"] * 1e3, color=c, ls="--", lw=1)
            notes.mark(ax1, ffn, ctx[0] if ctx else 1, ffn["timing"]["median"] * 1e3)
            if d["kind"] == "crossing":
                ax1.axvline(d["context"], color=c, ls=":", lw=1.2)
        ax1.errorbar(ctx, t, yerr=err, fmt="o-", color=c, capsize=3, label=label)
        for p, x, y in zip(att, ctx, t, strict=True):
            notes.mark(ax1, p, x, y)
    ax1.plot([], [], "--", color="0.3", label="dashed + band: that variant's decode FFN "
             "(median, p10-p90)")
    notes.legend(ax1)
    ax1.set_title(f"Measured, batch {pts[0]['batch'] if pts else '?'}, "
                  f"'{result['model']['preset']}' on {result['machine']}\na crossing counts "
                  "only where the p10-p90 ranges of attention and FFN are apart", fontsize=9.5)
    ax1.set_ylabel("Time per decode step, all layers (ms)")
    _modelled_crossover(ax2, result["modelled"]["crossover"])
    for ax in (ax1, ax2):
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("Context (cached tokens per sequence)")
        ax.legend(frameon=False, fontsize=8)
    fig.suptitle(title or "When does attention overtake the FFN in decode?", fontsize=14)
    notes.footnote(fig)
    return fig


def _modelled_crossover(ax, rows: list[dict]) -> None:
    if not rows:
        return
    ctx = [r["context"] for r in rows]
    ax.plot(ctx, [r["attention_s"] * 1e3 for r in rows], "-", color=PALETTE[0])
    ax.plot(ctx, [r["ffn_s"] * 1e3 for r in rows], "--", color="0.3", label="decode FFN")
    lims = [limit_of(r.get("attention_bound"), r.get("attention_memory_by")) for r in rows]
    for lim in dict.fromkeys(lims):
        xs = [(r["context"], r["attention_s"] * 1e3) for r, k in zip(rows, lims, strict=True)
              if k == lim]
        ax.scatter(*zip(*xs, strict=True), marker=LIMITS[lim][0], color=PALETTE[0], zorder=4,
                   label=f"decode attention: {LIMITS[lim][1]}")
    d = crossover_decision(ctx, [_timing_of(r["attention_s"]) for r in rows],
                           _timing_of(rows[0]["ffn_s"]))
    if d["kind"] == "crossing":
        ax.axvline(d["context"], color=SUSPECT_COLOR, ls=":", label=d["label"])
    ffn_lim = LIMITS[limit_of(rows[0].get("ffn_bound"), rows[0].get("ffn_memory_by"))][1]
    note = fit_note(rows[0])
    claim = (f"attention vs FFN: {d['label']}. Attention: "
             f"{limit_runs(ctx, [LIMITS[k][1] for k in lims])}; FFN: {ffn_lim}")
    ax.set_title(f"Modelled: {rows[0]['preset']} bf16 on {rows[0]['device']}, batch "
                 f"{rows[0]['batch']}" + (f" ({note})" if note else "") + "\n"
                 + textwrap.fill(claim, 80), fontsize=9.5)
    ax.set_ylabel("Roofline time per decode step (ms)")


def kv_claim(rows: Sequence[dict]) -> dict[str, str]:
    """Per preset, how its KV bytes grow over the last doubling of context in the rows."""
    out = {}
    for preset in dict.fromkeys(r["preset"] for r in rows):
        rs = sorted((r for r in rows if r["preset"] == preset), key=lambda r: r["context"])
        if len(rs) < 2:
            continue
        (a, b) = rs[-2], rs[-1]
        growth = (b["kv_bytes"] / a["kv_bytes"]) ** (1 / math.log2(b["context"] / a["context"]))
        if growth < 1.01:
            flat = next(r["context"] for r in rs if r["kv_bytes"] >= b["kv_bytes"] / 1.01)
            out[preset] = f"flat from {flat:,}"
        else:
            out[preset] = f"x{growth:.2f} per doubling at {b['context']:,}"
    return out


@styled
def kv_figure(results: Sequence[dict], title: str | None = None) -> Figure:
    """KV-cache bytes per sequence vs context for real presets (bf16)."""
    rows = _phases_of(results)[0]["modelled"]["kv"]
    fig, ax = new_figure(12, 7.5)
    growth = kv_claim(rows)
    for j, preset in enumerate(dict.fromkeys(r["preset"] for r in rows)):
        rs = [r for r in rows if r["preset"] == preset]
        notes = [growth.get(preset, "")]
        if rs[0].get("shipped_dtype"):
            notes.append(f"modelled in bf16, shipped in {rs[0]['shipped_dtype']}")
        notes.append(fit_note(rs[0]))
        ax.plot([r["context"] for r in rs], [r["kv_bytes"] for r in rs], "o-", ms=4,
                color=PALETTE[j % len(PALETTE)],
                label=f"{preset}: " + "; ".join(n for n in notes if n))
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("Context (tokens per sequence)")
    ax.set_ylabel("KV cache per sequence (bytes, bf16)")
    flat = [p for p, g in growth.items() if g.startswith("flat")]
    last = max((r["context"] for r in rows), default=0)
    at_last = [r for r in rows if r["context"] == last]
    if at_last:
        lo, hi = (min(at_last, key=lambda r: r["kv_bytes"]),
                  max(at_last, key=lambda r: r["kv_bytes"]))
        ax.set_title(f"At {last:,} tokens: {fmt_si(lo['kv_bytes'], 'B')} ({lo['preset']}) to "
                     f"{fmt_si(hi['kv_bytes'], 'B')} ({hi['preset']}) per sequence; flat "
                     f"past their window: {', '.join(flat) or 'none'}", fontsize=10)
    fig.suptitle(title or "KV-cache bytes vs context for real architectures", fontsize=14)
    ax.legend(frameon=False, fontsize=8.5)
    return fig


def gap_claim(ratios: Sequence[float]) -> str:
    """How many measured/predicted ratios fall in BAND, and their median."""
    if not ratios:
        return "no predicted points"
    s = sorted(ratios)
    inside = sum(BAND[0] <= r <= BAND[1] for r in s)
    return (f"{inside} of {len(s)} phase points within [{BAND[0]}, {BAND[1]}] of their "
            f"roofline prediction; median {s[len(s) // 2]:.2f}, range {s[0]:.2f}-{s[-1]:.2f}")


@styled
def gap_figure(results: Sequence[dict], title: str | None = None) -> Figure:
    """Measured / predicted per phase and variant; each point's own reason for its gap."""
    result = _phases_of(results)[0]
    pts = [p for p in result["points"] if in_sweep(p, "roofline") and
           p.get("measured_over_predicted")]
    variants = list(dict.fromkeys(p["variant"] for p in pts))
    phases = [ph for ph in PHASE_MARKERS if any(p["phase"] == ph for p in pts)]
    fig, ax = new_figure(13, 8)
    notes = Notes()
    width = 0.8 / max(1, len(phases))
    ax.axhspan(*BAND, color="0.85", lw=0, label=f"[{BAND[0]}, {BAND[1]}]: no note needed")
    for k, ph in enumerate(phases):
        xs, ys = [], []
        for i, v in enumerate(variants):
            p = next((p for p in pts if p["variant"] == v and p["phase"] == ph), None)
            if p:
                xs.append(i + (k - (len(phases) - 1) / 2) * width)
                ys.append(p["measured_over_predicted"])
                notes.mark(ax, p, xs[-1], ys[-1])
        ax.bar(xs, ys, width, color=PALETTE[k], label=ph)
    ax.axhline(1.0, color="black", lw=1)
    notes.legend(ax)
    ax.set_xticks(range(len(variants)), variants, rotation=20)
    ax.set_xlabel("Attention variant / FFN (batch 1)")
    ax.set_ylabel("Measured / predicted throughput (1 = on the roof)")
    ax.set_title(gap_claim([p["measured_over_predicted"] for p in pts]), fontsize=10)
    ax.legend(frameon=False, fontsize=9)
    fig.suptitle(title or f"How close each phase gets to this machine's roofline "
                 f"({result['machine']})", fontsize=14)
    notes.footnote(fig)
    return fig
