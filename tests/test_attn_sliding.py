"""Sliding-window attention: a numpy window-mask oracle, wrap-around of the ring cache, equality
with GQA when the window covers the sequence, O(W) cache shapes, pinned shapes and costs.

The golden test (3W + 2 tokens, chunks shorter and longer than W, then decode) is in
test_golden.py, which runs every registered kind; here are the sliding-specific cases,
gpt-oss's alternating sliding / full layers among them.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import assert_close, incremental_logits, tiny, tokens
from flax import nnx

import refmodel
from refmodel.attention import get
from refmodel.attention.sliding import RING_OP, RingCache, SlidingWindowAttention
from refmodel.counting import Dtypes

W = 8


def np_attention(q, k, v, allowed, scale, sinks=None):
    """Explicit-mask softmax attention in float64: q [B,T,K,G,H], k/v [B,K,S,H], allowed
    [B,T,S]; sinks [K,G] add exp(sink) to the denominator."""
    q, k, v = (np.asarray(a, np.float64) for a in (q, k, v))
    s = np.einsum("btkgh,bksh->btkgs", q, k) * scale
    s = np.where(allowed[:, :, None, None, :], s, -np.inf)
    m = s.max(-1, keepdims=True)
    if sinks is not None:
        m = np.maximum(m, np.asarray(sinks, np.float64)[None, None, :, :, None])
    p = np.exp(s - m)
    den = p.sum(-1, keepdims=True)
    if sinks is not None:
        den = den + np.exp(np.asarray(sinks, np.float64)[None, None, :, :, None] - m)
    return np.einsum("btkgs,bksh->btkgh", p / den, v)


def window_oracle(layer, x, window):
    """The layer's projections, then explicit window-mask attention, then its output."""
    B, T, _ = x.shape
    q, k, v = layer.project(x, jnp.arange(T, dtype=jnp.int32))
    t, s = np.arange(T)[:, None], np.arange(T)[None, :]
    allowed = np.broadcast_to((s <= t) & (t - s < window), (B, T, T))
    sinks = np.asarray(layer.sinks[...]).reshape(layer.K, -1) if layer.cfg.attn_sinks else None
    o = np_attention(q, k, v, allowed, layer.cfg.softmax_scale, sinks)
    return layer.output(x, jnp.asarray(o, jnp.float32))


_JITTED = {}


def jitted(layer):
    """The layer's call, jitted (one compile per chunk length instead of eager op dispatch)."""
    if _JITTED.get(id(layer), (None,))[0] is not layer:  # holds the layer: ids stay unique
        graphdef, state = nnx.split(layer)
        fn = jax.jit(lambda state, x, start, cache: nnx.merge(graphdef, state)(x, start, cache))
        _JITTED[id(layer)] = (layer, lambda x, t, cache: fn(state, x, jnp.int32(t), cache))
    return _JITTED[id(layer)][1]


def run_cached(layer, x, chunks, max_len):
    """Feed x [B, T, D] through the layer's cache in the given chunk lengths, then decode
    the rest one token at a time; returns (y [B, T, D], cache after the chunks, final cache)."""
    B, T, _ = x.shape
    call = jitted(layer)
    cache = type(layer).init_cache(layer.cfg, layer.kind, B, max_len)
    out, t = [], 0
    for n in list(chunks) + [1] * (T - sum(chunks)):
        y, cache = call(x[:, t:t + n], t, cache)
        out.append(y)
        t += n
        if t == sum(chunks):
            prefilled = cache
    return jnp.concatenate(out, axis=1), prefilled, cache


def make_layer(cls, cfg, kind, seed=0):
    layer = cls(cfg, kind=kind, rngs=nnx.Rngs(seed))
    layer.kind = kind
    if cfg.attn_sinks:  # zero at init; make them matter
        layer.sinks[...] = jax.random.normal(jax.random.key(seed + 7), layer.sinks.shape)
    return layer


def test_matches_window_oracle_past_wrap_around():
    """3W tokens: the no-cache forward, chunks of 3 (< W) and 11 (> W) then decode, and a
    one-shot prefill of 14 then decode, all equal the explicit window-mask oracle (gpt-oss
    sink logits included); chunked and one-shot prefill leave the same ring."""
    cfg = tiny(attention="sliding", window=W, attn_sinks=True)
    layer = make_layer(SlidingWindowAttention, cfg, "sliding")
    T = 3 * W
    x = jax.random.normal(jax.random.key(0), (2, T, cfg.d_model))
    want = window_oracle(layer, x, W)
    assert_close(jitted(layer)(x, 0, None)[0], want)
    got, chunked, cache = run_cached(layer, x, [3, 11], max_len=4)
    assert_close(got, want)
    got, one_shot, _ = run_cached(layer, x, [14], max_len=4)
    assert_close(got, want)
    for a, b in zip(jax.tree.leaves(chunked), jax.tree.leaves(one_shot), strict=True):
        assert_close(a, b)
    # every row's ring holds the last W positions, each in slot position mod W
    for pos in np.asarray(cache.pos):  # [B, W]
        np.testing.assert_array_equal(pos % W, np.arange(W))
        np.testing.assert_array_equal(np.sort(pos), np.arange(T - W, T))


def test_window_covering_the_sequence_equals_gqa():
    cfg = tiny(attention="sliding", window=16)
    gqa = make_layer(get("gqa"), cfg, "gqa", seed=3)
    sliding = make_layer(SlidingWindowAttention, cfg, "sliding", seed=4)
    nnx.update(sliding, nnx.state(gqa))
    x = jax.random.normal(jax.random.key(1), (2, 16, cfg.d_model))
    np.testing.assert_array_equal(jitted(sliding)(x, 0, None)[0], jitted(gqa)(x, 0, None)[0])
    assert_close(run_cached(sliding, x, [5], max_len=16)[0],
                 run_cached(gqa, x, [5], max_len=16)[0])


def test_pure_sliding_cache_has_no_max_len():
    """max_len is ignored: a model of only sliding layers gets a cache with no max_len
    (test_golden.py runs one through 3W + 2 tokens in a cache made for 4: chunks shorter and
    longer than W, then decode past wrap-around, against the forward pass)."""
    cfg = tiny(attention="sliding", window=W)
    assert refmodel.init_cache(cfg, 2, max_len=4).max_len is None


def test_gpt_oss_like_golden():
    """Alternating sliding / full layers with sinks and biases (gpt-oss): forward == prefill
    + decode past the window's wrap-around (MoE is covered by test_golden.py)."""
    cfg = tiny(layer_pattern=("sliding", "gqa"), window=W, attn_sinks=True, attn_bias=True)
    model = refmodel.init(cfg, seed=2)
    for block in model.blocks:  # sinks and biases start at zero; make them matter
        for name in ("sinks", "bq", "bk", "bv", "bo"):
            p = getattr(block.attn, name)
            p[...] = 0.5 * jax.random.normal(jax.random.key(len(name)), p.shape)
    toks = tokens(cfg, 2, 3 * W + 2, seed=5)
    assert_close(incremental_logits(model, toks, [W + 3]), refmodel.forward(model, toks))


def test_cache_shape_does_not_grow_with_max_len():
    cfg = tiny(attention="sliding", window=W)
    small = jax.eval_shape(lambda: refmodel.init_cache(cfg, 2, 16))
    large = jax.eval_shape(lambda: refmodel.init_cache(cfg, 2, 4096))
    shapes = lambda c: [(a.shape, a.dtype) for a in jax.tree.leaves(c.layers)]  # noqa: E731
    assert shapes(small) == shapes(large)
    K, H = cfg.n_kv_heads, cfg.resolved_head_dim
    ring = small.layers[0]
    assert isinstance(ring, RingCache)
    assert (ring.k.shape, ring.v.shape, ring.pos.shape) == ((2, K, W, H),) * 2 + ((2, W),)
    assert ring.pos.dtype == jnp.int32


@pytest.mark.parametrize("T", [1, 5, 2 * W + 3])
def test_shape_comments(T):
    cfg = tiny(attention="sliding", window=W)
    B, D, K, G, H = 2, cfg.d_model, cfg.n_kv_heads, cfg.groups, cfg.resolved_head_dim
    layer = make_layer(SlidingWindowAttention, cfg, "sliding")
    cache = SlidingWindowAttention.init_cache(cfg, "sliding", B, 64)
    x = jax.ShapeDtypeStruct((B, T, D), jnp.float32)
    q, k, v = jax.eval_shape(lambda x: layer.project(x, jnp.arange(T)), x)
    assert (q.shape, k.shape, v.shape) == ((B, T, K, G, H), (B, K, T, H), (B, K, T, H))
    y, new = jax.eval_shape(lambda x, c: layer(x, jnp.int32(3), c), x, cache)
    assert y.shape == (B, T, D)
    assert jax.tree.map(lambda a: a.shape, new) == jax.tree.map(lambda a: a.shape, cache)


@pytest.mark.parametrize("changes", [{}, {"attn_bias": True, "attn_sinks": True,
                                          "qk_norm": True, "attn_out_gate": True}])
def test_param_counts_match_the_layer(changes):
    cfg = tiny(attention="sliding", **changes)
    layer = make_layer(SlidingWindowAttention, cfg, "sliding")
    n = sum(a.size for a in jax.tree.leaves(nnx.state(layer, nnx.Param)))
    assert sum(SlidingWindowAttention.param_counts(cfg, "sliding").values()) == n


def test_decode_cost_stops_growing_at_the_window():
    """An engine reads min(S + 1, W) keys per sequence at decode; this ring scores all W slots,
    the masked rest counted apart under RING_OP, so the two sum to the executed W."""
    cfg = tiny(attention="sliding", window=W)
    dt, B, K, H = Dtypes(kv="bfloat16"), 4, cfg.n_kv_heads, cfg.resolved_head_dim
    cls, gqa = SlidingWindowAttention, get("gqa")
    per_key = 2 * B * K * H * dt.kv_size  # K and V of one key per sequence

    def decode_kv(c, context, ops=None):
        out = c.costs(cfg, "sliding", B, 1, context, dt)
        return sum(op.kv_bytes for name, op in out.items() if ops is None or name in ops)

    engine_ops = ("attn_scores", "attn_values")
    for context in (0, 1, W - 2, W - 1, W, 10 * W, 1000 * W):
        read = min(context + 1, W)
        assert decode_kv(cls, context, engine_ops) == read * per_key
        assert decode_kv(cls, context, (RING_OP,)) == (W - read) * per_key
        assert decode_kv(cls, context) == W * per_key + per_key  # the ring + the write
        assert cls.cache_bytes(cfg, "sliding", B, context, dt) == min(context, W) * per_key
        # below the window the engine reads exactly what full attention reads
        if context < W:
            assert decode_kv(cls, context, engine_ops) == decode_kv(gqa, context, engine_ops)
    assert decode_kv(gqa, 1000 * W) > 500 * decode_kv(cls, 1000 * W)  # GQA keeps growing
    # prefill of T > W into an empty cache: an engine scores the T x T (masked) pairs, the
    # ring the W old slots too; either writes only the last W keys
    pre = cls.costs(cfg, "sliding", B, 3 * W, 0, dt)
    score = 2 * B * 3 * W * cfg.n_heads * H  # FLOPs per key
    assert pre["attn_scores"].flops == score * 3 * W
    assert pre["attn_scores"].flops + pre[RING_OP].flops > score * 4 * W  # + softmax, values
    assert pre[RING_OP].kv_bytes == W * per_key
    assert pre["kv_write"].kv_bytes == W * per_key
    # a chunk after the window has filled: its first query sees the W - 1 keys before it
    chunk = cls.costs(cfg, "sliding", B, 2, 5 * W, dt)
    assert chunk["attn_scores"].kv_bytes == (W - 1 + 2) * per_key / 2
    assert chunk[RING_OP].kv_bytes == 1 * per_key  # its K (scores) and V (values)


def test_compiled_ring_executes_every_slot_below_the_window():
    """XLA's count of the compiled decode step at a context well inside the window matches the
    implementation's count (W slots scored), not the engine's (context + 1 keys): the reason
    refmodel/compiler_check.py and microbench compare against `count="implementation"`."""
    from refmodel import compiler_check, costs

    cfg = dataclasses.replace(compiler_check.variants(("sliding",))["sliding dense"], window=16)
    phases = refmodel.Phases(refmodel.init(cfg, seed=0))
    row = compiler_check.check_one("sliding", cfg, phases, "decode_attention", batch=2, context=2)
    assert abs(row["flops_rel_err"]) <= compiler_check.FLOP_RTOL, compiler_check.format_table([row])
    engine = costs.phase_costs(cfg, "decode_attention", 2, 2, count="engine")["flops"]
    assert abs(row["xla_flops"] - engine) / row["xla_flops"] > 5 * compiler_check.FLOP_RTOL
