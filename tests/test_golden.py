"""The golden test: one full causal forward == prefill of a prefix + token-by-token decode.

It runs over every option set every registered attention variant declares (so a new variant
file is covered the moment it registers: `refmodel.attention.option_sets`), and over hybrid
layer patterns; windows are exercised past wrap-around (the sequence is 3x the tiny window)
and prefill is also done in chunks. The MoE FFN sees one token at a time whatever the mixer,
so it runs under the configs that exercise its options (every router option, shared experts,
biases, a mixer-only / FFN-only hybrid) rather than under every mixer: its compiles are the
slowest of the suite. (The FFN-only hybrid's "none" layers take the same path with a dense FFN.)
"""

from __future__ import annotations

import pytest
from conftest import assert_golden, tiny

import refmodel

KINDS = refmodel.attention.registered()
LENGTH = 3 * tiny().window + 2  # past a sliding window's wrap-around
# Every option set of every registered variant, plus configs that switch on shared options.
VARIANTS = {label: (changes, ("dense",))
            for label, changes in refmodel.attention.option_sets().items()}
VARIANTS["gqa with every option"] = ({
    "attention": "gqa", "attn_bias": True, "qk_norm": True, "attn_out_gate": True,
    "attn_sinks": True, "attn_softcap": 20.0, "final_softcap": 30.0, "rope_fraction": 0.5,
    "post_norms": True, "mlp_act": "geglu", "tie_embeddings": True, "n_shared_experts": 1,
    "router_score": "sigmoid", "moe_bias": True, "router_bias": True}, ("dense", "moe"))
VARIANTS["gpt2-like"] = ({"attention": "mha", "position": "learned", "norm": "layernorm",
                          "mlp_act": "gelu", "attn_bias": True, "mlp_bias": True,
                          "tie_embeddings": True}, ("dense",))
CASES = [(v, ffn) for v, (_, ffns) in VARIANTS.items() for ffn in ffns]


@pytest.mark.parametrize(("variant", "ffn"), CASES, ids=[f"{v}-{f}" for v, f in CASES])
def test_forward_equals_prefill_then_decode(variant, ffn):
    assert_golden(tiny(ffn=ffn, **VARIANTS[variant][0]), 2, LENGTH, [5])


@pytest.mark.parametrize("kind", KINDS)
def test_chunked_prefill_equals_forward(kind):
    """Chunks shorter and longer than the window, on a cache that already holds tokens."""
    cfg = tiny(attention=kind)
    assert_golden(cfg, 2, LENGTH, [3, cfg.window + 3, LENGTH - cfg.window - 6], seed=1)


PATTERNS = {
    "gemma-like 2 local : 1 global": (("sliding", "sliding", "gqa"), ("dense",)),
    "gpt-oss-like alternating": (("sliding", "gqa"), ("dense",)),
    "qwen3-next-like linear + full": (("linear", "linear", "gqa"), ("dense",)),
    "nemotron-h-like mixer-only and ffn-only": (("linear", "none", "gqa"), ("moe",)),
    "every kind": (KINDS, ("dense",)),
}
HYBRIDS = [(name, ffn) for name, (_, ffns) in PATTERNS.items() for ffn in ffns]


@pytest.mark.parametrize(("name", "ffn"), HYBRIDS, ids=[f"{n}-{f}" for n, f in HYBRIDS])
def test_hybrid_layer_patterns(name, ffn):
    pattern = PATTERNS[name][0]
    cfg = tiny(layer_pattern=pattern, n_layers=len(pattern), ffn=ffn,
               ffn_pattern=(ffn, "none") if "none" in pattern else None)
    assert cfg.layer_kinds == pattern
    # two chunks (the second on a cache that holds tokens); one for the 7-layer stack of every
    # kind, whose compiles are the slowest of the file (chunking is tested kind by kind above)
    assert_golden(cfg, 1, LENGTH, [9] if name == "every kind" else [4, 9], seed=3)
