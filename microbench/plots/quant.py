"""The quantization figure and summary, drawn only from a saved quant result (quant.json,
`python -m microbench quant`): the decode step's measured speedup over float32 against the
bytes ratio its format promises, on the native kernel and on XLA; the quality each weight,
activation and KV format costs (bits per byte, KL divergence from the float model) beside the
bytes it saves; and the bandwidth each of XLA's formulations of a quantized product reaches.

Every title states numbers computed here from the JSON (each format's speedup on each path
and its bytes ratio, the bits per byte and KL each format adds, the bandwidth of the
formulation refmodel uses); nothing in a title is assumed. A result whose steps record no
path (an older layout) is read as XLA's path, and its claims name no path. Imports matplotlib,
numpy and microbench.plots only (no JAX): `python -m microbench.plots.quant quant.json
[out_dir]` redraws a saved result.
"""

from __future__ import annotations

import sys
import textwrap
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
    plain_log,
    redraw_main,
    save,
    styled,
    times,
    wall_time,
)
from microbench.plots.serving import _note, machine_name

FILE = "quant.png"
COMMAND = "python -m microbench quant"
COLORS = {"float32": "0.35", "bfloat16": PALETTE[0], "int8": PALETTE[1], "float8": PALETTE[2],
          "int4": PALETTE[3], "int8 w8a8": PALETTE[4], "int4 w4a8": PALETTE[5]}
PATH_NAMES = {"native": "the native kernel", "xla": "XLA"}
BATCH_MARKERS = {1: "o", 8: "s"}
SMALL = {"fontsize": 9, "color": "0.3"}


# ------------------------------------------------------------------ formatting

def fmt_name(fmt: str | None) -> str:
    """A weight or KV format as drawn: 'none' (unquantized) -> 'float32'."""
    return "float32" if fmt in (None, "none") else str(fmt)


def _color(name: str, i: int = 0):
    return COLORS.get(name, COLORS.get(name.split()[0], PALETTE[(i + 6) % len(PALETTE)]))


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


def _kl(value) -> str:
    """A KL divergence in nats: 2.4e-05, 0.0083, 0."""
    if value is None:
        return "n/a"
    return "0" if value == 0 else f"{value:.2g}"


# ------------------------------------------------------------------ selecting from the result

def _forms(result: dict) -> list[dict]:
    return (result.get("formulations") or {}).get("results") or []


def _steps(result: dict) -> list[dict]:
    return (result.get("steps") or {}).get("results") or []


def _quality(result: dict) -> list[dict]:
    """The quality rows measured (not those skipped)."""
    return [r for r in (result.get("quality") or {}).get("results") or []
            if "bits_per_byte" in r]


def _unique(values) -> list:
    out = []
    for v in values:
        if v not in out:
            out.append(v)
    return out


def path_of(row: dict) -> str:
    """The path a step row ran on; a row that records none is XLA's (the older layout)."""
    return row.get("path", "xla")


def _where(result: dict, path: str) -> str:
    """' on the native kernel' / ' on XLA' where the steps record their path, else ''."""
    return f" on {PATH_NAMES[path]}" if any("path" in r for r in _steps(result)) else ""


def skipped(result: dict) -> list[dict]:
    """The step cases recorded as skipped: [{path, precision, phase, reason}]."""
    return (result.get("steps") or {}).get("skipped") or []


def path_skipped(result: dict, path: str) -> str | None:
    """Why a whole path was skipped ("skipped: ..."), or None."""
    return next((s["reason"] for s in skipped(result) if s["path"] == path
                 and s.get("precision") is None), None)


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


def decode_rows(result: dict, batch: int, path: str = "xla") -> list[dict]:
    """The decode steps of every precision on `path` at `batch` and the decode context,
    float32 first."""
    ctx = decode_context(result)
    rows = [r for r in _steps(result) if r["phase"] == "decode" and r["batch"] == batch
            and r["context"] == ctx and r.get("kv_format", "none") == "none"
            and path_of(r) == path]
    return sorted(rows, key=lambda r: r["precision"] != "float32")


def decode_batches(result: dict) -> list[int]:
    ctx = decode_context(result)
    return sorted({r["batch"] for r in _steps(result) if r["phase"] == "decode"
                   and r["context"] == ctx and r.get("kv_format", "none") == "none"})


def paths(result: dict) -> list[str]:
    """The paths with a measured step, the native kernel first."""
    found = {path_of(r) for r in _steps(result)}
    return [p for p in PATH_NAMES if p in found]


def _reference(result: dict, row: dict) -> dict | None:
    """The float32 row of row's path with its phase, batch and context, float cache."""
    for r in _steps(result):
        if (r["precision"] == "float32" and r.get("kv_format", "none") == "none"
                and path_of(r) == path_of(row) and (r["phase"], r["batch"], r["context"]) ==
                (row["phase"], row["batch"], row["context"])):
            return r
    return None


def bytes_ratio(result: dict, row: dict) -> float | None:
    """float32's counted bytes over row's: the speedup a memory-bound step would get (as the
    row records it, else from its float32 row)."""
    if row.get("bytes_ratio") is not None:
        return row["bytes_ratio"]
    ref = _reference(result, row)
    if ref is None or not row.get("bytes"):
        return None
    return ref["bytes"] / row["bytes"]


def kv_rows(result: dict) -> list[dict]:
    """The long-context decode steps comparing KV formats (the float cache first)."""
    ctxs = _kv_contexts(result)
    rows = [r for r in _steps(result) if r["phase"] == "decode" and r["context"] in ctxs
            and r["precision"] == "float32" and path_of(r) == "xla"]
    return sorted(rows, key=lambda r: r.get("kv_format", "none") != "none")


def _spread(row: dict) -> tuple[float, float] | None:
    """The lowest and highest per-round speedup of a row, when it keeps them."""
    rounds = row.get("speedup_rounds")
    return (min(rounds), max(rounds)) if rounds else None


# ------------------------------------------------------------------ the headlines

def step_claim(result: dict, batch: int = 1, path: str = "xla", short: bool = False) -> str:
    """The fastest quantized decode step on `path` at `batch` against float32, beside its bytes
    ratio; int8's too when int8 is not the fastest. short: the title's form."""
    rows = [r for r in decode_rows(result, batch, path) if r["precision"] != "float32"
            and r.get("speedup") is not None]
    head = f"batch {batch}{_where(result, path)}"
    if not rows:
        return f"{head}: {path_skipped(result, path) or 'no quantized decode step measured'}"
    best = max(rows, key=lambda r: r["speedup"])

    def part(r, first=True):
        br = times(bytes_ratio(result, r))
        if short:
            return f"{r['precision']} {times(r['speedup'])} ({'bytes promise ' if first else ''}" \
                   f"{br})"
        return f"{r['precision']} {times(r['speedup'])} of float32, bytes promise {br}"

    if best["speedup"] > 1:
        text = f"{head}: fastest {part(best)}"
    else:
        text = f"{head}: none beats float32; best {part(best)}"
    int8 = next((r for r in rows if r["precision"] == "int8"), None)
    if int8 is not None and int8 is not best:
        text += f"; {part(int8, False)}"
    return text


def follow_claim(result: dict, batch: int = 1, short: bool = False) -> str:
    """Each format measured on both paths at `batch` (else on any): its bytes ratio and its
    speedup on each path: 'batch 1: int8 (3.95x fewer bytes) 3.19x on the native kernel, 0.720x
    on XLA; ...'. short: int8 alone (else the first such format), the paths' short names."""
    by_path = {p: {r["precision"]: r for r in decode_rows(result, batch, p)
                   if r["precision"] != "float32"} for p in paths(result)}
    common_ = set.intersection(*(set(v) for v in by_path.values())) if by_path else set()
    labels = [lab for lab in _unique(lab for v in by_path.values() for lab in v)
              if lab in common_ or not common_]
    if not labels:
        return f"batch {batch}: no quantized decode step measured"
    if short:
        labels = ["int8"] if "int8" in labels else labels[:1]
    names = {"native": "native", "xla": "XLA"} if short else \
        {p: f"on {n}" for p, n in PATH_NAMES.items()}
    parts = []
    for lab in labels:
        rows = [(p, by_path[p][lab]) for p in by_path if lab in by_path[p]]
        sp = ", ".join(f"{times(r['speedup'])} {names[p]}" for p, r in rows)
        fewer = f"{times(bytes_ratio(result, rows[0][1]))} fewer bytes"
        parts.append(f"{lab} {sp}, for {fewer}" if short else f"{lab} ({fewer}) {sp}")
    return f"batch {batch}: " + "; ".join(parts)


def readme_claim(result: dict) -> str:
    """The README's results-table headline: batch 1 on each path, and the model timed."""
    steps = result.get("steps") or {}
    model = f"the `{steps.get('model', '?')}` preset"
    if steps.get("layers") and (result.get("setup") or {}).get("layers"):
        model += f" cut to {steps['layers']} layers"
    if not any("path" in r for r in _steps(result)):
        return f"{step_claim(result, 1)} (decode step of {model})"
    if "native" in paths(result):
        return f"{follow_claim(result, 1)} (decode step of {model})"
    why = path_skipped(result, "native") or "not measured"
    return f"{step_claim(result, 1)}; native kernel {why} (decode step of {model})"


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
                 and r["context"] == ctx and r.get("kv_format", "none") == "none"
                 and path_of(r) == path_of(row)), None)


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


def qname(row: dict) -> str:
    """A quality row's weight format as drawn: its precision label (int8 w8a8: activations
    int8 too), else its weight format."""
    return row.get("precision") or fmt_name(row.get("weight_format"))


def _weight_rows(result: dict) -> list[dict]:
    return [r for r in _quality(result) if r.get("kv_format", "none") == "none"]


def _kv_quality_rows(result: dict) -> list[dict]:
    """The float-weight rows, unquantized cache first: the KV formats' quality."""
    rows = [r for r in _quality(result) if r.get("weight_format", "none") == "none"
            and r.get("activations", "float32") != "int8"]
    return sorted(rows, key=lambda r: r.get("kv_format", "none") != "none")


def quality_claim(result: dict, short: bool = False) -> str:
    """The bits per byte each quantized weight format adds, at its share of the bytes. short:
    the title's form, int8 and int4 alone (every format in the legend), each with its KL."""
    rows = _weight_rows(result)
    base = next((r for r in rows if qname(r) == "float32"), None)
    quant = [r for r in rows if qname(r) != "float32"]
    if base is None or not quant:
        return "no quantized weight format evaluated"
    if short:
        quant = [r for r in quant if qname(r) in ("int8", "int4")] or quant[:2]
        return "vs float32: " + ", ".join(
            f"{qname(r)} {_signed(r.get('delta_bits_per_byte'))} bits/B" + (
                f" (KL {_kl(r['kl_nats'])} nats)" if r.get("kl_nats") is not None else "")
            for r in quant)
    parts = [f"{qname(r)} {_signed(r.get('delta_bits_per_byte'))} at "
             f"{num(r['weight_bytes'] / base['weight_bytes'])}x the bytes" for r in quant]
    return "bits per byte vs float32 weights: " + ", ".join(parts)


def kl_claim(result: dict) -> str:
    """The KL divergence of each format's next-token distribution from float32's."""
    rows = [r for r in _quality(result) if r.get("kl_nats") is not None
            and (qname(r) != "float32" or r.get("kv_format", "none") != "none")]
    if not rows:
        return "no KL divergence measured"
    return "KL from float32's next token (nats): " + ", ".join(
        f"{qname(r) if r.get('kv_format', 'none') == 'none' else r['kv_format'] + ' KV'} "
        f"{_kl(r['kl_nats'])}" for r in rows)


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


def _steps_model(result: dict) -> str:
    steps = result.get("steps") or {}
    cut = steps.get("layers") if (result.get("setup") or {}).get("layers") else None
    return f"{steps.get('model', '?')}" + (f" ({cut} layers)" if cut else "")


# ------------------------------------------------------------------ the panels

MARKERS = "osD^vP*X"


def _quality_label(r: dict, name: str, x: float, what: str) -> str:
    cost = f"KL {_kl(r['kl_nats'])} nats" if r.get("kl_nats") is not None else \
        f"logit err {_pct(r.get('logit_error'))}"
    return f"{name}: {num(x)} {what}\n{_signed(r.get('delta_bits_per_byte'))} bits/B, {cost}"


def _points(ax, rows: list[dict], x_key: str, name_of, x_scale: float, what: str
            ) -> list[tuple]:
    """One marker per format at (x, bits per byte), described in full in the legend. Returns
    the labels to write beside them, (x, y, text), once the layout is final (formats that
    land on the same point share one)."""
    groups: dict = {}
    for i, r in enumerate(rows):
        name = name_of(r)
        x = r[x_key] / x_scale
        ax.plot([x], [r["bits_per_byte"]], MARKERS[i % len(MARKERS)], ms=11 - 1.2 * i,
                color=_color(name, i), mec="black", mew=0.6, ls="",
                label=_quality_label(r, name, x, what))
        groups.setdefault((x, round(r["bits_per_byte"], 9)), []).append(name)
    return [(x, y, " = ".join(names)) for (x, y), names in groups.items()]


def _quality_panel(ax, kv_ax, result: dict) -> list[tuple]:
    """Bits per byte against the bytes of each weight (and activation) format, and of each KV
    format. Returns each axes' point labels to place: [(axes, [(x, y, text)])]."""
    rows = _weight_rows(result)
    if not rows:
        _note(ax, "no quality results")
        _note(kv_ax, "")
        return []
    q = result.get("quality") or {}
    labels = [(ax, _points(ax, rows, "weight_bytes", qname, 1e6, "MB"))]
    ax.set_xlim(0, max(r["weight_bytes"] for r in rows) / 1e6 * 1.3)
    ys = [r["bits_per_byte"] for r in _quality(result)]
    pad = max(max(ys) - min(ys), 1e-3 * max(ys))
    ax.set_ylim(min(ys) - 0.15 * pad, max(ys) + 1.3 * pad)  # room for the legends above
    ax.set_xlabel("weight bytes of the model (MB, as stored)")
    ax.set_ylabel(f"{q.get('metric', 'bits per byte')}")
    ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:.3f}"))
    ax.legend(loc="upper right", fontsize=7.5, title="weights (w8a8, w4a8: activations "
              "int8)", title_fontsize=8)
    ax.set_title(f"(a) quality: {_model_line(result)}\n{quality_claim(result, True)}",
                 fontsize=10, loc="left")
    kv = _kv_quality_rows(result)
    kv_ax.tick_params(labelleft=False)
    if not any(r.get("kv_format", "none") != "none" for r in kv):
        _note(kv_ax, "no quantized\nKV format")
        return labels
    labels.append((kv_ax, _points(kv_ax, kv, "kv_bytes_per_token",
                                  lambda r: fmt_name(r.get("kv_format")), 1, "B/token")))
    kv_ax.set_xlim(0, max(r["kv_bytes_per_token"] for r in kv) * 1.4)
    kv_ax.set_xlabel("KV cache bytes per token")
    kv_ax.legend(loc="upper right", fontsize=7.5, title="KV (weights float32)",
                 title_fontsize=8)
    return labels


def _follow_points(ax, result: dict) -> list[tuple]:
    """Every quantized decode step as a point (bytes ratio, speedup), its rounds' range as an
    error bar: filled on the native kernel, hollow on XLA. Returns the labels to place."""
    labels = []
    for path in paths(result):
        for b in decode_batches(result):
            for r in decode_rows(result, b, path):
                br = bytes_ratio(result, r)
                if r["precision"] == "float32" or br is None or r.get("speedup") is None:
                    continue
                color = _color(r["precision"])
                spread = _spread(r)
                yerr = None if spread is None else \
                    [[max(0, r["speedup"] - spread[0])], [max(0, spread[1] - r["speedup"])]]
                ax.errorbar([br], [r["speedup"]], yerr=yerr, fmt=BATCH_MARKERS.get(b, "D"),
                            ms=9, color=color, mec=color if path == "native" else "black",
                            mfc=color if path == "native" else "white", mew=1.6,
                            elinewidth=1, capsize=3, ecolor=color)
                tag = "" if b == 1 else f" b{b}"
                labels.append((br, r["speedup"], f"{r['precision']}{tag} {num(r['speedup'], 2)}x"))
    return labels


def _follow_panel(ax, result: dict) -> list[tuple]:
    """Measured speedup over float32 against the bytes ratio, log-log, with y = x: a step
    that streams its bytes lies on the line. Returns the point labels to place."""
    labels = _follow_points(ax, result)
    if not labels:
        _note(ax, "no quantized decode step measured")
        return []
    xs, ys = [x for x, _, _ in labels], [y for _, y, _ in labels]
    lo, hi = min(min(ys), 1) / 1.8, max(max(ys), max(xs)) * 2.2
    ax.set_xscale("log")
    ax.set_yscale("log")
    line = np.array([1, max(xs) * 1.4])
    ax.plot(line, line, "--", color="black", lw=1.3, zorder=1)
    ax.axhline(1.0, color="0.5", lw=1, zorder=1)
    ax.set_xlim(0.85, max(xs) * 1.4)
    ax.set_ylim(lo, hi)
    plain_log(ax)
    ax.set_xlabel(f"bytes ratio: float32's counted bytes / the format's\ndecode step, model "
                  f"{_steps_model(result)}, {decode_context(result)} cached tokens")
    ax.set_ylabel("measured speedup over float32 (x)")
    handles = [Line2D([], [], ls="", marker="o", color="0.3", ms=8,
                      label="filled: the native kernel")] if "native" in paths(result) else []
    handles += [Line2D([], [], ls="", marker="o", color="0.3", mfc="white", mec="black", ms=8,
                       label="hollow: XLA (no kernel for the format)")]
    handles += [Line2D([], [], ls="", marker=m, color="0.3", mfc="none", ms=8,
                       label=f"batch {b}") for b, m in BATCH_MARKERS.items()
                if b in decode_batches(result)]
    handles += [Line2D([], [], ls="--", color="black", lw=1.3,
                       label="y = x: the step follows the bytes"),
                Line2D([], [], color="0.5", lw=1, label="1: as fast as float32"),
                Line2D([], [], color="0.3", lw=1, marker="_",
                       label="bar: lowest to highest round")]
    handles += [Line2D([], [], ls="", label=textwrap.shorten(
        f"{s['path']} {s.get('precision') or ''} {s.get('phase') or ''} {s['reason']}", 60))
        for s in skipped(result)]
    ax.legend(handles=handles, loc="upper left", fontsize=8.5)
    claims = [follow_claim(result, b, short=True) for b in decode_batches(result)]
    if len(claims) == 1:
        claims.append("y = x: the step follows the bytes")
    ax.set_title(f"(b) decode step, {claims[0]}\n" + "; ".join(claims[1:]), fontsize=10,
                 loc="left")
    return labels


def _memory_roof(result: dict) -> tuple[float, str] | None:
    roofs = result.get("roofs")
    if roofs and roofs.get("memory"):
        return roofs["memory"], f"DRAM read roof from {roofs.get('source', '?')}"
    roof = (result.get("steps") or {}).get("memory_roof")
    return (roof, "memory roof of the step predictions") if roof else None


# ------------------------------------------------------------------ the formulations

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
    ax.set_title(f"(c) XLA's formulations of x @ W, {claims}", fontsize=11, loc="left")


def _form_format(fs: list[dict], name: str) -> str:
    return next(r["format"] for r in fs if r["name"] == name)


def suptitle(result: dict) -> str:
    f = result.get("formulations") or {}
    return (f"Quantization on {machine_name(result.get('environment'))}: `{COMMAND}`\n"
            f"steps: model {_steps_model(result)}; quality: {_model_line(result)}; "
            f"formulations: [{f.get('k', '?')}, {f.get('n', '?')}] weight")


@styled
def quant_figure(result: dict):
    fig, _ = new_figure(18, 13)
    fig.clear()
    grid = fig.add_gridspec(2, 3, width_ratios=[2.0, 1.1, 2.8], height_ratios=[1.15, 1.0])
    ax_q = fig.add_subplot(grid[0, 0])
    ax_kv = fig.add_subplot(grid[0, 1], sharey=ax_q)
    ax_s = fig.add_subplot(grid[0, 2])
    ax_f = fig.add_subplot(grid[1, :])
    labels = _quality_panel(ax_q, ax_kv, result)
    labels.append((ax_s, _follow_panel(ax_s, result)))
    _formulation_panel(ax_f, result)
    fig.suptitle(suptitle(result), fontsize=14)
    fig.supxlabel(made_by(result.get("environment")), fontsize=9, ha="left", x=0.01,
                  color="0.3")
    for ax, points in labels:
        if points:
            place_labels(ax, points, fontsize=9 if ax is ax_s else 10)
    return fig


@styled
def follow_figure(result: dict):
    """Panel (b) alone: the decode steps' speedup against their bytes ratio (a notebook's)."""
    fig, ax = new_figure(10, 6.5)
    labels = _follow_panel(ax, result)
    fig.supxlabel(made_by(result.get("environment")), fontsize=9, ha="left", x=0.01,
                  color="0.3")
    if labels:
        place_labels(ax, labels, fontsize=9)
    return fig


def draw_quant(result: dict, out_dir: str | Path) -> list[Path]:
    """Write quant.png into out_dir; return its path in a list."""
    check_kind(result, "quant")
    return [save(quant_figure(result), Path(out_dir) / FILE)]


# ------------------------------------------------------------------ the summary

def _formulation_lines(result: dict) -> list[str]:
    f = result.get("formulations") or {}
    lines = [f"## formulations: x @ W, W [K, N] = [{f.get('k', '?')}, {f.get('n', '?')}]", ""]
    row_counts = sorted({r["rows"] for r in _forms(result)})
    lines += [f"{formulation_claim(result, m)}." for m in row_counts] or ["none measured."]
    return lines + [""] + md_table(
        ["formulation", "format", "rows", "refmodel uses", "stored MB", "ms", "GB/s", "speedup"],
        [[r["name"], r["format"], r["rows"], "yes" if r.get("used") else "no",
          _mb(r.get("stored_bytes")), _ms(r.get("seconds")), num(r["bytes_per_s"] / 1e9),
          times(r.get("speedup"))] for r in _forms(result)])


def _step_lines(result: dict) -> list[str]:
    rows = _steps(result)
    lines = ["", f"## steps: model {_steps_model(result)}", ""]
    lines += [f"{follow_claim(result, b)}." for b in decode_batches(result)]
    lines += [f"{step_claim(result, b, p)}." for b in decode_batches(result)
              for p in paths(result)]
    lines += [f"Skipped: {s['path']} {s.get('precision') or '(every precision)'}"
              f"{' ' + s['phase'] if s.get('phase') else ''}: {s['reason']}."
              for s in skipped(result)]
    lines += [f"{kv_claim(result)}."]
    cause = kv_cause(result)
    if cause:
        lines += [f"Why, measured: {cause}."]
    predicted = any(r.get("measured_over_predicted") is not None for r in rows)
    header = ["path", "precision", "phase", "batch", "context", "KV", "ms", "speedup",
              "rounds' range", "bytes ratio", "counted MB", "GB/s"] + \
        (["measured / predicted"] if predicted else [])
    table = []
    for r in rows:
        spread = _spread(r)
        row = [path_of(r), r["precision"], r["phase"], r["batch"], r["context"],
               fmt_name(r.get("kv_format")), _ms(r.get("seconds")), times(r.get("speedup")),
               "n/a" if spread is None else f"{num(spread[0], 2)}-{num(spread[1], 2)}x",
               times(bytes_ratio(result, r)), _mb(r.get("bytes")),
               num(r["bytes_per_s"] / 1e9) if r.get("bytes_per_s") else "n/a"]
        if predicted:
            row.append(_pct(r.get("measured_over_predicted")))
        table.append(row)
    lines += [""] + md_table(header, table)
    roof = _memory_roof(result)
    return lines + ["", "memory roof: " + (f"{fmt_si(roof[0], 'B/s')} ({roof[1]}); measured / "
                                           f"predicted = (counted bytes / roof) / measured time"
                                           if roof else "none recorded (no prediction)")]


def _quality_lines(result: dict) -> list[str]:
    q = result.get("quality") or {}
    lines = ["", f"## quality: {_model_line(result)}, {q.get('metric', '?')}", "",
             f"{quality_claim(result)}.", f"{kl_claim(result)}.", f"{kv_quality_claim(result)}."]
    lines += [f"Skipped: {r.get('precision')}, KV {fmt_name(r.get('kv_format'))}: "
              f"{r['skipped']}." for r in q.get("results") or [] if r.get("skipped")]
    return lines + [""] + md_table(
        ["weights", "activations", "KV", "bits/byte", "delta", "KL (nats)", "logit error",
         "weight MB", "KV bytes/token"],
        [[qname(r), r.get("activations", "float32"), fmt_name(r.get("kv_format")),
          f"{r['bits_per_byte']:.4f}", _signed(r.get("delta_bits_per_byte")),
          _kl(r.get("kl_nats")), _pct(r.get("logit_error")), _mb(r.get("weight_bytes")),
          num(r.get("kv_bytes_per_token"))] for r in _quality(result)])


def quant_summary(result: dict) -> str:
    lines = [f"# quantization on {machine_name(result.get('environment'))}", "",
             f"`{COMMAND}`: speedup = float32 time / this time on the same path (the native "
             f"kernel, or XLA), the median of the ratios of interleaved rounds; bytes ratio = "
             f"float32's counted bytes / these counted bytes (the speedup of a memory-bound "
             f"step that streams its bytes).", ""]
    lines += _formulation_lines(result) + _step_lines(result) + _quality_lines(result)
    lines += wall_time(result)
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    return redraw_main(argv, "quant", draw_quant, quant_summary)


if __name__ == "__main__":
    sys.exit(main())
