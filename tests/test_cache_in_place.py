"""The decode step writes its KV cache in place: the compiled step holds no copy of a whole
cache array (a copy is a read and a write of the whole cache per step, more bytes than the
attention itself reads).

The cause of the copies it once had, at batch 1 on XLA:CPU (jax 0.10.2): a dot whose operand
is the just-written cache with its batch axis of 1 dropped (a bitcast). `dynamic_update_slice`
then a batched einsum over it, alone in a 4-line jitted function with the cache donated,
compiles to 4 copies at batch 1 and none at batch 2; the same cache with no batch axis
compiles to none (`test_the_trigger_alone` keeps that reproduction). Dumping XLA's passes
(`--xla_dump_hlo_pass_re=.*`) shows how: the dot becomes a library (YNNPACK) fusion that
takes the bitcast as its operand, the fusion pass then fuses the write into that bitcast as
well as into the returned cache (the write emitted twice, both in place on the donated
buffer), and copy insertion resolves the interference with copies: each K and V cache 4 times
per step (llama-309m at context 2048: 99.5 ms per step against 44.5 ms at context 128).
A scatter, a per-row loop, a scalar start, an optimization barrier (XLA:CPU removes it before
copy insertion), a reshape, dot_general or a vmap in place of the einsum, or batch merged with
the KV heads, all kept copies.

The fix (`refmodel.backends.xla.attend_summed`): at batch 1, a decode step over its own
just-written cache computes both products as a broadcast multiply and a sum, a reduce fusion
that reads the written cache directly: no copy, and llama-309m's step at context 2048 went from
98-146 ms to 61 ms (best of 10, on a machine shared with other runs). Batch 2 and up keep the
einsums. MHA (G = 1, where the sum is ~50x slower than the einsum) and MLA's absorbed form
still copy at batch 1: 16 whole-cache copies in `tiny`'s decode step, not asserted here."""

from __future__ import annotations

import re

import jax
import jax.numpy as jnp
import pytest

import refmodel
from conftest import assert_golden, tiny
from refmodel import backends, compiler_check, kernels


def whole_cache_copies(cfg, batch: int, context: int) -> int:
    copies, arrays = compiler_check.cache_copies(refmodel.Phases(refmodel.init(cfg, seed=0)),
                                                 batch, context)
    assert arrays, "no cache arrays found in the decode step's arguments"
    return copies


def test_the_cache_is_written_in_place_at_batch_2():
    assert whole_cache_copies(tiny(), 2, 16) == 0


@pytest.mark.parametrize("changes", [{}, {"attention": "mqa"}, {"attention": "sliding"},
                                     {"attn_sinks": True, "attn_softcap": 20.0}])
def test_the_cache_is_written_in_place_at_batch_1(changes):
    assert whole_cache_copies(tiny(**changes), 1, 16) == 0


@pytest.mark.parametrize("changes", [{}, {"attention": "mqa"}, {"attention": "sliding"},
                                     {"attn_sinks": True, "attn_softcap": 20.0}])
def test_batch_1_decode_equals_forward(changes):
    """The golden check (tests/test_golden.py runs batch 2) on the batch-1 path."""
    W = tiny().window
    assert_golden(tiny(**changes), 1, 3 * W + 2, [3, W + 3, W + 1])


def test_the_trigger_alone():
    """The 4-line reproduction: copies at batch 1 only, none without the batch axis."""

    def step(cache, k, q, pos):  # write one key, then read every key
        start = (0,) * (cache.ndim - 2) + (pos, 0)
        new = jax.lax.dynamic_update_slice(cache, k, start)
        sub = "bkgh,bksh->bkgs" if cache.ndim == 4 else "kgh,ksh->kgs"
        return jnp.einsum(sub, q, new), new

    def copies(lead: tuple) -> int:
        cache, k, q = (jnp.zeros(lead + (4, 33, 8)), jnp.ones(lead + (4, 1, 8)),
                       jnp.ones(lead + (4, 2, 8)))
        text = jax.jit(step, donate_argnums=0).lower(cache, k, q, jnp.int32(5)).compile()
        return len(re.findall(r"\} copy\(", text.as_text()))

    assert copies((2,)) == 0 and copies(()) == 0
    assert copies((1,)) > 0  # the XLA behaviour this file documents; fails when it is fixed


@pytest.mark.skipif(not kernels.available(), reason="native kernels not built")
@pytest.mark.parametrize("kind", ["gqa", "mha"])
def test_a_native_model_attends_over_its_cache_in_place(kind):
    """backend="native": the decode step's attention is the paged kernel over the cache as one
    page per sequence, which reads the written cache where it lies: no copy at batch 1 either,
    MHA included (XLA's path copies MHA's cache there)."""
    model = backends.use(refmodel.init(tiny(attention=kind), seed=0), "native")
    for batch in (1, 3):
        copies, arrays = compiler_check.cache_copies(refmodel.Phases(model), batch, 16)
        assert arrays and copies == 0
