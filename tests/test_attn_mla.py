"""Multi-head latent attention (refmodel/attention/mla.py): the naive and absorbed forms, on the
same weights, against a slow numpy oracle, pinned shapes, and the counts (parameters against
DeepSeek-V3's checkpoint shapes, FLOPs against the jaxpr's matmuls).

The golden test (forward == chunked prefill + decode) is in test_golden.py: the naive form, and
the absorbed form with the compressed query (q_lora_rank > 0)."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import assert_close, tiny
from flax import nnx

import refmodel
from refmodel.attention.mla import NORM_FLOPS, ROPE_FLOPS, MLACache
from refmodel.attention.mla import MultiHeadLatentAttention as MLA
from refmodel.counting import Dtypes, total


def _cfg(**changes) -> refmodel.ModelConfig:
    return tiny(attention="mla", **changes)


# DeepSeek-V3 (config.json of deepseek-ai/DeepSeek-V3): only counted, never built for real.
V3 = refmodel.ModelConfig(name="v3", vocab_size=129280, d_model=7168, n_layers=61,
                          n_heads=128, n_kv_heads=128, d_ff=18432, attention="mla",
                          q_lora_rank=1536, kv_lora_rank=512, qk_nope_dim=128, qk_rope_dim=64,
                          v_head_dim=128)


# A slow oracle: MLA without absorption, explicit loops and an explicit causal mask ----------

def _rms(x, w, eps):
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * w


def _rope(x, pos, theta):
    """Rotate-half RoPE of x [..., Q] at integer position pos."""
    half = x.shape[-1] // 2
    angle = pos * theta ** (-np.arange(half) / half)
    x1, x2 = x[..., :half], x[..., half:]
    return np.concatenate([x1 * np.cos(angle) - x2 * np.sin(angle),
                           x2 * np.cos(angle) + x1 * np.sin(angle)], axis=-1)


def _oracle(cfg, w, x):
    """x [B, T, D] -> y [B, T, D], float64, one position and one head at a time."""
    N, P, Q, R = cfg.n_heads, cfg.qk_nope_dim, cfg.qk_rope_dim, cfg.kv_lora_rank
    Bx, Tx, _ = x.shape
    y = np.zeros_like(x)
    for b in range(Bx):
        keys, values = [], []
        for t in range(Tx):
            if cfg.q_lora_rank:
                cq = _rms(x[b, t] @ w["wq_a"], w["q_norm"], cfg.norm_eps)
                q = np.einsum("c,cnh->nh", cq, w["wq_b"])
            else:
                q = np.einsum("d,dnh->nh", x[b, t], w["wq"])
            kv = x[b, t] @ w["wkv_a"]
            c = _rms(kv[:R], w["kv_norm"], cfg.norm_eps)
            k_rope = _rope(kv[R:], t, cfg.rope_theta)
            kv_up = np.einsum("r,rnh->nh", c, w["wkv_b"])  # [N, P + U]
            keys.append(np.concatenate([kv_up[:, :P], np.tile(k_rope, (N, 1))], axis=-1))
            values.append(kv_up[:, P:])
            q = np.concatenate([q[:, :P], _rope(q[:, P:], t, cfg.rope_theta)], axis=-1)
            for n in range(N):
                scores = np.full(Tx, -np.inf)
                for s in range(t + 1):  # causal: key s is visible to query t iff s <= t
                    scores[s] = q[n] @ keys[s][n] / math.sqrt(P + Q)
                p = np.exp(scores - scores.max())
                p /= p.sum()
                o = sum(p[s] * values[s][n] for s in range(t + 1))
                y[b, t] += o @ w["wo"][n]
    return y


@pytest.mark.parametrize("q_lora", [0, 16])
def test_layer_against_numpy_oracle(q_lora):
    """Both forms, built from the same seed (so mla_absorb must not change the weights), equal
    the oracle computed from the naive layer's weights: the no-cache forward, and prefill into
    a cache with unwritten slots then a second chunk from the cache."""
    cfg = _cfg(q_lora_rank=q_lora)
    x = np.asarray(jax.random.normal(jax.random.key(2), (2, 6, cfg.d_model)), np.float64)
    layer = MLA(cfg, kind="mla", rngs=nnx.Rngs(3))
    w = {path[0]: np.asarray(v[...], np.float64)
         for path, v in nnx.to_flat_state(nnx.state(layer, nnx.Param))}
    want = _oracle(cfg, w, x)
    x32 = jnp.asarray(x, jnp.float32)
    for absorb in (False, True):  # the same weights run both ways
        graphdef, state = nnx.split(MLA(cfg.replace(mla_absorb=absorb), kind="mla",
                                        rngs=nnx.Rngs(3)))
        call = jax.jit(lambda state, x, start, cache, g=graphdef: nnx.merge(g, state)(
            x, start, cache))
        if not absorb:  # no cache: causal within x (the naive form)
            assert_close(call(state, x32, 0, None)[0], want, tol=1e-4)
        cache = MLA.init_cache(cfg, "mla", 2, 9)  # more slots than tokens: empty ones masked
        y1, cache = call(state, x32[:, :4], 0, cache)
        y2, cache = call(state, x32[:, 4:], 4, cache)
        assert_close(jnp.concatenate([y1, y2], 1), want, tol=1e-4)


# Shapes: the comments in mla.py, pinned ------------------------------------------------------

@pytest.mark.parametrize("Ts", [2, 1])  # 1: the naive form's decode layout (`naive_one`)
def test_shapes_under_eval_shape(Ts):
    cfg = _cfg(q_lora_rank=16)  # D 64, N 4, C 16, R 32, P 16, Q 8, U 16
    Bs, S = 3, 7
    D, N, R, P, Q, U = 64, 4, 32, 16, 8, 16
    layer = nnx.eval_shape(lambda: MLA(cfg, kind="mla", rngs=nnx.Rngs(0)))
    graphdef, state = nnx.split(layer)
    assert state["wq_a"].shape == (D, 16) and state["wq_b"].shape == (16, N, P + Q)
    assert state["wkv_a"].shape == (D, R + Q) and state["wkv_b"].shape == (R, N, P + U)
    assert state["wo"].shape == (N, U, D)
    empty = jax.eval_shape(lambda: MLA.init_cache(cfg, "mla", Bs, S))
    x = jax.ShapeDtypeStruct((Bs, Ts, D), jnp.float32)
    start = jax.ShapeDtypeStruct((), jnp.int32)

    def call(state, x, start, cache):
        return nnx.merge(graphdef, state)(x, start, cache)

    def parts(state, x, start, cache):
        m = nnx.merge(graphdef, state)
        q_nope, q_rope, latent, k_rope = m.project(x, jnp.arange(Ts))
        mask = jnp.ones((Ts, S), bool)
        return (q_nope, q_rope, latent, k_rope,
                m.naive(q_nope, q_rope, cache.latent, cache.k_rope, mask),
                m.absorbed(q_nope, q_rope, cache.latent, cache.k_rope, mask))

    y, cache = jax.eval_shape(call, state, x, start, empty)
    assert isinstance(cache, MLACache)
    for c in (empty, cache):
        assert c.latent.shape == (Bs, S, R)  # [B, S, R]: nothing per head
        assert c.k_rope.shape == (Bs, S, Q)  # [B, S, Q]
    assert y.shape == (Bs, Ts, D)
    shapes = [a.shape for a in jax.eval_shape(parts, state, x, start, empty)]
    assert shapes == [(Bs, Ts, N, P), (Bs, Ts, N, Q), (Bs, Ts, R), (Bs, Ts, Q),
                      (Bs, Ts, N, U), (Bs, Ts, N, U)]


# Counts --------------------------------------------------------------------------------------

def _n_params(cfg) -> int:
    layer = nnx.eval_shape(lambda: MLA(cfg, kind="mla", rngs=nnx.Rngs(0)))
    return sum(math.prod(a.shape) for a in jax.tree.leaves(nnx.state(layer, nnx.Param)))


@pytest.mark.parametrize("q_lora", [0, 16])
def test_param_counts_equal_the_layer_state(q_lora):
    cfg = _cfg(q_lora_rank=q_lora)
    counts = MLA.param_counts(cfg, "mla")
    assert sum(counts.values()) == _n_params(cfg)
    assert ("wq_a" in counts) == (q_lora > 0) and ("wq" in counts) == (q_lora == 0)


def test_deepseek_v3_attention_params_match_the_checkpoint():
    # Shapes of one layer's self_attn in the DeepSeek-V3 checkpoint (out x in):
    # q_a_proj 1536x7168, q_a_layernorm 1536, q_b_proj (128*192)x1536,
    # kv_a_proj_with_mqa (512+64)x7168, kv_a_layernorm 512, kv_b_proj (128*256)x512,
    # o_proj 7168x(128*128).
    published = (1536 * 7168 + 1536 + 128 * 192 * 1536 + 576 * 7168 + 512 + 128 * 256 * 512
                 + 7168 * 128 * 128)
    assert published == 187_107_328
    assert sum(MLA.param_counts(V3, "mla").values()) == published == _n_params(V3)


def test_deepseek_v3_cache_is_70272_bytes_per_token():
    per_token = V3.n_layers * MLA.cache_bytes(V3, "mla", 1, 1, Dtypes(kv="bfloat16"))
    assert per_token == 61 * (512 + 64) * 2 == 70_272


def test_absorbed_decode_does_less_work_on_the_same_cache_bytes():
    dt = Dtypes(weight="bfloat16", kv="bfloat16", act="bfloat16")
    naive = MLA.costs(V3, "mla", 8, 1, 4095, dt)
    absorbed = MLA.costs(V3.replace(mla_absorb=True), "mla", 8, 1, 4095, dt)
    assert total(absorbed).flops < total(naive).flops / 50
    assert total(absorbed).kv_bytes == total(naive).kv_bytes
    assert total(naive).kv_bytes == pytest.approx(
        MLA.cache_bytes(V3, "mla", 8, 4096, dt) + 8 * 576 * 2)  # read all, write one


def test_absorbed_decode_intensity_grows_with_heads():
    """Scores + softmax + values of one absorbed decode step: ~2 N (2R + Q) / ((R + Q) c)."""
    dt, R, Q = Dtypes(kv="bfloat16"), 512, 64

    def core(n_heads):
        cfg = V3.replace(n_heads=n_heads, n_kv_heads=n_heads, mla_absorb=True)
        ops = MLA.costs(cfg, "mla", 4, 1, 8191, dt)
        return total({k: ops[k] for k in ("attn_scores", "attn_softmax", "attn_values")})

    for n in (16, 128):
        assert core(n).intensity == pytest.approx(2 * n * (2 * R + Q) / ((R + Q) * 2), rel=1e-2)
    assert core(128).intensity == pytest.approx(8 * core(16).intensity)


# FLOPs against the jaxpr -------------------------------------------------------------------

def _dot_flops(eqn) -> int:
    lhs, rhs = (v.aval.shape for v in eqn.invars)
    (lc, _), (lb, _) = eqn.params["dimension_numbers"]
    contract, batch = math.prod(lhs[i] for i in lc), math.prod(lhs[i] for i in lb)
    return 2 * math.prod(lhs) * math.prod(rhs) // (contract * batch)  # 2 b m n k


def _flops_by_scope(jaxpr, prefix="", out=None) -> dict[str, int]:
    """Matmul FLOPs of a jaxpr (nested jaxprs included) keyed by its outermost scope: every
    dot_general, and every multiply-then-sum contraction (the decode form of attention in
    refmodel.attention.common.attend: one multiply and one add per product)."""
    out = {} if out is None else out
    products = {eqn.outvars[0] for eqn in jaxpr.eqns if eqn.primitive.name == "mul"}
    for eqn in jaxpr.eqns:
        scope = prefix or str(eqn.source_info.name_stack).split("/")[0]
        if eqn.primitive.name == "dot_general":
            out[scope] = out.get(scope, 0) + _dot_flops(eqn)
        if eqn.primitive.name == "reduce_sum" and eqn.invars[0] in products:
            out[scope] = out.get(scope, 0) + 2 * math.prod(eqn.invars[0].aval.shape)
        for p in eqn.params.values():
            inner = getattr(p, "jaxpr", p)
            if hasattr(inner, "eqns"):
                _flops_by_scope(inner, scope, out)
    return out


@pytest.mark.parametrize("absorb", [False, True])
@pytest.mark.parametrize("q_lora,new,context", [(0, 1, 8), (16, 1, 8), (16, 5, 0)])
def test_costs_match_the_jaxpr_matmuls(absorb, q_lora, new, context):
    cfg = _cfg(q_lora_rank=q_lora, mla_absorb=absorb)
    Bs, M, keys = 2, 2 * new, context + new
    graphdef, state = nnx.split(MLA(cfg, kind="mla", rngs=nnx.Rngs(0)))

    def step(state, x, start, cache):
        return nnx.merge(graphdef, state)(x, start, cache)

    x = jnp.zeros((Bs, new, cfg.d_model))
    cache = MLA.init_cache(cfg, "mla", Bs, keys)  # max_len = keys: the code attends to all
    jaxpr = jax.make_jaxpr(step)(state, x, jnp.int32(context), cache).jaxpr
    counted = _flops_by_scope(jaxpr)
    ops = MLA.costs(cfg, "mla", Bs, new, context, Dtypes())
    N = cfg.n_heads
    # Elementwise FLOPs the cost model adds to matmul ops: the RMSNorms inside qkv_proj and,
    # absorbed, the sum of the latent and rope scores.
    # The rope op's product is its table's (`rope_table`, a product with the identity).
    elementwise = {"qkv_proj": NORM_FLOPS * M * (q_lora + cfg.kv_lora_rank),
                   "attn_scores": M * N * keys if absorb else 0,
                   "rope": ROPE_FLOPS * M * (N + 1) * cfg.qk_rope_dim}
    matmul_ops = ("qkv_proj", "rope", "kv_expand", "absorb", "attn_scores", "attn_values",
                  "out_proj")
    assert set(counted) <= set(matmul_ops), counted
    for op in matmul_ops:
        want = ops[op].flops - elementwise.get(op, 0)
        assert counted.get(op, 0) == pytest.approx(want, rel=1e-2), op
    assert (counted.get("kv_expand", 0) > 0) != absorb and (counted.get("absorb", 0) > 0) == absorb
