"""Speculative decoding: exact against plain decode, rollback exact, rejection sampling exact."""

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import refmodel
from refmodel import attention, costs, presets
from refmodel import speculative as sp
from refmodel.model import init_cache, rollback

TINY = presets.get("tiny")
OPTION_SETS = attention.option_sets()
KINDS = attention.registered()
# Every attention variant, in two hybrid stacks (one compile each, as tests/test_golden.py's
# "every kind"): one layer of every registered kind with the default options (MLA naive,
# linear gated DeltaNet), then the other option sets (MLA absorbed, linear Mamba-2). Each
# layer's cache rolls back through its own variant.
STACKS = {
    "every kind": TINY.replace(layer_pattern=KINDS, n_layers=len(KINDS)),
    "mla absorbed + linear mamba2": TINY.replace(layer_pattern=("mla", "linear"), n_layers=2,
                                                 mla_absorb=True, linear_rule="mamba2"),
}


def test_the_stacks_hold_every_option_set():
    held = {attention.label(cfg.replace(layer_pattern=None, attention=kind))
            for cfg in STACKS.values() for kind in cfg.layer_kinds}
    assert held == set(OPTION_SETS), set(OPTION_SETS) - held


def noisy_copy(model, scale: float, seed: int = 1):
    """The model with every parameter perturbed: a drafter that agrees with it often, not
    always (so rounds accept some proposals and reject the rest)."""
    graphdef, state = nnx.split(model)
    leaves, treedef = jax.tree.flatten(state)
    keys = jax.random.split(jax.random.key(seed), len(leaves))
    noisy = [x + scale * jnp.std(x) * jax.random.normal(k, x.shape, x.dtype)
             if jnp.issubdtype(x.dtype, jnp.floating) else x
             for x, k in zip(leaves, keys, strict=True)]
    return nnx.merge(graphdef, jax.tree.unflatten(treedef, noisy))


@pytest.mark.parametrize("stack", STACKS)
def test_greedy_speculative_equals_plain_decode(stack):
    """Token for token, for every attention variant, with a drafter whose proposals are
    partly accepted (so caches are rolled back by 0 to k - 1 tokens); batch 2, so rows
    accept different counts and sit at different positions."""
    cfg = STACKS[stack]
    target = refmodel.init(cfg, seed=0)
    prompt = np.random.default_rng(0).integers(0, cfg.vocab_size, (2, 9))
    r = sp.generate(target, prompt, 14, sp.Draft(noisy_copy(target, 0.3)), k=3)
    # plain greedy decode's tokens are those whose every token is the argmax of the causal
    # forward over the tokens before it (test_golden: forward == prefill + decode)
    logits = refmodel.forward(target, r.tokens[:, :-1])
    np.testing.assert_array_equal(r.tokens[:, 9:], np.argmax(logits[:, 8:], axis=-1))
    partial = (r.accepted > 0) & (r.accepted < 3)
    assert partial.any() and (r.accepted < 3).any(), r.accepted.T  # rollbacks happened


def test_plain_loop_and_full_acceptance():
    """k=0 is plain decode (one token per pass); the target drafting for itself is accepted
    every time (k + 1 tokens per pass) and the acceptance estimate says 1. (Prompt lookup's
    rounds are checked against plain decode by notebook 09 and by `microbench speculative`.)"""
    target = refmodel.init(TINY, seed=0)
    prompt = np.random.default_rng(1).integers(0, 256, (1, 5))
    plain = np.asarray(refmodel.generate(target, prompt, 10))
    base = sp.generate(target, prompt, 10)
    assert base.k == 0 and base.tokens_per_pass == 1.0 and base.rounds == 9
    np.testing.assert_array_equal(base.tokens, plain)
    same = sp.generate(target, prompt, 10, sp.Draft(target), k=4)
    np.testing.assert_array_equal(same.tokens, plain)
    assert same.acceptance == 1.0 and (same.accepted == 4).all()


@functools.partial(jax.jit, static_argnums=(0, 1))
def _run(graphdef, verify, state, tokens, cache):
    model = nnx.merge(graphdef, state)
    return model.verify(tokens, cache) if verify else model(tokens, cache)


def _live(cache, max_len: int, pos: int):
    """Every cache leaf, with an axis of length max_len cut to the positions < pos (entries
    past a row's position are masked by position, whatever they hold)."""
    def cut(a):
        axes = [i for i, n in enumerate(a.shape) if n == max_len and i > 0]
        return a if not axes else jnp.take(a, jnp.arange(pos), axis=axes[0])
    return jax.tree.map(cut, cache.layers)


@pytest.mark.parametrize("stack", STACKS)
def test_rollback_equals_a_run_that_never_saw_the_rejected_tokens(stack):
    """Verify a chunk of 4 tokens, keep the first 1 and 3 (one row each): every layer's cache
    (full KV, MLA's latent, the sparse indexer's keys, the sliding ring, the recurrent state
    and its conv window) equals that of a run fed only the kept tokens, and so does the next
    decode step."""
    cfg = STACKS[stack]
    g, state = nnx.split(refmodel.init(cfg, seed=0))
    rng = np.random.default_rng(2)
    prompt = jnp.asarray(rng.integers(0, 256, (2, 11)), jnp.int32)  # past the window of 8
    chunk = jnp.asarray(rng.integers(0, 256, (2, 4)), jnp.int32)
    max_len, keep = 23, jnp.asarray([1, 3], jnp.int32)
    _, before = _run(g, False, state, prompt, init_cache(cfg, 2, max_len))
    _, after, snaps = _run(g, True, state, chunk, before)
    rolled = jax.jit(rollback, static_argnums=0)(cfg, before, after, snaps, keep)
    np.testing.assert_array_equal(rolled.pos, [12, 14])
    nxt = jnp.asarray([[5], [7]], jnp.int32)
    logits, _ = _run(g, False, state, nxt, rolled)
    # the runs that never saw the rejected tokens: both rows fed the first n tokens of their
    # chunk, for each row's n (batch 2 throughout: the shapes compiled above, and one more)
    for b in range(2):
        n = int(keep[b])
        _, clean = _run(g, False, state, chunk[:, :n], before)
        row = jax.tree.map(lambda a, b=b: a[b:b + 1], rolled)
        clean_row = jax.tree.map(lambda a, b=b: a[b:b + 1], clean)
        for got, want in zip(jax.tree.leaves(_live(row, max_len, 11 + n)),
                             jax.tree.leaves(_live(clean_row, max_len, 11 + n)), strict=True):
            np.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-5)
        want_logits, _ = _run(g, False, state, nxt, clean)
        np.testing.assert_allclose(logits[b], want_logits[b], rtol=1e-4, atol=1e-4)


# Chi-square critical value for 4 degrees of freedom at a false-failure rate of 0.1%
# (tables; scipy.stats.chi2.ppf(0.999, 4) = 18.467). The seed is fixed, so the test is
# deterministic; the rate says how often a correct sampler would fail with another seed.
CHI2_4DOF_999 = 18.467


def _chi2(samples: np.ndarray, p: np.ndarray) -> float:
    counts = np.bincount(samples, minlength=p.size)
    expected = samples.size * p
    return float(((counts - expected) ** 2 / expected).sum())


def test_rejection_sampling_emits_the_target_distribution():
    """V = 5, k = 2, fixed target p_0..p_2 and drafter q_1, q_2 far from them: over 40,000
    rounds the first emitted token follows p_0 and, where the first proposal was accepted,
    the second follows p_1 (chi-square at a 0.1% false-failure rate). The same test rejects
    the naive sampler that accepts every proposal (its first token follows q)."""
    V, k, B = 5, 2, 40_000
    p = np.array([[.5, .2, .1, .1, .1], [.05, .05, .1, .3, .5], [.2, .2, .2, .2, .2]])
    q = np.array([[.1, .1, .2, .3, .3], [.4, .3, .1, .1, .1]])
    key_d, key_a = jax.random.split(jax.random.key(0))
    draft = jax.random.categorical(key_d, jnp.log(jnp.asarray(q)), shape=(B, k)).astype(
        jnp.int32)
    logits = jnp.broadcast_to(jnp.log(jnp.asarray(p, jnp.float32)), (B, k + 1, V))
    qs = jnp.broadcast_to(jnp.asarray(q, jnp.float32), (B, k, V))
    n, out = jax.jit(sp.accept)(logits, draft, qs, 1.0, key_a)
    n, out = np.asarray(n), np.asarray(out)
    assert _chi2(out[:, 0], p[0]) < CHI2_4DOF_999
    assert _chi2(out[n >= 1, 1], p[1]) < CHI2_4DOF_999
    # acceptance of the first proposal: sum_x min(p, q) = 0.1 + 0.1 + 0.1 + 0.1 + 0.1
    assert abs((n >= 1).mean() - np.minimum(p[0], q[0]).sum()) < 0.01
    assert _chi2(np.asarray(draft[:, 0]), p[0]) > CHI2_4DOF_999  # the naive sampler fails


def test_prompt_lookup_proposes_what_followed_the_last_match():
    hist = jnp.asarray([[1, 2, 3, 9, 8, 1, 2, 3, 0, 0, 0],
                        [4, 5, 6, 7, 1, 2, 3, 4, 0, 0, 0]], jnp.int32)
    length = jnp.asarray([8, 8], jnp.int32)
    lookup = jax.jit(sp.lookup, static_argnums=(2, 3))
    props = np.asarray(lookup(hist, length, 3, 3))
    np.testing.assert_array_equal(props[0], [9, 8, 1])  # after the earlier "1 2 3"
    np.testing.assert_array_equal(props[1], [5, 6, 7])  # "4" matched alone, at position 0
    none = np.asarray(lookup(jnp.asarray([[1, 2, 3, 0]]), jnp.asarray([3]), 2, 2))
    np.testing.assert_array_equal(none[0], [3, 3])  # no match: the last token repeated


def test_bad_speculative_input_is_named():
    target = refmodel.init(dataclasses.replace(TINY, attention="sliding"), seed=0)
    prompt = np.zeros((1, 3), np.int32)
    with pytest.raises(ValueError, match=r"k=8.*'sliding'.*at most 8.*<= 7"):
        sp.generate(target, prompt, 4, sp.PromptLookup(), k=8)
    other = refmodel.init(dataclasses.replace(TINY, vocab_size=300), seed=0)
    with pytest.raises(ValueError, match="vocab_size=300 differs"):
        sp.generate(target, prompt, 4, sp.Draft(other), k=2)
    with pytest.raises(ValueError, match="k=-1"):
        sp.generate(target, prompt, 4, sp.PromptLookup(), k=-1)
    with pytest.raises(ValueError, match="need a drafter"):
        sp.generate(target, prompt, 4, None, k=2)
    with pytest.raises(ValueError, match="max_new_tokens=0"):
        sp.generate(target, prompt, 0, sp.PromptLookup(), k=2)


def test_expected_tokens_and_speedup_formula():
    assert sp.expected_tokens(0.0, 4) == 1.0 and sp.expected_tokens(1.0, 4) == 5.0
    assert sp.expected_tokens(0.5, 2) == pytest.approx(1.75)  # 1 + 0.5 + 0.25
    # Leviathan et al.: a = 0.8, k = 4 drafts at c = 0.05, verify = one step -> 3.36 / 1.2
    assert sp.predicted_speedup(0.8, 4, 0.05 * 4 / 5, 1.0) == pytest.approx(3.3616 / 1.2)


@pytest.mark.parametrize("name", ["byte-target", "llama3-8b"])
def test_verify_costs_are_a_step_of_k_plus_one_tokens(name):
    """The verify phase is one step of k + 1 new tokens per sequence: its weight bytes are
    decode's, its FLOPs about k + 1 times, so its intensity rises about (k + 1)-fold while
    weights dominate the bytes (batch 1, short context)."""
    cfg = presets.get(name)
    decode = costs.phase_costs(cfg, "decode", 1, 64)
    for k in (1, 4, 7):
        v = costs.verify_costs(cfg, 1, 64, k)
        assert v == costs.step_costs(cfg, [(k + 1, 64)])
        assert v["weight_bytes"] == pytest.approx(decode["weight_bytes"], rel=1e-3)  # + k rows
        assert 0.8 * (k + 1) < v["intensity"] / decode["intensity"] <= (k + 1) * 1.01


def test_benchmark_setup_and_roofs_are_checked():
    from microbench.studies import speculative as msp

    with pytest.raises(ValueError, match=r"ks=\(0, 2\) must be positive"):
        msp.Setup(ks=(0, 2)).check()
    with pytest.raises(ValueError, match="drafters=.*'oracle'"):
        msp.Setup(drafters=("oracle",)).check()
    with pytest.raises(ValueError, match="recipe 'nope' is unknown"):
        msp.Setup(target="nope").check()
    peaks = {"roofs": {"compute": [{"name": "GEMM float32", "value": 1e11}],
                       "memory": [{"name": "L3", "value": 9e10},
                                  {"name": "DRAM read-only", "value": 2e10}]}}
    roofs = msp.roofs_from_peaks(peaks, "p.json")
    assert (roofs["compute"], roofs["memory"], roofs["source"]) == (1e11, 2e10, "p.json")
    assert msp.roofs_from_peaks({"roofs": {}}, "p.json") is None
