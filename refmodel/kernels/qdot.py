"""Integer dot products for quantized weights with int8 activations (`qdot.cc`).

llama.cpp's Q8_0 and Q4_0 products round the activation row to int8 per block of 32 inputs and
sum each block's 32 byte products in an int32 with one instruction (AVX-512 VNNI's VPDPBUSD:
64 byte products; AVX-VNNI the same on 256 bits), then scale the block's sum by the two
scales. `quant.quantize(model, weights="int8" | "int4", activations=True)` is that arithmetic
(`quant.round_activations` rounds x exactly as the kernel does); `QuantPanels` stores such a
weight in the kernel's layout, a drop-in for it in `x @ w` (the "native" backend converts every
such matrix at `backends.use`).

Why integers here and floats in `rows.cc`: a float32 FMA does 16 multiply-adds per 512-bit
instruction; VPDPBUSD does 64, on a quarter (int8) or an eighth (int4) of the bytes. A decode
step needs few of either (it waits on the memory); a prefill is bound by them, and there the
int8 product is the faster one (`python -m microbench decode` times both).
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
from flax import struct

from refmodel.kernels import build

PANEL = 32  # outputs per panel (qdot.cc's QP)
BLOCK = 32  # inputs per activation scale and int4 group (quant.ACT_BLOCK, QUANT_GROUP)
OFFSET = {"int8": 128, "int4": 8}  # stored unsigned: value + offset
ROW4 = 4 * 128 + 2 * PANEL  # bytes of an int4 block in a panel: weights, then float16 scales
INSTRUCTIONS = {2: "avx512_vnni", 1: "avx_vnni"}


@functools.cache
def int8_dot() -> str | None:
    """The int8 dot-product instruction the kernel was built with on this CPU ("avx512_vnni",
    "avx_vnni"), or None: no kernels here, or a CPU without one (the kernel then computes the
    same sums with plain integer vector arithmetic, several times slower)."""
    lib = build.library()
    return None if lib is None else INSTRUCTIONS.get(lib.refmodel_int8_dot())


def pack(values: jax.Array, scale: jax.Array, fmt: str) -> tuple[jax.Array, jax.Array | None]:
    """Quantized values [n_out, n_pad] (int8 in [-127, 127], or int4 in [-8, 7]; n_pad a
    multiple of BLOCK) and their scales (float32 [n_out] int8, float16 [n_out, n_pad / BLOCK]
    int4) -> the kernel's (wp, scale), P = ceil(n_out / PANEL) panels (`qdot.cc`'s layout):
    int8 wp uint8 [P, n_pad / 4, 128] and scale float32 [P * PANEL]; int4 wp uint8 [P, n_pad /
    BLOCK, 576] (each block's 4 rows of 128 bytes, then its 32 float16 scales) and no scale.
    Outputs past n_out are zero weights with zero scales."""
    n_out, n_pad = values.shape
    P = -(-n_out // PANEL)
    u = jnp.pad(values.astype(jnp.int32) + OFFSET[fmt], ((0, P * PANEL - n_out), (0, 0)),
                constant_values=OFFSET[fmt])
    dtype = jnp.float32 if fmt == "int8" else jnp.float16  # as quant stores them
    scale = jnp.pad(scale.astype(dtype), ((0, P * PANEL - n_out),) + ((0, 0),) * (scale.ndim - 1))
    if fmt == "int8":  # [P, 32, n_pad/4, 4] -> [P, n_pad/4, 32, 4]
        wp = u.reshape(P, PANEL, n_pad // 4, 4).transpose(0, 2, 1, 3)
        return wp.reshape(P, n_pad // 4, 128).astype(jnp.uint8), scale
    G = n_pad // BLOCK
    quads = u.reshape(P, PANEL, n_pad // 8, 2, 4)  # chunk c: inputs 8c..8c+3, then 8c+4..8c+7
    byte = quads[..., 0, :] | (quads[..., 1, :] << 4)  # [P, 32, n_pad/8, 4]
    rows = byte.transpose(0, 2, 1, 3).reshape(P, G, 512).astype(jnp.uint8)
    scales = jax.lax.bitcast_convert_type(scale.reshape(P, PANEL, G).transpose(0, 2, 1),
                                          jnp.uint8).reshape(P, G, 2 * PANEL)
    return jnp.concatenate([rows, scales], axis=-1), None


def _check(x, wp, scale, n, fmt) -> None:
    M, n_in = x.shape
    G = -(-n_in // BLOCK)
    want = (-(-n // PANEL),) + ((G * BLOCK // 4, 128) if fmt == "int8" else (G, ROW4))
    if (fmt not in OFFSET or x.dtype != jnp.float32 or wp.dtype != jnp.uint8
            or wp.shape != want or (scale is None) != (fmt == "int4")):
        raise ValueError(f"qrows: fmt 'int8' (with a scale) or 'int4' (none), x float32 [M, "
                         f"n_in] and w uint8 {list(want)} for n_in={n_in}, n={n}; got fmt="
                         f"{fmt!r}, x {x.dtype}{list(x.shape)}, w {wp.dtype}{list(wp.shape)}, "
                         f"scale {None if scale is None else list(scale.shape)}")
    build.require()


def qrows(x: jax.Array, wp: jax.Array, scale: jax.Array | None, n: int, fmt: str) -> jax.Array:
    """x [M, n_in] float32, rounded to int8 per block, times the packed weight (`pack`) -> y
    [M, n] float32, in the native kernel."""
    _check(x, wp, scale, n, fmt)
    target = build.TARGETS["QRowsI8" if fmt == "int8" else "QRowsI4"]
    out = jax.ShapeDtypeStruct((x.shape[0], n), jnp.float32)
    args = (x, wp) + ((scale,) if fmt == "int8" else ())
    return jax.ffi.ffi_call(target, out, vmap_method="sequential")(*args)


def qrows_each(x: jax.Array, weights: list, fmt: str) -> list[jax.Array]:
    """x [M, n_in] float32, rounded once, times each packed weight (wp, scale, n) of one
    format -> [y [M, n] float32, ...], in one call of the native kernel (`qrows` for one)."""
    for wp, scale, n in weights:  # each checked as qrows checks it
        _check(x, wp, scale, n, fmt)
    target = build.TARGETS["QRowsManyI8" if fmt == "int8" else "QRowsManyI4"]
    out = [jax.ShapeDtypeStruct((x.shape[0], n), jnp.float32) for _, _, n in weights]
    args = [wp for wp, _, _ in weights] + ([s for _, s, _ in weights] if fmt == "int8" else [])
    return jax.ffi.ffi_call(target, out, vmap_method="sequential")(x, *args)


@struct.dataclass
class QuantPanels:
    """A `quant.Quantized` int8 or int4 weight with int8 activations, of declared `shape` (its
    first `contract` axes the inputs), stored in `qdot.cc`'s layout: `x @ w` runs the
    kernel."""

    w: jax.Array
    scale: jax.Array | None  # int8's per output; int4's are inside w
    fmt: str = struct.field(pytree_node=False)
    shape: tuple = struct.field(pytree_node=False)
    contract: int = struct.field(pytree_node=False, default=1)

    @classmethod
    def of_quantized(cls, q) -> QuantPanels:
        """From a `quant.Quantized` matrix (no stacked axes) with `acts`."""
        if q.fmt not in OFFSET or not q.acts or q.lead:
            raise ValueError(f"the integer dot kernel takes int8 or int4 weights with int8 "
                             f"activations and no stacked axes; this one is {q.fmt} {q.shape} "
                             f"(acts={q.acts}, lead={q.lead})")
        n_pad = -(-q.k // BLOCK) * BLOCK
        if q.fmt == "int8":
            values = jnp.pad(q.q, ((0, 0), (0, n_pad - q.k)))
        else:  # unpacked: value j in byte j's low nibble, j + n_pad / 2 in byte j's high one
            lo, hi = jnp.left_shift(q.q, 4) >> 4, q.q >> 4
            values = jnp.concatenate([lo, hi], axis=-1)
        wp, scale = pack(values, q.scale, q.fmt)
        return cls(wp, scale, q.fmt, tuple(q.shape), q.contract)

    @property
    def k(self) -> int:
        return math.prod(self.shape[:self.contract])

    @property
    def n(self) -> int:
        return math.prod(self.shape[self.contract:])

    @property
    def dtype(self):
        return self.w.dtype

    @property
    def nbytes(self) -> int:
        return self.w.nbytes + (0 if self.scale is None else self.scale.nbytes)

    def __getitem__(self, index) -> QuantPanels:
        if index is Ellipsis:
            return self
        raise IndexError("a matrix in the integer kernel's panels has no stacked axes")

    def __rmatmul__(self, x: jax.Array) -> jax.Array:  # x [..., n_in] @ w -> [..., n_out]
        y = qrows(x.reshape(-1, self.k).astype(jnp.float32), self.w, self.scale, self.n,
                  self.fmt)
        return y.astype(x.dtype).reshape(*x.shape[:-1], self.n)

    @staticmethod
    def contract_each(x: jax.Array, ws, axes: int):
        """`ops.contract_each` for QuantPanels of one format and one input size: one kernel
        call (x rounded once); NotImplemented for a mix."""
        w0 = ws[0]
        if any(w.fmt != w0.fmt or w.k != w0.k or w.contract != axes for w in ws):
            return NotImplemented
        lead = x.shape[:x.ndim - axes]
        ys = qrows_each(x.reshape(-1, w0.k).astype(jnp.float32),
                        [(w.w, w.scale, w.n) for w in ws], w0.fmt)
        return [y.astype(x.dtype).reshape(*lead, *w.shape[axes:])
                for y, w in zip(ys, ws, strict=True)]

    def values(self) -> tuple[jax.Array, jax.Array]:
        """(the stored values as int32 [n_pad, n] without their offset, scale per output [n]
        (int8) or [n_pad / BLOCK, n] (int4)): `pack` undone."""
        P = self.w.shape[0]
        u = self.w.astype(jnp.int32)
        if self.fmt == "int8":
            rows = self.w.shape[1]
            v = u.reshape(P, rows, PANEL, 4).transpose(1, 3, 0, 2).reshape(rows * 4, -1)
            return v[:, :self.n] - OFFSET["int8"], self.scale[:self.n]
        G = self.w.shape[1]
        b = u[..., :512].reshape(P, G * 4, PANEL, 4)  # [P, chunks, 32, 4]
        v = jnp.stack([b & 0xF, b >> 4], axis=2)  # [P, chunks, 2, 32, 4]
        v = v.transpose(1, 2, 4, 0, 3).reshape(G * BLOCK, -1)
        s = jax.lax.bitcast_convert_type(self.w[..., 512:].reshape(P, G, PANEL, 2),
                                         jnp.float16)  # [P, G, 32]
        s = s.transpose(1, 0, 2).reshape(G, -1)
        return v[:, :self.n] - OFFSET["int4"], s[:, :self.n]

    def dequantize(self, dtype=jnp.float32) -> jax.Array:
        """The float weight in its declared shape (for einsum products)."""
        v, s = self.values()
        s = s.astype(jnp.float32)
        w = v.astype(jnp.float32) * (s if self.fmt == "int8" else jnp.repeat(s, BLOCK, 0))
        return w[:self.k].astype(dtype).reshape(self.shape)
