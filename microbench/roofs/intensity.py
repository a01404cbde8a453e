"""Arithmetic-intensity sweep: one kernel whose FLOPs per byte is a parameter.

The ERT way of tracing a roofline with a single kernel: the FMA chain of `compute.fma_chain`
applied in place to a DRAM-sized buffer (donated, so there is no write-allocate read and no
page faulting). Per element it reads 4 bytes, writes 4 and does 2Kk + (k - 1) FLOPs, so
choosing (K, k) sets the intensity from 0.25 FLOP/byte upwards. Below the ridge the curve
follows the bandwidth roof, above it the vector roof; the knee sits at the measured ridge.

On XLA:CPU a fused chain longer than about 256 x 8 FMAs per element stops vectorising (and
runs many times slower), so the default sweep stops near 500 FLOP/byte, well past the ridge of
any CPU.
"""

from __future__ import annotations

from microbench.roofs import compute

# (K, k) pairs in increasing intensity; FLOP/byte = (2Kk + k - 1) / 8 for float32
POINTS = ((1, 1), (2, 1), (4, 1), (4, 2), (4, 4), (4, 8), (8, 8), (16, 8), (32, 8),
          (64, 8), (128, 8), (256, 8))
QUICK_POINTS = ((1, 1), (4, 1), (4, 4), (8, 8), (32, 8), (64, 8))


def intensity(K: int, k: int, dtype_bytes: int = 4) -> float:
    """FLOP per byte of one element's chain (element read once, written once)."""
    return (2 * K * k + k - 1) / (2 * dtype_bytes)


def kernel(K: int, k: int):
    """fn(x, a, b) -> x', to be timed with x donated (argument 0)."""
    return compute.fma_chain_fn(K, k)


def flops(n: int, K: int, k: int) -> int:
    return compute.fma_flops(n, K, k)


def bytes_moved(n: int, k: int, dtype: str = "float32") -> int:
    return compute.fma_bytes(n, k, dtype)
