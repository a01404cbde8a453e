"""Probes of the model API and the config: every bad input is a named error.

Each test feeds one bad input (on the tiny preset) that would otherwise give NaN, a wrong
answer or a traceback deep in JAX, and asserts the error names the argument or the field, the
value and what is allowed. The property test draws random configs: each either fails
validation naming a field, or builds a model whose forward on valid tokens is finite.
"""

from __future__ import annotations

import dataclasses
import re

import numpy as np
import pytest
from conftest import tiny
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import refmodel
from refmodel import api


@pytest.fixture(scope="module")
def model():
    return refmodel.init(tiny())


# Token ids -------------------------------------------------------------------------------------

@pytest.mark.parametrize("ids, shown", [
    ([[256]], "tokens[0, 0]=256"),  # was NaN logits
    ([[-1]], "tokens[0, 0]=-1"),  # was read as token 255
    (np.array([[7, 2**32 + 5]], np.int64), f"tokens[0, 1]={2**32 + 5}"),  # was token 5
])
def test_forward_refuses_ids_outside_the_vocabulary(model, ids, shown):
    with pytest.raises(ValueError) as err:
        refmodel.forward(model, ids)
    assert shown in str(err.value) and "[0, 255]" in str(err.value)


def test_forward_refuses_non_integer_ids(model):
    for ids in ([[1.0]], np.array([[True]])):
        with pytest.raises(ValueError, match="tokens must be an integer array"):
            refmodel.forward(model, ids)


def test_decode_step_refuses_a_bad_id_and_leaves_the_cache_usable(model):
    cache = refmodel.init_cache(model.cfg, 1, 8)
    _, cache = refmodel.prefill(model, [[1, 2]], cache)
    with pytest.raises(ValueError, match=r"token\[0\]=999 .*\[0, 255\]"):
        refmodel.decode_step(model, [999], cache)  # was NaN, and every later step too
    logits, _ = refmodel.decode_step(model, [3], cache)
    assert np.isfinite(np.asarray(logits)).all()


def test_generate_refuses_out_of_vocabulary_prompt(model):
    with pytest.raises(ValueError, match=r"prompt\[0, 0\]=300"):
        refmodel.generate(model, [[300]], 3)  # was [[300, 0, 0, 0]]


def test_generate_refuses_an_empty_prompt(model):
    with pytest.raises(ValueError, match=r"prompt of shape \(1, 0\) is empty"):
        refmodel.generate(model, np.zeros((1, 0), np.int32), 3)  # was an IndexError


# Caches ----------------------------------------------------------------------------------------

@pytest.mark.parametrize("batch, cache_batch", [(1, 2), (3, 2)])
def test_prefill_refuses_a_cache_of_another_batch(model, batch, cache_batch):
    cache = refmodel.init_cache(model.cfg, cache_batch, 8)
    with pytest.raises(ValueError, match=f"cache holds {cache_batch} sequences .* batch {batch}"):
        refmodel.prefill(model, [[1, 2]] * batch, cache)


def test_decode_step_refuses_a_cache_of_another_batch(model):
    cache = refmodel.init_cache(model.cfg, 2, 8)  # was silently broadcast
    with pytest.raises(ValueError, match="cache holds 2 sequences .* batch 1"):
        refmodel.decode_step(model, [1], cache)


def test_a_cache_of_another_kind_is_refused(model):
    mla = refmodel.init_cache(tiny(attention="mla"), 1, 8)  # was an AttributeError
    with pytest.raises(ValueError, match=r"cache.layers\[0\] is a MLACache.*'gqa'.*KVCache"):
        refmodel.prefill(model, [[1, 2]], mla)
    with pytest.raises(ValueError, match="cache must be a Cache"):
        refmodel.decode_step(model, [1], {"k": 0})


# Sampling temperature --------------------------------------------------------------------------

@pytest.mark.parametrize("temperature", [float("nan"), float("inf"), -1.0, "0.5", True])
def test_temperature_must_be_a_finite_number_at_least_zero(model, temperature):
    with pytest.raises(ValueError, match="temperature=.* finite number >= 0"):
        refmodel.generate(model, [[1, 2]], 2, temperature=temperature)  # nan: was token 0


def test_tiny_temperatures_behave_as_greedy(model):
    greedy = np.asarray(refmodel.generate(model, [[1, 2]], 3))
    assert greedy[0, 2:].any()  # not the "token 0" of a NaN distribution
    for temperature in (1e-38, 1e-30, 1e-6):  # 1e-38 was token 0 every step
        sampled = refmodel.generate(model, [[1, 2]], 3, temperature=temperature, seed=3)
        np.testing.assert_array_equal(np.asarray(sampled), greedy)


# Configs ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("changes, needle", [
    (dict(norm_eps=-1.0), "norm_eps=-1.0"),  # NaN logits
    (dict(rope_theta=0.0), "rope_theta=0.0"),  # NaN logits
    (dict(rope_theta=-5.0), "rope_theta=-5.0"),
    (dict(final_softcap=0.0), "final_softcap=0.0"),  # logits all 0
    (dict(attn_softcap=0.0), "attn_softcap=0.0"),  # attention silently uniform
    (dict(query_scale=-4), "query_scale=-4"),  # a complex scale, imaginary part dropped
    (dict(query_scale=0), "query_scale=0"),  # ZeroDivisionError
    (dict(ffn="moe", d_ff_expert=0), "d_ff_expert=0"),  # ZeroDivisionError at init
    (dict(ffn="moe", d_ff_expert=-5), "d_ff_expert=-5"),  # MLIRError at init
    (dict(attention="mla", q_lora_rank=-4), "q_lora_rank=-4"),  # silently 0
    (dict(layer_pattern=("gqa", "sliding", "mla")), "n_layers=2"),  # silently cut
    (dict(ffn_pattern=("dense", "moe", "dense")), "n_layers=2"),
    (dict(norm_eps=float("nan")), "norm_eps=nan"),
    (dict(tie_embeddings="no"), "tie_embeddings='no'"),
    (dict(rope_fraction=0.01), "rotary dim of 0"),
])
def test_meaningless_config_is_refused(changes, needle):
    with pytest.raises(ValueError) as err:
        tiny(**changes)
    assert needle in str(err.value)


# Property: a random config is refused naming a field, or runs finite ----------------------------

FIELDS = {f.name for f in dataclasses.fields(refmodel.ModelConfig)}
KINDS = refmodel.attention.registered()
SMALL = dict(vocab_size=32, d_model=16, n_layers=2, n_heads=2, n_kv_heads=1, d_ff=16,
             n_experts=4, top_k=2, d_ff_expert=8, window=4, kv_lora_rank=8, qk_nope_dim=4,
             qk_rope_dim=4, v_head_dim=4, sparse_top_k=3, indexer_heads=1, indexer_dim=4,
             linear_k_heads=1, linear_v_heads=2, linear_key_dim=4, linear_value_dim=4,
             linear_chunk=4)
ODD_FLOATS = st.sampled_from([0.0, -1.0, float("nan"), float("inf"), 1e-30, 0.5])


def sometimes(good, bad=ODD_FLOATS):
    """Mostly a sensible value, sometimes an odd one (so about half the configs validate)."""
    return st.one_of(good, good, good, good, good, good, bad)


CHANGES = st.fixed_dictionaries({}, optional={
    "attention": st.sampled_from(KINDS),
    "layer_pattern": st.lists(st.sampled_from((*KINDS, "none")), max_size=3).map(tuple),
    "ffn": st.sampled_from(["dense", "moe"]),
    "ffn_pattern": st.lists(st.sampled_from(["dense", "moe", "none"]), min_size=1,
                            max_size=3).map(tuple),
    "n_layers": sometimes(st.integers(1, 3), st.integers(-1, 0)),
    "d_model": sometimes(st.sampled_from([8, 16]), st.sampled_from([0, 12, -8])),
    "n_heads": sometimes(st.sampled_from([1, 2, 4]), st.integers(-1, 3)),
    "head_dim": st.one_of(st.none(), st.integers(-1, 8)),
    "norm": st.sampled_from(["rmsnorm", "layernorm"]),
    "norm_eps": sometimes(st.floats(1e-8, 1e-2)),
    "position": st.sampled_from(["rope", "learned", "none"]),
    "max_position": sometimes(st.integers(2, 16), st.integers(-1, 0)),
    "rope_theta": sometimes(st.floats(2.0, 1e7)),
    "rope_fraction": sometimes(st.sampled_from([0.25, 0.5, 1.0])),
    "attn_softcap": st.one_of(st.none(), sometimes(st.floats(1.0, 100.0))),
    "final_softcap": st.one_of(st.none(), sometimes(st.floats(1.0, 100.0))),
    "query_scale": st.one_of(st.none(), sometimes(st.floats(1.0, 256.0))),
    "qk_norm": st.booleans(), "attn_sinks": st.booleans(), "attn_out_gate": st.booleans(),
    "post_norms": st.booleans(), "tie_embeddings": st.booleans(), "mla_absorb": st.booleans(),
    "mlp_act": st.sampled_from(["swiglu", "geglu", "gelu", "relu2"]),
    "top_k": st.integers(-1, 4),
    "d_ff_expert": st.one_of(st.none(), st.integers(-2, 8)),
    "n_shared_experts": st.integers(-1, 1),
    "router_score": st.sampled_from(["softmax", "sigmoid"]),
    "q_lora_rank": st.integers(-2, 8),
    "qk_rope_dim": sometimes(st.sampled_from([2, 4]), st.integers(-1, 3)),
    "window": st.integers(-1, 6),
    "sparse_top_k": st.integers(-1, 6),
    "linear_rule": st.sampled_from(["gated_delta", "mamba2"]),
    "linear_conv": st.integers(-1, 4),
    "linear_chunk": st.integers(-1, 4),
    "dtype": st.sampled_from(["float32", "bfloat16", "float16"]),
})


# Each config that validates compiles its own forward, so 8 examples keep the test short;
# hypothesis keeps the failing ones in its database for the next run.
@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(changes=CHANGES, seed=st.integers(0, 2**16))
def test_random_config_is_refused_by_name_or_runs_finite(changes, seed):
    try:
        cfg = refmodel.ModelConfig(**{**SMALL, **changes})
    except ValueError as err:
        named = re.match(r"([a-z_]+)[=\s]", str(err))
        assert named and named.group(1) in FIELDS, f"no field named first: {err}"
        return
    T = min(5, cfg.max_position) if cfg.position == "learned" else 5
    ids = np.random.default_rng(seed).integers(0, cfg.vocab_size, (2, T))
    logits = np.asarray(api.forward(refmodel.init(cfg, seed), ids))
    assert logits.shape == (2, T, cfg.vocab_size)
    assert np.isfinite(logits).all(), cfg
