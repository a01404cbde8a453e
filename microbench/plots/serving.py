"""The serving figures, drawn only from a saved serve result (serve.json, `python -m microbench
serve`): per-request latency CDFs, goodput against the offered request rate, what the radix
(prefix) cache and the pool size change, and the pool's pages over time.

Every title and note states what the plotted numbers show, computed here from the JSON; nothing
is claimed that the data does not carry. Imports matplotlib, numpy and microbench.plots.common
only (no JAX): `python -m microbench.plots.serving serve.json [out_dir]` redraws a saved result.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
from matplotlib.ticker import FuncFormatter

from microbench.plots.common import PALETTE, made_by, new_figure, redraw_main, save, styled

FILES = ("serve_latency_cdf.png", "serve_goodput.png", "serve_prefix_cache.png",
         "serve_pool_timeline.png")
NOTE = {"ha": "center", "va": "center", "fontsize": 11, "color": "0.35", "wrap": True}


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
    return PALETTE[policies.index(policy) % len(PALETTE)] if policy in policies else "0.4"


def _common_top_rate(runs: list[dict]) -> float | None:
    """The highest rate at which every policy ran (None if no rate is shared)."""
    policy_runs = _find(runs, experiment="policy")
    by_policy: dict[str, set] = {}
    for r in policy_runs:
        by_policy.setdefault(r.get("policy"), set()).add(r["rate"])
    shared = set.intersection(*by_policy.values()) if by_policy else set()
    return max(shared) if shared else None


def _prefix_pair(runs: list[dict]):
    """(run with the radix cache, run without), same policy and rate; either may be None."""
    off = next(iter(_find(runs, experiment="prefix cache off")), None)
    if off is None:
        return None, None
    on = next(iter(_find(runs, experiment="policy", policy=off.get("policy"),
                         rate=off["rate"])), None)
    return on, off


def _mean_ttft(run: dict) -> float | None:
    value = run.get("mean_ttft_s")
    return value if value is not None else run.get("summary", {}).get("ttft_s", {}).get("mean")


def _latencies(run: dict, key: str) -> np.ndarray:
    values = [q.get(key) for q in run.get("requests") or []]
    return np.array([v for v in values if v is not None], dtype=float)


def machine_name(env: dict | None) -> str:
    env = env or {}
    name = env.get("cpu_model") or env.get("device_kind")
    if not name:
        return "machine not recorded"
    n = env.get("cpu_count")
    return f"{name} ({n} CPUs)" if n and env.get("backend") == "cpu" else name


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


def _plain_log_ticks(ax) -> None:
    """Log x tick labels as plain numbers (3, 10, 20), not 3x10^0;
    over more than ~1.5 decades only minor ticks at 2 and 5 are labelled (no collisions)."""
    lo, hi = ax.get_xlim()
    wide = hi / max(lo, 1e-300) > 30

    def minor(v, _):
        lead = round(v / 10 ** np.floor(np.log10(v)))
        return f"{v:g}" if not wide or lead in (2, 5) else ""

    ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    ax.xaxis.set_minor_formatter(FuncFormatter(minor))


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


# ------------------------------------------------------------------ the four figures

@styled
def latency_cdf_figure(result: dict):
    """Empirical CDFs of per-request TTFT and TPOT, one line per policy, at one shared rate."""
    runs = _runs(result)
    policies = _policies(runs)
    rate = _common_top_rate(runs)
    fig, _ = new_figure(13, 6.5)
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
    frac = chosen[0].get("rate_fraction")
    at = f"{_rate(rate)}" + (f" ({frac:g} x estimated capacity)" if frac is not None else "")
    fig.suptitle(f"Per-request latency at {at}, the highest rate every policy ran"
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
            _plain_log_ticks(ax)
        ax.set_ylim(0, 1.02)
        ax.set_xlabel(f"{name} per request (ms, log scale)")
        ax.set_ylabel("fraction of requests at or below")
        ax.set_title(name + (" (time to first token)" if key == "ttft_s"
                             else " (time per output token)"), fontsize=12)
        ax.legend(loc="best")
    _footer(fig, result)
    return fig


@styled
def goodput_figure(result: dict):
    """Goodput (requests/s meeting both SLOs) against the offered rate, one line per policy."""
    runs = _runs(result)
    policies = _policies(runs)
    fig, ax = new_figure(11, 7)
    slo = result.get("slo") or {}
    scale = (result.get("setup") or {}).get("slo_scale")
    sub = []
    if slo.get("ttft_s") and slo.get("tpot_s"):
        sub.append(f"SLOs: TTFT <= {_ms(slo['ttft_s'])}, TPOT <= {_ms(slo['tpot_s'])}")
    if scale is not None:
        sub.append(f"{scale:g} x the unloaded latency")
    ax.set_title("Goodput against offered request rate"
                 + ("\n" + " (".join(sub) + (")" if len(sub) == 2 else "") if sub else ""),
                 fontsize=13)
    top = 0.0
    for policy in policies:
        pts = sorted((r["rate"], r.get("summary", {}).get("goodput_requests_per_s"))
                     for r in _find(runs, experiment="policy", policy=policy))
        pts = [(x, y) for x, y in pts if y is not None]
        if not pts:
            continue
        xs, ys = zip(*pts, strict=True)
        top = max(top, *xs, *ys)
        ax.plot(xs, ys, "o-", color=_color(policies, policy), label=policy)
    peers = {}
    for r in _find(runs, experiment="peer"):
        y = r.get("summary", {}).get("goodput_requests_per_s")
        if y is not None:
            peers.setdefault(r.get("policy", "peer"), []).append((r["rate"], y))
    for name, pts in peers.items():
        xs, ys = zip(*sorted(pts), strict=True)
        top = max(top, *xs, *ys)
        ax.plot(xs, ys, "s--", color="0.25", label=f"{name} (transformers generate, same "
                "trace and SLOs)")
    if top == 0:
        _note(ax, "no policy runs with a goodput")
    else:
        ax.plot([0, top * 1.05], [0, top * 1.05], ":", color="0.3", lw=1.4,
                label="offered rate (goodput counts per second of the whole run, first "
                      "arrival to last token:\nbelow this even when every request meets "
                      "the SLOs)")
        cap = result.get("capacity_requests_per_s")
        if cap and cap <= top * 1.05:
            ax.axvline(cap, color="0.6", lw=1.0, ls="-.",
                       label=f"estimated capacity {_rate(cap)} (max_running / unloaded e2e)")
        ax.set_xlim(0, top * 1.05)
        ax.set_ylim(0, top * 1.05)
        ax.legend(loc="upper left")
        if len(policies) < 2:
            _note(ax, "only one policy ran: nothing to compare", empty=False)
    ax.set_xlabel("offered request rate (requests/s, Poisson arrivals)")
    ax.set_ylabel("goodput (requests/s meeting both SLOs)")
    _footer(fig, result)
    return fig


@styled
def prefix_cache_figure(result: dict):
    """Left: mean TTFT with and without the radix cache. Right: hit rate, preemptions by pool."""
    runs = _runs(result)
    fig, _ = new_figure(13, 6.5)
    fig.clear()
    left, right = fig.subplots(1, 2)
    on, off = _prefix_pair(runs)
    if on is None or off is None or not _mean_ttft(on) or not _mean_ttft(off):
        _note(left, "needs a 'prefix cache off' run and a policy run\nat the same policy "
                    "and rate")
        left.set_title("Mean TTFT with and without the radix cache", fontsize=12)
    else:
        t_on, t_off = _mean_ttft(on) * 1e3, _mean_ttft(off) * 1e3
        bars = left.bar([0, 1], [t_on, t_off], color=[PALETTE[0], "0.6"], width=0.6)
        left.set_xticks([0, 1], ["radix cache on", "radix cache off"])
        for bar, run, t in zip(bars, (on, off), (t_on, t_off), strict=True):
            hit = run.get("hit_rate")
            text = f"{_num(t)} ms" + (f"\nhit rate {hit:.0%}" if hit is not None else "")
            left.annotate(text, (bar.get_x() + bar.get_width() / 2, t), ha="center",
                          va="bottom", xytext=(0, 3), textcoords="offset points", fontsize=10)
        left.set_ylim(0, max(t_on, t_off) * 1.3)
        left.set_ylabel("mean TTFT (ms)")
        ratio = t_off / t_on
        left.set_title(f"Mean TTFT, {on.get('policy')} at {_rate(on['rate'])}:\n"
                       f"off / on = {ratio:.2f}x", fontsize=12)
        left.grid(axis="x", visible=False)
    _pool_panel(right, runs, result)
    fig.suptitle("What the radix (prefix) cache and the pool size change")
    _footer(fig, result)
    return fig


def _pool_panel(ax, runs: list[dict], result: dict) -> None:
    pool = _find(runs, experiment="pool")
    ax.set_title("Hit rate and preemptions against pool size", fontsize=12)
    if not pool:
        _note(ax, "no pool runs in this result")
        return
    rate, policy = pool[0]["rate"], pool[0].get("policy")
    points = {r["num_pages"]: r for r in pool if r.get("num_pages") is not None}
    # the policy run with the full pool at the same rate and policy, when it ran
    full = next(iter(_find(runs, experiment="policy", policy=policy, rate=rate)), None)
    if full is not None and full.get("num_pages") is not None:
        points.setdefault(full["num_pages"], full)
    if not points:
        _note(ax, "pool runs record no num_pages")
        return
    pages = sorted(points)
    hits = [points[p].get("hit_rate") for p in pages]
    pre = [points[p].get("preemptions") or 0 for p in pages]
    ax.plot(pages, [h if h is not None else np.nan for h in hits], "o-", color=PALETTE[0],
            label="prefix-cache hit rate (left axis)")
    ax.set_ylim(-0.03, 1.05)
    ax.set_ylabel("hit rate (fraction of prompt tokens)")
    ax.set_xlabel(f"pool size (pages), {policy} at {_rate(rate)}")
    twin = ax.twinx()
    twin.plot(pages, pre, "s--", color=PALETTE[3], label="preemptions (right axis)")
    top = max(max(pre) * 1.25, 1)
    twin.set_ylim(-0.03 * top, top)
    twin.set_ylabel("preemptions")
    twin.grid(False)
    full_pages = result.get("full_pool_pages")
    if full_pages in points:
        ax.axvline(full_pages, color="0.6", lw=1.0, ls="-.")
        ax.annotate("full pool", (full_pages, 1.0), ha="right", va="top", fontsize=9,
                    color="0.4", xytext=(-3, 0), textcoords="offset points")
    lines = ax.get_legend_handles_labels()
    more = twin.get_legend_handles_labels()
    ax.legend(lines[0] + more[0], lines[1] + more[1], loc="lower center",
              bbox_to_anchor=(0.5, 1.0), ncols=2, frameon=False)
    ax.set_title(ax.get_title(), fontsize=12, pad=28)  # room for the legend above the axes
    if len(pages) < 2:
        _note(ax, "one pool size only: no trend to show", empty=False)


@styled
def pool_timeline_figure(result: dict):
    """Used and cached pages over time for the mixed policy at its highest rate."""
    runs = _runs(result)
    fig, ax = new_figure(12, 6.5)
    policy_runs = _find(runs, experiment="policy")
    mixed = _find(policy_runs, policy="mixed") or policy_runs
    run = max(mixed, key=lambda r: r["rate"]) if mixed else None
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
    ax.set_title(f"Pool pages over time, {run.get('policy')} at {_rate(run['rate'])}"
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
    """The serve claims as a short Markdown table, numbers from the JSON only."""
    runs = _runs(result)
    claims = result.get("claims") or {}
    lines = ["| claim | measured |", "|---|---|"]
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
    on, off = _prefix_pair(runs)
    speedup = claims.get("prefix_cache_ttft_speedup")
    if speedup is None and on and off and _mean_ttft(on):
        speedup = _mean_ttft(off) / _mean_ttft(on)
    at = f", {on.get('policy')} at {_rate(on['rate'])}" if on else ""
    lines.append(f"| mean TTFT without / with the radix cache{at} | {_x(speedup)} |")
    table = claims.get("goodput_by_rate")
    if table is None:
        by_rate: dict[float, dict] = {}
        for r in _find(runs, experiment="policy"):
            by_rate.setdefault(r["rate"], {})[r.get("policy")] = \
                r.get("summary", {}).get("goodput_requests_per_s")
        table = [{"rate": k, **v} for k, v in sorted(by_rate.items())]
    policies = list(dict.fromkeys(k for row in table for k in row if k != "rate"))
    if table and policies:
        lines += ["", "Goodput (requests/s meeting both SLOs):", "",
                  "| offered rate (requests/s) | " + " | ".join(policies) + " |",
                  "|---|" + "---|" * len(policies)]
        for row in table:
            cells = ["n/a" if row.get(p) is None else _num(row[p]) for p in policies]
            lines.append(f"| {_num(row['rate'])} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    return redraw_main(argv, "serving", draw_serving, serving_summary)


if __name__ == "__main__":
    raise SystemExit(main())
