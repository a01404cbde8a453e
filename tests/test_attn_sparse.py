"""Sparse (top-k, DeepSeek-Sparse-Attention-style) attention: a numpy oracle that ranks keys by
the indexer score and runs explicit softmax, the exact selection rule, equality with dense GQA
when k covers every key, pinned shapes, parameter counts and costs.

The golden test (forward == chunked prefill + decode) is in test_golden.py, which runs every
registered kind.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from conftest import assert_close, tiny
from flax import nnx
from test_attn_sliding import jitted, make_layer, np_attention, run_cached

from refmodel.attention import get
from refmodel.attention.common import causal_mask
from refmodel.attention.sparse import SparseAttention, SparseCache
from refmodel.counting import Dtypes


def np_index_scores(layer, x):
    """I(t, s) = sum_i w[t, i] relu(q_idx[t, i] . k_idx[s]) in float64 -> [B, T, S]."""
    x = np.asarray(x, np.float64)
    wq, wk, w = (np.asarray(p[...], np.float64) for p in (layer.wq_idx, layer.wk_idx,
                                                            layer.w_idx))
    dots = np.einsum("btij,bsj->btis", np.einsum("btd,dij->btij", x, wq), x @ wk)
    return np.einsum("bti,btis->bts", x @ w, np.maximum(dots, 0.0))


def np_topk_allowed(scores, top_k):
    """[B, T, S] True for the top_k causally visible keys of each query; ties -> earlier."""
    B, T, _ = scores.shape
    allowed = np.zeros(scores.shape, bool)
    for b in range(B):
        for t in range(T):
            order = np.argsort(-scores[b, t, :t + 1], kind="stable")  # visible: s <= t
            allowed[b, t, order[:top_k]] = True
    return allowed


def sparse_oracle(layer, x):
    B, T, _ = x.shape
    q, k, v = layer.project(x, jnp.arange(T, dtype=jnp.int32))
    allowed = np_topk_allowed(np_index_scores(layer, x), layer.cfg.sparse_top_k)
    sinks = np.asarray(layer.sinks[...]).reshape(layer.K, -1) if layer.cfg.attn_sinks else None
    o = np_attention(q, k, v, allowed, layer.cfg.softmax_scale, sinks)
    return layer.output(x, jnp.asarray(o, jnp.float32)), allowed


def test_small_k_matches_topk_oracle():
    """k = 3 of up to 12 keys: the forward and prefill (5, into a cache of 16 with unwritten
    slots) + decode equal explicit softmax over the oracle's top-3 by indexer score."""
    cfg = tiny(attention="sparse", sparse_top_k=3, attn_sinks=True)
    layer = make_layer(SparseAttention, cfg, "sparse")
    x = jax.random.normal(jax.random.key(0), (2, 12, cfg.d_model))
    assert_close(layer.index_scores(x, layer.index_keys(x)), np_index_scores(layer, x))
    want, allowed = sparse_oracle(layer, x)
    assert allowed.sum(-1).max() == 3  # the selection really drops keys
    assert_close(jitted(layer)(x, 0, None)[0], want)
    assert_close(run_cached(layer, x, [5], max_len=16)[0], want)


def test_selection_rule():
    """Highest visible scores; ties to the earlier position; invisible keys never valid,
    however high their score; fewer visible keys than k leaves the extra picks invalid."""
    layer = make_layer(SparseAttention, tiny(attention="sparse", sparse_top_k=3), "sparse")
    scores = jnp.array([[[0.0, 5.0, 5.0, 1.0, 9.0, 9.0],  # query 0: sees 4 keys
                         [2.0, 2.0, 2.0, 2.0, 9.0, 9.0],  # query 1: a four-way tie
                         [7.0, 3.0, 9.0, 9.0, 9.0, 9.0]]])  # query 2: sees 2 keys
    mask = jnp.array([[1, 1, 1, 1, 0, 0], [1, 1, 1, 1, 0, 0], [1, 1, 0, 0, 0, 0]], bool)
    idx, valid = layer.select(scores, mask)
    np.testing.assert_array_equal(idx[0, :2], [[1, 2, 3], [0, 1, 2]])
    np.testing.assert_array_equal(valid[0, :2], True)
    chosen = set(np.asarray(idx[0, 2])[np.asarray(valid[0, 2])])
    assert chosen == {0, 1} and int(valid[0, 2].sum()) == 2


def test_k_covering_every_key_equals_gqa():
    """k >= S: the selection is exactly the causal mask, and the output is GQA's up to float32
    rounding (not bit for bit: each query is its own batch row of the gathered keys, so XLA
    runs the same dot products with other matmul shapes; the differences are ~5e-7, where a
    single dropped key would change outputs by ~1e-1)."""
    cfg = tiny(attention="sparse", sparse_top_k=16, attn_sinks=True)
    gqa = make_layer(get("gqa"), cfg, "gqa", seed=3)
    sparse = make_layer(SparseAttention, cfg, "sparse", seed=4)
    nnx.update(sparse, nnx.state(gqa))  # the indexer weights stay sparse's own
    x = jax.random.normal(jax.random.key(1), (2, 16, cfg.d_model))
    mask = causal_mask(jnp.arange(16), jnp.arange(16))
    idx, valid = sparse.select(sparse.index_scores(x, sparse.index_keys(x)), mask)
    np.testing.assert_array_equal(idx, np.broadcast_to(np.arange(16), (2, 16, 16)))
    np.testing.assert_array_equal(valid, np.broadcast_to(mask, (2, 16, 16)))
    assert_close(jitted(sparse)(x, 0, None)[0], jitted(gqa)(x, 0, None)[0], tol=1e-6)
    assert_close(run_cached(sparse, x, [5], max_len=16)[0],
                 run_cached(gqa, x, [5], max_len=16)[0], tol=1e-6)


def test_shape_comments():
    cfg = tiny(attention="sparse", sparse_top_k=4)
    B, T, S, D, K, G, H = 2, 5, 32, cfg.d_model, cfg.n_kv_heads, cfg.groups, cfg.resolved_head_dim
    J, n = cfg.indexer_dim, cfg.sparse_top_k
    layer = make_layer(SparseAttention, cfg, "sparse")
    x = jax.ShapeDtypeStruct((B, T, D), jnp.float32)
    cache = jax.eval_shape(lambda: SparseAttention.init_cache(cfg, "sparse", B, S))
    assert isinstance(cache, SparseCache)
    assert (cache.k.shape, cache.v.shape, cache.k_idx.shape) == ((B, K, S, H),) * 2 + ((B, S, J),)
    assert jax.eval_shape(layer.index_keys, x).shape == (B, T, J)
    scores = jax.eval_shape(layer.index_scores, x, cache.k_idx)
    assert scores.shape == (B, T, S)
    idx, valid = jax.eval_shape(layer.select, scores, jax.ShapeDtypeStruct((T, S), bool))
    assert idx.shape == valid.shape == (B, T, n)
    q = jax.ShapeDtypeStruct((B, T, K, G, H), jnp.float32)
    o = jax.eval_shape(layer.sparse_core, q, cache.k, cache.v, idx, valid)
    assert o.shape == (B, T, K, G, H)
    y, new = jax.eval_shape(lambda x, c: layer(x, jnp.int32(3), c), x, cache)
    assert y.shape == (B, T, D)
    assert jax.tree.map(lambda a: a.shape, new) == jax.tree.map(lambda a: a.shape, cache)


def test_param_counts_match_the_layer():
    for changes in ({}, {"attn_bias": True, "attn_sinks": True, "qk_norm": True,
                         "attn_out_gate": True, "indexer_heads": 3, "indexer_dim": 8}):
        cfg = tiny(attention="sparse", **changes)
        layer = make_layer(SparseAttention, cfg, "sparse")
        n = sum(a.size for a in jax.tree.leaves(nnx.state(layer, nnx.Param)))
        counts = SparseAttention.param_counts(cfg, "sparse")
        assert sum(counts.values()) == n
        assert counts["wq_idx"] == layer.wq_idx.size and counts["w_idx"] == layer.w_idx.size


def test_decode_reads_k_kv_entries_but_all_indexer_keys():
    cfg = tiny(attention="sparse", sparse_top_k=64, indexer_dim=16)
    dt, B, J = Dtypes(kv="bfloat16"), 4, cfg.indexer_dim
    K, H = cfg.n_kv_heads, cfg.resolved_head_dim
    k = cfg.sparse_top_k

    def decode(S):  # S = keys after the step
        return SparseAttention.costs(cfg, "sparse", B, 1, S - 1, dt)

    for S in (16, 64, 4096, 65536):
        ops = decode(S)
        assert ops["topk_select"].kv_bytes == 2 * B * min(k, S) * K * H * dt.kv_size
        assert ops["attn_scores"].kv_bytes == ops["attn_values"].kv_bytes == 0
        assert ops["attn_scores"].flops == 2 * B * cfg.n_heads * min(k, S) * H
        assert ops["indexer"].kv_bytes == B * (S + 1) * J * dt.kv_size  # read S keys, write one
    assert decode(65536)["topk_select"].kv_bytes == decode(4096)["topk_select"].kv_bytes
    gqa = sum(o.kv_bytes for o in get("gqa").costs(cfg, "gqa", B, 1, 65535, dt).values())
    sparse = sum(o.kv_bytes for o in decode(65536).values())
    # still O(S) through the indexer: 2KH / J = 4x fewer bytes per token, not 1000x
    assert 3 < gqa / sparse < 4
    assert SparseAttention.cache_bytes(cfg, "sparse", B, 100, dt) == \
        get("gqa").cache_bytes(cfg, "gqa", B, 100, dt) + B * 100 * J * dt.kv_size
