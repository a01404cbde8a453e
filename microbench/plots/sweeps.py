"""The sweep figures (batch.png, throughput.png, crossover.png, kv_cache.png): drawn from a
phases result (schema.KIND_PHASES) only, without JAX.

The measured batch and context sweeps of microbench.phases.sweeps beside the modelled series of
spec-database devices (the scaling book's inference chapter for throughput vs interactivity).
Titles come from microbench.plots.claims; measured points carry the marks of
microbench.plots.points.Notes; on modelled panels a marker says which roof bounds each point
(LIMITS).
"""

from __future__ import annotations

import math
import textwrap
from collections import Counter
from collections.abc import Sequence

from matplotlib.figure import Figure

from microbench.plots.claims import (
    below_ridge_claim,
    crossover_decision,
    fit_note,
    kv_claim,
    limit_of,
    ratio_claim,
    throughput_claim,
    timing_of,
)
from microbench.plots.common import (
    PALETTE,
    SUSPECT_COLOR,
    fmt_si,
    legend_beside,
    legend_clear,
    new_figure,
    place_labels,
    plain_log,
    styled,
)
from microbench.plots.points import Notes, in_sweep, machine_line, phases_of, ridge_of

# What bounds a modelled point: marker and legend text.
LIMITS = {"compute": ("s", "compute-bound"),
          "weights": ("o", "memory-bound: weight reads dominate"),
          "KV cache": ("v", "memory-bound: KV-cache reads dominate"),
          "activations": ("d", "memory-bound: activation traffic dominates"),
          "memory": ("o", "memory-bound (weights vs KV not recorded)")}


def _short(limit: str) -> str:
    """LIMITS' words for a limit, short: 'weight reads', 'KV-cache reads', 'compute-bound'."""
    return LIMITS[limit][1].removeprefix("memory-bound: ").removesuffix(" dominate")


def _series(points: Sequence[dict], variant: str) -> list[dict]:
    return sorted((p for p in points if p["variant"] == variant), key=lambda p: p["batch"])


def _batch_series(axes, ps: list[dict], v: str, c, notes) -> None:
    """One variant's decode-FFN points across batch: intensity, step time and FLOP/s,
    measured (solid) and predicted (dashed; hollow o / s: memory- / compute-bound)."""
    ax1, ax2, ax3 = axes
    b = [p["batch"] for p in ps]
    ax1.plot(b, [p["intensity"] for p in ps], "o-", color=c, label=v)
    t = [p["timing"]["median"] * 1e3 for p in ps]
    err = [[x - p["timing"]["p10"] * 1e3 for x, p in zip(t, ps, strict=True)],
           [p["timing"]["p90"] * 1e3 - x for x, p in zip(t, ps, strict=True)]]
    ax2.errorbar(b, t, yerr=err, fmt="o-", color=c, capsize=3, label=f"{v}: measured")
    ax3.plot(b, [p["flops_per_s"]["median"] for p in ps], "o-", color=c, label=f"{v}: measured")
    for p, x, y2 in zip(ps, b, t, strict=True):
        notes.mark(ax2, p, x, y2)
        notes.mark(ax3, p, x, p["flops_per_s"]["median"])
    pred = [p["predicted"] for p in ps if p.get("predicted")]
    if len(pred) == len(ps):
        ax2.plot(b, [q["time_s"] * 1e3 for q in pred], "--", color=c,
                 label=f"{v}: roofline prediction")
        ax3.plot(b, [q["flops_per_s"] for q in pred], "--", color=c,
                 label=f"{v}: roofline prediction")
        for x, q in zip(b, pred, strict=True):
            ax2.scatter([x], [q["time_s"] * 1e3], marker="s" if q["bound"] == "compute"
                        else "o", s=45, facecolors="white", edgecolors=c, zorder=4)


@styled
def batch_figure(results: Sequence[dict], title: str | None = None) -> Figure:
    """Decode FFN vs batch, dense and MoE: intensity, step time and achieved FLOP/s."""
    result = phases_of(results)[0]
    points = [p for p in result["points"] if in_sweep(p, "batch") and p["phase"] == "decode_ffn"]
    fig = Figure(figsize=(19, 6.6), layout="constrained")
    ax1, ax2, ax3 = fig.subplots(1, 3)
    level = Counter((p.get("predicted") or {}).get("memory_level")
                    for p in points).most_common(1)[0][0] if points else None
    r, notes = ridge_of(result, level), Notes()
    variants = list(dict.fromkeys(p["variant"] for p in points))
    for j, v in enumerate(variants):
        _batch_series((ax1, ax2, ax3), _series(points, v), v, PALETTE[j % len(PALETTE)], notes)
    ax2.scatter([], [], marker="o", s=45, facecolors="white", edgecolors="0.3",
                label="hollow o / s: predicted memory- / compute-bound")
    if r:
        ax1.axhline(r["flops_per_byte"], color="0.3", ls=":", label=r["label"])
    notes.legend(ax2)
    for ax in (ax1, ax2, ax3):
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("Batch (tokens decoded per step)")
    ax1.set_ylabel("Decode-FFN intensity (FLOP / byte)")
    ax2.set_ylabel("Time per decode-FFN step, all layers (ms)")
    ax3.set_ylabel("Achieved (FLOP / s)")
    by = {v: _series(points, v) for v in variants}
    ax1.set_title(ratio_claim("intensity", {v: [(p["batch"], p["intensity"]) for p in ps]
                                            for v, ps in by.items()}), fontsize=10)
    below = (below_ridge_claim({v: [(p["batch"], p["intensity"], p["timing"]["median"])
                                    for p in ps] for v, ps in by.items()}, r["flops_per_byte"])
             if r else "no ridge: no GEMM or main-memory roof in the file")
    ax2.set_title(textwrap.fill(ratio_claim("measured step time", {
        v: [(p["batch"], p["timing"]["median"]) for p in ps] for v, ps in by.items()}), 80),
        fontsize=10)
    ax3.set_title(ratio_claim("measured FLOP/s", {
        v: [(p["batch"], p["flops_per_s"]["median"]) for p in ps] for v, ps in by.items()}),
        fontsize=10)
    fig.suptitle(title or f"Decode FFN vs batch on {result['machine']}\n{below}", fontsize=13)
    notes.footnote(fig, machine_line(result, points))
    for ax in (ax1, ax2, ax3):
        plain_log(ax)
        legend_clear(ax)
    return fig


@styled
def throughput_figure(results: Sequence[dict], title: str | None = None) -> Figure:
    """Tokens/s per system vs tokens/s per user across batch: measured here, modelled there."""
    runs = phases_of(results)
    result = runs[0]
    fig = Figure(figsize=(14, 6.8), layout="constrained")
    ax1, ax2 = fig.subplots(1, 2)
    notes = Notes()
    batch_labels: list[tuple] = []  # (x, y, "B=n"), placed once the layout is final
    steps = [{**p, "series": f"{p['variant']}" + (f" [{r['machine']}]" if len(runs) > 1 else "")}
             for r in runs for p in r["points"] if in_sweep(p, "batch") and p["phase"] == "decode"]
    for j, v in enumerate(dict.fromkeys(p["series"] for p in steps)):
        ps = sorted((p for p in steps if p["series"] == v), key=lambda p: p["batch"])
        user = [1 / p["timing"]["median"] for p in ps]
        system = [p["batch"] / p["timing"]["median"] for p in ps]
        ax1.plot(user, system, "o-", color=PALETTE[j % len(PALETTE)], label=v)
        for p, x, y in zip(ps, user, system, strict=True):
            batch_labels.append((x, y, f"B={p['batch']}"))
            notes.mark(ax1, p, x, y)
    notes.legend(ax1)
    ax1.set_title(textwrap.fill(f"Measured, '{result['model']['preset']}': "
                                + throughput_claim(steps), 75), fontsize=10)
    rows = result["modelled"]["throughput"]
    for j, dev in enumerate(dict.fromkeys(r["device"] for r in rows)):
        rs, c = [r for r in rows if r["device"] == dev], PALETTE[j % len(PALETTE)]
        note = fit_note(rs[0])
        ax2.plot([r["tokens_per_s_user"] for r in rs], [r["tokens_per_s_system"] for r in rs],
                 ":" if note else "-", color=c, label=dev + (f" ({note})" if note else ""))
        for r in rs:
            marker = LIMITS[limit_of(r.get("bound"), r.get("memory_by"))][0]
            ax2.scatter([r["tokens_per_s_user"]], [r["tokens_per_s_system"]], marker=marker,
                        s=30, color=c if r["fits_memory"] else "white", edgecolors=c, zorder=4)
    if rows:
        seen = Counter(limit_of(r.get("bound"), r.get("memory_by")) for r in rows)
        for lim, n in seen.items():
            ax2.scatter([], [], marker=LIMITS[lim][0], color="0.4", label=f"{LIMITS[lim][1]} "
                        f"({n} of {len(rows)} points)")
        ax2.scatter([], [], marker="o", color="white", edgecolors="0.4",
                    label="hollow: weights + KV cache do not fit one device")
        batches = sorted({r["batch"] for r in rows})
        ax2.set_title(f"Modelled on paper: {rows[0]['preset']} bf16, context "
                      f"{rows[0]['context']}, batch {batches[0]}..{batches[-1]}\nwhat bounds "
                      "each step: " + ", ".join(f"{_short(lim)} {n}/{len(rows)}"
                                                 for lim, n in seen.most_common()), fontsize=10)
    for ax in (ax1, ax2):
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("Interactivity (tokens / s per user)")
        ax.set_ylabel("Throughput (tokens / s per system)")
        plain_log(ax)
    ax1.legend(frameon=False, fontsize=8.5)
    legend_beside(ax2)
    fig.suptitle(title or "Throughput vs interactivity across batch", fontsize=14)
    notes.footnote(fig, "; ".join(machine_line(r, [p for p in steps if p in r["points"]])
                                  for r in runs) if len(runs) > 1 else
                   "left: " + machine_line(result, steps))
    place_labels(ax1, _one_per_spot(batch_labels), fontsize=8)
    return fig


def _one_per_spot(labels: list[tuple]) -> list[tuple]:
    """(x, y, text) labels less those repeating an earlier one's text at nearly the same point
    (two series' B=64 within 5% on both log axes): one label names both."""
    kept: list[tuple] = []
    for x, y, text in labels:
        if not any(t == text and abs(math.log(x / kx)) < 0.05 and abs(math.log(y / ky)) < 0.05
                   for kx, ky, t in kept):
            kept.append((x, y, text))
    return kept


@styled
def crossover_figure(results: Sequence[dict], title: str | None = None) -> Figure:
    """Decode attention vs decode FFN time vs context: measured per variant, and modelled."""
    result = phases_of(results)[0]
    fig = Figure(figsize=(14, 8.5), layout="constrained")
    ax1, ax2 = fig.subplots(1, 2)
    notes = Notes()
    pts = [p for p in result["points"] if in_sweep(p, "context")]
    for j, v in enumerate(dict.fromkeys(p["variant"] for p in pts)):
        c = PALETTE[j % len(PALETTE)]
        att = sorted((p for p in pts if p["variant"] == v and p["phase"] == "decode_attention"),
                     key=lambda p: p["context"])
        ffn = next((p for p in pts if p["variant"] == v and p["phase"] == "decode_ffn"), None)
        ctx = [p["context"] for p in att]
        t = [p["timing"]["median"] * 1e3 for p in att]
        err = [[x - p["timing"]["p10"] * 1e3 for x, p in zip(t, att, strict=True)],
               [p["timing"]["p90"] * 1e3 - x for x, p in zip(t, att, strict=True)]]
        label = f"{v}: attention"
        if ffn:
            d = crossover_decision(ctx, [p["timing"] for p in att], ffn["timing"])
            label += f"; vs its FFN: {d['label']}"
            ax1.axhspan(ffn["timing"]["p10"] * 1e3, ffn["timing"]["p90"] * 1e3, color=c,
                        alpha=0.12, lw=0)
            ax1.axhline(ffn["timing"]["median"] * 1e3, color=c, ls="--", lw=1)
            notes.mark(ax1, ffn, ctx[0] if ctx else 1, ffn["timing"]["median"] * 1e3)
            if d["kind"] == "crossing":
                ax1.axvline(d["context"], color=c, ls=":", lw=1.2)
        ax1.errorbar(ctx, t, yerr=err, fmt="o-", color=c, capsize=3, label=label)
        for p, x, y in zip(att, ctx, t, strict=True):
            notes.mark(ax1, p, x, y)
    ax1.plot([], [], "--", color="0.3", label="dashed + band: that variant's decode FFN "
             "(median, p10-p90)")
    notes.legend(ax1)
    ax1.set_title(f"Measured, batch {pts[0]['batch'] if pts else '?'}, "
                  f"'{result['model']['preset']}' on {result['machine']}\na crossing counts "
                  "only where the p10-p90 ranges of attention and FFN are apart", fontsize=10)
    ax1.set_ylabel("Time per decode step, all layers (ms)")
    _modelled_crossover(ax2, result["modelled"]["crossover"])
    for ax in (ax1, ax2):
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("Context (cached tokens per sequence)")
        ax.legend(frameon=False, fontsize=8)
        plain_log(ax)
    # the measured panel's legend runs one line per variant: room above the data for it
    share = min(0.6, 0.03 + 0.032 * len(ax1.get_legend_handles_labels()[1]))
    lo, hi = ax1.get_ylim()
    ax1.set_ylim(lo, lo * (hi / lo) ** (1 / (1 - share)))
    fig.suptitle(title or "When does attention overtake the FFN in decode?", fontsize=14)
    notes.footnote(fig, "left: " + machine_line(result, pts) + "; right: on paper")
    return fig


def _modelled_crossover(ax, rows: list[dict]) -> None:
    if not rows:
        return
    ctx = [r["context"] for r in rows]
    ax.plot(ctx, [r["attention_s"] * 1e3 for r in rows], "-", color=PALETTE[0])
    ffn_lim = _short(limit_of(rows[0].get("ffn_bound"), rows[0].get("ffn_memory_by")))
    ax.plot(ctx, [r["ffn_s"] * 1e3 for r in rows], "--", color="0.3",
            label=f"decode FFN ({ffn_lim})")
    lims = [limit_of(r.get("attention_bound"), r.get("attention_memory_by")) for r in rows]
    for lim in dict.fromkeys(lims):
        xs = [(r["context"], r["attention_s"] * 1e3) for r, k in zip(rows, lims, strict=True)
              if k == lim]
        ax.scatter(*zip(*xs, strict=True), marker=LIMITS[lim][0], color=PALETTE[0], zorder=4,
                   label=f"decode attention: {LIMITS[lim][1]}")
    d = crossover_decision(ctx, [timing_of(r["attention_s"]) for r in rows],
                           timing_of(rows[0]["ffn_s"]))
    if d["kind"] == "crossing":
        ax.axvline(d["context"], color=SUSPECT_COLOR, ls=":", label=d["label"])
    note = fit_note(rows[0])
    ax.set_title(f"Modelled on paper: {rows[0]['preset']} bf16 on {rows[0]['device']}, batch "
                 f"{rows[0]['batch']}" + (f" ({note})" if note else "") + "\nattention vs "
                 f"FFN: {d['label']}", fontsize=10)
    ax.set_ylabel("Roofline time per decode step (ms)")


@styled
def kv_figure(results: Sequence[dict], title: str | None = None) -> Figure:
    """KV-cache bytes per sequence vs context for real presets (bf16)."""
    rows = phases_of(results)[0]["modelled"]["kv"]
    fig, ax = new_figure(12, 7.5)
    growth = kv_claim(rows)
    for j, preset in enumerate(dict.fromkeys(r["preset"] for r in rows)):
        rs = [r for r in rows if r["preset"] == preset]
        notes = [growth.get(preset, "")]
        if rs[0].get("shipped_dtype"):
            notes.append(f"modelled in bf16, shipped in {rs[0]['shipped_dtype']}")
        notes.append(fit_note(rs[0]))
        ax.plot([r["context"] for r in rs], [r["kv_bytes"] for r in rs], "o-", ms=4,
                color=PALETTE[j % len(PALETTE)],
                label=f"{preset}: " + "; ".join(n for n in notes if n))
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("Context (tokens per sequence)")
    ax.set_ylabel("KV cache per sequence (bytes, bf16)")
    flat = [p for p, g in growth.items() if g.startswith("flat")]
    last = max((r["context"] for r in rows), default=0)
    at_last = [r for r in rows if r["context"] == last]
    if at_last:
        lo, hi = (min(at_last, key=lambda r: r["kv_bytes"]),
                  max(at_last, key=lambda r: r["kv_bytes"]))
        ax.set_title(f"At {last:,} tokens: {fmt_si(lo['kv_bytes'], 'B')} ({lo['preset']}) to "
                     f"{fmt_si(hi['kv_bytes'], 'B')} ({hi['preset']}) per sequence; flat "
                     f"past their window: {', '.join(flat) or 'none'}", fontsize=10)
    fig.suptitle(title or "KV-cache bytes vs context for real architectures (on paper: counted "
                 "from each config)", fontsize=14)
    handles, labels = ax.get_legend_handles_labels()
    fig.legend(handles, [textwrap.fill(label, 75) for label in labels],
               loc="outside lower center", ncol=2, frameon=False, fontsize=8.5)
    return fig
