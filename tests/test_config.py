"""Every bad config raises a ValueError that names the field, the value and what is allowed."""

from __future__ import annotations

import pytest
from conftest import tiny
from hypothesis import given
from hypothesis import strategies as st

import refmodel

BAD = [
    (dict(n_heads=4, n_kv_heads=3), "n_kv_heads=3"),
    (dict(ffn="moe", top_k=9, n_experts=8), "top_k=9"),
    (dict(attention="flash"), "attention='flash'"),
    (dict(ffn="sparse"), "ffn='sparse'"),
    (dict(layer_pattern=("gqa", "local")), "layer_pattern='local'"),
    (dict(layer_pattern=()), "layer_pattern"),
    (dict(ffn_pattern=("dense", "huge")), "ffn_pattern='huge'"),
    (dict(d_model=0), "d_model=0"),
    (dict(n_layers=-1), "n_layers=-1"),
    (dict(d_model=65), "d_model=65"),
    (dict(mlp_act="tanh"), "mlp_act='tanh'"),
    (dict(norm="batchnorm"), "norm='batchnorm'"),
    (dict(dtype="float64"), "dtype='float64'"),
    (dict(first_dense_layers=5), "first_dense_layers=5"),
    (dict(rope_fraction=1.5), "rope_fraction=1.5"),
    (dict(router_score="relu", ffn="moe"), "router_score='relu'"),
    (dict(attention="sliding", window=0), "window=0"),
    (dict(attention="sparse", sparse_top_k=0), "sparse_top_k=0"),
    (dict(attention="linear", linear_k_heads=3, linear_v_heads=4), "linear_v_heads=4"),
    (dict(attention="mla", qk_rope_dim=7), "qk_rope_dim=7"),
    (dict(attention="mla", kv_lora_rank=0), "kv_lora_rank=0"),
    (dict(linear_rule="rwkv", attention="linear"), "linear_rule='rwkv'"),
    (dict(attention="mla", attn_sinks=True), "attn_sinks=True is not implemented"),
]


@pytest.mark.parametrize("changes,needle", BAD)
def test_bad_config_names_field_and_value(changes, needle):
    with pytest.raises(ValueError) as err:
        tiny(**changes)
    assert needle in str(err.value)


def test_unknown_attention_lists_the_registered_kinds():
    with pytest.raises(ValueError) as err:
        tiny(attention="flash")
    for kind in refmodel.attention.registered():
        assert repr(kind) in str(err.value)


def test_unknown_preset_lists_names():
    with pytest.raises(ValueError, match="'tiny'"):
        refmodel.presets.get("gpt-5")


def test_config_is_frozen():
    with pytest.raises(AttributeError):
        tiny().d_model = 8  # type: ignore[misc]


@given(n=st.integers(1, 16), k=st.integers(1, 16))
def test_heads_validation_agrees_with_divisibility(n, k):
    if n % k:
        with pytest.raises(ValueError, match=f"n_kv_heads={k}"):
            tiny(n_heads=n, n_kv_heads=k, head_dim=8)
    else:
        cfg = tiny(n_heads=n, n_kv_heads=k, head_dim=8)
        assert cfg.groups * cfg.n_kv_heads == cfg.n_heads


def test_layer_pattern_and_first_dense_layers_tile():
    cfg = tiny(n_layers=5, layer_pattern=("gqa", "mqa"), ffn="moe", first_dense_layers=2)
    assert cfg.layer_kinds == ("gqa", "mqa", "gqa", "mqa", "gqa")
    assert cfg.layer_ffns == ("dense", "dense", "moe", "moe", "moe")


def test_bad_api_inputs():
    cfg = tiny()
    model = refmodel.init(cfg)
    with pytest.raises(ValueError, match="batch=0"):
        refmodel.init_cache(cfg, 0, 4)
    with pytest.raises(ValueError, match="tokens must be an integer array"):
        refmodel.forward(model, [1.5, 2.5])
    with pytest.raises(ValueError, match="max_new_tokens=-1"):
        refmodel.generate(model, [[1, 2]], -1)
    with pytest.raises(TypeError, match="ModelConfig"):
        refmodel.init({"d_model": 8})
    gpt2_like = refmodel.init(tiny(attention="mha", position="learned", max_position=8))
    with pytest.raises(ValueError, match="max_position=8"):
        refmodel.forward(gpt2_like, [[1] * 9])
    with pytest.raises(ValueError, match="max_position=8"):
        refmodel.init_cache(gpt2_like.cfg, 1, 9)
