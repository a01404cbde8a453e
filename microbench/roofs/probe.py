"""Drift probes: a short main-memory read and a short GEMM, timed before and after each phase
point, so a prediction uses the roofs of its own moment.

The main roofs are measured in rounds (microbench.roofs.rounds). The memory probe of the phase
points is the C read over the rounds' own array (where gcc built it), so its reference is the
C read's median over the rounds and no ratio between two programs has to hold still; without
a C compiler it is XLA's `jnp.sum` over 128 MiB, which each round also times for its
reference. The GEMM probe is XLA's 1024^3 GEMM, likewise timed in every round. Then

    memory factor  = probe read now / probe read in the rounds
    compute factor = probe GEMM now / probe GEMM in the rounds

scale the roofs the point is predicted with (microbench.phases.points; a sweep takes each
factor as the median over the points measured around it, `points.repredict`). The factors and
their before/after values are saved with the point, so the machine's drift is recorded and
shown rather than absorbed into the gap.

Why the C read: XLA's 128 MiB sum and the 1 GiB C read, timed seconds apart in the same round,
can differ by a ratio that itself moves from round to round, so a reference taken from a few
rounds of the XLA probe can put every point's roof too high (or miss a real slowdown); the C
read is the program the roof itself is taken from.
"""

from __future__ import annotations

import time

import numpy as np

from microbench import harness

GEMM_N = 1024


def host_array(n: int, seed: int = 0) -> np.ndarray:
    """n random-normal float32 values, generated in 4 MiB blocks and tiled (fast for GiBs)."""
    block = np.random.default_rng(seed).standard_normal(1 << 20, dtype=np.float32)
    return np.tile(block, -(-n // block.size))[:n]


def probe_elements(llc_bytes: int, n_main: int) -> int:
    """Large enough to leave the caches (4x the LLC, >= 128 MiB), at most the main array."""
    return min(n_main, max(4 * llc_bytes, 128 << 20) // 4)


class Probe:
    """Compiled once; `measure()` returns the current read bandwidth and GEMM rate. With a
    `reader` (microbench.roofs.native.Server over the main-memory array of the roof rounds) the read
    is the C read itself, the read roof's own program, 3 passes; else XLA's `jnp.sum` over
    `array[:n]`, 5 calls."""

    def __init__(self, array=None, n: int | None = None, reader=None):
        import jax
        import jax.numpy as jnp

        from microbench.roofs import compute

        self.reader = reader
        if reader is not None:
            from microbench.roofs import native

            self.bytes = 4.0 * reader.n
            self.name = (f"C read probe ({native.label(reader.threads)}, "
                         f"{self.bytes / 2**20:.0f} MiB: the read roof's own program)")
        else:
            n = int(n or array.size)
            self.x = jax.block_until_ready(array[:n] if n < array.size else array)
            self.bytes = 4.0 * n
            self.name = f"XLA read probe (jnp.sum over {self.bytes / 2**20:.0f} MiB)"
            self._read = jax.jit(jnp.sum).lower(self.x).compile()
        fn, _ = compute.gemm_fn("float32")
        self._gemm_args = compute.gemm_inputs(GEMM_N, GEMM_N, GEMM_N, "float32", seed=1)
        self._gemm = jax.jit(fn).lower(*self._gemm_args).compile()
        self.gemm_flops = 2.0 * GEMM_N**3
        self.gemm_name = f"XLA GEMM probe ({GEMM_N}^3 float32)"

    def samples(self, n: int = 5) -> list[float]:
        if self.reader is not None:
            return list(self.reader.read(3)["read"])
        return list(harness.time_fn(self._read, self.x, warmup=1, budget_s=0.0,
                                    min_samples=n, min_sample_s=0.0).samples)

    def gemm_samples(self, n: int = 5) -> list[float]:
        return list(harness.time_fn(self._gemm, *self._gemm_args, warmup=1, budget_s=0.0,
                                    min_samples=n, min_sample_s=0.0).samples)

    def measure(self) -> dict:
        read, gemm = np.median(self.samples()), np.median(self.gemm_samples())
        return {"t": time.time(), "read_bytes_per_s": self.bytes / read,
                "gemm_flops_per_s": self.gemm_flops / gemm}
