"""The speculative-decoding figure and summary, drawn only from a saved speculative result
(speculative.json, `python -m microbench speculative`): acceptance vs k, measured speedup beside
the two predictions, the verify pass on the roofline, and the verify/decode cost ratio as the
batch grows.

Every title states numbers computed here from the JSON (the best measured speedup, the intensity
shift, where the predicted speedup falls below 1); nothing in a title is assumed. Imports
matplotlib, numpy and microbench.plots only (no JAX): `python -m microbench.plots.speculative
speculative.json [out_dir]` redraws a saved result.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
from matplotlib.lines import Line2D
from matplotlib.ticker import FixedLocator, FuncFormatter, NullFormatter

from microbench.plots.common import (
    PALETTE,
    check_kind,
    fmt_si,
    made_by,
    md_table,
    new_figure,
    num,
    redraw_main,
    save,
    styled,
    times,
    wall_time,
)
from microbench.plots.serving import _note, machine_name

FILE = "speculative.png"
DRAFTER_NAMES = {"draft": "draft model", "lookup": "prompt lookup", "none": "plain decode"}
DRAFTER_COLORS = {"draft": PALETTE[0], "lookup": PALETTE[1]}
MARKERS = {"draft": "o", "lookup": "s"}
SMALL = {"fontsize": 9, "color": "0.3"}


# ------------------------------------------------------------------ formatting

def _ms(seconds) -> str:
    return "n/a" if seconds is None else f"{num(seconds * 1e3)} ms"


def _name(drafter: str) -> str:
    return DRAFTER_NAMES.get(drafter, drafter)


def _color(drafter: str, i: int = 0):
    return DRAFTER_COLORS.get(drafter, PALETTE[(i + 2) % len(PALETTE)])


def _drafters(result: dict) -> list[str]:
    """The drafters with k >= 1 runs, in their order of appearance."""
    out: list[str] = []
    for r in result.get("runs") or []:
        if r.get("k") and r["drafter"] not in out:
            out.append(r["drafter"])
    return out


def _rows(result: dict, drafter: str) -> list[dict]:
    return sorted((r for r in result.get("runs") or [] if r["drafter"] == drafter and r.get("k")),
                  key=lambda r: r["k"])


def _model(m: dict | None) -> str:
    m = m or {}
    params = f", {m['params']:,} params" if m.get("params") else ""
    return f"{m.get('preset', '?')} ({m.get('recipe', '?')} recipe{params})"


def models_line(result: dict) -> str:
    ms = result.get("models") or {}
    return f"target {_model(ms.get('target'))}; draft {_model(ms.get('draft'))}"


def best_run(result: dict) -> dict | None:
    """The speculative run (k >= 1) with the highest measured median speedup."""
    runs = [r for r in result.get("runs") or [] if r.get("k") and r.get("speedup") is not None]
    return max(runs, key=lambda r: r["speedup"]) if runs else None


def best_claim(result: dict) -> str:
    best = best_run(result)
    if best is None:
        return "no speculative run measured"
    return f"best measured speedup {times(best['speedup'])} at k={best['k']} " \
           f"({_name(best['drafter'])})"


def _roof(roofs: dict | None, intensity: float) -> float | None:
    if not roofs or not roofs.get("compute") or not roofs.get("memory"):
        return None
    return min(roofs["compute"], roofs["memory"] * intensity)


def break_even(result: dict) -> str:
    """Where the predicted speedup of the batch rows first falls below 1, from the data."""
    rows = [r for r in result.get("batch") or [] if r.get("predicted_speedup") is not None]
    if not rows:
        return "no predicted speedup (no acceptance measured at the batch k)"
    below = [r["batch"] for r in rows if r["predicted_speedup"] < 1]
    if not below:
        return f"predicted speedup stays above 1 up to batch {rows[-1]['batch']}"
    first = below[0]
    above = [r["batch"] for r in rows if r["batch"] < first and r["predicted_speedup"] >= 1]
    if not above:
        return f"predicted speedup below 1 already at batch {first}"
    return f"predicted speedup falls below 1 between batch {above[-1]} and {first}"


def _roof_time(roofs: dict, flops: float, intensity: float) -> float:
    """Roofline time of `flops` at `intensity` FLOP/B: max(FLOPs / C, bytes / M)."""
    return max(flops / roofs["compute"], flops / intensity / roofs["memory"])


def batch_cause(result: dict, short: bool = False) -> str | None:
    """Why the measured verify/decode ratio v at the largest batch is what it is, from the
    data: where the verify's counted intensity sits against the ridge, the v the roofs would
    give (roofline time of the verify over the decode step's), and how far below its own roof
    each step ran (roofline time / measured time). The FLOPs of a step at batch b are b times
    the batch-1 roofline points' (every sequence does the same work at one context). None
    without roofs, batch rows or the batch-1 points of k = 0 and the batch k. short: one
    line, for a panel title."""
    rows = sorted(result.get("batch") or [], key=lambda r: r["batch"])
    roofs = result.get("roofs") or {}
    k = (result.get("setup") or {}).get("batch_k")
    pts = {p["k"]: p for p in result.get("roofline") or [] if p.get("flops")}
    if not rows or not roofs.get("compute") or not roofs.get("memory") or 0 not in pts \
            or k not in pts:
        return None
    r = rows[-1]
    if not r.get("decode_intensity") or not r.get("verify_intensity") or not r.get("decode_s"):
        return None
    b, ridge = r["batch"], roofs["compute"] / roofs["memory"]
    t_dec = _roof_time(roofs, b * pts[0]["flops"], r["decode_intensity"])
    t_ver = _roof_time(roofs, b * pts[k]["flops"], r["verify_intensity"])
    v_roof, v = t_ver / t_dec, r["verify_ratio"]
    side = "past" if r["verify_intensity"] > ridge else "below"
    where = (f"batch {b}: verify (k={k}) at {num(r['verify_intensity'])} FLOP/B, {side} the "
             f"ridge ({num(ridge)}); on the roofs v = {num(v_roof)}, measured v = {num(v)}")
    why = (f"decode ran at {t_dec / r['decode_s']:.0%} of its roof, verify at "
           f"{t_ver / r['verify_s']:.0%}")
    if v < 0.8 * v_roof:
        why += ", so the verify's extra FLOPs cost less than the roofs say"
    elif v > 1.25 * v_roof:
        why += ", so the verify costs more than the roofs say"
    if short:
        return (f"batch {b}: v = {num(v_roof)} on the roofs, {num(v)} measured: decode ran at "
                f"{t_dec / r['decode_s']:.0%} of its roof")
    return f"{where}: {why}"


def _plain_log(axis, minor: bool = False) -> None:
    """Log tick labels as plain numbers (0.5, 1, 10, not 10^0); with minor also at 2, 3, 5."""
    axis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:,.6g}"))
    if not minor:
        axis.set_minor_formatter(NullFormatter())
        return
    axis.set_minor_formatter(FuncFormatter(
        lambda v, _: f"{v:,.3g}" if round(v / 10 ** np.floor(np.log10(v))) in (2, 3, 5)
        else ""))


# ------------------------------------------------------------------ the four panels

def _acceptance_panel(ax, result: dict) -> None:
    drafters = _drafters(result)
    if not drafters:
        _note(ax, "no speculative runs")
        return
    tw = ax.twinx()
    tw.grid(False)
    handles, labels = [], []
    kmax = 1
    parts = []
    for i, d in enumerate(drafters):
        rows = _rows(result, d)
        ks = [r["k"] for r in rows]
        kmax = max(kmax, *ks)
        color = _color(d, i)
        acc = [(r["k"], r["acceptance"]) for r in rows if r.get("acceptance") is not None]
        if acc:
            h, = ax.plot(*zip(*acc, strict=True), "-", marker=MARKERS.get(d, "o"), color=color,
                         ms=7)
            handles.append(h)
            labels.append(f"{_name(d)}: acceptance a")
            a = [v for _, v in acc]
            parts.append(f"{_name(d)} {num(min(a))}" if min(a) == max(a) else
                         f"{_name(d)} {num(min(a))}-{num(max(a))}")
        tpp = [(r["k"], r["tokens_per_pass"]) for r in rows
               if r.get("tokens_per_pass") is not None]
        if tpp:
            h, = tw.plot(*zip(*tpp, strict=True), "--", marker=MARKERS.get(d, "o"),
                         mfc="white", color=color, ms=7, lw=1.5)
            handles.append(h)
            labels.append(f"{_name(d)}: tokens per target pass (right)")
    ks = np.arange(0, kmax + 2)
    h, = tw.plot(ks, ks + 1, ":", color="0.5", lw=1.2)
    handles.append(h)
    labels.append("k + 1: tokens per pass if a = 1 (right)")
    s = result.get("sampled")
    if s and s.get("acceptance") is not None:
        h, = ax.plot([s["k"]], [s["acceptance"]], "*", color=_color(s["drafter"]), ms=14,
                     mec="black", mew=0.6)
        handles.append(h)
        labels.append(f"sampled T={num(s.get('temperature'))}, {_name(s['drafter'])}: a")
    ax.set_ylim(0, 1.45)
    ax.set_yticks(np.linspace(0, 1, 6))
    tw.set_ylim(0, (kmax + 1) * 1.45)
    ax.set_xlim(0.5, kmax + 0.5)
    ax.set_xticks(sorted({r["k"] for d in drafters for r in _rows(result, d)}))
    ax.set_xlabel("k (proposals per round)")
    ax.set_ylabel("acceptance a (accepted / judged)")
    tw.set_ylabel("tokens per target pass")
    ax.legend(handles, labels, loc="upper left", fontsize=8.5, ncol=2)
    ax.set_title("(a) acceptance, greedy: " + ", ".join(parts), fontsize=12)


def _speedup_panel(ax, result: dict) -> None:
    drafters = _drafters(result)
    if not drafters:
        _note(ax, "no speculative runs")
        return
    values = [1.0]
    nrounds = 0
    for i, d in enumerate(drafters):
        rows = _rows(result, d)
        color = _color(d, i)
        ks = [r["k"] for r in rows]
        med = [r["speedup"] for r in rows]
        spans = [r.get("speedup_rounds") or [r["speedup"]] for r in rows]
        lo = [max(0.0, r["speedup"] - min(x)) for r, x in zip(rows, spans, strict=True)]
        hi = [max(0.0, max(x) - r["speedup"]) for r, x in zip(rows, spans, strict=True)]
        nrounds = max(nrounds, *[len(r.get("speedup_rounds") or []) for r in rows])
        ax.errorbar(ks, med, yerr=[lo, hi], fmt="-", marker=MARKERS.get(d, "o"), color=color,
                    ms=8, capsize=4, lw=1.6, label=f"{_name(d)}")
        values += [m + h for m, h in zip(med, hi, strict=True)]
        values += [m - lw for m, lw in zip(med, lo, strict=True)]
        for key, ls in (("predicted", "--"), ("standard", ":")):
            pts = [(r["k"], r[key]) for r in rows if r.get(key) is not None]
            if pts:
                ax.plot(*zip(*pts, strict=True), ls, color=color, lw=1.6)
                values += [v for _, v in pts]
    s = result.get("sampled")
    if s and s.get("speedup") is not None:
        ax.plot([s["k"]], [s["speedup"]], "*", color=_color(s["drafter"]), ms=14, mec="black",
                mew=0.6, label=f"sampled T={num(s.get('temperature'))} "
                               f"({_name(s['drafter'])}), one timing")
        values.append(s["speedup"])
        if s.get("predicted") is not None:
            ax.plot([s["k"]], [s["predicted"]], "*", color="white", ms=12,
                    mec=_color(s["drafter"]), mew=1.2, label="sampled: predicted (this loop)")
            values.append(s["predicted"])
    ax.axhline(1.0, color="0.3", lw=1.2, label="1: plain decode")
    pos = [v for v in values if v and v > 0]
    if max(pos) / min(pos) > 5:
        ax.set_yscale("log")
        ax.set_ylim(min(pos) / 1.3, max(pos) * 2.5)
        _plain_log(ax.yaxis, minor=True)
    else:
        ax.set_ylim(0, max(pos) * 1.3)
    ks = sorted({r["k"] for d in drafters for r in _rows(result, d)})
    ax.set_xticks(ks)
    ax.set_xlim(min(ks) - 0.5, max(ks) + 0.5)
    ax.set_xlabel("k (proposals per round)")
    ax.set_ylabel("speedup over plain decode (x)")
    handles, labels = ax.get_legend_handles_labels()
    order = sorted(range(len(labels)), key=lambda i: (labels[i].startswith("1:"),
                                                          labels[i].startswith("sampled")))
    first = ax.legend([handles[i] for i in order], [labels[i] for i in order], loc="upper left",
                      fontsize=8.5)
    ax.add_artist(first)
    bar = f"median, bar: min-max of {nrounds} rounds" if nrounds > 1 else "one round"
    style = [Line2D([], [], color="0.3", marker="o", lw=1.6), Line2D([], [], color="0.3",
             ls="--"), Line2D([], [], color="0.3", ls=":")]
    ax.legend(style, [f"measured ({bar})", "predicted, this loop: E(1+o)/((k+1)c + v_k + o)",
                      "standard: E/(k c + 1)"], loc="upper right", fontsize=8.5)
    ax.set_title(f"(b) {best_claim(result)}", fontsize=12)


def _roofline_panel(ax, result: dict) -> None:
    pts = sorted((p for p in result.get("roofline") or []
                  if p.get("intensity") and p.get("flops_per_s")), key=lambda p: p["k"])
    if not pts:
        _note(ax, "no roofline points")
        return
    roofs = result.get("roofs")
    xs = [p["intensity"] for p in pts]
    ys = [p["flops_per_s"] for p in pts]
    lo_x, hi_x = min(xs) / 4, max(xs) * 4
    have_roof = _roof(roofs, 1.0) is not None
    if have_roof:
        ridge = roofs["compute"] / roofs["memory"]
        hi_x = max(hi_x, ridge * 4)
        grid = np.geomspace(lo_x, hi_x, 200)
        ax.plot(grid, np.minimum(roofs["compute"], roofs["memory"] * grid), color="0.25",
                lw=1.6, label=f"roofs this run read from {roofs.get('source', '?')}: "
                              f"{fmt_si(roofs['compute'], 'FLOP/s')}, "
                              f"{fmt_si(roofs['memory'], 'B/s')}")
        ax.axvline(ridge, color="0.6", lw=1, ls=":")
        ax.text(ridge, 0.02, f" ridge {num(ridge, 2)} FLOP/B", rotation=90, ha="left",
                va="bottom", transform=ax.get_xaxis_transform(), **SMALL)
    ax.plot(xs, ys, "-", color=PALETTE[2], lw=1, alpha=0.6)
    ax.plot(xs[:1], ys[:1], "D", color=PALETTE[3], ms=9, label="plain decode step (k = 0)")
    ax.plot(xs[1:], ys[1:], "o", color=PALETTE[2], ms=8,
            label="verify of k + 1 tokens (k >= 1)")
    for p in pts:
        ax.annotate(f"k={p['k']}", (p["intensity"], p["flops_per_s"]), textcoords="offset points",
                    xytext=(6, -12), fontsize=9)
    ymax = max(ys) * 30
    ymin = min(ys) / 5
    if have_roof:
        ymax = max(ymax, roofs["compute"] * 3)
    ax.set(xscale="log", yscale="log", xlim=(lo_x, hi_x), ylim=(ymin, ymax))
    _plain_log(ax.xaxis)
    ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: fmt_si(v, "FLOP/s")))
    ctx = (result.get("steps") or {}).get("context")
    where = f"; batch 1, {ctx} cached tokens" if ctx else ""
    ax.set_xlabel(f"arithmetic intensity (FLOPs / byte, counted{where})")
    ax.set_ylabel("FLOP/s (counted FLOPs / measured time)")
    ax.legend(loc="upper left", fontsize=8.5)
    title = (f"(c) intensity {num(xs[0], 2)} -> {num(xs[-1], 2)} FLOP/B "
             f"(k = {pts[0]['k']} -> {pts[-1]['k']})")
    if have_roof:
        frac = [p["flops_per_s"] / _roof(roofs, p["intensity"]) for p in pts]
        title += f"\nat {min(frac):.1%}-{max(frac):.1%} of the roof"
    else:
        title += "\nno roofs recorded (no peaks.json)"
    ax.set_title(title, fontsize=12)


def _batch_panel(ax, result: dict) -> None:
    rows = sorted(result.get("batch") or [], key=lambda r: r["batch"])
    if not rows:
        _note(ax, "no batch measurements")
        return
    k = (result.get("setup") or {}).get("batch_k")
    bs = [r["batch"] for r in rows]
    ax.plot(bs, [r["verify_ratio"] for r in rows], "-o", color=PALETTE[2], ms=7,
            label=f"verify (k={k}) / decode step time")
    ax.plot(bs, [r["draft_ratio"] for r in rows], "-^", color=PALETTE[4], ms=7, lw=1.4,
            label="draft step / target decode step (c)")
    values = [r["verify_ratio"] for r in rows] + [r["draft_ratio"] for r in rows] + [1.0]
    if k:
        ax.axhline(k + 1, color=PALETTE[2], ls="--", lw=1.2,
                   label=f"k + 1 = {k + 1}: verify ceiling when compute-bound")
        values.append(k + 1)
    pred = [(r["batch"], r["predicted_speedup"]) for r in rows
            if r.get("predicted_speedup") is not None]
    if pred:
        a = result.get("batch_acceptance")
        ax.plot(*zip(*pred, strict=True), "-s", color=PALETTE[3], ms=7,
                label=f"predicted speedup (this loop, a = {num(a)})")
        values += [v for _, v in pred]
    ax.axhline(1.0, color="0.3", lw=1.2,
               label="1: verify = one decode step; speedup break-even")
    ax.set_xscale("log")
    ax.xaxis.set_major_locator(FixedLocator(bs))
    _plain_log(ax.xaxis)
    ax.set_xlim(min(bs) / 1.6, max(bs) * 1.6)
    ax.set_ylim(0, max(values) * 1.45)
    ax.set_xlabel("batch (sequences)")
    ax.set_ylabel("ratio (x)")
    ax.legend(loc="upper left", fontsize=8.5)
    cause = batch_cause(result, short=True)
    ax.set_title(f"(d) {break_even(result)}" + (f"\n{cause}" if cause else ""),
                 fontsize=12 if cause is None else 10)


@styled
def speculative_figure(result: dict):
    fig, _ = new_figure(16, 12)
    fig.clear()
    axes = fig.subplots(2, 2)
    _acceptance_panel(axes[0, 0], result)
    _speedup_panel(axes[0, 1], result)
    _roofline_panel(axes[1, 0], result)
    _batch_panel(axes[1, 1], result)
    su = result.get("setup") or {}
    fig.suptitle(f"Speculative decoding on {machine_name(result.get('environment'))}: "
                 f"{best_claim(result)}\n{models_line(result)}\ngreedy, batch 1, "
                 f"{su.get('prompts', '?')} prompt(s) x {su.get('prompt_len', '?')} tokens, "
                 f"{su.get('new_tokens', '?')} new tokens, {su.get('rounds', '?')} round(s)",
                 fontsize=14)
    fig.supxlabel(made_by(result.get("environment")), fontsize=9, ha="left", x=0.01,
                  color="0.3")
    return fig


def draw_speculative(result: dict, out_dir: str | Path) -> list[Path]:
    """Write speculative.png into out_dir; return its path in a list."""
    check_kind(result, "speculative")
    return [save(speculative_figure(result), Path(out_dir) / FILE)]


# ------------------------------------------------------------------ the summary

def _spread(r: dict) -> str:
    rounds = r.get("speedup_rounds") or []
    if len(rounds) < 2:
        return "one round"
    return f"{times(min(rounds))}-{times(max(rounds))}"


def speculative_summary(result: dict) -> str:
    steps = result.get("steps") or {}
    su = result.get("setup") or {}
    lines = [f"# speculative decoding on {machine_name(result.get('environment'))}", "",
             f"Models: {models_line(result)}.", "",
             f"speedup = plain decode time / speculative time, measured in the same "
             f"interleaved rounds (median of {su.get('rounds', '?')}), greedy, batch 1.",
             f"predicted (this loop) = E[tokens] (1 + o) / ((k + 1) c + v_k + o); standard = "
             f"E[tokens] / (k c + 1); c = draft / target decode step = "
             f"{num(steps.get('draft_ratio'))} (0 for prompt lookup), v_k = verify / decode "
             f"step time, o = the loop's fixed cost per round in decode steps = "
             f"{num(steps.get('overhead'))} (plain decode's time per token in the loop over "
             f"its step timed alone, minus 1).", "",
             f"{best_claim(result)}.", ""]
    rows = [[_name(r["drafter"]), r["k"], num(r.get("acceptance")),
             num(r.get("tokens_per_pass")), times(r.get("speedup")), _spread(r),
             times(r.get("predicted")), times(r.get("standard"))]
            for d in _drafters(result) for r in _rows(result, d)]
    lines += md_table(["drafter", "k", "acceptance a", "tokens / target pass", "measured speedup",
                     "min-max over rounds", "predicted (this loop)", "standard formula"], rows)
    s = result.get("sampled")
    if s:
        lines += ["", f"Sampled (temperature {num(s.get('temperature'))}, "
                      f"{_name(s.get('drafter', '?'))}, k={s.get('k')}): acceptance a = "
                      f"{num(s.get('acceptance'))}, {num(s.get('tokens_per_pass'))} tokens per "
                      f"target pass, measured speedup {times(s.get('speedup'))} (one timing), "
                      f"predicted (this loop) {times(s.get('predicted'))}."]
    else:
        lines += ["", "No sampled run."]
    t_dec = steps.get("target_decode_s")
    lines += ["", f"## step times ({steps.get('context', '?')} cached tokens, batch 1)", "",
              f"target decode step {_ms(t_dec)}, draft decode step "
              f"{_ms(steps.get('draft_decode_s'))} (c = {num(steps.get('draft_ratio'))}).", ""]
    roofs = result.get("roofs")
    rows = []
    for p in sorted(result.get("roofline") or [], key=lambda p: p["k"]):
        v = p["seconds"] / t_dec if t_dec else None
        roof = _roof(roofs, p["intensity"]) if p.get("intensity") else None
        rows.append(["plain decode (0)" if p["k"] == 0 else p["k"], _ms(p.get("seconds")),
                     num(v), num(p.get("intensity")), fmt_si(p["flops_per_s"], "FLOP/s"),
                     "n/a" if roof is None else f"{p['flops_per_s'] / roof:.1%}"])
    lines += md_table(["k", "verify time", "verify / decode (v_k)", "intensity (FLOP/B)",
                     "FLOP/s", "of the roof"], rows)
    lines += ["", "roofs: " + (f"{fmt_si(roofs['compute'], 'FLOP/s')}, "
                               f"{fmt_si(roofs['memory'], 'B/s')} from {roofs.get('source')}"
                               if roofs else "none recorded")]
    k = su.get("batch_k")
    lines += ["", f"## batch (k={k}, acceptance a = {num(result.get('batch_acceptance'))})", "",
              f"{break_even(result)}." + (f" Why, measured: {batch_cause(result)}."
                                          if batch_cause(result) else ""), ""]
    rows = [[r["batch"], num(r.get("verify_ratio")), num(r.get("draft_ratio")),
             times(r.get("predicted_speedup")), num(r.get("decode_intensity")),
             num(r.get("verify_intensity"))]
            for r in sorted(result.get("batch") or [], key=lambda r: r["batch"])]
    lines += md_table(["batch", "verify / decode", "draft / decode", "predicted speedup",
                     "decode intensity", "verify intensity"], rows)
    lines += wall_time(result)
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    return redraw_main(argv, "speculative", draw_speculative, speculative_summary)


if __name__ == "__main__":
    sys.exit(main())
