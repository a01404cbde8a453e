"""The machine's roofline (roofline.png), drawn from one or more peaks results.

Log-log, x = FLOP/byte, y = FLOP/s (Williams, Waterman & Patterson, "Roofline", CACM 2009, as
the Empirical Roofline Tool draws it): one diagonal per memory level and one horizontal per
compute roof; vendor or theoretical roofs dashed, measured roofs solid with their p10-p90
spread shaded, ridge points against main memory marked (microbench.roofline), what XLA itself
reaches dotted grey, and values that exceeded their ceiling drawn in red as measurement errors
rather than as roofs.
"""

from __future__ import annotations

import re
import textwrap
from collections.abc import Sequence

from matplotlib.figure import Figure

from microbench.plots.common import (
    SUSPECT_COLOR,
    X_RANGE,
    colors,
    draw_compute_roof,
    draw_memory_roof,
    fmt_si,
    made_by,
    marker_boxes,
    new_figure,
    renderer_of,
    roof_ends,
    shared_area,
    styled,
)
from microbench.roofline import main_roofs, ridge
from microbench.schema import KIND_PEAKS

INTEGER = re.compile(r"\bu?int\d")


def integer_roof(roof: dict) -> bool:
    """True for a compute roof of integer arithmetic (an int8 GEMM): it does operations, not
    floating-point ones, so its rate is OP/s and its ridge OP/B."""
    return str(roof.get("dtype") or "").startswith(("int", "uint")) or \
        bool(INTEGER.search(str(roof.get("name") or "")))


def rate_unit(roof: dict) -> str:
    """'OP/s' for an integer compute roof, 'FLOP/s' for another, 'B/s' for a memory roof."""
    if roof.get("kind") == "memory":
        return "B/s"
    return "OP/s" if integer_roof(roof) else "FLOP/s"


def ridge_label(ridge: dict, compute: dict | None = None) -> str:
    """A ridge's label ('ridge 9.42 OP/B = GEMM int8 / DRAM read-only'): per byte in the
    compute roof's own unit (its name, or the `compute` roof it was made from)."""
    unit = "OP/B" if integer_roof(compute or {"name": ridge.get("compute")}) else "FLOP/B"
    return f"ridge {ridge['flops_per_byte']:.3g} {unit} = {ridge['compute']} / {ridge['memory']}"


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
            op = "OP" if dt.startswith("int") else "FLOP"
            how = (f"{der['cores']} cores x {per_cycle:g} {op}/cycle x "
                   f"{der['clock_hz'] / 1e9:.2f} GHz")
        comp.append({"name": f"{dt} peak ({how})", "value": v, "label_kind": kind,
                     "dtype": dt})
    mem = [{"name": f"{lvl} ({spec['name']})", "value": v, "label_kind": kind}
           for lvl, v in spec["memory_bandwidth"].items()]
    return comp, mem


def _draw_ridges(ax, compute: list[dict], memory: list[dict], color):
    """The matrix roof of float32 over main memory's read-only and read+write roofs, each
    labelled with the two roofs it divides (roofline.ridge, the one place ridges are made)."""
    gemm = next((r for r in compute if r["name"] == "GEMM float32"), None)
    if gemm is None:
        return
    for n, mem in enumerate(main_roofs(memory)):
        rd = ridge(gemm, mem)
        x = rd["flops_per_byte"]
        ax.plot([x], [gemm["value"]], marker="D", ms=7, color=color, mec="black", zorder=5)
        ax.annotate(ridge_label(rd, gemm), (x, gemm["value"]), textcoords="offset points",
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
    names = ", ".join(f"{r['name']} {fmt_si(r['value'], rate_unit(r))}"
                      for r in result["roofs"].get("compiler", [])[:3])
    if names:
        ax.plot([], [], color="0.45", ls=":", lw=1.2,
                label=f"{prefix}compiler level, not a roof: {names}")


def _integer_label(artists) -> None:
    """An integer GEMM's roof does operations, not floating-point ones: its legend entry says
    OP/s (common.draw_compute_roof writes every compute roof's value in FLOP/s)."""
    for a in artists:
        label = a.get_label()
        if label and not label.startswith("_"):
            a.set_label(label.replace("FLOP/s", "OP/s"))


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
    bw_max, flops_max = roof_ends(memory, compute)
    v_bw_max, v_flops_max = roof_ends(v_mem or memory, v_comp or compute)
    layers = [(compute, draw_compute_roof, bw_max, False),
              (memory, draw_memory_roof, flops_max, False),
              (v_comp, draw_compute_roof, v_bw_max, True),
              (v_mem, draw_memory_roof, v_flops_max, True)]
    j = 0
    for roofs_, draw, end, dashed in layers:
        for roof in roofs_:
            before = len(ax.collections)
            draw(ax, roof, end, color_of(i, j), prefix, dashed=dashed)
            if draw is draw_compute_roof and integer_roof(roof):
                _integer_label(ax.collections[before:])
            j += 1
    _draw_ridges(ax, compute, memory, color_of(i, 0))
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
        raise ValueError("no peaks result among the files (kind 'microbench.roofs.peaks')")
    fig, ax = new_figure(13.0, 10.0)
    color_of = colors(len(results))
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
    ax.set_ylabel("Performance (FLOP / s; an integer GEMM: OP / s)")
    names = "; ".join(f"{r['machine']} ({r['environment'].get('date_utc', '?')[:10]})"
                      for r in results)
    fig.suptitle(title or f"Roofline measured on {names}", fontsize=14)
    # the CPU path's roofs are medians over interleaved rounds; the device path runs each once
    how = ("median over rounds, shaded spread" if any(r.get("rounds") for r in results)
           else "each program's median")
    ax.set_title(f"Solid: measured roofs, the best program of each ({how}).  Dashed: vendor "
                 "or theoretical ceilings.\nDotted grey: what XLA "
                 "itself reaches.  Diamonds: ridge points against main memory.  Bytes are "
                 "algorithmic.", fontsize=10)
    handles, labels = ax.get_legend_handles_labels()
    # two columns of long labels, each wrapped so neither runs past the figure's edge
    # the machine line heads the legend: as a separate footer it shared the bottom margin with
    # the legend and was drawn over its last row
    made = "; ".join(f"{r['machine']}: " * (len(results) > 1) + made_by(r.get("environment"))
                     for r in results)
    fig.legend(handles, [textwrap.fill(label, 78) for label in labels],
               loc="outside lower center", ncol=2, frameon=False, fontsize=8,
               title=textwrap.fill(made, 150), title_fontsize=9)
    _slide_roof_names(ax)
    return fig


def _slide_roof_names(ax) -> None:
    """Each memory roof's name (common.draw_memory_roof writes it at the line's left end),
    highest roof first, slid up its line to the first place that covers no marker and no
    name before it: close bandwidths (L2, L3) would print their names on top of each other."""
    renderer = renderer_of(ax.figure)
    taken = marker_boxes(ax, renderer)
    names = sorted((t for t in ax.texts if t.get_text().endswith("B/s")),
                   key=lambda t: -t.xy[1])
    for t in names:
        bandwidth = t.xy[1] / t.xy[0]
        for k in range(12):
            x = X_RANGE[0] * 1.1 * 2 ** (0.45 * k)
            t.xy = (x, bandwidth * x)
            box = t.get_window_extent(renderer).padded(6)  # well apart, not touching
            if not any(shared_area(box, b) for b in taken):
                break
        taken.append(t.get_window_extent(renderer))
