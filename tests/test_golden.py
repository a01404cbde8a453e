"""The golden test: one full causal forward == prefill of a prefix + token-by-token decode.

It runs over every registered attention kind (so a new variant file is covered the moment it
registers), dense and MoE, and over hybrid layer patterns; windows are exercised past
wrap-around (the sequence is 3x the tiny window) and prefill is also done in chunks.
"""

from __future__ import annotations

import pytest
from conftest import assert_close, incremental_logits, tiny, tokens

import refmodel

KINDS = refmodel.attention.registered()
LENGTH = 3 * tiny().window + 2  # past a sliding window's wrap-around


@pytest.mark.parametrize("ffn", ["dense", "moe"])
@pytest.mark.parametrize("kind", KINDS)
def test_forward_equals_prefill_then_decode(kind, ffn):
    cfg = tiny(attention=kind, ffn=ffn)
    model = refmodel.init(cfg, seed=0)
    toks = tokens(cfg, 2, LENGTH)
    full = refmodel.forward(model, toks)
    assert full.shape == (2, LENGTH, cfg.vocab_size)
    assert_close(incremental_logits(model, toks, [5]), full)


@pytest.mark.parametrize("kind", KINDS)
def test_chunked_prefill_equals_forward(kind):
    """Chunks shorter and longer than the window, on a cache that already holds tokens."""
    cfg = tiny(attention=kind)
    model = refmodel.init(cfg, seed=1)
    toks = tokens(cfg, 2, LENGTH, seed=2)
    full = refmodel.forward(model, toks)
    chunks = [3, cfg.window + 3, LENGTH - cfg.window - 6]
    assert_close(incremental_logits(model, toks, chunks), full)


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
    pattern = tuple(k for k in PATTERNS[name] if k in KINDS or k == "none")
    if not pattern:
        pytest.skip(f"kinds of {name} not registered")
    cfg = tiny(layer_pattern=pattern, n_layers=len(pattern), ffn=ffn,
               ffn_pattern=("moe" if ffn == "moe" else "dense", "none") if "none" in pattern
               else None)
    assert cfg.layer_kinds == pattern
    model = refmodel.init(cfg, seed=3)
    toks = tokens(cfg, 1, LENGTH, seed=4)
    assert_close(incremental_logits(model, toks, [4, 9]), refmodel.forward(model, toks))
