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

from microbench.files import readable  # noqa: E402
from microbench.roofline import main_memory_name, ridge  # noqa: E402
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


def _by(roof: dict) -> str:
    """', reached by <program>' for a measured roof that names its program."""
    prog = roof.get("program")
    return f" ({prog})" if prog else ""


def _draw_compute(ax, roof: dict, bw_max, color, prefix: str, dashed: bool = False):
    x0 = max(X_RANGE[0], roof["value"] / bw_max) if bw_max else X_RANGE[0]
    kind = roof.get("label_kind", "ceiling") if dashed else "measured"
    ax.hlines(roof["value"], x0, X_RANGE[1], colors=[color], linestyles="--" if dashed else "-",
              label=f"{prefix}{kind} {roof['name']}: {fmt_si(roof['value'], 'FLOP/s')}"
                    f"{_by(roof)}")

    if not dashed:
        ax.fill_between([x0, X_RANGE[1]], roof["p10"], roof["p90"], color=color, alpha=0.15,
                        lw=0)


def _draw_memory(ax, roof: dict, flops_max, color, prefix: str, dashed: bool = False):
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
    """The matrix roof of float32 over main memory's read-only and read+write roofs, each
    labelled with the two roofs it divides (roofline.ridge, the one place ridges are made)."""
    gemm = next((r for r in compute if r["name"] == "GEMM float32"), None)
    if gemm is None:
        return
    mains = [r for r in memory if r["level"].split()[0] == main]
    for n, mem in enumerate(mains):
        rd = ridge(gemm, mem)
        x = rd["flops_per_byte"]
        ax.plot([x], [gemm["value"]], marker="D", ms=7, color=color, mec="black", zorder=5)
        ax.annotate(rd["label"], (x, gemm["value"]), textcoords="offset points",
                    xytext=(8, -16 - 12 * n), fontsize=8.5)


def _draw_compiler(ax, result: dict, prefix: str, flops_max: float | None):
    """What XLA itself reaches (roofs.compiler): thin dotted grey lines, never roofs."""
    for r in result["roofs"].get("compiler", []):
        if r["kind"] == "compute":
            ax.hlines(r["value"], X_RANGE[0], X_RANGE[1], colors=["0.45"], linestyles=":",
                      lw=1.2)
        else:
            end = min(X_RANGE[1], flops_max / r["value"]) if flops_max else X_RANGE[1]
            xs = [X_RANGE[0], end]
            ax.plot(xs, [r["value"] * x for x in xs], color="0.45", ls=":", lw=1.2)
    unit = {"compute": "FLOP/s", "memory": "B/s"}
    names = ", ".join(f"{r['name']} {fmt_si(r['value'], unit[r['kind']])}"
                      for r in result["roofs"].get("compiler", [])[:3])
    if names:
        ax.plot([], [], color="0.45", ls=":", lw=1.2,
                label=f"{prefix}compiler level, not a roof: {names}")


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
                label=f"{prefix}AI sweep: FMA chain in place (main-memory buffer while it can be "
                      f"memory-bound, 1/8 of it beyond 8 FLOP/B; median, p10-p90)")


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
    for metric, block in (result.get("main_roofs") or {}).items():
        ours = block.get("ours")
        if block.get("suspect") and ours and metric != "gemm_float32":
            out.append((1.0, ours["median"], ours["program"]))
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
    main = main_memory_name(result["environment"])
    _draw_ridges(ax, compute, memory, color_of(i, 0), main)
    _draw_compiler(ax, result, prefix, flops_max)
    _draw_intensity(ax, result, color_of(i, j), prefix)
    bad = _suspects(result)
    if bad:
        ax.scatter([b[0] for b in bad], [b[1] for b in bad], marker="X", s=120,
                   color=SUSPECT_COLOR, zorder=6, edgecolors="black",
                   label=f"{prefix}SUSPECT: above a ceiling, a peer or a roof = a measurement "
                         f"to explain, not a roof ({len(bad)})")


@styled
def roofline_figure(results: Sequence[dict], title: str | None = None) -> Figure:
    """Log-log roofline of one or more result objects (several machines on one chart)."""
    results = [r for r in results if r.get("kind", KIND_PEAKS) == KIND_PEAKS]
    if not results:
        raise ValueError("no peaks result among the files (kind 'microbench.peaks')")
    fig, ax = new_figure(13.0, 10.0)
    color_of = _colors(len(results))
    for i, result in enumerate(results):
        prefix = f"[{result['machine']}] " if len(results) > 1 else ""
        _draw_one(ax, result, i, color_of, prefix)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlim(*X_RANGE)
    tops = [r["value"] for res in results for r in res["roofs"]["compute"]]
    tops += [v for res in results for v in ((res.get("spec") or {}).get("peak_flops") or {})
             .values()]
    bottoms = [r["value"] * X_RANGE[0] for res in results for r in res["roofs"]["memory"]]
    if tops and bottoms:
        ax.set_ylim(min(bottoms) / 2, max(tops) * 3)
    ax.set_xlabel("Arithmetic intensity (FLOP / byte)")
    ax.set_ylabel("Performance (FLOP / s)")
    names = "; ".join(f"{r['machine']} ({r['environment'].get('date_utc', '?')[:10]})"
                      for r in results)
    fig.suptitle(title or f"Roofline measured on {names}", fontsize=14)
    ax.set_title("Solid: measured roofs, the best program of each (median over rounds, shaded "
                 "spread).  Dashed: vendor or theoretical ceilings.\nDotted grey: what XLA "
                 "itself reaches.  Diamonds: ridge points against main memory.  Bytes are "
                 "algorithmic.", fontsize=10)
    fig.legend(*ax.get_legend_handles_labels(), loc="outside lower center", ncol=2,
               frameon=False, fontsize=8)
    return fig


# ------------------------------------------------------------------ hierarchy and drift

def _series(ax, series: dict, color, label: str, marker: str):
    pts = series["points"]
    xs = [p["working_set_bytes"] for p in pts]
    ys = [p["bytes_per_s"]["median"] for p in pts]
    lo = [p["bytes_per_s"]["p10"] for p in pts]
    hi = [p["bytes_per_s"]["p90"] for p in pts]
    ax.plot(xs, ys, marker=marker, ms=4, color=color, label=label)
    ax.fill_between(xs, lo, hi, color=color, alpha=0.15, lw=0)


@styled
def hierarchy_figure(results: Sequence[dict], title: str | None = None) -> Figure:
    """Left: read bandwidth vs working set at a fixed thread count (native all-core and
    one-core series, XLA's own sweep), the OS cache sizes, the plateaus named as levels and
    main memory's roofs, violations of L1 >= L2 >= L3 >= main memory in red. Right: each main
    roof's programs round by round (the drift of the machine during the run)."""
    result = next((r for r in results if r.get("kind", KIND_PEAKS) == KIND_PEAKS), None)
    if result is None:
        raise ValueError("no peaks result among the files (kind 'microbench.peaks')")
    fig = Figure(figsize=(15, 6.8), layout="constrained")
    ax, ax2 = fig.subplots(1, 2, width_ratios=[1.4, 1])
    hier = result.get("hierarchy")
    if hier:
        _series(ax, hier["all_cores"], PALETTE[0], hier["all_cores"]["program"], "o")
        _series(ax, hier["single_core"], PALETTE[1], hier["single_core"]["program"], "s")
        bad = {c["larger"] for c in hier.get("checks", []) if not c["ok"]}
        for q in hier["all_cores"]["plateaus"]:
            color = SUSPECT_COLOR if q["name"] in bad else "black"
            ax.hlines(q["bytes_per_s"], q["lo_bytes"], q["hi_bytes"], colors=[color], lw=3)
            ax.annotate(f"{q['name']} {fmt_si(q['bytes_per_s'], 'B/s')}"
                        + (" VIOLATES the hierarchy" if q["name"] in bad else ""),
                        (q["lo_bytes"], q["bytes_per_s"]), textcoords="offset points",
                        xytext=(0, 6), fontsize=9, color=color)
        for name, cap in hier["all_cores"]["cache_capacities"]:
            ax.axvline(cap, color="0.5", ls="--", lw=1)
            ax.text(cap, 0.55, f"OS: {name} {cap / 2**20:.3g} MiB (all cores) ",
                    transform=ax.get_xaxis_transform(), rotation=90, fontsize=8, color="0.4",
                    ha="right", va="center")
    sweep = result["sweep"]["points"]
    ax.plot([p["working_set_bytes"] for p in sweep],
            [p["bytes_per_s"]["median"] for p in sweep], ":", color="0.45",
            label="XLA in-place scale sweep (compiler level; read + write bytes)")
    for r in result["roofs"]["memory"]:
        if r["level"].split()[0] in ("DRAM", "HBM") and not r.get("suspect"):
            ax.axhline(r["value"], color=PALETTE[3] if "read" in r["level"] else PALETTE[2],
                       lw=1.2, label=f"{r['name']} roof {fmt_si(r['value'], 'B/s')} "
                                     f"({r.get('program', r['source'])})")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("Working set (bytes)")
    ax.set_ylabel("Bandwidth (bytes / s, algorithmic)")
    checks = (hier or {}).get("checks", [])
    verdict = ("no hierarchy series (no C compiler)" if not hier else
               "L1 >= L2 >= L3 >= main memory holds" if all(c["ok"] for c in checks) else
               "hierarchy VIOLATED: " + "; ".join(c["smaller"] + " < " + c["larger"]
                                                  for c in checks if not c["ok"]))
    ax.set_title(f"Read bandwidth per level at a fixed thread count: {verdict}", fontsize=11)
    ax.legend(loc="lower left", fontsize=8.5, frameon=False)
    _drift_panel(ax2, result)
    fig.suptitle(title or f"Memory hierarchy and drift: {result['machine']} "
                 f"({result['environment'].get('date_utc', '?')[:10]})", fontsize=14)
    return fig


def _drift_panel(ax, result: dict) -> None:
    rounds = result.get("rounds") or []
    if not rounds:
        ax.set_axis_off()
        ax.set_title("no rounds in this result", fontsize=11)
        return
    t0 = rounds[0]["t_start"]
    programs: dict[str, list] = {}
    for rnd in rounds:
        for p in rnd["programs"]:
            if p["metric"] in ("main_read", "main_rw", "gemm_float32"):
                programs.setdefault((p["metric"], p["program"]), []).append(
                    (rnd["t_start"] - t0, p["value"]))
    spreads = []
    for j, ((metric, prog), pts) in enumerate(sorted(programs.items())):
        vals = [v for _, v in pts]
        med = sorted(vals)[len(vals) // 2]
        spreads.append((max(vals) - min(vals)) / med)
        ax.plot([t for t, _ in pts], [v / med for v in vals], "o-", ms=4,
                color=PALETTE[j % len(PALETTE)], label=f"{metric}: {prog}"[:70])
    ax.axhspan(0.9, 1.1, color="0.85", zorder=0, label="+/-10% (the 'unstable' limit)")
    ax.set_xlabel("Seconds since the first round")
    ax.set_ylabel("Value / its median over the rounds")
    ax.set_title(f"Drift across {len(rounds)} interleaved rounds: largest program spread "
                 f"{max(spreads):.0%}", fontsize=11)
    ax.legend(fontsize=7, frameon=False, loc="best")


# ------------------------------------------------------------------ the figure table

from microbench.plot_phases import (  # noqa: E402  (they use the helpers above)
    batch_figure,
    crossover_figure,
    gap_figure,
    kv_figure,
    phases_roofline_figure,
    throughput_figure,
)

FIGURES = {"roofline": roofline_figure, "hierarchy": hierarchy_figure,
           "phases_roofline": phases_roofline_figure,
           "batch": batch_figure, "throughput": throughput_figure,
           "crossover": crossover_figure, "kv_cache": kv_figure, "gap": gap_figure}


def plot_files(paths: Sequence[str | Path], out_dir: str | Path,
               name: str = "roofline") -> Path:
    """Redraw figure `name` from saved result files into out_dir/<name>.png."""
    fig = FIGURES[name](load_results(paths))
    return save(fig, Path(out_dir) / f"{name}.png")
