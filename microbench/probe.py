"""Drift probes: a short main-memory read and a short GEMM, timed before and after each phase
point, so a prediction uses the roofs of its own moment.

The main roofs are measured in rounds (microbench.rounds), each of which also times these
probes; their median over the rounds is the reference. Before and after a phase point the
probes run again, and

    memory factor  = probe read now / probe read in the rounds
    compute factor = probe GEMM now / probe GEMM in the rounds

scale the roofs the point is predicted with (microbench.points). A probe costs well under a
second; the factors and their before/after values are saved with the point, so the machine's
drift is recorded and shown rather than absorbed into the gap.
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
    """Compiled once; `measure()` returns the current read bandwidth and GEMM rate."""

    def __init__(self, array, n: int | None = None):
        import jax
        import jax.numpy as jnp

        from microbench import compute

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
        return list(harness.time_fn(self._read, self.x, warmup=1, budget_s=0.0,
                                    min_samples=n, min_sample_s=0.0).samples)

    def gemm_samples(self, n: int = 5) -> list[float]:
        return list(harness.time_fn(self._gemm, *self._gemm_args, warmup=1, budget_s=0.0,
                                    min_samples=n, min_sample_s=0.0).samples)

    def measure(self) -> dict:
        read, gemm = np.median(self.samples()), np.median(self.gemm_samples())
        return {"t": time.time(), "read_bytes_per_s": self.bytes / read,
                "gemm_flops_per_s": self.gemm_flops / gemm}
