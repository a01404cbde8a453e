"""The few-rows weight product as a native kernel (`rows.cc`) and the weight that calls it.

`OutputMajor` holds a float32 weight of `shape` = lead + (K,) + (N...) stored as w [*lead, N, K]
(each output's K inputs contiguous: the layout ggml/llama.cpp use for the same reason), and is
a drop-in for the weight in `x @ w`. It is a pytree like `quant.Quantized`, so modules are
unchanged: they write `x @ self.w_up[...]` either way. Which code multiplies (113 chained
products of llama-309m's shapes, 1.10 GB, in the interleaved rounds of `python -m microbench
decode`):

- 1 row (batch-1 decode): XLA's GEMV over the output-major weight, `dot_general` contracting
  the stored K axis. On a 2-core Zen 3 it ran 47.6-53.6 ms against 55.5-58.1 ms for the first
  native kernel and 62-78 ms for XLA's GEMV over the input-major [K, N] weight the model is
  written with (a [4096, 1024] product at 6-9 GB/s, a quarter of the memory's speed); on a
  2-core Zen 4, 39.0-40.3 ms against 36.6-38.2 ms for this kernel: about even. The layout, not the
  kernel, is the batch-1 fix, and XLA alone reaches it.
- 2 to NATIVE_ROWS rows (small-batch decode, a speculative verify): the native kernel. On the
  Zen 4, rows 2 / 4 / 8 / 16: 40.1-42.1 / 41.0-44.7 / 58.5-58.8 / 102.6-108.9 ms, against
  71.7-81.0 / 65.5-72.7 / 82.4-82.8 / 99.1-120.7 ms for XLA over [K, N] and 87.8-103.2 /
  97.7-105.8 / 99.4-109.7 / 128.5-150.7 ms over [N, K] (two runs). On the Zen 3 the first
  kernel ran 4 rows in 66.5-85.8 ms against 138.7-197.6 ms.
- more (prefill): XLA's GEMM, which reads the transposed operand as it is.
With `native=False` every product is XLA's (ModelConfig.matmul="output-major": the layout
alone, the pure-JAX lesson).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import struct

from refmodel.kernels import build

# Rows of x the native kernel takes (inclusive); outside, XLA (see the module docstring). At 16
# rows the kernel and XLA's best form are even (Zen 4: 102.6 vs 120.7 ms in one run, 108.9 vs
# 99.1 in the next; Zen 3, the first kernel, 256 MB weight: 33-37 ms vs 31-38 ms).
# `python -m microbench decode` times the products alone at 1, 2, 4, 8 and 16 rows each round.
NATIVE_ROWS = (2, 16)
FEW_ROWS = NATIVE_ROWS[1]


def rows(x: jax.Array, w: jax.Array) -> jax.Array:
    """x [M, K] float32 times w [N, K] float32 transposed -> y [M, N], in the native kernel."""
    M, K = x.shape
    N = w.shape[0]
    if w.shape[1] != K or x.dtype != jnp.float32 or w.dtype != jnp.float32:
        raise ValueError(f"rows: x float32 [M, K] and w float32 [N, K] with one K; got x "
                         f"{x.dtype}{list(x.shape)} and w {w.dtype}{list(w.shape)}")
    if not build.load():
        raise RuntimeError(f"the native kernels are not available: {build.why_not()}")
    out = jax.ShapeDtypeStruct((M, N), jnp.float32)
    return jax.ffi.ffi_call(build.TARGETS["RowsF32"], out, vmap_method="sequential")(x, w)


@struct.dataclass
class OutputMajor:
    """A float32 weight of `shape` (lead + K + N axes) stored as w [*lead, N, K]."""

    w: jax.Array
    shape: tuple = struct.field(pytree_node=False)
    lead: int = struct.field(pytree_node=False, default=0)
    native: bool = struct.field(pytree_node=False, default=True)  # False: XLA products only

    @classmethod
    def of(cls, w: jax.Array, lead: int = 0, contract: int = 1,
           native: bool = True) -> OutputMajor:
        if contract != 1 or w.ndim != lead + 2:
            raise ValueError(f"native kernels take matrices [*lead, K, N]; this one is "
                             f"{tuple(w.shape)} with {contract} input axes")
        if w.dtype != jnp.float32:
            raise ValueError(f"native kernels are float32; this weight is {w.dtype}")
        return cls(jnp.swapaxes(w, -1, -2), tuple(w.shape), lead, native)

    @property
    def k(self) -> int:
        return self.shape[-2]

    @property
    def n(self) -> int:
        return self.shape[-1]

    @property
    def dtype(self):
        return self.w.dtype

    @property
    def nbytes(self) -> int:
        return self.w.nbytes

    def __getitem__(self, index) -> OutputMajor:
        """w[...] is w; w[e] (lead axes only) is one stacked matrix, still output-major."""
        if index is Ellipsis:
            return self
        if self.lead == 0:
            raise IndexError("an output-major matrix indexes only its leading (stacked) axes")
        return OutputMajor(self.w[index], self.shape[1:], self.lead - 1, self.native)

    def __rmatmul__(self, x: jax.Array) -> jax.Array:  # x [..., K] @ w [K, N] -> [..., N]
        if self.lead:
            raise ValueError(f"x @ w takes a 2-D weight; this one is {self.shape}: index it")
        lead = x.shape[:-1]
        x2 = x.reshape(-1, self.k)
        if self.native and NATIVE_ROWS[0] <= x2.shape[0] <= NATIVE_ROWS[1]:
            y = rows(x2.astype(jnp.float32), self.w)
        else:
            y = jax.lax.dot_general(x2, self.w, (((1,), (1,)), ((), ())))
        return y.astype(x.dtype).reshape(*lead, self.n)

    def dequantize(self, dtype=jnp.float32) -> jax.Array:
        """The weight in its original layout (for einsum products): a transpose."""
        return jnp.swapaxes(self.w, -1, -2).astype(dtype)


