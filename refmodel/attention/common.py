"""Pieces the softmax-attention variants share: RoPE, masks, the grouped softmax core.

RoPE is the rotate-half form of Su et al. 2021 ("RoFormer") as Llama and Hugging Face apply
it, optionally on the first `rotary_dim` channels only (partial rotary). The grouped core is
the scaling book's GQA einsum: queries [B, T, K, G, H] against keys [B, K, S, H]. Caches are
head-major, [B, K, S, H], so both products take batch dims (B, K) leading and contract over a
contiguous axis: with a [B, S, K, H] cache XLA:CPU transposed (copied) the whole cache on
every decode step.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

NEG_INF = -1e30  # finite, so a fully masked row would give a uniform softmax, not NaN


def rope(x: jax.Array, positions: jax.Array, rotary_dim: int, theta: float) -> jax.Array:
    """Rotate the first `rotary_dim` channels of x [B, T, ..., H] by position [T]."""
    half = rotary_dim // 2
    freqs = theta ** (-jnp.arange(half, dtype=jnp.float32) / half)  # [rotary_dim / 2]
    angles = positions.astype(jnp.float32)[:, None] * freqs  # [T, rotary_dim / 2]
    shape = (1, angles.shape[0]) + (1,) * (x.ndim - 3) + (half,)
    cos = jnp.cos(angles).reshape(shape).astype(x.dtype)
    sin = jnp.sin(angles).reshape(shape).astype(x.dtype)
    x1, x2, rest = x[..., :half], x[..., half:rotary_dim], x[..., rotary_dim:]
    return jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin, rest], axis=-1)


def causal_mask(q_pos: jax.Array, k_pos: jax.Array, window: int | None = None) -> jax.Array:
    """[T, S] True where query at q_pos [T] may see key at k_pos [S] (k_pos < 0: empty slot)."""
    mask = (k_pos[None, :] <= q_pos[:, None]) & (k_pos[None, :] >= 0)
    if window is not None:
        mask &= q_pos[:, None] - k_pos[None, :] < window
    return mask


def attend(q: jax.Array, k: jax.Array, v: jax.Array, mask: jax.Array, scale: float,
           softcap: float | None = None, sinks: jax.Array | None = None) -> jax.Array:
    """Softmax attention of q [B, T, K, G, H] over k [B, K, S, H], v [B, K, S, Hv].

    mask is [T, S] or [B, T, S]; sinks, if given, is one learned logit per head [K, G] that
    joins the softmax denominator but carries no value (gpt-oss). Returns [B, T, K, G, Hv].

    For one query with G > 1 (GQA, MQA decode) both products are written as a broadcast
    multiply and a sum: the same FLOPs, but XLA:CPU fuses them into one pass over the cache,
    where the einsum made it transpose (copy) K and V on every step: 4 full copies of a
    4K-token cache per layer, 3-4x slower (measured while the machine was shared). With G = 1
    (MHA, MLA naive) the same multiply-and-sum hit a slow path, 40x slower than the einsum
    (K = 8, S = 4K, H = 32: 3.8 ms vs 0.09 ms), so there the einsum stays.
    """
    decode = q.shape[1] == 1 and q.shape[3] > 1  # one query, several per KV head (G > 1)
    with jax.named_scope("attn_scores"):
        if decode:  # multiply-and-reduce reads the cache once, in place (see below)
            s = jnp.sum(q[:, 0, :, :, None, :] * k[:, :, None], axis=-1)[:, :, :, None] * scale
        else:
            s = jnp.einsum("BTKGH,BKSH->BKGTS", q, k) * scale  # [B, K, G, T, S]
        if softcap is not None:
            s = softcap * jnp.tanh(s / softcap)
        m = mask[:, None, None] if mask.ndim == 3 else mask
        s = jnp.where(m, s, NEG_INF)
    with jax.named_scope("attn_softmax"):
        if sinks is not None:
            sink = jnp.broadcast_to(sinks[None, :, :, None, None], s.shape[:-1] + (1,))
            p = jax.nn.softmax(jnp.concatenate([s, sink.astype(s.dtype)], axis=-1), axis=-1)
            p = p[..., :-1]
        else:
            p = jax.nn.softmax(s, axis=-1)
    with jax.named_scope("attn_values"):
        p = p.astype(v.dtype)
        if decode:
            return jnp.sum(p[:, :, :, 0, :, None] * v[:, :, None], axis=-2)[:, None]
        return jnp.einsum("BKGTS,BKSH->BTKGH", p, v)  # [B, T, K, G, Hv]
