"""The weight product as a native kernel (`rows.cc`) and the weight types that choose it.

`Panels` holds a weight of `shape` = lead + (n_in,) + (n_out,) (its inputs and outputs) stored
in panels, w [*lead, ceil(n_out / 32), n_in, 32] (32 outputs side by side per input, each
panel contiguous: the packed operand of a BLAS GEMM, packed once at load time), float32 or int8
with one float32 scale per output (`quant`'s "int8", from `Panels.of_quantized`), and is a
drop-in for the weight in `x @ w`: every product with it runs the native kernel, whatever the
rows of x. `OutputMajor` stores the same weight as [*lead, n_out, n_in] (each output's inputs
contiguous, as ggml/llama.cpp store it) and leaves every product to XLA:
`backend="output-major"`, the pure-JAX lesson. Both are pytrees like `quant.Quantized`, so
modules are unchanged: they write `x @ self.w_up[...]` either way. A stack of matrices in
panels also runs a grouped product (`Panels.grouped`, `rows_groups`: a MoE layer's experts,
each on its own rows, in one call).

Why three forms (`python -m microbench decode` times them at 1 to 16 rows; figures/decode.md):
- 1 row (batch-1 decode): XLA's GEMV over the weight as written, [n_in, n_out], reads it below
  the memory's speed; over [n_out, n_in] it reaches that speed: the layout alone gets XLA to
  the memory. The kernel reaches it too.
- a few rows (small-batch decode, a speculative verify): XLA's products over either layout
  fall to a fraction of the memory's speed; the kernel reads each panel once for all the rows
  and stays near it.
- many rows (prefill): the kernel is a GEMM whose panel sits in L2 while blocks of rows of x
  (6 or 12, panels.h's MB) pass over it. XLA over the panels themselves (an einsum) copies the
  weight first: not a fallback.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
from flax import struct

from refmodel.kernels import build

PANEL = 32  # outputs per panel: panels.h's PANEL


def panels(w: jax.Array) -> jax.Array:
    """w [*lead, n_in, n_out] -> [*lead, ceil(n_out / PANEL), n_in, PANEL]: PANEL outputs side
    by side per input, each panel contiguous; outputs past n_out in the last panel are zero."""
    *lead, n_in, n_out = w.shape
    n = -(-n_out // PANEL)
    w = jnp.pad(w, [(0, 0)] * len(lead) + [(0, 0), (0, n * PANEL - n_out)])
    return jnp.swapaxes(w.reshape(*lead, n_in, n, PANEL), -3, -2)


def _check_scale(fn: str, wp: jax.Array, scale: jax.Array | None, shape: tuple) -> None:
    """An int8 wp takes one float32 scale per output, `shape` ([n], or [E, n] for a stack); a
    float32 wp none."""
    int8 = wp.dtype == jnp.int8
    if int8 != (scale is not None) or (int8 and (scale.dtype != jnp.float32
                                                 or scale.shape != shape)):
        got = None if scale is None else f"{scale.dtype}{list(scale.shape)}"
        want = "E, " * (len(shape) - 1) + f"n={shape[-1]}"
        raise ValueError(f"{fn}: an int8 w takes scale float32 [{want}], a float32 w none; got "
                         f"w {wp.dtype} and scale {got}")


def rows(x: jax.Array, wp: jax.Array, n: int, scale: jax.Array | None = None,
         at: jax.Array | int | None = None) -> jax.Array:
    """x [M, n_in] float32 times the weight whose panels are wp ([ceil(n / PANEL), n_in,
    PANEL], `panels`) -> y [M, n], in the native kernel, whatever M; n = n_out, the outputs.
    wp float32, or int8 with `scale` float32 [n], one per output (y = scale * the sum over the
    int8 values: quant's "int8"). With `at` (an int32 index, clamped to the stack), wp is a
    stack [E, ceil(n / PANEL), n_in, PANEL] (scale [E, n]) and the product is with matrix
    `at`, read where it lies: no copy of it is made first, as indexing the stack in XLA
    would."""
    M, n_in = x.shape
    int8 = wp.dtype == jnp.int8
    stack = () if at is None else wp.shape[:1]
    if (x.dtype != jnp.float32 or wp.dtype not in (jnp.float32, jnp.int8)
            or wp.ndim != 3 + len(stack) or wp.shape[len(stack) + 1:] != (n_in, PANEL)
            or wp.shape[len(stack)] != -(-n // PANEL)):
        raise ValueError(f"rows: x float32 [M, n_in] and w float32 or int8 in panels "
                         f"[{'E, ' if stack else ''}ceil(n / {PANEL}), n_in, {PANEL}] with one "
                         f"n_in; "
                         f"got x {x.dtype}{list(x.shape)}, w {wp.dtype}{list(wp.shape)} and "
                         f"n={n}")
    _check_scale("rows", wp, scale, (*stack, n))
    build.require()
    out = jax.ShapeDtypeStruct((M, n), jnp.float32)
    name = ("RowsAt" if stack else "Rows") + ("I8" if int8 else "F32")
    args = (x, wp) + ((scale,) if int8 else ()) + (
        (jnp.asarray(at, jnp.int32).reshape(()),) if stack else ())
    return jax.ffi.ffi_call(build.TARGETS[name], out, vmap_method="sequential")(*args)


def rows_groups(x: jax.Array, wp: jax.Array, n: int, sizes: jax.Array,
                scale: jax.Array | None = None) -> jax.Array:
    """A grouped product in the native kernel (`jax.lax.ragged_dot`'s contract): x [M, n_in]
    float32 holds E groups of rows one after another, sizes [E] int32 of them each (rows past
    their sum get zeros), and group e's rows are multiplied by matrix e of the stack wp [E,
    ceil(n / PANEL), n_in, PANEL] (float32, or int8 with `scale` float32 [E, n]) -> y [M, n].
    All groups run in one call: each matrix with rows is read once, one with none is not
    read."""
    M, n_in = x.shape
    int8 = wp.dtype == jnp.int8
    if (x.dtype != jnp.float32 or wp.dtype not in (jnp.float32, jnp.int8) or wp.ndim != 4
            or wp.shape[2:] != (n_in, PANEL) or wp.shape[1] != -(-n // PANEL)
            or sizes.shape != wp.shape[:1] or not jnp.issubdtype(sizes.dtype, jnp.integer)):
        raise ValueError(f"rows_groups: x float32 [M, n_in], w float32 or int8 in panels [E, "
                         f"ceil(n / {PANEL}), n_in, {PANEL}] with one n_in and integer sizes "
                         f"[E]; got "
                         f"x {x.dtype}{list(x.shape)}, w {wp.dtype}{list(wp.shape)}, sizes "
                         f"{sizes.dtype}{list(sizes.shape)} and n={n}")
    _check_scale("rows_groups", wp, scale, (wp.shape[0], n))
    build.require()
    out = jax.ShapeDtypeStruct((M, n), jnp.float32)
    name = "RowsGroups" + ("I8" if int8 else "F32")
    args = (x, wp) + ((scale,) if int8 else ()) + (sizes.astype(jnp.int32),)
    return jax.ffi.ffi_call(build.TARGETS[name], out, vmap_method="sequential")(*args)


def _check(w: jax.Array, lead: int, contract: int) -> None:
    if contract != 1 or w.ndim != lead + 2:
        raise ValueError(f"native kernels take matrices [*lead, n_in, n_out]; this one is "
                         f"{tuple(w.shape)} with {contract} input axes")
    if w.dtype != jnp.float32:
        raise ValueError(f"native kernels are float32; this weight is {w.dtype}")


class _Stored:
    """What both stored forms share: `w` holds a 2-D (or stacked) weight of `shape` = lead +
    (n_in, n_out), multiplied as `x @ w`."""

    @property
    def k(self) -> int:
        return self.shape[-2]

    @property
    def n(self) -> int:
        return self.shape[-1]

    @property
    def dtype(self):
        return self.w.dtype

    def _rows(self, x: jax.Array) -> jax.Array:
        """x [..., n_in] as rows [M, n_in]; a stacked weight must be indexed first."""
        if self.lead:
            raise ValueError(f"x @ w takes a 2-D weight; this one is {self.shape}: index it")
        return x.reshape(-1, self.k)


@struct.dataclass
class Panels(_Stored):
    """A weight of `shape` (lead + n_in + n_out axes) stored in panels, w [*lead, ceil(n_out /
    PANEL), n_in, PANEL] (`panels`): float32, or int8 with `scale` [*lead, n_out] (quant's
    "int8": one float32 scale per output). `x @ w` runs the native kernel."""

    w: jax.Array
    shape: tuple = struct.field(pytree_node=False)
    lead: int = struct.field(pytree_node=False, default=0)
    scale: jax.Array | None = None
    # A view of one matrix of a stack (w[e] of a [E, n_in, n_out] weight: `__getitem__`): w and
    # scale stay the whole stack, `at` is e, and the kernel reads matrix e where it lies.
    at: jax.Array | None = None
    # A weight declared with several input or output axes (MLA's wq [D, N, H], wo [N, U, D]):
    # its declared shape; `shape` is the matrix it is multiplied as, [prod(inputs),
    # prod(outputs)], and `dequantize` gives the declared one back.
    declared: tuple | None = struct.field(pytree_node=False, default=None)

    @classmethod
    def of(cls, w: jax.Array, lead: int = 0, contract: int = 1) -> Panels:
        """w [*lead, n_in, n_out]; or, unstacked (lead 0), w [*inputs, *outputs] with
        `contract` input axes, stored as the matrix [prod(inputs), prod(outputs)] (x @ w takes
        x [..., n_in] and gives [..., n_out]: the caller reshapes)."""
        if lead == 0 and w.ndim > 2 and 0 < contract < w.ndim:
            k = math.prod(w.shape[:contract])
            _check(w.reshape(k, -1), 0, 1)
            return cls(panels(w.reshape(k, -1)), (k, w.size // k), 0, declared=tuple(w.shape))
        _check(w, lead, contract)
        return cls(panels(w), tuple(w.shape), lead)

    @classmethod
    def of_quantized(cls, q) -> Panels:
        """From a `quant.Quantized` int8 weight (q [*lead, n_out, n_in], scale [*lead, n_out]):
        a matrix or, unstacked, one declared over several axes; other formats, int8
        activations and stacks over several axes raise."""
        matrix = q.contract == 1 and len(q.shape) == q.lead + 2
        if q.fmt != "int8" or q.acts or not (matrix or q.lead == 0):
            raise ValueError(f"native kernels take int8 weights [*lead, n_in, n_out] with "
                             f"float activations; this one is {q.fmt} {q.shape} (acts="
                             f"{q.acts}, {q.contract} input axes)")
        wp = panels(jnp.swapaxes(q.q, -1, -2))
        if matrix:
            return cls(wp, tuple(q.shape), q.lead, q.scale)
        return cls(wp, (q.k, q.n), 0, q.scale, declared=tuple(q.shape))

    @property
    def nbytes(self) -> int:
        whole = self.w.nbytes + (0 if self.scale is None else self.scale.nbytes)
        return whole if self.at is None else whole // self.w.shape[0]

    def __getitem__(self, index) -> Panels:
        """w[...] is w; w[e] (lead axes only) is one stacked matrix, still in panels: of a
        stack of matrices ([E, n_in, n_out]) a view that the kernel reads in place (`at`), of a
        deeper stack a slice."""
        if index is Ellipsis:
            return self
        if self.lead == 0:
            raise IndexError("a matrix in panels indexes only its leading (stacked) axes")
        if self.lead == 1 and (isinstance(index, int) or (
                hasattr(index, "ndim") and index.ndim == 0
                and jnp.issubdtype(index.dtype, jnp.integer))):
            if isinstance(index, int):
                if not -self.shape[0] <= index < self.shape[0]:
                    raise IndexError(f"index {index} is out of bounds for a stack of "
                                     f"{self.shape[0]} matrices")
                index %= self.shape[0]
            return Panels(self.w, self.shape[1:], 0, self.scale, jnp.asarray(index, jnp.int32))
        scale = None if self.scale is None else self.scale[index]
        return Panels(self.w[index], self.shape[1:], self.lead - 1, scale)

    def _matrix(self) -> tuple[jax.Array, jax.Array | None]:
        """(w, scale) of this matrix alone: the view's matrix sliced out (a copy)."""
        if self.at is None:
            return self.w, self.scale
        return self.w[self.at], None if self.scale is None else self.scale[self.at]

    def __rmatmul__(self, x: jax.Array) -> jax.Array:  # x [..., n_in] @ w -> [..., n_out]
        y = rows(self._rows(x).astype(jnp.float32), self.w, self.n, self.scale, self.at)
        return y.astype(x.dtype).reshape(*x.shape[:-1], self.n)

    def grouped(self, x: jax.Array, sizes: jax.Array) -> jax.Array:
        """x [M, n_in] in groups of sizes [E] rows (one after another) times this stack [E,
        n_in, n_out]: group e's rows by matrix e, in one native call (`rows_groups`) -> [M,
        n_out]."""
        if self.lead != 1 or self.at is not None:
            raise ValueError(f"grouped products take a stack of matrices [E, n_in, n_out]; this is "
                             f"{self.shape}" + (" (one matrix of a stack)" if self.at is not None
                                               else ""))
        y = rows_groups(x.astype(jnp.float32), self.w, self.n, sizes, self.scale)
        return y.astype(x.dtype)

    def dequantize(self, dtype=jnp.float32) -> jax.Array:
        """The weight in its original layout [*lead, n_in, n_out] (for einsum products)."""
        w, scale = self._matrix()
        w = jnp.swapaxes(w, -3, -2)
        w = w.reshape(*w.shape[:-2], -1)[..., :self.n].astype(jnp.float32)
        if scale is not None:
            w = w * scale[..., None, :]
        return w.astype(dtype).reshape(self.declared or w.shape)


@struct.dataclass
class OutputMajor(_Stored):
    """A float32 weight of `shape` (lead + n_in + n_out axes) stored as w [*lead, n_out, n_in],
    multiplied by XLA (`backend="output-major"`: the layout alone, the pure-JAX lesson)."""

    w: jax.Array
    shape: tuple = struct.field(pytree_node=False)
    lead: int = struct.field(pytree_node=False, default=0)
    # A weight declared with several input or output axes, as `Panels.declared`.
    declared: tuple | None = struct.field(pytree_node=False, default=None)

    @classmethod
    def of(cls, w: jax.Array, lead: int = 0, contract: int = 1) -> OutputMajor:
        """w [*lead, n_in, n_out]; or, unstacked (lead 0), w [*inputs, *outputs] with
        `contract` input axes, stored as its matrix."""
        if lead == 0 and w.ndim > 2 and 0 < contract < w.ndim:
            k = math.prod(w.shape[:contract])
            m = w.reshape(k, -1)
            _check(m, 0, 1)
            return cls(m.T, tuple(m.shape), 0, declared=tuple(w.shape))
        _check(w, lead, contract)
        return cls(jnp.swapaxes(w, -1, -2), tuple(w.shape), lead)

    @property
    def nbytes(self) -> int:
        return self.w.nbytes

    def __getitem__(self, index) -> OutputMajor:
        """w[...] is w; w[e] (lead axes only) is one stacked matrix, still output-major."""
        if index is Ellipsis:
            return self
        if self.lead == 0:
            raise IndexError("an output-major matrix indexes only its leading (stacked) axes")
        return OutputMajor(self.w[index], self.shape[1:], self.lead - 1)

    def __rmatmul__(self, x: jax.Array) -> jax.Array:  # x [..., n_in] @ w -> [..., n_out]
        y = jax.lax.dot_general(self._rows(x), self.w, (((1,), (1,)), ((), ())))
        return y.astype(x.dtype).reshape(*x.shape[:-1], self.n)

    def dequantize(self, dtype=jnp.float32) -> jax.Array:
        """The weight in its declared layout (for einsum products): a transpose."""
        w = jnp.swapaxes(self.w, -1, -2).astype(dtype)
        return w.reshape(self.declared) if self.declared else w
