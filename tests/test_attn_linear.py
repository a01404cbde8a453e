"""The "linear" mixer (Mamba-2 SSD, Gated DeltaNet): forms, oracle, cache, shapes and counts.

The golden test (forward == chunked prefill + decode) of each rule alone, and of both in hybrids
with full attention (mamba2 in the Nemotron-H-like one), is in test_golden.py."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import assert_close, tiny
from flax import nnx

import refmodel
from refmodel.attention.linear import LinearAttention, LinearCache, sizes
from refmodel.attention.linear_scan import RULES, chunked, recurrent
from refmodel.counting import Dtypes

# Distinct sizes so that a swapped dimension shows: N=6 value heads in K=2 groups of G=3,
# H=5 key dim, P=3 value dim, Q=3 taps, chunk 4.
SMALL = dict(d_model=16, linear_v_heads=6, linear_k_heads=2, linear_key_dim=5,
             linear_value_dim=3, linear_conv=3, linear_chunk=4)


def layer_cfg(rule, **changes):
    return tiny(attention="linear", linear_rule=rule, **{**SMALL, **changes})


def make_layer(cfg, seed=0):
    """A layer whose 1-D parameters (norm, D, dt_bias, conv bias) are random, not 1s and 0s."""
    layer = LinearAttention(cfg, kind="linear", rngs=nnx.Rngs(seed))
    rng = np.random.default_rng(seed)
    for name in ("norm", "D", "dt_bias", "conv_b"):
        if hasattr(layer, name):
            p = getattr(layer, name)
            p[...] = p[...] + jnp.asarray(rng.normal(0, 0.5, p.shape), p.dtype)
    return layer


def random_inputs(rule, B, T, K, G, H, P, seed):
    rng = np.random.default_rng(seed)
    f = lambda *s: jnp.asarray(rng.normal(size=s), jnp.float32)
    q, k, v = f(B, T, K, H), f(B, T, K, H), f(B, T, K, G, P)
    if rule == "gated_delta":
        k = k / jnp.linalg.norm(k, axis=-1, keepdims=True)
    g = jnp.asarray(-rng.uniform(0, 3, (B, T, K, G)), jnp.float32)  # strong decays too
    beta = jnp.asarray(rng.uniform(0, 1, (B, T, K, G)), jnp.float32)
    return f(B, K, G, H, P), q, k, v, g, beta


@pytest.mark.parametrize("rule", RULES)
def test_recurrent_equals_chunked(rule):
    """T < chunk, T a multiple of it, and T not a multiple; from a non-zero state."""
    rec = jax.jit(recurrent, static_argnums=0)
    chunk = jax.jit(chunked, static_argnums=(0, 7))
    for T in (3, 8, 13):
        S0, q, k, v, g, beta = random_inputs(rule, 2, T, 2, 3, 5, 4, seed=T)
        o1, s1 = rec(rule, S0, q, k, v, g, beta)
        o2, s2 = chunk(rule, S0, q, k, v, g, beta, 8)
        assert o1.shape == o2.shape == (2, T, 2, 3, 4)
        assert_close(o2, o1)
        assert_close(s2, s1)


def _silu(x):
    return x / (1 + np.exp(-x))


def _softplus(x):
    return np.log1p(np.exp(x))


def oracle(layer, x):
    """The layer as the formulas say, in float64 numpy, one token and one head at a time."""
    cfg, rule = layer.cfg, layer.cfg.linear_rule
    N, K, H, P, Q, X = sizes(cfg)
    G, eps = N // K, cfg.norm_eps
    W = {name: np.asarray(getattr(layer, name)[...], np.float64)
         for name in LinearAttention.param_counts(cfg, "linear")}
    x = np.asarray(x, np.float64)
    B, T, _ = x.shape
    S, window, ys = np.zeros((B, N, H, P)), np.zeros((B, Q, X)), []
    for t in range(T):
        if rule == "mamba2":  # in_proj = [z, x, B, C, dt]
            proj = x[:, t] @ W["in_proj"]
            z, xc, dt_raw = proj[:, :N * P], proj[:, N * P:N * P + X], proj[:, N * P + X:]
        else:  # per key head: [q, k, v, z] and [b, a] (HF's interleaved layout)
            qkvz = (x[:, t] @ W["in_proj_qkvz"]).reshape(B, K, 2 * H + 2 * G * P)
            qh, kh, vh = qkvz[..., :H], qkvz[..., H:2 * H], qkvz[..., 2 * H:2 * H + G * P]
            z = qkvz[..., 2 * H + G * P:].reshape(B, N * P)
            xc = np.concatenate([qh.reshape(B, -1), kh.reshape(B, -1), vh.reshape(B, -1)], -1)
            ba = (x[:, t] @ W["in_proj_ba"]).reshape(B, K, 2, G)
            b, a = ba[:, :, 0].reshape(B, N), ba[:, :, 1].reshape(B, N)
        window = np.concatenate([window[:, 1:], xc[:, None]], axis=1)  # last Q inputs
        c = _silu((window * W["conv_w"].T[None]).sum(1) + W.get("conv_b", 0.0))  # [B, X]
        y = np.zeros((B, N, P))
        for h in range(N):
            grp = h // G
            if rule == "mamba2":
                xh = c[:, h * P:(h + 1) * P]
                Bg = c[:, N * P + grp * H:N * P + (grp + 1) * H]
                Cg = c[:, N * P + K * H + grp * H:N * P + K * H + (grp + 1) * H]
                dt = _softplus(dt_raw[:, h] + W["dt_bias"][h])  # [B]
                decay = np.exp(-np.exp(W["A_log"][h]) * dt)
                S[:, h] = decay[:, None, None] * S[:, h] + dt[:, None, None] * (
                    Bg[:, :, None] * xh[:, None, :])
                y[:, h] = np.einsum("bn,bnp->bp", Cg, S[:, h]) + W["D"][h] * xh
            else:
                qv = c[:, grp * H:(grp + 1) * H]
                kv = c[:, K * H + grp * H:K * H + (grp + 1) * H]
                vv = c[:, 2 * K * H + h * P:2 * K * H + (h + 1) * P]
                qv = qv / np.sqrt((qv**2).sum(-1, keepdims=True) + 1e-6) * H**-0.5
                kv = kv / np.sqrt((kv**2).sum(-1, keepdims=True) + 1e-6)
                beta = 1 / (1 + np.exp(-b[:, h]))
                gh = -np.exp(W["A_log"][h]) * _softplus(a[:, h] + W["dt_bias"][h])
                S[:, h] = np.exp(gh)[:, None, None] * S[:, h]
                delta = beta[:, None] * (vv - np.einsum("bk,bkv->bv", kv, S[:, h]))
                S[:, h] = S[:, h] + kv[:, :, None] * delta[:, None, :]
                y[:, h] = np.einsum("bk,bkv->bv", qv, S[:, h])
        zz = _silu(z.reshape(B, N, P))
        if rule == "mamba2":
            gated = (y * zz).reshape(B, K, G * P)
            gated = gated / np.sqrt((gated**2).mean(-1, keepdims=True) + eps)
            out = gated.reshape(B, N * P) * W["norm"]
        else:
            out = (y / np.sqrt((y**2).mean(-1, keepdims=True) + eps) * W["norm"] * zz)
            out = out.reshape(B, N * P)
        ys.append(out @ W["out_proj"])
    return np.stack(ys, axis=1), S


def _run(layer, x, cache):
    graphdef, state = nnx.split(layer)
    return jax.jit(lambda s, x, c: nnx.merge(graphdef, s)(x, jnp.int32(0), c))(state, x, cache)


@pytest.mark.parametrize("rule", RULES)
def test_layer_equals_oracle_and_chunked_prefill_equals_one_shot(rule):
    """The no-cache path (chunked from a zero state) and prefill 3 + 6 (the second chunk
    continuing from the cache's state) + one decode step (the recurrent form) both equal the
    numpy loop, and so does the final state: chunked prefill == prefill at once."""
    cfg = layer_cfg(rule)
    layer = make_layer(cfg)
    x = jax.random.normal(jax.random.key(0), (2, 10, cfg.d_model), jnp.float32)
    want, S = oracle(layer, x)
    y, _ = _run(layer, x, None)
    assert_close(y, want)
    cache = LinearAttention.init_cache(cfg, "linear", 2, 10)
    y1, cache = _run(layer, x[:, :3], cache)  # T < chunk
    y2, cache = _run(layer, x[:, 3:9], cache)  # T > chunk, not a multiple, from a state
    y3, cache = _run(layer, x[:, 9:10], cache)  # decode: the recurrent form
    assert_close(jnp.concatenate([y1, y2, y3], axis=1), want)
    assert_close(cache.state, S)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_cache_is_fixed_size(dtype):
    cfg = tiny(attention="linear", dtype=dtype)
    small = jax.eval_shape(lambda: refmodel.init_cache(cfg, 2, 16))
    large = jax.eval_shape(lambda: refmodel.init_cache(cfg, 2, 4096))
    shapes = lambda c: [(a.shape, a.dtype) for a in jax.tree.leaves(c.layers)]
    assert shapes(small) == shapes(large)
    assert refmodel.init_cache(cfg, 2, 16).max_len is None  # nothing bounds the sequence
    layer = small.layers[0]
    N, _, H, P, Q, X = sizes(cfg)
    assert layer.state.shape == (2, N, H, P) and layer.state.dtype == jnp.float32
    assert layer.conv.shape == (2, Q - 1, X) and layer.conv.dtype == jnp.dtype(dtype)
    nbytes = sum(a.size * a.dtype.itemsize for a in jax.tree.leaves(layer))
    for context in (16, 4096, 10**6):
        assert LinearAttention.cache_bytes(cfg, "linear", 2, context, Dtypes(kv=dtype)) == nbytes


@pytest.mark.parametrize("rule", RULES)
def test_shape_comments(rule):
    """The documented shapes (N=6, K=2, G=3, H=5, P=3, Q=3, X=2KH+NP=38, D=16)."""
    cfg = layer_cfg(rule)
    B, T, D, N, K, G, H, P, Q, X = 2, 7, 16, 6, 2, 3, 5, 3, 3, 38
    layer = LinearAttention(cfg, kind="linear", rngs=nnx.Rngs(0))
    assert sizes(cfg) == (N, K, H, P, Q, X)
    want = {"conv_w": (X, Q), "dt_bias": (N,), "A_log": (N,), "out_proj": (N * P, D)}
    if rule == "mamba2":
        want |= {"in_proj": (D, 2 * N * P + 2 * K * H + N), "conv_b": (X,), "D": (N,),
                 "norm": (N * P,)}
    else:
        want |= {"in_proj_qkvz": (D, 2 * K * H + 2 * N * P), "in_proj_ba": (D, 2 * N),
                 "norm": (P,)}
    assert {k: getattr(layer, k).shape for k in want} == want
    x = jax.ShapeDtypeStruct((B, T, D), jnp.float32)
    z, xc, ab = jax.eval_shape(layer.project, x)
    assert z.shape == (B, T, N, P) and xc.shape == (B, T, X)
    assert ab.shape == ((B, T, N) if rule == "mamba2" else (B, T, 2, N))
    q, k, v, g, beta = jax.eval_shape(layer.features, xc, ab)
    assert q.shape == k.shape == (B, T, K, H) and v.shape == (B, T, K, G, P)
    assert g.shape == beta.shape == (B, T, K, G)
    o = jax.ShapeDtypeStruct((B, T, N, P), jnp.float32)
    assert jax.eval_shape(lambda o, z: layer.output(o, z, jnp.float32), o, z).shape == (B, T, D)
    cache = LinearAttention.init_cache(cfg, "linear", B, 64)
    y, new = jax.eval_shape(lambda x, c: layer(x, jnp.int32(0), c), x, cache)
    assert y.shape == (B, T, D)
    assert jax.tree.map(lambda a: a.shape, new) == LinearCache(state=(B, N, H, P),
                                                               conv=(B, Q - 1, X))


@pytest.mark.parametrize("rule", RULES)
def test_param_counts_equal_module_state(rule):
    cfg = layer_cfg(rule)
    layer = nnx.eval_shape(lambda: LinearAttention(cfg, kind="linear", rngs=nnx.Rngs(0)))
    state = {path[0]: v.size for path, v in nnx.to_flat_state(nnx.state(layer, nnx.Param))}
    assert state == LinearAttention.param_counts(cfg, "linear")


def test_nemotron_h_8b_mamba_layer_matches_hf_count():
    """Nemotron-H-8B's Mamba-2 layer: D=4096, 128 heads of 64, 8 groups, state 128, conv 4."""
    cfg = refmodel.ModelConfig(d_model=4096, attention="linear", linear_rule="mamba2",
                               linear_v_heads=128, linear_value_dim=64, linear_k_heads=8,
                               linear_key_dim=128, linear_conv=4, linear_chunk=128)
    layer = nnx.eval_shape(lambda: LinearAttention(cfg, kind="linear", rngs=nnx.Rngs(0)))
    n = sum(v.size for v in jax.tree.leaves(nnx.state(layer, nnx.Param)))
    hf = (4096 * (2 * 8192 + 2 * 8 * 128 + 128) + (8192 + 2048) * 4 + (8192 + 2048)
          + 3 * 128 + 8192 + 8192 * 4096)
    assert n == hf == sum(LinearAttention.param_counts(cfg, "linear").values())


@pytest.mark.parametrize("rule", RULES)
def test_decode_cost_is_independent_of_context(rule):
    """The lesson in numbers: a decode step costs the same at context 10 and 10^6, and it
    moves the whole float32 state twice (read, write)."""
    cfg, dt = tiny(attention="linear", linear_rule=rule), Dtypes()
    near = LinearAttention.costs(cfg, "linear", 4, 1, 10, dt)
    far = LinearAttention.costs(cfg, "linear", 4, 1, 10**6, dt)
    assert near == far and set(near) == {"qkv_proj", "conv", "state_update", "out_proj"}
    N, _, H, P, _, _ = sizes(cfg)
    assert near["state_update"].kv_bytes == 2 * 4 * N * H * P * 4
    prefill = LinearAttention.costs(cfg, "linear", 4, 100, 0, dt)
    assert set(prefill) == {"qkv_proj", "conv", "chunk_scan", "out_proj"}
    # Linear in T: 13 chunks of 8 cost 13x one chunk.
    one = LinearAttention.costs(cfg, "linear", 4, 8, 0, dt)["chunk_scan"].flops
    assert prefill["chunk_scan"].flops == 13 * one


@pytest.mark.parametrize("rule", RULES)
@pytest.mark.parametrize("shape", [(3, 2, 3, 5, 37), (2, 1, 2, 64, 64), (1, 3, 1, 7, 16)])
def test_native_state_step_equals_recurrent(rule, shape):
    """The native decode step (kernels/recurrence.cc) against `recurrent` at one token: value
    channels in blocks of 4 vectors, single vectors and a scalar tail (U = 37, 64, 16), odd key
    dims; the state it returns is written in place of a donated one (no copy in the compiled
    step); wrong shapes are refused with the shapes named."""
    from refmodel import kernels
    from refmodel.kernels.recurrence import state_step

    if not kernels.available():
        pytest.skip(f"native kernels not built: {kernels.why_not()}")
    B, K, G, H, U = shape
    rng = np.random.default_rng(sum(shape))

    def f(*s):
        return jnp.asarray(rng.standard_normal(s), jnp.float32)

    S, q, k, v = f(B, K, G, H, U), f(B, K, H), f(B, K, H), f(B, K, G, U)
    g, beta = -jnp.abs(f(B, K, G)), jax.nn.sigmoid(f(B, K, G))
    o_ref, S_ref = recurrent(rule, S, *(a[:, None] for a in (q, k, v, g, beta)))

    def step(S, *rest):
        return state_step(S, *rest, delta=rule == "gated_delta")

    o, S2 = jax.jit(step)(S.reshape(B, K * G, H, U), q, k, v, g, beta)
    assert_close(o, o_ref[:, 0], tol=2e-5)
    assert_close(S2, S_ref.reshape(B, K * G, H, U), tol=2e-5)
    text = jax.jit(step, donate_argnums=0).lower(S.reshape(B, K * G, H, U), q, k, v, g,
                                                  beta).compile().as_text()
    assert " copy(" not in text and "copy_fusion" not in text
    with pytest.raises(ValueError, match=r"state float32\[2, 5, 5, 37\]"):
        state_step(jnp.zeros((2, 5, 5, 37)), q, k, v, g, beta, delta=True)


def test_native_mamba2_model_decodes_as_the_xla_model():
    """A native model's Mamba-2 layers decode in the kernel: prefill then token-by-token decode
    equals the XLA model's logits and the full forward (golden). (The gated delta rule, the
    default, decodes in the kernel in test_kernels.py's native golden stack of every kind.)"""
    rule = "mamba2"
    from conftest import assert_logits_close, incremental_logits, tokens

    from refmodel import backends, kernels

    if not kernels.available():
        pytest.skip(f"native kernels not built: {kernels.why_not()}")
    cfg = layer_cfg(rule, n_layers=2)
    xla = refmodel.init(cfg, seed=0)
    native = backends.use(xla, "native")
    toks = tokens(cfg, 2, 9, seed=3)
    got = incremental_logits(native, toks, [4])
    assert_logits_close(got, incremental_logits(xla, toks, [4]))
    assert_logits_close(got, refmodel.forward(xla, toks))
