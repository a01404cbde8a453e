"""Quantized weights (refmodel/quant.py): the formats' error bounds, both product paths against
the dequantized oracle, the quantized model's golden test on a stack of every attention kind,
closeness to the float model per format, and counted bytes == the bytes of the arrays made."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from hypothesis import given, settings
from hypothesis import strategies as st

import refmodel
from conftest import assert_logits_close, incremental_logits, tiny, tokens
from refmodel import costs, quant
from refmodel.counting import QUANT_GROUP

KINDS = refmodel.attention.registered()
EVERY_KIND = tiny(layer_pattern=KINDS, n_layers=len(KINDS), ffn_pattern=("dense", "moe"))
FORMATS = quant.WEIGHT_FORMATS


@settings(max_examples=6, deadline=None)
@given(k=st.integers(1, 80), n=st.integers(1, 12), log_scale=st.floats(-6, 6),
       fmt=st.sampled_from(FORMATS), seed=st.integers(0, 2**16))
def test_dequantize_quantize_is_within_the_formats_bound(k, n, log_scale, fmt, seed):
    """int8 / int4: |w - w'| <= scale / 2 (round to nearest on a grid of `scale`); float8
    e4m3 (3 mantissa bits): |w - w'| <= 2**-4 |w| + the subnormal step, in units of scale.
    int4's float16 scale is rounded up (so max|w| / scale <= 7): w' may pass max|w| by
    float16's rounding step, and a group's max|w| / 7 must fit float16 (as in Q4_0)."""
    w = np.random.default_rng(seed).standard_normal((k, n)).astype(np.float32) * 10**log_scale
    if fmt == "int4" and np.abs(w).max() / 7 > np.finfo(np.float16).max:
        w = w / np.abs(w).max() * 1e4  # past float16's range the format cannot hold it
    qw = quant.quantize_matrix(jnp.asarray(w), fmt)
    back = np.asarray(qw.dequantize())
    assert back.shape == w.shape
    group = QUANT_GROUP[fmt]
    scale = np.asarray(qw.scale)  # [n_out] or [n_out, n_in / group]
    per_elem = (scale[None, :] if group is None
                else np.repeat(scale, group, axis=1)[:, :k].T)  # [n_in, n_out]
    err = np.abs(back - w)
    if fmt == "float8":
        bound = 2.0**-4 * np.abs(w) + 2.0**-9 * per_elem  # e4m3: 3 mantissa bits, min 2**-9
    else:
        bound = per_elem / 2
    assert np.all(err <= bound * (1 + 1e-5) + 1e-30), float((err - bound).max())
    # scales from the max; int4's float16 scale rounded up by at most a step (a subnormal one)
    step, floor = (2.0**-10, 7 * float(np.finfo(np.float16).smallest_subnormal)) if (
        fmt == "int4") else (1e-6, 0.0)
    assert np.all(np.abs(back) <= np.abs(w).max() * (1 + step) + floor)


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("rows", [1, 5, quant.FEW_ROWS + 3])
def test_products_equal_the_dequantized_oracle(fmt, rows):
    """Both paths (fused multiply-and-reduce up to FEW_ROWS rows, dequantize-then-GEMM above)
    give x @ dequantize(w) to float32 rounding; stacked experts index to the same matrices."""
    rng = np.random.default_rng(rows)
    w = jnp.asarray(rng.standard_normal((3, 70, 24)), jnp.float32)  # [E, n_in, n_out]: 70 % 32 != 0
    x = jnp.asarray(rng.standard_normal((rows, 70)), jnp.float32)
    qw = quant.quantize_matrix(w, fmt, lead=1)
    for e in range(3):
        oracle = np.asarray(x) @ np.asarray(qw[e].dequantize())
        np.testing.assert_allclose(np.asarray(x @ qw[...][e]), oracle, rtol=1e-5, atol=1e-4)


def test_int8_activations_round_the_rows_too():
    """W8A8: the product of int8 rows and int8 weights, exact in int32, then scaled: within
    the activations' own rounding (half a step of max|x| / 127 per element) of the oracle."""
    rng = np.random.default_rng(0)
    w = jnp.asarray(rng.standard_normal((64, 16)), jnp.float32)
    x = jnp.asarray(rng.standard_normal((3, 64)), jnp.float32)
    qw = quant.quantize_matrix(w, "int8", acts=True)
    exact = np.asarray(x) @ np.asarray(qw.dequantize())
    step = np.abs(np.asarray(x)).max(-1, keepdims=True) / 127
    bound = (step / 2) * np.abs(np.asarray(qw.dequantize())).sum(0)  # [M, n_out]
    assert np.all(np.abs(np.asarray(x @ qw) - exact) <= bound + 1e-4)


# Golden on every way a variant multiplies by a matrix, split over two small models (the
# suite's time): int8 on MLA (`x @ w` and einsums of dequantized 3-D weights), float8 on
# sparse (the gqa projections it inherits, the indexer's einsums) and linear (`x @ w`). int4
# takes the same code with two nibbles per byte: its products are checked against the oracle
# on both paths above. A MoE's stacked experts are the products test's too (a quantized MoE
# compiles 8 experts' loops: 2-3x the time).
GOLDEN = {"int8": tiny(attention="mla", n_layers=1, q_lora_rank=16),
          "float8": tiny(layer_pattern=("sparse", "linear"), n_layers=2)}


@pytest.mark.parametrize("fmt", GOLDEN)
def test_golden_holds_for_quantized_weights(fmt):
    """forward == prefill in chunks + token-by-token decode with weights in `fmt`. The
    prefill's products dequantize then run the GEMM, decode's multiply-and-reduce the stored
    values: the same numbers summed in another order, so the tolerance is 5e-5, not the float
    model's 1e-5 (one layer differs by 1.2e-6 to 6.7e-6 in max logit; a stack
    compounds them)."""
    cfg = GOLDEN[fmt].replace(weight_format=fmt)
    W, length = cfg.window, 2 * cfg.window + 3
    model = refmodel.init(cfg, seed=0)
    toks = tokens(cfg, 2, length, seed=1)
    assert_logits_close(incremental_logits(model, toks, [3, W + 1]),
                        refmodel.forward(model, toks), tol=5e-5)


# Relative max logit error against the float model (same weights) on a dense GQA model, as
# measured here (int8 0.013, float8 0.043, int4 0.18 on tiny): a 3x margin. Routing (MoE)
# and top-k key selection (sparse) are discrete: a quantized weight can flip a choice, so
# their closeness is not bounded like this (golden above still holds exactly for them).
TOLERANCE = {"int8": 0.04, "float8": 0.15, "int4": 0.5}


@pytest.mark.parametrize("fmt", FORMATS)
def test_quantized_forward_is_close_to_float(fmt):
    cfg = tiny(attention="gqa")
    model = refmodel.init(cfg, seed=0)
    toks = np.random.default_rng(0).integers(0, cfg.vocab_size, (2, 12))
    ref = refmodel.forward(model, toks)
    out = refmodel.forward(quant.quantize(model, weights=fmt), toks)
    err = float(jnp.abs(out - ref).max() / jnp.abs(ref).max())
    assert 0 < err < TOLERANCE[fmt], err
    # the finer format is closer
    if fmt == "int4":
        int8 = refmodel.forward(quant.quantize(model, weights="int8"), toks)
        assert float(jnp.abs(int8 - ref).max()) < float(jnp.abs(out - ref).max())


def _param_bytes(model) -> int:
    return sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(nnx.state(model, nnx.Param)))


@pytest.mark.parametrize("fmt", ["none", *FORMATS])
def test_counted_weight_bytes_equal_the_arrays_made(fmt):
    """Decode at batch 1 reads every parameter once, except the embedding table (one row per
    token): its counted weight bytes are the bytes of every created Param leaf (quantized
    values and their scales) less the table plus one row (a tied table is also the LM head:
    read whole, plus the row). Every kind, dense FFN (a MoE reads the experts its tokens
    touch); MLA in both forms; Mamba-2's extra vectors."""
    configs = [EVERY_KIND.replace(ffn_pattern=None, mla_absorb=absorb, mlp_bias=True)
               for absorb in (False, True)]
    configs.append(tiny(attention="linear", linear_rule="mamba2", tie_embeddings=True))
    for cfg in configs:
        cfg = cfg.replace(weight_format=fmt)
        model = nnx.eval_shape(lambda cfg=cfg: refmodel.model.Transformer(cfg,
                                                                         rngs=nnx.Rngs(0)))
        made = _param_bytes(model)
        row = cfg.d_model * 4
        table = 0 if cfg.tie_embeddings else cfg.vocab_size * row
        counted = costs.phase_costs(cfg, "decode", 1, 8)["weight_bytes"]
        assert counted == made - table + row, (cfg.layer_kinds, counted, made)


def test_quantize_one_call_keeps_the_model_and_says_so_in_its_config():
    model = refmodel.init(tiny(attention="gqa", ffn="moe"), seed=0)
    q = quant.quantize(model, weights="int4", kv="int8")
    assert (q.cfg.weight_format, q.cfg.kv_format) == ("int4", "int8")
    assert model.cfg.weight_format == "none"  # the float model is untouched
    assert isinstance(q.blocks[0].ffn.w_up[...], quant.Quantized)
    assert not isinstance(q.blocks[0].ffn.w_router[...], quant.Quantized)  # router stays float
    assert not isinstance(q.embed.embedding[...], quant.Quantized)
    np.testing.assert_array_equal(q.blocks[0].attn_norm.scale[...],
                                  model.blocks[0].attn_norm.scale[...])
    fresh = refmodel.init(tiny(attention="gqa", ffn="moe", weight_format="int4"), seed=0)
    a, b = jax.tree.leaves(nnx.state(q, nnx.Param)), jax.tree.leaves(nnx.state(fresh, nnx.Param))
    assert all(np.array_equal(x, y) for x, y in zip(a, b, strict=True))  # init == quantize(init)
    with pytest.raises(ValueError, match="already int4"):
        quant.quantize(q, weights="int8")


def test_bad_formats_are_refused_by_name():
    with pytest.raises(ValueError, match="weight_format='int3'"):
        tiny(weight_format="int3")
    with pytest.raises(ValueError, match="kv_format='int4'"):
        tiny(kv_format="int4")
    with pytest.raises(ValueError, match="quant_activations"):
        tiny(weight_format="float8", quant_activations=True)
    with pytest.raises(ValueError, match="weight format 'fp4'"):
        quant.quantize_matrix(jnp.ones((4, 4)), "fp4")


def test_int4_packs_two_values_per_byte_with_group_scales():
    w = jnp.asarray(np.random.default_rng(0).standard_normal((70, 5)), jnp.float32)
    qw = quant.quantize_matrix(w, "int4")
    padded = math.ceil(70 / 32) * 32
    assert qw.q.shape == (5, padded // 2) and qw.q.dtype == jnp.int8
    assert qw.scale.shape == (5, padded // 32)


def test_shipped_precision_halves_deepseek_v3s_decode_weight_bytes():
    """DeepSeek-V3 ships fp8 matrices (presets.SHIPPED, cited): its batch-1 decode reads about
    half the bf16 weight bytes (plus per-channel scales; norms and the embedding row stay bf16),
    and the maximum batch at a fixed memory grows with the freed bytes."""
    bf16 = costs.phase_costs(refmodel.presets.get("deepseek-v3"), "decode", 1, 4096)
    fp8 = costs.phase_costs(refmodel.presets.shipped("deepseek-v3"), "decode", 1, 4096)
    assert fp8["dtypes"]["weight"] == "float8"
    assert 0.5 < fp8["weight_bytes"] / bf16["weight_bytes"] < 0.503
    assert fp8["kv_bytes"] == bf16["kv_bytes"]
    assert refmodel.presets.shipped("llama3-8b") == refmodel.presets.get("llama3-8b")
