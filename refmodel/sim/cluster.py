"""Chips and the links between them, as plain numbers (no JAX): the roofline of one device
and the time to move bytes between devices.

A Chip is one device at one dtype: dense peak FLOP/s, main-memory bandwidth (HBM; on an
SRAM-only chip, its SRAM), memory capacity, and a per-call floor (launch and dispatch, paid
by every model call however small). Its time for work of F FLOPs and Y bytes is the roofline
time, floor + max(F / flops, Y / bandwidth) (Williams et al. 2009): no overlap is lost and
none is invented, so a modelled number is a bound a real engine approaches, never beats.

A Link is one chip's port to its peers: bytes/s in one direction and a latency per message
(one hop). A ring all-reduce of Y bytes over n chips sends 2 (n - 1) messages of Y / n bytes
per chip (reduce-scatter, then all-gather; Patarasuk & Yuan 2009), which is what NCCL's ring
does for large messages; small messages pay the 2 (n - 1) latencies.

microbench builds Chips and Links from its hardware database (vendor specs with sources) or
from this machine's measured roofs; nothing here reads a file.
"""

from __future__ import annotations

import math
from dataclasses import dataclass


def _positive(owner: str, field: str, value, allow_zero: bool = False) -> float:
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    if not ok or value < 0 or (value == 0 and not allow_zero):
        need = "a finite number >= 0" if allow_zero else "a finite number > 0"
        raise ValueError(f"{owner}.{field}={value!r}: must be {need}")
    return float(value)


@dataclass(frozen=True)
class Chip:
    """One device's roofline: FLOP/s, bytes/s, bytes of memory, seconds per call."""

    name: str
    flops: float  # dense peak FLOP/s at `dtype`
    bandwidth: float  # main-memory bytes/s (HBM; SRAM on an SRAM-only chip)
    memory: float  # bytes of that memory
    dtype: str = "bfloat16"
    floor: float = 0.0  # seconds every model call pays (launch, dispatch)

    def __post_init__(self):
        for f in ("flops", "bandwidth", "memory"):
            _positive(f"Chip({self.name!r})", f, getattr(self, f))
        _positive(f"Chip({self.name!r})", "floor", self.floor, allow_zero=True)

    def time(self, flops: float, nbytes: float) -> float:
        """Roofline seconds of one call: floor + the slower of compute and memory."""
        return self.floor + max(flops / self.flops, nbytes / self.bandwidth)

    @property
    def ridge(self) -> float:
        """FLOPs per byte where compute and memory take equally long."""
        return self.flops / self.bandwidth


@dataclass(frozen=True)
class Link:
    """One chip's port to its peers: bytes/s in one direction, seconds per message."""

    name: str
    bandwidth: float  # bytes/s, one direction, per chip
    latency: float  # seconds per message (one hop)

    def __post_init__(self):
        _positive(f"Link({self.name!r})", "bandwidth", self.bandwidth)
        _positive(f"Link({self.name!r})", "latency", self.latency, allow_zero=True)

    def send(self, nbytes: float, hops: int = 1) -> float:
        """Seconds to move `nbytes` point to point over `hops` hops (store and forward is
        not modelled: the bytes stream, each hop adds its latency)."""
        return hops * self.latency + nbytes / self.bandwidth if nbytes > 0 else 0.0

    def all_reduce(self, nbytes: float, n: int) -> float:
        """Seconds of a ring all-reduce of `nbytes` (each chip's full buffer) over n chips."""
        if n <= 1 or nbytes <= 0:
            return 0.0
        return 2 * (n - 1) * (self.latency + nbytes / n / self.bandwidth)
