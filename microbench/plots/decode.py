"""The decode race's figure (microbench.studies.decode): step time per batch beside its roof,
and the batch-1 ratios round by round.

Left: our decode step per batch, XLA's products and the native kernel's (median over rounds,
bars from the fastest to the slowest round), the roof time of the same step (the slower of
bytes / C read and FLOPs / GEMM, per round), and the peers at batch 1. Right: each round's
batch-1 ratios (speed over llama.cpp, bytes/s over the C read of the same round) with the
targets: the drift of the machine is the spread of these lines, not hidden in a median.
"""

from __future__ import annotations

from pathlib import Path

from matplotlib.figure import Figure

from microbench.plots.common import PALETTE, made_by, save, styled
from microbench.plots.serving import machine_name

FILE = "decode.png"
COLORS = {"xla": PALETTE[0], "output-major": PALETTE[5], "native": PALETTE[1],
          "native-int8": PALETTE[3],
          "llama.cpp": PALETTE[2], "transformers": PALETTE[4], "roof": "0.3"}
NAMES = {"xla": "ours: XLA, weights [K, N] as written",
         "output-major": "ours: XLA, weights stored [N, K]",
         "native": "ours: native kernel, weights stored in its panels",
         "native-int8": "ours: native kernel, the weights in int8"}
SHORT = {"xla": "XLA [K, N]", "output-major": "XLA [N, K]", "native": "native kernel",
         "native-int8": "native int8"}


def _row(result: dict, program: str, batch: int) -> dict | None:
    return next((r for r in result["table"] if r["program"] == program and r["batch"] == batch),
                None)


def title(result: dict) -> str:
    """What batch 1 reached (share of the C read, speed over llama.cpp when it ran) and what
    the largest batch reached (share of its roof), per program, from the table."""
    parts, big = [], []
    batches = result["setup"]["batches"]
    for program in result["programs"]:
        row = _row(result, program, 1)
        if row is not None and row["over_read"] is not None:
            text = f"{SHORT[program]} {row['over_read']:.2f} of the C read"
            if row.get("over_llama.cpp") is not None:
                text += f", {row['over_llama.cpp']:.2f}x llama.cpp"
            parts.append(text)
        last = _row(result, program, max(batches))
        if max(batches) > 1 and last is not None and last["roof_fraction"] is not None:
            big.append(f"{SHORT[program]} {last['roof_fraction']:.2f}")
    dtype = "float32" + (", one program int8" if "native-int8" in result["programs"] else "")
    lines = [f"Decode race, {result['model']} {dtype}, context {result['setup']['context']}, "
             f"{len(result['rounds'])} interleaved rounds"]
    if parts:  # two programs per line: four do not fit the figure's width
        lines.append("batch 1 (median of per-round ratios): " + "; ".join(parts[:2]))
        lines += ["; ".join(parts[i:i + 2]) for i in range(2, len(parts), 2)]
    if big:
        lines.append(f"batch {max(batches)}, share of its roof: " + "; ".join(big))
    return "\n".join(lines)


@styled
def decode_figure(result: dict):
    fig = Figure(figsize=(13.0, 6.0), layout="constrained")
    left, right = fig.subplots(1, 2)
    _step_times_panel(left, result)
    _rounds_panel(right, result)
    fig.suptitle(title(result), fontsize=10)
    fig.supxlabel(f"{made_by(result.get('environment'))}; roofs: memory "
                  f"{result['read_program']}, compute {result['gemm_program']}",
                  fontsize=8.5, color="0.3")
    return fig


def _step_times_panel(ax, result: dict) -> None:
    """Each program's step time per batch (bars: fastest to slowest round), the roofs of the
    float32 (and int8) step, and the peers at batch 1."""
    batches = result["setup"]["batches"]
    for program in result["programs"]:
        rows = [_row(result, program, b) for b in batches]
        ms = [1e3 * r["step_s"] for r in rows]
        lo, hi = [], []
        for b, m in zip(batches, ms, strict=True):
            pts = [1e3 * p["step_s"] for r in result["rounds"] for p in r["points"]
                   if p["program"] == program and p["batch"] == b]
            lo.append(m - min(pts))
            hi.append(max(pts) - m)
        ax.errorbar(batches, ms, yerr=[lo, hi], marker="o", capsize=3,
                    color=COLORS[program], label=NAMES[program])
    roof = [1e3 * _row(result, result["programs"][0], b)["roof_s"] for b in batches]
    ax.plot(batches, roof, ls="--", color=COLORS["roof"],
            label="roof of the float32 step: max(bytes / C read, FLOPs / GEMM), counted")
    if "native-int8" in result["programs"]:  # a quarter of the weight bytes: its own roof
        roof8 = [1e3 * _row(result, "native-int8", b)["roof_s"] for b in batches]
        ax.plot(batches, roof8, ls="--", color=COLORS["native-int8"], alpha=0.6,
                label="roof of the int8 step")
    for name, p in result["peer_table"].items():
        ax.plot([1], [1e3 * p["step_s"]], marker="D", ls="none", ms=9,
                color=COLORS.get(name, "k"), label=f"{name} (batch 1)")
    ax.set_xscale("log", base=2)
    ax.set_xticks(batches, [str(b) for b in batches])
    ax.set_xlabel("batch (sequences decoded together)")
    ax.set_ylabel("decode step time (ms)")
    ax.set_ylim(0, 1.5 * ax.get_ylim()[1])  # headroom: the legend sits above the lines
    ax.legend(fontsize=8, loc="upper left")
    ax.set_title("step time per batch (bars: fastest to slowest round)", fontsize=10)


def _rounds_panel(ax, result: dict) -> None:
    """Each round's batch-1 ratios (bytes/s over the C read, speed over llama.cpp) beside
    their targets."""
    batches = result["setup"]["batches"]
    rounds = [r["round"] + 1 for r in result["rounds"]]
    t = result["targets"]
    for program in result["programs"]:
        pts = [next(p for p in r["points"] if p["program"] == program and p["batch"] == 1)
               for r in result["rounds"]] if 1 in batches else []
        if not pts:
            continue
        ax.plot(rounds, [p["over_read"] for p in pts], marker="o", color=COLORS[program])
        if all("llama.cpp" in p["speed_over"] for p in pts):
            ax.plot(rounds, [p["speed_over"]["llama.cpp"] for p in pts], marker="s",
                    ls=":", color=COLORS[program])
    # colors are the programs, as in the left panel's legend; the styles are the ratios
    ax.plot([], [], marker="o", color="0.3", label="bytes/s over the C read (color: program)")
    ax.plot([], [], marker="s", ls=":", color="0.3", label="speed over llama.cpp")
    ax.axhline(t["vs_read"], color="0.5", lw=0.8, ls="--",
               label=f"target: {t['vs_read']} of the C read")
    ax.axhline(t["vs_llamacpp"], color="0.5", lw=0.8, ls=":",
               label=f"target: {t['vs_llamacpp']}x llama.cpp")
    ax.set_xticks(rounds)
    ax.set_xlabel("round")
    ax.set_ylabel("ratio, batch 1 (same round)")
    ax.set_ylim(0, 1.08 * ax.get_ylim()[1])  # the targets' lines clear of the frame
    ax.legend(fontsize=8, loc="lower left")
    ax.set_title("batch 1, round by round", fontsize=10)


def draw_decode(result: dict, out_dir: str | Path) -> list[Path]:
    """Write decode.png into out_dir; return its path in a list."""
    if not isinstance(result, dict) or "table" not in result:
        raise ValueError("not a decode-race result: expected a dict with a 'table'")
    return [save(decode_figure(result), Path(out_dir) / FILE)]


def _fmt(x, spec=".2f") -> str:
    return "-" if x is None else format(x, spec)


def _times(x) -> str:
    return "-" if x is None else f"{x:.2f}x"


def decode_summary(result: dict) -> str:
    """The race as a markdown table, with the machine's drift and the targets."""
    s, env = result["setup"], result.get("environment") or {}
    lines = [f"# Decode race: {result['model']} ({result['params'] / 1e6:.0f}M parameters, "
             f"float32), context {s['context']}, {len(result['rounds'])} interleaved rounds",
             "", f"`python -m microbench decode` on {machine_name(env)}"
             f"{', ' + env['date_utc'] if env.get('date_utc') else ''}.", "",
             f"Memory roof: {result['read_program']}, median "
             f"{result['read']['median'] / 1e9:.1f} GB/s over rounds "
             f"(spread {_fmt(result['read']['spread'] and 100 * result['read']['spread'], '.0f')}"
             "%). Ratios are taken inside each round, then the median over rounds.", "",
             "| ours | batch | step ms | bound | of roof | bytes/s over C read | vs llama.cpp |"
             " vs transformers |", "|---|---|---|---|---|---|---|---|"]
    for row in result["table"]:
        lines.append(
            f"| {row['program']} | {row['batch']} | {_fmt(row['step_s'] and 1e3 * row['step_s'])}"
            f" | {row['bound']} | {_fmt(row['roof_fraction'])} | {_fmt(row['over_read'])} | "
            f"{_times(row.get('over_llama.cpp'))} | {_times(row.get('over_transformers'))} |")
    if result.get("products"):
        p0 = result["products"][0]
        lines += ["", f"The {p0['products']} weight products of a step alone, chained, per "
                  "number of rows (weights as written, [K, N], stored output-major, [N, K], or "
                  "in the native kernel's panels, float32 or int8):", "",
                  "| rows | form | GB | ms | bytes/s over C read |", "|---|---|---|---|---|"]
        lines += [f"| {p['rows']} | {p['form']} | {p['bytes'] / 1e9:.2f} | "
                  f"{_fmt(1e3 * p['seconds'])} | {_fmt(p['over_read'])} |"
                  for p in result["products"]]
    above = ([(f"{p['form']} at {p['rows']} rows", p["bytes"] / p["seconds"])
              for p in result.get("products", []) if (p["over_read"] or 0) > 1]
             + [(f"{r['program']} at batch {r['batch']}", None) for r in result["table"]
                if (r["over_read"] or 0) > 1])
    if above:
        reads = [x for r in result["rounds"] for x in r["read_bytes_per_s"]]
        beyond = [name for name, rate in above if rate and rate > max(reads)]
        lines.append(
            f"\nAbove the C read of their rounds (median > 1): "
            f"{'; '.join(n + (f' ({r / 1e9:.1f} GB/s)' if r else '') for n, r in above)}. "
            "Each round's roof is the faster of the reads before and after it, and the machine's "
            f"bandwidth moved within rounds (reads: {', '.join(f'{x / 1e9:.1f}' for x in reads)}"
            " GB/s): a program timed in a fast moment beats a read taken in a slow one. "
            + (f"Faster than every read of the run ({max(reads) / 1e9:.1f} GB/s): "
               f"{'; '.join(beyond)}; no read was taken in that moment, so this run cannot tell "
               "drift from a read peer slower than the memory." if beyond else
               f"None is faster than the fastest read of the run ({max(reads) / 1e9:.1f} GB/s)."))
    for name, p in result["peer_table"].items():
        lines.append(f"\n{name}: {_fmt(1e3 * p['step_s'])} ms per step at batch 1 (spread "
                     f"{_fmt(p['step_spread'] and 100 * p['step_spread'], '.0f')}% over rounds)")
    g = result.get("greedy_vs_llamacpp")
    if g:
        lines.append(f"\nGreedy tokens after a {g['prompt_len']}-token prompt: ours {g['ours']}, "
                     f"llama.cpp {g['llama.cpp']}: {'equal' if g['equal'] else 'DIFFERENT'}.")
    t = result["targets"]
    lines.append(f"\nTargets: batch 1 >= {t['vs_llamacpp']}x llama.cpp and >= "
                 f"{t['vs_read']} of the C read; batches 2-8 >= {t['small_batch_roof']} of "
                 "their roof.")
    for why in result["skipped"]:
        lines.append(f"- not run: {why}")
    return "\n".join(lines)
