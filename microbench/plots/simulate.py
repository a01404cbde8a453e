"""The simulate figures and summary, drawn only from a saved simulate result (simulate.json,
`python -m microbench simulate`): the simulator against the engine on this machine, then
serving at scale on paper: scale-out, prefill/decode (PD) disaggregation, attention-FFN
disaggregation (AFD) and SRAM-only chips.

Every title states what the plotted numbers show, computed here from the JSON (the PD winner
per rate by `pd_claim`); every paper figure states its assumptions (device, precision,
parallelism, link) from the result's own "assumptions" blocks. The paper numbers are roofline
bounds of the design (microbench.studies.scale), not measurements, and the figures say so. Imports
matplotlib, numpy and microbench.plots.common only (no JAX): `python -m
microbench.plots.simulate simulate.json [out_dir]` redraws a saved result.
"""

from __future__ import annotations

import textwrap
from pathlib import Path

import numpy as np

from microbench.plots.common import (
    PALETTE,
    check_kind,
    made_by,
    md_table,
    new_figure,
    plain_log,
    redraw_main,
    save,
    styled,
)
from microbench.plots.serving import _note, _num, machine_name

FILES = {"check": "simulate_check.png", "scale": "simulate_scale.png",
         "pd": "simulate_pd.png", "afd": "simulate_afd.png", "sram": "simulate_sram.png"}
METRICS = (("ttft_s", "TTFT"), ("tpot_s", "TPOT"), ("e2e_s", "E2E"))
PREDICTORS = (("table", "table sim", "o"), ("roofline", "roofline sim", "^"))
BAND = 0.10  # the +-10% band drawn around y = x
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


# ------------------------------------------------------------------ 1. the check

def _run_label(model: str, run: dict) -> str:
    return f"{model} {run.get('policy')} @ {_num(run['rate'])}/s"


def _spread(run: dict, key: str):
    values = [m.get(key) for m in run.get("engine_runs") or [] if m.get(key) is not None]
    return (min(values), max(values)) if values else (None, None)


def _check_panel(ax, check: dict, key: str, name: str) -> None:
    errors = check.get("errors") or {}
    lo, hi = np.inf, 0.0
    for i, model in enumerate(check.get("models") or []):
        color = PALETTE[i % len(PALETTE)]
        for pred, _, marker in PREDICTORS:
            pts = [(r["engine"][key], r[pred][key], *_spread(r, key))
                   for r in model["runs"] if pred in r and r["engine"].get(key)
                   and r[pred].get(key)]
            for x, y, a, b in pts:
                xerr = [[x - a], [b - x]] if a is not None else None
                ax.errorbar(x * 1e3, y * 1e3, xerr=None if xerr is None else
                            np.array(xerr) * 1e3, fmt=marker, color=color, ms=7,
                            mfc=color if pred == "table" else "white", capsize=2, lw=1)
                lo, hi = min(lo, x, y), max(hi, x, y)
    if hi == 0:
        _note(ax, f"no runs with a mean {name}")
        return
    xs = np.geomspace(lo * 0.7e3, hi * 1.4e3, 50)
    ax.plot(xs, xs, color="0.3", lw=1.2)
    ax.fill_between(xs, xs * (1 - BAND), xs * (1 + BAND), color="0.5", alpha=0.15, lw=0)
    ax.set(xscale="log", yscale="log", xlim=(xs[0], xs[-1]), ylim=(xs[0], xs[-1]))
    _plain_log(ax)
    ax.set_xlabel(f"engine mean {name} (ms; bar: its repeats)")
    ax.set_ylabel(f"simulated mean {name} (ms)")
    goal = (check.get("goals") or {}).get(key)
    handles = [ax.plot([], [], m, color="0.3", mfc="0.3" if p == "table" else "white")[0]
               for p, _, m in PREDICTORS if p in errors]
    labels = [f"{label}: MAPE {pct(errors[p].get(key))} over {errors[p].get('runs')} runs"
              for p, label, _ in PREDICTORS if p in errors]
    handles.append(ax.fill_between([], [], color="0.5", alpha=0.15))
    labels.append(f"y = x, +-{BAND:.0%}")
    ax.legend(handles, labels, loc="upper left", fontsize=9)
    noise = (errors.get("engine_vs_engine") or {}).get(key)
    ax.set_title(f"{name}: goal MAPE <= {pct(goal)}\nengine vs itself: {pct(noise)}",
                 fontsize=12)


def check_claim(check: dict) -> str:
    """Which predictors meet the MAPE goals, and whether the engine's own noise exceeds them."""
    errors, goals = check.get("errors") or {}, check.get("goals") or {}
    ran = [(label, bool(errors[p].get("meets_goals"))) for p, label, _ in PREDICTORS
           if p in errors]
    met = [label for label, ok in ran if ok]
    if met:
        text = " and ".join(met) + (" meet" if len(met) > 1 else " meets")
    elif ran:
        text = "neither simulator meets" if len(ran) > 1 else f"{ran[0][0]} does not meet"
    else:
        text = "no simulator ran: nothing meets"
    text += " the MAPE goals"
    ee = errors.get("engine_vs_engine") or {}
    over = [n for k, n in METRICS if ee.get(k) is not None and goals.get(k) is not None
            and ee[k] > goals[k]]
    if over:
        text += f"; the engine's own noise exceeds them ({', '.join(over)})"
    return text


@styled
def check_figure(result: dict):
    """Engine mean TTFT/TPOT/E2E per run against the table and roofline simulators."""
    check = result["check"]
    fig, _ = new_figure(17, 7)
    fig.clear()
    axes = fig.subplots(1, 3)
    for ax, (key, name) in zip(axes, METRICS, strict=True):
        _check_panel(ax, check, key, name)
    models = check.get("models") or []
    if models and axes[0].get_legend() is not None:  # beside the panels: it covers no run
        handles = [axes[0].plot([], [], "s", color=PALETTE[i % len(PALETTE)])[0]
                   for i in range(len(models))]
        fig.legend(handles, [m["model"] for m in models], loc="outside right upper",
                   fontsize=9, title="model (filled: table,\nhollow: roofline)",
                   title_fontsize=9, frameon=False)
    errors = check.get("errors") or {}
    fig.suptitle("Simulator vs engine, mean latency per run (model x policy x rate):\n"
                 + check_claim(check), fontsize=14)
    c = check.get("check") or {}
    ee = errors.get("engine_vs_engine")
    floor = (f"engine noise floor (two runs of one trace, {ee['runs']} traces): "
             + ", ".join(f"{n} {pct(ee.get(k))}" for k, n in METRICS) if ee else
             "engine noise floor: not measured (one engine run per trace)")
    _caption(fig, f"measured on {made_by(result.get('environment'))}; roofline "
                  f"predictor from the roofs of {check.get('peaks_machine') or 'n/a'}; "
                  f"policies {', '.join(c.get('policies') or [])}, rates "
                  f"{', '.join(f'{f:g}' for f in c.get('rate_fractions') or [])} x capacity,"
                  f" {c.get('requests')} requests per run\n{floor}")
    return fig


# ------------------------------------------------------------------ 2. scale-out

def _model_setup(m: dict) -> str:
    a = m.get("assumptions") or {}
    link = f" over {a['link']}" if a.get("link") else ""
    return (f"{m['model']}: {a.get('device')} x TP {a.get('tp')}{link}, "
            f"{_precision(a)}")


@styled
def scale_figure(result: dict):
    """Left: goodput per chip vs request rate. Right: tokens/s/chip vs tokens/s/user."""
    models = result["paper"]["scale_out"]
    fig, _ = new_figure(15, 7)
    fig.clear()
    left, right = fig.subplots(1, 2)
    for i, m in enumerate(models):
        color = PALETTE[i % len(PALETTE)]
        runs = sorted(m["runs"], key=lambda r: r["rate"])
        best = max(r["goodput_per_chip"] for r in runs)
        left.plot([r["rate"] for r in runs], [r["goodput_per_chip"] for r in runs], "o-",
                  color=color, label=f"{m['model']} (TP {m['tp']}): best {_num(best)}")
        pts = sorted(m["pareto"], key=lambda r: r["max_running"])
        right.plot([r["tokens_per_s_per_user"] for r in pts],
                   [r["tokens_per_s_per_chip"] for r in pts], "o-", color=color,
                   label=m["model"])
        for r in pts:
            right.annotate(f"{r['max_running']}", (r["tokens_per_s_per_user"],
                           r["tokens_per_s_per_chip"]), xytext=(4, 4),
                           textcoords="offset points", fontsize=8, color=color)
    left.set(xscale="log", xlabel="offered request rate (requests/s, Poisson arrivals)",
             ylabel="goodput per chip (requests/s/chip meeting both SLOs)")
    left.set_ylim(bottom=0)
    left.set_title("Goodput per chip vs request rate", fontsize=12)
    left.legend(loc="best")
    right.set(xscale="log", yscale="log", xlabel="tokens/s per user (1 / mean TPOT)",
              ylabel="output tokens/s per chip")
    _plain_log(left)
    _plain_log(right)
    right.set_title("Throughput vs interactivity (labels: batch cap, all requests at once)",
                    fontsize=12)
    right.legend(loc="best")
    mix = models[0].get("mix") or ["?", "?", "?"]
    fig.suptitle(f"Scale-out on paper (roofline bound, not measured): '{mix[0]}' mix, "
                 f"{mix[1]} prompt / {mix[2]} output tokens", fontsize=14)
    slo = "; ".join(f"{m['model']} TTFT <= {_ms(m['slo']['ttft_s'])}, TPOT <= "
                    f"{_ms(m['slo']['tpot_s'])}" for m in models)
    _caption(fig, "; ".join(_model_setup(m) for m in models) + "\nSLOs (" +
             f"{result['paper'].get('paper', {}).get('slo_scale', '?')} x unloaded): " + slo)
    return fig


# ------------------------------------------------------------------ 3. PD

def pd_winners(mix: dict) -> list[tuple[float, list[str], float]]:
    """(rate, the designs within TIE of the best goodput per chip, that best) per rate;
    no design when none meets the SLOs at all."""
    out = []
    for row in sorted(mix["rates"], key=lambda r: r["rate"]):
        best = max(d["goodput_per_chip"] for d in row["designs"])
        won = [d["design"] for d in row["designs"]
               if best > 0 and d["goodput_per_chip"] >= best * (1 - TIE)]
        out.append((row["rate"], won, best))
    return out


def pd_claim(mix: dict) -> str:
    """Which design has the most goodput per chip at which rates, e.g. '4 colocated at 1.2-
    3.4 requests/s; 1P3D at 5.1 requests/s', runs of equal winners merged."""
    groups: list[list] = []
    for rate, won, _ in pd_winners(mix):
        name = " = ".join(won) if won else "no design meets the SLOs"
        if groups and groups[-1][0] == name:
            groups[-1][2] = rate
        else:
            groups.append([name, rate, rate])
    if len(groups) == 1:
        return f"{groups[0][0]} at every rate ({_num(groups[0][1])}-{_num(groups[0][2])} " \
               "requests/s)"
    return "; ".join(f"{name} at {_num(a)}" + (f"-{_num(b)}" if b != a else "") +
                     " requests/s" for name, a, b in groups)


@styled
def pd_figure(result: dict):
    """Goodput per chip vs rate per design, one panel per prompt/output mix."""
    pd = result["paper"]["pd"]
    mixes = pd["mixes"]
    cols = min(2, len(mixes))
    rows_n = -(-len(mixes) // cols)
    fig, _ = new_figure(8.5 * cols + 1, 6.5 * rows_n + 1)
    fig.clear()
    axes = np.atleast_1d(fig.subplots(rows_n, cols)).ravel()
    for ax in axes[len(mixes):]:
        ax.set_visible(False)
    for ax, mix in zip(axes, mixes, strict=False):
        rows = sorted(mix["rates"], key=lambda r: r["rate"])
        names = list(dict.fromkeys(d["design"] for r in rows for d in r["designs"]))
        for j, name in enumerate(names):
            pts = [(r["rate"], d) for r in rows for d in r["designs"] if d["design"] == name]
            colo = pts[0][1].get("prefill") == 0
            ax.plot([x for x, _ in pts], [d["goodput_per_chip"] for _, d in pts],
                    "s--" if colo else "o-", color="0.2" if colo else PALETTE[j % 10],
                    label=f"{name} ({pts[0][1]['chips']} chips)")
        ax.set(xlabel="offered request rate (requests/s)", ylim=(0, None),
               ylabel="goodput per chip (requests/s/chip meeting both SLOs)")
        m = mix["mix"]
        ax.set_title(f"'{m[0]}': {m[1]} prompt / {m[2]} output tokens; SLOs TTFT <= "
                     f"{_ms(mix['slo']['ttft_s'])}, TPOT <= {_ms(mix['slo']['tpot_s'])}\n"
                     f"best: {pd_claim(mix)}", fontsize=11, wrap=True)
        ax.legend(loc="best")
    a = pd.get("assumptions") or {}
    fig.suptitle(f"PD disaggregation vs colocated, {pd['model']}, on paper (roofline): "
                 "goodput per chip", fontsize=14)
    _caption(fig, f"{a.get('device')} x TP {a.get('tp_per_instance')} per instance, "
                  f"{_precision(a)}; KV over {a.get('kv_link')}; {a.get('routing')} routing,"
                  f" prefill {a.get('prefill_policy')}, colocated {a.get('colocated_policy')}"
                  f"; ties within {TIE:.0%} share the win; SLOs: a multiple of one "
                  "request's TTFT and TPOT alone on one instance")
    return fig


# ------------------------------------------------------------------ 4. AFD

def _k(n: int) -> str:
    return f"{n // 1024}k" if n >= 1024 and n % 1024 == 0 else str(n)


@styled
def afd_figure(result: dict):
    """AFD's tokens/s/chip over colocated's, per model x context x batch (bars); cases no
    split of the chips holds are named in the caption."""
    rows = [r for r in result["paper"]["afd"] if r.get("fits", True) is not False]
    skipped = [r for r in result["paper"]["afd"] if r.get("fits", True) is False]
    fig, ax = new_figure(max(10, 0.6 * len(rows) + 4), 7.5)
    xs, gains = np.arange(len(rows)), [r["gain"] for r in rows]
    models = list(dict.fromkeys(r["model"] for r in rows))
    bars = ax.bar(xs, gains, color=[PALETTE[models.index(r["model"]) % 10] for r in rows],
                  hatch=None, edgecolor="0.2")
    for bar, r in zip(bars, rows, strict=True):
        if r["moe"]:
            bar.set_hatch("//")
        ax.annotate(f"{r['gain']:.2f}x\n{r['n_attn']}A:{r['n_ffn']}F", (bar.get_x() +
                    bar.get_width() / 2, r["gain"]), ha="center", va="bottom", xytext=(0, 2),
                    textcoords="offset points", fontsize=8)
    ax.axhline(1.0, color="0.2", ls="--", lw=1.2, label="colocated (gain 1)")
    ax.set_xticks(xs, [f"{r['model']}\nctx {_k(r['context'])}, B {r['batch']}" for r in rows],
                  rotation=60, ha="right", fontsize=8)
    ax.set_ylim(0, max(gains) * 1.25)
    ax.set_ylabel("AFD tokens/s/chip over colocated's")
    for m in models:
        moe = next(r["moe"] for r in rows if r["model"] == m)
        ax.bar([0], [0], color=PALETTE[models.index(m) % 10], hatch="//" if moe else None,
               edgecolor="0.2", label=f"{m} ({'MoE, hatched' if moe else 'dense'})")
    ax.legend(loc="upper left")
    wins = sum(g > 1 + TIE for g in gains)
    a = rows[0]["assumptions"]
    ax.set_title(f"Attention-FFN disaggregation vs colocated on {a.get('total')} chips, on "
                 f"paper (roofline)\nAFD ahead by more than {TIE:.0%} in {wins} of {len(rows)}"
                 f" cases (best {max(gains):.2f}x, worst {min(gains):.2f}x); labels: gain, "
                 "attention:FFN chips", fontsize=13)
    weights = dict.fromkeys(f"{r['model']} {_dtype(r['assumptions'].get('weight_dtype'))}"
                            for r in rows)
    _caption(fig, f"{a.get('attn_chip')} chips; weights {', '.join(weights)}; kv "
                  f"{_dtype(a.get('kv_dtype'))}, act {_dtype(a.get('act_dtype'))}; "
                  "activations over "
                  f"{a.get('link')}; batch B per attention chip; colocated: replicas with "
                  "tensor parallelism inside; best split and micro-batch count per case"
                  + ("; no split holds " + ", ".join(
                      f"{r['model']} ctx {_k(r['context'])} B {r['batch']}" for r in skipped)
                     if skipped else ""))
    return fig


# ------------------------------------------------------------------ 5. SRAM

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


# ------------------------------------------------------------------ drawing

def _parts(result: dict) -> list[str]:
    paper = result.get("paper") or {}
    have = {"check": bool((result.get("check") or {}).get("models")),
            "scale": bool(paper.get("scale_out")), "pd": bool((paper.get("pd") or {})
                                                               .get("mixes")),
            "afd": bool(paper.get("afd")), "sram": bool(paper.get("sram"))}
    return [k for k in FILES if have[k]]


FIGURES = {"check": check_figure, "scale": scale_figure, "pd": pd_figure, "afd": afd_figure,
           "sram": sram_figure}


def draw_simulate(result: dict, out_dir: str | Path) -> list[Path]:
    """Write the figures of the parts the result holds into out_dir; return their paths."""
    check_kind(result, "simulate")
    out_dir = Path(out_dir)
    return [save(FIGURES[k](result), out_dir / FILES[k]) for k in _parts(result)]


# ------------------------------------------------------------------ the summary

def check_summary(check: dict) -> list[str]:
    errors, goals = check.get("errors") or {}, check.get("goals") or {}
    head = ["predictor", "runs", *[f"{n} (run means)" for _, n in METRICS],
            *[f"{n} (per request)" for _, n in METRICS], "meets goals"]
    rows = [[label, errors[p].get("runs"), *[pct(errors[p].get(k)) for k, _ in METRICS],
             *[pct(errors[p].get(k.replace("_s", "_per_request"))) for k, _ in METRICS],
             "yes" if errors[p].get("meets_goals") else "no"]
            for p, label, _ in PREDICTORS if p in errors]
    rows.append(["goal", "", *[f"<= {pct(goals.get(k))}" for k, _ in METRICS], "", "", "",
                 ""])
    lines = ["## Simulator vs engine (MAPE)", "", *md_table(head, rows), ""]
    ee = errors.get("engine_vs_engine")
    lines.append("Engine noise floor (two runs of one trace, " + (
        f"{ee['runs']} traces): " + ", ".join(f"{n} {pct(ee.get(k))}" for k, n in METRICS)
        if ee else "not measured: one engine run per trace") + ".")
    by = [[m, label, *[pct(v.get(k)) for k, _ in METRICS]] for p, label, _ in PREDICTORS
          if p in errors for m, v in (errors[p].get("by_model") or {}).items()]
    if by:
        lines += ["", "Per model (run means):", "",
                  *md_table(["model", "predictor", *[n for _, n in METRICS]], sorted(by))]
    return lines


def _assume(a: dict) -> str:
    """One line of a study's assumptions: devices, parallelism, precision, links."""
    keys = ("device", "attn_chip", "sram_chip", "gpu_chip", "gpus", "tp", "tp_per_instance",
            "total", "link", "kv_link", "sram_link", "gpu_link", "weight_dtype", "kv_dtype",
            "act_dtype")
    return ", ".join(f"{k} {a[k]}" for k in keys if a.get(k) is not None)


def paper_summary(paper: dict) -> list[str]:
    lines = ["", "## On paper (roofline bounds, not measured)"]
    if paper.get("scale_out"):
        rows = [[m["model"], f"{m['assumptions'].get('device')} x {m['tp']}",
                 _num(m["capacity"]), _num(max(r["goodput_per_chip"] for r in m["runs"])),
                 _num(max(r["tokens_per_s_per_chip"] for r in m["pareto"])),
                 _num(max(r["tokens_per_s_per_user"] for r in m["pareto"]))]
                for m in paper["scale_out"]]
        lines += ["", "Scale-out ('" + paper["scale_out"][0]["mix"][0] + "' mix; "
                  + "; ".join(f"{m['model']}: {_assume(m['assumptions'])}"
                              for m in paper["scale_out"]) + "):", "", *md_table(
            ["model", "chips", "capacity (requests/s)", "best goodput/chip",
             "max tokens/s/chip", "max tokens/s/user"], rows)]
    pd = paper.get("pd") or {}
    for mix in pd.get("mixes") or []:
        m = mix["mix"]
        rows = []
        for rate, won, best in pd_winners(mix):
            row = next(r for r in mix["rates"] if r["rate"] == rate)
            colo = max((d["goodput_per_chip"] for d in row["designs"]
                        if d.get("prefill") == 0), default=None)
            rows.append([_num(rate), " = ".join(won) or "none meets the SLOs", _num(best),
                         "n/a" if colo is None else _num(colo)])
        lines += ["", f"PD, {pd['model']} ({_assume(pd.get('assumptions') or {})}), "
                  f"'{m[0]}' ({m[1]} prompt / {m[2]} output; SLOs "
                  f"TTFT <= {_ms(mix['slo']['ttft_s'])}, TPOT <= {_ms(mix['slo']['tpot_s'])})"
                  f": best {pd_claim(mix)}", "", *md_table(
                      ["rate (requests/s)", "best design", "goodput/chip",
                       "best colocated goodput/chip"], rows)]
    if paper.get("afd"):
        rows = [[r["model"], "MoE" if r["moe"] else "dense",
                 (r.get("assumptions") or {}).get("weight_dtype", "-"), r["context"],
                 r["batch"], f"{r['n_attn']}:{r['n_ffn']}", f"{r['gain']:.2f}x"]
                if r.get("fits", True) is not False else
                [r["model"], "MoE" if r.get("moe") else "dense", "-", r["context"],
                 r["batch"], "none fits", "-"] for r in paper["afd"]]
        a = next((r["assumptions"] for r in paper["afd"] if r.get("assumptions")), {})
        a = {k: v for k, v in a.items() if k != "weight_dtype"}  # per row: its own column
        lines += ["", f"AFD vs colocated (tokens/s/chip ratio; {_assume(a)}):", "", *md_table(
            ["model", "FFN", "weights", "context", "batch/attention chip",
             "attention:FFN chips", "gain"], rows)]
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


def simulate_summary(result: dict) -> str:
    """Markdown: the MAPE table, the engine noise floor, per-model MAPE, then the paper
    parts' short tables; numbers from the JSON only."""
    lines = [f"# simulate on {machine_name(result.get('environment'))}"]
    if (result.get("check") or {}).get("models"):
        lines += ["", *check_summary(result["check"])]
    if result.get("paper"):
        lines += paper_summary(result["paper"])
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    return redraw_main(argv, "simulate", draw_simulate, simulate_summary)


if __name__ == "__main__":
    raise SystemExit(main())
