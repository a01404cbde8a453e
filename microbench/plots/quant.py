"""The quantization figure and summary, drawn only from a saved quant result (quant.json,
`python -m microbench quant`): the quality each weight and KV format costs beside the bytes it
saves, the decode step's measured speedup per precision beside the speedup its bytes promise,
and the bandwidth each formulation of a quantized product reaches.

Every title states numbers computed here from the JSON (the fastest precision and what its bytes
promised, the bits per byte each format adds, the bandwidth of the formulation refmodel uses);
nothing in a title is assumed. Imports matplotlib, numpy and microbench.plots only (no JAX):
`python -m microbench.plots.quant quant.json [out_dir]` redraws a saved result.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
from matplotlib.lines import Line2D
from matplotlib.patches import Patch
from matplotlib.ticker import FuncFormatter

from microbench.plots.common import (
    PALETTE,
    check_kind,
    fmt_si,
    made_by,
    md_table,
    new_figure,
    num,
    place_labels,
    redraw_main,
    save,
    styled,
    times,
    wall_time,
)
from microbench.plots.serving import _note, machine_name

FILE = "quant.png"
COMMAND = "python -m microbench quant"
FORMAT_COLORS = {"float32": "0.35", "bfloat16": PALETTE[0], "int8": PALETTE[1],
                 "float8": PALETTE[2], "int4": PALETTE[3]}
SMALL = {"fontsize": 9, "color": "0.3"}


# ------------------------------------------------------------------ formatting

def fmt_name(fmt: str | None) -> str:
    """A weight or KV format as drawn: 'none' (unquantized) -> 'float32'."""
    return "float32" if fmt in (None, "none") else str(fmt)


def _color(fmt: str, i: int = 0):
    return FORMAT_COLORS.get(fmt.split()[0], PALETTE[(i + 4) % len(PALETTE)])


def _mb(nbytes) -> str:
    return "n/a" if nbytes is None else num(nbytes / 1e6)


def _gbs(bytes_per_s) -> str:
    return "n/a" if bytes_per_s is None else f"{num(bytes_per_s / 1e9)} GB/s"


def _ms(seconds) -> str:
    return "n/a" if seconds is None else num(seconds * 1e3)


def _signed(value) -> str:
    """+0.0167 / -4.51e-05 / 0: a difference in bits per byte."""
    if value is None:
        return "n/a"
    if value == 0:
        return "0"
    return f"{value:+.3g}"


def _pct(value) -> str:
    return "n/a" if value is None else f"{value:.2%}"


# ------------------------------------------------------------------ selecting from the result

def _forms(result: dict) -> list[dict]:
    return (result.get("formulations") or {}).get("results") or []


def _steps(result: dict) -> list[dict]:
    return (result.get("steps") or {}).get("results") or []


def _quality(result: dict) -> list[dict]:
    return (result.get("quality") or {}).get("results") or []


def _unique(values) -> list:
    out = []
    for v in values:
        if v not in out:
            out.append(v)
    return out


def _kv_contexts(result: dict) -> set:
    return {r["context"] for r in _steps(result) if r.get("kv_format", "none") != "none"}


def decode_context(result: dict) -> int | None:
    """The context of the per-precision decode steps (not the long-context KV cases)."""
    ctx = (result.get("setup") or {}).get("context")
    if ctx is not None:
        return ctx
    rows = [r["context"] for r in _steps(result) if r["phase"] == "decode"
            and r.get("kv_format", "none") == "none" and r["context"] not in _kv_contexts(result)]
    return min(rows) if rows else None


def decode_rows(result: dict, batch: int) -> list[dict]:
    """The decode steps of every precision at `batch` and the decode context, float32 first."""
    ctx = decode_context(result)
    rows = [r for r in _steps(result) if r["phase"] == "decode" and r["batch"] == batch
            and r["context"] == ctx and r.get("kv_format", "none") == "none"]
    return sorted(rows, key=lambda r: r["precision"] != "float32")


def decode_batches(result: dict) -> list[int]:
    ctx = decode_context(result)
    return sorted({r["batch"] for r in _steps(result) if r["phase"] == "decode"
                   and r["context"] == ctx and r.get("kv_format", "none") == "none"})


def _reference(result: dict, row: dict) -> dict | None:
    """The float32 row with row's phase, batch and context (and an unquantized cache)."""
    for r in _steps(result):
        if (r["precision"] == "float32" and r.get("kv_format", "none") == "none"
                and (r["phase"], r["batch"], r["context"]) ==
                (row["phase"], row["batch"], row["context"])):
            return r
    return None


def bytes_ratio(result: dict, row: dict) -> float | None:
    """float32's counted bytes over row's: the speedup a memory-bound step would get."""
    ref = _reference(result, row)
    if ref is None or not row.get("bytes"):
        return None
    return ref["bytes"] / row["bytes"]


def kv_rows(result: dict) -> list[dict]:
    """The long-context decode steps comparing KV formats (the float cache first)."""
    ctxs = _kv_contexts(result)
    rows = [r for r in _steps(result) if r["phase"] == "decode" and r["context"] in ctxs
            and r["precision"] == "float32"]
    return sorted(rows, key=lambda r: r.get("kv_format", "none") != "none")


# ------------------------------------------------------------------ the headlines

def step_claim(result: dict, batch: int = 1, short: bool = False) -> str:
    """The fastest quantized decode step at `batch` against float32, beside its bytes ratio;
    int8's too when int8 is not the fastest. short: the title's form."""
    rows = [r for r in decode_rows(result, batch) if r["precision"] != "float32"
            and r.get("speedup") is not None]
    if not rows:
        return f"no quantized decode step measured at batch {batch}"
    best = max(rows, key=lambda r: r["speedup"])

    def part(r, first=True):
        br = times(bytes_ratio(result, r))
        if short:
            return f"{r['precision']} {times(r['speedup'])} ({'bytes promise ' if first else ''}" \
                   f"{br})"
        return f"{r['precision']} {times(r['speedup'])} of float32, bytes promise {br}"

    if best["speedup"] > 1:
        text = f"batch {batch}: fastest {part(best)}"
    else:
        text = f"batch {batch}: none beats float32; best {part(best)}"
    int8 = next((r for r in rows if r["precision"] == "int8"), None)
    if int8 is not None and int8 is not best:
        text += f"; {part(int8, False)}"
    return text


def kv_claim(result: dict) -> str:
    rows = [r for r in kv_rows(result) if r.get("kv_format", "none") != "none"]
    if not rows:
        return "no long-context KV cases measured"
    ctx = rows[0]["context"]
    parts = [f"{r['kv_format']} KV {times(r.get('speedup'))} (bytes promise "
             f"{times(bytes_ratio(result, r))})" for r in rows]
    return f"decode at {ctx:,} cached tokens, batch {rows[0]['batch']}: " + ", ".join(parts)


def _short_step(result: dict, row: dict) -> dict | None:
    """The float32 decode step at row's batch at the decode context, float cache: the same
    weights read with a short cache, what a long-context step adds its cache time to."""
    ctx = decode_context(result)
    return next((r for r in _steps(result) if r["precision"] == "float32"
                 and r["phase"] == "decode" and r["batch"] == row["batch"]
                 and r["context"] == ctx and r.get("kv_format", "none") == "none"), None)


def kv_cause(result: dict) -> str | None:
    """Why a KV format's measured speedup differs from its bytes ratio, from the data: the
    long-context step's time beyond the short-context step of the same weights is its cache's
    time; the float cache's bandwidth there against the short step's, that time's share of
    the step, and each format's cache bytes and cache time against the float cache's. None
    without a float-cache long step and a short step to subtract."""
    rows = kv_rows(result)
    base = next((r for r in rows if r.get("kv_format", "none") == "none"), None)
    short = _short_step(result, base) if base else None
    if base is None or short is None or base["context"] <= short["context"] or \
            not base.get("kv_bytes") or short.get("kv_bytes") is None:
        return None
    extra_t = base["seconds"] - short["seconds"]
    extra_kv = base["kv_bytes"] - short["kv_bytes"]
    if extra_t <= 0 or extra_kv <= 0:
        return None
    text = (f"the float32 cache's {_mb(extra_kv)} MB more than at {short['context']:,} tokens "
            f"cost {_ms(extra_t)} ms more ({_gbs(extra_kv / extra_t)}, where the "
            f"{short['context']:,}-token step read its bytes at "
            f"{_gbs(short['bytes'] / short['seconds'])}): the cache is "
            f"{extra_t / base['seconds']:.0%} of the {base['context']:,}-token step's time, so "
            f"a cache format's speedup follows its cache time, not the step's total bytes")
    parts = []
    for r in rows:
        if r is base or not r.get("kv_bytes") or r.get("seconds") is None:
            continue
        own = r["seconds"] - short["seconds"]
        if own <= 0:
            how = "no time beyond the short step"
        elif own <= extra_t:
            how = f"cache time {num(extra_t / own)}x shorter"
        else:
            how = f"cache time {num(own / extra_t)}x longer"
        parts.append(f"{r['kv_format']} KV {num(base['kv_bytes'] / r['kv_bytes'])}x fewer cache "
                     f"bytes, {how}")
    return text + (": " + "; ".join(parts) if parts else "")


def formulation_claim(result: dict, rows: int) -> str:
    """At `rows` activation rows: the float32 dot's bandwidth, the fastest quantized
    formulation and refmodel's own quantized formulations, each with its speedup."""
    fs = [r for r in _forms(result) if r["rows"] == rows]
    ref = next((r for r in fs if r["name"] == "float32 dot"), None)
    quant = [r for r in fs if r["format"] not in ("float32", "bfloat16")]
    if ref is None or not quant:
        return f"{rows} row(s): no quantized formulation measured"
    best = max(quant, key=lambda r: r["speedup"])
    used = [r for r in quant if r.get("used")]
    text = (f"{rows} row{'s' if rows != 1 else ''}: float32 dot {_gbs(ref['bytes_per_s'])}; "
            f"fastest quantized '{best['name']}' {_gbs(best['bytes_per_s'])} "
            f"({times(best['speedup'])})")
    used_int8 = next((r for r in used if r["format"] == "int8"), used[0] if used else None)
    if used_int8 is not None and used_int8 is not best:
        text += (f"; refmodel uses '{used_int8['name']}' {_gbs(used_int8['bytes_per_s'])} "
                 f"({times(used_int8['speedup'])})")
    return text


def _weight_rows(result: dict) -> list[dict]:
    return [r for r in _quality(result) if r.get("kv_format", "none") == "none"]


def _kv_quality_rows(result: dict) -> list[dict]:
    """The float-weight rows, unquantized cache first: the KV formats' quality."""
    rows = [r for r in _quality(result) if r.get("weight_format", "none") == "none"]
    return sorted(rows, key=lambda r: r.get("kv_format", "none") != "none")


def quality_claim(result: dict, short: bool = False) -> str:
    """The bits per byte each quantized weight format adds (short: without the bytes)."""
    rows = _weight_rows(result)
    base = next((r for r in rows if r["weight_format"] == "none"), None)
    quant = [r for r in rows if r["weight_format"] != "none"]
    if base is None or not quant:
        return "no quantized weight format evaluated"
    parts = [f"{r['weight_format']} {_signed(r.get('delta_bits_per_byte'))}" + (
        "" if short else f" at {num(r['weight_bytes'] / base['weight_bytes'])}x the bytes")
        for r in quant]
    return "bits per byte vs float32 weights: " + ", ".join(parts)


def kv_quality_claim(result: dict) -> str:
    rows = [r for r in _kv_quality_rows(result) if r.get("kv_format", "none") != "none"]
    if not rows:
        return "no quantized KV format evaluated"
    return "KV cache: " + ", ".join(
        f"{r['kv_format']} {_signed(r.get('delta_bits_per_byte'))} bits/byte, logit error "
        f"{_pct(r.get('logit_error'))}" for r in rows)


def _model_line(result: dict) -> str:
    q = result.get("quality") or {}
    return f"{q.get('preset', '?')} ({q.get('recipe', '?')} recipe)"


# ------------------------------------------------------------------ the panels

MARKERS = "osD^vP*X"


def _points(ax, rows: list[dict], x_key: str, fmt_key: str, x_scale: float, what: str
            ) -> list[tuple]:
    """One marker per format at (x, bits per byte), described in full in the legend. Returns
    the labels to write beside them, (x, y, text), once the layout is final (formats that
    land on the same point share one)."""
    groups: dict = {}
    for i, r in enumerate(rows):
        name = fmt_name(r[fmt_key])
        x = r[x_key] / x_scale
        ax.plot([x], [r["bits_per_byte"]], MARKERS[i % len(MARKERS)], ms=11 - 1.5 * i,
                color=_color(name, i), mec="black", mew=0.6, ls="",
                label=f"{name}: {num(x)} {what}\n{_signed(r.get('delta_bits_per_byte'))} "
                      f"bits/B, logit err {_pct(r.get('logit_error'))}")
        groups.setdefault((x, round(r["bits_per_byte"], 9)), []).append(name)
    return [(x, y, " = ".join(names)) for (x, y), names in groups.items()]


def _quality_panel(ax, kv_ax, result: dict) -> list[tuple]:
    """Bits per byte against the bytes of each weight format, and of each KV format. Returns
    each axes' point labels to place: [(axes, [(x, y, text)])]."""
    rows = _weight_rows(result)
    if not rows:
        _note(ax, "no quality results")
        _note(kv_ax, "")
        return []
    q = result.get("quality") or {}
    labels = [(ax, _points(ax, rows, "weight_bytes", "weight_format", 1e6, "MB"))]
    ax.set_xlim(0, max(r["weight_bytes"] for r in rows) / 1e6 * 1.3)
    ys = [r["bits_per_byte"] for r in _quality(result)]
    pad = max(max(ys) - min(ys), 1e-3 * max(ys))
    ax.set_ylim(min(ys) - 0.15 * pad, max(ys) + 1.0 * pad)  # room for the legends above
    ax.set_xlabel("weight bytes of the model (MB, as stored)")
    ax.set_ylabel(f"{q.get('metric', 'bits per byte')}")
    ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:.3f}"))
    ax.legend(loc="upper right", fontsize=8, title="weights (KV float32)", title_fontsize=8.5)
    ax.set_title(f"(a) quality: {_model_line(result)}\n"
                 + quality_claim(result, True).replace("bits per byte vs float32 weights",
                                                       "bits/B vs float32"),
                 fontsize=11, loc="left")
    kv = _kv_quality_rows(result)
    kv_ax.tick_params(labelleft=False)
    kv_ax.set_title("KV formats", fontsize=11)
    if not any(r.get("kv_format", "none") != "none" for r in kv):
        _note(kv_ax, "no quantized\nKV format")
        return labels
    labels.append((kv_ax, _points(kv_ax, kv, "kv_bytes_per_token", "kv_format", 1, "B/token")))
    kv_ax.set_xlim(0, max(r["kv_bytes_per_token"] for r in kv) * 1.4)
    kv_ax.set_xlabel("KV cache bytes per token")
    kv_ax.legend(loc="upper right", fontsize=8, title="KV (weights float32)",
                 title_fontsize=8.5)
    return labels


def _steps_panel(ax, result: dict) -> None:
    batches = decode_batches(result)
    if not batches:
        _note(ax, "no decode steps")
        return
    precisions = _unique(r["precision"] for b in batches for r in decode_rows(result, b))
    x = np.arange(len(precisions))
    width = 0.8 / len(batches)
    bars = []  # (x, speedup, bytes ratio)
    for j, b in enumerate(batches):
        by = {r["precision"]: r for r in decode_rows(result, b)}
        off = (j - (len(batches) - 1) / 2) * width
        for i, p in enumerate(precisions):
            r = by.get(p)
            if r is None or r.get("speedup") is None:
                continue
            ax.bar(x[i] + off, r["speedup"], width * 0.9, color=PALETTE[j], edgecolor="black",
                   lw=0.5)
            br = bytes_ratio(result, r)
            if br is not None:
                ax.plot([x[i] + off], [br], "D", color="black", mfc="white", ms=7, mew=1.4)
            bars.append((x[i] + off, r["speedup"], br))
    ymax = max([1.0] + [v for _, s, br in bars for v in (s, br) if v is not None]) * 1.25
    for xb, sp, br in bars:
        y = sp
        if br is not None and 0 <= br - sp < 0.07 * ymax:  # the marker sits on the bar top
            y = br + 0.02 * ymax
        ax.text(xb, y, f"{num(sp, 2)}x", ha="center", va="bottom", fontsize=9,
                fontweight="bold")
        if br is not None and abs(br - 1) > 1e-9 and br - sp >= 0.07 * ymax:
            ax.text(xb, br + 0.02 * ymax, f"{num(br, 2)}x", ha="center", va="bottom",
                    fontsize=8.5, color="0.3")
    ax.axhline(1.0, color="0.3", lw=1.2)
    ax.set_xticks(x, precisions)
    ax.set_xlim(-0.6, len(precisions) - 0.4)
    ax.set_ylim(0, ymax)
    steps = result.get("steps") or {}
    ax.set_xlabel(f"precision of weights (w8a8: activations int8 too)\ndecode step, model "
                  f"{steps.get('model', '?')}, {decode_context(result)} cached tokens")
    ax.set_ylabel("speedup over float32 (x)")
    handles = [Patch(color=PALETTE[j], label=f"measured, batch {b}: float32 time / this time")
               for j, b in enumerate(batches)]
    handles += [Line2D([], [], ls="", marker="D", color="black", mfc="white", ms=7, mew=1.4,
                       label="bytes ratio: float32 counted bytes / these\n"
                             "(the speedup of a memory-bound step)"),
                Line2D([], [], color="0.3", lw=1.2, label="1: as fast as float32")]
    ax.legend(handles=handles, loc="upper left", fontsize=8.5)
    ax.set_title("(b) " + "\n".join(step_claim(result, b, short=True) for b in batches),
                 fontsize=11, loc="left")


def _memory_roof(result: dict) -> tuple[float, str] | None:
    roofs = result.get("roofs")
    if roofs and roofs.get("memory"):
        return roofs["memory"], f"DRAM read roof from {roofs.get('source', '?')}"
    roof = (result.get("steps") or {}).get("memory_roof")
    return (roof, "memory roof of the step predictions") if roof else None


def _formulation_panel(ax, result: dict) -> None:
    fs = _forms(result)
    if not fs:
        _note(ax, "no formulations measured")
        return
    names = _unique(r["name"] for r in fs)
    row_counts = sorted({r["rows"] for r in fs})
    used = {r["name"] for r in fs if r.get("used")}
    y = np.arange(len(names))[::-1]
    height = 0.8 / len(row_counts)
    top = []
    for j, m in enumerate(row_counts):
        by = {r["name"]: r for r in fs if r["rows"] == m}
        off = ((len(row_counts) - 1) / 2 - j) * height
        for i, name in enumerate(names):
            r = by.get(name)
            if r is None:
                continue
            gbs = r["bytes_per_s"] / 1e9
            top.append(gbs)
            ax.barh(y[i] + off, gbs, height * 0.92, color=PALETTE[j], edgecolor="black",
                    lw=1.6 if name in used else 0.4, hatch="//" if name in used else None)
            ax.text(gbs, y[i] + off, f" {num(gbs)} GB/s, {times(r.get('speedup'))}",
                    va="center", fontsize=8.5)
        ref = by.get("float32 dot")
        if ref is not None:
            ax.axvline(ref["bytes_per_s"] / 1e9, color=PALETTE[j], ls="--", lw=1.3)
    roof = _memory_roof(result)
    if roof is not None:
        ax.axvline(roof[0] / 1e9, color="0.2", ls=":", lw=1.5)
        top.append(roof[0] / 1e9)
    ax.set_yticks(y, [f"{n} [{_form_format(fs, n)}]" for n in names])
    for label, name in zip(ax.get_yticklabels(), names, strict=True):
        if name in used:
            label.set_fontweight("bold")
    ax.set_xlim(0, max(top) * 1.35)
    ax.set_ylim(-0.6, len(names) - 0.4)
    f = result.get("formulations") or {}
    ax.set_xlabel(f"bandwidth: stored weight bytes / measured time (GB/s); "
                  f"weight [K, N] = [{f.get('k', '?')}, {f.get('n', '?')}]; "
                  f"label: GB/s, speedup over the float32 dot")
    handles = [Patch(color=PALETTE[j], label=f"x with {m} row{'s' if m != 1 else ''}")
               for j, m in enumerate(row_counts)]
    handles += [Patch(facecolor="white", edgecolor="black", lw=1.6, hatch="//",
                      label="bold, hatched: the formulation refmodel uses"),
                Line2D([], [], color="0.3", ls="--", lw=1.3,
                       label="float32 dot's bandwidth (per row count, its color)")]
    if roof is not None:
        handles.append(Line2D([], [], color="0.2", ls=":", lw=1.5,
                              label=f"{roof[1]}: {fmt_si(roof[0], 'B/s')}"))
    ax.legend(handles=handles, loc="lower right", fontsize=8.5)
    claims = "\n".join(formulation_claim(result, m) for m in row_counts)
    ax.set_title(f"(c) formulations of x @ W (bytes become speed only when the kernel streams "
                 f"them)\n{claims}".replace(")\n", "): ", 1), fontsize=11, loc="left")


def _form_format(fs: list[dict], name: str) -> str:
    return next(r["format"] for r in fs if r["name"] == name)


def suptitle(result: dict) -> str:
    steps = result.get("steps") or {}
    f = result.get("formulations") or {}
    return (f"Quantization on {machine_name(result.get('environment'))}: `{COMMAND}`\n"
            f"steps: model {steps.get('model', '?')}; quality: {_model_line(result)}; "
            f"formulations: [{f.get('k', '?')}, {f.get('n', '?')}] weight")


@styled
def quant_figure(result: dict):
    fig, _ = new_figure(18, 13)
    fig.clear()
    grid = fig.add_gridspec(2, 3, width_ratios=[2.0, 1.1, 2.8], height_ratios=[1.1, 1.0])
    ax_q = fig.add_subplot(grid[0, 0])
    ax_kv = fig.add_subplot(grid[0, 1], sharey=ax_q)
    ax_s = fig.add_subplot(grid[0, 2])
    ax_f = fig.add_subplot(grid[1, :])
    labels = _quality_panel(ax_q, ax_kv, result)
    _steps_panel(ax_s, result)
    _formulation_panel(ax_f, result)
    fig.suptitle(suptitle(result), fontsize=14)
    fig.supxlabel(made_by(result.get("environment")), fontsize=9, ha="left", x=0.01,
                  color="0.3")
    for ax, points in labels:
        place_labels(ax, points, fontsize=10)
    return fig


def draw_quant(result: dict, out_dir: str | Path) -> list[Path]:
    """Write quant.png into out_dir; return its path in a list."""
    check_kind(result, "quant")
    return [save(quant_figure(result), Path(out_dir) / FILE)]


# ------------------------------------------------------------------ the summary

def quant_summary(result: dict) -> str:
    f = result.get("formulations") or {}
    steps = result.get("steps") or {}
    q = result.get("quality") or {}
    lines = [f"# quantization on {machine_name(result.get('environment'))}", "",
             f"`{COMMAND}`: speedup = float32 time / this time, the median of the ratios of "
             f"interleaved rounds; bytes ratio = float32's counted bytes / these counted bytes "
             f"(the speedup a memory-bound step would get).", "",
             f"## formulations: x @ W, W [K, N] = [{f.get('k', '?')}, {f.get('n', '?')}]", ""]
    row_counts = sorted({r["rows"] for r in _forms(result)})
    lines += [f"{formulation_claim(result, m)}." for m in row_counts] or ["none measured."]
    lines += [""]
    lines += md_table(["formulation", "format", "rows", "refmodel uses", "stored MB", "ms",
                     "GB/s", "speedup"],
                    [[r["name"], r["format"], r["rows"], "yes" if r.get("used") else "no",
                      _mb(r.get("stored_bytes")), _ms(r.get("seconds")),
                      num(r["bytes_per_s"] / 1e9), times(r.get("speedup"))]
                     for r in _forms(result)])
    lines += ["", f"## steps: model {steps.get('model', '?')}", ""]
    lines += [f"{step_claim(result, b)}." for b in decode_batches(result)]
    lines += [f"{kv_claim(result)}."]
    cause = kv_cause(result)
    if cause:
        lines += [f"Why, measured: {cause}."]
    rows = _steps(result)
    predicted = any(r.get("measured_over_predicted") is not None for r in rows)
    header = ["precision", "phase", "batch", "context", "KV", "ms", "speedup", "bytes ratio",
              "counted MB", "GB/s"] + (["measured / predicted"] if predicted else [])
    table = []
    for r in rows:
        row = [r["precision"], r["phase"], r["batch"], r["context"],
               fmt_name(r.get("kv_format")), _ms(r.get("seconds")), times(r.get("speedup")),
               times(bytes_ratio(result, r)), _mb(r.get("bytes")),
               num(r["bytes_per_s"] / 1e9) if r.get("bytes_per_s") else "n/a"]
        if predicted:
            row.append(_pct(r.get("measured_over_predicted")))
        table.append(row)
    lines += [""] + md_table(header, table)
    roof = _memory_roof(result)
    lines += ["", "memory roof: " + (f"{fmt_si(roof[0], 'B/s')} ({roof[1]}); measured / "
                                     f"predicted = (counted bytes / roof) / measured time"
                                     if roof else "none recorded (no prediction)")]
    lines += ["", f"## quality: {_model_line(result)}, {q.get('metric', '?')}", "",
              f"{quality_claim(result)}.", f"{kv_quality_claim(result)}.", ""]
    lines += md_table(["weights", "KV", "bits/byte", "delta", "logit error", "weight MB",
                     "KV bytes/token"],
                    [[fmt_name(r.get("weight_format")), fmt_name(r.get("kv_format")),
                      f"{r['bits_per_byte']:.4f}", _signed(r.get("delta_bits_per_byte")),
                      _pct(r.get("logit_error")), _mb(r.get("weight_bytes")),
                      num(r.get("kv_bytes_per_token"))]
                     for r in _quality(result)])
    lines += wall_time(result)
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    return redraw_main(argv, "quant", draw_quant, quant_summary)


if __name__ == "__main__":
    sys.exit(main())
