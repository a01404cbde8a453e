"""The project's one plotting module: every figure is drawn from saved JSON results only.

Layout: shared style helpers first (rc settings, SI formatting, atomic save, loading), then
one function per figure, each taking parsed result objects and returning a matplotlib Figure.
Add a figure by writing `<name>_figure(results, ...) -> Figure` below and listing it in
FIGURES. The roofline follows Williams, Waterman & Patterson, "Roofline" (CACM 2009), drawn
the way the Empirical Roofline Tool does: log-log, x = FLOP/byte, y = FLOP/s, one diagonal
per memory level and one horizontal per compute roof; vendor or theoretical roofs dashed,
measured roofs solid with their p10-p90 spread shaded, ridge points marked, and values that
exceeded their ceiling drawn in red as measurement errors rather than as roofs.
"""

from __future__ import annotations

import functools
import json
import os
import tempfile
from collections.abc import Sequence
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402

from microbench.harness import readable  # noqa: E402
from microbench.schema import KIND_PEAKS, validate_result  # noqa: E402

# ------------------------------------------------------------------ shared style helpers

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


def load_results(paths: Sequence[str | Path]) -> list[dict]:
    """Parse and validate result files (schema.validate_result)."""
    return [validate_result(json.loads(Path(p).read_text())) for p in paths]


def _colors(n_results: int):
    """color(i_result, j_roof): per roof for one machine, per machine for several."""
    if n_results == 1:
        return lambda i, j: PALETTE[j % len(PALETTE)]
    return lambda i, j: PALETTE[i % len(PALETTE)]


# ------------------------------------------------------------------ roofline

X_RANGE = (1 / 16, 2048.0)


def _roof_ends(memory: list[dict], compute: list[dict]):
    bw_max = max((r["value"] for r in memory), default=None)
    flops_max = max((r["value"] for r in compute), default=None)
    return bw_max, flops_max


def _draw_compute(ax, roof: dict, bw_max, color, prefix: str, dashed: bool = False):
    x0 = max(X_RANGE[0], roof["value"] / bw_max) if bw_max else X_RANGE[0]
    kind = roof.get("label_kind", "ceiling") if dashed else "measured"
    ax.hlines(roof["value"], x0, X_RANGE[1], colors=[color], linestyles="--" if dashed else "-",
              label=f"{prefix}{kind} {roof['name']}: {fmt_si(roof['value'], 'FLOP/s')}")
    if not dashed:
        ax.fill_between([x0, X_RANGE[1]], roof["p10"], roof["p90"], color=color, alpha=0.15,
                        lw=0)


def _draw_memory(ax, roof: dict, flops_max, color, prefix: str, dashed: bool = False):
    x1 = min(X_RANGE[1], flops_max / roof["value"]) if flops_max else X_RANGE[1]
    xs = [X_RANGE[0], x1]
    kind = roof.get("label_kind", "ceiling") if dashed else "measured"
    ax.plot(xs, [roof["value"] * x for x in xs], color=color, ls="--" if dashed else "-",
            lw=1.6, label=f"{prefix}{kind} {roof['name']} bandwidth: "
                          f"{fmt_si(roof['value'], 'B/s')}")
    if not dashed:
        ax.fill_between(xs, [roof["p10"] * x for x in xs], [roof["p90"] * x for x in xs],
                        color=color, alpha=0.12, lw=0)


def _spec_roofs(spec: dict | None) -> tuple[list[dict], list[dict]]:
    """Vendor/theoretical ceilings of a result's spec block, as roof-like dicts."""
    if not spec:
        return [], []
    der = spec.get("derivation") or {}
    kind = "theoretical" if der else "vendor"
    comp = []
    for dt, v in spec["peak_flops"].items():
        how = spec["name"]
        if der:
            per_cycle = der["flop_per_cycle_per_core"][dt]
            how = (f"{der['cores']} cores x {per_cycle:g} FLOP/cycle x "
                   f"{der['clock_hz'] / 1e9:.2f} GHz")
        comp.append({"name": f"{dt} peak ({how})", "value": v, "label_kind": kind})
    mem = [{"name": f"{lvl} ({spec['name']})", "value": v, "label_kind": kind}
           for lvl, v in spec["memory_bandwidth"].items()]
    return comp, mem


def _draw_ridges(ax, compute: list[dict], memory: list[dict], color, main: str):
    main_roof = next((r for r in memory if r["level"] == main), None)
    if main_roof is None:
        return
    for n, roof in enumerate(sorted(compute, key=lambda r: r["value"])):
        x = roof["value"] / main_roof["value"]
        ax.plot([x], [roof["value"]], marker="D", ms=7, color=color, mec="black", zorder=5)
        ax.annotate(f"ridge {x:.3g} FLOP/B", (x, roof["value"]), textcoords="offset points",
                    xytext=(8, -16 if n % 2 == 0 else 6), fontsize=9)


def _draw_intensity(ax, result: dict, color, prefix: str):
    pts = sorted((p for p in result["intensity"]["points"] if not p["suspect"]),
                 key=lambda p: p["flops_per_byte"])
    if not pts:
        return
    xs = [p["flops_per_byte"] for p in pts]
    ys = [p["flops_per_s"]["median"] for p in pts]
    err = [[y - p["flops_per_s"]["p10"] for y, p in zip(ys, pts, strict=True)],
           [p["flops_per_s"]["p90"] - y for y, p in zip(ys, pts, strict=True)]]
    ax.errorbar(xs, ys, yerr=err, fmt="o:", color=color, ms=5, lw=1.2, capsize=3,
                label=f"{prefix}AI sweep: FMA chain in place on a DRAM-sized buffer "
                      f"(median, p10-p90)")


def _suspects(result: dict) -> list[tuple[float, float, str]]:
    """(x, y, text) for every flagged value: compute at its own FLOP/byte, memory on x=1."""
    out = []
    entries = (result["gemm"] + result["vector"] + result["bandwidth"]
               + result["sweep"]["points"] + result["intensity"]["points"])
    for e in entries:
        if not e["suspect"]:
            continue
        if e.get("flops_per_s") and e["flops"] and e["bytes"]:
            out.append((e["flops"] / e["bytes"], e["flops_per_s"]["median"], e["name"]))
        elif e.get("bytes_per_s"):
            out.append((1.0, e["bytes_per_s"]["median"], e["name"]))
    for r in result["roofs"]["compute"] + result["roofs"]["memory"]:
        if r["suspect"]:
            out.append((1.0 if r["kind"] == "memory" else X_RANGE[1] / 2, r["value"], r["name"]))
    return out


def _draw_one(ax, result: dict, i: int, color_of, prefix: str):
    roofs = result["roofs"]
    compute = [r for r in roofs["compute"] if not r["suspect"]]
    memory = [r for r in roofs["memory"] if not r["suspect"]]
    v_comp, v_mem = _spec_roofs(result.get("spec"))
    bw_max, flops_max = _roof_ends(memory, compute)
    v_bw_max, v_flops_max = _roof_ends(v_mem or memory, v_comp or compute)
    layers = [(compute, _draw_compute, bw_max, False), (memory, _draw_memory, flops_max, False),
              (v_comp, _draw_compute, v_bw_max, True), (v_mem, _draw_memory, v_flops_max, True)]
    j = 0
    for roofs_, draw, end, dashed in layers:
        for roof in roofs_:
            draw(ax, roof, end, color_of(i, j), prefix, dashed=dashed)
            j += 1
    main = "DRAM" if result["environment"]["backend"] == "cpu" else "HBM"
    _draw_ridges(ax, compute, memory, color_of(i, 0), main)
    _draw_intensity(ax, result, color_of(i, j), prefix)
    bad = _suspects(result)
    if bad:
        ax.scatter([b[0] for b in bad], [b[1] for b in bad], marker="X", s=120,
                   color=SUSPECT_COLOR, zorder=6, edgecolors="black",
                   label=f"{prefix}SUSPECT: above the ceiling = measurement error, not a roof "
                         f"({len(bad)})")


@styled
def roofline_figure(results: Sequence[dict], title: str | None = None) -> Figure:
    """Log-log roofline of one or more result objects (several machines on one chart)."""
    results = [r for r in results if r.get("kind", KIND_PEAKS) == KIND_PEAKS]
    if not results:
        raise ValueError("no peaks result among the files (kind 'microbench.peaks')")
    fig, ax = new_figure()
    color_of = _colors(len(results))
    for i, result in enumerate(results):
        prefix = f"[{result['machine']}] " if len(results) > 1 else ""
        _draw_one(ax, result, i, color_of, prefix)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlim(*X_RANGE)
    ax.set_xlabel("Arithmetic intensity (FLOP / byte)")
    ax.set_ylabel("Performance (FLOP / s)")
    names = "; ".join(f"{r['machine']} ({r['environment'].get('date_utc', '?')[:10]})"
                      for r in results)
    fig.suptitle(title or f"Roofline measured on {names}", fontsize=14)
    ax.set_title("Solid: measured roofs (median, shaded p10-p90).  Dashed: vendor or theoretical "
                 "ceilings.\nDiamonds: ridge points against main memory.  Bytes are "
                 "algorithmic (no write-allocate).", fontsize=10)
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.1), ncol=2, frameon=False)
    return fig


# ------------------------------------------------------------------ the figure table

from microbench.plot_phases import (  # noqa: E402  (they use the helpers above)
    batch_figure,
    crossover_figure,
    gap_figure,
    kv_figure,
    phases_roofline_figure,
    throughput_figure,
)

FIGURES = {"roofline": roofline_figure, "phases_roofline": phases_roofline_figure,
           "batch": batch_figure, "throughput": throughput_figure,
           "crossover": crossover_figure, "kv_cache": kv_figure, "gap": gap_figure}


def plot_files(paths: Sequence[str | Path], out_dir: str | Path,
               name: str = "roofline") -> Path:
    """Redraw figure `name` from saved result files into out_dir/<name>.png."""
    fig = FIGURES[name](load_results(paths))
    return save(fig, Path(out_dir) / f"{name}.png")
