"""Find the bandwidth plateaus of a working-set sweep and name them after the memory levels.

Pure functions over (sizes, bandwidths) and the cache capacities the OS reports; no timing.
Method: fit a piecewise-constant curve to log(bandwidth) by dynamic programming (optimal
least-squares segmentation, Bellman 1961; the penalised-cost choice of the number of segments
follows the change-point literature, e.g. Killick et al. 2012, with the noise level estimated
robustly from first differences). Segments of at least `min_points` points are plateaus;
shorter ones are transitions between levels. A plateau is named after the smallest level whose
capacity holds its typical working set (its geometric-centre size); the level beyond the last
cache is main memory (named by the caller, microbench.roofline.main_memory_name: "DRAM" on a
CPU, "HBM" on an accelerator) and is taken from the largest sizes, since a main-memory figure
measured on a cache-resident buffer is wrong.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from microbench import roofline


@dataclass(frozen=True)
class Plateau:
    name: str  # "L1", "L2", "L3", "DRAM", "HBM", ... ("P1".. when caches are unknown)
    lo_bytes: float  # smallest working set in the plateau
    hi_bytes: float  # largest working set in the plateau
    bytes_per_s: float  # median bandwidth of its points
    p10: float
    p90: float
    n_points: int


def _segment_costs(y: np.ndarray) -> np.ndarray:
    """cost[i, j] = squared error of y[i:j] around its mean (j exclusive)."""
    n = y.size
    c1 = np.concatenate([[0.0], np.cumsum(y)])
    c2 = np.concatenate([[0.0], np.cumsum(y * y)])
    i, j = np.meshgrid(np.arange(n + 1), np.arange(n + 1), indexing="ij")
    length = np.maximum(j - i, 1)
    s1, s2 = c1[j] - c1[i], c2[j] - c2[i]
    cost = s2 - s1 * s1 / length
    cost[j <= i] = np.inf
    return np.maximum(cost, 0.0)


def segment(y: Sequence[float], penalty: float) -> list[tuple[int, int]]:
    """Optimal partition of y into runs [start, stop) minimising SSE + penalty x #segments."""
    y = np.asarray(y, dtype=np.float64)
    n = y.size
    cost = _segment_costs(y)
    best = np.full(n + 1, np.inf)
    best[0] = -penalty
    prev = np.zeros(n + 1, dtype=int)
    for j in range(1, n + 1):
        cand = best[:j] + cost[:j, j] + penalty
        prev[j] = int(np.argmin(cand))
        best[j] = cand[prev[j]]
    bounds, j = [], n
    while j > 0:
        bounds.append((prev[j], j))
        j = prev[j]
    return bounds[::-1]


def noise_sigma(y: Sequence[float], floor: float = 0.02) -> float:
    """Robust noise estimate of y from first differences (MAD x 1.4826 / sqrt 2)."""
    d = np.diff(np.asarray(y, dtype=np.float64))
    if d.size == 0:
        return floor
    return max(floor, 1.4826 * float(np.median(np.abs(d))) / np.sqrt(2.0))


def _level_name(center: float, caches: Sequence[tuple[str, float]], memory_name: str) -> str:
    for name, capacity in caches:
        if center <= capacity:
            return name
    return memory_name


def _plateau(name: str, sizes: np.ndarray, bws: np.ndarray) -> Plateau:
    return Plateau(name=name, lo_bytes=float(sizes[0]), hi_bytes=float(sizes[-1]),
                   bytes_per_s=float(np.median(bws)), p10=float(np.percentile(bws, 10)),
                   p90=float(np.percentile(bws, 90)), n_points=int(sizes.size))


def find_plateaus(sizes: Sequence[float], bandwidths: Sequence[float],
                  caches: Sequence[tuple[str, float]] = (), memory_name: str = roofline.DRAM,
                  min_points: int = 3, penalty_scale: float = 8.0) -> list[Plateau]:
    """Named plateaus, small to large. `caches` = [(name, capacity bytes)] small first
    (aggregate over the cores the sweep used); with none, plateaus are named P1, P2, ..."""
    order = np.argsort(sizes)
    s = np.asarray(sizes, dtype=np.float64)[order]
    b = np.asarray(bandwidths, dtype=np.float64)[order]
    if s.size == 0:
        return []
    if np.any(b <= 0) or np.any(s <= 0):
        raise ValueError("find_plateaus: sizes and bandwidths must be positive")
    y = np.log(b)
    penalty = penalty_scale * noise_sigma(y) ** 2 * max(np.log(y.size), 1.0)
    runs = [(i, j) for i, j in segment(y, penalty) if j - i >= min(min_points, s.size)]
    if not caches:
        return [_plateau(f"P{k + 1}", s[i:j], b[i:j]) for k, (i, j) in enumerate(runs)]
    chosen: dict[str, tuple[int, int]] = {}
    for i, j in runs:
        center = float(np.exp(np.mean(np.log(s[i:j]))))
        name = _level_name(center, caches, memory_name)
        old = chosen.get(name)
        # main memory: the run reaching the largest sizes; caches: the longest run
        if old is None or (name == memory_name) or (j - i) > (old[1] - old[0]):
            chosen[name] = (i, j)
    ordered = sorted(chosen.items(), key=lambda kv: kv[1][0])
    return [_plateau(name, s[i:j], b[i:j]) for name, (i, j) in ordered]
