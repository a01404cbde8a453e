"""Real-architecture presets: parameter totals against the figures their sources publish, and
the analytic count against the parameter tree the model would create (under eval_shape).

Published figures (each within its published rounding): GPT-2 124,439,808 (the '124M'
checkpoint); Gemma 2 9B 9,242,164,736 and 27B 27,227,718,144 (256,128-row embedding); gpt-oss
model card Table 1: 120b 116.83B total / 5.13B active, 20b 20.91B / 3.61B (active counts the
unembedding, not the embedding); Mixtral 8x7B card 46.7B / 12.9B; DeepSeek-V3 671B without
the MTP module; Qwen3-30B-A3B card 30.5B total and 29.9B non-embedding (its '3.3B activated'
is not asserted: the count here, embedding and head included, is 3.35B).
"""

from __future__ import annotations

import math

import jax
import pytest
from flax import nnx

import refmodel
from refmodel import costs, presets
from refmodel.model import Block

RUNNABLE = ("tiny", "small", "medium", "bench", "byte-micro", "byte-draft", "byte-target",
            "byte-target-moe", "llama-309m")
REAL = tuple(n for n in presets.names() if n not in RUNNABLE)


def rounded(x: float, unit: float) -> float:
    return round(x / unit) * unit


@pytest.mark.parametrize("name, total", [
    ("gpt2", 124_439_808), ("gemma2-9b", 9_242_164_736), ("gemma2-27b", 27_227_718_144)])
def test_exact_published_totals(name, total):
    assert costs.param_counts(presets.get(name))["total"] == total


@pytest.mark.parametrize("name, field, published, unit", [
    ("gpt-oss-120b", "total", 116.83e9, 1e7),
    ("gpt-oss-120b", "active_without_embedding", 5.13e9, 1e7),
    ("gpt-oss-20b", "total", 20.91e9, 1e7),
    ("gpt-oss-20b", "active_without_embedding", 3.61e9, 1e7),
    ("mixtral-8x7b", "total", 46.7e9, 1e8),
    ("mixtral-8x7b", "active", 12.9e9, 1e8),
    ("deepseek-v3", "total", 671e9, 1e9),
    ("qwen3-30b-a3b", "total", 30.5e9, 1e8),
    ("qwen3-30b-a3b", "non_embedding", 29.9e9, 1e8),
])
def test_published_totals_within_rounding(name, field, published, unit):
    assert rounded(costs.param_counts(presets.get(name))[field], unit) == pytest.approx(
        published)


def test_gpt_oss_card_breakdown():
    """Card Table 1 (120b): MLP 114.71B, attention 0.96B, embed + unembed 1.16B."""
    comp = costs.param_counts(presets.get("gpt-oss-120b"))["components"]
    mlp = comp["router"] + comp["routed_experts"]
    assert rounded(mlp, 1e7) == pytest.approx(114.71e9)
    assert rounded(comp["attention"], 1e7) == pytest.approx(0.96e9)
    assert rounded(comp["embedding"] + comp["lm_head"], 1e7) == pytest.approx(1.16e9)


@pytest.mark.parametrize("name", presets.names())
def test_breakdown_sums_and_sources(name):
    counts = costs.param_counts(presets.get(name))
    assert sum(counts["components"].values()) == counts["total"]
    assert counts["non_embedding"] <= counts["active_without_embedding"] + counts[
        "components"]["routed_experts"]
    assert counts["active"] <= counts["total"]
    if name in REAL:  # a citation travels with every real preset
        assert name in presets.PRESET_SOURCES and len(presets.source(name)) > 80


def test_layer_patterns_of_hybrid_presets():
    def count(name, kind):
        return presets.get(name).layer_kinds.count(kind)

    assert (count("gemma3-27b", "sliding"), count("gemma3-27b", "gqa")) == (52, 10)
    assert (count("gemma2-9b", "sliding"), count("gemma2-9b", "gqa")) == (21, 21)
    assert presets.get("gpt-oss-120b").layer_kinds[:2] == ("sliding", "gqa")
    assert (count("qwen3-next-80b-a3b", "linear"), count("qwen3-next-80b-a3b", "gqa")) == (36,
                                                                                           12)
    nemo = presets.get("nemotron-h-8b")
    assert (count("nemotron-h-8b", "linear"), count("nemotron-h-8b", "gqa")) == (24, 4)
    assert nemo.layer_ffns.count("dense") == 24
    assert all((k == "none") != (f == "none") for k, f in zip(nemo.layer_kinds,
                                                               nemo.layer_ffns, strict=True))
    v3 = presets.get("deepseek-v3")
    assert v3.layer_ffns[:4] == ("dense", "dense", "dense", "moe")


# The parameter tree under eval_shape ------------------------------------------------------------
#
# Building a whole model under nnx.eval_shape costs time quadratic in its depth here (each
# parameter's RNG draw walks the trace built so far), so models deeper
# than FULL_DEPTH are built block by block: every distinct (mixer, FFN) block once, plus the
# embedding, final norm and head of a one-layer model. `test_blockwise_equals_whole_model`
# shows the two agree.

FULL_DEPTH = 24


def tree_size(make) -> int:
    abstract = nnx.eval_shape(make)
    return sum(math.prod(x.shape) for x in jax.tree.leaves(nnx.state(abstract, nnx.Param)))


def whole_model_size(cfg) -> int:
    return tree_size(lambda: refmodel.Transformer(cfg, rngs=nnx.Rngs(0)))


def blockwise_size(cfg) -> int:
    sizes = {}
    for i, key in enumerate(zip(cfg.layer_kinds, cfg.layer_ffns, strict=True)):
        if key not in sizes:
            sizes[key] = tree_size(lambda i=i: Block(cfg, i, rngs=nnx.Rngs(0)))
    blocks = sum(sizes[key] for key in zip(cfg.layer_kinds, cfg.layer_ffns, strict=True))
    # a one-layer shell: its pattern cut to its one layer (a longer pattern is refused)
    one = cfg.replace(n_layers=1, first_dense_layers=min(cfg.first_dense_layers, 1),
                      layer_pattern=cfg.layer_pattern and cfg.layer_pattern[:1],
                      ffn_pattern=cfg.ffn_pattern and cfg.ffn_pattern[:1])
    shell = whole_model_size(one) - tree_size(lambda: Block(one, 0, rngs=nnx.Rngs(0)))
    return shell + blocks


@pytest.mark.parametrize("name", presets.names())
def test_param_tree_matches_analytic_total(name):
    cfg = presets.get(name)
    size = whole_model_size(cfg) if cfg.n_layers <= FULL_DEPTH else blockwise_size(cfg)
    assert size == costs.param_counts(cfg)["total"]


def test_blockwise_equals_whole_model():
    cfg = presets.get("gpt-oss-20b")  # alternating mixers, MoE with biases, untied
    assert blockwise_size(cfg) == whole_model_size(cfg)


def test_shared_expert_gate_is_one_weight_per_channel():
    """Qwen3-Next's sigmoid gate on the shared expert: D parameters per MoE layer."""
    base = presets.get("tiny").replace(ffn="moe", n_shared_experts=1)
    gated = base.replace(shared_expert_gate=True)
    extra = base.n_layers * base.d_model
    assert costs.param_counts(gated)["total"] == costs.param_counts(base)["total"] + extra
    assert whole_model_size(gated) == costs.param_counts(gated)["total"]
