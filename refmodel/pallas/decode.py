"""Decode attention over a contiguous KV cache as a Pallas kernel, flash-decoding style.

One query per sequence (decode): q [B, K, G, H] over k, v [B, K, S, H], row b seeing its first
lens[b] keys -> softmax(scale q k^T) v [B, K, G, H], the GQA einsum of
`refmodel.attention.common.attend` with T = 1 (`reference_decode_attention` below).

The grid is (B, K, splits). Program (b, h, s) holds the G query heads that share KV head h
(GQA: one read of the keys serves all G) and owns split s's keys; it walks them in blocks of
`block_k`, keeping a running max m, a running sum l and an unnormalised output acc (the online
softmax of FlashAttention), so every key and value is read once and the [G, S] scores never
exist whole. Splitting the keys (Dao et al. 2023, "Flash-Decoding") gives an accelerator
B K splits programs where a decode step would otherwise have only B K: at batch 1 that is the
difference between a few busy cores and all of them. Each split writes acc, m and l, and
`combine` rescales them to one softmax. Blocks past lens[b] are never read (ragged lengths).

Computed in float32 whatever the cache's dtype (a bfloat16 cache is widened block by block).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

from refmodel.pallas.blocks import block_sizes, interpret_mode, round_up

MASKED = -1e30  # a masked score: finite, so exp(MASKED - m) is 0 and never NaN


def online_step(q, k, v, valid, carry):
    """One block of keys into the running softmax: q [G, H] (scaled), k and v [n, H], valid
    [n] (keys the row sees), carry (m [G], l [G], acc [G, H]) -> the new carry."""
    m, l, acc = carry
    s = jnp.dot(q, k.T, preferred_element_type=jnp.float32)  # [G, n]
    s = jnp.where(valid[None, :], s, MASKED)
    m_new = jnp.maximum(m, s.max(axis=-1))  # [G]
    p = jnp.exp(s - m_new[:, None])  # [G, n]
    alpha = jnp.exp(m - m_new)  # how much the old max overstated: rescale the old sums
    l = alpha * l + p.sum(axis=-1)
    acc = alpha[:, None] * acc + jnp.dot(p, v, preferred_element_type=jnp.float32)
    return m_new, l, acc


def _kernel(lens_ref, q_ref, k_ref, v_ref, acc_ref, m_ref, l_ref, *, scale, block_k):
    """Program (b, h, s): q_ref [G, H], k_ref and v_ref [span, H] (split s's keys), lens_ref
    [1] -> acc_ref [G, H], m_ref and l_ref [G]."""
    span = k_ref.shape[0]
    seen = lens_ref[0] - pl.program_id(2) * span  # keys of this split row b sees (may be <= 0)
    q = q_ref[...].astype(jnp.float32) * scale

    def step(i, carry):
        at = pl.ds(i * block_k, block_k)
        k = k_ref[at, :].astype(jnp.float32)  # [block_k, H]
        v = v_ref[at, :].astype(jnp.float32)
        valid = i * block_k + jnp.arange(block_k) < seen
        return online_step(q, k, v, valid, carry)

    G, H = q.shape
    carry = (jnp.full((G,), MASKED, jnp.float32), jnp.zeros((G,), jnp.float32),
             jnp.zeros((G, H), jnp.float32))
    n_blocks = jnp.clip(pl.cdiv(seen, block_k), 0, span // block_k)  # only blocks it sees
    m, l, acc = jax.lax.fori_loop(0, n_blocks, step, carry)
    acc_ref[...], m_ref[...], l_ref[...] = acc, m, l


def combine(acc, m, l, dtype):
    """The splits' partial softmaxes (acc [..., splits, G, H], m and l [..., splits, G]) as one:
    each rescaled by exp(m - max m), summed, divided by the total sum -> [..., G, H]."""
    top = m.max(axis=-2, keepdims=True)
    w = jnp.exp(m - top)  # a split that saw no key: m = MASKED, weight 0
    o = (w[..., None] * acc).sum(axis=-3) / (w * l).sum(axis=-2)[..., None]
    return o.astype(dtype)


def split_outputs(B, K, splits, Gp, H) -> dict:
    """The `pallas_call` outputs of a grid (B, K, splits) whose program (b, h, s) writes its
    split's partial softmax: acc [B, K, splits, Gp, H], m and l [B, K, splits, Gp], float32."""
    part = pl.BlockSpec((None, None, None, Gp), lambda b, h, s: (b, h, s, 0))
    return {"out_specs": [pl.BlockSpec((None, None, None, Gp, H),
                                       lambda b, h, s: (b, h, s, 0, 0)), part, part],
            "out_shape": [jax.ShapeDtypeStruct((B, K, splits, Gp, H), jnp.float32),
                          jax.ShapeDtypeStruct((B, K, splits, Gp), jnp.float32),
                          jax.ShapeDtypeStruct((B, K, splits, Gp), jnp.float32)]}


def pad_heads(q, min_rows):
    """q [..., G, H] with G padded to a multiple of min_rows (a GPU's dot wants >= 16 rows)."""
    G = q.shape[-2]
    extra = round_up(G, min_rows) - G
    return jnp.pad(q, [(0, 0)] * (q.ndim - 2) + [(0, extra), (0, 0)]) if extra else q


@functools.partial(jax.jit, static_argnames=("scale", "interpret", "block_k", "split_k"))
def decode_attention(q, k, v, lens, scale, *, interpret=None, block_k=None, split_k=None):
    """q [B, K, G, H] over k, v [B, K, S, H], row b seeing keys < lens[b] (int32 [B], >= 1)
    -> [B, K, G, H] in q's dtype. Blocks from `blocks.BLOCKS` unless given."""
    B, K, G, H = q.shape
    S = k.shape[2]
    cfg = block_sizes(block_k=block_k, split_k=split_k)
    bk = min(cfg["block_k"], round_up(S, 8))
    span = min(round_up(cfg["split_k"], bk), round_up(S, bk))  # keys per program
    splits = -(-S // span)
    if splits * span != S:  # a cache allocated in whole splits is read as it lies
        k, v = (jnp.pad(a, ((0, 0), (0, 0), (0, splits * span - S), (0, 0))) for a in (k, v))
    lens = jnp.minimum(lens.astype(jnp.int32), S)  # never the padding's keys
    qp = pad_heads(q, cfg["min_rows"])
    Gp = qp.shape[2]
    kv = pl.BlockSpec((None, None, span, H), lambda b, h, s: (b, h, s, 0))
    acc, m, l = pl.pallas_call(
        functools.partial(_kernel, scale=scale, block_k=bk),
        grid=(B, K, splits),
        in_specs=[pl.BlockSpec((1,), lambda b, h, s: (b,)),  # lens
                  pl.BlockSpec((None, None, Gp, H), lambda b, h, s: (b, h, 0, 0)),  # q
                  kv, kv],
        **split_outputs(B, K, splits, Gp, H),
        interpret=interpret_mode(interpret),
        name="decode_attention",
    )(lens, qp, k, v)
    return combine(acc, m, l, q.dtype)[:, :, :G]


def reference_decode_attention(q, k, v, lens, scale):
    """The oracle: the same attention as one masked softmax in plain jnp, float32."""
    f32 = jnp.float32
    s = jnp.einsum("BKGH,BKSH->BKGS", q.astype(f32), k.astype(f32)) * scale
    seen = jnp.arange(k.shape[2])[None, :] < lens[:, None]  # [B, S]
    p = jax.nn.softmax(jnp.where(seen[:, None, None], s, MASKED), axis=-1)
    return jnp.einsum("BKGS,BKSH->BKGH", p, v.astype(f32)).astype(q.dtype)
