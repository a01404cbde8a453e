"""Quantized weights and caches: int8, float8 (e4m3) and int4 numbers with their scales.

Formats (symmetric, round to nearest; what each stores is what `refmodel.counting` counts):
- `int8`: one scale per output channel, s = max|w| / 127 over the channel's inputs;
- `float8`: e4m3 (`jnp.float8_e4m3fn`, max 448), one scale per output channel, s = max|w| / 448;
- `int4`: one float16 scale per QUANT_GROUP = 32 inputs of each output channel, s = max|w| /
  7, values in [-8, 7], two packed per byte (`packed`, below): llama.cpp's Q4_0 layout, 4.5
  bits per weight (int8 and float8 keep a float32 scale per output channel).
A KV cache in int8 or float8 keeps one scale per cached vector (a head's key or value, a
latent row): `QuantCache`. With `activations=True` (int8 or int4 weights) the activations are
rounded to int8 too, per block of ACT_BLOCK = 32 inputs (s = max|x| / 127 over the block), as
llama.cpp's Q8_0 and Q4_0 dot products round theirs: the product is then an integer dot per
block, scaled by both scales.

A quantized weight is a `Quantized` pytree stored output-major, q [..., n_out, n_in], so
that the product with a few activation rows is one fused multiply-and-reduce over the
contiguous input axis (`FEW_ROWS`). XLA:CPU has no fast mixed-precision GEMV: written as a
dot of x with the dequantized weight, or as a dot with `preferred_element_type`, or as an
int8 x int8 -> int32 dot, the batch-1 product of an int8 weight ran several times slower
than the float32 GEMV (`python -m microbench quant` measures them all). More rows than FEW_ROWS
(prefill) dequantize once and run the float GEMM. With backend="native"
(`backends.use(quantize(model, weights="int8"), "native")`) an int8 matrix is stored in the
native kernel's panels instead, converted to float as it is loaded: every product, one row or
many, in the kernel; an int8 or int4 matrix with int8 activations is stored for the integer
dot kernel (`refmodel/kernels/qdot.cc`), which sums each block's byte products with the CPU's
int8 dot instruction, as llama.cpp does. On "xla" the activations are rounded
(`round_activations`) and the product is the weight-only one: the same numbers, no faster.

`quantize(model, weights=..., kv=...)` is the one call: any model (random or trained) comes
back with its matrices and its cache format as the config says; the modules declare which of
their parameters are matrices (`MATRICES`), so nothing here names a variant.
"""

from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp
from flax import nnx, struct

from refmodel import ops
from refmodel.counting import QUANT_GROUP

WEIGHT_FORMATS = ("int8", "float8", "int4")
ACT_FORMATS = ("int8", "int4")  # weight formats whose products may take int8 activations
KV_FORMATS = ("int8", "float8")
STORAGE = {"int8": jnp.int8, "float8": jnp.float8_e4m3fn, "int4": jnp.int8}
QMAX = {"int8": 127.0, "float8": 448.0, "int4": 7.0}
ACT_BLOCK = 32  # inputs per activation scale with activations=True (llama.cpp's Q8_0 block)
# Rows at or below which a product runs as a fused multiply-and-reduce over the quantized
# weight; above, the weight is dequantized once and the float GEMM runs (past ~32 rows the
# reduce loses to the GEMM: `python -m microbench quant` times both).
FEW_ROWS = 32


def _round(x: jax.Array, fmt: str) -> jax.Array:
    if fmt == "float8":
        return x.astype(STORAGE[fmt])  # round to nearest e4m3
    return jnp.clip(jnp.round(x), -QMAX[fmt] - (fmt == "int4"), QMAX[fmt]).astype(jnp.int8)


def _scale(amax: jax.Array, fmt: str) -> jax.Array:
    """max|x| -> a float32 scale; an all-zero row gets 1 (it quantizes to zeros either way)."""
    amax = amax.astype(jnp.float32)
    return jnp.where(amax > 0, amax / QMAX[fmt], 1.0)


def _half(scale: jax.Array) -> jax.Array:
    """A float32 scale as the float16 it is stored in, rounded up so that max|w| / s stays
    within the format (rounded down it could pass 7) and kept inside float16's range: from its
    smallest subnormal (a smaller group rounds to zeros either way) to its largest number."""
    f16 = jnp.finfo(jnp.float16)
    s = jnp.clip(scale, float(f16.smallest_subnormal), float(f16.max))
    half = s.astype(jnp.float16)
    return jnp.where(half.astype(jnp.float32) < s, jnp.nextafter(half, jnp.float16(jnp.inf)),
                     half)


# Weights -----------------------------------------------------------------------------------------

@struct.dataclass
class Quantized:
    """A weight of `shape` = lead + inputs + outputs stored as q [*lead, n_out, n_pad] and
    scales.

    `lead` leading axes index stacked matrices (a MoE's experts); the next `contract` axes
    are the inputs (n_in, their product), the rest the outputs (n_out). int4 packs two values
    per byte: q [*lead, n_out, n_pad / 2] with n_pad = n_in rounded up to a whole group, value
    j of a row in the low nibble of byte j and value j + n_pad / 2 in the high one. `acts`
    (int8 and int4): the activations are rounded to int8 per block of ACT_BLOCK inputs before
    the product (`round_activations`), as an integer dot product reads them.
    """

    q: jax.Array
    scale: jax.Array  # float32 [*lead, n_out] (int8, float8), float16 [*lead, n_out, groups] (int4)
    fmt: str = struct.field(pytree_node=False)
    shape: tuple = struct.field(pytree_node=False)
    lead: int = struct.field(pytree_node=False, default=0)
    contract: int = struct.field(pytree_node=False, default=1)
    acts: bool = struct.field(pytree_node=False, default=False)

    @property
    def k(self) -> int:
        return math.prod(self.shape[self.lead:self.lead + self.contract])

    @property
    def n(self) -> int:
        return math.prod(self.shape[self.lead + self.contract:])

    @property
    def nbytes(self) -> int:
        return self.q.nbytes + self.scale.nbytes

    @property
    def dtype(self):
        return self.q.dtype

    def __getitem__(self, index) -> Quantized:
        """w[...] is w; w[e] (lead axes only) is one stacked matrix, still quantized."""
        if index is Ellipsis:
            return self
        if self.lead == 0:
            raise IndexError("a quantized matrix indexes only its leading (stacked) axes")
        return Quantized(self.q[index], self.scale[index], self.fmt, self.shape[1:],
                         self.lead - 1, self.contract, self.acts)

    def __rmatmul__(self, x: jax.Array) -> jax.Array:  # x [..., n_in] @ w -> [..., n_out]
        """The product with the matrix q holds, [prod(inputs), prod(outputs)] (a weight
        declared over several axes takes x with its inputs flattened: `ops.contract`)."""
        if self.lead:
            raise ValueError(f"x @ w takes one matrix; this is a stack {self.shape}: index it")
        return matmul(x, self)

    def dequantize(self, dtype=jnp.float32) -> jax.Array:
        """The float weight, in its original `shape` and layout."""
        w = unpack(self) * _expand_scale(self)  # [*lead, n_out, n_pad]
        w = w[..., :self.k].astype(dtype)
        lead = self.shape[:self.lead]
        w = w.reshape(*lead, self.n, self.k)
        w = jnp.swapaxes(w, -1, -2)  # [*lead, n_pad, n_out]
        return w.reshape(self.shape)


ops.weight_type(Quantized, ops.matrix_contract)  # x [..., *in] times the matrix it holds


def _expand_scale(w: Quantized) -> jax.Array:
    """Scales broadcast to q's unpacked [*lead, n_out, n_pad]."""
    if QUANT_GROUP[w.fmt] is None:
        return w.scale[..., None]
    return jnp.repeat(w.scale.astype(jnp.float32), QUANT_GROUP[w.fmt], axis=-1)


def unpack(w: Quantized) -> jax.Array:
    """The stored values as float32 [*lead, n_out, n_pad] (int4: both nibbles, sign-extended)."""
    if w.fmt != "int4":
        return w.q.astype(jnp.float32)
    lo = jnp.left_shift(w.q, 4) >> 4  # arithmetic shifts sign-extend the nibble
    hi = w.q >> 4
    return jnp.concatenate([lo, hi], axis=-1).astype(jnp.float32)


def quantize_matrix(w: jax.Array, fmt: str, lead: int = 0, contract: int = 1,
                    acts: bool = False) -> Quantized:
    """A float weight of shape lead + input axes + output axes -> `Quantized` in `fmt`."""
    if fmt not in WEIGHT_FORMATS:
        raise ValueError(f"weight format {fmt!r} is not one of {list(WEIGHT_FORMATS)}")
    if acts and fmt not in ACT_FORMATS:
        raise ValueError(f"quantized activations need weights in {list(ACT_FORMATS)}, not "
                         f"{fmt!r}")
    shape = tuple(w.shape)
    lead_shape = shape[:lead]
    n_in, n_out = math.prod(shape[lead:lead + contract]), math.prod(shape[lead + contract:])
    wt = jnp.swapaxes(w.astype(jnp.float32).reshape(*lead_shape, n_in, n_out), -1, -2)
    group = QUANT_GROUP[fmt]
    if group is None:
        scale = _scale(jnp.max(jnp.abs(wt), axis=-1), fmt)  # [*lead, n_out]
        q = _round(wt / scale[..., None], fmt)
    else:
        n_pad = -(-n_in // group) * group
        wt = jnp.pad(wt, [(0, 0)] * (wt.ndim - 1) + [(0, n_pad - n_in)])
        groups = wt.reshape(*wt.shape[:-1], n_pad // group, group)
        scale = _half(_scale(jnp.max(jnp.abs(groups), axis=-1), fmt))  # [*lead, n_out, groups]
        v = _round(groups / scale[..., None].astype(jnp.float32), fmt).reshape(wt.shape)
        half = n_pad // 2
        q = (v[..., :half] & 0xF) | jnp.left_shift(v[..., half:], 4)  # two per byte
    return Quantized(q, scale, fmt, shape, lead, contract, acts)


def matmul(x: jax.Array, w: Quantized) -> jax.Array:
    """x [..., n_in] times the quantized w (n_in inputs, n_out outputs) -> [..., n_out] in
    x's dtype.

    With `acts`, x is first rounded to int8 per block (`round_activations`). Up to FEW_ROWS
    rows: the fused multiply-and-reduce over each output channel's stored values, scaled once
    per channel (int4: per group, inside the reduce). More: dequantize, then the float GEMM.
    """
    lead, n_in = x.shape[:-1], x.shape[-1]
    rows = x.reshape(-1, n_in)
    if w.acts:
        rows = round_activations(rows)
    if rows.shape[0] <= FEW_ROWS:
        xf = rows.astype(jnp.float32)
        if QUANT_GROUP[w.fmt] is not None:
            xf = jnp.pad(xf, ((0, 0), (0, w.q.shape[-1] * 2 - n_in)))  # to whole groups
        if rows.shape[0] == 1:  # 2-D: as one 3-D product XLA:CPU ran far slower
            y = _reduce(w, xf[0][None, :])[None]  # [1, n_out]
        else:
            y = jax.vmap(lambda r: _reduce(w, r[None, :]))(xf)  # [M, n_out]
    else:
        y = rows @ w.dequantize(rows.dtype).reshape(w.k, w.n)
    return y.astype(x.dtype).reshape(*lead, w.n)


def round_activations(x: jax.Array) -> jax.Array:
    """x [..., n] as an int8 dot product reads it: each block of ACT_BLOCK inputs (the last
    one zero-padded) rounded to int8 with scale s = max|x| / 127 over the block, then times s.
    The integer product of these int8 values with a quantized weight, scaled by both scales, is
    the float product of this x with the dequantized weight (to float rounding)."""
    n = x.shape[-1]
    xf = jnp.pad(x.astype(jnp.float32), [(0, 0)] * (x.ndim - 1) + [(0, -n % ACT_BLOCK)])
    blocks = xf.reshape(*xf.shape[:-1], -1, ACT_BLOCK)
    s = _scale(jnp.max(jnp.abs(blocks), axis=-1), "int8")[..., None]
    q = _round(blocks / s, "int8")
    return (q.astype(jnp.float32) * s).reshape(xf.shape)[..., :n].astype(x.dtype)


def _reduce(w: Quantized, x: jax.Array) -> jax.Array:
    """One row x [1, n_pad] against every output channel of q [n_out, n_pad]: a fused multiply
    and sum over the contiguous input axis, scaled per channel (int4: per group, before the
    sum)."""
    if QUANT_GROUP[w.fmt] is None:
        return (w.q.astype(jnp.float32) * x).sum(-1) * w.scale  # [n_out]
    return (unpack(w) * _expand_scale(w) * x).sum(-1)  # [n_out]


def dense(w) -> jax.Array:
    """A weight as a float array in its declared layout, for einsum products: dequantized if
    quantized, transposed back if stored output-major for a native kernel."""
    return w.dequantize() if hasattr(w, "dequantize") else w


def matrices(module: nnx.Module) -> dict[str, tuple[int, int]]:
    """{attribute: (lead, contract)} of the matrices `module` holds (its class's MATRICES,
    those it has: optional ones, e.g. a gate, may be absent)."""
    spec = getattr(type(module), "MATRICES", {})
    return {name: lc for name, lc in spec.items() if hasattr(module, name)}


def quantize_weights(model: nnx.Module, fmt: str, acts: bool = False) -> nnx.Module:
    """Replace, in place, every declared matrix of every submodule by its `Quantized` form."""
    for _, module in nnx.iter_modules(model):
        for name, (lead, contract) in matrices(module).items():
            value = getattr(module, name)[...]
            if not isinstance(value, Quantized):
                setattr(module, name, nnx.Param(quantize_matrix(value, fmt, lead, contract, acts)))
    return model


def quantize(model: nnx.Module, weights: str | None = None, kv: str | None = None,
             activations: bool = False) -> nnx.Module:
    """A copy of `model` (random or trained, float) with its matrices in `weights` format and
    its caches in `kv` format (None: as they are), its config saying so."""
    cfg = model.cfg
    if cfg.weight_format != "none" and weights is not None:
        raise ValueError(f"the model's weights are already {cfg.weight_format}; quantize the "
                         "float model")
    if cfg.backend in ("output-major", "native") and weights is not None:
        raise ValueError(f"the model's weights are stored for backend={cfg.backend!r}; quantize "
                         "the backend='xla' model, then backends.use(quantized, 'native')")
    new_cfg = dataclasses.replace(cfg, weight_format=weights or cfg.weight_format,
                                  kv_format=kv or cfg.kv_format,
                                  quant_activations=activations or cfg.quant_activations)
    float_cfg = dataclasses.replace(new_cfg, weight_format="none", quant_activations=False)
    new = nnx.eval_shape(lambda: type(model)(float_cfg, rngs=nnx.Rngs(0)))
    nnx.update(new, nnx.state(model))
    for _, module in nnx.iter_modules(new):
        if hasattr(module, "cfg"):
            module.cfg = new_cfg
    if weights is not None:
        quantize_weights(new, weights, activations)
    return new


# KV caches ---------------------------------------------------------------------------------------

@struct.dataclass
class QuantCache:
    """A token cache in int8 or float8: q as the float cache's shape, one float32 scale per
    cached vector (the last axis): scale = q's shape without it."""

    q: jax.Array
    scale: jax.Array

    @property
    def shape(self):
        return self.q.shape

    @property
    def nbytes(self) -> int:
        return self.q.nbytes + self.scale.nbytes


def cache_zeros(shape: tuple[int, ...], dtype, kv_format: str):
    """An empty token cache: a float array, or a `QuantCache` when kv_format is not "none"."""
    if kv_format == "none":
        return jnp.zeros(shape, dtype)
    return QuantCache(q=jnp.zeros(shape, STORAGE[kv_format]),
                      scale=jnp.ones(shape[:-1], jnp.float32))


def quantize_vectors(x: jax.Array, like: QuantCache) -> QuantCache:
    """Float vectors x [..., H] in the format of the cache `like` (one scale per vector)."""
    fmt = "float8" if like.q.dtype == STORAGE["float8"] else "int8"
    scale = _scale(jnp.max(jnp.abs(x.astype(jnp.float32)), axis=-1), fmt)
    return QuantCache(q=_round(x.astype(jnp.float32) / scale[..., None], fmt), scale=scale)


def cache_store(x: jax.Array, like):
    """x [..., H] as the cache `like` stores it: quantized vectors for a `QuantCache`, else
    only cast (no other op, so a float cache's compiled code is what it was)."""
    if isinstance(like, QuantCache):
        return quantize_vectors(x, like)
    return x.astype(like.dtype)


def cache_round(x: jax.Array, like) -> jax.Array:
    """x as a query reads it back from the cache `like` (x itself for a float cache): a
    layer that attends to a chunk's own keys before reading them from the cache (the sliding
    ring's prefill) sees them rounded, as later chunks and decode steps will."""
    if isinstance(like, QuantCache):
        return cache_read(quantize_vectors(x, like), x.dtype)
    return x


def cache_read(cache, dtype) -> jax.Array:
    """The cache as floats of `dtype` (a float cache is only cast)."""
    if isinstance(cache, QuantCache):
        return (cache.q.astype(jnp.float32) * cache.scale[..., None]).astype(dtype)
    return cache.astype(dtype)
