"""The memory hierarchy and the machine's drift (hierarchy.png), drawn from a peaks result.

Left: read bandwidth vs working set at a fixed thread count (the native all-core and one-core
series of microbench.roofs.hierarchy, XLA's own sweep), the OS cache sizes, the plateaus named as
levels and main memory's roofs (microbench.roofline), violations of L1 >= L2 >= L3 >= main
memory in red. Right: each main roof's programs round by round (microbench.roofs.rounds), so the
drift of a shared machine during the run is visible.
"""

from __future__ import annotations

from collections.abc import Sequence

from matplotlib.figure import Figure

from microbench.plots.common import (
    PALETTE,
    SUSPECT_COLOR,
    fmt_si,
    made_by,
    place_labels,
    styled,
)
from microbench.roofline import READ, levels, main_roofs
from microbench.schema import KIND_PEAKS


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
        raise ValueError("no peaks result among the files (kind 'microbench.roofs.peaks')")
    fig = Figure(figsize=(15, 6.8), layout="constrained")
    ax, ax2 = fig.subplots(1, 2, width_ratios=[1.4, 1])
    hier = result.get("hierarchy")
    plateaus = []  # (x, y, text, colour), labelled once the layout is final
    if hier:
        _series(ax, hier["all_cores"], PALETTE[0], hier["all_cores"]["program"], "o")
        _series(ax, hier["single_core"], PALETTE[1], hier["single_core"]["program"], "s")
        bad = {c["larger"] for c in hier.get("checks", []) if not c["ok"]}
        for q in hier["all_cores"]["plateaus"]:
            color = SUSPECT_COLOR if q["name"] in bad else "black"
            ax.hlines(q["bytes_per_s"], q["lo_bytes"], q["hi_bytes"], colors=[color], lw=3)
            plateaus.append(((q["lo_bytes"] * q["hi_bytes"]) ** 0.5, q["bytes_per_s"],
                             f"{q['name']} {fmt_si(q['bytes_per_s'], 'B/s')}"
                             + (" VIOLATES the hierarchy" if q["name"] in bad else ""), color))
        for name, cap in hier["all_cores"]["cache_capacities"]:
            ax.axvline(cap, color="0.5", ls="--", lw=1)
            ax.text(cap * 1.15, 0.985, f"OS {name}: {fmt_bytes(cap)}",
                    transform=ax.get_xaxis_transform(), fontsize=8.5, color="0.4",
                    ha="left", va="top")
    sweep = result["sweep"]["points"]
    ax.plot([p["working_set_bytes"] for p in sweep],
            [p["bytes_per_s"]["median"] for p in sweep], ":", color="0.45",
            label="XLA in-place scale sweep (compiler level; read + write bytes)")
    for r in main_roofs(result["roofs"]["memory"]):
        ax.axhline(r["value"], color=PALETTE[3] if levels(r)["access"] == READ else PALETTE[2],
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
    lo, hi = ax.get_ylim()
    ax.set_ylim(lo, hi * (hi / lo) ** 0.12)  # room for the OS cache sizes over the data
    ax.legend(loc="lower left", fontsize=8.5, frameon=False)
    _drift_panel(ax2, result)
    fig.suptitle(title or f"Memory hierarchy and drift: {result['machine']} "
                 f"({result['environment'].get('date_utc', '?')[:10]})", fontsize=14)
    fig.supxlabel(made_by(result.get("environment")), fontsize=9, ha="left", x=0.01)
    for x, y, text, color in plateaus:
        place_labels(ax, [(x, y, text)], fontsize=9, color=color)
    return fig


def fmt_bytes(n: float) -> str:
    """65536 -> '64 KiB', 33554432 -> '32 MiB'."""
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= scale:
            return f"{n / scale:.3g} {unit}"
    return f"{n:.0f} B"


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


def has_series(peaks: dict) -> bool:
    """Whether a peaks result holds what this figure draws (the CPU's cache levels)."""
    return bool(peaks.get("hierarchy") or (peaks.get("sweep") or {}).get("points"))
