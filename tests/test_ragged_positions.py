"""Positions per sequence, the ground continuous batching stands on: rows of one batch at
their own positions give, row by row, the logits each sequence gets alone.

For every option set of every registered variant (`refmodel.attention.option_sets`) and the
learned absolute positions of GPT-2: three sequences are grown alone (batch 1) to different
lengths, one past the sliding window's wrap-around, and their caches stacked row-wise into
one batch-3 cache whose `pos` holds three different positions. The batch then takes a
prefill chunk (a start per row, the same T for every row) and decode steps together; each
row's logits must equal those of its sequence continued alone, in float32.

"Alone" is a batch holding nothing but copies of one sequence (every row at one position, as
before positions were per row), fed token by token through the decode step: prefill equals
decode token by token by the golden test, and one batch size keeps each config to two
compiles (decode and prefill at batch 3), most of this file's time; one layer halves them
(a layer's positions do not depend on the layers before it). Tokens and the stacking stay in
NumPy so that no eager op compiles.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import assert_logits_close, tiny, tokens

import refmodel
from refmodel import kernels
from refmodel.phases import Phases

W = tiny().window
LENGTHS = (1, 4, W + 2)  # the last row's ring has wrapped; the others' have not
CHUNK, STEPS = 3, 3  # then a prefill chunk of CHUNK tokens and STEPS decode steps
MAX_LEN = max(LENGTHS) + CHUNK + STEPS
CONFIGS = dict(refmodel.attention.option_sets())
CONFIGS["mha, learned positions"] = {"attention": "mha", "position": "learned"}
# A native model's decode attends in the kernel over each row's first min(p + 1, S) slots:
# GQA's cache, and the sliding ring (whose written slots are its first ones, in any order).
NATIVE = {f"{kind}, native kernels": {"attention": kind, "backend": "native"}
          for kind in ("gqa", "sliding")}
CASES = [*CONFIGS, *(pytest.param(label, marks=pytest.mark.skipif(
    not kernels.available(), reason="native kernels not built")) for label in NATIVE)]


def decoded(ph, cache, toks):
    """Feed toks [B, L] (NumPy) one token at a time -> (logits [B, L, V] NumPy, cache)."""
    out = []
    for t in range(toks.shape[1]):
        logits, cache = ph.jitted["decode"](ph.state, toks[:, t], cache)
        out.append(np.asarray(logits)[:, None])
    return np.concatenate(out, axis=1), cache


def rows(caches, picks):
    """Row picks[i] of caches[i], stacked into one cache with a row per sequence (every leaf's
    axis 0), in new buffers."""
    return jax.tree.map(lambda *leaves: jnp.asarray(np.concatenate(
        [np.asarray(a)[b:b + 1] for a, b in zip(leaves, picks, strict=True)])), *caches)


@pytest.mark.parametrize("label", CASES)
def test_rows_at_their_own_positions_equal_each_alone(label):
    cfg = tiny(n_layers=1, **{**CONFIGS, **NATIVE}[label])
    ph = Phases(refmodel.init(cfg, seed=0))
    B = len(LENGTHS)
    toks = np.asarray(tokens(cfg, B, max(LENGTHS), seed=2))
    new = np.asarray(tokens(cfg, B, CHUNK + STEPS, seed=3))  # [B, CHUNK + STEPS]
    alone = [decoded(ph, refmodel.init_cache(cfg, B, MAX_LEN),
                     np.repeat(toks[b:b + 1, :n], B, 0))[1]
             for b, n in enumerate(LENGTHS)]  # B copies of sequence b
    batch = rows(alone, range(B))  # row b of alone[b]: the copies can still be continued
    np.testing.assert_array_equal(np.asarray(batch.pos), LENGTHS)  # [B]
    first, batch = ph.jitted["prefill"](ph.state, new[:, :CHUNK], batch)  # starts [B]
    rest, batch = decoded(ph, batch, new[:, CHUNK:])
    got = np.concatenate([np.asarray(first), rest], axis=1)  # [B, CHUNK + STEPS, V]
    np.testing.assert_array_equal(np.asarray(batch.pos), np.add(LENGTHS, CHUNK + STEPS))
    for b, cache in enumerate(alone):
        want, _ = decoded(ph, cache, np.repeat(new[b:b + 1], B, 0))
        assert_logits_close(got[b], want[b])


def test_init_cache_gives_a_position_per_row():
    cache = refmodel.init_cache(tiny(attention="sliding"), 3, 8)
    assert cache.pos.shape == (3,) and cache.pos.dtype == jnp.int32
    assert cache.layers[0].pos.shape == (3, W)  # the ring's slot positions, per row


def test_capacity_check_uses_the_furthest_row():
    cfg = tiny()
    model = refmodel.init(cfg)
    cache = refmodel.init_cache(cfg, 2, 6).replace(pos=jnp.asarray([1, 5], jnp.int32))
    with pytest.raises(ValueError, match="max_len=6"):
        refmodel.decode_step(model, jnp.zeros((2,), jnp.int32), cache.replace(
            pos=jnp.asarray([1, 6], jnp.int32)))
    with pytest.raises(ValueError, match="5 \\+ 2 tokens"):
        refmodel.prefill(model, jnp.zeros((2, 2), jnp.int32), cache)
