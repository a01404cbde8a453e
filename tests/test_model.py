"""The reference model against slow oracles and its own invariants."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import assert_close, tiny, tokens
from flax import nnx

import refmodel
from refmodel.moe import MoE


def copy_weights(src, dst):
    nnx.update(dst, nnx.state(src))


def test_mha_equals_gqa_with_k_equal_n():
    cfg = tiny()
    mha = refmodel.init(cfg.replace(attention="mha"), seed=0)
    gqa = refmodel.init(cfg.replace(attention="gqa", n_kv_heads=cfg.n_heads), seed=1)
    copy_weights(mha, gqa)
    toks = tokens(cfg, 2, 10)
    assert_close(refmodel.forward(gqa, toks), refmodel.forward(mha, toks), 1e-6)


def test_gqa_with_one_kv_head_equals_mqa():
    cfg = tiny()
    mqa = refmodel.init(cfg.replace(attention="mqa"), seed=0)
    gqa = refmodel.init(cfg.replace(attention="gqa", n_kv_heads=1), seed=1)
    copy_weights(mqa, gqa)
    toks = tokens(cfg, 2, 10)
    assert_close(refmodel.forward(gqa, toks), refmodel.forward(mqa, toks), 1e-6)


def test_kv_heads_per_kind():
    cfg = tiny()  # N = 4, n_kv_heads = 2
    for kind, K in [("mha", 4), ("gqa", 2), ("mqa", 1)]:
        cache = jax.eval_shape(lambda k=kind: refmodel.init_cache(cfg.replace(attention=k), 3, 7))
        assert cache.layers[0].k.shape == (3, K, 7, cfg.resolved_head_dim)  # [B, K, S, H]


def moe_oracle(moe: MoE, x: np.ndarray) -> np.ndarray:
    """Every expert on every token, masked by the router's normalised top-k weights."""
    cfg = moe.cfg
    logits = x @ np.asarray(moe.w_router[...])
    if cfg.router_score == "softmax":
        e = np.exp(logits - logits.max(-1, keepdims=True))
        scores = e / e.sum(-1, keepdims=True)
    else:
        scores = 1 / (1 + np.exp(-logits))
    top = np.argsort(-scores, axis=-1)[:, : cfg.top_k]
    weights = np.zeros_like(scores)
    np.put_along_axis(weights, top, np.take_along_axis(scores, top, -1), -1)
    if cfg.norm_topk:
        weights /= weights.sum(-1, keepdims=True)
    y = np.zeros_like(x)
    for e in range(cfg.n_experts):
        gate = x @ np.asarray(moe.w_gate[...][e])
        h = gate / (1 + np.exp(-gate)) * (x @ np.asarray(moe.w_up[...][e]))
        y += weights[:, e : e + 1] * (h @ np.asarray(moe.w_down[...][e]))
    if moe.shared is not None:
        g = x @ np.asarray(moe.shared.w_gate[...])
        y += (g / (1 + np.exp(-g)) * (x @ np.asarray(moe.shared.w_up[...]))) @ np.asarray(
            moe.shared.w_down[...])
    return y


@pytest.mark.parametrize("score,shared", [("softmax", 0), ("sigmoid", 2)])
def test_moe_matches_every_expert_oracle(score, shared, rng):
    cfg = tiny(ffn="moe", router_score=score, n_shared_experts=shared)
    moe = MoE(cfg, rngs=nnx.Rngs(0))
    x = rng.standard_normal((37, cfg.d_model)).astype(np.float32)
    assert_close(moe(jnp.asarray(x)), moe_oracle(moe, x), 1e-5)
    moe.dense_dispatch = True  # training's path: every expert on every token
    assert_close(moe(jnp.asarray(x)), moe_oracle(moe, x), 1e-5)


def test_router_stats_count_every_routed_token():
    cfg = tiny(ffn="moe")
    model = refmodel.init(cfg)
    stats = refmodel.router_stats(model, tokens(cfg, 2, 9))
    assert sorted(stats) == list(range(cfg.n_layers))
    for counts in stats.values():
        assert counts.shape == (cfg.n_experts,)
        assert int(counts.sum()) == 2 * 9 * cfg.top_k


def test_documented_shapes_under_eval_shape():
    cfg = tiny(ffn="moe")
    model = nnx.eval_shape(lambda: refmodel.init(cfg))
    D, N, K, H, F, E, V = (cfg.d_model, cfg.n_heads, cfg.n_kv_heads, cfg.resolved_head_dim,
                           cfg.expert_width, cfg.n_experts, cfg.vocab_size)
    attn, moe = model.blocks[0].attn, model.blocks[0].ffn
    assert attn.wq.shape == (D, N, H) and attn.wk.shape == attn.wv.shape == (D, K, H)
    assert attn.wo.shape == (N, H, D)
    assert moe.w_up.shape == (E, D, F) and moe.w_down.shape == (E, F, D)
    assert model.lm_head.shape == (D, V)
    B, T, S = 3, 5, 11
    cache = jax.eval_shape(lambda: refmodel.init_cache(cfg, B, S))
    graphdef, state = nnx.split(refmodel.init(cfg))
    toks = jax.ShapeDtypeStruct((B, T), jnp.int32)
    logits, new = jax.eval_shape(
        lambda s, t, c: refmodel.phases.prefill(graphdef, s, t, c), state, toks, cache)
    assert logits.shape == (B, T, V) and logits.dtype == jnp.float32
    assert jax.tree.map(lambda a: a.shape, new) == jax.tree.map(lambda a: a.shape, cache)
    step, _ = jax.eval_shape(lambda s, t, c: refmodel.phases.decode(graphdef, s, t, c), state,
                             jax.ShapeDtypeStruct((B,), jnp.int32), cache)
    assert step.shape == (B, V)
    x = jax.ShapeDtypeStruct((B, D), jnp.float32)
    h, _ = jax.eval_shape(
        lambda s, x, c: refmodel.phases.decode_attention(graphdef, s, x, c), state, x, cache)
    assert h.shape == (B, D)
    assert jax.eval_shape(
        lambda s, x: refmodel.phases.decode_ffn(graphdef, s, x), state, x).shape == (B, D)


def test_greedy_generate_is_argmax_of_forward_step_by_step():
    cfg = tiny()
    model = refmodel.init(cfg, seed=5)
    prompt = tokens(cfg, 2, 4)
    out = refmodel.generate(model, prompt, max_new_tokens=6, temperature=0.0)
    assert out.shape == (2, 10)
    np.testing.assert_array_equal(out[:, :4], prompt)
    # Causal: the logits at position t - 1 of the full sequence see exactly out[:, :t].
    expected = jnp.argmax(refmodel.forward(model, out)[:, 3:-1], axis=-1)
    np.testing.assert_array_equal(out[:, 4:], expected)


def test_sampled_generate_is_reproducible_and_in_vocab():
    cfg = tiny()
    model = refmodel.init(cfg)
    prompt = tokens(cfg, 2, 4)  # the shapes of the greedy test above: its compiles are reused
    a = refmodel.generate(model, prompt, 6, temperature=1.0, seed=3)
    b = refmodel.generate(model, prompt, 6, temperature=1.0, seed=3)
    np.testing.assert_array_equal(a, b)
    assert int(a.min()) >= 0 and int(a.max()) < cfg.vocab_size


def test_sequence_past_max_len_raises():
    cfg = tiny()
    model = refmodel.init(cfg)
    cache = refmodel.init_cache(cfg, 1, 6)
    with pytest.raises(ValueError, match="max_len=6"):
        refmodel.prefill(model, tokens(cfg, 1, 7), cache)
    _, cache = refmodel.prefill(model, tokens(cfg, 1, 6), cache)
    with pytest.raises(ValueError, match="6 \\+ 1 tokens would pass the cache's max_len=6"):
        refmodel.decode_step(model, jnp.zeros((1,), jnp.int32), cache)


def test_phase_halves_compose_to_the_layers_of_a_decode_step():
    """decode_attention then decode_ffn one layer at a time == the blocks of a decode step."""
    cfg = tiny()
    phases = refmodel.Phases(refmodel.init(cfg, seed=2))
    x = phases.hidden(2)
    cache = refmodel.init_cache(cfg, 2, 4)
    h = x
    for i in range(cfg.n_layers):
        h, cache = phases.layer("decode_attention", i)(phases.state, h, cache)
        h = phases.layer("decode_ffn", i)(phases.state, h)
    model = nnx.merge(phases.graphdef, phases.state)
    ref, c2 = x[:, None], refmodel.init_cache(cfg, 2, 4)
    for i, block in enumerate(model.blocks):
        ref, _ = block.mix(ref, c2.pos, c2.layers[i])
        ref = block.feed(ref)
    assert_close(h, ref[:, 0], 1e-6)


@pytest.mark.parametrize("rows", [1, 5, 64])
def test_grouped_experts_equal_ragged_dot(rows, rng):
    """The tiled per-expert loop == jax.lax.ragged_dot, the library's grouped matmul."""
    cfg = tiny(ffn="moe")
    moe = MoE(cfg, rngs=nnx.Rngs(1))
    xs = jnp.asarray(rng.standard_normal((rows, cfg.d_model)), jnp.float32)
    expert = np.sort(rng.integers(0, cfg.n_experts, rows))
    sizes = jnp.asarray(np.bincount(expert, minlength=cfg.n_experts), jnp.int32)
    gate = jax.lax.ragged_dot(xs, moe.w_gate[...], sizes)
    h = jax.nn.silu(gate) * jax.lax.ragged_dot(xs, moe.w_up[...], sizes)
    assert_close(moe.grouped_experts(xs, sizes), jax.lax.ragged_dot(h, moe.w_down[...], sizes))
