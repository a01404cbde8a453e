"""The serving engine on the real model: the serving golden test, paging, no leaks, bad input.

Golden: every request's greedy output from the engine equals `refmodel.generate` on its prompt
alone, for one option set of every registered attention variant (a new variant file is picked
up from the registry) in two hybrid stacks, one with an MoE FFN, in a run
built to force prefix hits, chunked prefill, eviction and preemption - and the test checks that
each of them happened. Prompts have one length so the oracle is one batched `generate`.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import refmodel
from conftest import tiny
from refmodel import kernels
from refmodel.serving import Request
from refmodel.serving.engine import Engine, Layout
from refmodel.serving.steps import bucket

PAGE = 4
PROMPT = 28  # 7 pages; a system prompt of 16 tokens (two variants) + 12 of the request's own
MAX_NEW = 6
MAX_LEN = PROMPT + MAX_NEW  # one view length: one compile per (rows, tokens) shape


def _one_kind_per_variant() -> list[str]:
    seen, kinds = set(), []
    for kind in refmodel.attention.registered():
        cls = refmodel.attention.get(kind)
        if cls not in seen:
            seen.add(cls)
            kinds.append(kind)
    return kinds


def _has_state(kind: str) -> bool:
    return Layout.of(tiny(attention=kind), PAGE).has_state


# Two stacks hold one kind of every variant (a newly registered one joins its stack), each one
# compile: the paged kinds in one model (ring slots and pages in one pool) with a MoE FFN that
# sees padding rows and padded prefill tokens beside the real ones (its routing must not mix
# them); and the kinds with a recurrent state (a state at the end of a prefix is not cached, so
# the stack of paged kinds is the one that exercises the prefix cache).
_PAGED = tuple(k for k in _one_kind_per_variant() if not _has_state(k))
_STATEFUL = tuple(k for k in _one_kind_per_variant() if _has_state(k))
CASES = {"paged kinds, moe": {"layer_pattern": _PAGED, "n_layers": len(_PAGED), "ffn": "moe"},
         "stateful kinds": {"layer_pattern": _STATEFUL, "n_layers": len(_STATEFUL)}}


def requests(cfg, n: int = 8, seed: int = 0) -> list[Request]:
    """n requests, all PROMPT long: two system prompts (so cached leaves compete), own tails."""
    rng = np.random.default_rng(seed)
    systems = rng.integers(0, cfg.vocab_size, (2, 16))
    out = []
    for i in range(n):
        tail = rng.integers(0, cfg.vocab_size, PROMPT - 16)
        prompt = np.concatenate([systems[i % 2], tail])
        out.append(Request(i, tuple(prompt), int(rng.integers(2, MAX_NEW + 1)), arrival=0.0))
    return out


def oracle(model, reqs: list[Request]) -> dict[int, list[int]]:
    prompts = jnp.asarray([r.prompt for r in reqs], jnp.int32)
    out = np.asarray(refmodel.generate(model, prompts, MAX_NEW))[:, PROMPT:]
    return {r.id: out[i, :r.max_new_tokens].tolist() for i, r in enumerate(reqs)}


def assert_no_leak(engine: Engine) -> None:
    """Every page free or cached, every reference count zero; evicting the cache frees all."""
    counts = engine.pool.check()
    assert counts["used"] == 0 and all(r == 0 for r in engine.pool.ref)
    assert not engine.pool.sequences
    if engine.cache is not None:
        engine.cache.check()
        assert engine.cache.evict(engine.pool.num_pages) == counts["cached"]
    assert engine.pool.free_pages == engine.pool.num_pages


@pytest.mark.parametrize("case", list(CASES))
def test_engine_equals_generate(case):
    cfg = tiny(**CASES[case])
    model = refmodel.init(cfg, seed=0)
    reqs = requests(cfg)
    # 3 running sequences need up to 3 x 9 pages; 16 pages force preemption, and cached
    # system prompts of two kinds force eviction. A budget of 10 tokens chunks every prompt.
    engine = Engine(model, num_pages=16, page_size=PAGE, policy="mixed", token_budget=10,
                    max_running=3, max_len=MAX_LEN, shapes="fixed")
    run = engine.run(reqs)
    assert run.outputs == oracle(model, reqs)
    assert run.preemptions > 0, "the run was meant to preempt"
    chunks = {}
    for step in run.steps:
        for seq, _ in step.prefill:
            chunks[seq] = chunks.get(seq, 0) + 1
    assert max(chunks.values()) >= 3, "prompts were meant to be prefilled in chunks"
    if engine.layout.has_state:
        assert not run.prefix_cache  # a state at the end of a prefix is not kept
    else:
        assert run.prefix_cache and run.hit_tokens >= 16, "system prompts were meant to hit"
        assert run.evicted_pages > 0, "the pool was meant to evict cached prefixes"
    assert_no_leak(engine)


@pytest.mark.parametrize(("attention", "native"), [  # latent [B, S, R]; head-major k, v
    ("mla", False), ("gqa", False),
    pytest.param("gqa", True, marks=pytest.mark.skipif(not kernels.available(),
                                                        reason="native kernels not built"))])
def test_decode_through_pages_equals_contiguous_decode(attention, native):
    """Pages in scrambled order gather to the contiguous cache exactly (XLA's gather or the
    native kernel), and one decode step through them gives the contiguous decode's logits
    and cache."""
    cfg = tiny(attention=attention)
    model = refmodel.init(cfg, seed=0)
    B, S = 2, 3 * PAGE + 1
    toks = jax.random.randint(jax.random.key(3), (B, S + 1), 0, cfg.vocab_size, jnp.int32)
    cache = refmodel.init_cache(cfg, B, 4 * PAGE)
    _, cache = refmodel.prefill(model, toks[:, :S], cache)
    layout = Layout.of(cfg, PAGE, native=native)
    arrays = list(layout.allocate(num_pages=12))
    tables = np.array([[5, 0, 9, 2], [7, 11, 1, 3]], np.int32)  # 4 pages = 16 slots per row
    flat = [jax.tree.leaves(layer) for layer in cache.layers]
    for k, lf in enumerate(layout.leaves):
        x = flat[lf.layer][lf.index]  # [B, ...pre, 16, ...post]
        x = x.reshape(*x.shape[:lf.axis], 4, PAGE, *x.shape[lf.axis + 1:])
        arrays[k] = arrays[k].at[tables].set(jnp.moveaxis(x, lf.axis, 1))  # [B, 4, ...page]
    slots = np.zeros((B,), np.int32)
    fresh = np.zeros((B,), bool)
    gathered = [layout.gather(tuple(arrays), layout.initial_states(cfg), tables, slots, fresh,
                              i) for i in range(cfg.n_layers)]
    for a, b in zip(jax.tree.leaves(gathered), jax.tree.leaves(cache.layers), strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))

    want, cache2 = refmodel.decode_step(model, toks[:, S], cache)
    from flax import nnx

    from refmodel.serving import engine as eng
    graphdef, state = nnx.split(model)
    weights, statedef = jax.tree.flatten(state)
    start = np.full((B,), S, np.int32)
    token, new_arrays = eng.step_fn(graphdef, statedef, layout, True)(weights, tuple(arrays),
                                  layout.initial_states(cfg), np.asarray(toks[:, S:S + 1]),
                                  tables, slots, start, np.ones((B,), np.int32), fresh,
                                  jnp.float32(1.0), jax.random.split(jax.random.key(0), B))
    np.testing.assert_array_equal(np.asarray(token), np.asarray(jnp.argmax(want, -1)))
    page, off = tables[:, S // PAGE], S % PAGE
    flat2 = [jax.tree.leaves(layer) for layer in cache2.layers]
    for k, lf in enumerate(layout.leaves):
        got = new_arrays[k][eng.token_index(lf, page, off)]  # the token written at S
        exp = jnp.moveaxis(flat2[lf.layer][lf.index], lf.axis, 1)[:, S]
        np.testing.assert_allclose(np.asarray(got), np.asarray(exp), rtol=1e-5, atol=1e-5)


def test_layout_pages_tokens_and_slots_states():
    gqa = Layout.of(tiny(attention="gqa"), PAGE)
    assert not gqa.has_state and all(lf.axis == 2 for lf in gqa.leaves)  # k, v [B, K, S, H]
    assert gqa.slot_pages() == 1
    cfg = tiny(attention="gqa", layer_pattern=("sliding", "gqa"))
    hybrid = Layout.of(cfg, PAGE)
    states = [lf for lf in hybrid.leaves if lf.axis is None]
    assert {lf.layer for lf in states} == {0} and hybrid.has_state
    # the ring (K, V of W tokens + W positions) costs as many pages as its bytes need
    W, K, H = cfg.window, cfg.n_kv_heads, cfg.d_model // cfg.n_heads
    page_bytes = 2 * PAGE * K * H * 4  # layer 1's k and v pages
    assert hybrid.page_bytes() == page_bytes
    assert hybrid.state_bytes() == 2 * W * K * H * 4 + 4 * W
    assert hybrid.slot_pages() == -(-hybrid.state_bytes() // page_bytes)
    assert [bucket(n) for n in (0, 1, 2, 3, 8, 9)] == [1, 1, 2, 4, 8, 16]


def test_temperature_sampling_is_per_request():
    """Sampled tokens depend on (seed, request, index), not on which requests share a batch."""
    cfg = tiny()
    model = refmodel.init(cfg, seed=0)
    reqs = requests(cfg, n=4)

    def serve(rs):
        e = Engine(model, num_pages=40, page_size=PAGE, max_running=4, max_len=MAX_LEN,
                   shapes="fixed", temperature=1.0, seed=7)
        return e.run(rs).outputs

    alone = {r.id: serve([r])[r.id] for r in reqs[:2]}
    together = serve(reqs)
    assert {i: together[i] for i in alone} == alone
    greedy = Engine(model, num_pages=40, page_size=PAGE, max_running=4, max_len=MAX_LEN,
                    shapes="fixed").run(reqs).outputs
    assert together != greedy  # temperature 1 over 256 tokens: sampling changed something


def test_bad_input_is_a_clear_error():
    cfg = tiny()
    model = refmodel.init(cfg, seed=0)
    with pytest.raises(ValueError, match="num_pages=0"):
        Engine(model, num_pages=0)
    with pytest.raises(ValueError, match="page_size"):
        Engine(model, num_pages=4, page_size=0)
    with pytest.raises(ValueError, match="temperature"):
        Engine(model, num_pages=4, temperature=-1.0)
    with pytest.raises(ValueError, match="prefix_cache=True"):
        Engine(refmodel.init(tiny(attention="linear"), seed=0), num_pages=4, prefix_cache=True)
    engine = Engine(model, num_pages=4, page_size=PAGE, max_len=64)
    long = Request(0, tuple(range(20)), 4)  # 24 tokens > 4 pages of 4
    with pytest.raises(ValueError, match="the pool has only 4"):
        engine.run([long])
    with pytest.raises(ValueError, match="vocabulary"):
        engine.run([Request(1, (cfg.vocab_size,), 1)])
    with pytest.raises(ValueError, match="max_len=64"):
        engine.run([Request(2, tuple(range(60)), 8)])
    learned = refmodel.init(dataclasses.replace(cfg, position="learned", max_position=16),
                            seed=0)
    with pytest.raises(ValueError, match="max_position=16"):
        Engine(learned, num_pages=40, page_size=PAGE).run([Request(3, tuple(range(14)), 4)])


@pytest.fixture(scope="module")
def tiny_model():
    return refmodel.init(tiny(), seed=0)


@pytest.mark.parametrize(("kwargs", "shown"), [
    # a float count ran as if rounded up (max_running=2.5 ran 3 rows) or failed mid-run with
    # an unnamed TypeError (shapes="fixed", warmup); now each is refused when the engine is made
    ({"max_running": 2.5}, "max_running=2.5 (float): must be an integer >= 1"),
    ({"max_running": 2.5, "shapes": "fixed", "max_len": 32}, "max_running=2.5"),
    ({"token_budget": 4.5}, "token_budget=4.5 (float): must be an integer >= 1"),
    ({"max_running": True}, "max_running=True (bool): must be an integer >= 1"),
    ({"token_budget": False}, "token_budget=False (bool)"),
    ({"num_pages": 8.0}, "num_pages=8.0 (float)"),
    ({"page_size": True}, "page_size=True (bool)"),
    ({"max_len": 31.5}, "max_len=31.5 (float)"),
    ({"array_pages": 40.0}, "array_pages=40.0 (float)"),
    ({"seed": 0.5}, "seed=0.5 (float): must be an integer"),
    ({"temperature": True}, "temperature=True must be a finite number >= 0"),
    ({"prefix_cache": 1}, "prefix_cache=1: choose one of (True, False, None)"),
    ({"cache_aware": "yes"}, "cache_aware='yes': choose one of (True, False)"),
])
def test_engine_numeric_fields_are_checked_at_construction(tiny_model, kwargs, shown):
    with pytest.raises(ValueError) as err:
        Engine(tiny_model, **{"num_pages": 32, "page_size": PAGE, **kwargs})
    assert shown in str(err.value)


def test_numpy_integers_are_counts(tiny_model):
    e = Engine(tiny_model, num_pages=np.int64(32), page_size=np.int32(PAGE),
               max_running=np.int64(2), token_budget=np.int64(16), max_len=np.int64(32),
               shapes="fixed")
    assert e.scheduler.max_running == 2 and type(e.scheduler.max_running) is int


@pytest.mark.parametrize(("args", "shown"), [
    # float ids were truncated ((1.5, 2.9) served as (1, 2)) and bools passed as 0/1
    ((0, (1.5, 2.9), 2), "request 0: prompt[0]=1.5 (float) is not a token id"),
    ((0, (3, True), 2), "request 0: prompt[1]=True (bool) is not a token id"),
    ((0, (3, "4"), 2), "request 0: prompt[1]='4' (str) is not a token id"),
    ((0, "34", 2), "request 0: prompt='34' must be a sequence of integer token ids"),
    ((0, (3, -1), 2), "request 0: prompt[1]=-1 is a negative token id"),
    ((0, (), 2), "request 0: prompt is empty"),
    ((0, (3,), True), "request 0: max_new_tokens=True (bool): must be an integer >= 1"),
    ((0, (3,), 2.0), "request 0: max_new_tokens=2.0 (float)"),
    ((1.5, (3,), 2), "Request id=1.5 (float): must be an integer"),
    ((0, (3,), 2, True), "request 0: arrival=True must be a finite number of seconds >= 0"),
    ((0, (3,), 2, float("nan")), "request 0: arrival=nan"),
])
def test_request_fields_are_checked_when_made(args, shown):
    with pytest.raises(ValueError) as err:
        Request(*args)
    assert shown in str(err.value)
    ok = Request(np.int64(4), np.array([1, 2], np.int32), np.int64(3), np.float32(0.5))
    assert ok.prompt == (1, 2) and all(type(t) is int for t in ok.prompt)
    assert (type(ok.id), type(ok.max_new_tokens), type(ok.arrival)) == (int, int, float)
