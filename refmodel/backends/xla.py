"""The "xla" backend: the reference's ops laid out for XLA's CPU compiler.

Same algorithm, same numbers to float rounding, other shapes: XLA:CPU picks a slow path or
copies a cache for some einsum layouts, and these keep it on its fast ones. Each form says what
it avoids; `python -m microbench phases --backend reference` against `--backend xla` measures
what they buy on your machine.

- `attend`: one query per sequence with G > 1 (GQA and MQA decode) keeps the scores as
  [B, K, S, G], the cache the GEMM's tall operand (with [B, K, G, S] XLA:CPU ran the batched
  product with G rows on a slow path); at batch 1 over a cache just written in place, both
  products are a broadcast multiply and a sum, since a dot there made XLA:CPU copy every
  cache several times per step (tests/test_cache_in_place.py); longer query runs go in
  blocks of QUERY_BLOCK queries laid out [B, K, G T, H], so each block's scores are one
  GEMM's natural output and stay small.
- MLA's naive decode expands the keys and values as [B, N, P, S] and [B, N, U, S], the
  layout of XLA's own product, so neither is transposed through memory.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from refmodel import ops
from refmodel.attention.common import NEG_INF, causal_mask, softmax
from refmodel.layers import soft_cap
from refmodel.quant import cache_read, dense

QUERY_BLOCK = 256  # queries per block of a long chunk's attention
SUMMED_BATCH = 1  # decode batches up to this over a just-written cache take `attend_summed`


def attend(q, k, v, mask, scale, softcap=None, sinks=None, written=False):
    """`refmodel.attention.common.attend` in XLA:CPU's fast layouts (see the module doc);
    written=True when k, v are the caches this step has just written."""
    if q.shape[1] == 1 and q.shape[3] > 1:
        one = attend_summed if written and q.shape[0] <= SUMMED_BATCH else attend_one
        return one(q, k, v, mask, scale, softcap, sinks)
    T = q.shape[1]
    return jnp.concatenate([
        attend_rows(q[:, i:i + QUERY_BLOCK], k, v, mask[..., i:i + QUERY_BLOCK, :], scale,
                    softcap, sinks)
        for i in range(0, T, QUERY_BLOCK)], axis=1)


def _masked(s, mask, softcap):
    """Soft-capped (if asked) scores s with the masked entries at NEG_INF; mask is already
    broadcastable to s."""
    if softcap is not None:
        s = soft_cap(s, softcap)
    return jnp.where(mask, s, NEG_INF)


def attend_rows(q, k, v, mask, scale, softcap=None, sinks=None):
    """A block of queries as K batched GEMMs whose rows are the G T query rows of one KV head
    (M = G T): scores [B, K, M, S], the softmax over their last, contiguous axis."""
    B, T, K, G, H = q.shape
    S = k.shape[2]
    with jax.named_scope("attn_scores"):
        qr = q.transpose(0, 2, 3, 1, 4).reshape(B, K, G * T, H)  # [B, K, M, H]
        s = jnp.einsum("BKMH,BKSH->BKMS", qr, k).reshape(B, K, G, T, S) * scale
        s = _masked(s, mask[:, None, None] if mask.ndim == 3 else mask, softcap)
    with jax.named_scope("attn_softmax"):
        p = softmax(s, None if sinks is None else sinks[None, :, :, None, None])
    with jax.named_scope("attn_values"):
        p = p.astype(v.dtype).reshape(B, K, G * T, S)
        o = jnp.einsum("BKMS,BKSU->BKMU", p, v)  # [B, K, M, U]
        return o.reshape(B, K, G, T, -1).transpose(0, 3, 1, 2, 4)  # [B, T, K, G, U]


def attend_one(q, k, v, mask, scale, softcap=None, sinks=None):
    """One query per sequence, G > 1: scores [B, K, S, G] (mask, softmax over S, and the
    values product all keep this layout) -> [B, 1, K, G, U]."""
    with jax.named_scope("attn_scores"):
        s = jnp.einsum("BKSH,BKGH->BKSG", k, q[:, 0]) * scale  # [B, K, S, G]
        m = mask[..., 0, :]  # [S] or [B, S]: the one query's row
        s = _masked(s, m[None, None, :, None] if m.ndim == 1 else m[:, None, :, None], softcap)
    with jax.named_scope("attn_softmax"):  # over S, axis 2: a transpose would be undone
        if sinks is not None:
            sink = jnp.broadcast_to(sinks[None, :, None, :], s.shape[:2] + (1, s.shape[3]))
            p = jax.nn.softmax(jnp.concatenate([s, sink.astype(s.dtype)], axis=2), axis=2)
            p = p[:, :, :-1]
        else:
            p = jax.nn.softmax(s, axis=2)
    with jax.named_scope("attn_values"):
        return jnp.einsum("BKSG,BKSU->BKGU", p.astype(v.dtype), v)[:, None]  # [B, 1, K, G, U]


def attend_summed(q, k, v, mask, scale, softcap=None, sinks=None):
    """`attend_one` at batch 1 over a cache just written in place: both products as a
    broadcast multiply and a sum (accumulated in float32 at least, as a dot does), which XLA
    fuses with the written cache as it lies -> [1, 1, K, G, U]."""
    acc = jnp.promote_types(jnp.result_type(q, k), jnp.float32)
    with jax.named_scope("attn_scores"):
        qk = q[:, 0, :, :, None, :].astype(acc) * k[:, :, None].astype(acc)  # [1, K, G, S, H]
        s = jnp.sum(qk, axis=-1).astype(jnp.result_type(q, k)) * scale  # [1, K, G, S]
        m = mask[..., 0, :]  # [S] or [1, S]
        s = _masked(s, m[None, None, None, :] if m.ndim == 1 else m[:, None, None, :], softcap)
    with jax.named_scope("attn_softmax"):
        p = softmax(s, None if sinks is None else sinks[None, :, :, None])
    with jax.named_scope("attn_values"):
        pv = p.astype(v.dtype)[..., None].astype(acc) * v[:, :, None].astype(acc)
        return jnp.sum(pv, axis=3).astype(jnp.result_type(p, v))[:, None]  # [1, 1, K, G, U]


@ops.implements("gqa.attend", "xla")
def gqa_attend(layer, q, k, v, mask):
    return attend(q, k, v, mask, layer.cfg.softmax_scale, layer.cfg.attn_softcap,
                  layer.sink_logits())


@ops.implements("gqa.attend_cache", "xla")
def gqa_attend_cache(layer, q, cache, positions):
    """The reference's attention over the cache, told the cache was just written."""
    k_pos = jnp.arange(cache.k.shape[2], dtype=jnp.int32)
    k, v = cache_read(cache.k, q.dtype), cache_read(cache.v, q.dtype)
    return attend(q, k, v, causal_mask(positions, k_pos), layer.cfg.softmax_scale,
                  layer.cfg.attn_softcap, layer.sink_logits(), written=True)


@ops.implements("sliding.attend_ring", "xla")
def sliding_attend_ring(layer, q, cache, positions):
    """The decode step's attention over the ring just written."""
    k, v = cache_read(cache.k, q.dtype), cache_read(cache.v, q.dtype)  # [B, K, W, H]
    mask = causal_mask(positions, cache.pos, layer.cfg.window)  # [B, 1, W]
    return attend(q, k, v, mask, layer.cfg.softmax_scale, layer.cfg.attn_softcap,
                  layer.sink_logits(), written=True)


@ops.implements("mla.naive", "xla")
def mla_naive(layer, q_nope, q_rope, latent, k_rope, mask):
    """One query per sequence: keys and values expanded as [B, N, P, S] and [B, N, U, S];
    the scores add the shared RoPE key's part (q_rope . k_rope) -> [B, 1, N, U]."""
    if q_nope.shape[1] != 1:
        return NotImplemented
    P = layer.cfg.qk_nope_dim
    with jax.named_scope("kv_expand"):
        w = dense(layer.wkv_b[...])
        k_nope = jnp.einsum("BSR,RNP->BNPS", latent, w[..., :P])  # [B, N, P, S]
        v = jnp.einsum("BSR,RNU->BNUS", latent, w[..., P:])  # [B, N, U, S]
    with jax.named_scope("attn_scores"):
        s = jnp.einsum("BTNP,BNPS->BNTS", q_nope, k_nope.astype(q_nope.dtype))
        s = s + jnp.einsum("BTNQ,BSQ->BNTS", q_rope, k_rope)  # [B, N, 1, S]
        s = jnp.where(mask[:, None] if mask.ndim == 3 else mask, s * layer.scale, NEG_INF)
    with jax.named_scope("attn_softmax"):
        p = jax.nn.softmax(s, axis=-1)
    with jax.named_scope("attn_values"):
        return jnp.einsum("BNTS,BNUS->BTNU", p.astype(v.dtype), v)  # [B, 1, N, U]


ops.provide("xla")
