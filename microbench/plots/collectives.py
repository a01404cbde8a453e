"""The collectives figure and summary, drawn only from a saved result (collectives.json,
`python -m microbench collectives`): bus bandwidth against message size per collective, with
the p10-p90 spread, beside the vendor spec of a few interconnects, and the time per call.

Bytes, algbw and busbw follow nccl-tests (NVIDIA/nccl-tests, doc/PERFORMANCE.md), as the
result's `convention` block records: busbw = algbw x 2(n-1)/n for all-reduce and x (n-1)/n for
all-gather, reduce-scatter and all-to-all, comparable with one direction of a link. Titles are
computed from the JSON; a result measured on emulated CPU devices says so in the title.
Imports matplotlib and microbench.plots only (no JAX):
`python -m microbench.plots.collectives collectives.json [out_dir]` redraws a saved result.
"""

from __future__ import annotations

import sys
from pathlib import Path

from microbench.plots.common import (
    PALETTE,
    check_kind,
    made_by,
    new_figure,
    num,
    redraw_main,
    save,
    styled,
    wall_time,
)
from microbench.plots.serving import _note, machine_name

FILE = "collectives.png"
COMMAND = "python -m microbench collectives"
MARKERS = "osD^"


def fmt_bytes(nbytes: float) -> str:
    """1024 -> '1 KiB'; 4194304 -> '4 MiB'; 100 -> '100 B'."""
    for scale, unit in ((2**30, "GiB"), (2**20, "MiB"), (2**10, "KiB")):
        if nbytes >= scale:
            value = nbytes / scale
            return f"{value:.0f} {unit}" if value == int(value) else f"{num(value)} {unit}"
    return f"{nbytes:g} B"


def _gbs(bytes_per_s) -> str:
    return "n/a" if bytes_per_s is None else f"{num(bytes_per_s / 1e9)} GB/s"


def _us(seconds) -> str:
    return "n/a" if seconds is None else f"{num(seconds * 1e6)} us"


def _rows(result: dict, name: str | None = None) -> list[dict]:
    rows = result.get("results") or []
    rows = [r for r in rows if name is None or r["collective"] == name]
    return sorted(rows, key=lambda r: r["bytes"])


def names(result: dict) -> list[str]:
    out: list[str] = []
    for r in result.get("results") or []:
        if r["collective"] not in out:
            out.append(r["collective"])
    return out


def devices_line(result: dict) -> str:
    """'8 emulated CPU devices (threads of one process)' or '8 x NVIDIA H200'."""
    d = result.get("devices") or {}
    n = d.get("count", "?")
    if d.get("emulated", result.get("emulated")):
        return f"{n} emulated CPU devices (threads of one process)"
    return f"{n} x {d.get('device_kind', '?')} ({d.get('backend', '?')})"


def best(result: dict, name: str) -> dict | None:
    """The row of collective `name` with the highest median busbw."""
    rows = _rows(result, name)
    return max(rows, key=lambda r: r["busbw"]["median"]) if rows else None


def claim(result: dict, per_line: int = 0) -> str:
    """The highest median busbw of each collective and the size it was reached at
    (per_line > 0: a line break after every per_line collectives)."""
    parts = []
    for name in names(result):
        r = best(result, name)
        parts.append(f"{name} {_gbs(r['busbw']['median'])} at {fmt_bytes(r['bytes'])}")
    if not parts:
        return "nothing measured"
    return "peak busbw: " + _join(parts, per_line)


def _join(parts: list[str], per_line: int) -> str:
    if per_line <= 0:
        return ", ".join(parts)
    return ",\n".join(", ".join(parts[i:i + per_line]) for i in range(0, len(parts), per_line))


def aggregate(result: dict) -> str:
    """n x the highest median algbw: the bytes per second all devices together moved, which on
    emulated devices is one memory's traffic (each byte read once and written once at least)."""
    rows = _rows(result)
    if not rows:
        return "nothing was measured"
    n = (result.get("devices") or {}).get("count", 1)
    r = max(rows, key=lambda row: row["algbw"]["median"])
    return (f"the {n} devices together came to {_gbs(n * r['algbw']['median'])} of S per second "
            f"({n} x the highest algbw, {r['collective']} at {fmt_bytes(r['bytes'])})")


def _links_drawn(ax, result: dict) -> None:
    """Each link's spec as a dashed line, labelled at the right end: above the line, or
    below it when the next higher link is within 1.6x (so the two labels do not collide)."""
    links = sorted(result.get("links") or [], key=lambda link: -link["bandwidth"])
    above = None
    for link in links:
        gbs = link["bandwidth"] / 1e9
        ax.axhline(gbs, color="0.35", ls="--", lw=1.2)
        below = above is not None and above / gbs < 1.6
        ax.text(1.0, gbs / 1.15 if below else gbs * 1.03,
                f" vendor spec: {link['name']} {num(gbs)} GB/s ",
                transform=ax.get_yaxis_transform(), ha="right",
                va="top" if below else "bottom", fontsize=9, color="0.25")
        above = gbs


def _series(ax, result: dict, key: str, scale: float) -> None:
    for i, name in enumerate(names(result)):
        rows = _rows(result, name)
        x = [r["bytes"] for r in rows]
        if key == "busbw":
            mid = [r["busbw"]["median"] / scale for r in rows]
            lo = [r["busbw"]["p10"] / scale for r in rows]
            hi = [r["busbw"]["p90"] / scale for r in rows]
        else:  # seconds per call: p10-p90 of the time
            mid = [r["timing"]["median"] / scale for r in rows]
            lo = [r["timing"]["p10"] / scale for r in rows]
            hi = [r["timing"]["p90"] / scale for r in rows]
        factor = (result.get("convention") or {}).get("busbw", {}).get(name, "")
        label = f"{name} ({factor.replace('algbw x ', 'busbw = algbw x ')})" if factor else name
        ax.plot(x, mid, marker=MARKERS[i % len(MARKERS)], color=PALETTE[i], label=label)
        ax.fill_between(x, lo, hi, color=PALETTE[i], alpha=0.2, lw=0)


def _size_axis(ax, result: dict, most: int = 9) -> None:
    """Message sizes on a log axis, at most `most` of them labelled (a narrow panel: fewer)."""
    ax.set_xscale("log", base=2)
    sizes = sorted({r["bytes"] for r in _rows(result)})
    ticks = sizes[::-(-len(sizes) // most)]
    ax.set_xticks(ticks, [fmt_bytes(s) for s in ticks])
    ax.set_xlabel("message size S: bytes per device (all_gather: its output)")


def _bandwidth_panel(ax, result: dict) -> None:
    _series(ax, result, "busbw", 1e9)
    _links_drawn(ax, result)
    ax.set_yscale("log")
    top = max([r["busbw"]["p90"] for r in _rows(result)]
              + [link["bandwidth"] for link in result.get("links") or []])
    ax.set_ylim(top=top / 1e9 * 2.5)
    _size_axis(ax, result)
    ax.set_ylabel("bus bandwidth (GB/s, nccl-tests busbw)")
    emulated = (result.get("devices") or {}).get("emulated", result.get("emulated"))
    what = ("\nemulated devices: threads copying memory within one DRAM, not a link"
            if emulated else "")
    ax.legend(loc="lower right", fontsize=9,
              title="measured median, p10-p90 shaded; dashed: vendor spec,\n"
                    f"one direction per chip (what busbw compares with){what}",
              title_fontsize=8.5)
    ax.set_title(f"(a) bus bandwidth vs message size, {claim(result, 2)}", fontsize=10.5,
                 loc="left")


def _time_panel(ax, result: dict) -> None:
    _series(ax, result, "seconds", 1e-6)
    ax.set_yscale("log")
    _size_axis(ax, result, most=6)
    ax.set_ylabel("time per call (us, median, p10-p90 shaded)")
    smallest = [min(_rows(result, n), key=lambda r: r["bytes"]) for n in names(result)]
    text = _join([f"{r['collective']} {_us(r['seconds'])}" for r in smallest], 0)
    size = fmt_bytes(min(r["bytes"] for r in smallest))
    ax.set_title(f"(b) time per call; latency at {size}:\n{text}", fontsize=10, loc="left")


def suptitle(result: dict) -> str:
    env = result.get("environment") or {}
    return (f"Collectives on {devices_line(result)}, {machine_name(env)}: `{COMMAND}`\n"
            f"{result.get('dtype', 'float32')} buffers, jax.shard_map over a 1-D mesh, "
            f"out of place; bytes and busbw as nccl-tests")


@styled
def collectives_figure(result: dict):
    fig, _ = new_figure(16, 7.5)
    fig.clear()
    grid = fig.add_gridspec(1, 2, width_ratios=[1.45, 1.0])
    ax_bw, ax_t = fig.add_subplot(grid[0, 0]), fig.add_subplot(grid[0, 1])
    if not _rows(result):
        _note(ax_bw, "nothing measured")
        _note(ax_t, "")
    else:
        _bandwidth_panel(ax_bw, result)
        _time_panel(ax_t, result)
    fig.suptitle(suptitle(result), fontsize=13)
    fig.supxlabel(made_by(result.get("environment")), fontsize=9, ha="left", x=0.01,
                  color="0.3")
    return fig


def draw_collectives(result: dict, out_dir: str | Path) -> list[Path]:
    """Write collectives.png into out_dir; return its path in a list."""
    check_kind(result, "collectives")
    return [save(collectives_figure(result), Path(out_dir) / FILE)]


# ------------------------------------------------------------------ the summary

def collectives_summary(result: dict) -> str:
    env = result.get("environment") or {}
    conv = result.get("convention") or {}
    d = result.get("devices") or {}
    lines = [f"# collectives on {devices_line(result)}, {machine_name(env)}", "",
             f"`{COMMAND}`: {result.get('dtype', 'float32')} buffers, out of place. "
             f"S = {conv.get('bytes', 'the bytes per device')}; algbw = S / time; busbw = algbw x "
             f"2(n-1)/n (all_reduce) or x (n-1)/n (the others), after "
             f"{conv.get('source', 'nccl-tests')}. Every point was checked against numpy.", ""]
    if d.get("emulated", result.get("emulated")):
        lines += [f"**Emulated**: {d.get('note', 'emulated CPU devices')}. Compare these "
                  "numbers with this machine's memory bandwidth, never with a link's: all "
                  f"devices share one memory, so {aggregate(result)}.", ""]
    lines += [f"{claim(result)}.", "",
              "| collective | S per device | time (median) | time p10-p90 | algbw | busbw |",
              "|---|---|---|---|---|---|"]
    for name in names(result):
        for r in _rows(result, name):
            t = r["timing"]
            lines.append(f"| {name} | {fmt_bytes(r['bytes'])} | {_us(r['seconds'])} | "
                         f"{_us(t['p10'])} - {_us(t['p90'])} | {_gbs(r['algbw']['median'])} | "
                         f"{_gbs(r['busbw']['median'])} |")
    links = result.get("links") or []
    if links:
        lines += ["", "vendor spec, one direction per chip: " + ", ".join(
            f"{link['name']} {_gbs(link['bandwidth'])}" for link in links) + "."]
    lines += wall_time(result)
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    return redraw_main(argv, "collectives", draw_collectives, collectives_summary)


if __name__ == "__main__":
    sys.exit(main())
