"""How one compiled phase is timed, shared by the phase points and the per-op breakdown: the
time budget of a point, the eviction buffer a cold call reads first, and a point's label.

A leaf: points.py and breakdown.py both import it, so neither imports the other to time a phase.
"""

from __future__ import annotations

import dataclasses
import functools

import refmodel
from microbench import harness


@dataclasses.dataclass(frozen=True)
class Budget:
    """How long to spend on each point (passed through to harness.time_fn, whose result
    is a harness.Timing)."""

    budget_s: float = 1.0
    min_samples: int = 5
    target_cv: float = 0.03
    min_sample_s: float = 2e-3


DEFAULT_BUDGET = Budget()


@functools.cache
def evictor() -> harness.Evictor:
    """One eviction buffer per process (4x the last-level cache, >= 128 MiB)."""
    return harness.Evictor()


def describe(cfg: refmodel.ModelConfig) -> str:
    """A short legend label: each mixer's option set (its variant names it), the FFN."""
    return f"{refmodel.attention.label(cfg)} / {cfg.ffn}"
