"""What every figure shares: the house rc settings, SI formatting, atomic saving, loading result
files, and the two roof lines of a roofline (a horizontal compute roof, a diagonal memory roof).

Imports matplotlib and the JAX-free parts of microbench only (files, schema): a figure is drawn
from saved JSON alone. The roof lines follow Williams, Waterman & Patterson, "Roofline" (CACM
2009), drawn the way the Empirical Roofline Tool does: log-log, x = FLOP/byte, y = FLOP/s;
vendor or theoretical roofs dashed, measured roofs solid with their p10-p90 spread shaded.
"""

from __future__ import annotations

import functools
import math
import os
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402

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


def new_figure(width: float = 11.0, height: float = 8.5):
    fig = Figure(figsize=(width, height), layout="constrained")
    return fig, fig.add_subplot()


def save(fig: Figure, path: str | Path) -> Path:
    """Render to a temporary file beside `path`, then os.replace: never a half-written PNG."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.stem}.", suffix=path.suffix, dir=path.parent)
    os.close(fd)
    readable(tmp)
    try:
        with plt.rc_context(RC):
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


def draw_memory_roof(ax, roof: dict, flops_max, color, prefix: str, dashed: bool = False):
    """A memory roof: the diagonal y = bandwidth x intensity up to the highest compute roof."""
    x1 = min(X_RANGE[1], flops_max / roof["value"]) if flops_max else X_RANGE[1]
    xs = [X_RANGE[0], x1]
    kind = roof.get("label_kind", "ceiling") if dashed else "measured"
    ax.plot(xs, [roof["value"] * x for x in xs], color=color, ls="--" if dashed else "-",
            lw=1.6, label=f"{prefix}{kind} {roof['name']} bandwidth: "
                          f"{fmt_si(roof['value'], 'B/s')}{_by(roof)}")
    if not dashed:
        ax.annotate(f"{roof['name']} {fmt_si(roof['value'], 'B/s')}",
                    (X_RANGE[0] * 1.1, roof["value"] * X_RANGE[0] * 1.1),
                    textcoords="offset points", xytext=(2, 4), fontsize=8, color=color,
                    rotation=0)
    if not dashed:
        ax.fill_between(xs, [roof["p10"] * x for x in xs], [roof["p90"] * x for x in xs],
                        color=color, alpha=0.12, lw=0)
