"""The simulate figures and summary, drawn only from a saved simulate result (simulate.json,
`python -m microbench simulate`): the simulator against the engine on this machine here, then
serving at scale on paper (scale-out, prefill/decode (PD) disaggregation, attention-FFN
disaggregation (AFD), SRAM-only chips) from microbench.plots.scale.

Every title states what the plotted numbers show, computed here from the JSON (the ranking
by `scale_claim`, the PD verdicts by `pd_headline`, the AFD ones by `afd_claim`), against
SLOs the result records; every paper figure states its assumptions (device, precision,
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
    redraw_main,
    save,
    styled,
)
from microbench.plots.scale import (
    _caption,
    _plain_log,
    afd_figure,
    paper_summary,
    pct,
    pd_figure,
    scale_figure,
    sram_figure,
)
from microbench.plots.serving import _note, machine_name

FILES = {"check": "simulate_check.png", "scale": "simulate_scale.png",
         "pd": "simulate_pd.png", "afd": "simulate_afd.png", "sram": "simulate_sram.png"}
METRICS = (("ttft_s", "TTFT"), ("tpot_s", "TPOT"), ("e2e_s", "E2E"))
PREDICTORS = (("table", "table sim", "o"), ("roofline", "roofline sim", "^"))
BAND = 0.10  # the +-10% band drawn around y = x (the table's step target when unsaved)
SPREAD_FACTOR = 1.2  # a simulator's MAPE target, x the engine's spread (when unsaved)


# ------------------------------------------------------------------ 1. the check

def _trace_ticks(ax, traces: list[tuple[str, dict]]) -> None:
    """Each trace's rate (and policy, when they differ) on its tick; each model's name once,
    centred under its traces."""
    policies = {r.get("policy") for _, r in traces}
    ax.set_xticks(range(len(traces)),
                  [(f"{r.get('policy')}\n" if len(policies) > 1 else "")
                   + f"{r.get('rate_fraction', 0):g}x" for _, r in traces], fontsize=8)
    for model in dict.fromkeys(m for m, _ in traces):
        at = [i for i, (m, _) in enumerate(traces) if m == model]
        ax.annotate(model, (sum(at) / len(at), 0), xycoords=("data", "axes fraction"),
                    xytext=(0, -16 if len(policies) == 1 else -28), textcoords="offset points",
                    ha="center", va="top", fontsize=8.5)


def _spread(run: dict, key: str):
    """The engine's spread on one trace (median pair MAPE) for a metric, or None."""
    return ((run.get("engine") or {}).get("spread") or {}).get(key)


def _ratio(errors: dict, pred: str, key: str):
    return (errors.get(pred) or {}).get(f"{key[:-2]}_ratio")


def _check_panel(ax, check: dict, key: str, name: str) -> None:
    """Per trace: the engine's spread (grey) beside each simulator's MAPE (log scale)."""
    errors = check.get("errors") or {}
    factor = (check.get("targets") or {}).get("spread_factor", SPREAD_FACTOR)
    traces = [(m["model"], r) for m in check.get("models") or [] for r in m.get("runs") or []]
    values = [v for _, r in traces for v in
              [_spread(r, key), *[((r.get(p) or {}).get("mape") or {}).get(key)
                                  for p, _, _ in PREDICTORS]] if v]
    if not values:
        _note(ax, f"no runs with a {name}")
        return
    width = 0.8 / (1 + len(PREDICTORS))
    xs = np.arange(len(traces))
    spreads = [_spread(r, key) or 0 for _, r in traces]
    ax.bar(xs - width, [100 * s for s in spreads], width, color="0.6",
           label=f"engine vs itself: {pct((errors.get('spread') or {}).get(key))}")
    ax.hlines([100 * factor * s for s in spreads], xs - 1.5 * width, xs + 1.5 * width,
              color="0.2", lw=1.2, ls=":", label=f"{factor:g} x spread (target)")
    for j, (pred, label, _) in enumerate(PREDICTORS):
        mapes = [((r.get(pred) or {}).get("mape") or {}).get(key) for _, r in traces]
        if not any(mapes):
            continue
        e = errors.get(pred) or {}
        ratio = _ratio(errors, pred, key)
        ax.bar(xs + j * width, [100 * (v or 0) for v in mapes], width, color=PALETTE[j],
               hatch=None if pred == "table" else "//", edgecolor="0.2", lw=0.5,
               label=f"{label}: {pct(e.get(key))}"
                     + (f" ({ratio:.2f}x spread)" if ratio is not None else ""))
    ax.set_yscale("log")
    ax.set_ylim(min(100 * v for v in values) / 2, max(100 * v for v in values) * 3)
    _plain_log(ax)
    _trace_ticks(ax, traces)
    ax.set_ylabel(f"{name}: MAPE over requests (%)")
    ax.legend(loc="upper left", fontsize=8)
    ratio = _ratio(errors, "table", key)
    ax.set_title(f"{name}: table sim {pct((errors.get('table') or {}).get(key))} vs engine "
                 f"spread {pct((errors.get('spread') or {}).get(key))}"
                 + (f"\n= {ratio:.2f}x (target <= {factor:g}x)" if ratio is not None else ""),
                 fontsize=11)


def _steps_panel(ax, check: dict) -> None:
    """Per step shape: the engine's median step time (bar: p10-p90 of its steps) against
    each predictor's time for that shape."""
    errors, targets = check.get("errors") or {}, (check.get("targets") or {}).get(
        "step_error") or {}
    lo, hi = np.inf, 0.0
    for i, model in enumerate(check.get("models") or []):
        color = PALETTE[i % len(PALETTE)]
        for run in model.get("runs") or []:
            for s in (run.get("step") or {}).get("shapes") or []:
                x = s["engine_s"]
                for pred, _, marker in PREDICTORS:
                    y = s.get(f"{pred}_s")
                    if not y:
                        continue
                    ax.errorbar(x * 1e3, y * 1e3, xerr=np.array([[x - s["engine_p10_s"]],
                                [s["engine_p90_s"] - x]]) * 1e3, fmt=marker, color=color,
                                mfc=color if pred == "table" else "white",
                                ms=3 + 1.5 * np.log2(1 + s["steps"]) ** 0.8, lw=0.6,
                                capsize=0, alpha=0.8)
                    lo, hi = min(lo, x, y), max(hi, x, y)
    if hi == 0:
        _note(ax, "no steps recorded")
        return
    xs = np.geomspace(lo * 0.7e3, hi * 1.4e3, 50)
    band = targets.get("table", BAND)
    ax.plot(xs, xs, color="0.3", lw=1.2)
    ax.fill_between(xs, xs * (1 - band), xs * (1 + band), color="0.5", alpha=0.15, lw=0)
    ax.set(xscale="log", yscale="log", xlim=(xs[0], xs[-1]), ylim=(xs[0], xs[-1]))
    _plain_log(ax)
    ax.set_xlabel("engine step time (ms; median of its steps of one shape, bar p10-p90)")
    ax.set_ylabel("predicted step time (ms)")
    handles = [ax.plot([], [], m, color="0.3", mfc="0.3" if p == "table" else "white")[0]
               for p, _, m in PREDICTORS if p in errors]
    labels = [f"{label}: median |error| {pct(errors[p].get('step_error'))} (target <= "
              f"{pct(targets.get(p))})" for p, label, _ in PREDICTORS if p in errors]
    handles.append(ax.fill_between([], [], color="0.5", alpha=0.15))
    labels.append(f"y = x, +-{band:.0%}")
    ax.legend(handles, labels, loc="upper left", fontsize=8)
    ax.set_title(f"Each step the engine ran, by shape (marker size: steps)\nengine's own step "
                 f"noise {pct(errors.get('step_noise'))}", fontsize=11)


def check_claim(check: dict) -> str:
    """What the check shows: the table simulator's MAPE against the engine's own spread,
    each predictor's per-step error against its target, and whether the spread itself is
    under its target on this machine."""
    errors, targets = check.get("errors") or {}, check.get("targets") or {}
    factor = targets.get("spread_factor", SPREAD_FACTOR)
    parts = []
    table = errors.get("table")
    if table:
        ratios = [(n, _ratio(errors, "table", k)) for k, n in METRICS]
        over = [f"{n} {r:.2f}x" for n, r in ratios if r is None or r > factor]
        if table.get("within_spread"):
            parts.append(f"table sim within {factor:g}x the engine's own spread ("
                         + ", ".join(f"{n} {r:.2f}x" for n, r in ratios) + ")")
        else:
            parts.append(f"table sim outside {factor:g}x the engine's own spread ("
                         + ", ".join(over) + ")")
    else:
        parts.append("no table simulator ran")
    bounds = targets.get("step_error") or {}
    for pred, label, _ in PREDICTORS:
        e = errors.get(pred) or {}
        if e.get("step_error") is not None:
            ok = "met" if e.get("step_ok") else "missed"
            parts.append(f"{label} per step {pct(e['step_error'])} (target <= "
                         f"{pct(bounds.get(pred))}: {ok})")
    spread = errors.get("spread") or {}
    high = [f"{n} {pct(spread.get(k))}" for k, n in METRICS
            if spread.get(k) is not None and spread[k] > targets.get("spread_max", 1.0)]
    if high:
        parts.append(f"the engine's own spread is over {pct(targets.get('spread_max'))} on "
                     f"this machine ({', '.join(high)})")
    return "; ".join(parts)


@styled
def check_figure(result: dict):
    """Per trace, the engine's spread beside each simulator's MAPE (TTFT, TPOT, E2E); per
    step shape, the engine's time against each predictor's."""
    check = result["check"]
    fig, _ = new_figure(22, 7.5)
    fig.clear()
    axes = fig.subplots(1, 4, width_ratios=(1, 1, 1, 1.2))
    for ax, (key, name) in zip(axes, METRICS, strict=False):
        _check_panel(ax, check, key, name)
    _steps_panel(axes[3], check)
    models = check.get("models") or []
    if models:
        handles = [axes[3].plot([], [], "s", color=PALETTE[i % len(PALETTE)])[0]
                   for i in range(len(models))]
        fig.legend(handles, [m["model"] for m in models], loc="outside right upper",
                   fontsize=9, title="model (steps panel;\nfilled: table,\nhollow: roofline)",
                   title_fontsize=9, frameon=False)
    fig.suptitle("Simulator vs engine, judged against the engine's own run-to-run spread:\n"
                 + textwrap.fill(check_claim(check), 190), fontsize=13)
    c = check.get("check") or {}
    errors = check.get("errors") or {}
    _caption(fig, f"measured on {made_by(result.get('environment'))}; roofline predictor "
                  f"from the roofs of {check.get('peaks_machine') or 'n/a'}, plus "
                  f"{_kernel_note(check)}\nspread: median over {errors.get('pairs')} pairs "
                  f"of engine runs (each trace run {c.get('engine_repeats')} times) of their "
                  "MAPE over requests; simulator MAPE against the mean of the engine's runs; "
                  f"policies {', '.join(c.get('policies') or [])}, rates "
                  f"{', '.join(f'{f:g}' for f in c.get('rate_fractions') or [])} x the "
                  "policy's saturation throughput (simulated on the call table), "
                  f"{c.get('requests')} requests per trace")
    return fig


def _kernel_note(check: dict) -> str:
    """'13.2 us per kernel (small), ...; an 8x8 product's kernel 0.6 us' from the runs."""
    bits, chain = [], None
    for m in check.get("models") or []:
        info = m.get("machine") or {}
        if info.get("per_kernel_s") is not None:
            bits.append(f"{info['per_kernel_s'] * 1e6:.1f} us ({m['model']})")
        chain = chain or info.get("chain_per_kernel_s")
    if not bits:
        return "no per-kernel cost"
    return ("a cost per kernel measured on each model's smallest decode call: "
            + ", ".join(bits) + (f" (a chain of 8x8 products: {chain * 1e6:.1f} us per "
                                 "kernel)" if chain else ""))

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
    """The check in markdown: per metric the engine's spread beside each simulator's MAPE
    and their ratio; per predictor the per-step error; per trace the same; each against
    the saved targets."""
    errors, targets = check.get("errors") or {}, check.get("targets") or {}
    factor = targets.get("spread_factor", SPREAD_FACTOR)
    spread = errors.get("spread") or {}
    ran = [(p, label) for p, label, _ in PREDICTORS if p in errors]
    head = ["metric", f"engine spread (median of {errors.get('pairs')} pairs)"]
    for _, label in ran:
        head += [f"{label} MAPE", f"{label} / spread"]
    rows = []
    for k, n in METRICS:
        row = [n, pct(spread.get(k))]
        for p, _ in ran:
            r = _ratio(errors, p, k)
            row += [pct(errors[p].get(k)), "n/a" if r is None else f"{r:.2f}x"]
        rows.append(row)
    c = check.get("check") or {}
    lines = ["## Simulator vs engine, against the engine's own spread", "",
             f"Each trace run {c.get('engine_repeats')} times on the engine; spread: the "
             "median over pairs of runs of their MAPE over requests; a simulator's MAPE: "
             "against the mean of the engine's runs, over requests.", "",
             *md_table(head, rows), "",
             f"Targets: a simulator's MAPE <= {factor:g}x the spread on every metric; the "
             f"spread <= {pct(targets.get('spread_max'))}. " + check_claim(check) + "."]
    bounds = targets.get("step_error") or {}
    steps = [[label, pct(errors[p].get("step_error")), pct(errors[p].get("step_p90")),
              errors[p].get("steps"), f"<= {pct(bounds.get(p))}",
              "yes" if errors[p].get("step_ok") else "no"]
             for p, label in ran if errors[p].get("step_error") is not None]
    if steps:
        lines += ["", "Per step (each step the engine ran, priced by the predictor, against "
                  "its measured time):", "",
                  *md_table(["predictor", "median abs error", "p90 abs error", "steps", "target",
                             "met"], steps), "",
                  f"The engine's own step noise (each step against the median of its shape):"
                  f" {pct(errors.get('step_noise'))}. {_kernel_note(check)[0].upper()}"
                  f"{_kernel_note(check)[1:]}."]
    per = []
    for m in check.get("models") or []:
        for r in m.get("runs") or []:
            s = r.get("step") or {}
            per.append([m["model"], r.get("policy"), f"{r.get('rate_fraction', 0):g}",
                        *[pct(_spread(r, k)) for k, _ in METRICS],
                        *[pct(((r.get("table") or {}).get("mape") or {}).get(k))
                          for k, _ in METRICS],
                        pct(s.get("table_error")), pct(s.get("roofline_error")),
                        pct(s.get("noise"))])
    if per:
        lines += ["", "Per trace:", "", *md_table(
            ["model", "policy", "rate (x saturation)", *[f"spread {n}" for _, n in METRICS],
             *[f"table {n}" for _, n in METRICS], "table per step", "roofline per step",
             "step noise"], per)]
    return lines


def simulate_summary(result: dict) -> str:
    """Markdown: the check (the engine's spread beside each simulator's MAPE, the per-step
    errors, per trace), then the paper parts' short tables; numbers from the JSON only."""
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
