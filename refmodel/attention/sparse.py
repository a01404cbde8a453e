"""Sparse attention by top-k token selection, in the spirit of DeepSeek Sparse Attention.

DeepSeek-AI 2025, "DeepSeek-V3.2-Exp: Boosting Long-Context Efficiency with DeepSeek Sparse
Attention". A small "lightning indexer" scores every (query t, key s) pair cheaply,

    I(t, s) = sum_i w[t, i] * relu(q_idx[t, i] . k_idx[s])

with I indexer heads of dim J (two letters local to this file: I = cfg.indexer_heads,
J = cfg.indexer_dim), one indexer key per token shared by the indexer heads and cached
(`k_idx` [B, S, J]), and per-query head weights w [B, T, I]. Each query then runs ordinary
GQA softmax attention over only the k = cfg.sparse_top_k tokens the indexer ranks highest.
(DeepSeek's indexer also applies RoPE and a norm to its queries and keys and runs in FP8; this
reference keeps the scoring rule only.)

Selection rule, exactly: among the keys query t may see (causal: position <= t, and a written
cache slot), take the k with the highest I(t, s); equal scores go to the earlier position
(`jax.lax.top_k` keeps the lower index first). The chosen indices are sorted by position.
With fewer than k visible keys, every visible key is chosen and the remaining picks are
masked out of the softmax, so an invisible token never takes part. With k >= the number of
visible keys the selection is exactly the causal mask and the layer is dense GQA (equal to
float32 rounding: the gathered keys make each query its own batch row, so XLA runs the same
dot products with other matmul shapes and sums in another order).

The lesson, in the costs below: a decode step's attention reads O(k) K/V entries per
sequence instead of O(S), but the indexer still reads all S of the small indexer keys
(J numbers per token against 2 K H for K/V), so decode stays O(S) in bytes, with a much
smaller constant. The main K/V cache is still full-length (`capacity_bound` = True).

With cfg.kv_format int8 or float8 the K/V cache is quantized (one scale per head vector) but
the indexer keys stay in cfg.dtype, and are counted so (`float_cache_size`). Rounded indexer
keys flip picks wherever two scores lie within the rounding, and one flipped pick moves a
query's output by a whole key's contribution: on tests/test_quant_kv.py's stack the logits'
error against a float cache was 0.063 (int8) with quantized indexer keys, 0.012 without;
a lone sparse layer in float8: 0.22, against 0.017. (DeepSeek's FP8 indexer is trained
with its rounding; this random-weight reference is not.)
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx, struct

from refmodel import ops
from refmodel.attention.base import float_cache_size
from refmodel.attention.common import (
    causal_mask,
    positions_of,
    write_at,
)
from refmodel.attention.gqa import GroupedQueryAttention, gqa_costs, kv_heads
from refmodel.config import ModelConfig, positive
from refmodel.counting import Cost, Dtypes, matmul
from refmodel.layers import param
from refmodel.quant import cache_read, cache_zeros, dense
from refmodel.registry import register

# Per (query, key, indexer head): relu, multiply by the head weight, add.
INDEX_FLOPS = 3


def indexer_product(x: jax.Array, w) -> jax.Array:
    """x [B, T, D] times an indexer weight [D, ...], from its float values (a quantized one
    dequantized): the scores decide discrete picks, and a product whose summation order
    followed the number of rows (a quantized weight's few-row reduce against its GEMM) would
    flip picks between a chunk and the same tokens one by one."""
    return jnp.tensordot(x, dense(w), axes=1)


@struct.dataclass
class SparseCache:
    """k and v float, or (cfg.kv_format) `QuantCache`s with scales [B, K, S]; k_idx is float
    whatever the format (see the module docstring)."""

    k: jax.Array  # [B, K, S, H]
    v: jax.Array  # [B, K, S, H]
    k_idx: jax.Array  # [B, S, J]


@register("sparse")
class SparseAttention(GroupedQueryAttention):
    """GQA in which each query attends to its top-k keys by a lightning indexer's score."""

    MEASURE = {"sparse": ("context",)}
    MATRICES = {**GroupedQueryAttention.MATRICES, "wq_idx": (0, 1), "wk_idx": (0, 1),
                "w_idx": (0, 1)}

    @classmethod
    def validate(cls, cfg: ModelConfig, kind: str) -> None:
        for f in ("sparse_top_k", "indexer_heads", "indexer_dim"):
            positive(f, getattr(cfg, f))

    def __init__(self, cfg: ModelConfig, *, kind: str, rngs: nnx.Rngs):
        super().__init__(cfg, kind=kind, rngs=rngs)
        D, I, J = cfg.d_model, cfg.indexer_heads, cfg.indexer_dim
        dtype = jnp.dtype(cfg.dtype)
        self.wq_idx = param(rngs, (D, I, J), D, dtype)  # [D, I, J]
        self.wk_idx = param(rngs, (D, J), D, dtype)  # [D, J]
        self.w_idx = param(rngs, (D, I), D, dtype)  # [D, I]

    def index_keys(self, x: jax.Array) -> jax.Array:
        """x [B, T, D] -> indexer keys [B, T, J]."""
        with jax.named_scope("indexer"):
            return indexer_product(x, self.wk_idx[...])  # [B, T, J]

    def index_scores(self, x: jax.Array, k_idx: jax.Array) -> jax.Array:
        """I(t, s) of queries x [B, T, D] against indexer keys [B, S, J] -> [B, T, S]."""
        with jax.named_scope("indexer"):
            q_idx = indexer_product(x, self.wq_idx[...])  # [B, T, I, J]
            w = indexer_product(x, self.w_idx[...])  # [B, T, I]
            dots = jnp.einsum("BTIJ,BSJ->BTIS", q_idx, k_idx.astype(q_idx.dtype))
            return jnp.einsum("BTI,BTIS->BTS", w, jax.nn.relu(dots))  # [B, T, S]

    def select(self, scores: jax.Array, mask: jax.Array):
        """Top-k visible keys of each query: scores [B, T, S], mask [T, S] or [B, T, S] ->
        indices int32 [B, T, k] sorted by position and valid [B, T, k] (k = min(top_k, S))."""
        n = min(self.cfg.sparse_top_k, scores.shape[-1])
        with jax.named_scope("topk_select"):
            _, idx = jax.lax.top_k(jnp.where(mask, scores, -jnp.inf), n)  # ties: lower index
            idx = jnp.sort(idx, axis=-1)  # [B, T, k]
            valid = jnp.take_along_axis(jnp.broadcast_to(mask, scores.shape), idx, axis=-1)
        return idx, valid

    def sparse_core(self, q, k, v, idx, valid):
        """q [B, T, K, G, H] over the k selected of k, v [B, K, S, H] -> [B, T, K, G, H]."""
        B, T, K, G, H = q.shape
        n = idx.shape[-1]
        with jax.named_scope("topk_select"):
            rows = jnp.arange(B)[:, None, None]
            # gather [B, T, k, K, H] -> one batch row per query, head-major [B*T, K, k, H]
            k_sel = k[rows, :, idx].reshape(B * T, n, K, H).transpose(0, 2, 1, 3)
            v_sel = v[rows, :, idx].reshape(B * T, n, K, H).transpose(0, 2, 1, 3)
        # each (b, t) is a batch row with its own keys: GQA's core, with sinks and soft-cap
        o = self.attend(q.reshape(B * T, 1, K, G, H), k_sel, v_sel, valid.reshape(B * T, 1, n))
        return o.reshape(B, T, K, G, H)

    @ops.op("sparse.attend")
    def sparse_attend(self, x, q, k, v, k_idx, positions, causal_within: bool) -> jax.Array:
        """Each query over the top-k of the keys it sees, ranked by the indexer: q [B, T, K, G,
        H], k, v [B, K, S, H], k_idx [B, S, J] -> [B, T, K, G, H]. causal_within: the keys
        are the chunk's own (no cache)."""
        k_pos = jnp.arange(k.shape[2], dtype=jnp.int32)  # [S]
        mask = causal_mask(positions, k_pos)  # [T, S], or [B, T, S]: each row its own
        idx, valid = self.select(self.index_scores(x, k_idx), mask)  # [B, T, k] x 2
        return self.sparse_core(q, k, v, idx, valid)

    def write(self, cache: SparseCache, k, v, k_idx, start) -> SparseCache:
        with jax.named_scope("kv_write"):  # each row at its own start if start is [B]
            new_k, new_v = write_at(cache.k, k, start, 2), write_at(cache.v, v, start, 2)
        with jax.named_scope("indexer"):
            return SparseCache(k=new_k, v=new_v, k_idx=write_at(cache.k_idx, k_idx, start, 1))

    def __call__(self, x: jax.Array, start: jax.Array, cache: SparseCache | None):
        positions = positions_of(start, x.shape[1])  # [T], or [B, T] for a start per row
        q, k, v = self.project(x, positions)  # [B, T, K, G, H], [B, K, T, H] x 2
        k_idx = self.index_keys(x)  # [B, T, J]
        if cache is not None:
            cache = self.write(cache, k, v, k_idx, start)
            k, v, k_idx = cache_read(cache.k, q.dtype), cache_read(cache.v, q.dtype), cache.k_idx
        o = self.sparse_attend(x, q, k, v, k_idx, positions, causal_within=cache is None)
        return self.output(x, o), cache

    @classmethod
    def init_cache(cls, cfg: ModelConfig, kind: str, batch: int, max_len: int) -> SparseCache:
        shape = (batch, kv_heads(cfg, kind), max_len, cfg.resolved_head_dim)
        dtype, fmt = jnp.dtype(cfg.dtype), cfg.kv_format
        return SparseCache(k=cache_zeros(shape, dtype, fmt), v=cache_zeros(shape, dtype, fmt),
                           k_idx=jnp.zeros((batch, max_len, cfg.indexer_dim), dtype))

    # Costs ------------------------------------------------------------------------------------

    @classmethod
    def param_counts(cls, cfg: ModelConfig, kind: str) -> dict[str, int]:
        D, I, J = cfg.d_model, cfg.indexer_heads, cfg.indexer_dim
        return {**super().param_counts(cfg, kind),
                "wq_idx": D * I * J, "wk_idx": D * J, "w_idx": D * I}

    @classmethod
    def cache_bytes(cls, cfg: ModelConfig, kind: str, batch: int, context: int,
                    dt: Dtypes) -> float:
        kv = super().cache_bytes(cfg, kind, batch, context, dt)
        return kv + batch * context * cfg.indexer_dim * float_cache_size(cfg, dt)

    @classmethod
    def costs(cls, cfg: ModelConfig, kind: str, batch: int, new: int, context: int,
              dt: Dtypes) -> dict[str, Cost]:
        """`new` queries per sequence over S = context + new keys, k = min(top_k, S) each."""
        K, H, I, J = kv_heads(cfg, kind), cfg.resolved_head_dim, cfg.indexer_heads, cfg.indexer_dim
        S, BT = context + new, batch * new
        n = min(cfg.sparse_top_k, S)
        out = gqa_costs(cfg, K, batch, new, n, dt)  # scores, softmax, values over k keys
        # The selected K/V are gathered in topk_select, so attn_scores/values read no cache:
        # the gather reads each selected entry once, at most all S of them.
        idx_size = float_cache_size(cfg, dt)  # the indexer keys stay float
        gathered = dt.kv_bytes(2.0 * batch * min(new * n, S) * K * H, H)
        out["attn_scores"] = Cost(flops=out["attn_scores"].flops)
        out["attn_values"] = Cost(flops=out["attn_values"].flops)
        out["indexer"] = (
            matmul(BT, cfg.d_model, I * J + J + I, dt)  # q_idx, k_idx and w projections
            + Cost(flops=2.0 * BT * S * I * J + INDEX_FLOPS * BT * S * I,
                   kv_bytes=batch * (S + new) * J * idx_size)  # read S keys, write `new`
        )
        # top-k and gathers count 0 FLOPs (as in XLA's cost analysis): selection moves the
        # [B, T, S] index scores and the selected K/V, and multiplies nothing.
        out["topk_select"] = Cost(kv_bytes=gathered, act_bytes=BT * S * dt.act_size)
        return out
