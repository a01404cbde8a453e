"""The phase figures on measured points (phases_roofline.png, gap.png) and what every phase
figure shares: drawn from a phases result (schema.KIND_PHASES) only, without JAX.

Measured points with their counted FLOPs and bytes and their roofline prediction, on the roofs
the predictions used (Williams, Waterman & Patterson, "Roofline", CACM 2009; ridge points from
microbench.roofline). Points are marked where the data say something about them (`Notes`):
measured / predicted outside roofline.BAND (circled, numbered, reasons as footnotes: a point's
`outside_reason`, or "unexplained") and measured above its roof (`suspect`: a red X). Titles
come from microbench.plots.claims.
"""

from __future__ import annotations

import math
import textwrap
from collections import Counter
from collections.abc import Sequence

from matplotlib.figure import Figure

from microbench import roofline
from microbench.plots.claims import backends, gap_claim, roofline_claim, short_reason
from microbench.plots.common import (
    PALETTE,
    SUSPECT_COLOR,
    draw_compute_roof,
    draw_memory_roof,
    fmt_si,
    new_figure,
    roof_ends,
    styled,
)
from microbench.roofline import BAND
from microbench.schema import KIND_PHASES, point_sweeps

PHASE_MARKERS = {"prefill": "s", "decode_attention": "o", "decode_ffn": "^", "decode": "D"}
SUSPECT_LABEL = "above its roof: measurement to explain"
OUTSIDE_LABEL = (f"circled n: measured/predicted outside [{BAND[0]}, {BAND[1]}] "
                 "(reason n below)")


# ----------------------------------------------------------------------- selecting and roofs

def phases_of(results: Sequence[dict]) -> list[dict]:
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


def ridge_of(result: dict, memory_level: str | None = None) -> dict | None:
    """The ridge of the model dtype's GEMM roof over the memory roof keyed `memory_level` (a
    point's predicted["memory_level"]), else main memory's read-only roof, else its
    read+write roof (roofline.phase_ridge). None without both roofs."""
    return roofline.phase_ridge(result["peaks"]["roofs"], result["model"]["dtype"],
                                memory_level)


def _machine_roofs(ax, result: dict, color: str = "0.4", prefix: str = "") -> list:
    """The measured roofs the predictions used (every memory level, the matrix roof of the
    model's dtype), each labelled on the line itself as well as in the legend. Returns the
    labels to place once the axes' limits are known (_place_roof_labels)."""
    roofs = result["peaks"]["roofs"]
    compute = roofline.gemm_roofs(roofs["compute"], result["model"]["dtype"])
    memory = [r for r in roofs["memory"] if not r.get("suspect")]
    bw_max, flops_max = roof_ends(memory, compute)
    labels = []
    for roof in memory:
        draw_memory_roof(ax, roof, flops_max, color, prefix, dashed=False)
        labels.append(("memory", roof, f"{prefix}{roof['name']} {fmt_si(roof['value'], 'B/s')}"))
    for roof in compute:
        draw_compute_roof(ax, roof, bw_max, color, prefix, dashed=False)
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
        def span(r: dict) -> str:  # 3 digits: 0.748 is outside the band, "0.75" would not be
            lo, hi = min(r.values()), max(r.values())
            return f"{lo:.3g}" if f"{lo:.3g}" == f"{hi:.3g}" else f"{lo:.3g}-{hi:.3g}"

        lines = [f"{k}: {reason} ({len(r)} point{'s' * (len(r) > 1)}, measured/predicted "
                 f"{span(r)})" for k, (reason, r) in enumerate(self.reasons.items(), 1)]
        lines += [f"X ({SUSPECT_LABEL}): {s}" for s in self.suspects.values()]
        if len(lines) > MAX_NOTES:
            more = len(lines) - MAX_NOTES + 1
            lines = lines[:MAX_NOTES - 1] + [f"... {more} more: every reason in full in "
                                             f"summary.md and phases.json (outside_reason)"]
        return "\n".join(textwrap.shorten(line, 175) for line in lines)

    def footnote(self, fig) -> None:
        if self.reasons or self.suspects:
            fig.supxlabel(self.text(), fontsize=9, ha="left", x=0.01)


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
    runs = phases_of(results)
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
               label="hollow: roofline prediction of the same phase\n(the sum of its ops' "
                     "roofline times: below the roof\nwhere compute- and memory-bound ops mix)")
    notes.legend(ax)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("Arithmetic intensity (counted FLOP / counted byte)")
    ax.set_ylabel("Achieved performance (FLOP / s)")
    model = runs[0]["model"]
    points = [p for p in runs[0]["points"] if in_sweep(p, "roofline")]
    machines = ", ".join(r["machine"] for r in runs)
    fig.suptitle(title or f"Phases of the '{model['preset']}' model ({fmt_si(model['params'], '')}"
                 f"parameters, {model['dtype']}) on {machines}", fontsize=14,
                 x=0.01, ha="left")  # left: the legend column on the right starts at the top
    prefill = next((p["context"] for p in points if p["phase"] == "prefill"), "?")
    decode = next((p["context"] for p in points if p["phase"] != "prefill"), "?")
    lines = [roofline_claim(points), f"Batch 1; prefill of {prefill} tokens; decode at "
             f"context {decode}; backend: {backends(points)}.  Error bars: p10-p90."]
    # wrapped: the legend's width (its roofs name their programs) decides the axes' width
    ax.set_title("\n".join(textwrap.fill(line, 100) for line in lines), fontsize=10)
    fig.legend(*ax.get_legend_handles_labels(), loc="outside right upper", ncol=1,
               frameon=False, fontsize=8.5)
    notes.footnote(fig)
    _place_roof_labels(fig, ax, labels)
    return fig


@styled
def gap_figure(results: Sequence[dict], title: str | None = None) -> Figure:
    """Measured / predicted per phase and variant; each point's own reason for its gap."""
    result = phases_of(results)[0]
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
    ax.set_title(gap_claim([p["measured_over_predicted"] for p in pts]) + "\nBackend: "
                 + backends(pts) + ".", fontsize=10)
    ax.legend(frameon=False, fontsize=9)
    fig.suptitle(title or f"How close each phase gets to this machine's roofline "
                 f"({result['machine']})", fontsize=14)
    notes.footnote(fig)
    return fig
