"""The at-scale figures and summary of a saved simulate result (simulate.json, `python -m
microbench simulate`): serving at scale on paper, scale-out against published SLOs,
prefill/decode (PD) disaggregation, attention-FFN disaggregation (AFD) against the colocated
deployment practitioners would run, and SRAM-only chips.

Every title states what the plotted numbers show, computed here from the JSON (the ranking
by `scale_claim`, the PD verdicts by `pd_headline`, the AFD ones by `afd_claim`), against
the SLOs the result records; every figure states its assumptions (device, precision,
parallelism, link) from the result's own "assumptions" blocks. The numbers are roofline
bounds of each design (microbench.studies.scale), not measurements, and the figures say so.
Imports matplotlib, numpy and microbench.plots.common only (no JAX).
"""

from __future__ import annotations

import math
import textwrap

import numpy as np

from microbench.plots.common import (
    PALETTE,
    legend_clear,
    md_table,
    new_figure,
    place_labels,
    plain_log,
    renderer_of,
    styled,
)
from microbench.plots.serving import _num

TIE = 0.01  # PD designs within 1% of the best goodput per chip share the win
SMALL = {"fontsize": 9, "color": "0.3"}


# ------------------------------------------------------------------ formatting

def pct(value) -> str:
    """0.1234 -> '12.3%'; None -> 'n/a'."""
    return "n/a" if value is None else f"{value:.1%}"


def _ms(seconds) -> str:
    return "n/a" if seconds is None else f"{_num(seconds * 1e3)} ms"


def _dtype(name) -> str:
    return {"bfloat16": "bf16", "float16": "fp16", "float8": "fp8", "float32": "fp32"}.get(
        name, str(name))


def _caption(fig, text: str) -> None:
    """Assumptions, in small grey type under the axes, wrapped to the figure's width."""
    width = int(fig.get_figwidth() * 13)
    text = "\n".join(textwrap.fill(line, width) for line in text.split("\n"))
    lines = text.count("\n") + 1
    fig.get_layout_engine().set(rect=(0, 0.03 * lines + 0.01, 1, 1 - 0.03 * lines - 0.01))
    fig.text(0.01, 0.008, text, ha="left", va="bottom", **SMALL)


_plain_log = plain_log  # log axes labelled 30, 100, 300 (common.plain_log)


def _precision(a: dict) -> str:
    bits = [f"{k.split('_')[0]} {_dtype(a[k])}" for k in ("weight_dtype", "kv_dtype",
                                                          "act_dtype") if a.get(k)]
    return ", ".join(bits)


# ------------------------------------------------------------------ 1. scale-out

def _model_setup(m: dict) -> str:
    a = m.get("assumptions") or {}
    link = f" over {a['link']}" if a.get("link") else ""
    return (f"{m['model']}: {a.get('device')} x TP {a.get('tp')}{link}, "
            f"{_precision(a)}, at most {a.get('max_running')} running")


SLO_STYLES = ("--", ":", "-.")


def _maybe(value) -> str:
    """_num, or 'none' for None (a rate no run sustained)."""
    return "none" if value is None else _num(value)


def _time(seconds: float) -> str:
    """0.045 -> '45 ms'; 2.0 -> '2 s'."""
    return f"{_num(seconds)} s" if seconds >= 1 else _ms(seconds)


def _slo_text(slo: dict) -> str:
    return (f"{slo['name']}: p99 TTFT <= {_time(slo['ttft_s'])}, p99 TPOT <= "
            f"{_time(slo['tpot_s'])}")


def _slo_lines(ax, slos: list[dict], key: str) -> None:
    """A horizontal line (ms) per SLO at its `key` bound, labelled for the legend."""
    for slo, ls in zip(slos, SLO_STYLES, strict=False):
        ax.axhline(slo[key] * 1e3, color="0.25", ls=ls, lw=1.3, label=f"{slo['name']} SLO")


def missed(runs: list[dict], slo: str) -> dict:
    """How many runs miss `slo` at p99, and on which part: {"runs", "ttft", "tpot"}."""
    out = {"runs": 0, "ttft": 0, "tpot": 0}
    for r in runs:
        v = r["slos"][slo]
        if not v["meets_p99"]:
            out["runs"] += 1
            out["ttft"] += r["p99_ttft_s"] > v["ttft_s"]
            out["tpot"] += r["p99_tpot_s"] > v["tpot_s"]
    return out


def scale_claim(models: list[dict]) -> str:
    """The models from most to fewest requests/s per chip sustained within the first SLO
    (p99), e.g. 'within MLPerf server SLOs: llama3-8b 34, qwen3-30b-a3b 23 requests/s/chip'."""
    slo = models[0]["slos"][0]["name"]
    ranked = sorted(models, key=lambda m: -((m.get("sustained_per_chip") or {}).get(slo) or 0))
    parts = [f"{m['model']} {_num(v) if (v := m['sustained_per_chip'].get(slo)) else 'none'}"
             for m in ranked]
    return f"requests/s per chip sustained within {slo} SLOs (p99): " + ", ".join(parts)


def _scale_panel(ax, models: list[dict], key: str, name: str, named: bool = True) -> None:
    """p99 `key` (ms) vs offered requests/s per chip, one line per model (in the legend when
    `named`), the SLO lines."""
    for i, m in enumerate(models):
        runs = sorted(m["runs"], key=lambda r: r["rate"])
        slo = m["slos"][0]["name"]
        best = m["sustained_per_chip"].get(slo)
        label = (f"{m['model']} (TP {m['tp']}{', MoE' if m.get('moe') else ''}): "
                 f"{_num(best) if best else 'none'}/chip (capacity "
                 f"{_num(m['capacity'] / m['tp'])})")
        ax.plot([r["rate_per_chip"] for r in runs], [r[f"p99_{key}"] * 1e3 for r in runs],
                "o-", color=PALETTE[i % 10], label=label if named else None)
    _slo_lines(ax, models[0]["slos"], key)
    ax.set(xscale="log", yscale="log", xlabel="offered requests/s per chip (Poisson arrivals)",
           ylabel=f"p99 {name} (ms)")
    _plain_log(ax)


def _pareto_panel(ax, models: list[dict]) -> None:
    for i, m in enumerate(models):
        pts = sorted(m["pareto"], key=lambda r: r["max_running"])
        ax.plot([r["tokens_per_s_per_user"] for r in pts],
                [r["tokens_per_s_per_chip"] for r in pts], "o-", color=PALETTE[i % 10],
                label=m["model"])
    ax.set(xscale="log", yscale="log", xlabel="tokens/s per user (1 / mean TPOT)",
           ylabel="output tokens/s per chip")
    _plain_log(ax)
    ax.set_title("Throughput vs interactivity\n(labels: batch cap, all requests at once)",
                 fontsize=12)


def _pareto_labels(ax, models: list[dict]) -> None:
    """Each point's batch cap beside it, in its model's colour, clear of the others."""
    renderer = renderer_of(ax.figure)
    taken = [lg.get_window_extent(renderer) for lg in [ax.get_legend()] if lg]
    for i, m in enumerate(models):
        pts = [(r["tokens_per_s_per_user"], r["tokens_per_s_per_chip"], f"{r['max_running']}")
               for r in m["pareto"]]
        for ann in place_labels(ax, pts, avoid=taken, renderer=renderer, fontsize=8,
                                color=PALETTE[i % 10]):
            taken.append(ann.get_window_extent(renderer))


@styled
def scale_figure(result: dict):
    """p99 TTFT and p99 TPOT vs offered rate per chip against the published SLOs, and
    tokens/s per chip vs tokens/s per user as the batch cap grows."""
    models = result["paper"]["scale_out"]
    fig, _ = new_figure(21, 7.5)
    fig.clear()
    ttft, tpot, right = fig.subplots(1, 3, width_ratios=(1, 1, 1.1))
    _scale_panel(ttft, models, "ttft_s", "TTFT")
    _scale_panel(tpot, models, "tpot_s", "TPOT", named=False)
    _pareto_panel(right, models)
    slo = models[0]["slos"][0]["name"]
    ttft.set_title(f"p99 TTFT (legend: requests/s per chip sustained\nwithin {slo} SLOs, "
                   "at most the steady capacity)", fontsize=12)
    tpot.set_title("p99 TPOT (mean gap between a request's tokens)", fontsize=12)
    mix = models[0].get("mix") or ["?", "?", "?"]
    fig.suptitle(f"Scale-out on paper (roofline bound, not measured), '{mix[0]}' mix "
                 f"({mix[1]} prompt / {mix[2]} output tokens):\n{scale_claim(models)}",
                 fontsize=14)
    why = []
    for s in models[0]["slos"]:
        n = {k: sum(missed(m["runs"], s["name"])[k] for m in models)
             for k in ("runs", "ttft", "tpot")}
        why.append(f"{s['name']}: {n['runs']} of {sum(len(m['runs']) for m in models)} runs "
                   f"miss it, {n['ttft']} on TTFT, {n['tpot']} on TPOT")
    _caption(fig, "; ".join(_model_setup(m) for m in models) + "\nSLOs, the same for every "
             "model: " + "; ".join(_slo_text(s) for s in models[0]["slos"]) + " (MLPerf "
             "Inference llama2-70b scenarios); rates: fractions of each instance's steady "
             f"capacity, {models[0].get('requests', 0) // models[0]['tp']} requests per run "
             "per chip\n" + "; ".join(why))
    legend_clear(ttft)
    legend_clear(tpot)
    legend_clear(right)
    _pareto_labels(right, models)
    return fig


# ------------------------------------------------------------------ 2. PD

def pd_sustained(mix: dict, slo: str) -> dict:
    """{design: requests/s per chip it sustains within `slo` at p99 (the highest swept rate
    whose run meets it, every lower rate meeting it too, at most the design's steady
    capacity), or None}."""
    names = list(dict.fromkeys(d["design"] for r in mix["rates"] for d in r["designs"]))
    caps = mix.get("design_capacity") or {}
    out = {}
    for name in names:
        best = None
        for row in sorted(mix["rates"], key=lambda r: r["rate"]):
            d = next((d for d in row["designs"] if d["design"] == name), None)
            if (d is None or not d["slos"][slo]["meets_p99"]
                    or row["rate"] > caps.get(name, math.inf) * (1 + 1e-9)):
                break
            best = row["rate"] / d["chips"]
        out[name] = best
    return out


def pd_winners(mix: dict) -> list[tuple[str, float | None, list[str]]]:
    """(SLO, the most requests/s per chip any design sustains within it, the designs within
    TIE of that) per SLO of the mix; (SLO, None, []) when none meets it at the lowest rate."""
    out = []
    for slo in mix["slos"]:
        got = pd_sustained(mix, slo["name"])
        best = max((v for v in got.values() if v), default=None)
        out.append((slo["name"], best, [k for k, v in got.items()
                                        if best and v and v >= best * (1 - TIE)]))
    return out


def pd_claim(mix: dict) -> str:
    """Per SLO, the design(s) sustaining the most requests/s per chip, e.g. 'MLPerf server:
    4 colocated = 2P2D 90/chip; MLPerf interactive: 3P1D 12/chip'."""
    return "; ".join(f"{slo}: " + (f"{' = '.join(won)} {_num(best)}/chip" if best else
                                   "no design meets it at the lowest rate")
                     for slo, best, won in pd_winners(mix))


def _pd_cases(pd: dict) -> list[tuple[str, str, str]]:
    """(mix, SLO, 'pd' | 'colocated' | 'tie') per mix and SLO: whether the best PD design
    sustains more requests/s per chip than the best colocated one (by more than TIE)."""
    out = []
    for mix in pd["mixes"]:
        colo = {d["design"] for r in mix["rates"] for d in r["designs"] if d["prefill"] == 0}
        for slo in mix["slos"]:
            got = pd_sustained(mix, slo["name"])
            c = max((v or 0 for k, v in got.items() if k in colo), default=0)
            d = max((v or 0 for k, v in got.items() if k not in colo), default=0)
            who = ("pd" if d > c * (1 + TIE) else "colocated" if c > d * (1 + TIE)
                   else "tie")
            out.append((mix["mix"][0], slo["name"], who))
    return out


def pd_headline(pd: dict) -> str:
    """How many (mix, SLO) cases a PD design wins, where; e.g. 'a PD design sustains more per
    chip in 1 of 4 cases ('summarize' at MLPerf interactive); colocated in 2; tied in 1'."""
    cases = _pd_cases(pd)
    won = [f"'{m}' at {s}" for m, s, w in cases if w == "pd"]
    text = (f"a PD design sustains more requests/s per chip in {len(won)} of {len(cases)} "
            "cases" + (f" ({', '.join(won)})" if won else ""))
    n_colo = sum(w == "colocated" for _, _, w in cases)
    n_tie = sum(w == "tie" for _, _, w in cases)
    return text + f"; colocated in {n_colo}; tied in {n_tie}"


def pd_tpot_note(pd: dict) -> str:
    """PD's lever, from the data: p99 TPOT at each mix's highest rate, colocated against the
    best PD design, and whether a published TPOT bound falls between the two."""
    parts, between = [], set()
    for mix in pd["mixes"]:
        top = max(mix["rates"], key=lambda r: r["rate"])["designs"]
        colo = min((d["p99_tpot_s"] for d in top if d["prefill"] == 0), default=None)
        best = min((d for d in top if d["prefill"]), key=lambda d: d["p99_tpot_s"],
                   default=None)
        if colo is None or best is None:
            continue
        parts.append(f"'{mix['mix'][0]}' {_ms(colo)} vs {_ms(best['p99_tpot_s'])} "
                     f"({best['design']})")
        between |= {s["name"] for s in mix["slos"]
                    if best["p99_tpot_s"] < s["tpot_s"] < colo}
    if not parts:
        return "no PD design ran"
    verdict = (f"the TPOT bound of {', '.join(sorted(between))} falls between them" if between
               else "no published TPOT bound falls between them")
    return ("PD's lever is TPOT (its decodes never share a step with a prefill): p99 TPOT at "
            "the highest rate, colocated vs the best PD design: " + "; ".join(parts) + "; "
            + verdict)


def _pd_panel(ax, mix: dict, key: str, name: str) -> None:
    rows = sorted(mix["rates"], key=lambda r: r["rate"])
    names = list(dict.fromkeys(d["design"] for r in rows for d in r["designs"]))
    for j, design in enumerate(names):
        pts = [(r["rate"], d) for r in rows for d in r["designs"] if d["design"] == design]
        colo, chips = pts[0][1].get("prefill") == 0, pts[0][1]["chips"]
        cap = (mix.get("design_capacity") or {}).get(design)
        ax.plot([x / d["chips"] for x, d in pts], [d[f"p99_{key}"] * 1e3 for _, d in pts],
                "s--" if colo else "o-", color="0.2" if colo else PALETTE[j % 10],
                label=f"{design} ({chips} chips" + (f"; capacity {_num(cap / chips)}/chip)"
                                                    if cap else ")"))
    _slo_lines(ax, mix["slos"], key)
    ax.set(xscale="log", yscale="log", xlabel="offered requests/s per chip",
           ylabel=f"p99 {name} (ms)")
    _plain_log(ax)


@styled
def pd_figure(result: dict):
    """p99 TTFT and p99 TPOT vs offered rate per design, one row per prompt/output mix,
    against the published SLOs."""
    pd = result["paper"]["pd"]
    mixes = pd["mixes"]
    fig, _ = new_figure(17, 6.2 * len(mixes) + 1.5)
    fig.clear()
    axes = np.atleast_2d(fig.subplots(len(mixes), 2))
    for (left, right), mix in zip(axes, mixes, strict=True):
        _pd_panel(left, mix, "ttft_s", "TTFT")
        _pd_panel(right, mix, "tpot_s", "TPOT")
        m = mix["mix"]
        left.set_title(f"'{m[0]}' ({m[1]} prompt / {m[2]} output tokens): p99 TTFT",
                       fontsize=12)
        right.set_title(f"'{m[0]}': p99 TPOT\nmost per chip: {pd_claim(mix)}", fontsize=11,
                        wrap=True)
        legend_clear(left)
    a = pd.get("assumptions") or {}
    fig.suptitle(f"PD disaggregation vs colocated, {pd['model']}, on paper (roofline), "
                 f"judged by p99 against published SLOs:\n{pd_headline(pd)}\n"
                 + textwrap.fill(pd_tpot_note(pd), 150), fontsize=13)
    _caption(fig, f"{a.get('device')} x TP {a.get('tp_per_instance')} per instance, "
                  f"{_precision(a)}; KV over {a.get('kv_link')}; {a.get('routing')} routing,"
                  f" prefill {a.get('prefill_policy')}, colocated {a.get('colocated_policy')}"
                  f"; ties within {TIE:.0%}; sustained: the highest swept rate meeting the "
                  "SLO at p99 (every lower rate meeting it too) at or below the design's "
                  "steady capacity\nSLOs, the same for every design: "
                  + "; ".join(_slo_text(s) for s in mixes[0]["slos"]))
    return fig


# ------------------------------------------------------------------ 3. AFD

def _k(n: int) -> str:
    return f"{n // 1024}k" if n >= 1024 and n % 1024 == 0 else str(n)


def _baseline_name(r: dict) -> str:
    """'TP 8' or 'EP 32 (attention TP 2)' from an AFD row's baseline fields."""
    if r.get("baseline") == "ep":
        a = r.get("baseline_attn_tp") or 1
        return f"EP {r['baseline_size']}" + (f" (attention TP {a})" if a > 1 else "")
    return f"TP {r.get('baseline_size', r.get('colocated_tp'))}"


def afd_claim(rows: list[dict]) -> tuple[str, str]:
    """(where AFD is ahead by more than TIE: 'AFD ahead in 3 of 17 cases: llama3-70b (dense,
    vs TP 8) at ctx 1k B 4, 16', where it is behind: 'behind: qwen3-30b-a3b 0.72-0.92x vs
    EP 32, ...')."""
    fitted = [r for r in rows if r.get("fits", True) is not False]
    ahead = [r for r in fitted if r["gain"] > 1 + TIE]
    where = []
    for m in dict.fromkeys(r["model"] for r in ahead):
        mine = [r for r in ahead if r["model"] == m]
        vs = ", ".join(dict.fromkeys(_baseline_name(r) for r in mine))
        cases = "; ".join(f"ctx {_k(c)} B " + ", ".join(str(r["batch"]) for r in mine
                                                         if r["context"] == c)
                          for c in dict.fromkeys(r["context"] for r in mine))
        where.append(f"{m} ({'MoE' if mine[0]['moe'] else 'dense'}, vs {vs}) at {cases}")
    head = f"AFD ahead in {len(ahead)} of {len(fitted)} cases" + (
        ": " + "; ".join(where) if where else "")
    behind = []
    for m in dict.fromkeys(r["model"] for r in fitted):
        mine = [r for r in fitted if r["model"] == m and r["gain"] < 1 - TIE]
        if mine:
            lo, hi = min(r["gain"] for r in mine), max(r["gain"] for r in mine)
            vs = ", ".join(dict.fromkeys(_baseline_name(r).split(" (")[0] for r in mine))
            span = f"{lo:.2f}x" if lo == hi else f"{lo:.2f}-{hi:.2f}x"
            behind.append(f"{m} {span} vs {vs} ({len(mine)} case{'s' * (len(mine) > 1)})")
    return head, ("behind: " + "; ".join(behind)) if behind else "behind in none"


def _afd_bars(ax, rows: list[dict], models: list[str]) -> None:
    xs, gains = np.arange(len(rows)), [r["gain"] for r in rows]
    bars = ax.bar(xs, gains, color=[PALETTE[models.index(r["model"]) % 10] for r in rows],
                  edgecolor="0.2")
    for bar, r in zip(bars, rows, strict=True):
        if r["moe"]:
            bar.set_hatch("//")
        ax.annotate(f"{r['gain']:.2f}x\n{r['n_attn']}A:{r['n_ffn']}F\n{_baseline_name(r)}"
                    .replace(" (attention TP", "\n(attn TP"), (bar.get_x() + bar.get_width()
                                                                / 2, r["gain"]),
                    ha="center", va="bottom", xytext=(0, 2), textcoords="offset points",
                    fontsize=7)
    ax.axhline(1.0, color="0.2", ls="--", lw=1.2, label="best colocated (gain 1)")
    ax.set_xticks(xs, [f"{r['model']}\nctx {_k(r['context'])}, B {r['batch']}" for r in rows],
                  rotation=60, ha="right", fontsize=8)
    ax.set_ylim(0, max(gains) * 1.45)
    ax.set_ylabel("AFD tokens/s per chip over the best colocated's\n(same chips, same load)")
    for m in models:
        moe = next(r["moe"] for r in rows if r["model"] == m)
        ax.bar([0], [0], color=PALETTE[models.index(m) % 10], hatch="//" if moe else None,
               edgecolor="0.2", label=f"{m} ({'MoE, hatched' if moe else 'dense'})")
    ax.legend(loc="upper right", fontsize=8.5)
    ax.set_title("Gain per case (labels: gain, attention:FFN chips, the baseline)",
                 fontsize=12)


def _afd_intensity(ax, rows: list[dict], models: list[str]) -> None:
    """AFD's pooled FFN FLOP/byte against the baseline's: AFD can only gain above y = x."""
    for m in models:
        mine = [r for r in rows if r["model"] == m]
        color = PALETTE[models.index(m) % 10]
        for r in mine:
            ax.plot(r["colocated_ffn_intensity"], r["ffn_intensity"], "o", ms=8, color=color,
                    mfc=color if r["gain"] > 1 + TIE else "white")
        ax.plot([], [], "o", color=color, label=m)
    vals = [v for r in rows for v in (r["ffn_intensity"], r["colocated_ffn_intensity"])]
    lo, hi = min(vals) / 1.5, max(vals) * 1.5
    ax.plot([lo, hi], [lo, hi], color="0.3", lw=1.2, label="y = x")
    ax.set(xscale="log", yscale="log", xlim=(lo, hi), ylim=(lo, hi),
           xlabel="best colocated's FFN FLOP/byte", ylabel="AFD's pooled FFN FLOP/byte")
    _plain_log(ax)
    ax.set_title("Why: the tokens each FFN weight read serves\n(filled: AFD ahead)",
                 fontsize=12)
    legend_clear(ax)


@styled
def afd_figure(result: dict):
    """AFD's tokens/s per chip over the best colocated deployment's at the same load, per
    model x context x batch, and why (FFN FLOP/byte of each); cases no split of the chips
    holds are named in the caption."""
    rows = [r for r in result["paper"]["afd"] if r.get("fits", True) is not False]
    skipped = [r for r in result["paper"]["afd"] if r.get("fits", True) is False]
    fig, _ = new_figure(max(16, 0.6 * len(rows) + 10), 8.5)
    fig.clear()
    left, right = fig.subplots(1, 2, width_ratios=(max(2.0, len(rows) / 7), 1))
    models = list(dict.fromkeys(r["model"] for r in rows))
    _afd_bars(left, rows, models)
    _afd_intensity(right, rows, models)
    a = rows[0]["assumptions"]
    head, behind = afd_claim(rows)
    fig.suptitle(f"Attention-FFN disaggregation vs the best colocated deployment of "
                 f"{a.get('total')} x {a.get('attn_chip')}, on paper (roofline):\n{head}\n"
                 f"{behind}", fontsize=13)
    weights = dict.fromkeys(f"{r['model']} {_dtype(r['assumptions'].get('weight_dtype'))}"
                            for r in rows)
    _caption(fig, f"weights {', '.join(weights)}; kv {_dtype(a.get('kv_dtype'))}, act "
                  f"{_dtype(a.get('act_dtype'))}; B: sequences per chip, the same load for "
                  f"both designs; AFD's hop over {a.get('link')} (once per node of FFN chips "
                  "a token needs), attention tensor parallel inside a node where that pays;"
                  " colocated: the best of TP replicas (all-reduce on "
                  f"{a.get('attn_link')} inside a node) and, for MoE, expert parallelism "
                  "(all-to-all over the scale-out link across nodes) with data-parallel "
                  "attention; both searched over micro-batches (they hide communication, and "
                  "each reads the weights again)" + ("; no split holds " + ", ".join(
                      f"{r['model']} ctx {_k(r['context'])} B {r['batch']}" for r in skipped)
                      if skipped else ""))
    return fig


# ------------------------------------------------------------------ 4. SRAM

def _pareto_line(ax, rows: list[dict], color, label: str) -> None:
    rows = sorted(rows, key=lambda r: r["batch"])
    ax.plot([r["tokens_per_s_per_user"] for r in rows], [r["tokens_per_s_per_chip"]
            for r in rows], "-", color=color, label=label)
    for r in rows:
        ax.plot(r["tokens_per_s_per_user"], r["tokens_per_s_per_chip"], "o", color=color,
                mfc=color if r["fits"] else "white")
        ax.annotate(f"B{r['batch']}, {r['chips']} chips", (r["tokens_per_s_per_user"],
                    r["tokens_per_s_per_chip"]), xytext=(4, -10), textcoords="offset points",
                    fontsize=7, color=color)


def _chips_panel(ax, need: list[dict]) -> None:
    models = list(dict.fromkeys(r["model"] for r in need))
    chips = list(dict.fromkeys(r["chip"] for r in need))
    width = 0.8 / len(chips)
    for j, chip in enumerate(chips):
        for i, m in enumerate(models):
            r = next((x for x in need if x["model"] == m and x["chip"] == chip), None)
            if r is None:
                continue
            x = i + (j - (len(chips) - 1) / 2) * width
            ax.bar(x, r["chips"], width, color=PALETTE[(j + 2) % 10],
                   label=chip if i == 0 else None)
            ax.annotate(f"{r['chips']:,}", (x, r["chips"]), ha="center", va="bottom",
                        fontsize=8, xytext=(0, 2), textcoords="offset points")
    ax.set_yscale("log")
    _plain_log(ax)
    ax.set_xticks(range(len(models)), models, rotation=30, ha="right", fontsize=9)
    ax.set_ylabel("chips to hold weights + KV")
    ax.legend(loc="upper left")


@styled
def sram_figure(result: dict):
    """SRAM pipeline vs HBM GPUs (tokens/s/chip vs tokens/s/user), and chips per model."""
    s = result["paper"]["sram"]
    fig, _ = new_figure(16, 7.5)
    fig.clear()
    left, right = fig.subplots(1, 2, width_ratios=(3, 2))
    p, a = s["pareto"], s["pareto"]["assumptions"]
    _pareto_line(left, p["sram"], PALETTE[0], f"{a['sram_chip']} pipeline")
    _pareto_line(left, p["gpu"], PALETTE[1], f"{a['gpus']} x {a['gpu_chip']}, TP")
    left.set(xscale="log", yscale="log", xlabel="tokens/s per user",
             ylabel="tokens/s per chip")
    _plain_log(left)
    left.set_title(f"{a['model']} decode at context {a['context']:,} (hollow: does not "
                   "fit)", fontsize=12)
    left.legend(loc="best")
    ctx = (result["paper"].get("paper") or {}).get("context")
    _chips_panel(right, s["chips_needed"])
    right.set_title(f"Chips to hold each model (batch 1, context {ctx})", fontsize=12)
    fast_user = max(p["sram"] + p["gpu"], key=lambda r: r["tokens_per_s_per_user"])
    fast_chip = max(p["sram"] + p["gpu"], key=lambda r: r["tokens_per_s_per_chip"])
    who = {id(r): n for n, rs in (("SRAM", p["sram"]), ("GPU", p["gpu"])) for r in rs}
    fig.suptitle(f"SRAM-only chips vs HBM GPUs on paper (roofline): most tokens/s/user "
                 f"{who[id(fast_user)]} ({_num(fast_user['tokens_per_s_per_user'])} at B"
                 f"{fast_user['batch']}), most tokens/s/chip {who[id(fast_chip)]} "
                 f"({_num(fast_chip['tokens_per_s_per_chip'])} at B{fast_chip['batch']})",
                 fontsize=13)
    h = s.get("heterogeneous") or {}
    het = (f"\nprefill on {h['assumptions'].get('prefill_chips')} x "
           f"{h['assumptions'].get('prefill_chip')}, KV over {h['assumptions'].get('kv_link')}"
           f", decode on SRAM: TTFT {_ms(h.get('ttft'))}, TPOT {_ms(h.get('tpot'))} "
           f"(prompt {h['assumptions'].get('prompt')})" if h.get("assumptions") else "")
    _caption(fig, f"{a['sram_chip']} over {a['sram_link']}; {a['gpu_chip']} over "
                  f"{a['gpu_link']}; {_precision(a)}; labels: batch, chips" + het)
    return fig



def _assume(a: dict) -> str:
    """One line of a study's assumptions: devices, parallelism, precision, links."""
    keys = ("device", "attn_chip", "sram_chip", "gpu_chip", "gpus", "tp", "tp_per_instance",
            "total", "link", "kv_link", "sram_link", "gpu_link", "weight_dtype", "kv_dtype",
            "act_dtype")
    return ", ".join(f"{k} {a[k]}" for k in keys if a.get(k) is not None)


def paper_summary(paper: dict) -> list[str]:
    lines = ["", "## On paper (roofline bounds, not measured)"]
    if paper.get("scale_out"):
        models = paper["scale_out"]
        slos = models[0]["slos"]
        rows = [[m["model"], f"{m['assumptions'].get('device')} x {m['tp']}",
                 _num(m["capacity"] / m["tp"]),
                 *[_maybe(m["sustained_per_chip"].get(s["name"])) for s in slos],
                 _num(max(r["tokens_per_s_per_chip"] for r in m["pareto"])),
                 _num(max(r["tokens_per_s_per_user"] for r in m["pareto"]))]
                for m in models]
        lines += ["", "Scale-out ('" + models[0]["mix"][0] + "' mix; "
                  + "; ".join(f"{m['model']}: {_assume(m['assumptions'])}" for m in models)
                  + "); SLOs, the same for every model: "
                  + "; ".join(_slo_text(s) for s in slos) + ":", "", *md_table(
            ["model", "chips", "capacity per chip (requests/s)",
             *[f"sustained per chip, {s['name']}" for s in slos], "max tokens/s/chip",
             "max tokens/s/user"], rows)]
    pd = paper.get("pd") or {}
    if pd.get("mixes"):
        lines += ["", f"PD, {pd['model']} ({_assume(pd.get('assumptions') or {})}): "
                  f"{pd_headline(pd)}. Requests/s per chip each design sustains within each "
                  "SLO (p99):", ""]
        for mix in pd["mixes"]:
            m, names = mix["mix"], [s["name"] for s in mix["slos"]]
            got = {s: pd_sustained(mix, s) for s in names}
            designs = list(got[names[0]])
            lines += [f"'{m[0]}' ({m[1]} prompt / {m[2]} output): {pd_claim(mix)}", "",
                      *md_table(["design", *names],
                                [[d, *[_maybe(got[s][d]) for s in names]] for d in designs]),
                      ""]
    if paper.get("afd"):
        rows = [[r["model"], "MoE" if r["moe"] else "dense",
                 (r.get("assumptions") or {}).get("weight_dtype", "-"), r["context"],
                 r["batch"], f"{r['n_attn']}:{r['n_ffn']}", _baseline_name(r),
                 f"{r['ffn_intensity']:.1f} / {r['colocated_ffn_intensity']:.1f}",
                 f"{r['gain']:.2f}x"]
                if r.get("fits", True) is not False else
                [r["model"], "MoE" if r.get("moe") else "dense", "-", r["context"],
                 r["batch"], "none fits", "-", "-", "-"] for r in paper["afd"]]
        a = next((r["assumptions"] for r in paper["afd"] if r.get("assumptions")), {})
        a = {k: v for k, v in a.items() if k != "weight_dtype"}  # per row: its own column
        head, behind = afd_claim(paper["afd"])
        lines += ["", f"AFD vs the best colocated deployment at the same load (tokens/s/chip "
                  f"ratio; {_assume(a)}): {head}; {behind}.", "", *md_table(
            ["model", "FFN", "weights", "context", "sequences/chip", "attention:FFN chips",
             "colocated", "FFN FLOP/B (AFD / colocated)", "gain"], rows)]
    s = paper.get("sram") or {}
    if s.get("chips_needed"):
        rows = [[r["model"], r["chip"], f"{r['chips']:,}", f"{r['weight_chips']:,}"]
                for r in s["chips_needed"]]
        a = (s.get("pareto") or {}).get("assumptions") or {}
        lines += ["", f"SRAM chips to hold each model ({_assume(a)}):", "", *md_table(
            ["model", "chip", "chips (weights + KV)", "chips (weights)"], rows)]
    h = s.get("heterogeneous") or {}
    if h:
        lines += ["", f"GPU prefill + SRAM decode: TTFT {_ms(h.get('ttft'))} (prefill "
                  f"{_ms(h.get('prefill'))}, KV transfer {_ms(h.get('transfer'))}), TPOT "
                  f"{_ms(h.get('tpot'))}."]
    return lines
