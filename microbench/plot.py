"""The project's one plotting module: every figure is drawn from saved JSON results only.

Layout: shared style helpers first (rc settings, SI formatting, atomic save, loading), then
one function per figure, each taking parsed result objects and returning a matplotlib Figure.
Add a figure by writing `<name>_figure(results, ...) -> Figure` below and listing it in
FIGURES. The roofline follows Williams, Waterman & Patterson, "Roofline" (CACM 2009), drawn
the way the Empirical Roofline Tool does: log-log, x = FLOP/byte, y = FLOP/s, one diagonal
per memory level and one horizontal per compute roof; vendor or theoretical roofs dashed,
measured roofs solid with their p10-p90 spread shaded, ridge points marked, and values that
exceeded their ceiling drawn in red as measurement errors rather than as roofs.
"""

from __future__ import annotations

import functools
import json
import os
import tempfile
from collections.abc import Sequence
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402

from microbench.harness import readable  # noqa: E402
from microbench.schema import KIND_PEAKS, KIND_PHASES, validate_result  # noqa: E402

# ------------------------------------------------------------------ shared style helpers

RC = {"font.size": 12, "axes.titlesize": 14, "axes.labelsize": 13, "legend.fontsize": 9.5,
      "xtick.labelsize": 11, "ytick.labelsize": 11, "lines.linewidth": 2.0,
      "axes.grid": True, "grid.alpha": 0.3, "savefig.dpi": 150}
PALETTE = plt.get_cmap("tab10").colors
SUSPECT_COLOR = "#d62728"


def fmt_si(value: float, unit: str) -> str:
    """201e9, 'FLOP/s' -> '201 GFLOP/s'."""
    for scale, prefix in ((1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(value) >= scale:
            return f"{value / scale:.3g} {prefix}{unit}"
    return f"{value:.3g} {unit}"


def styled(figure_fn):
    """Decorator: run a figure function under the house rc settings (fonts, widths)."""

    @functools.wraps(figure_fn)
    def wrapper(*args, **kwargs):
        with plt.rc_context(RC):
            return figure_fn(*args, **kwargs)

    return wrapper


def new_figure(width: float = 11.0, height: float = 8.5):
    fig = Figure(figsize=(width, height), layout="constrained")
    return fig, fig.add_subplot()


def save(fig: Figure, path: str | Path) -> Path:
    """Render to a temporary file beside `path`, then os.replace: never a half-written PNG."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.stem}.", suffix=path.suffix, dir=path.parent)
    os.close(fd)
    readable(tmp)
    try:
        with plt.rc_context(RC):
            fig.savefig(tmp)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def load_results(paths: Sequence[str | Path]) -> list[dict]:
    """Parse and validate result files (schema.validate_result)."""
    return [validate_result(json.loads(Path(p).read_text())) for p in paths]


def _colors(n_results: int):
    """color(i_result, j_roof): per roof for one machine, per machine for several."""
    if n_results == 1:
        return lambda i, j: PALETTE[j % len(PALETTE)]
    return lambda i, j: PALETTE[i % len(PALETTE)]


# ------------------------------------------------------------------ roofline

X_RANGE = (1 / 16, 2048.0)


def _roof_ends(memory: list[dict], compute: list[dict]):
    bw_max = max((r["value"] for r in memory), default=None)
    flops_max = max((r["value"] for r in compute), default=None)
    return bw_max, flops_max


def _draw_compute(ax, roof: dict, bw_max, color, prefix: str, dashed: bool = False):
    x0 = max(X_RANGE[0], roof["value"] / bw_max) if bw_max else X_RANGE[0]
    kind = roof.get("label_kind", "ceiling") if dashed else "measured"
    ax.hlines(roof["value"], x0, X_RANGE[1], colors=[color], linestyles="--" if dashed else "-",
              label=f"{prefix}{kind} {roof['name']}: {fmt_si(roof['value'], 'FLOP/s')}")
    if not dashed:
        ax.fill_between([x0, X_RANGE[1]], roof["p10"], roof["p90"], color=color, alpha=0.15,
                        lw=0)


def _draw_memory(ax, roof: dict, flops_max, color, prefix: str, dashed: bool = False):
    x1 = min(X_RANGE[1], flops_max / roof["value"]) if flops_max else X_RANGE[1]
    xs = [X_RANGE[0], x1]
    kind = roof.get("label_kind", "ceiling") if dashed else "measured"
    ax.plot(xs, [roof["value"] * x for x in xs], color=color, ls="--" if dashed else "-",
            lw=1.6, label=f"{prefix}{kind} {roof['name']} bandwidth: "
                          f"{fmt_si(roof['value'], 'B/s')}")
    if not dashed:
        ax.fill_between(xs, [roof["p10"] * x for x in xs], [roof["p90"] * x for x in xs],
                        color=color, alpha=0.12, lw=0)


def _spec_roofs(spec: dict | None) -> tuple[list[dict], list[dict]]:
    """Vendor/theoretical ceilings of a result's spec block, as roof-like dicts."""
    if not spec:
        return [], []
    der = spec.get("derivation") or {}
    kind = "theoretical" if der else "vendor"
    comp = []
    for dt, v in spec["peak_flops"].items():
        how = spec["name"]
        if der:
            per_cycle = der["flop_per_cycle_per_core"][dt]
            how = (f"{der['cores']} cores x {per_cycle:g} FLOP/cycle x "
                   f"{der['clock_hz'] / 1e9:.2f} GHz")
        comp.append({"name": f"{dt} peak ({how})", "value": v, "label_kind": kind})
    mem = [{"name": f"{lvl} ({spec['name']})", "value": v, "label_kind": kind}
           for lvl, v in spec["memory_bandwidth"].items()]
    return comp, mem


def _draw_ridges(ax, compute: list[dict], memory: list[dict], color, main: str):
    main_roof = next((r for r in memory if r["level"] == main), None)
    if main_roof is None:
        return
    for n, roof in enumerate(sorted(compute, key=lambda r: r["value"])):
        x = roof["value"] / main_roof["value"]
        ax.plot([x], [roof["value"]], marker="D", ms=7, color=color, mec="black", zorder=5)
        ax.annotate(f"ridge {x:.3g} FLOP/B", (x, roof["value"]), textcoords="offset points",
                    xytext=(8, -16 if n % 2 == 0 else 6), fontsize=9)


def _draw_intensity(ax, result: dict, color, prefix: str):
    pts = sorted((p for p in result["intensity"]["points"] if not p["suspect"]),
                 key=lambda p: p["flops_per_byte"])
    if not pts:
        return
    xs = [p["flops_per_byte"] for p in pts]
    ys = [p["flops_per_s"]["median"] for p in pts]
    err = [[y - p["flops_per_s"]["p10"] for y, p in zip(ys, pts, strict=True)],
           [p["flops_per_s"]["p90"] - y for y, p in zip(ys, pts, strict=True)]]
    ax.errorbar(xs, ys, yerr=err, fmt="o:", color=color, ms=5, lw=1.2, capsize=3,
                label=f"{prefix}AI sweep: FMA chain in place on a DRAM-sized buffer "
                      f"(median, p10-p90)")


def _suspects(result: dict) -> list[tuple[float, float, str]]:
    """(x, y, text) for every flagged value: compute at its own FLOP/byte, memory on x=1."""
    out = []
    entries = (result["gemm"] + result["vector"] + result["bandwidth"]
               + result["sweep"]["points"] + result["intensity"]["points"])
    for e in entries:
        if not e["suspect"]:
            continue
        if e.get("flops_per_s") and e["flops"] and e["bytes"]:
            out.append((e["flops"] / e["bytes"], e["flops_per_s"]["median"], e["name"]))
        elif e.get("bytes_per_s"):
            out.append((1.0, e["bytes_per_s"]["median"], e["name"]))
    for r in result["roofs"]["compute"] + result["roofs"]["memory"]:
        if r["suspect"]:
            out.append((1.0 if r["kind"] == "memory" else X_RANGE[1] / 2, r["value"], r["name"]))
    return out


def _draw_one(ax, result: dict, i: int, color_of, prefix: str):
    roofs = result["roofs"]
    compute = [r for r in roofs["compute"] if not r["suspect"]]
    memory = [r for r in roofs["memory"] if not r["suspect"]]
    v_comp, v_mem = _spec_roofs(result.get("spec"))
    bw_max, flops_max = _roof_ends(memory, compute)
    v_bw_max, v_flops_max = _roof_ends(v_mem or memory, v_comp or compute)
    layers = [(compute, _draw_compute, bw_max, False), (memory, _draw_memory, flops_max, False),
              (v_comp, _draw_compute, v_bw_max, True), (v_mem, _draw_memory, v_flops_max, True)]
    j = 0
    for roofs_, draw, end, dashed in layers:
        for roof in roofs_:
            draw(ax, roof, end, color_of(i, j), prefix, dashed=dashed)
            j += 1
    main = "DRAM" if result["environment"]["backend"] == "cpu" else "HBM"
    _draw_ridges(ax, compute, memory, color_of(i, 0), main)
    _draw_intensity(ax, result, color_of(i, j), prefix)
    bad = _suspects(result)
    if bad:
        ax.scatter([b[0] for b in bad], [b[1] for b in bad], marker="X", s=120,
                   color=SUSPECT_COLOR, zorder=6, edgecolors="black",
                   label=f"{prefix}SUSPECT: above the ceiling = measurement error, not a roof "
                         f"({len(bad)})")


@styled
def roofline_figure(results: Sequence[dict], title: str | None = None) -> Figure:
    """Log-log roofline of one or more result objects (several machines on one chart)."""
    results = [r for r in results if r.get("kind", KIND_PEAKS) == KIND_PEAKS]
    if not results:
        raise ValueError("no peaks result among the files (kind 'microbench.peaks')")
    fig, ax = new_figure()
    color_of = _colors(len(results))
    for i, result in enumerate(results):
        prefix = f"[{result['machine']}] " if len(results) > 1 else ""
        _draw_one(ax, result, i, color_of, prefix)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlim(*X_RANGE)
    ax.set_xlabel("Arithmetic intensity (FLOP / byte)")
    ax.set_ylabel("Performance (FLOP / s)")
    names = "; ".join(f"{r['machine']} ({r['environment'].get('date_utc', '?')[:10]})"
                      for r in results)
    fig.suptitle(title or f"Roofline measured on {names}", fontsize=14)
    ax.set_title("Solid: measured roofs (median, shaded p10-p90).  Dashed: vendor or theoretical "
                 "ceilings.\nDiamonds: ridge points against main memory.  Bytes are "
                 "algorithmic (no write-allocate).", fontsize=10)
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.1), ncol=2, frameon=False)
    return fig


# ------------------------------------------------------------------ phase figures
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


FIGURES = {"roofline": roofline_figure, "phases_roofline": phases_roofline_figure,
           "batch": batch_figure, "throughput": throughput_figure,
           "crossover": crossover_figure, "kv_cache": kv_figure, "gap": gap_figure}


def plot_files(paths: Sequence[str | Path], out_dir: str | Path,
               name: str = "roofline") -> Path:
    """Redraw figure `name` from saved result files into out_dir/<name>.png."""
    fig = FIGURES[name](load_results(paths))
    return save(fig, Path(out_dir) / f"{name}.png")
