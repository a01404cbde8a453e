"""Pieces the softmax-attention variants share: RoPE, masks, the grouped softmax core.

RoPE is the rotate-half form of Su et al. 2021 ("RoFormer") as Llama and Hugging Face apply
it, optionally on the first `rotary_dim` channels only (partial rotary). The grouped core is
the scaling book's GQA einsum: queries [B, T, K, G, H] against keys [B, K, S, H]. Caches are
head-major, [B, K, S, H]: each (sequence, KV head) reads its keys as one contiguous block.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from refmodel import ops
from refmodel.layers import SOFTMAX_FLOPS, soft_cap
from refmodel.quant import cache_store

NEG_INF = -1e30  # finite, so a fully masked row would give a uniform softmax, not NaN
# FLOPs per attention score of `attend`: scale, mask select, then the row softmax.
ATTN_SOFTMAX_FLOPS = 2 + SOFTMAX_FLOPS
# A learned sink logit joins each softmax row as one more entry: max, subtract, sum = 3 per row.
SINK_FLOPS = 3
# `rope`: 2 multiplies and 1 add per rotated channel.
ROPE_FLOPS = 3

def to_heads(x: jax.Array, w) -> jax.Array:
    """x [..., D] times w [D, *outputs] -> [..., *outputs] (MLA's wq [D, N, H], the sparse
    indexer's weights), whatever type stores w (`ops.contract`)."""
    return ops.contract(x, w, 1)


def from_heads(o: jax.Array, w) -> jax.Array:
    """o [B, T, N, U] times w [N, U, D] -> [B, T, D], as `to_heads`."""
    return ops.contract(o, w, 2)


def positions_of(start: jax.Array, T: int) -> jax.Array:
    """Positions of a chunk of T tokens from `start`: int32 [T] for a scalar start (one
    position shared by the batch), [B, T] for a start per sequence [B]."""
    start = jnp.asarray(start, jnp.int32)
    if start.ndim == 0:
        return start + jnp.arange(T, dtype=jnp.int32)  # [T]
    return start[:, None] + jnp.arange(T, dtype=jnp.int32)  # [B, T]


def write_at(cache, new: jax.Array, start: jax.Array, axis: int):
    """Write new into cache (batch first, sequence along `axis`) from position `start`.

    A quantized cache (`QuantCache`) gets new's vectors quantized, and both its leaves written
    at the same index: the scale lacks only the last axis, never the token axis.

    A scalar start writes every row at the same offset: one dynamic_update_slice. A start per
    sequence [B] writes row by row, one dynamic_update_slice per row in a `fori_loop`: as one
    scatter XLA:CPU kept some caches out of place (a copy of the cache per step), while the
    loop updates the cache where it lies, as the scalar path does."""
    start = jnp.asarray(start, jnp.int32)
    return jax.tree.map(lambda c, n: _write_leaf(c, n, start, axis), cache,
                        cache_store(new, cache))


def _write_leaf(cache: jax.Array, new: jax.Array, start: jax.Array, axis: int) -> jax.Array:
    if start.ndim == 0:
        return jax.lax.dynamic_update_slice_in_dim(cache, new, start, axis)

    def row(b, c):  # sequence b's T entries from its own start
        where = [b] + [jnp.int32(0)] * (c.ndim - 1)
        where[axis] = start[b]
        return jax.lax.dynamic_update_slice(c, jax.lax.dynamic_slice_in_dim(new, b, 1),
                                            tuple(where))

    return jax.lax.fori_loop(0, new.shape[0], row, cache)


def rope_table(positions: jax.Array, rotary_dim: int,
               theta: float) -> tuple[jax.Array, jax.Array]:
    """cos and sin of every position's angles, [T or B T, rotary_dim / 2] each, computed once.

    XLA fuses elementwise producers into their consumers, transcendental ones too: written
    plainly, every element of q and k would recompute its own cos and sin, several times the
    RoPE's own work. A product with the identity is an op XLA does not fuse into an
    elementwise loop, so the table is written once and read by both (`precision="highest"`:
    exact in float32 on every backend); its FLOPs are counted (`rope_table_flops`)."""
    half = rotary_dim // 2
    freqs = theta ** (-jnp.arange(half, dtype=jnp.float32) / half)  # [rotary_dim / 2]
    angles = positions.astype(jnp.float32)[..., None] * freqs  # [T or B T, rotary_dim / 2]
    table = jnp.concatenate([jnp.cos(angles), jnp.sin(angles)], axis=-1)
    table = jnp.dot(table, jnp.eye(2 * half, dtype=table.dtype), precision="highest")
    return table[..., :half], table[..., half:]


def rope_table_flops(tokens: float, rotary_dim: int) -> float:
    """FLOPs of `rope_table` for `tokens` positions: its product with the identity, 2 x
    rotary_dim x rotary_dim per position (the price of computing each cos and sin once)."""
    return 2.0 * tokens * rotary_dim * rotary_dim


def rope_pair(q: jax.Array, k: jax.Array, positions: jax.Array, rotary_dim: int,
              theta: float) -> tuple[jax.Array, jax.Array]:
    """Rotate the first `rotary_dim` channels of q and k [B, T, ..., H] by position [T] or
    [B, T], both by one table with a row per token of [B, T] (what `rope_table_flops`
    counts)."""
    cos, sin = rope_table(jnp.broadcast_to(positions, q.shape[:2]), rotary_dim, theta)
    return _rotate(q, cos, sin, rotary_dim), _rotate(k, cos, sin, rotary_dim)


def _rotate(x: jax.Array, cos: jax.Array, sin: jax.Array, rotary_dim: int) -> jax.Array:
    """x [B, T, ..., H] rotated by cos and sin [B, T, rotary_dim / 2]."""
    half = rotary_dim // 2
    shape = cos.shape[:2] + (1,) * (x.ndim - 3) + (half,)
    cos, sin = cos.reshape(shape).astype(x.dtype), sin.reshape(shape).astype(x.dtype)
    x1, x2, rest = x[..., :half], x[..., half:rotary_dim], x[..., rotary_dim:]
    return jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin, rest], axis=-1)


def causal_mask(q_pos: jax.Array, k_pos: jax.Array, window: int | None = None) -> jax.Array:
    """True where a query at q_pos [T] or [B, T] may see a key at k_pos [S] or [B, S]
    (k_pos < 0: empty slot): [T, S] if both are shared by the batch, else [B, T, S]."""
    q, k = q_pos[..., :, None], k_pos[..., None, :]  # [(B,) T, 1], [(B,) 1, S]
    mask = (k <= q) & (k >= 0)
    if window is not None:
        mask &= q - k < window
    return mask


def attend(q: jax.Array, k: jax.Array, v: jax.Array, mask: jax.Array, scale: float,
           softcap: float | None = None, sinks: jax.Array | None = None) -> jax.Array:
    """Softmax attention of q [B, T, K, G, H] over k [B, K, S, H] and v [B, K, S, U] (U: the
    value head dim, H except in MLA), where mask [T, S] or [B, T, S] is True -> [B, T, K, G, U].

    The G query heads of a group share their KV head: the scaling book's GQA einsum. sinks,
    if given, are one learned logit per head [K, G] that joins the softmax's denominator but
    carries no value (gpt-oss); softcap is Gemma 2's tanh cap on the scores."""
    with jax.named_scope("attn_scores"):
        s = jnp.einsum("BTKGH,BKSH->BKGTS", q, k) * scale  # [B, K, G, T, S]
        if softcap is not None:
            s = soft_cap(s, softcap)
        s = jnp.where(mask[:, None, None] if mask.ndim == 3 else mask, s, NEG_INF)
    with jax.named_scope("attn_softmax"):
        p = softmax(s, None if sinks is None else sinks[None, :, :, None, None])
    with jax.named_scope("attn_values"):
        return jnp.einsum("BKGTS,BKSU->BTKGU", p.astype(v.dtype), v)  # [B, T, K, G, U]


def softmax(s: jax.Array, sink: jax.Array | None = None) -> jax.Array:
    """Softmax over the last axis; a sink logit (broadcast to s's rows) joins each row's
    denominator and is dropped from the result."""
    if sink is None:
        return jax.nn.softmax(s, axis=-1)
    sink = jnp.broadcast_to(sink, s.shape[:-1] + (1,)).astype(s.dtype)
    return jax.nn.softmax(jnp.concatenate([s, sink], axis=-1), axis=-1)[..., :-1]
