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
from microbench.plots.claims import (
    backends,
    gap_claim,
    headline_claim,
    roof_share,
    short_reason,
)
from microbench.plots.common import (
    PALETTE,
    SUSPECT_COLOR,
    fmt_si,
    legend_clear,
    made_by,
    marker_boxes,
    new_figure,
    place_labels,
    renderer_of,
    shared_area,
    styled,
)
from microbench.roofline import BAND
from microbench.schema import KIND_PEAKS, KIND_PHASES, point_sweeps

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


def ridge_of(result: dict, memory_level: str | None = None) -> dict | None:
    """The ridge of the model dtype's GEMM roof over the memory roof keyed `memory_level` (a
    point's predicted["memory_level"]), else main memory's read-only roof, else its
    read+write roof (roofline.phase_ridge). None without both roofs."""
    return roofline.phase_ridge(result["peaks"]["roofs"], result["model"]["dtype"],
                                memory_level)


# ----------------------------------------------------------------------- notes on points

MAX_NOTES = 14  # footnote lines a figure can hold; the rest are in summary.md


class Notes:
    """Marks on measured points and the footnote that explains them: a circle and number for
    measured/predicted outside BAND (number = the point's reason: `outside_reason`, else
    "unexplained"), a red X for a point flagged `suspect` (measured above its roof)."""

    def __init__(self):
        self.reasons: dict[str, dict] = {}  # reason -> {point id: measured/predicted}
        self.suspects: dict[tuple, str] = {}
        self.numbered: list[tuple] = []  # (axes, x, y) of each number written

    @staticmethod
    def _id(point: dict) -> tuple:
        return (point.get("machine"), point["variant"], point["phase"], point["batch"],
                point["context"])

    def key(self, point: dict) -> int | None:
        """The footnote number of a point outside BAND (None inside it)."""
        ratio = point.get("measured_over_predicted")
        if ratio is None or BAND[0] <= ratio <= BAND[1]:
            return None
        reason = short_reason(point.get("outside_reason") or "unexplained", ratio)
        self.reasons.setdefault(reason, {})[self._id(point)] = ratio
        return list(self.reasons).index(reason) + 1

    def mark(self, ax, point: dict, x: float, y: float) -> None:
        k = self.key(point)
        if k is not None:
            ax.scatter([x], [y], s=230, facecolors="none", edgecolors="black", lw=1.0,
                       zorder=6)
            near = sum(a is ax and math.isclose(x, u, rel_tol=0.1, abs_tol=0.05)
                       and math.isclose(y, v, rel_tol=0.1) for a, u, v in self.numbered)
            self.numbered.append((ax, x, y))  # beside a point nearby: the other side, lower
            ax.annotate(str(k), (x, y), xytext=(-7 if near % 2 else 7, -13 - 10 * (near // 2)),
                        textcoords="offset points", ha="right" if near % 2 else "left",
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

    def footnote(self, fig, first: str = "") -> None:
        """The notes under the figure, after `first` (the line saying what made it)."""
        text = "\n".join(line for line in (first, self.text()) if line)
        if text:
            fig.supxlabel(text, fontsize=9, ha="left", x=0.01)


def machine_line(result: dict, points: Sequence[dict]) -> str:
    """A phase figure's first footnote: the machine and backend that measured `points`."""
    return made_by(result.get("environment"), backends(points))


# ----------------------------------------------------------------------- figures

# ----------------------------------------------------------------------- roofline figures

PHASE_COLORS = {"prefill": PALETTE[1], "decode_attention": PALETTE[2], "decode_ffn": PALETTE[4],
                "decode": PALETTE[0]}
PHASE_WORDS = {"prefill": "prefill", "decode_attention": "decode attention",
               "decode_ffn": "decode FFN", "decode": "decode step"}
ROOF_COLOR = "0.2"
FLAGS_NOTE = ("each point's prediction, and the points off it or above their roof with their "
              "reasons: summary.md")


def roofline_points(result: dict) -> list[dict]:
    return [p for p in result["points"] if in_sweep(p, "roofline")]


def phase_roofs(result: dict, points: Sequence[dict]) -> tuple[dict, dict] | None:
    """(compute roof, memory roof) the points were predicted on: the model dtype's best GEMM
    roof over the memory roof most of their predictions used (ridge_of). None without both."""
    levels_ = Counter((p.get("predicted") or {}).get("memory_level") for p in points)
    rd = ridge_of(result, levels_.most_common(1)[0][0] if points else None)
    if rd is None:
        return None
    roofs = result["peaks"]["roofs"]
    pick = lambda kind, name: next(r for r in roofs[kind]  # noqa: E731
                                   if r["name"] == name and not r.get("suspect"))
    return pick("compute", rd["compute"]), pick("memory", rd["memory"])


def headline_variant(result: dict, points: Sequence[dict]) -> str | None:
    """The variant the headline shows: the model's own attention (model.config.attention)
    when the roofline sweep has its prefill and decode, else the first variant that has both."""
    both = [v for v in dict.fromkeys(p["variant"] for p in points)
            if {"prefill", "decode"} <= {p["phase"] for p in points if p["variant"] == v}]
    own = (result["model"].get("config") or {}).get("attention")
    return own if own in both else next(iter(both), None)


def spec_roofs(results: Sequence[dict], machine: str, dtype: str) -> dict | None:
    """The vendor or theoretical ceilings of `machine` (a peaks result's spec block among
    `results`): {"kind", "flops" (dtype's peak or None), "bandwidth" (main memory or None)}."""
    for r in results:
        spec = r.get("spec") if r.get("kind") == KIND_PEAKS and r.get("machine") == machine \
            else None
        if spec:
            return {"kind": "theoretical" if spec.get("derivation") else "vendor",
                    "flops": (spec.get("peak_flops") or {}).get(dtype),
                    "bandwidth": (spec.get("memory_bandwidth") or {}).get(
                        spec.get("main_memory"))}
    return None


def _pow2_range(lo: float, hi: float) -> tuple[float, float]:
    return 2.0 ** math.floor(math.log2(lo)), 2.0 ** math.ceil(math.log2(hi))


def _draw_roofs(ax, compute: dict, memory: dict, xs: tuple[float, float],
                spec: dict | None = None, color=ROOF_COLOR) -> float:
    """The measured memory diagonal and compute roof meeting at the ridge (solid, p10-p90
    shaded), the spec ceilings dashed, the ridge dotted down to the x axis. Returns the ridge."""
    x0, x1 = xs
    bw, top = memory["value"], compute["value"]
    ridge = top / bw
    left = [x0, min(ridge, x1)]
    ax.plot(left, [bw * x for x in left], color=color, lw=2, zorder=3)
    ax.fill_between(left, [memory["p10"] * x for x in left], [memory["p90"] * x for x in left],
                    color=color, alpha=0.12, lw=0)
    right = [max(ridge, x0), x1]
    ax.plot(right, [top, top], color=color, lw=2, zorder=3)
    ax.fill_between(right, compute["p10"], compute["p90"], color=color, alpha=0.12, lw=0)
    if spec and spec["flops"]:
        start = max(x0, spec["flops"] / (spec["bandwidth"] or bw))
        ax.plot([start, x1], [spec["flops"]] * 2, color=color, lw=1.4, ls="--")
    if spec and spec["bandwidth"]:
        end = min(x1, (spec["flops"] or top) / spec["bandwidth"])
        ax.plot([x0, end], [spec["bandwidth"] * x0, spec["bandwidth"] * end], color=color,
                lw=1.4, ls="--")
    if x0 < ridge < x1:
        ax.plot([ridge, ridge], [1e-30, top], color=color, lw=1, ls=":")
    return ridge


def _roof_labels(ax, compute: dict, memory: dict, spec: dict | None, points: Sequence[dict],
                 dtype: str, fontsize: float = 9.5, renderer=None) -> list:
    """The roofs' names and values written on them: the compute roof's under it (right of the
    ridge, else at its right end), a spec peak's over its line, the memory roof's along its
    diagonal (past the points below the ridge, else nearer the origin, else under the line),
    the ridge's at the foot of its line; each at the first of its places inside the axes
    that covers no point and no label before it. Returns their display boxes (for
    place_labels to avoid). Call once the axes' limits and the layout are final."""
    renderer = renderer or renderer_of(ax.figure)
    frame = ax.get_window_extent(renderer)
    taken = marker_boxes(ax, renderer)
    (x0, x1), (y0, _) = ax.get_xlim(), ax.get_ylim()
    bw, top = memory["value"], compute["value"]
    ridge = top / bw
    style = {"fontsize": fontsize, "color": ROOF_COLOR, "zorder": 4}
    boxes = []

    def first_clear(text, places):
        for n, (x, y, kw) in enumerate(places):
            t = ax.text(x, y, text, **style, **kw)
            box = t.get_window_extent(renderer)
            inside = frame.x0 <= box.x0 and box.x1 <= frame.x1 and frame.y0 <= box.y0 \
                and box.y1 <= frame.y1
            if (inside and not any(shared_area(box, b) for b in taken)) or n == len(places) - 1:
                taken.append(box)
                boxes.append(box)
                return
            t.remove()

    if ridge < x1:
        x = max(ridge, x0) * 1.25
        first_clear(f"{compute['name']}: {fmt_si(top, 'FLOP/s')} (measured)",
                    [(x, top / 1.04, {"ha": "left", "va": "top"}),
                     (x1 / 1.1, top / 1.04, {"ha": "right", "va": "top"}),
                     (x, top * 1.04, {"ha": "left", "va": "bottom"})])
        if spec and spec["flops"]:
            first_clear(f"{dtype} peak: {fmt_si(spec['flops'], 'FLOP/s')} ({spec['kind']})",
                        [(x, spec["flops"] * 1.04, {"ha": "left", "va": "bottom"}),
                         (x1 / 1.1, spec["flops"] * 1.04, {"ha": "right", "va": "bottom"})])
    if x0 < ridge:
        (ax_, ay), (bx, by) = ax.transData.transform([(1, bw), (2, 2 * bw)])
        along = {"rotation": math.degrees(math.atan2(by - ay, bx - ax_)),
                 "rotation_mode": "anchor", "ha": "left"}
        below = [p["intensity"] for p in points if p["intensity"] < ridge]
        starts = [max([x0 * 1.3] + [v * 1.6 for v in below])]
        starts += [x for x in (starts[0] / 2, starts[0] / 4, x0 * 1.3) if x0 < x < starts[0]]
        text = f"{memory['name']}: {fmt_si(bw, 'B/s')} (measured)"
        first_clear(text, [(x, bw * x * 1.12, {**along, "va": "bottom"}) for x in starts]
                    + [(x, bw * x / 1.12, {**along, "va": "top"}) for x in starts])
    if x0 < ridge < x1:
        first_clear(f"ridge {ridge:.3g} FLOP/B",
                    [(ridge * 1.06, y0 * 1.15, {"ha": "left", "va": "bottom"}),
                     (ridge / 1.06, y0 * 1.15, {"ha": "right", "va": "bottom"})])
    return boxes


def _points(ax, points: Sequence[dict], color, emphasis: str | None = None) -> None:
    """Measured medians with p10-p90 bars; the `emphasis` variant's drawn larger."""
    for p in points:
        y, r = p["flops_per_s"]["median"], p["flops_per_s"]
        big = p["variant"] == emphasis
        ax.errorbar([p["intensity"]], [y], yerr=[[y - r["p10"]], [r["p90"] - y]], fmt="o",
                    color=color, ms=11 if big else 7, mec="black", mew=1.2 if big else 0.6,
                    elinewidth=1.4, capsize=3, zorder=5)


def _point_text(p: dict, compute: dict, memory: dict) -> str:
    share, roof = roof_share(p["intensity"], p["flops_per_s"]["median"], compute["value"],
                             memory["value"])
    what = (f"prefill of {p['context']:,} tokens" if p["phase"] == "prefill"
            else f"{PHASE_WORDS[p['phase']]} at context {p['context']:,}")
    # the drawn roofs are the rounds' medians; a point is predicted at its own moment's roofs
    # (the drift probe), so its measured / predicted says where it sat on those
    mop = p.get("measured_over_predicted")
    moment = f"\n{mop:.2f}x its prediction at its moment's roofs" if mop else ""
    return (f"{what}: {p['timing']['median'] * 1e3:.3g} ms\n"
            f"{fmt_si(p['flops_per_s']['median'], 'FLOP/s')} at {p['intensity']:.2g} FLOP/B "
            f"= {share:.0%} of the {roof} roof{moment}")


def _headline_runs(results: Sequence[dict]) -> list[tuple]:
    """Per phases result: (result, [its model's prefill and decode points], (compute, memory)
    roofs or None, its machine's spec ceilings or None)."""
    out = []
    for result in phases_of(results):
        pts = roofline_points(result)
        variant = headline_variant(result, pts)
        pair = [p for ph in ("prefill", "decode") for p in pts
                if p["variant"] == variant and p["phase"] == ph]
        out.append((result, pair, phase_roofs(result, pts),
                    spec_roofs(results, result["machine"], result["model"]["dtype"])))
    return out


@styled
def phases_roofline_figure(results: Sequence[dict], title: str | None = None) -> Figure:
    """Prefill vs decode of one model on the machine's roofs: the measured roofs its
    predictions used (solid), the vendor or theoretical ones when a peaks result among
    `results` has them (dashed), the ridge, and the two measured points labelled beside
    them; the title says which roof each reaches and how close. Several phases results
    (machines): each with its own roofs and points."""
    runs = _headline_runs(results)
    fig, ax = new_figure(11, 7.2)
    xs = [p["intensity"] for _, pair, _, _ in runs for p in pair]
    ys = [p["flops_per_s"]["p10"] for _, pair, _, _ in runs for p in pair]
    ridges = [rf[0]["value"] / rf[1]["value"] for _, _, rf, _ in runs if rf]
    x0, x1 = _pow2_range(min(xs + ridges) / 3, max(xs + ridges) * 5)
    tops, bottoms, shares = list(ys), list(ys), {}
    for _, pair, roofs, spec in runs:
        if roofs:
            _draw_roofs(ax, *roofs, (x0, x1), spec)
            tops += [roofs[0]["value"], (spec or {}).get("flops") or 0]
            bottoms.append(roofs[1]["value"] * x0)
            shares.update({p["phase"]: roof_share(p["intensity"], p["flops_per_s"]["median"],
                                                  roofs[0]["value"], roofs[1]["value"])
                           for p in pair})
        for p in pair:
            _points(ax, [p], PHASE_COLORS[p["phase"]], p["variant"])
    ax.set_xscale("log", base=2)
    ax.set(yscale="log", xlim=(x0, x1), ylim=(min(bottoms) / 1.8, max(tops) * 1.8),
           xlabel="Arithmetic intensity (counted FLOP / counted byte)",
           ylabel="Achieved (FLOP / s)")
    result, pair, _, spec = runs[0]
    model = result["model"]
    claim = headline_claim(shares) if len(runs) == 1 else "prefill vs decode"
    fig.suptitle(title or claim[:1].upper() + claim[1:], fontsize=15)
    dashed = f"dashed: {spec['kind']} peak; " if spec and spec["flops"] else ""
    ax.set_title(f"'{model['preset']}' model ({fmt_si(model['params'], '').replace(' ', '')} "
                 f"parameters, {model['dtype']}, {pair[0]['variant'] if pair else '?'} "
                 f"attention), batch 1, on {', '.join(r['machine'] for r, *_ in runs)}\n"
                 f"solid: measured roofs (shaded: p10-p90 over rounds); {dashed}points: "
                 "median, bars p10-p90", fontsize=10.5)
    fig.text(0.01, 0.005, "\n".join(["; ".join(made_by(r.get("environment"), backends(pr))
                                                for r, pr, *_ in runs),
                                     "every attention variant: variants_roofline.png; "
                                     + FLAGS_NOTE]), fontsize=8.5, color="0.3", va="bottom")
    fig.get_layout_engine().set(rect=(0, 0.05, 1, 0.95))
    avoid, labels = [], []  # once the layout is final: the roofs' labels, then the points'
    for res, pr, roofs, spec_ in runs:
        if roofs:
            avoid += _roof_labels(ax, *roofs, spec_, pr, res["model"]["dtype"])
            prefix = f"{res['machine']}: " if len(runs) > 1 else ""
            labels += [(p["intensity"], p["flops_per_s"]["median"],
                        prefix + _point_text(p, *roofs)) for p in pr]
    # a white ground, so the ridge's dotted line never runs through a label
    place_labels(ax, labels, avoid, fontsize=10.5,
                 bbox={"facecolor": "white", "edgecolor": "none", "pad": 1.0, "alpha": 0.9})
    return fig


def _variant_claim(points: Sequence[dict], compute: dict, memory: dict) -> str:
    shares = [roof_share(p["intensity"], p["flops_per_s"]["median"], compute["value"],
                         memory["value"]) for p in points]
    span = lambda lo, hi, f: f"{lo:{f}}" if f"{lo:{f}}" == f"{hi:{f}}" \
        else f"{lo:{f}}-{hi:{f}}"  # noqa: E731
    xs = sorted(p["intensity"] for p in points)
    sh = sorted(s for s, _ in shares)
    roofs = sorted({r for _, r in shares})  # the roof above each point: compute or memory
    return (f"{span(xs[0], xs[-1], '.3g')} FLOP/B, {span(sh[0] * 100, sh[-1] * 100, '.0f')}% "
            f"of the {' or '.join(roofs)} roof")


@styled
def variants_roofline_figure(results: Sequence[dict], title: str | None = None) -> Figure:
    """Every attention variant's phases on the machine's measured roofs, one panel per phase
    (its axes zoomed on its points), each point labelled with its variant beside it; the
    headline's model drawn larger."""
    result = phases_of(results)[0]
    pts = roofline_points(result)
    roofs = phase_roofs(result, pts)
    phases = [ph for ph in PHASE_WORDS if any(p["phase"] == ph for p in pts)]
    emphasis = headline_variant(result, pts)
    fig = Figure(figsize=(16, 11 if len(phases) > 2 else 6), layout="constrained")
    axes = [fig.add_subplot((len(phases) + 1) // 2, min(len(phases), 2), k + 1)
            for k in range(len(phases))]
    placed = []
    for ax, phase in zip(axes, phases, strict=False):
        ps = [p for p in pts if p["phase"] == phase]
        xs = [p["intensity"] for p in ps]
        x0, x1 = min(xs) / 2.5, max(xs) * 2.5
        ys = [p["flops_per_s"][k] for p in ps for k in ("p10", "p90")]
        y1 = max(ys) * 1.6
        if roofs:
            _draw_roofs(ax, *roofs, (x0, x1))
            y1 = max(y1, min(roofs[0]["value"], roofs[1]["value"] * x1) * 1.35)
        _points(ax, ps, PHASE_COLORS[phase], emphasis)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlim(x0, x1)
        ax.set_ylim(min(ys) / 1.5, y1)
        ax.set_xlabel("FLOP / byte (counted)")
        ax.set_ylabel("Achieved (FLOP / s)")
        ax.set_title(f"{PHASE_WORDS[phase]}: " + (_variant_claim(ps, *roofs) if roofs else
                                                   f"{len(ps)} variants"), fontsize=11)
        placed.append((ax, ps))
    fig.suptitle(title or f"Each attention variant of the '{result['model']['preset']}' model, "
                 f"phase by phase, on {result['machine']} (batch 1; larger: {emphasis}, the "
                 "headline's model)", fontsize=14)
    fig.text(0.01, 0.005, made_by(result.get("environment"), backends(pts)) + "\nsolid: "
             "measured roofs (shaded p10-p90); points: median, bars p10-p90; " + FLAGS_NOTE,
             fontsize=8.5, color="0.3", va="bottom")
    fig.get_layout_engine().set(rect=(0, 0.04, 1, 0.96))
    renderer = renderer_of(fig)  # the layout is final: labels inside the axes leave it so
    for ax, ps in placed:
        avoid = _roof_labels(ax, *roofs, None, ps, result["model"]["dtype"], 8.5,
                             renderer) if roofs else []
        place_labels(ax, [(p["intensity"], p["flops_per_s"]["median"], p["variant"])
                          for p in ps], avoid, renderer, fontsize=10)
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
    ax.set_title(gap_claim([p["measured_over_predicted"] for p in pts]), fontsize=10)
    fig.suptitle(title or f"How close each phase gets to this machine's roofline "
                 f"({result['machine']})", fontsize=14)
    notes.footnote(fig, machine_line(result, pts))
    legend_clear(ax, ncol=2, fontsize=9)
    return fig
