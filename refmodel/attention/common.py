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

from refmodel.kernels.rows import Panels
from refmodel.layers import SOFTMAX_FLOPS, soft_cap
from refmodel.quant import cache_store, dense

NEG_INF = -1e30  # finite, so a fully masked row would give a uniform softmax, not NaN
# FLOPs per attention score of `attend`: scale, mask select, then the row softmax.
ATTN_SOFTMAX_FLOPS = 2 + SOFTMAX_FLOPS
# A learned sink logit joins each softmax row as one more entry: max, subtract, sum = 3 per row.
SINK_FLOPS = 3
# `rope`: 2 multiplies and 1 add per rotated channel.
ROPE_FLOPS = 3

# The named scope of a kernel that computes scores, softmax and values in one pass (the native
# decode attention): the ops it holds, joined by "+" (microbench.breakdown charges its time
# and their counted cost to one row).
KERNEL_SCOPE = "attn_scores+attn_softmax+attn_values"


def to_heads(x: jax.Array, w) -> jax.Array:
    """x [..., D] times w [D, *outputs] -> [..., *outputs] (MLA's wq [D, N, H], the sparse
    indexer's weights): the native kernel's product where w is stored in its panels (a native
    model, `kernels.convert`), else XLA's over the float weight."""
    if isinstance(w, Panels):
        return (x @ w).reshape(*x.shape[:-1], *(w.declared or w.shape)[1:])
    return jnp.tensordot(x, dense(w), axes=1)


def from_heads(o: jax.Array, w) -> jax.Array:
    """o [B, T, N, U] times w [N, U, D] -> [B, T, D], as `to_heads`."""
    if isinstance(w, Panels):
        return o.reshape(*o.shape[:-2], -1) @ w
    return jnp.einsum("BTNU,NUD->BTD", o, dense(w))


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
    sequence [B] writes row by row, one dynamic_update_slice per row in a `fori_loop`. Written
    as one scatter (`.at[rows, :, cols].set` or a vmapped slice), XLA:CPU kept some caches out
    of place: the `medium` decode step at batch 1 needed 55 MB more temporaries and ran ~12%
    slower than with a scalar start. The loop compiles to the scalar path's program at batch 1
    and to the same bytes at batch 8."""
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

    XLA:CPU fuses elementwise producers into their consumers, transcendental ones too, and
    drops `optimization_barrier` before fusing: written plainly, every element of q and k
    recomputed its own cos and sin (a `medium` prefill of 512 tokens: 6.4-7.1 ms per layer for
    q's and k's RoPE, 2-core Xeon, 2026-12-03). A product with the identity is an op XLA does
    not fuse into an elementwise loop, so the table is written once and read by both: 1.1-1.3
    ms, the same numbers (`precision="highest"`: exact in float32 on every backend)."""
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


# Queries per block of the prefill core. A `medium` prefill of 1024 tokens holds its scores
# [B, K, G, T, S] in 64 MiB, written and read back by the mask, the softmax and the values
# product; in blocks of 256 queries each block's are 16 MiB, and the whole prefill ran
# ~10% faster than with blocks of 512 (blocks of 128: within the noise of 256).
QUERY_BLOCK = 256
# Decode batches up to this take `attend_one_summed` over a just-written cache. Batch 1 must
# (the einsum copies every cache 4 times there); above it the einsum copies nothing and the
# two forms ran even or split (llama-309m, native products, 2-core Zen 4, 7 interleaved calls:
# summed / einsum at context 128, batch 2 / 4 / 8: 1.02 / 1.01 / 0.93; context 1024, batch
# 2 / 8: 1.03 / 0.97), so the einsum keeps them.
SUMMED_BATCH = 1


def attend(q: jax.Array, k: jax.Array, v: jax.Array, mask: jax.Array, scale: float,
           softcap: float | None = None, sinks: jax.Array | None = None,
           written: bool = False) -> jax.Array:
    """Softmax attention of q [B, T, K, G, H] over k [B, K, S, H], v [B, K, S, U] (U: value
    head dim, H except in MLA).

    mask is [T, S] or [B, T, S]; sinks, if given, is one learned logit per head [K, G] that
    joins the softmax denominator but carries no value (gpt-oss). Returns [B, T, K, G, U].

    One query with G > 1 (GQA, MQA decode) goes to `attend_one`, or, at batch 1 when k and v
    are the caches this step has just written (`written`: a decode step's own cache, not
    gathered or concatenated keys), to `attend_one_summed`. Longer query runs (prefill)
    go through `attend_rows` in blocks of QUERY_BLOCK queries, each block exact (every block
    sees all S keys, so no running max is needed) and its output concatenated along T.
    """
    if q.shape[1] == 1 and q.shape[3] > 1:
        one = attend_one_summed if written and q.shape[0] <= SUMMED_BATCH else attend_one
        return one(q, k, v, mask, scale, softcap, sinks)
    T = q.shape[1]
    if T <= QUERY_BLOCK:
        return attend_rows(q, k, v, mask, scale, softcap, sinks)
    return jnp.concatenate([
        attend_rows(q[:, i:i + QUERY_BLOCK], k, v, mask[..., i:i + QUERY_BLOCK, :], scale,
                    softcap, sinks)
        for i in range(0, T, QUERY_BLOCK)], axis=1)


def attend_rows(q: jax.Array, k: jax.Array, v: jax.Array, mask: jax.Array, scale: float,
                softcap: float | None = None, sinks: jax.Array | None = None) -> jax.Array:
    """`attend` for one block of queries, as K batched GEMMs whose rows are the G x T query
    rows of one KV head (M = G*T): q is laid out [B, K, M, H] so the scores
    [B, K, M, S] are the product's natural output and the softmax runs over their last,
    contiguous axis.
    Written as one einsum to [B, K, G, T, S] over q [B, T, K, G, H], XLA:CPU computed the
    scores as [K, S, G*T] and transposed them (and the probabilities) through memory.
    With G = 1 (MHA, MLA naive) a multiply-and-sum hit a slow path, 40x slower than the
    einsum (K = 8, S = 4K, H = 32: 3.8 ms vs 0.09 ms), so the products stay einsums."""
    B, T, K, G, H = q.shape
    S = k.shape[2]
    with jax.named_scope("attn_scores"):
        qr = q.transpose(0, 2, 3, 1, 4).reshape(B, K, G * T, H)  # [B, K, M, H]
        s = jnp.einsum("BKMH,BKSH->BKMS", qr, k).reshape(B, K, G, T, S) * scale
        if softcap is not None:
            s = soft_cap(s, softcap)
        m = mask[:, None, None] if mask.ndim == 3 else mask
        s = jnp.where(m, s, NEG_INF)  # [B, K, G, T, S]
    with jax.named_scope("attn_softmax"):
        if sinks is not None:
            sink = jnp.broadcast_to(sinks[None, :, :, None, None], s.shape[:-1] + (1,))
            p = jax.nn.softmax(jnp.concatenate([s, sink.astype(s.dtype)], axis=-1), axis=-1)
            p = p[..., :-1]
        else:
            p = jax.nn.softmax(s, axis=-1)
    with jax.named_scope("attn_values"):
        p = p.astype(v.dtype).reshape(B, K, G * T, S)
        o = jnp.einsum("BKMS,BKSU->BKMU", p, v)  # [B, K, M, U]
        return o.reshape(B, K, G, T, -1).transpose(0, 3, 1, 2, 4)  # [B, T, K, G, U]


def attend_one(q: jax.Array, k: jax.Array, v: jax.Array, mask: jax.Array, scale: float,
               softcap: float | None = None, sinks: jax.Array | None = None) -> jax.Array:
    """`attend` for one query per sequence with G > 1 (GQA, MQA decode), scores kept as
    [B, K, S, G]: the cache is the GEMM's tall operand (S rows), the few query heads its
    columns. Written with the scores as [B, K, G, S], XLA:CPU ran the batched product with
    G rows (1-8) on a slow path, and an earlier broadcast multiply-and-sum (one pass, no
    cache copy) was handed to a library fusion that ran at ~1 GB/s: on `bench`, decode at
    batch 64 and context 1024 took 427-490 ms with it and 157-220 ms with this form (batch 1:
    the same). XLA's simplifier folds a transpose of the scores back into the slow
    orientation, so mask, softmax (over S, axis 2) and the values product all keep this
    layout. Returns [B, 1, K, G, U]."""
    with jax.named_scope("attn_scores"):
        s = jnp.einsum("BKSH,BKGH->BKSG", k, q[:, 0]) * scale  # [B, K, S, G]
        if softcap is not None:
            s = soft_cap(s, softcap)
        m = mask[..., 0, :]  # [S] or [B, S]: the one query's row
        m = m[None, None, :, None] if m.ndim == 1 else m[:, None, :, None]
        s = jnp.where(m, s, NEG_INF)
    with jax.named_scope("attn_softmax"):
        if sinks is not None:
            sink = jnp.broadcast_to(sinks[None, :, None, :], s.shape[:2] + (1, s.shape[3]))
            p = jax.nn.softmax(jnp.concatenate([s, sink.astype(s.dtype)], axis=2), axis=2)
            p = p[:, :, :-1]
        else:
            p = jax.nn.softmax(s, axis=2)
    with jax.named_scope("attn_values"):
        return jnp.einsum("BKSG,BKSU->BKGU", p.astype(v.dtype), v)[:, None]  # [B, 1, K, G, U]


def attend_one_summed(q: jax.Array, k: jax.Array, v: jax.Array, mask: jax.Array, scale: float,
                      softcap: float | None = None,
                      sinks: jax.Array | None = None) -> jax.Array:
    """`attend_one` at batch 1 over a cache just written in place: both products as a
    broadcast multiply and a sum (accumulated in float32 at least, as a dot does), scores
    [1, K, G, S]. Returns [1, 1, K, G, U].

    At batch 1 XLA:CPU (jax 0.10.2) drops the batch axis of a dot's operands through a
    bitcast; a bitcast of the freshly written cache made its fusion pass emit the write twice
    (one fusion feeding the dot, one for the returned cache) and copy insertion then copied
    every K and V cache 4 times per step (tests/test_cache_in_place.py). A reduce fusion
    takes the written cache directly: no copy. llama-309m, context 2048: a decode step of
    61 ms against 98-146 ms with the copies (best of 10, on a machine shared with other runs).
    The einsums read the cache ~2-3x faster per byte (0.10 vs 0.30 ms for the scores of one
    [4, 2049, 64] cache), so batch 2 and up, which never copied, keep them. G > 1 only: with
    one query head per KV head (G = 1) the same sum ran ~50x slower than the einsum (K = 8,
    S = 4K, H = 32: 3.8 ms vs 0.07 ms), so MHA keeps its copies."""
    acc = jnp.promote_types(jnp.result_type(q, k), jnp.float32)
    with jax.named_scope("attn_scores"):
        qk = q[:, 0, :, :, None, :].astype(acc) * k[:, :, None].astype(acc)  # [1, K, G, S, H]
        s = jnp.sum(qk, axis=-1).astype(jnp.result_type(q, k)) * scale  # [1, K, G, S]
        if softcap is not None:
            s = soft_cap(s, softcap)
        m = mask[..., 0, :]  # [S] or [1, S]: the one query's row
        m = m[None, None, None, :] if m.ndim == 1 else m[:, None, None, :]
        s = jnp.where(m, s, NEG_INF)
    with jax.named_scope("attn_softmax"):
        if sinks is not None:
            sink = jnp.broadcast_to(sinks[None, :, :, None], s.shape[:3] + (1,))
            p = jax.nn.softmax(jnp.concatenate([s, sink.astype(s.dtype)], axis=-1), axis=-1)
            p = p[..., :-1]
        else:
            p = jax.nn.softmax(s, axis=-1)
    with jax.named_scope("attn_values"):
        p = p.astype(v.dtype)
        pv = p[..., None].astype(acc) * v[:, :, None].astype(acc)  # [1, K, G, S, U]
        return jnp.sum(pv, axis=3).astype(jnp.result_type(p, v))[:, None]  # [1, 1, K, G, U]
