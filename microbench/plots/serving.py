"""The serving figures, drawn only from a saved serve result (serve.json, `python -m microbench
serve`): per-request latency CDFs, steady-state goodput and SLO attainment against the offered
rate, what the radix (prefix) cache and the pool size change, and the pool's pages over time.

Every title and note states what the plotted numbers show, computed here from the JSON (the
result's `claims` where it has them, else the runs); nothing names a winner or a number the
data does not carry. Imports matplotlib, numpy and microbench.plots.common only (no JAX):
`python -m microbench.plots.serving serve.json [out_dir]` redraws a saved result.
"""

from __future__ import annotations

import textwrap
from pathlib import Path

import numpy as np
from matplotlib.figure import Figure

from microbench import machines
from microbench.plots.common import (
    PALETTE,
    made_by,
    new_figure,
    plain_log,
    redraw_main,
    save,
    styled,
)

FILES = ("serve_latency_cdf.png", "serve_goodput.png", "serve_prefix_cache.png",
         "serve_pool_timeline.png")
NOTE = {"ha": "center", "va": "center", "fontsize": 11, "color": "0.35", "wrap": True}
PEER = "hf static"


# ------------------------------------------------------------------ reading the result

def _runs(result: dict) -> list[dict]:
    """The result's runs, checked: a non-empty list of dicts, each naming its experiment."""
    if not isinstance(result, dict):
        raise ValueError(f"serve result must be a dict with 'runs', got {type(result).__name__}")
    runs = result.get("runs")
    if not isinstance(runs, list) or not runs:
        raise ValueError(f"serve result has no usable 'runs': expected a non-empty list, got "
                         f"{runs!r:.60}")
    for i, run in enumerate(runs):
        if not isinstance(run, dict) or "experiment" not in run or "rate" not in run:
            raise ValueError(f"serve result 'runs'[{i}] is malformed: each run needs "
                             "'experiment' and 'rate'")
    return runs


def _find(runs: list[dict], **kw) -> list[dict]:
    return [r for r in runs if all(r.get(k) == v for k, v in kw.items())]


def _policies(runs: list[dict]) -> list[str]:
    """Policies of the policy runs, in the order they first appear."""
    return list(dict.fromkeys(r.get("policy") for r in _find(runs, experiment="policy")))


def _color(policies: list[str], policy: str):
    return PALETTE[policies.index(policy) % len(PALETTE)] if policy in policies else "0.25"


def _window(run: dict) -> dict:
    """The run's steady-state window numbers (metrics.steady), else its whole-run summary."""
    return run.get("steady") or run.get("summary") or {}


def _saturation(result: dict) -> float | None:
    return (result.get("saturation") or {}).get("requests_per_s")


def _target(result: dict) -> float:
    return (result.get("setup") or {}).get("attainment_target") or 0.9


def _shared_rates(runs: list[dict]) -> list[float]:
    """The rates at which every policy ran, ascending."""
    by_policy: dict[str, set] = {}
    for r in _find(runs, experiment="policy"):
        by_policy.setdefault(r.get("policy"), set()).add(r["rate"])
    return sorted(set.intersection(*by_policy.values())) if by_policy else []


def _prefix_pair(runs: list[dict]):
    """(run with the radix cache, run without) at one rate; either may be None."""
    on = next(iter(_find(runs, experiment="prefix cache on")), None)
    off = next(iter(_find(runs, experiment="prefix cache off")), None)
    return on, off


def _mean_ttft(run: dict) -> float | None:
    value = run.get("mean_ttft_s")
    return value if value is not None else run.get("summary", {}).get("ttft_s", {}).get("mean")


def _latencies(run: dict, key: str) -> np.ndarray:
    values = [q.get(key) for q in run.get("requests") or []]
    return np.array([v for v in values if v is not None], dtype=float)


def machine_name(env: dict | None) -> str:
    """The machine a summary's heading names (machines.describe: CPU, microarchitecture,
    cores; the accelerator when there is one)."""
    return machines.describe(env)


def footer_text(result: dict) -> str:
    model = result.get("model") or {}
    parts = [str(model.get("preset") or result.get("setup", {}).get("model") or "model ?")]
    detail = ", ".join(str(x) for x in (model.get("label"), model.get("dtype")) if x)
    if model.get("params"):
        detail += f"{', ' if detail else ''}{model['params']:,} params"
    if detail:
        parts.append(f"({detail})")
    return f"{' '.join(parts)} on {made_by(result.get('environment'))}"


def _footer(fig, result: dict) -> None:
    fig.get_layout_engine().set(rect=(0, 0.035, 1, 0.965))
    fig.text(0.01, 0.008, footer_text(result), fontsize=9, color="0.35", ha="left",
             va="bottom")


def _ms(seconds: float) -> str:
    return f"{_num(seconds * 1e3)} ms"


def _num(value: float) -> str:
    """1212.06 -> '1,212'; 2.4567 -> '2.46': no exponents in titles."""
    return f"{value:,.0f}" if abs(value) >= 100 else f"{value:.3g}"


def _rate(rate: float) -> str:
    return f"{_num(rate)} requests/s"


def _at(rate: float, result: dict) -> str:
    """'29.3 requests/s (0.75x the measured saturation)'."""
    sat = _saturation(result)
    return _rate(rate) + (f" ({rate / sat:.2g}x the measured saturation)" if sat else "")


def _note(ax, text: str, empty: bool = True) -> None:
    """A grey note: centred in an empty panel (ticks removed), else in its lower right."""
    if empty:
        ax.set_xticks([])
        ax.set_yticks([])
        ax.text(0.5, 0.5, text, transform=ax.transAxes, **NOTE)
    else:
        ax.text(0.98, 0.03, text, transform=ax.transAxes, **{**NOTE, "ha": "right",
                "va": "bottom", "fontsize": 10},
                bbox={"facecolor": "white", "edgecolor": "0.8", "alpha": 0.9})


# ------------------------------------------------------------------ what the data say

def slo_text(result: dict) -> str:
    """'SLOs, the same for every policy: TTFT <= 190 ms, TPOT <= 12.4 ms (5 x one request
    alone on small: 276-token prompt, 42 tokens out)'."""
    slo = result.get("slo") or {}
    if not (slo.get("ttft_s") and slo.get("tpot_s")):
        return "no SLOs recorded"
    text = f"SLOs for every policy: TTFT <= {_ms(slo['ttft_s'])}, TPOT <= {_ms(slo['tpot_s'])}"
    ref = slo.get("reference") or {}
    if slo.get("scale") and ref:
        text += (f" ({slo['scale']:g} x one request alone on {ref.get('model')}: "
                 f"{ref.get('prompt')}-token prompt, {ref.get('output')} tokens out)")
    return text


def max_rates(result: dict) -> dict[str, float | None]:
    """Per policy (and peer), the highest swept rate whose steady-state SLO attainment is at
    the target or above (None: no swept rate)."""
    claims = (result.get("claims") or {}).get("max_rate_at_target")
    if claims is not None:
        return claims
    target, out = _target(result), {}
    for r in _runs(result):
        if r["experiment"] in ("policy", "peer"):
            ok = _window(r).get("slo_attainment", 0) >= target
            best = out.get(r["policy"])
            out[r["policy"]] = max(best or 0, r["rate"]) if ok else best
    return out


def goodput_verdict(result: dict) -> str:
    """The goodput figure's title: which policies sustain which rate at the attainment
    target, grouped, highest first, each also as a multiple of the measured saturation."""
    best, target = max_rates(result), _target(result)
    if not best:
        return "Goodput against offered request rate (no policy runs)"
    if all(v is None for v in best.values()):
        return f"No policy kept {target:.0%} of requests within the SLOs at any swept rate"
    sat = _saturation(result)
    groups: dict = {}
    for policy, rate in best.items():
        groups.setdefault(rate, []).append(policy)
    parts = []
    for rate in sorted(groups, key=lambda x: -1 if x is None else x, reverse=True):
        who = ", ".join(groups[rate])
        if rate is None:
            parts.append(f"{who} at none")
        else:
            parts.append(f"{who} {_num(rate)}" + (f" ({rate / sat:.2g}x)" if sat else ""))
    drift = drift_text(result)
    return (f"Highest swept rate with >= {target:.0%} SLO attainment (requests/s, x the "
            f"measured saturation):\n" + textwrap.fill("; ".join(parts), 110)
            + (f"\n{drift}" if drift else ""))


def drift_text(result: dict) -> str:
    """'' when the saturation measured after the sweep is within 15% of the one before it,
    else a clause saying by how much the machine's speed drifted during the sweep."""
    before = _saturation(result)
    after = (result.get("saturation_after") or {}).get("requests_per_s")
    if not before or not after or abs(after / before - 1) <= 0.15:
        return ""
    return (f"(saturation {_num(before)} requests/s before the sweep, {_num(after)} after "
            "it: the machine's speed drifted during the sweep)")


# ------------------------------------------------------------------ the four figures

@styled
def latency_cdf_figure(result: dict):
    """Empirical CDFs of per-request TTFT and TPOT, one line per policy, at the highest rate
    every policy ran below the measured saturation (else the lowest shared rate)."""
    runs = _runs(result)
    policies = _policies(runs)
    shared = _shared_rates(runs)
    sat = _saturation(result)
    below = [x for x in shared if sat is None or x < sat]
    rate = max(below) if below else (min(shared) if shared else None)
    fig, _ = new_figure(13, 7.5)
    fig.clear()
    axes = fig.subplots(1, 2)
    slo = result.get("slo") or {}
    if rate is None:
        fig.suptitle("Per-request latency CDFs")
        for ax in axes:
            _note(ax, "no policy runs at a rate shared by every policy")
        _footer(fig, result)
        return fig
    chosen = [r for r in _find(runs, experiment="policy") if r["rate"] == rate]
    which = "the highest rate below saturation that every policy ran" if below else \
        "the lowest rate every policy ran"
    fig.suptitle(f"Per-request latency at {_at(rate, result)}, {which}"
                 + ("\n(only one policy ran: nothing to compare)" if len(policies) < 2 else ""))
    for ax, key, name in ((axes[0], "ttft_s", "TTFT"), (axes[1], "tpot_s", "TPOT")):
        drawn = False
        for run in chosen:
            values = _latencies(run, key)
            values = values[values > 0]
            if values.size == 0:
                continue
            xs = np.sort(values) * 1e3
            ys = np.arange(1, xs.size + 1) / xs.size
            label = f"{run.get('policy')} (n={xs.size}"
            if slo.get(key):
                met = int(np.sum(values <= slo[key]))
                label += f", {met}/{xs.size} within SLO"
            ax.step(np.r_[xs[0], xs], np.r_[0, ys], where="post", label=label + ")",
                    color=_color(policies, run.get("policy")))
            drawn = True
        if slo.get(key):
            ax.axvline(slo[key] * 1e3, color="0.25", ls="--", lw=1.4,
                       label=f"SLO {_ms(slo[key])}")
        if not drawn:
            _note(ax, f"no per-request {name} recorded")
        else:
            ax.set_xscale("log")
            plain_log(ax)
        ax.set_ylim(0, 1.02)
        ax.set_xlabel(f"{name} per request (ms, log scale)")
        ax.set_ylabel("fraction of requests at or below")
        ax.set_title(name + (" (time to first token)" if key == "ttft_s"
                             else " (time per output token)"), fontsize=12)
        # below the axes: a CDF runs corner to corner, so no corner inside is free of it
        ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.14), ncols=2, fontsize=9,
                  frameon=False)
    _footer(fig, result)
    return fig


def _series(runs: list[dict], experiment: str, policy: str, key: str) -> list[tuple]:
    pts = sorted((r["rate"], _window(r).get(key)) for r in
                 _find(runs, experiment=experiment, policy=policy))
    return [(x, y) for x, y in pts if y is not None]


def _goodput_lines(left, right, runs: list[dict], lines: list[tuple]) -> float:
    """Each policy's (and the peer's) goodput on `left`, attainment on `right`; returns the
    largest rate or goodput drawn (0 when nothing was)."""
    top = 0.0
    for policy, experiment, style, color in lines:
        label = policy
        if experiment == "peer":
            n = {r["summary"].get("requests") for r in _find(runs, experiment="peer")
                 if r.get("summary")}
            label += f" (transformers generate, {n.pop()} requests)" if len(n) == 1 \
                else " (transformers generate)"
        good = _series(runs, experiment, policy, "goodput_requests_per_s")
        att = _series(runs, experiment, policy, "slo_attainment")
        if good:
            xs, ys = zip(*good, strict=True)
            top = max(top, *xs, *ys)
            left.plot(xs, ys, style, color=color, label=label)
        if att:
            xs, ys = zip(*att, strict=True)
            right.plot(xs, [100 * y for y in ys], style, color=color, label=label)
    return top


@styled
def goodput_figure(result: dict):
    """Left: steady-state goodput against the offered rate; right: steady-state SLO
    attainment; one line per policy (and the peer), the measured saturation marked."""
    runs = _runs(result)
    policies = _policies(runs)
    fig, _ = new_figure(15, 7.5)
    fig.clear()
    left, right = fig.subplots(1, 2)
    lines = [(p, "policy", "o-", _color(policies, p)) for p in policies]
    lines += [(p, "peer", "s--", "0.25") for p in
              dict.fromkeys(r.get("policy") for r in _find(runs, experiment="peer"))]
    top = _goodput_lines(left, right, runs, lines)
    fig.suptitle(goodput_verdict(result) + "\n" + slo_text(result), fontsize=13)
    if top == 0:
        _note(left, "no policy runs with a goodput")
        _note(right, "no policy runs with an attainment")
        _footer(fig, result)
        return fig
    sat, target = _saturation(result), _target(result)
    after = (result.get("saturation_after") or {}).get("requests_per_s")
    top = max(top, after or 0)
    left.plot([0, top * 1.05], [0, top * 1.05], ":", color="0.4", lw=1.4,
              label="offered rate (all within SLOs)")
    right.axhline(100 * target, color="0.3", ls="--", lw=1.2, label=f"target {target:.0%}")
    for ax in (left, right):
        if sat:
            ax.axvline(sat, color="0.55", lw=1.2, ls="-.",
                       label=f"measured saturation {_rate(sat)}")
        if after and sat and abs(after / sat - 1) > 0.15:
            ax.axvline(after, color="0.55", lw=1.0, ls=":",
                       label=f"the same, after the sweep: {_rate(after)}")
        ax.set_xlim(0, top * 1.05)
        ax.set_xlabel("offered request rate (requests/s, Poisson arrivals)")
    left.set_ylim(-0.03 * top, top * 1.05)  # a goodput of 0 drawn whole, not on the edge
    window = (result.get("setup") or {}).get("trim")
    where = f"the first and last {window:.0%} of arrivals left out" if window is not None \
        else "steady-state window"
    left.set_title(f"Goodput ({where});\npast saturation the queue grows through the window: "
                   "no steady state", fontsize=12)
    right.set_title("SLO attainment (the same requests)", fontsize=12)
    left.set_ylabel("goodput (requests/s meeting both SLOs)")
    right.set_ylabel("requests meeting both SLOs (%)")
    left.legend(loc="upper left", fontsize=9)  # goodput <= offered rate: that corner is free
    # attainment sits near 100% up to the knee: the legend goes below the axes
    right.legend(loc="upper center", bbox_to_anchor=(0.5, -0.12), fontsize=9, ncols=2,
                 frameon=False)
    right.set_ylim(-3, 105)
    if len(policies) < 2:
        _note(left, "only one policy ran: nothing to compare", empty=False)
    _footer(fig, result)
    return fig


def prefix_title(result: dict) -> str:
    """The prefix-cache panel's title: the matched rate, TTFT with and without, prefill tokens
    saved, and whether both runs were below saturation (their attainments)."""
    claim = (result.get("claims") or {}).get("prefix_cache")
    on, off = _prefix_pair(_runs(result))
    if claim is None and on and off:
        claim = {"rate": on["rate"], "mean_ttft_on_s": _mean_ttft(on),
                 "mean_ttft_off_s": _mean_ttft(off),
                 "prefill_tokens_on": on.get("prefill_tokens"),
                 "prefill_tokens_off": off.get("prefill_tokens"),
                 "attainment_on": _window(on).get("slo_attainment"),
                 "attainment_off": _window(off).get("slo_attainment")}
        att = [claim["attainment_on"], claim["attainment_off"]]
        claim["both_unsaturated"] = None not in att and min(att) >= _target(result)
    if not claim or not claim.get("mean_ttft_on_s"):
        return "Mean TTFT with and without the radix cache"
    t_on, t_off = claim["mean_ttft_on_s"], claim["mean_ttft_off_s"]
    sat_off = (result.get("saturation_no_cache") or {}).get("requests_per_s")
    at = _rate(claim["rate"]) + (f" ({claim['rate'] / sat_off:.2g}x the cache-off saturation)"
                                 if sat_off else "")
    text = (f"Same trace at {at}: mean TTFT {_ms(t_on)} with the cache, "
            f"{_ms(t_off)} without ({t_off / t_on:.2g}x)")
    a, b = claim.get("prefill_tokens_on"), claim.get("prefill_tokens_off")
    if a is not None and b:
        text += f"\nprefill tokens computed: {a:,} with, {b:,} without ({1 - a / b:.0%} saved)"
    att = (claim.get("attainment_on"), claim.get("attainment_off"))
    if None not in att:
        state = "both below saturation" if claim.get("both_unsaturated") else \
            "NOT both below saturation: queueing is in the ratio"
        text += (f"\nSLO attainment {att[0]:.0%} with, {att[1]:.0%} without (target "
                 f"{_target(result):.0%}): {state}")
    return text


@styled
def prefix_cache_figure(result: dict):
    """Left: mean TTFT with and without the radix cache at one unsaturated rate (the title
    says whether both runs were). Right: hit rate (all admissions and first admissions alone)
    and preemptions by pool size; below it, what readmissions after preemption add."""
    runs = _runs(result)
    fig = Figure(figsize=(15, 8.5), layout="constrained")
    axes = fig.subplot_mosaic([["ttft", "pool"], ["ttft", "note"]],
                              height_ratios=[3.2, 1])
    left, note = axes["ttft"], axes["note"]
    on, off = _prefix_pair(runs)
    left.set_title("Mean TTFT, one trace with and without the radix cache", fontsize=12)
    if on is None or off is None or not _mean_ttft(on) or not _mean_ttft(off):
        _note(left, "needs a 'prefix cache on' and a 'prefix cache off' run")
    else:
        t_on, t_off = _mean_ttft(on) * 1e3, _mean_ttft(off) * 1e3
        bars = left.bar([0, 1], [t_on, t_off], color=[PALETTE[0], "0.6"], width=0.6)
        left.set_xticks([0, 1], ["radix cache on", "radix cache off"])
        for bar, run, t in zip(bars, (on, off), (t_on, t_off), strict=True):
            hit = run.get("hit_rate")
            text = f"{_num(t)} ms" + (f"\nhit rate {hit:.0%}" if hit is not None else "")
            left.annotate(text, (bar.get_x() + bar.get_width() / 2, t), ha="center",
                          va="bottom", xytext=(0, 3), textcoords="offset points", fontsize=10)
        left.set_ylim(0, max(t_on, t_off) * 1.25)
        left.set_ylabel("mean TTFT (ms)")
        left.grid(axis="x", visible=False)
    handles = _pool_panel(axes["pool"], runs, result)
    note.axis("off")
    if handles:
        note.legend(*handles, loc="upper left", ncols=3, fontsize=9, frameon=False)
    text = readmission_note(result)
    if text:
        note.text(0.0, 0.55, textwrap.fill(text, 95), transform=note.transAxes, fontsize=9.5,
                  color="0.2", va="top", ha="left")
    fig.suptitle(prefix_title(result), fontsize=13)
    _footer(fig, result)
    return fig


def readmission_note(result: dict) -> str | None:
    """What readmissions after preemption do to the smallest pool's hit rate, from its counts:
    the tokens they bring back (prompt and output so far), how many of those the radix cache
    still holds (past the shared system prompt: the request's own prompt pages, cached when
    its first prefill ended), and the hit rate with and without them. None: no pool runs."""
    runs = _runs(result)
    pool = [r for r in _find(runs, experiment="pool") if r.get("num_pages")]
    if not pool:
        return None
    r = min(pool, key=lambda x: x["num_pages"])
    if not r.get("readmissions"):
        return f"{r['num_pages']} pages: no request was readmitted after a preemption"
    setup = result.get("setup") or {}
    page = setup.get("page_size") or 1
    system = (setup.get("system_len") or 0) // page * page
    hits, tokens, n = r["readmit_hit_tokens"], r["readmit_tokens"], r["readmissions"]
    own = hits - n * system
    text = (f"At {r['num_pages']} pages, {n} readmissions after preemption brought back "
            f"{tokens:,} tokens (prompt and output so far); {hits:,} ({hits / tokens:.0%}) were "
            "cache hits")
    if own > 0:
        text += (f", {own:,} of them past the shared system prompt: the requests' own prompt "
                 "pages, cached when their first prefill ended")
    first, both = r.get("first_admission_hit_rate"), r.get("hit_rate")
    if first is not None and both is not None:
        move = "raise" if both > first + 0.005 else "lower" if both < first - 0.005 \
            else "leave"
        text += (f". First admissions alone hit {first:.1%} of their tokens; readmissions "
                 f"{move} the hit rate to {both:.1%}")
    return text + "."


def _pool_panel(ax, runs: list[dict], result: dict):
    """Hit rates and preemptions against pool size; returns the (handles, labels) of its two
    axes for a legend drawn elsewhere (None when there is nothing to draw)."""
    pool = _find(runs, experiment="pool")
    ax.set_title("Hit rate and preemptions against pool size", fontsize=12)
    if not pool:
        _note(ax, "no pool runs in this result")
        return None
    rate, policy = pool[0]["rate"], pool[0].get("policy")
    points = {r["num_pages"]: r for r in pool if r.get("num_pages") is not None}
    # the policy run with the full pool at the same rate and policy, when it ran
    full = next(iter(_find(runs, experiment="policy", policy=policy, rate=rate)), None)
    if full is not None and full.get("num_pages") is not None:
        points.setdefault(full["num_pages"], full)
    if not points:
        _note(ax, "pool runs record no num_pages")
        return None
    pages = sorted(points)
    hits = [points[p].get("hit_rate") for p in pages]
    first = [points[p].get("first_admission_hit_rate") for p in pages]
    pre = [points[p].get("preemptions") or 0 for p in pages]
    ax.plot(pages, [h if h is not None else np.nan for h in hits], "o-", color=PALETTE[0],
            label="hit rate, all admissions (left axis)")
    if any(f is not None for f in first):
        ax.plot(pages, [f if f is not None else np.nan for f in first], "^:", color=PALETTE[2],
                label="hit rate, first admissions only (left axis)")
    ax.set_ylim(-0.03, 1.05)
    ax.set_ylabel("hit rate (cached share of tokens admitted)")
    ax.set_xlabel(f"pool size (pages), {policy} at {_at(rate, result)}")
    twin = ax.twinx()
    twin.plot(pages, pre, "s--", color=PALETTE[3], label="preemptions (right axis)")
    top = max(max(pre) * 1.15, 1)
    twin.set_ylim(-0.03 * top, top)
    twin.set_ylabel("preemptions")
    twin.grid(False)
    if len(pages) < 2:
        _note(ax, "one pool size only: no trend to show", empty=False)
    lines, more = ax.get_legend_handles_labels(), twin.get_legend_handles_labels()
    return lines[0] + more[0], lines[1] + more[1]


@styled
def pool_timeline_figure(result: dict):
    """Used and cached pages over time for the mixed policy at the pool experiment's rate
    (else its highest rate)."""
    runs = _runs(result)
    fig, ax = new_figure(12, 6.5)
    policy_runs = _find(runs, experiment="policy")
    mixed = _find(policy_runs, policy="mixed") or policy_runs
    pool = _find(runs, experiment="pool")
    at = [r for r in mixed if pool and r["rate"] == pool[0]["rate"]]
    run = at[0] if at else (max(mixed, key=lambda r: r["rate"]) if mixed else None)
    if run is None or not run.get("usage"):
        ax.set_title("Pool pages over time")
        _note(ax, "no policy run with a recorded pool usage")
        _footer(fig, result)
        return fig
    usage = np.asarray(run["usage"], dtype=float).reshape(-1, 3)
    t, used, cached = usage[:, 0] * 1e3, usage[:, 1], usage[:, 2]
    ax.fill_between(t, 0, used, step="post", color=PALETTE[0], alpha=0.75,
                    label="used: referenced by running requests")
    ax.fill_between(t, used, used + cached, step="post", color=PALETTE[1], alpha=0.55,
                    label="cached: free to evict, kept for prefix reuse")
    ax.step(t, used + cached, where="post", color="0.25", lw=1.0)
    n = run.get("num_pages")
    if n:
        ax.axhline(n, color="0.2", ls="--", lw=1.4, label=f"pool size: {n} pages")
        ax.set_ylim(0, n * 1.4)
    util = run.get("utilization") or {}
    bits = []
    if util.get("used") is not None:
        bits.append(f"time-weighted mean used {util['used']:.0%}")
    if util.get("held") is not None:
        bits.append(f"used + cached {util['held']:.0%} of the pool")
    if run.get("preemptions") is not None:
        bits.append(f"{run['preemptions']} preemptions")
    ax.set_title(f"Pool pages over time, {run.get('policy')} at {_at(run['rate'], result)}"
                 + ("\n" + ", ".join(bits) if bits else ""), fontsize=13)
    ax.set_xlabel("time on the run's clock (ms; the first request arrives at 0)")
    ax.set_ylabel("pages")
    ax.set_xlim(0, t.max() if t.size else 1)
    ax.legend(loc="upper left")
    _footer(fig, result)
    return fig


FIGURES = dict(zip(FILES, (latency_cdf_figure, goodput_figure, prefix_cache_figure,
                           pool_timeline_figure), strict=True))


def draw_serving(result: dict, out_dir: str | Path) -> list[Path]:
    """Write the four serving figures into out_dir; return their paths (in FILES order)."""
    _runs(result)
    out_dir = Path(out_dir)
    return [save(figure(result), out_dir / name) for name, figure in FIGURES.items()]


# ------------------------------------------------------------------ the summary table

def _x(value) -> str:
    return "n/a" if value is None else f"{value:.2f}x"


def serving_summary(result: dict) -> str:
    """The serve claims as Markdown, numbers from the JSON only."""
    runs = _runs(result)
    claims = result.get("claims") or {}
    lines = [f"# serving on {machine_name(result.get('environment'))}", "",
             "| claim | measured |", "|---|---|"]
    decode = result.get("decode") or {}
    ratio = claims.get("decode_engine_over_phases", decode.get("ratio"))
    where = ", ".join(f"{k} {decode[k]}" for k in ("batch", "context", "kernels")
                      if k in decode)
    tps = ""
    if decode.get("engine_tokens_per_s") and decode.get("phases_tokens_per_s"):
        tps = (f" ({_num(decode['engine_tokens_per_s'])} vs "
               f"{_num(decode['phases_tokens_per_s'])} tokens/s)")
    lines.append(f"| decode step, engine / Phases tokens/s{f' ({where})' if where else ''} "
                 f"| {_x(ratio)}{tps} |")
    xla = decode.get("xla")
    if xla and xla.get("ratio") is not None:
        lines.append(f"| the same on XLA's path (a view gathered per layer) | "
                     f"{_x(xla['ratio'])} |")
    sat = _saturation(result)
    if sat:
        s = result["saturation"]
        runs_ = s.get("runs_requests_per_s") or []
        each = f" (runs: {', '.join(_num(x) for x in runs_)})" if len(runs_) > 1 else ""
        lines.append(f"| saturation: {s.get('policy')}, {s.get('requests')} requests queued "
                     f"at once, median of {max(1, len(runs_))} runs | {_rate(sat)}{each} |")
        after = (result.get("saturation_after") or {}).get("requests_per_s")
        if after:
            lines.append(f"| the same, measured again after the sweep | {_rate(after)} |")
    lines.append(f"| SLOs | {slo_text(result)} |")
    lines.append(f"| prefix cache at matched load | {' '.join(prefix_title(result).split())} |")
    note = readmission_note(result)
    if note:
        lines.append(f"| hit rate at the smallest pool | {note} |")
    lines += ["", goodput_verdict(result).replace("\n", " "), ""]
    rows = claims.get("by_rate")
    if rows is None:
        by_rate: dict[float, dict] = {}
        for r in _find(runs, experiment="policy") + _find(runs, experiment="peer"):
            w = _window(r)
            by_rate.setdefault(r["rate"], {"rate": r["rate"]})[r.get("policy")] = \
                {"goodput": w.get("goodput_requests_per_s"),
                 "attainment": w.get("slo_attainment")}
        rows = [by_rate[k] for k in sorted(by_rate)]
    policies = list(dict.fromkeys(k for row in rows for k in row
                                  if k not in ("rate", "rate_fraction")))
    if rows and policies:
        lines += ["Steady-state goodput in requests/s (SLO attainment):", "",
                  "| offered rate (requests/s) | " + " | ".join(policies) + " |",
                  "|---|" + "---|" * len(policies)]
        for row in rows:
            cells = []
            for p in policies:
                cell = row.get(p) or {}
                g, a = cell.get("goodput"), cell.get("attainment")
                cells.append("n/a" if g is None else
                             _num(g) + (f" ({a:.0%})" if a is not None else ""))
            lines.append(f"| {_num(row['rate'])} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    return redraw_main(argv, "serving", draw_serving, serving_summary)


if __name__ == "__main__":
    raise SystemExit(main())
