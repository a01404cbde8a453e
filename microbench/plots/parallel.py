"""The tensor- and expert-parallel figures and summary, drawn only from a saved result
(parallel.json, `python -m microbench parallel`; the study is microbench/studies/parallel.py):

    parallel_tp.png  per model and batch, one device's decode step per TP degree as stacked
                     bars (weight reads, KV reads, activations, compute beyond memory, the
                     all-reduces) on the device's scale-up link (solid) and a slower link
                     (hatched), and below it the chip-milliseconds per token (step x TP / batch)
    parallel_ep.png  per EP degree, the all-to-all bytes against the expert weight bytes one
                     device reads as the tokens per device grow, and their times

Every claim in a title is computed here from the JSON (where TP stops paying, the all-to-all's
share of the expert bytes and where its time passes the expert reads). Imports matplotlib and
microbench.plots only (no JAX): `python -m microbench.plots.parallel parallel.json [out_dir]`.
"""

from __future__ import annotations

import sys
from pathlib import Path

from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import Patch
from matplotlib.ticker import FixedFormatter, FixedLocator, NullFormatter

from microbench.plots.common import PALETTE, check_kind, num, redraw_main, save, styled

FILES = ("parallel_tp.png", "parallel_ep.png")
COMMAND = "python -m microbench parallel"
PARTS = {"weights": ("weight reads", PALETTE[0]), "kv": ("KV reads", PALETTE[1]),
         "act": ("activations", PALETTE[7]), "compute_excess": ("compute beyond memory",
                                                                 PALETTE[2]),
         "comm": ("all-reduce / all-gather", PALETTE[3])}
HATCHES = ("", "////", "..")
SMALL = {"fontsize": 9, "color": "0.25"}


def _ms(seconds: float) -> float:
    return seconds * 1e3


def _short(link: str) -> str:
    return link.split(" x16")[0]


def stop_text(series: dict) -> str:
    """'TP 4 (to 8: 1.24x)' / 'TP 8 (every doubling >= 1.5x)', from the derived numbers."""
    after, steps = series["stops_paying_after"], series["doublings"]
    if after is None:
        return f"TP {series['rows'][-1]['tp']} (every doubling >= {num(series['threshold'])}x)"
    step = next(s for s in steps if s["from"] == after)
    return f"TP {after} (to {step['to']}: {num(step['speedup'])}x)"


def tp_claim(tp: dict) -> str:
    """What every series shows as TP grows, checked on the data."""
    falls = all(b["time"]["total"] < a["time"]["total"]
                for s in tp["series"] for a, b in zip(s["rows"], s["rows"][1:], strict=False))
    rises = all(b["chip_s_per_token"] >= a["chip_s_per_token"]
                for s in tp["series"] for a, b in zip(s["rows"], s["rows"][1:], strict=False))
    return ("time per step falls" if falls else "time per step does not always fall") + \
        (", chip-time per token rises" if rises else ", chip-time per token does not always rise")


def _series(result: dict, model: str, batch: int) -> list[dict]:
    return [s for s in result["tp"]["series"] if s["model"] == model and s["batch"] == batch]


# ------------------------------------------------------------------ tensor parallel

def _bars(ax, series: list[dict]) -> None:
    width = 0.8 / len(series)
    for j, s in enumerate(series):
        for i, row in enumerate(s["rows"]):
            x = i + (j - (len(series) - 1) / 2) * width
            bottom = 0.0
            alpha = 1.0 if row["fits"] else 0.35
            for part, (_, color) in PARTS.items():
                h = _ms(row["parts"][part])
                ax.bar(x, h, width * 0.95, bottom=bottom, color=color, alpha=alpha,
                       hatch=HATCHES[j], edgecolor="white" if j else color, linewidth=0)
                bottom += h
            t = row["time"]
            if t["compute"] < t["memory"]:  # where compute time sits under the memory time
                ax.hlines(_ms(t["compute"]), x - width * 0.45, x + width * 0.45,
                          color="black", linewidth=1.5)
    rows = series[0]["rows"]
    ax.set_xticks(range(len(rows)), [f"TP {r['tp']}" for r in rows])
    ax.set_ylabel("ms per decode step")
    ax.grid(axis="x", visible=False)
    top = max(_ms(r["time"]["total"]) for s in series for r in s["rows"])
    ax.set_ylim(0, top * 1.32)
    lines = [f"TP pays (>= {num(series[0]['threshold'])}x per doubling) up to:"]
    lines += [f"  {_short(s['link'])}: {stop_text(s)}" for s in series]
    ax.text(0.98, 0.97, "\n".join(lines), transform=ax.transAxes, ha="right", va="top",
            fontsize=9.5, bbox={"facecolor": "white", "edgecolor": "0.8", "alpha": 0.9})


def _chip_seconds(ax, series: list[dict]) -> None:
    for j, s in enumerate(series):
        ys = [_ms(r["chip_s_per_token"]) for r in s["rows"]]
        ax.plot(range(len(ys)), ys, marker="os"[j % 2], color="0.2" if j == 0 else "0.55",
                linestyle="-" if j == 0 else "--", label=_short(s["link"]))
    rows = series[0]["rows"]
    ax.set_xticks(range(len(rows)), [f"TP {r['tp']}" for r in rows])
    ax.set_xlim(-0.5, len(rows) - 0.5)
    ax.set_ylim(0, 1.2 * max(_ms(r["chip_s_per_token"]) for s in series for r in s["rows"]))
    ax.set_ylabel("chip-ms / token", fontsize=11)


@styled
def tp_figure(result: dict) -> Figure:
    tp, setup = result["tp"], result["setup"]
    models = list(dict.fromkeys(s["model"] for s in tp["series"]))
    batches = list(dict.fromkeys(s["batch"] for s in tp["series"]))
    fig = Figure(figsize=(5.6 * len(models), 5.2 * len(batches) + 1.6), layout="constrained")
    grid = fig.add_gridspec(2 * len(batches), len(models),
                            height_ratios=[3, 1.25] * len(batches))
    for c, model in enumerate(models):
        for r, batch in enumerate(batches):
            series = _series(result, model, batch)
            ax = fig.add_subplot(grid[2 * r, c])
            _bars(ax, series)
            dtype = series[0]["rows"][0]["assumptions"]["dtypes"]["weight"]
            ax.set_title(f"{model} ({dtype}), batch {batch}")
            low = fig.add_subplot(grid[2 * r + 1, c], sharex=ax)
            _chip_seconds(low, series)
            if c == 0 and r == 0:
                low.legend(fontsize=9, loc="upper left")
    memory = tp["series"][0]["rows"][0]["assumptions"]["memory_bytes"]
    use = result["assumptions"]["fits"]
    handles = [Patch(color=color, label=label) for label, color in PARTS.values()]
    handles += [Patch(facecolor="0.6", label=f"solid: {tp['links'][0]}")]
    handles += [Patch(facecolor="0.6", hatch=HATCHES[j], edgecolor="white",
                      label=f"hatched: {name}")
                for j, name in enumerate(tp["links"]) if j]
    handles += [Line2D([], [], color="black", linewidth=1.5, label="compute time (under memory)"),
                Patch(color=PALETTE[0], alpha=0.35,
                      label=f"faded: weights + KV over {use.split('<= ')[1].split(' x')[0]} "
                            f"x {num(memory / 1e9)} GB")]
    fig.legend(handles=handles, loc="outside lower center", ncol=5, fontsize=10)
    fig.suptitle(f"On paper: decode per device vs tensor-parallel degree on {tp['device']}, "
                 f"context {setup['context']}: {tp_claim(tp)}\n"
                 f"{result['assumptions']['bound']}. {tp['note']}", fontsize=13)
    return fig


# ------------------------------------------------------------------ expert parallel

def _ep_rows(ep: dict, degree: int) -> list[dict]:
    return [r for r in ep["rows"] if r["ep"] == degree]


def _degrees_text(degrees: list[int]) -> str:
    return f"EP {degrees[0]}" if len(degrees) == 1 else f"EP {degrees[0]}-{degrees[-1]}"


def _percent(values: list[float]) -> str:
    """[0.0006, 0.0015] -> '0.06-0.15%'; one value (or equal ones) -> '95%'."""
    lo, hi = num(100 * min(values), 2), num(100 * max(values), 2)
    return f"{lo}%" if lo == hi else f"{lo}-{hi}%"


def ep_claims(ep: dict) -> tuple[str, str]:
    """(bytes claim, time claim), computed from the per-degree summaries and the rows."""
    per = ep["per_degree"]
    lo = [p["bytes_ratio"][0] for p in per]
    hi = [p["bytes_ratio"][1] for p in per]
    n0 = ep["rows"][0]["tokens_per_device"]
    n1 = ep["rows"][-1]["tokens_per_device"]
    bytes_claim = (f"all-to-all / expert bytes: {_percent(lo)} at {n0} token/device, "
                   f"{_percent(hi)} at {n1}")
    lines = []
    for link in dict.fromkeys(p["link"] for p in per):
        mine = [p for p in per if p["link"] == link]
        degrees = [p["ep"] for p in mine]
        cross = [p["a2a_time_exceeds_expert_reads_from"] for p in mine]
        if all(c is None for c in cross):
            what = "below the expert reads at every batch"
        elif all(c is not None for c in cross):
            what = (f"above the expert reads from {min(cross)}"
                    + (f"-{max(cross)}" if max(cross) != min(cross) else "") + " token/device")
        else:
            what = ", ".join(f"EP {p['ep']}: " + ("never above" if c is None else
                                                   f"above from {c}")
                             for p, c in zip(mine, cross, strict=True))
        first = [r for r in ep["rows"] if r["link"] == link and r["tokens_per_device"] == n0]
        share = [r["a2a"]["latency_s"] / r["a2a"]["s"] for r in first]
        lines.append(f"{_degrees_text(degrees)} ({link}): {what} ({_percent(share)} "
                     f"latency at {n0})")
    return bytes_claim, "\n".join(lines)


@styled
def ep_figure(result: dict) -> Figure:
    ep = result["ep"]
    fig = Figure(figsize=(16, 8.5), layout="constrained")
    left, right = fig.subplots(1, 2)
    degrees = [p["ep"] for p in ep["per_degree"]]
    for k, e in enumerate(degrees):
        rows = _ep_rows(ep, e)
        color = PALETTE[k % len(PALETTE)]
        xs = [r["tokens_per_device"] for r in rows]
        face = [color if r["fits"] else "white" for r in rows]
        for ax, ys, style in (
                (left, [r["experts"]["read"] for r in rows], "-"),
                (left, [r["a2a"]["wire_bytes"] for r in rows], "--"),
                (right, [_ms(r["experts"]["s"]) for r in rows], "-"),
                (right, [_ms(r["a2a"]["s"]) for r in rows], "--"),
                (right, [_ms(r["a2a"]["bandwidth_s"]) for r in rows], ":")):
            ax.plot(xs, ys, color=color, linestyle=style)
            ax.scatter(xs, ys, color=color, facecolors=face, zorder=3, s=28)
    for ax in (left, right):
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ticks = sorted({r["tokens_per_device"] for r in ep["rows"]})
        ax.xaxis.set_major_locator(FixedLocator(ticks))
        ax.xaxis.set_major_formatter(FixedFormatter([str(t) for t in ticks]))
        ax.xaxis.set_minor_formatter(NullFormatter())
        ax.set_xlabel("decode tokens per device (batch / EP)")
    left.set_ylabel("bytes per device per decode step")
    right.set_ylabel("ms per decode step (expert reads at HBM\nbandwidth, all-to-all on the link)")
    bytes_claim, time_claim = ep_claims(ep)
    left.set_title("Bytes: expert weights read vs all-to-all sent\n" + bytes_claim,
                   fontsize=11)
    right.set_title(time_claim, fontsize=10)
    link_of = {p["ep"]: p["link"] for p in ep["per_degree"]}
    handles = [Line2D([], [], color=PALETTE[k % len(PALETTE)], marker="o",
                      label=f"EP {e} ({link_of[e]})") for k, e in enumerate(degrees)]
    handles += [Line2D([], [], color="0.3", linestyle="-", label="expert weights read"),
                Line2D([], [], color="0.3", linestyle="--", label="all-to-all (dispatch + "
                       "combine)"),
                Line2D([], [], color="0.3", linestyle=":", label="all-to-all without "
                       "latency (right)"),
                Line2D([], [], color="0.3", marker="o", markerfacecolor="white",
                       linestyle="", label="hollow: does not fit")]
    fig.legend(handles=handles, loc="outside lower center", ncol=5, fontsize=10)
    a = ep["rows"][0]["assumptions"]
    fig.suptitle(f"On paper: {ep['model']} decode ({ep['weight_dtype']} weights, "
                 f"{a['dtypes']['act']} "
                 f"activations, context {a['context']}) on {ep['device']}, experts split over "
                 f"EP devices, attention data-parallel\n{ep['link_rule']}\n"
                 f"{result['assumptions']['bound']}", fontsize=12)
    return fig


def draw_parallel(result: dict, out_dir: str | Path) -> list[Path]:
    """Write parallel_tp.png and parallel_ep.png into out_dir; return their paths."""
    check_kind(result, "parallel", required=True)
    out = Path(out_dir)
    return [save(tp_figure(result), out / FILES[0]), save(ep_figure(result), out / FILES[1])]


# ------------------------------------------------------------------ the summary

def parallel_summary(result: dict) -> str:
    tp, ep = result["tp"], result["ep"]
    degrees = sorted({r["tp"] for s in tp["series"] for r in s["rows"]})
    lines = [f"# Tensor and expert parallelism on paper ({COMMAND})", "",
             f"Decode, context {result['setup']['context']}; {result['assumptions']['bound']}; "
             f"count = {result['assumptions']['count']}. {tp['note']}.", "",
             f"## Tensor parallel on {tp['device']}: ms per step (chip-ms per token)", "",
             "| model | batch | link | " + " | ".join(f"TP {d}" for d in degrees)
             + " | TP pays (>= " + num(result["setup"]["threshold"])
             + "x per doubling) up to | comm > weight time saved at | fits from |",
             "|---|---:|---|" + "---:|" * len(degrees) + "---|---|---|"]
    for s in tp["series"]:
        cells = {r["tp"]: f"{num(_ms(r['time']['total']))} ({num(_ms(r['chip_s_per_token']))})"
                 for r in s["rows"]}
        exceeds = s["comm_exceeds_weights_saved_at"]
        fit = s["smallest_fitting_tp"]
        lines.append(f"| {s['model']} | {s['batch']} | {s['link']} | "
                     + " | ".join(cells.get(d, "-") for d in degrees)
                     + f" | {stop_text(s)} | {'TP ' + str(exceeds) if exceeds else 'never'} | "
                     + f"{'TP ' + str(fit) if fit else 'no degree'} |")
    bytes_claim, time_claim = ep_claims(ep)
    lines += ["", f"## Expert parallel: {ep['model']} ({ep['weight_dtype']}) on {ep['device']}",
              "", f"{ep['link_rule']}.", "", f"- {bytes_claim[0].upper()}{bytes_claim[1:]}.",
              *(f"- All-to-all time, {line}." for line in time_claim.split("\n")), "",
              "| EP | link | tokens/device | expert GB read | all-to-all MB | ratio | "
              "expert ms | all-to-all ms (latency) | fits |",
              "|---:|---|---:|---:|---:|---:|---:|---:|---|"]
    for r in ep["rows"]:
        lines.append(f"| {r['ep']} | {r['link']} | {r['tokens_per_device']} | "
                     f"{num(r['experts']['read'] / 1e9)} | {num(r['a2a']['wire_bytes'] / 1e6)} | "
                     f"{num(100 * r['a2a_over_expert_bytes'], 2)}% | "
                     f"{num(_ms(r['experts']['s']))} | {num(_ms(r['a2a']['s']))} "
                     f"({num(_ms(r['a2a']['latency_s']))}) | {'yes' if r['fits'] else 'no'} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    return redraw_main(argv, "parallel", draw_parallel, parallel_summary)


if __name__ == "__main__":
    sys.exit(main())
