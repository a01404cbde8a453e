"""The public calls' fast path: a split kept per model that is never stale, and a room check
that reads nothing from the device.

`refmodel.api` keeps each model's split and trusts, for a cache it returned itself, the
position it counted on the host. Each test here changes what that trust rests on (weights set
in place, replaced by `nnx.update`, modules and Variables swapped, a cache edited with
`replace`) and asserts the answer follows; the last two assert that a warmed-up decode step
neither splits the module nor reads the cache's position from the device.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import refmodel
from conftest import tiny
from refmodel import api, phases


def fresh_logits(model, tokens, cache):
    """The decode step's logits from a split made now (the slow path, never stale)."""
    graphdef, state = nnx.split(model)
    return phases.jitted("decode", graphdef)(state, jnp.asarray(tokens, jnp.int32), cache)[0]


def copy(cache):
    return jax.tree.map(lambda a: jnp.array(a, copy=True), cache)  # the steps donate theirs


def scale_head_in_place(model, other):
    model.lm_head[...] = 3.0 * model.lm_head[...]


def update_from_other(model, other):
    nnx.update(model, nnx.state(other))


def replace_a_variable(model, other):
    model.lm_head = nnx.Param(other.lm_head[...])


def replace_a_module(model, other):
    model.blocks[1] = other.blocks[1]


def replace_a_nested_variable(model, other):
    model.blocks[0].attn.wq = nnx.Param(other.blocks[0].attn.wq[...])


def change_a_static_attribute(model, other):
    model.final_norm.epsilon = 10.0


def replace_the_list_then_a_block(model, other):
    """nnx.List's == compares its items: the new list equals the old one, yet it is the new
    one that the next line changes."""
    model.blocks = nnx.List(list(model.blocks))
    refmodel.forward(model, np.array([[1, 2]]))
    model.blocks[1] = other.blocks[1]


@pytest.mark.parametrize("change", [scale_head_in_place, update_from_other, replace_a_variable,
                                    replace_a_module, replace_a_nested_variable,
                                    change_a_static_attribute, replace_the_list_then_a_block])
def test_a_changed_model_gives_new_logits(change):
    cfg = tiny()
    model, other = refmodel.init(cfg, seed=0), refmodel.init(cfg, seed=1)
    cache = refmodel.init_cache(cfg, 2, 8)
    _, cache = refmodel.prefill(model, [[1, 2, 3], [4, 5, 6]], cache)
    token = np.array([7, 8], np.int32)
    before, _ = refmodel.decode_step(model, token, copy(cache))  # the split is now kept
    change(model, other)
    after, _ = refmodel.decode_step(model, token, copy(cache))
    want = fresh_logits(model, token, copy(cache))
    assert not np.allclose(np.asarray(before), np.asarray(want))  # the change shows
    np.testing.assert_allclose(np.asarray(after), np.asarray(want), rtol=1e-6, atol=1e-6)
    ids = np.array([[1, 2, 3]])
    np.testing.assert_allclose(np.asarray(refmodel.forward(model, ids)),
                               np.asarray(refmodel.forward(nnx.clone(model), ids)),
                               rtol=1e-6, atol=1e-6)


def test_the_room_check_counts_on_the_host_and_still_raises_at_max_len():
    cfg = tiny()
    model = refmodel.init(cfg)
    cache = refmodel.init_cache(cfg, 1, 4)
    _, cache = refmodel.prefill(model, [[1, 2]], cache)
    with pytest.raises(ValueError, match="2 \\+ 3 tokens would pass the cache's max_len=4"):
        refmodel.prefill(model, [[1, 2, 3]], cache)
    with pytest.raises(ValueError, match=r"token\[0\]=999"):
        refmodel.decode_step(model, [999], cache)  # refused before the cache is donated
    for token in (3, 4):
        _, cache = refmodel.decode_step(model, [token], cache)
    with pytest.raises(ValueError, match="4 \\+ 1 tokens would pass the cache's max_len=4"):
        refmodel.decode_step(model, [5], cache)


def test_an_edited_cache_is_checked_again():
    """A cache made from a returned one by `replace` is not trusted: its position is read."""
    cfg = tiny()
    model = refmodel.init(cfg)
    _, cache = refmodel.prefill(model, [[1, 2]], refmodel.init_cache(cfg, 1, 4))
    with pytest.raises(ValueError, match="4 \\+ 1 tokens would pass the cache's max_len=4"):
        refmodel.decode_step(model, [3], cache.replace(pos=jnp.asarray([4], jnp.int32)))
    other = refmodel.init_cache(cfg, 2, 4)
    with pytest.raises(ValueError, match="cache holds 2 sequences .* batch 1"):
        refmodel.decode_step(model, [3], cache.replace(layers=other.layers))


def test_a_returned_cache_is_checked_again_for_another_model_or_batch():
    cfg = tiny()
    model = refmodel.init(cfg)
    _, cache = refmodel.prefill(model, [[1, 2]], refmodel.init_cache(cfg, 1, 8))
    mla = refmodel.init(tiny(attention="mla"))
    with pytest.raises(ValueError, match=r"cache.layers\[0\] is a KVCache.*'mla'"):
        refmodel.decode_step(mla, [3], cache)
    with pytest.raises(ValueError, match="cache holds 1 sequences .* batch 2"):
        refmodel.decode_step(model, [3, 4], cache)


def test_a_warm_decode_step_does_not_split_the_model(monkeypatch):
    cfg = tiny()
    model = refmodel.init(cfg)
    cache = refmodel.init_cache(cfg, 2, 16)
    _, cache = refmodel.prefill(model, np.array([[1, 2], [3, 4]]), cache)
    splits = []
    split = nnx.split
    monkeypatch.setattr(api.nnx, "split", lambda *a, **k: splits.append(1) or split(*a, **k))
    for t in range(3):
        _, cache = refmodel.decode_step(model, np.array([t, t + 1]), cache)
    assert not splits
    model.final_norm = refmodel.init(cfg, seed=3).final_norm
    refmodel.decode_step(model, np.array([1, 2]), cache)
    assert len(splits) == 1  # a changed graph is split again, once


def test_the_room_check_of_a_returned_cache_does_not_read_the_device():
    """The position on the device of a cache the API returned is overwritten behind its back
    (a frozen dataclass, so by object.__setattr__) with one that leaves no room: a step that
    read it would raise. Its host count says there is room, and that is what is checked."""
    cfg = tiny()
    model = refmodel.init(cfg)
    _, cache = refmodel.prefill(model, [[1, 2]], refmodel.init_cache(cfg, 1, 4))
    object.__setattr__(cache, "pos", jnp.asarray([4], jnp.int32))
    logits, cache = refmodel.decode_step(model, [3], cache)  # 2 + 1 <= 4, counted on the host
    assert logits.shape == (1, cfg.vocab_size)
    with pytest.raises(ValueError, match="3 \\+ 2 tokens would pass the cache's max_len=4"):
        refmodel.prefill(model, [[1, 2]], cache)
