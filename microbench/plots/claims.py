"""What the phase figures say, computed from the plotted data: pure functions, no drawing.

Every title and footnote of a phase figure states what its data show (the scaling book's
inference chapter for throughput vs interactivity; Williams, Waterman & Patterson's roofline
for "below the ridge"): growth ratios across a batch sweep, where attention overtakes the FFN
only as far as the noise allows, which roof bounds each point, how KV bytes grow, how many
points sit within roofline.BAND of their prediction. Each returns text or numbers and is
tested on its own.
"""

from __future__ import annotations

import math
import re
import textwrap
from collections import Counter
from collections.abc import Sequence

from microbench.roofline import BAND
from microbench.schema import PHASE_NAMES

BACKENDS = {"reference": "reference (the model files' own code)",
            "xla": "xla (XLA's layouts)",
            "output-major": "output-major (XLA, weights stored [out, in])",
            "native": "native (the C++ kernels where they apply, else xla)",
            "pallas": "pallas (the Pallas kernels where they apply, else xla)"}


def backends(points: Sequence[dict]) -> str:
    """Who ran the points' ops (ModelConfig.backend, `refmodel/ops.py`)."""
    kinds = sorted({p.get("backend", "xla") for p in points})
    return ", ".join(BACKENDS.get(k, k) for k in kinds) or "-"


PROFILED = re.compile(r"^(most time lost in|slowest op) (.+?): ([\d.]+ ms) \((\d+)% of the call\)")


def profiled_clause(clause: str) -> str:
    """A reason's op clause ('most time lost in X: 26.70 ms (121% of the call) ...') said as
    what it is: the op's time comes from a separate profiled run of a few calls
    (microbench.phases.breakdown), its share is of the timed call's median, so it can pass
    100% when the profiled calls ran slower than the timed ones. Other clauses unchanged."""
    return PROFILED.sub(lambda m: f"{m[1]} {m[2]}: {m[3]} in a separate profile "
                                  f"({m[4]}% of the timed call)", clause)


def reason_text(reason: str, ratio: float | None = None) -> str:
    """A point's whole measured reason for a table: its op clause said as a separate
    profile's (profiled_clause) and, for a point faster than predicted (ratio above 1), the
    clause saying so first."""
    parts = [profiled_clause(p.strip()) for p in reason.split(";") if p.strip()]
    if ratio is not None and ratio > 1.0:
        parts.sort(key=lambda p: not (p.startswith("measured") and "faster" in p))
    return "; ".join(parts) or reason


def short_reason(reason: str, ratio: float | None = None) -> str:
    """The most specific clause of a point's measured reason, for a one-line footnote.

    A point slower than predicted (`ratio` = measured/predicted below 1, or not given): the op
    losing the most time, else what the compiler's own kernel reaches, else the first clause.
    A point faster than predicted (ratio above 1) lost no time to any op: its clause is the one
    saying that it ran faster, and why where the reason says ('measured 1.27x faster than
    predicted: part of the working set stays cached between calls'), never the op that lost
    the most."""
    parts = [p.strip() for p in reason.split(";") if p.strip()]
    if ratio is not None and ratio > 1.0:
        pick = next((p for p in parts if p.startswith("measured") and "faster" in p),
                    "ran faster than predicted, no measured reason recorded")
    else:
        pick = (next((p for p in parts if p.startswith(("most time lost", "slowest op"))), None)
                or next((p for p in parts if p.startswith("XLA's own")), None)
                or (parts[0] if parts else reason))
    return textwrap.shorten(profiled_clause(pick), 130)


def ratio_claim(what: str, series: dict[str, list[tuple[float, float]]]) -> str:
    """'step time x1.8 (gqa), x5.3 (gqa moe) from batch 1 to 8': last over first value of
    each series [(batch, value), ...]; the batch range is stated once when shared."""
    parts, ranges = [], set()
    for name, pts in series.items():
        pts = sorted(pts)
        if len(pts) < 2:
            continue
        (b0, v0), (b1, v1) = pts[0], pts[-1]
        parts.append(f"x{v1 / v0:.2g} ({name})")
        ranges.add((b0, b1))
    if not parts:
        return f"{what}: fewer than two batches"
    span = (f"from batch {min(ranges)[0]:g} to {min(ranges)[1]:g}" if len(ranges) == 1
            else "from the smallest to the largest batch")
    return f"{what} {', '.join(parts)} {span}"


def below_ridge_claim(series: dict[str, list[tuple[float, float, float]]],
                      ridge_x: float) -> str:
    """For each series [(batch, intensity, step time), ...]: how the step time grew from the
    smallest batch to the largest one still below the ridge, beside the batch's growth."""
    parts = []
    for name, pts in series.items():
        pts = sorted(pts)
        below = [p for p in pts if p[1] < ridge_x]
        if len(below) < 2:
            continue
        (b0, _, t0), (b1, _, t1) = below[0], below[-1]
        parts.append(f"{name}: step time x{t1 / t0:.2g} for x{b1 / b0:g} tokens "
                     f"(batch {b0:g} to {b1:g})")
    return ("below the ridge: " + "; ".join(parts)) if parts else \
        "fewer than two batches below the ridge"


def roofline_claim(points: Sequence[dict]) -> str:
    """Which roof the prediction puts each phase under (of a per-op prediction, the side whose
    ops take most of its time), counted over the plotted points."""
    parts = []
    for phase in PHASE_NAMES:
        bounds = Counter((p.get("predicted") or {}).get("bound") for p in points
                         if p["phase"] == phase)
        if bounds:
            parts.append(f"{phase} " + ", ".join(f"{b or 'unpredicted'} {n}/{bounds.total()}"
                                                 for b, n in bounds.most_common()))
    return "Predicted bound: " + " · ".join(parts)


def limit_runs(xs: Sequence[float], limits: Sequence[str], unit: str = "") -> str:
    """'weights at 256-1,024, KV cache at 2,048-131,072': consecutive runs of one limit."""
    runs: list[list] = []
    for x, lim in zip(xs, limits, strict=True):
        if runs and runs[-1][0] == lim:
            runs[-1][2] = x
        else:
            runs.append([lim, x, x])
    return ", ".join(f"{lim} at {unit}{a:,.0f}" + (f"-{b:,.0f}" if b != a else "")
                     for lim, a, b in runs)


def limit_of(bound: str | None, memory_by: str | None) -> str:
    """The LIMITS key of a modelled point: compute, or what dominates a memory-bound one."""
    return "compute" if bound == "compute" else (memory_by or "memory")


def fit_note(row: dict) -> str:
    """'' when the weights fit one device (or the row does not say), else
    "bf16 weights do not fit one H100 SXM: 2 devices' worth"."""
    n = row.get("weight_devices")
    if not n or n <= 1:
        return ""
    dtype = {"bfloat16": "bf16"}.get(row.get("weights_dtype"), row.get("weights_dtype"))
    return (f"{dtype + ' ' if dtype else ''}weights do not fit one "
            f"{row.get('device', 'device')}: {n} devices' worth")


def crossover(contexts: Sequence[float], attention: Sequence[float], ffn: float
              ) -> float | None:
    """The context where attention time first reaches the FFN time, interpolated in log-log
    between the two contexts around it; None if it never does from below in the range."""
    pairs = list(zip(contexts, attention, strict=True))
    for (c0, a0), (c1, a1) in zip(pairs, pairs[1:], strict=False):
        if a0 < ffn <= a1:
            f = (math.log(ffn) - math.log(a0)) / (math.log(a1) - math.log(a0))
            return math.exp(math.log(c0) + f * (math.log(c1) - math.log(c0)))
    return None


def crossover_decision(contexts: Sequence[float], attention: Sequence[dict], ffn: dict
                       ) -> dict:
    """Where attention overtakes the FFN, only as far as the noise allows.

    `attention` is one timing {median, p10, p90} per context (ascending), `ffn` one timing.
    Attention is above (below) the FFN at a context when its p10-p90 range lies wholly above
    (below) the FFN's. Returns {kind, context, label}: kind "above" (already above at the
    smallest context), "crossing" (below at some context, above at a later one: the medians'
    log-log crossing between the last resolved-below and first resolved-above contexts), or
    "none" (no crossing resolved within the noise)."""
    sides = [1 if a["p10"] > ffn["p90"] else -1 if a["p90"] < ffn["p10"] else 0
             for a in attention]
    if sides and sides[0] > 0:
        return {"kind": "above", "context": None,
                "label": f"already above at the smallest context ({contexts[0]:,.0f})"}
    first_above = next((i for i, s in enumerate(sides) if s > 0), None)
    below = [i for i, s in enumerate(sides[:first_above]) if s < 0] if first_above else []
    if first_above is None or not below:
        label = "no crossing resolved within the noise"
        if first_above is not None:
            label += f" (above from {contexts[first_above]:,.0f})"
        return {"kind": "none", "context": None, "label": label}
    i, j = below[-1], first_above
    x = crossover(contexts[i:j + 1], [a["median"] for a in attention[i:j + 1]], ffn["median"])
    return {"kind": "crossing", "context": x,
            "label": f"crosses at ~{float(f'{x:.2g}'):,.0f} (between {contexts[i]:,.0f} and "
                     f"{contexts[j]:,.0f})"}


def timing_of(seconds: float) -> dict:
    """A timing {median, p10, p90} without spread, for a modelled (exact) time."""
    return {"median": seconds, "p10": seconds, "p90": seconds}


def throughput_claim(steps: Sequence[dict]) -> str:
    """Per series: the batch with the most tokens/s per system, and what happened after it."""
    parts = []
    for name in dict.fromkeys(p["series"] for p in steps):
        ps = sorted((p for p in steps if p["series"] == name), key=lambda p: p["batch"])
        tps = [p["batch"] / p["timing"]["median"] for p in ps]
        k = max(range(len(ps)), key=tps.__getitem__)
        text = f"{name}: most tokens/s per system at batch {ps[k]['batch']} ({tps[k]:,.0f})"
        if k < len(ps) - 1:
            text += f", {tps[-1]:,.0f} at batch {ps[-1]['batch']}"
        parts.append(text)
    return "; ".join(parts)


def kv_claim(rows: Sequence[dict]) -> dict[str, str]:
    """Per preset, how its KV bytes grow over the last doubling of context in the rows."""
    out = {}
    for preset in dict.fromkeys(r["preset"] for r in rows):
        rs = sorted((r for r in rows if r["preset"] == preset), key=lambda r: r["context"])
        if len(rs) < 2:
            continue
        (a, b) = rs[-2], rs[-1]
        growth = (b["kv_bytes"] / a["kv_bytes"]) ** (1 / math.log2(b["context"] / a["context"]))
        if growth < 1.01:
            flat = next(r["context"] for r in rs if r["kv_bytes"] >= b["kv_bytes"] / 1.01)
            out[preset] = f"flat from {flat:,}"
        else:
            out[preset] = f"x{growth:.2f} per doubling at {b['context']:,}"
    return out


def roof_share(intensity: float, flops_per_s: float, compute: float, bandwidth: float
               ) -> tuple[float, str]:
    """(achieved / the roof at that intensity, "compute" or "memory"): which roof bounds a
    point at `intensity` FLOP/byte under a compute roof (FLOP/s) and a memory roof (B/s)."""
    memory = bandwidth * intensity
    return (flops_per_s / min(compute, memory), "compute" if compute <= memory else "memory")


def headline_claim(shares: dict[str, tuple[float, str]]) -> str:
    """'prefill at 96% of the compute roof, decode at 93% of the memory roof': per phase,
    its share of the roof that bounds it (roof_share)."""
    return ", ".join(f"{phase} at {share:.0%} of the {roof} roof"
                     for phase, (share, roof) in shares.items())


def gap_claim(ratios: Sequence[float]) -> str:
    """How many measured/predicted ratios fall in BAND, and their median."""
    if not ratios:
        return "no predicted points"
    s = sorted(ratios)
    inside = sum(BAND[0] <= r <= BAND[1] for r in s)
    return (f"{inside} of {len(s)} phase points within [{BAND[0]}, {BAND[1]}] of their "
            f"roofline prediction; median {s[len(s) // 2]:.3g}, range {s[0]:.3g}-{s[-1]:.3g}")
