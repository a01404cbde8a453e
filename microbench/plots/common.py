"""What every figure shares: the house rc settings, SI formatting, atomic saving, loading result
files, and the two roof lines of a roofline (a horizontal compute roof, a diagonal memory roof).

Imports matplotlib and the JAX-free parts of microbench only (files, schema): a figure is drawn
from saved JSON alone. The roof lines follow Williams, Waterman & Patterson, "Roofline" (CACM
2009), drawn the way the Empirical Roofline Tool does: log-log, x = FLOP/byte, y = FLOP/s;
vendor or theoretical roofs dashed, measured roofs solid with their p10-p90 spread shaded.
"""

from __future__ import annotations

import contextlib
import functools
import math
import os
import sys
import tempfile
import textwrap
from collections.abc import Sequence
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.backends.backend_agg import FigureCanvasAgg  # noqa: E402
from matplotlib.collections import LineCollection, PathCollection  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402
from matplotlib.ticker import FuncFormatter  # noqa: E402
from matplotlib.transforms import Bbox  # noqa: E402

from microbench import machines  # noqa: E402
from microbench.files import readable  # noqa: E402
from microbench.schema import read_result  # noqa: E402

RC = {"font.size": 12, "axes.titlesize": 14, "axes.labelsize": 13, "legend.fontsize": 9.5,
      "xtick.labelsize": 11, "ytick.labelsize": 11, "lines.linewidth": 2.0,
      "axes.grid": True, "grid.alpha": 0.3, "savefig.dpi": 150}
PALETTE = plt.get_cmap("tab10").colors
SUSPECT_COLOR = "#d62728"


def fmt_si(value: float, unit: str) -> str:
    """201e9, 'FLOP/s' -> '201 GFLOP/s'."""
    for scale, prefix in ((1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(value) >= scale:
            return f"{value / scale:.3g} {prefix}{unit}"
    return f"{value:.3g} {unit}"


def num(value, digits: int = 3) -> str:
    """1212.06 -> '1,212'; 0.84615 -> '0.846'; 1.0 -> '1.00'; None -> 'n/a'."""
    if value is None:
        return "n/a"
    value = float(value)
    if not math.isfinite(value):
        return "n/a"
    if abs(value) >= 10 ** (digits - 1):
        return f"{value:,.0f}"
    return f"{value:#.{digits}g}"


def times(value) -> str:
    """1.6067 -> '1.61x'; None -> 'n/a'."""
    return "n/a" if value is None else f"{num(value)}x"


def md_table(header: list[str], rows: list[list]) -> list[str]:
    """The lines of a markdown table."""
    return ["| " + " | ".join(header) + " |", "|" + "---|" * len(header),
            *["| " + " | ".join(str(c) for c in row) + " |" for row in rows]]


def made_by(env: dict | None, ops: str | None = None) -> str:
    """Which machine, backend and day made a result, from its environment block: 'AMD EPYC,
    family 25 model 17 (Zen 4 (Genoa)), 2 cores; JAX cpu backend (jax 0.10.2); YYYY-MM-DD',
    then '; model ops: OPS' when given (a phase point's `backend`, claims.backends)."""
    env = env or {}
    machine = machines.describe(env)
    if machine != "machine not recorded":
        jax = f" (jax {env['jax_version']})" if env.get("jax_version") else ""
        machine += f"; JAX {env.get('backend') or '?'} backend{jax}"
        if env.get("date_utc"):
            machine += f"; {str(env['date_utc'])[:10]}"
    return machine + (f"; model ops: {ops}" if ops else "")


def check_kind(result, kind: str, required: bool = False) -> None:
    """Refuse what is not a `kind` result (a dict whose "kind" is kind, or absent unless
    `required`) before anything is drawn from it."""
    if not isinstance(result, dict) or result.get("kind", None if required else kind) != kind:
        raise ValueError(f"not a {kind} result: expected a dict with kind {kind!r}")


def wall_time(result: dict) -> list[str]:
    """A summary's closing line: the run's wall time, when the result has one."""
    return [] if result.get("wall_s") is None else ["", f"wall time {num(result['wall_s'])} s."]


def styled(figure_fn):
    """Decorator: run a figure function under the house rc settings (fonts, widths)."""

    @functools.wraps(figure_fn)
    def wrapper(*args, **kwargs):
        with plt.rc_context(RC):
            return figure_fn(*args, **kwargs)

    return wrapper


def renderer_of(fig: Figure):
    """The Agg renderer of `fig` (given an Agg canvas if it has none), its layout settled:
    what text extents are measured with before labels are placed."""
    if not hasattr(fig.canvas, "get_renderer"):
        FigureCanvasAgg(fig)
    fig.draw_without_rendering()
    return fig.canvas.get_renderer()


def marker_boxes(ax, renderer) -> list[Bbox]:
    """Display boxes of the markers drawn on `ax` (lines' markers, scatter points)."""
    scale = renderer.points_to_pixels(1.0) / 2
    out = []
    for line in ax.get_lines():
        if line.get_marker() in (None, "", " ", "None", "none") or not line.get_visible():
            continue
        r = line.get_markersize() * scale
        out += [Bbox([[x - r, y - r], [x + r, y + r]])
                for x, y in line.get_transform().transform(line.get_xydata())]
    for coll in ax.collections:
        if isinstance(coll, PathCollection) and coll.get_visible() and len(coll.get_sizes()):
            r = max(coll.get_sizes()) ** 0.5 * scale
            out += [Bbox([[x - r, y - r], [x + r, y + r]])
                    for x, y in coll.get_offset_transform().transform(coll.get_offsets())]
    return [b for b in out if math.isfinite(b.x0) and math.isfinite(b.y0)]


def shared_area(a: Bbox, b: Bbox) -> float:
    """Area two boxes share (0 when they only touch or are apart)."""
    return (max(0.0, min(a.x1, b.x1) - max(a.x0, b.x0))
            * max(0.0, min(a.y1, b.y1) - max(a.y0, b.y0)))


# Where a label may go beside its point, in order of preference: right, left, a little above
# or below those, diagonally, then above or below.
_AROUND = ((1, 0), (-1, 0), (1, 0.5), (1, -0.5), (-1, 0.5), (-1, -0.5), (1, 1), (1, -1),
           (-1, 1), (-1, -1), (0, 1), (0, -1))
_BESIDE = _AROUND[:6]  # where a label goes without a leader line: unmistakably its point's
_NEAR = 6  # points from a point to a label beside it
_FAR = (18, 32, 50)  # ... to a label set apart, with a leader line
_COLUMN = (24, 48, 80, 120)  # ... from a cluster's outermost point to its labels' column


def place_labels(ax, labels, avoid=(), renderer=None, **style) -> list:
    """Write each (x, y, text) beside its point (data coordinates), at the first place around
    it where it stays inside the axes and covers no marker, no label placed before it and no
    box in `avoid` (display boxes). The labels no such place is left for (a cluster) go in a
    column beside the cluster, in the order of their points' heights, each with a thin leader
    line to its point: on the side where the column covers least. Returns the annotations.
    Call once the axes' limits and the figure's layout are final (`renderer`: renderer_of's,
    when the caller has it)."""
    renderer = renderer or renderer_of(ax.figure)
    frame = ax.get_window_extent(renderer)
    taken = [*avoid, *marker_boxes(ax, renderer), *_bar_boxes(ax, renderer)]
    style = {"fontsize": 9, **style}

    def cost(box):
        return ((box.width * box.height - shared_area(box, frame)) * 10
                + sum(shared_area(box, t) for t in taken))

    out, crowded = {}, []
    for i in sorted(range(len(labels)), key=lambda i: -labels[i][1]):  # top down: in order
        x, y, text = labels[i]
        for dx, dy in _BESIDE:
            ann = _label(ax, (x, y), text, (dx * _NEAR, dy * _NEAR), dx, dy, style, False)
            box = ann.get_window_extent(renderer)
            if cost(box) == 0:
                taken.append(box)
                out[i] = ann
                break
            ann.remove()
        else:
            crowded.append(i)
    columns = [(d, side, *_column(ax, renderer, [labels[i] for i in crowded], side, d, style))
               for d in _COLUMN for side in (1, -1)] if len(crowded) > 1 else []
    free = next((c for c in columns if sum(map(cost, c[2])) == 0), None)
    for k, i in enumerate(crowded):
        x, y, text = labels[i]
        if free:
            out[i] = _label(ax, (x, y), text, free[3][k], free[1], 0, style, True)
            continue
        best = None  # apart from the others, with a leader line: the place that covers least
        for dist in _FAR:
            for dx, dy in _AROUND:
                ann = _label(ax, (x, y), text, (dx * dist, dy * dist), dx, dy, style, False)
                box = ann.get_window_extent(renderer)
                ann.remove()
                if best is None or cost(box) < best[0]:
                    best = (cost(box), (dx * dist, dy * dist), dx, dy, box)
        taken.append(best[4])
        out[i] = _label(ax, (x, y), text, *best[1:4], style, True)
    return [out[i] for i in range(len(labels))]


def _bar_boxes(ax, renderer) -> list[Bbox]:
    """Display boxes of the error bars drawn on `ax` (what a label should not cover either)."""
    out = []
    for coll in ax.collections:
        if isinstance(coll, LineCollection) and coll.get_visible():
            for seg in coll.get_segments():
                if len(seg):
                    (x0, y0), (x1, y1) = coll.get_transform().transform(seg).min(0), \
                        coll.get_transform().transform(seg).max(0)
                    out.append(Bbox([[x0 - 1, y0], [x1 + 1, y1]]))
    return out


def _column(ax, renderer, labels, side: int, dist: float, style) -> tuple[list, list]:
    """Labels stacked `dist` points beside their points' cluster (side 1: right, -1: left),
    in the order of the points' heights, pushed apart just enough not to touch: (display
    boxes, offsets in points from each point)."""
    px = [ax.transData.transform((x, y)) for x, y, _ in labels]
    col = (max if side > 0 else min)(p[0] for p in px) + side * renderer.points_to_pixels(dist)
    sizes = []
    for x, y, text in labels:
        t = ax.text(x, y, text, **style)
        box = t.get_window_extent(renderer)
        t.remove()
        sizes.append((box.width, box.height))
    order = sorted(range(len(labels)), key=lambda i: px[i][1])
    ys, gap = {}, 2.0
    for k, i in enumerate(order):  # bottom up: each at its point's height, or just above the last
        ys[i] = px[i][1] if k == 0 else max(px[i][1], ys[order[k - 1]]
                                            + (sizes[order[k - 1]][1] + sizes[i][1]) / 2 + gap)
    shift = sum(ys[i] - px[i][1] for i in order) / len(order)  # centre the stack on its points
    per_point = 72 / ax.figure.dpi
    boxes, offsets = [], []
    for i, (w, h) in enumerate(sizes):
        y = ys[i] - shift
        x0 = col if side > 0 else col - w
        boxes.append(Bbox([[x0, y - h / 2], [x0 + w, y + h / 2]]))
        offsets.append(((col - px[i][0]) * per_point, (y - px[i][1]) * per_point))
    return boxes, offsets


def _label(ax, xy, text, offset, dx, dy, style, leader: bool):
    arrow = {"arrowstyle": "-", "lw": 0.6, "color": "0.45", "shrinkA": 1, "shrinkB": 5}
    return ax.annotate(text, xy, xytext=offset, textcoords="offset points",
                       ha={1: "left", -1: "right", 0: "center"}[dx],
                       va="bottom" if dy >= 1 else "top" if dy <= -1 else "center",
                       arrowprops=arrow if leader else None, **style)


def legend_beside(ax, width: int = 40, **kw):
    """The axes' legend outside it on its right, each label wrapped at `width` characters: it
    covers no data, and the constrained layout makes room for it."""
    handles, labels = ax.get_legend_handles_labels()
    return ax.legend(handles, [textwrap.fill(label, width) for label in labels],
                     loc="upper left", bbox_to_anchor=(1.01, 1), frameon=False,
                     **{"fontsize": 8.5, **kw})


def legend_clear(ax, loc: str = "upper left", **kw):
    """The axes' legend at `loc` (an upper corner), the y axis raised in steps until it
    covers no marker. Call once the titles and the figure's layout are final."""
    legend = ax.legend(loc=loc, **{"frameon": False, "fontsize": 8.5, **kw})
    for _ in range(8):
        renderer = renderer_of(ax.figure)
        box = legend.get_window_extent(renderer)
        if not any(shared_area(box, m) for m in marker_boxes(ax, renderer)):
            break
        lo, hi = ax.get_ylim()
        ax.set_ylim(lo, hi * (hi / lo) ** 0.12 if ax.get_yscale() == "log"
                    else hi + 0.12 * (hi - lo))
    return legend


def plain_log(ax) -> None:
    """Log axes labelled 30, 100, 300 rather than 3x10^1; between the powers of ten also the
    minor ticks at 2 and 5 over less than two decades, at 2, 3, 4, 5 under one decade and at
    every digit under a factor 4 (no crowding). Call once the limits are final."""
    for axis, scale, (lo, hi) in ((ax.xaxis, ax.get_xscale(), ax.get_xlim()),
                                  (ax.yaxis, ax.get_yscale(), ax.get_ylim())):
        if scale != "log" or getattr(axis.get_major_locator(), "_base", 10) != 10:
            continue
        axis.set_major_formatter(FuncFormatter(lambda v, _: _plain(v)))
        span = hi / max(lo, 1e-300)
        lead = ((2, 3, 4, 5, 6, 7, 8, 9) if span < 4 else (2, 3, 4, 5) if span < 10
                else (2, 5) if span < 100 else ())
        axis.set_minor_formatter(FuncFormatter(
            lambda v, _, lead=lead: _plain(v)
            if round(v / 10 ** math.floor(math.log10(v))) in lead else ""))


def _plain(v: float) -> str:
    """3 -> '3', 1500 -> '1,500', 2e11 -> '200G' (SI past a million)."""
    return fmt_si(v, "").replace(" ", "") if v >= 1e6 else f"{v:,.6g}"


def new_figure(width: float = 11.0, height: float = 8.5):
    fig = Figure(figsize=(width, height), layout="constrained")
    return fig, fig.add_subplot()


_CHECKS: list = []  # what `save` runs on each figure before writing it (see `checking`)


@contextlib.contextmanager
def checking(check):
    """Within the block, `save` calls check(fig, path) on every figure, under the house rc
    settings, before writing it: the seam a test reads each drawn Figure through."""
    _CHECKS.append(check)
    try:
        yield
    finally:
        _CHECKS.remove(check)


def save(fig: Figure, path: str | Path) -> Path:
    """Render to a temporary file beside `path`, then os.replace: never a half-written PNG."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.stem}.", suffix=path.suffix, dir=path.parent)
    os.close(fd)
    readable(tmp)
    try:
        with plt.rc_context(RC):
            for check in _CHECKS:
                check(fig, path)
            fig.savefig(tmp)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def redraw_main(argv: list[str] | None, module: str, draw, summary) -> int:
    """`python -m microbench.plots.<module> result.json [out_dir]`: draw the figures of one
    saved result (next to it by default) and print its summary. argv: sys.argv[1:] if None."""
    import json

    argv = sys.argv[1:] if argv is None else argv
    if not 1 <= len(argv) <= 2:
        print(f"usage: python -m microbench.plots.{module} result.json [out_dir]")
        return 2
    src = Path(argv[0])
    result = json.loads(src.read_text())
    for path in draw(result, Path(argv[1]) if len(argv) == 2 else src.parent):
        print(path)
    print(summary(result))
    return 0


def load_results(paths: Sequence[str | Path]) -> list[dict]:
    """Read, upgrade and validate result files (schema.read_result: errors name the file)."""
    return [read_result(p) for p in paths]


def colors(n_results: int):
    """color(i_result, j_roof): per roof for one machine, per machine for several."""
    if n_results == 1:
        return lambda i, j: PALETTE[j % len(PALETTE)]
    return lambda i, j: PALETTE[i % len(PALETTE)]


# ------------------------------------------------------------------ roof lines

X_RANGE = (1 / 16, 2048.0)  # FLOP/byte spanned by a roofline's x axis


def roof_ends(memory: list[dict], compute: list[dict]):
    """(highest bandwidth, highest FLOP/s): where the diagonals and horizontals stop."""
    bw_max = max((r["value"] for r in memory), default=None)
    flops_max = max((r["value"] for r in compute), default=None)
    return bw_max, flops_max


def _by(roof: dict) -> str:
    """', reached by <program>' for a measured roof that names its program."""
    prog = roof.get("program")
    return f" ({prog})" if prog else ""


def draw_compute_roof(ax, roof: dict, bw_max, color, prefix: str, dashed: bool = False):
    """A compute roof: horizontal from the ridge with the highest bandwidth to the right."""
    x0 = max(X_RANGE[0], roof["value"] / bw_max) if bw_max else X_RANGE[0]
    kind = roof.get("label_kind", "ceiling") if dashed else "measured"
    ax.hlines(roof["value"], x0, X_RANGE[1], colors=[color], linestyles="--" if dashed else "-",
              label=f"{prefix}{kind} {roof['name']}: {fmt_si(roof['value'], 'FLOP/s')}"
                    f"{_by(roof)}")

    if not dashed:
        ax.fill_between([x0, X_RANGE[1]], roof["p10"], roof["p90"], color=color, alpha=0.15,
                        lw=0)


def draw_memory_roof(ax, roof: dict, flops_max, color, prefix: str, dashed: bool = False,
                     label_x: float = X_RANGE[0] * 1.1):
    """A memory roof: the diagonal y = bandwidth x intensity up to the highest compute roof,
    a measured one named on the line at intensity `label_x`."""
    x1 = min(X_RANGE[1], flops_max / roof["value"]) if flops_max else X_RANGE[1]
    xs = [X_RANGE[0], x1]
    kind = roof.get("label_kind", "ceiling") if dashed else "measured"
    ax.plot(xs, [roof["value"] * x for x in xs], color=color, ls="--" if dashed else "-",
            lw=1.6, label=f"{prefix}{kind} {roof['name']} bandwidth: "
                          f"{fmt_si(roof['value'], 'B/s')}{_by(roof)}")
    if not dashed:
        ax.annotate(f"{roof['name']} {fmt_si(roof['value'], 'B/s')}",
                    (label_x, roof["value"] * label_x),
                    textcoords="offset points", xytext=(2, 4), fontsize=8, color=color,
                    rotation=0)
    if not dashed:
        ax.fill_between(xs, [roof["p10"] * x for x in xs], [roof["p90"] * x for x in xs],
                        color=color, alpha=0.12, lw=0)
