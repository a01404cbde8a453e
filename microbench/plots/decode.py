"""The decode race's figure (microbench.studies.decode): step time per batch beside its roof,
step time against the bytes each format stores per weight, and the batch-1 ratios round by
round.

Left: our decode step per batch, XLA's products, the native kernel's and the quantized
programs' (median over rounds, bars from the fastest to the slowest round), the roof time of
the float32 step (the slower of bytes / C read and FLOPs / GEMM, per round), and the peers at
batch 1. Middle (a result with formats): the batch-1 step of every format, ours and
llama.cpp's, against the weight bytes it streams per weight of the step's matrices, beside the
read roof: time = weight bytes / the C read (the line; the band spans the rounds' reads).
Right: each round's batch-1 ratios (speed over the peer of the same format, weight bytes/s
over the C read of the same round) with the targets: the drift of the machine is the spread of
these lines, not hidden in a median.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
from matplotlib.figure import Figure

from microbench.plots.common import PALETTE, made_by, save, styled
from microbench.plots.serving import machine_name

FILE = "decode.png"
COLORS = {"xla": PALETTE[0], "output-major": PALETTE[5], "native": PALETTE[1],
          "native-int8": PALETTE[3], "w8a8": PALETTE[6], "w4a8": PALETTE[9],
          "llama.cpp": PALETTE[2], "llama.cpp Q8_0": PALETTE[8], "llama.cpp Q4_0": PALETTE[7],
          "llama.cpp Q4_K_M": "k", "transformers": PALETTE[4], "roof": "0.3"}
NAMES = {"xla": "ours: XLA, weights [K, N] as written",
         "output-major": "ours: XLA, weights stored [N, K]",
         "native": "ours: native kernel, weights stored in its panels",
         "native-int8": "ours: native kernel, int8 weights only (weight-only)",
         "w8a8": "ours: native kernel, int8 weights and activations",
         "w4a8": "ours: native kernel, int4 weights, int8 activations"}
PAIRED = ("w8a8", "w4a8")  # our quantized programs, each with a llama.cpp peer of its format
SHORT = {"xla": "XLA [K, N]", "output-major": "XLA [N, K]", "native": "native kernel",
         "native-int8": "native int8 weight-only", "w8a8": "w8a8", "w4a8": "w4a8"}


def _row(result: dict, program: str, batch: int) -> dict | None:
    return next((r for r in result["table"] if r["program"] == program and r["batch"] == batch),
                None)


def _name(result: dict, program: str) -> str:
    """The legend's name of one of our programs, saying when a quantized one ran on XLA."""
    if (result.get("backends") or {}).get(program, "native") != "native" and program in PAIRED:
        return NAMES[program].replace("native kernel", "XLA reference (slow)")
    return NAMES[program]


def title(result: dict) -> str:
    """What batch 1 reached (share of the C read, speed over llama.cpp when it ran) and what
    the largest batch reached (share of its roof), per program, from the table; with formats,
    ours over llama.cpp's same format per pair first."""
    parts, big = [], []
    batches = result["setup"]["batches"]
    formats = bool(result.get("formats"))
    for program in result["programs"]:
        row = _row(result, program, 1)
        if row is not None and row["over_read"] is not None:
            if formats:
                of_read = row.get("weights_over_read") or row["over_read"]
                parts.append(f"{SHORT[program]} {of_read:.2f}")
            else:
                text = f"{SHORT[program]} {row['over_read']:.2f} of the C read"
                if row.get("over_llama.cpp") is not None:
                    text += f", {row['over_llama.cpp']:.2f}x llama.cpp"
                parts.append(text)
        last = _row(result, program, max(batches))
        if max(batches) > 1 and last is not None and last["roof_fraction"] is not None:
            big.append(f"{SHORT[program]} {last['roof_fraction']:.2f}")
    if formats:
        lines = [f"Decode race, {result['model']} in float32 and quantized, context "
                 f"{result['setup']['context']}, {len(result['rounds'])} interleaved rounds"]
        pairs = [f"{r['pair']} {r['speed']:.2f}x" for r in result.get("pairs", [])
                 if r["target"] is not None]
        if pairs:
            lines.append("batch 1, ours over llama.cpp's same format (median of per-round "
                         "ratios): " + "; ".join(pairs))
        if parts:  # three programs per line: six do not fit the figure's width
            lines.append("batch 1, weight bytes/s over the C read: " + "; ".join(parts[:3]))
            lines += ["; ".join(parts[i:i + 3]) for i in range(3, len(parts), 3)]
    else:
        dtype = "float32" + (", one program int8" if "native-int8" in result["programs"] else "")
        lines = [f"Decode race, {result['model']} {dtype}, context "
                 f"{result['setup']['context']}, {len(result['rounds'])} interleaved rounds"]
        if parts:  # two programs per line: four do not fit the figure's width
            lines.append("batch 1 (median of per-round ratios): " + "; ".join(parts[:2]))
            lines += ["; ".join(parts[i:i + 2]) for i in range(2, len(parts), 2)]
    if big:
        lines.append(f"batch {max(batches)}, share of its roof: " + "; ".join(big))
    return "\n".join(lines)


@styled
def decode_figure(result: dict):
    formats = bool(result.get("formats"))
    fig = Figure(figsize=(19.0, 6.6) if formats else (13.0, 6.0), layout="constrained")
    axes = fig.subplots(1, 3 if formats else 2)
    _step_times_panel(axes[0], result)
    if formats:
        _bytes_panel(axes[1], result)
    _rounds_panel(axes[-1], result)
    fig.suptitle(title(result), fontsize=10)
    fig.supxlabel(f"{made_by(result.get('environment'))}; roofs: memory "
                  f"{result['read_program']}, compute {result['gemm_program']}",
                  fontsize=8.5, color="0.3")
    return fig


def _step_times_panel(ax, result: dict) -> None:
    """Each program's step time per batch (bars: fastest to slowest round), the roofs of the
    float32 (and int8) step, and the peers at batch 1 (with formats, the middle panel holds
    llama.cpp's)."""
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
                    color=COLORS[program], label=_name(result, program))
    roof = [1e3 * _row(result, result["programs"][0], b)["roof_s"] for b in batches]
    ax.plot(batches, roof, ls="--", color=COLORS["roof"],
            label="roof of the float32 step: max(bytes / C read, FLOPs / GEMM), counted")
    if "native-int8" in result["programs"]:  # a quarter of the weight bytes: its own roof
        roof8 = [1e3 * _row(result, "native-int8", b)["roof_s"] for b in batches]
        ax.plot(batches, roof8, ls="--", color=COLORS["native-int8"], alpha=0.6,
                label="roof of the int8 step")
    for name, p in result["peer_table"].items():
        if result.get("formats") and name in result["formats"]:
            continue  # llama.cpp's formats: the middle panel
        ax.plot([1], [1e3 * p["step_s"]], marker="D", ls="none", ms=9,
                color=COLORS.get(name, "k"), label=f"{name} (batch 1)")
    ax.set_xscale("log", base=2)
    ax.set_xticks(batches, [str(b) for b in batches])
    ax.set_xlabel("batch (sequences decoded together)")
    ax.set_ylabel("decode step time (ms)")
    ax.set_ylim(0, 1.5 * ax.get_ylim()[1])  # headroom: the legend sits above the lines
    ax.legend(fontsize=8, loc="upper left")
    ax.set_title("step time per batch (bars: fastest to slowest round)", fontsize=10)


def _batch1(result: dict, program: str, key: str = "points") -> list[dict]:
    return [p for r in result["rounds"] for p in r[key]
            if p["program"] == program and p.get("batch", 1) == 1]


def _bytes_panel(ax, result: dict) -> None:
    """Batch-1 step time of every format, ours and llama.cpp's, against the weight bytes it
    streams per weight of the step's matrices, beside the read roof (time = those bytes / the
    C read: the line at the rounds' median read, the band from the fastest to the slowest)."""
    formats = result["formats"]
    W = next(f["matrix_weights"] for f in formats.values() if f.get("matrix_weights"))
    xs_all = []
    for name, f in formats.items():
        ours = f["side"] == "ours"
        pts = _batch1(result, name, "points" if ours else "peers")
        if not pts:
            continue
        x = float(np.median([p["weight_bytes"] for p in pts])) / W
        ms = [1e3 * p["step_s"] for p in pts]
        m = float(np.median(ms))
        label = (f"ours: {SHORT[name]}" if ours else f"llama.cpp {f['format']}") + \
            f" ({f['matrix_bpw']:.2f} bits/weight)"
        marker = "D" if not ours else "s" if name == "native-int8" else "o"  # int8 twice
        ax.errorbar([x], [m], yerr=[[m - min(ms)], [max(ms) - m]], capsize=3, ls="none",
                    marker=marker, ms=8, color=COLORS.get(name, "k"), label=label)
        xs_all.append(x)
    reads = result["read"]["rounds"]
    xs = np.linspace(0, 1.1 * max(xs_all), 50)
    ax.plot(xs, 1e3 * xs * W / result["read"]["median"], color=COLORS["roof"], lw=1.2,
            label="read roof: weight bytes / C read (median of rounds)")
    ax.fill_between(xs, 1e3 * xs * W / max(reads), 1e3 * xs * W / min(reads),
                    color=COLORS["roof"], alpha=0.12, lw=0,
                    label="the same from the fastest to the slowest round's read")
    ax.set_xlim(0, xs[-1])
    ax.set_ylim(0, 1.45 * ax.get_ylim()[1])  # headroom: the legend sits above the points
    ax.set_xlabel("weight bytes streamed per step, per weight of its matrices "
                  f"({W / 1e6:.3g}M weights)")
    ax.set_ylabel("batch-1 decode step time (ms)")
    ax.legend(fontsize=8, loc="best")
    ax.set_title("batch 1: each format's step against its bytes per weight", fontsize=10)


def _rounds_panel(ax, result: dict) -> None:
    """Each round's batch-1 ratios (bytes/s over the C read, speed over the peer of the same
    format) beside their targets."""
    rounds = [r["round"] + 1 for r in result["rounds"]]
    t = result["targets"]
    formats = bool(result.get("formats"))
    key = "weights_over_read" if formats else "over_read"
    speed = {r["ours"]: r["rounds"] for r in result.get("pairs", []) if r["target"]}
    peers = False  # whether any speed over llama.cpp is drawn
    for program in result["programs"]:
        pts = _batch1(result, program)
        if len(pts) != len(rounds) or any(p.get(key) is None for p in pts):
            continue
        ax.plot(rounds, [p[key] for p in pts], marker="o", color=COLORS[program])
        if program in speed and len(speed[program]) == len(rounds):
            ax.plot(rounds, speed[program], marker="s", ls=":", color=COLORS[program])
            peers = True
        elif all("llama.cpp" in p["speed_over"] for p in pts):
            ax.plot(rounds, [p["speed_over"]["llama.cpp"] for p in pts], marker="s",
                    ls=":", color=COLORS[program])
            peers = True
    # colors are the programs, as in the left panel's legend; the styles are the ratios
    what = "weight bytes/s" if formats else "bytes/s"
    ax.plot([], [], marker="o", color="0.3", label=f"{what} over the C read (color: program)")
    if peers:
        ax.plot([], [], marker="s", ls=":", color="0.3",
                label="speed over llama.cpp" + ("'s same format" if formats else ""))
    ax.axhline(t["vs_read"], color="0.5", lw=0.8, ls="--",
               label=f"target: {t['vs_read']} of the C read" + (" (float32)" if formats else ""))
    if formats and "quant_vs_read" in t:
        ax.axhline(t["quant_vs_read"], color="0.5", lw=0.8, ls="-.",
                   label=f"target: {t['quant_vs_read']} of the C read (quantized)")
    if peers:
        ax.axhline(t["vs_llamacpp"], color="0.5", lw=0.8, ls=":",
                   label=f"target: {t['vs_llamacpp']}x llama.cpp")
    ax.set_xticks(rounds)
    ax.set_xlabel("round")
    ax.set_ylabel("ratio, batch 1 (same round)")
    ax.set_ylim(0, 1.08 * ax.get_ylim()[1])  # the targets' lines clear of the frame
    ax.legend(fontsize=8, loc="best")
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


def _dispatch_text(result: dict) -> str:
    mode = result.get("dispatch")
    if mode is None:
        return ""
    if mode == "inline":
        return (" Our jitted calls run inline on the calling thread (JAX's CPU async dispatch "
                "off), as llama.cpp's step runs.")
    return f" Our jitted calls: {mode}."


def decode_summary(result: dict) -> str:
    """The race as markdown tables: every program per batch, every pair of formats with its
    rounds, bits per weight and share of the read, then the formats, the products alone, the
    peers, greedy agreement, quality, the prefill race, the public step and the targets."""
    s, env = result["setup"], result.get("environment") or {}
    formats = bool(result.get("formats"))  # a result with quantized programs and their peers
    kind = "float32 and quantized" if formats else "float32"
    lines = [f"# Decode race: {result['model']} ({result['params'] / 1e6:.0f}M parameters, "
             f"{kind}), context {s['context']}, {len(result['rounds'])} interleaved rounds",
             "", f"`python -m microbench decode` on {machine_name(env)}"
             f"{', ' + env['date_utc'] if env.get('date_utc') else ''}.", "",
             f"Memory roof: {result['read_program']}, median "
             f"{result['read']['median'] / 1e9:.1f} GB/s over rounds "
             f"(spread {_fmt(result['read']['spread'] and 100 * result['read']['spread'], '.0f')}"
             "%). Ratios are taken inside each round, then the median over rounds."
             + _dispatch_text(result), "",
             "| ours | batch | step ms | bound | of roof | bytes/s over C read | vs llama.cpp |"
             " vs transformers |" + (" weight bytes/s over C read |" if formats else ""),
             "|---" * (8 + formats) + "|"]
    for row in result["table"]:
        lines.append(
            f"| {row['program']} | {row['batch']} | {_fmt(row['step_s'] and 1e3 * row['step_s'])}"
            f" | {row['bound']} | {_fmt(row['roof_fraction'])} | {_fmt(row['over_read'])} | "
            f"{_times(row.get('over_llama.cpp'))} | {_times(row.get('over_transformers'))} |"
            + (f" {_fmt(row.get('weights_over_read'))} |" if formats else ""))
    for section in (_pairs_lines, _formats_lines, _products_lines, _above_lines, _peer_lines,
                    _greedy_lines, _quality_lines, _prefill_lines, _public_lines):
        lines += section(result)
    lines.append(f"\nTargets: {_targets_text(result['targets'])}.")
    for why in result["skipped"]:
        lines.append(f"- not run: {why}")
    return "\n".join(lines)


def _targets_text(t: dict) -> str:
    text = (f"batch 1 >= {t['vs_llamacpp']}x llama.cpp and >= {t['vs_read']} of the C read; "
            f"batches 2-8 >= {t['small_batch_roof']} of their roof")
    if "int8_vs_q8_0" in t:
        text += (f"; w8a8 >= {t['int8_vs_q8_0']}x Q8_0 and w4a8 >= {t['int4_vs_q4_0']}x Q4_0, "
                 f"each streaming its weights at >= {t['quant_vs_read']} of the C read; a w8a8 "
                 f"prefill >= {t['w8a8_prefill']}x the float32 one (where the CPU has an int8 "
                 "dot-product instruction)")
    return text


def _bpw(result: dict, name: str) -> str:
    f = (result.get("formats") or {}).get(name)
    return "-" if f is None else f"{f['matrix_bpw']:.2f}"


def _pairs_lines(result: dict) -> list[str]:
    if not result.get("pairs"):
        return []
    out = ["", "Batch 1, ours against llama.cpp's file of the same weights (speed: llama.cpp's "
           "step time over ours, per round, then the median; bits per weight over the step's "
           "matrices; weight bytes/s over the round's C read):", "",
           "| pair | speed | per round | bits/weight ours | theirs | ours of read | "
           "theirs of read | target |", "|---|---|---|---|---|---|---|---|"]
    t = result["targets"]
    for r in result["pairs"]:
        target = (f"{t[r['target']]}x" if r["target"] else "none (not the same format)")
        out.append(f"| {r['pair']} | {_times(r['speed'])} | "
                   f"{', '.join(f'{x:.2f}' for x in r['rounds'])} | {_bpw(result, r['ours'])} | "
                   f"{_bpw(result, r['theirs'])} | {_fmt(r['ours_of_read'])} | "
                   f"{_fmt(r['theirs_of_read'])} | {target} |")
    return out


def _formats_lines(result: dict) -> list[str]:
    formats = result.get("formats")
    if not formats:
        return []
    out = ["", "What each format stores (bits per weight over the step's matrices, counted by "
           "refmodel.counting for ours and read from the GGUF as llama.cpp wrote it; and over "
           "everything stored, the embedding included: ours every parameter's bytes, "
           "llama.cpp's the file's bytes over its tensors' elements):", "",
           "| program | format | backend | bits/weight, matrices | bits/weight, all stored | "
           "tensor types |", "|---|---|---|---|---|---|"]
    for name, f in formats.items():
        stored = f.get("stored_bpw", f.get("file_bpw"))
        types = ", ".join(f"{k} {v}" for k, v in (f.get("types") or {}).items()) or "-"
        out.append(f"| {name} | {f['format']} | {f.get('backend', 'llama.cpp')} | "
                   f"{f['matrix_bpw']:.2f} | {_fmt(stored)} | {types} |")
    return out


def _products_lines(result: dict) -> list[str]:
    if not result.get("products"):
        return []
    p0 = result["products"][0]
    return ["", f"The {p0['products']} weight products of a step alone, chained, per number of "
            "rows (weights as written, [K, N], stored output-major, [N, K], or in the native "
            "kernel's panels, float32 or int8; `native w8a8` / `native w4a8`: the integer dot "
            "kernel, int8 or int4 weights with the rows rounded to int8): set against the "
            "step's time, what a step spends outside its weight products:", "",
            "| rows | form | GB | ms | bytes/s over C read |", "|---|---|---|---|---|"] + [
        f"| {p['rows']} | {p['form']} | {p['bytes'] / 1e9:.2f} | {_fmt(1e3 * p['seconds'])} | "
        f"{_fmt(p['over_read'])} |" for p in result["products"]]


def _above_lines(result: dict) -> list[str]:
    above = ([(f"{p['form']} at {p['rows']} rows", p["bytes"] / p["seconds"])
              for p in result.get("products", []) if (p["over_read"] or 0) > 1]
             + [(f"{r['program']} at batch {r['batch']}", None) for r in result["table"]
                if (r["over_read"] or 0) > 1])
    if not above:
        return []
    reads = [x for r in result["rounds"] for x in r["read_bytes_per_s"]]
    beyond = [name for name, rate in above if rate and rate > max(reads)]
    return [
        f"\nAbove the C read of their rounds (median > 1): "
        f"{'; '.join(n + (f' ({r / 1e9:.1f} GB/s)' if r else '') for n, r in above)}. "
        "Each round's roof is the faster of the reads before and after it, and the machine's "
        f"bandwidth moved within rounds (reads: {', '.join(f'{x / 1e9:.1f}' for x in reads)}"
        " GB/s): a program timed in a fast moment beats a read taken in a slow one. "
        + (f"Faster than every read of the run ({max(reads) / 1e9:.1f} GB/s): "
           f"{'; '.join(beyond)}; no read was taken in that moment, so this run cannot tell "
           "drift from a read peer slower than the memory." if beyond else
           f"None is faster than the fastest read of the run ({max(reads) / 1e9:.1f} GB/s).")]


def _peer_lines(result: dict) -> list[str]:
    out = []
    for name, p in result["peer_table"].items():
        share = p.get("weights_over_read")
        out.append(f"\n{name}: {_fmt(1e3 * p['step_s'])} ms per step at batch 1 (spread "
                   f"{_fmt(p['step_spread'] and 100 * p['step_spread'], '.0f')}% over rounds)"
                   + (f", its weights streamed at {share:.2f} of the C read" if share else ""))
    return out


def _greedy_lines(result: dict) -> list[str]:
    g = result.get("greedy_vs_llamacpp")  # a result from before the formats
    if g:
        return [f"\nGreedy tokens after a {g['prompt_len']}-token prompt: ours {g['ours']}, "
                f"llama.cpp {g['llama.cpp']}: {'equal' if g['equal'] else 'DIFFERENT'}."]
    if not result.get("greedy"):
        return []
    n = len(result["greedy"][0]["ours"])
    return ["", f"Greedy tokens of the race's model (random weights: nearly flat logits, so "
            f"rounding flips close calls) after one {result['greedy'][0]['prompt_len']}-token "
            f"prompt, the first {n} of each side:", "",
            *_agreement_table(result["greedy"])]


def _agreement_table(rows: list[dict]) -> list[str]:
    def first(g):
        d = g["first_difference"]
        return "none" if d is None else f"token {d + 1}"

    if any(g.get("step_agreement") is not None for g in rows):
        return ["| pair | agreement | first difference | step agreement |", "|---|---|---|---|"] + [
            f"| {g['pair']} | {g['agreement']:.2f} | {first(g)} | "
            f"{_fmt(g.get('step_agreement'))} |" for g in rows]
    return ["| pair | agreement | first difference |", "|---|---|---|"] + [
        f"| {g['pair']} | {g['agreement']:.2f} | {first(g)} |" for g in rows]


def _quality_lines(result: dict) -> list[str]:
    q = result.get("quality")
    if not q:
        return []
    out = ["", f"Quality on held-out text: the trained `{q['recipe']}` model ({q['preset']}), "
           f"{q['windows']} validation windows of {q['length']} tokens ({q['positions']} "
           "positions); KL divergence of the next-token distribution from our float32 model "
           "(nats, mean and largest over positions) and how often its top token is float32's:",
           "", "| side | program | bits/weight | KL mean | KL max | top-1 as float32 |",
           "|---|---|---|---|---|---|"]
    out += [f"| {r['side']} | {r['program']} | {r['matrix_bpw']:.2f} | {r['kl_mean']:.2e} | "
            f"{r['kl_max']:.2e} | {r['top1_agreement']:.3f} |" for r in q["rows"]]
    if q.get("llamacpp"):
        out.append(f"\nllama.cpp's side not measured: {q['llamacpp']}.")
    if q.get("greedy"):
        out += ["", f"Greedy tokens of the trained model after a {q['greedy_prompt_len']}-token "
                f"held-out prompt, the first {len(q['greedy'][0]['ours'])} of each side (step "
                "agreement: at each of our greedy steps, llama.cpp fed the same text picks the "
                "same token):", "", *_agreement_table(q["greedy"])]
    return out


def _prefill_lines(result: dict) -> list[str]:
    p = result.get("prefill")
    if not p or (not result.get("formats") and "speedup" not in p):
        return []  # a result from before the prefill race
    if "speedup" not in p:
        return [f"\nW8A8 prefill: {p['skipped']}."]
    return [f"\nW8A8 prefill of {p['tokens']} tokens (batch 1): w8a8 "
            f"{1e3 * p['w8a8_s']:.1f} ms, float32 {1e3 * p['native_s']:.1f} ms: "
            f"{_times(p['speedup'])} (per round {', '.join(f'{x:.2f}' for x in p['rounds'])})."]


def _public_lines(result: dict) -> list[str]:
    runs = result.get("public_step")
    if not runs:
        return []
    runs = [runs] if isinstance(runs, dict) else runs  # one model in an older result
    lines = ["\nThe public `refmodel.decode_step` beside the raw jitted step it runs (batch 1, "
             "medians over interleaved rounds; the host's own part: the call's time to return, "
             "public less raw):"]
    for p in runs:
        per_round = ", ".join(f"{1e3 * r['public_s']:.3f}/{1e3 * r['raw_s']:.3f}"
                              for r in p["rounds"])
        host = (f"; per call on the host {1e3 * p['call_overhead_s']:.3f} ms"
                if "call_overhead_s" in p else "")
        lines.append(f"- {p['model']} (context {p['context']}): {1e3 * p['public_s']:.3f} ms "
                     f"per step beside {1e3 * p['raw_s']:.3f} ms, the median of the per-round "
                     f"differences {1e3 * p['overhead_s']:.3f} ms{host} (public/raw ms per "
                     f"round: {per_round})")
    return lines
