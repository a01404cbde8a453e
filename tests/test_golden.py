"""The golden test: one full causal forward == prefill of a prefix + token-by-token decode.

It runs over every registered attention kind (so a new variant file is covered the moment it
registers), dense and MoE, and over hybrid layer patterns; windows are exercised past
wrap-around (the sequence is 3x the tiny window) and prefill is also done in chunks.
"""

from __future__ import annotations

import pytest
from conftest import assert_logits_close, incremental_logits, tiny, tokens

import refmodel

KINDS = refmodel.attention.registered()
LENGTH = 3 * tiny().window + 2  # past a sliding window's wrap-around
# Every registered kind with its defaults, plus the options that switch code paths.
VARIANTS = {kind: {"attention": kind} for kind in KINDS}
VARIANTS["mla absorbed"] = {"attention": "mla", "mla_absorb": True}
VARIANTS["linear mamba2"] = {"attention": "linear", "linear_rule": "mamba2"}
VARIANTS["gqa with every option"] = {
    "attention": "gqa", "attn_bias": True, "qk_norm": True, "attn_out_gate": True,
    "attn_sinks": True, "attn_softcap": 20.0, "final_softcap": 30.0, "rope_fraction": 0.5,
    "post_norms": True, "mlp_act": "geglu", "tie_embeddings": True, "n_shared_experts": 1,
    "router_score": "sigmoid", "moe_bias": True, "router_bias": True}
VARIANTS["gpt2-like"] = {"attention": "mha", "position": "learned", "norm": "layernorm",
                         "mlp_act": "gelu", "attn_bias": True, "mlp_bias": True,
                         "tie_embeddings": True}


@pytest.mark.parametrize("ffn", ["dense", "moe"])
@pytest.mark.parametrize("variant", VARIANTS)
def test_forward_equals_prefill_then_decode(variant, ffn):
    cfg = tiny(ffn=ffn, **VARIANTS[variant])
    model = refmodel.init(cfg, seed=0)
    toks = tokens(cfg, 2, LENGTH)
    full = refmodel.forward(model, toks)
    assert full.shape == (2, LENGTH, cfg.vocab_size)
    assert_logits_close(incremental_logits(model, toks, [5]), full)


@pytest.mark.parametrize("kind", KINDS)
def test_chunked_prefill_equals_forward(kind):
    """Chunks shorter and longer than the window, on a cache that already holds tokens."""
    cfg = tiny(attention=kind)
    model = refmodel.init(cfg, seed=1)
    toks = tokens(cfg, 2, LENGTH, seed=2)
    full = refmodel.forward(model, toks)
    chunks = [3, cfg.window + 3, LENGTH - cfg.window - 6]
    assert_logits_close(incremental_logits(model, toks, chunks), full)


PATTERNS = {
    "gemma-like 2 local : 1 global": ("sliding", "sliding", "gqa"),
    "gpt-oss-like alternating": ("sliding", "gqa"),
    "qwen3-next-like linear + full": ("linear", "linear", "gqa"),
    "nemotron-h-like mixer-only and ffn-only": ("linear", "none", "gqa"),
    "every kind": KINDS,
}


@pytest.mark.parametrize("ffn", ["dense", "moe"])
@pytest.mark.parametrize("name", PATTERNS)
def test_hybrid_layer_patterns(name, ffn):
    if name == "every kind" and ffn == "moe":
        pytest.skip("every kind x MoE is covered kind by kind above; one 9-layer MoE compile "
                    "would cost 30 s of the suite")
    pattern = PATTERNS[name]
    cfg = tiny(layer_pattern=pattern, n_layers=len(pattern), ffn=ffn,
               ffn_pattern=("moe" if ffn == "moe" else "dense", "none") if "none" in pattern
               else None)
    assert cfg.layer_kinds == pattern
    model = refmodel.init(cfg, seed=3)
    toks = tokens(cfg, 1, LENGTH, seed=4)
    assert_logits_close(incremental_logits(model, toks, [4, 9]), refmodel.forward(model, toks))
