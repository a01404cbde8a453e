"""The phase figures: drawn from a phases result (schema.KIND_PHASES) only.

Part of the one plotting module (`microbench.plot`, which lists these in FIGURES and holds the
shared style helpers): measured points with their counted FLOPs and bytes and their roofline
prediction, the batch and context sweeps, and the modelled series of spec-database devices
(Williams, Waterman & Patterson, "Roofline", CACM 2009; the scaling book's inference chapter
for throughput vs interactivity).
"""

from __future__ import annotations

from collections.abc import Sequence

from matplotlib.figure import Figure

from microbench.plot import (
    PALETTE,
    SUSPECT_COLOR,
    _draw_compute,
    _draw_memory,
    _roof_ends,
    fmt_si,
    new_figure,
    styled,
)
from microbench.schema import KIND_PHASES

# Drawn from a phases result (schema.KIND_PHASES): measured points with their counted FLOPs and
# bytes and their roofline prediction, plus the modelled series for spec-database devices.

PHASE_MARKERS = {"prefill": "s", "decode_attention": "o", "decode_ffn": "^", "decode": "D"}
GAP_REASONS = (
    "Why measured < predicted:  prefill - attention softmax, norms and RoPE run on the vector "
    "unit, not the GEMM roof;  decode at small batch - per-op dispatch and\nfusion boundaries "
    "(each einsum re-reads its input), cache slicing, and weights read in several passes;  tiny "
    "phases (decode attention at short context) - fixed per-call overhead dominates.")


def _phases_of(results: Sequence[dict]) -> list[dict]:
    out = [r for r in results if r.get("kind") == KIND_PHASES]
    if not out:
        raise ValueError("no phases result among the files (kind 'microbench.phases')")
    return out


def _variant_colors(points: Sequence[dict]) -> dict:
    names = list(dict.fromkeys(p["variant"] for p in points))
    return {v: PALETTE[i % len(PALETTE)] for i, v in enumerate(names)}


def _machine_roofs(ax, result: dict, color: str = "0.4", prefix: str = ""):
    """The measured roofs the predictions used: every memory level and the matrix roof of
    the model's dtype."""
    roofs, dtype = result["peaks"]["roofs"], result["model"]["dtype"]
    compute = [r for r in roofs["compute"] if not r["suspect"] and r["name"].startswith("GEMM")
               and r.get("dtype") == dtype]
    memory = [r for r in roofs["memory"] if not r["suspect"]]
    bw_max, flops_max = _roof_ends(memory, compute)
    for roof in memory:
        _draw_memory(ax, roof, flops_max, color, prefix, dashed=False)
    for roof in compute:
        _draw_compute(ax, roof, bw_max, color, prefix, dashed=False)


def _draw_phase_points(ax, points: Sequence[dict], colors: dict, key: str) -> None:
    """Measured points (filled, p10-p90 bars) and their predictions (hollow), joined."""
    for p in points:
        c, m = colors[p[key]], PHASE_MARKERS[p["phase"]]
        y, (lo, hi) = p["flops_per_s"]["median"], (p["flops_per_s"]["p10"],
                                                    p["flops_per_s"]["p90"])
        ax.errorbar([p["intensity"]], [y], yerr=[[y - lo], [hi - y]], fmt=m, color=c, ms=9,
                    mec="black", zorder=5)
        pred = p.get("predicted")
        if pred:
            ax.scatter([p["intensity"]], [pred["flops_per_s"]], marker=m, s=80,
                       facecolors="none", edgecolors=c, zorder=4)
            ax.plot([p["intensity"]] * 2, [y, pred["flops_per_s"]], color=c, lw=0.8, alpha=0.6)


@styled
def phases_roofline_figure(results: Sequence[dict], title: str | None = None) -> Figure:
    """Measured phase points (filled) and their predictions (hollow) on the measured roofs.

    One machine: colours are variants. Several machines (e.g. this CPU and a GPU): colours
    are machines, each with its own roofs."""
    runs = _phases_of(results)
    fig, ax = new_figure(12, 8.5)
    legend = {}
    for i, result in enumerate(runs):
        points = [{**p, "machine": result["machine"]} for p in result["points"]
                  if p["sweep"] == "roofline"]
        if len(runs) == 1:
            _machine_roofs(ax, result)
            colors, key = _variant_colors(points), "variant"
        else:
            colors, key = {result["machine"]: PALETTE[i % len(PALETTE)]}, "machine"
            _machine_roofs(ax, result, colors[result["machine"]], f"[{result['machine']}] ")
        _draw_phase_points(ax, points, colors, key)
        legend.update(colors)
    for name, c in legend.items():
        ax.plot([], [], "s", color=c, label=f"{'variant' if len(runs) == 1 else 'machine'}: "
                f"{name}")
    for ph, m in PHASE_MARKERS.items():
        ax.plot([], [], m, color="0.3", mfc="0.6", label=f"phase: {ph}")
    ax.scatter([], [], marker="o", facecolors="none", edgecolors="0.3",
               label="hollow: roofline prediction of the same phase")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("Arithmetic intensity (counted FLOP / counted byte)")
    ax.set_ylabel("Achieved performance (FLOP / s)")
    model, points = runs[0]["model"], [p for p in runs[0]["points"] if p["sweep"] == "roofline"]
    machines = ", ".join(r["machine"] for r in runs)
    fig.suptitle(title or f"Phases of the '{model['preset']}' model ({fmt_si(model['params'], '')}"
                 f"parameters, {model['dtype']}) on {machines}", fontsize=14)
    prefill = next((p["context"] for p in points if p["phase"] == "prefill"), "?")
    decode = next((p["context"] for p in points if p["phase"] != "prefill"), "?")
    ax.set_title("Prefill sits right (compute-bound); decode sits left (bandwidth-bound). "
                 f"Batch 1; prefill of {prefill} tokens; decode at context {decode}.  "
                 "Error bars: p10-p90.", fontsize=10)
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.1), ncol=3, frameon=False)
    return fig


@styled
def batch_figure(results: Sequence[dict], title: str | None = None) -> Figure:
    """Decode-FFN intensity and achieved FLOP/s vs batch, dense and MoE."""
    result = _phases_of(results)[0]
    points = [p for p in result["points"] if p["sweep"] == "batch" and p["phase"] == "decode_ffn"]
    fig = Figure(figsize=(13, 5.8), layout="constrained")
    ax1, ax2 = fig.subplots(1, 2)
    ridge = _ridge(result)
    for j, v in enumerate(dict.fromkeys(p["variant"] for p in points)):
        ps = sorted((p for p in points if p["variant"] == v), key=lambda p: p["batch"])
        b = [p["batch"] for p in ps]
        ax1.plot(b, [p["intensity"] for p in ps], "o-", color=PALETTE[j], label=v)
        ax2.plot(b, [p["flops_per_s"]["median"] for p in ps], "o-", color=PALETTE[j],
                 label=f"{v}: measured")
        pred = [p["predicted"]["flops_per_s"] for p in ps if p.get("predicted")]
        if len(pred) == len(ps):
            ax2.plot(b, pred, "--", color=PALETTE[j], label=f"{v}: roofline prediction")
    if ridge:
        ax1.axhline(ridge, color="0.3", ls=":", label=f"ridge point {ridge:.1f} FLOP/B "
                    "(GEMM roof / main-memory read roof)")
    for ax in (ax1, ax2):
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("Batch (tokens decoded per step)")
        ax.legend(frameon=False)
    ax1.set_ylabel("Decode-FFN intensity (FLOP / byte)")
    ax1.set_title("Intensity grows ~linearly with batch\n(MoE: per-expert ~ B·A/E, slower)",
                  fontsize=11)
    ax2.set_ylabel("Achieved (FLOP / s)")
    ax2.set_title("Below the ridge, a bigger batch costs almost no time:\nthroughput is free "
                  "until the ridge", fontsize=11)
    fig.suptitle(title or f"Decode FFN vs batch on {result['machine']}", fontsize=14)
    return fig


def _ridge(result: dict) -> float | None:
    """Ridge point of the roofs the predictions use: the model dtype's best compute roof over
    main memory's roof for a large working set (microbench.phases.memory_level)."""
    from microbench.phases import memory_level

    roofs = result["peaks"]["roofs"]
    comp = [r["value"] for r in roofs["compute"] if not r["suspect"] and r.get("dtype") ==
            result["model"]["dtype"]]
    caps = result["peaks"].get("cache_capacities") or []
    try:
        main = memory_level(roofs, caps, float("inf"))["value"]
    except ValueError:
        return None
    return max(comp) / main if comp else None


@styled
def throughput_figure(results: Sequence[dict], title: str | None = None) -> Figure:
    """Tokens/s per system vs tokens/s per user across batch: measured here, modelled there."""
    result = _phases_of(results)[0]
    fig = Figure(figsize=(13, 5.8), layout="constrained")
    ax1, ax2 = fig.subplots(1, 2)
    runs = _phases_of(results)
    steps = [{**p, "series": f"{p['variant']}" + (f" [{r['machine']}]" if len(runs) > 1 else "")}
             for r in runs for p in r["points"] if p["sweep"] == "batch" and p["phase"] == "decode"]
    for j, v in enumerate(dict.fromkeys(p["series"] for p in steps)):
        ps = sorted((p for p in steps if p["series"] == v), key=lambda p: p["batch"])
        user = [1 / p["timing"]["median"] for p in ps]
        system = [p["batch"] / p["timing"]["median"] for p in ps]
        ax1.plot(user, system, "o-", color=PALETTE[j], label=v)
        for p, x, y in zip(ps, user, system, strict=True):
            ax1.annotate(f"B={p['batch']}", (x, y), fontsize=8, xytext=(3, 3),
                         textcoords="offset points")
    ax1.set_title(f"Measured: '{result['model']['preset']}' on "
                  f"{', '.join(r['machine'] for r in runs)}", fontsize=11)
    rows = result["modelled"]["throughput"]
    for j, dev in enumerate(dict.fromkeys(r["device"] for r in rows)):
        rs = [r for r in rows if r["device"] == dev]
        ax2.plot([r["tokens_per_s_user"] for r in rs], [r["tokens_per_s_system"] for r in rs],
                 "-", color=PALETTE[j], label=dev)
        ok = [r for r in rs if r["fits_memory"]]
        ax2.plot([r["tokens_per_s_user"] for r in ok], [r["tokens_per_s_system"] for r in ok],
                 "o", color=PALETTE[j], ms=5)
    if rows:
        ax2.set_title(f"Modelled: {rows[0]['preset']} bf16, context {rows[0]['context']}, "
                      "batch 1..512\n(dots: weights + KV cache fit one device)", fontsize=11)
    for ax in (ax1, ax2):
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("Interactivity (tokens / s per user)")
        ax.set_ylabel("Throughput (tokens / s per system)")
        ax.legend(frameon=False)
    fig.suptitle(title or "Throughput vs interactivity: fast tokens cost more", fontsize=14)
    return fig


def crossover(contexts: Sequence[float], attention: Sequence[float], ffn: float
              ) -> float | None:
    """The context where attention time first reaches the FFN time, interpolated in log-log
    between the two measured contexts around it (None if it never does in the range)."""
    import math

    pairs = list(zip(contexts, attention, strict=True))
    for (c0, a0), (c1, a1) in zip(pairs, pairs[1:], strict=False):
        if a0 < ffn <= a1:
            f = (math.log(ffn) - math.log(a0)) / (math.log(a1) - math.log(a0))
            return math.exp(math.log(c0) + f * (math.log(c1) - math.log(c0)))
    return contexts[0] if pairs and attention[0] >= ffn else None


@styled
def crossover_figure(results: Sequence[dict], title: str | None = None) -> Figure:
    """Decode attention vs decode FFN time vs context: measured per variant, and modelled."""
    result = _phases_of(results)[0]
    fig = Figure(figsize=(13, 5.8), layout="constrained")
    ax1, ax2 = fig.subplots(1, 2)
    pts = [p for p in result["points"] if p["sweep"] == "context"]
    for j, v in enumerate(dict.fromkeys(p["variant"] for p in pts)):
        att = sorted((p for p in pts if p["variant"] == v and p["phase"] == "decode_attention"),
                     key=lambda p: p["context"])
        ffn = [p for p in pts if p["variant"] == v and p["phase"] == "decode_ffn"]
        ax1.plot([p["context"] for p in att], [p["timing"]["median"] * 1e3 for p in att], "o-",
                 color=PALETTE[j], label=f"{v}: attention")
        if ffn and j == 0:
            ax1.axhline(ffn[0]["timing"]["median"] * 1e3, color="0.3", ls="--",
                        label=f"decode FFN (batch {ffn[0]['batch']})")
        if ffn:
            cross = crossover([p["context"] for p in att],
                              [p["timing"]["median"] for p in att], ffn[0]["timing"]["median"])
            if cross:
                ax1.axvline(cross, color=PALETTE[j], ls=":", lw=1.2,
                            label=f"{v}: crosses its FFN at ~{cross:,.0f}")
    ax1.set_title(f"Measured, batch {pts[0]['batch'] if pts else '?'}, "
                  f"'{result['model']['preset']}' on {result['machine']}", fontsize=11)
    ax1.set_ylabel("Time per decode step, all layers (ms)")
    rows = result["modelled"]["crossover"]
    if rows:
        ctx = [r["context"] for r in rows]
        ax2.plot(ctx, [r["attention_s"] * 1e3 for r in rows], "o-", label="decode attention")
        ax2.plot(ctx, [r["ffn_s"] * 1e3 for r in rows], "--", color="0.3", label="decode FFN")
        cross = crossover([r["context"] for r in rows], [r["attention_s"] for r in rows],
                          rows[0]["ffn_s"])
        if cross:
            ax2.axvline(cross, color=SUSPECT_COLOR, ls=":", label=f"crossover ~{cross:,.0f} tokens")
        ax2.set_title(f"Modelled: {rows[0]['preset']} bf16 on {rows[0]['device']}, batch "
                      f"{rows[0]['batch']}", fontsize=11)
        ax2.set_ylabel("Roofline time per decode step (ms)")
    for ax in (ax1, ax2):
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("Context (cached tokens per sequence)")
        ax.legend(frameon=False, fontsize=9)
    fig.suptitle(title or "When does attention overtake the FFN in decode?", fontsize=14)
    return fig


@styled
def kv_figure(results: Sequence[dict], title: str | None = None) -> Figure:
    """KV-cache bytes per sequence vs context for real presets (bf16)."""
    rows = _phases_of(results)[0]["modelled"]["kv"]
    fig, ax = new_figure(11, 7)
    for j, preset in enumerate(dict.fromkeys(r["preset"] for r in rows)):
        rs = [r for r in rows if r["preset"] == preset]
        ax.plot([r["context"] for r in rs], [r["kv_bytes"] for r in rs], "o-", ms=4,
                color=PALETTE[j % len(PALETTE)], label=preset)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("Context (tokens per sequence)")
    ax.set_ylabel("KV cache per sequence (bytes, bf16)")
    ax.set_title("Sliding windows flatten, MLA's latent is small, linear layers are fixed; "
                 "full GQA grows linearly", fontsize=10)
    fig.suptitle(title or "KV-cache bytes vs context for real architectures", fontsize=14)
    ax.legend(frameon=False, ncol=2)
    return fig


@styled
def gap_figure(results: Sequence[dict], title: str | None = None) -> Figure:
    """Measured / predicted per phase and variant, with the reasons for the gap."""
    result = _phases_of(results)[0]
    pts = [p for p in result["points"] if p["sweep"] == "roofline" and
           p.get("measured_over_predicted")]
    variants = list(dict.fromkeys(p["variant"] for p in pts))
    phases = [ph for ph in PHASE_MARKERS if any(p["phase"] == ph for p in pts)]
    fig, ax = new_figure(13, 7)
    width = 0.8 / max(1, len(phases))
    for k, ph in enumerate(phases):
        xs, ys = [], []
        for i, v in enumerate(variants):
            p = next((p for p in pts if p["variant"] == v and p["phase"] == ph), None)
            if p:
                xs.append(i + (k - (len(phases) - 1) / 2) * width)
                ys.append(p["measured_over_predicted"])
        ax.bar(xs, ys, width, color=PALETTE[k], label=ph)
    ax.axhline(1.0, color="black", lw=1)
    ax.set_xticks(range(len(variants)), variants, rotation=20)
    ax.set_xlabel("Attention variant / FFN (batch 1)")
    ax.set_ylabel("Measured / predicted throughput (1 = on the roof)")
    ax.set_title(GAP_REASONS, fontsize=8.5)
    ax.legend(frameon=False)
    fig.suptitle(title or f"How close each phase gets to this machine's roofline "
                 f"({result['machine']})", fontsize=14)
    return fig
