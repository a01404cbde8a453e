"""Roofline arithmetic on saved results, without JAX: ridge points, the working-set curve,
predicted times and the "above its roof" test.

Every figure, table and prediction takes these from here, so a ridge point or a roof is
computed in one place (Williams, Waterman & Patterson, "Roofline", CACM 2009).

Public API:
    main_memory_name(env) -> "DRAM" | "HBM"
    ridge(compute_roof, memory_roof) -> {"flops_per_byte", "compute", "memory", "label"}
    spread(entry) -> float          (p90 - p10) / median of a roof or a rate
    above(value, roof) -> bool      value > roof x (1 + the roof's spread)
    curve_bandwidth(curve, working_set_bytes) -> bytes/s, log-log interpolation (no cliffs)
"""

from __future__ import annotations

import math
from collections.abc import Sequence


def main_memory_name(env: dict) -> str:
    """The off-chip level's name: DRAM behind a CPU, HBM behind an accelerator."""
    return "DRAM" if env.get("backend") == "cpu" else "HBM"


def ridge(compute: dict, memory: dict) -> dict:
    """FLOP/byte where a compute roof meets a memory roof, labelled with both roofs."""
    x = compute["value"] / memory["value"]
    return {"flops_per_byte": x, "compute": compute["name"], "memory": memory["name"],
            "label": f"ridge {x:.3g} FLOP/B = {compute['name']} / {memory['name']}"}


def spread(entry: dict) -> float:
    """Relative p10-p90 spread of a roof ({value, p10, p90}) or a rate ({median, p10, p90})."""
    centre = entry.get("value", entry.get("median"))
    if not centre:
        return 0.0
    return max(0.0, (entry["p90"] - entry["p10"]) / centre)


def above(value: float, roof: dict, extra: float = 0.0) -> bool:
    """True when `value` sits above `roof` by more than the roof's own spread (+ extra)."""
    return value > roof["value"] * (1.0 + spread(roof) + extra)


def curve_bandwidth(curve: Sequence[Sequence[float]], working_set_bytes: float) -> float:
    """Bandwidth at a working-set size from a measured curve [[bytes, bytes/s], ...]
    (sorted by size): linear interpolation in log(size)-log(bandwidth), clamped at the ends,
    so a predicted time is continuous in the bytes a phase touches."""
    pts = sorted((float(s), float(b)) for s, b in curve)
    if not pts:
        raise ValueError("curve_bandwidth: empty curve")
    if working_set_bytes <= pts[0][0]:
        return pts[0][1]
    if working_set_bytes >= pts[-1][0]:
        return pts[-1][1]
    x = math.log(working_set_bytes)
    for (s0, b0), (s1, b1) in zip(pts, pts[1:], strict=False):
        if s0 <= working_set_bytes <= s1:
            w = (x - math.log(s0)) / (math.log(s1) - math.log(s0)) if s1 > s0 else 0.0
            return math.exp(math.log(b0) + w * (math.log(b1) - math.log(b0)))
    return pts[-1][1]
