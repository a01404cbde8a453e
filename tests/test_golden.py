"""The golden test: one full causal forward == prefill in chunks + token-by-token decode.

It runs over every option set every registered attention variant declares (so a new variant
file is covered the moment it registers: `refmodel.attention.option_sets`), held by two hybrid
stacks: "every kind" (one layer of every registered kind, each in its default options) and
"mla absorbed + linear mamba2" (the other option sets), one compile per chunk shape each. Each
stack prefills in three chunks (shorter than the window; longer than it, on a cache that holds
tokens; longer again, into a ring that has wrapped), then decodes the rest across another
wrap-around: the sequence is 3x the tiny window + 2. An option of a variant that no option set
switches on rides along on one (`ALSO`). A sliding-only model, whose cache has no max_len, is
tested past any max_len in tests/test_attn_sliding.py.

The MoE FFN sees one token at a time whatever the mixer, so it runs under the configs that
exercise its options (every router option, shared experts, biases, after a dense first layer;
a mixer-only / FFN-only hybrid) rather than under every mixer: its compiles are the slowest of
the suite. (The FFN-only hybrid's "none" layers take the same path with a dense FFN.)
"""

from __future__ import annotations

import pytest

import refmodel
from conftest import assert_golden, tiny

KINDS = refmodel.attention.registered()
W = tiny().window
LENGTH = 3 * W + 2  # past a sliding window's wrap-around
CHUNKS = [3, W + 3, W + 1]  # then decode 3 tokens, across the ring's wrap at 3W
# Options that ride along on an option set: the compressed query of MLA on the absorbed form
# (the naive form runs without it; the layer runs both forms both ways in test_attn_mla.py).
ALSO = {"mla absorbed": {"q_lora_rank": 16}}
OPTION_SETS = refmodel.attention.option_sets()
STACKS = {
    "every kind": tiny(layer_pattern=KINDS, n_layers=len(KINDS)),
    "mla absorbed + linear mamba2": tiny(layer_pattern=("mla", "linear"), n_layers=2,
                                         mla_absorb=True, linear_rule="mamba2",
                                         **ALSO["mla absorbed"]),
}


def test_the_stacks_hold_every_option_set():
    held = {refmodel.attention.label(cfg.replace(layer_pattern=None, attention=kind))
            for cfg in STACKS.values() for kind in cfg.layer_kinds}
    assert held == set(OPTION_SETS), set(OPTION_SETS) - held


@pytest.mark.parametrize("stack", STACKS)
def test_chunked_prefill_then_decode_equals_forward(stack):
    assert_golden(STACKS[stack], 2, LENGTH, CHUNKS)


# Configs that switch on shared options (one prefill chunk, then decode). Every option of the
# gqa layer and the model, with a dense FFN (geglu) in layer 0 and an MoE FFN with every router
# option in layer 1; and GPT-2's learned positions, LayerNorm and biases.
CONFIGS = {
    "gqa with every option, dense then moe": {
        "attention": "gqa", "attn_bias": True, "qk_norm": True, "attn_out_gate": True,
        "attn_sinks": True, "attn_softcap": 20.0, "final_softcap": 30.0, "rope_fraction": 0.5,
        "post_norms": True, "mlp_act": "geglu", "tie_embeddings": True, "ffn": "moe",
        "first_dense_layers": 1, "n_shared_experts": 1, "router_score": "sigmoid",
        "moe_bias": True, "router_bias": True},
    "gpt2-like": {"attention": "mha", "position": "learned", "norm": "layernorm",
                  "mlp_act": "gelu", "attn_bias": True, "mlp_bias": True,
                  "tie_embeddings": True},
}


@pytest.mark.parametrize("backend", ["xla", "pallas"])  # "pallas": its decode kernels (mha)
@pytest.mark.parametrize("variant", CONFIGS)  # and its grouped matmul (moe) in the golden test
def test_forward_equals_prefill_then_decode(variant, backend):
    cfg = tiny(**CONFIGS[variant], backend=backend)
    if cfg.ffn == "moe":
        assert cfg.layer_ffns == ("dense", "moe")
    assert_golden(cfg, 2, LENGTH, [5])


# gpt-oss's alternating sliding / full layers (with sinks and biases) are in test_attn_sliding.
# Qwen3-Next's gated-delta linear + full layers: the "every kind" stack above holds both, and the
# Nemotron-H-like pattern runs the same linear + full hybrid with the mamba2 rule.
# Gemma's 2 local : 1 global tiling is a sliding + gqa mix, which "every kind" holds (the
# tiling itself is config logic, tests/test_config.py).
PATTERNS = {
    "nemotron-h-like mixer-only and ffn-only": (("linear", "none", "gqa"), "moe",
                                                {"linear_rule": "mamba2"}),
}


@pytest.mark.parametrize("name", PATTERNS)
def test_hybrid_layer_patterns(name):
    pattern, ffn, changes = PATTERNS[name]
    cfg = tiny(layer_pattern=pattern, n_layers=len(pattern), ffn=ffn,
               ffn_pattern=(ffn, "none") if "none" in pattern else None, **changes)
    assert cfg.layer_kinds == pattern
    # one chunk: the compile of linear + MoE is the slowest of the file (every option set is
    # chunked three ways in the stacks above)
    assert_golden(cfg, 1, LENGTH, [9], seed=3)
