"""Speculative decoding: a drafter proposes k tokens, the target verifies them in one pass.

Leviathan, Kalman & Matias 2023 ("Fast inference from transformers via speculative
decoding", arXiv:2211.17192); Chen et al. 2023 ("Accelerating large language model decoding
with speculative sampling", arXiv:2302.01318). A decode step reads every weight for one token
per sequence; the verify pass reads them once for k + 1 tokens (the pending token and the k
proposals), so its arithmetic intensity is about k + 1 times decode's, and each accepted
proposal is a target step saved.

One round, jitted whole (no host work between draft, verify and rollback):

1. the drafter proposes d_1..d_k after the pending token t (the last one emitted, not yet in
   the target's cache): a small model (`Draft(model)`: k + 1 of its decode steps, the last
   one only to put d_k in its cache), or prompt lookup (`PromptLookup()`: the tokens that
   followed the last occurrence of the context's final n-gram, no model at all);
2. the target runs [t, d_1..d_k] as one chunk (`Transformer.verify`) -> k + 1 distributions;
3. acceptance (`accept`): greedy keeps the longest prefix of proposals equal to the target's
   argmax; sampling keeps d_i with probability min(1, p_i(d_i) / q_i(d_i)) up to the first
   rejection and then samples from norm(max(p - q, 0)) (after k acceptances: from p_k), so the
   emitted tokens are distributed exactly as the target's own samples. A round emits n + 1
   tokens, n in [0, k] accepted;
4. every cache of the target and of the draft model is rolled back to the n + 1 tokens kept
   (`refmodel.model.rollback`: each attention variant undoes its own kind of cache).

The expected tokens per round for an acceptance rate a are (1 - a^(k+1)) / (1 - a)
(`expected_tokens`); `predicted_speedup` sets that against the round's cost.
`generate(..., k=0)` is plain decode through the same loop: the baseline speedups are
measured against.
"""

from __future__ import annotations

import functools
import numbers
from dataclasses import dataclass

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from refmodel import attention, phases
from refmodel.api import GREEDY_BELOW, _temperature, _tokens
from refmodel.model import Transformer, init_cache, rollback


@dataclass(frozen=True)
class Draft:
    """A small model sharing the target's vocabulary proposes by decoding k steps."""

    model: Transformer


@dataclass(frozen=True)
class PromptLookup:
    """Prompt lookup (Saxena 2023): the k tokens that followed the most recent earlier
    occurrence of the context's last n-gram, trying n = max_ngram down to 1; with no match,
    the last token repeated (to be rejected). No model, no cache."""

    max_ngram: int = 3


@dataclass
class Result:
    tokens: np.ndarray  # int32 [B, T + max_new_tokens]
    accepted: np.ndarray  # int32 [rounds, B]: proposals accepted by each row in each round
    k: int

    @property
    def rounds(self) -> int:
        """Target passes after the prompt (each emits 1 to k + 1 tokens per row)."""
        return int(self.accepted.shape[0])

    @property
    def tokens_per_pass(self) -> float:
        """Mean tokens emitted per row and target pass (1 for plain decode)."""
        return float(np.mean(self.accepted + 1)) if self.rounds else float("nan")

    @property
    def acceptance(self) -> float:
        """The per-proposal acceptance rate a: proposals accepted / proposals judged (a round
        that accepts n < k judged n + 1 of them, the last rejected; one with n = k judged k)."""
        if not self.rounds or not self.k:
            return float("nan")
        judged = np.minimum(self.accepted + 1, self.k)
        return float(self.accepted.sum() / judged.sum())


def expected_tokens(a: float, k: int) -> float:
    """Tokens per target pass with acceptance rate a and k proposals: 1 + a + ... + a^k."""
    return float(k + 1) if a == 1.0 else (1.0 - a ** (k + 1)) / (1.0 - a)


def predicted_speedup(a: float, k: int, draft_step: float, verify: float = 1.0,
                      overhead: float = 0.0) -> float:
    """Plain decode's time per token over speculative decoding's, in units of one target
    decode step: expected_tokens x (1 + o) / ((k + 1) c + v + o). The standard formula
    (Leviathan et al. 2023, Theorem 3.8) charges k draft steps of relative cost c =
    `draft_step` and one target step for the verify (verify=1, overhead=0); this loop runs
    k + 1 draft steps (the last puts d_k in the draft's cache), a verify of k + 1 tokens costs
    v = `verify` decode steps, measured or counted (about 1 only while the step is bound by
    reading the weights), and every round, like every plain decode step, pays a fixed
    o = `overhead` (dispatch, the host's check of the lengths: measured as plain decode's
    time per token over its step's), which speculation pays once per n + 1 tokens."""
    return expected_tokens(a, k) * (1.0 + overhead) / ((k + 1) * draft_step + verify + overhead)


def accept(logits: jax.Array, draft: jax.Array, q: jax.Array | None, temperature,
           key: jax.Array) -> tuple[jax.Array, jax.Array]:
    """Target logits [B, k+1, V] for the chunk [t, d_1..d_k], proposals draft [B, k] and the
    drafter's distributions q [B, k, V] (None: greedy) -> (n [B] accepted, out [B, k+1]):
    the round emits out[:, :n+1]."""
    B, k1, _ = logits.shape
    k = k1 - 1
    if q is None:  # greedy: emitted = the target's argmax, as long as the proposals match it
        best = jnp.argmax(logits, axis=-1).astype(jnp.int32)  # [B, k+1]
        n = jnp.sum(jnp.cumprod(draft == best[:, :k], axis=1), axis=1).astype(jnp.int32)
        return n, best
    p = jax.nn.softmax(logits / temperature, axis=-1)  # [B, k+1, V]
    key_u, key_c = jax.random.split(key)
    p_d = jnp.take_along_axis(p[:, :k], draft[..., None], axis=-1)[..., 0]  # [B, k]
    q_d = jnp.take_along_axis(q, draft[..., None], axis=-1)[..., 0]  # [B, k]
    ok = jax.random.uniform(key_u, (B, k)) * q_d < p_d  # u < p / q
    n = jnp.sum(jnp.cumprod(ok, axis=1), axis=1).astype(jnp.int32)
    resid = jnp.concatenate([jnp.maximum(p[:, :k] - q, 0.0), p[:, k:]], axis=1)  # [B, k+1, V]
    mass = resid.sum(axis=-1, keepdims=True)
    resid = jnp.where(mass > 0, resid / jnp.where(mass > 0, mass, 1.0), p)  # p = q: sample p
    fix = jax.random.categorical(key_c, jnp.log(resid), axis=-1).astype(jnp.int32)  # [B, k+1]
    padded = jnp.concatenate([draft, jnp.zeros((B, 1), jnp.int32)], axis=1)  # [B, k+1]
    return n, jnp.where(jnp.arange(k + 1) < n[:, None], padded, fix)


def lookup(hist: jax.Array, length: jax.Array, k: int, max_ngram: int) -> jax.Array:
    """Prompt-lookup proposals [B, k] from each row's tokens hist[b, :length[b]] (hist
    [B, S]): after the most recent earlier occurrence of its last n-gram, longest n first."""
    B, S = hist.shape
    rows = jnp.arange(B)[:, None]
    follow = jnp.full((B,), -1, jnp.int32)  # where the proposals start, -1: not found
    for n in range(max_ngram, 0, -1):
        suffix = hist[rows, jnp.maximum(length[:, None] - n + jnp.arange(n), 0)]  # [B, n]
        starts = jnp.arange(S - n + 1)  # candidate match positions i
        match = jnp.ones((B, S - n + 1), bool)
        for t in range(n):
            match &= hist[:, t:S - n + 1 + t] == suffix[:, t:t + 1]
        match &= (starts + n < length[:, None]) & (length[:, None] >= n)  # an earlier match
        last = jnp.max(jnp.where(match, starts, -1), axis=1)  # [B]
        follow = jnp.where((follow < 0) & (last >= 0), last + n, follow)
    idx = jnp.where(follow[:, None] >= 0, follow[:, None] + jnp.arange(k), length[:, None] - 1)
    return hist[rows, jnp.minimum(idx, length[:, None] - 1)]  # [B, k]


def _propose(model: Transformer, last: jax.Array, cache, k: int, temperature, key):
    """k + 1 decode steps of the draft model from the pending token last [B]: proposals
    [B, k], their distributions [B, k, V] (None when greedy), the cache after all k + 1
    tokens and its per-step snapshots for the rollback."""
    greedy = temperature is None

    def step(carry, key_j):
        tok, cache = carry
        logits, cache, snaps = model.verify(tok[:, None], cache)
        logits = logits[:, 0]
        if greedy:
            nxt, q = jnp.argmax(logits, axis=-1).astype(jnp.int32), None
        else:
            q = jax.nn.softmax(logits / temperature, axis=-1)
            nxt = jax.random.categorical(key_j, logits / temperature).astype(jnp.int32)
        return (nxt, cache), (nxt, q, snaps)

    (_, after), (toks, q, snaps) = jax.lax.scan(step, (last, cache), jax.random.split(key, k + 1))
    snaps = jax.tree.map(lambda a: jnp.moveaxis(a, 0, 1)[:, :, 0], snaps)  # [B, k+1, ...]
    q = None if greedy else jnp.moveaxis(q[:k], 0, 1)
    return toks[:k].T, q, after, snaps


@functools.lru_cache(maxsize=32)
def _round_fn(tgraph, tcfg, dgraph, dcfg, k: int, lookup_ngram: int | None, greedy: bool):
    """One jitted round (see the module docstring) for static graphs, configs, k and drafter
    (a draft model when dgraph is given, prompt lookup when lookup_ngram is)."""

    def round_(tstate, dstate, hist, length, tcache, dcache, key, temperature):
        B = hist.shape[0]
        rows = jnp.arange(B)
        last = hist[rows, length - 1]  # [B] the pending token
        key, key_d, key_a = jax.random.split(key, 3)
        q = None
        if k == 0:
            draft = jnp.zeros((B, 0), jnp.int32)
        elif dgraph is not None:
            draft, q, d_after, d_snaps = _propose(nnx.merge(dgraph, dstate), last, dcache, k,
                                                  None if greedy else temperature, key_d)
        else:
            draft = lookup(hist, length, k, lookup_ngram)
            if not greedy:  # a deterministic proposal: q is one-hot
                q = jax.nn.one_hot(draft, tcfg.vocab_size, dtype=jnp.float32)
        target = nnx.merge(tgraph, tstate)
        logits, t_after, t_snaps = target.verify(jnp.concatenate([last[:, None], draft], 1),
                                                 tcache)
        n, out = accept(logits, draft, q, temperature, key_a)
        keep = n + 1
        tcache = rollback(tcfg, tcache, t_after, t_snaps, keep)
        if k and dgraph is not None:
            dcache = rollback(dcfg, dcache, d_after, d_snaps, keep)
        hist = hist.at[rows[:, None], length[:, None] + jnp.arange(k + 1)].set(out, mode="drop")
        return hist, length + keep, tcache, dcache, key, n

    return jax.jit(round_, donate_argnums=(2, 4, 5))


def check(target: Transformer, drafter, k) -> None:
    """Raise ValueError for a k or drafter this target cannot run speculatively."""
    if not isinstance(k, numbers.Integral) or isinstance(k, bool) or k < 0:
        raise ValueError(f"k={k!r} must be a non-negative integer (0: plain decode)")
    if drafter is not None and not isinstance(drafter, (Draft, PromptLookup)):
        raise ValueError(f"drafter={drafter!r}: give a speculative.Draft(model) or a "
                         "speculative.PromptLookup()")
    if k and drafter is None:
        raise ValueError(f"k={k} proposals need a drafter (Draft(model) or PromptLookup())")
    models = [("target", target)]
    if isinstance(drafter, Draft):
        if drafter.model.cfg.vocab_size != target.cfg.vocab_size:
            raise ValueError(f"the draft's vocab_size={drafter.model.cfg.vocab_size} differs "
                             f"from the target's {target.cfg.vocab_size}: they must share "
                             "a tokenizer")
        models.append(("draft", drafter.model))
    if isinstance(drafter, PromptLookup) and (not isinstance(drafter.max_ngram, int)
                                              or drafter.max_ngram < 1):
        raise ValueError(f"PromptLookup(max_ngram={drafter.max_ngram!r}) must be >= 1")
    for who, model in models:
        for kind in attention.kinds_in(model.cfg):
            limit = attention.get(kind).rollback_limit(model.cfg, kind)
            if limit is not None and k + 1 > limit:
                raise ValueError(f"k={k}: the {who}'s {kind!r} layers roll back at most "
                                 f"{limit} tokens per chunk, so k must be <= {limit - 1}")


def generate(target: Transformer, prompt, max_new_tokens: int, drafter=None,
             k: int | None = None, temperature: float = 0.0, seed: int = 0) -> Result:
    """Prompt [B, T] -> Result with tokens [B, T + max_new_tokens]. Greedy at temperature 0:
    the very tokens `refmodel.generate` gives; sampled otherwise, from the target's own
    distribution. k proposals per round (default 4 with a drafter); no drafter (k=0): plain
    decode through the same loop."""
    k = (4 if drafter is not None else 0) if k is None else k
    check(target, drafter, k)
    prompt = _tokens(prompt, 2, "prompt", target.cfg.vocab_size)
    if (not isinstance(max_new_tokens, numbers.Integral) or isinstance(max_new_tokens, bool)
            or max_new_tokens < 1):
        raise ValueError(f"max_new_tokens={max_new_tokens!r} must be a positive integer")
    temperature = _temperature(temperature)
    greedy = temperature < GREEDY_BELOW
    B, T = prompt.shape
    S = T + max_new_tokens + k + 1  # the last round may write k + 1 tokens past the end
    tgraph, tstate = nnx.split(target)
    dgraph = dstate = dcache = None
    key = jax.random.key(seed)
    prefill = phases.jitted("prefill", tgraph)  # the very function refmodel.generate runs
    logits, tcache = prefill(tstate, prompt, init_cache(target.cfg, B, S))
    if greedy:
        first = jnp.argmax(logits[:, -1], axis=-1).astype(jnp.int32)
    else:
        key, sub = jax.random.split(key)
        first = jax.random.categorical(sub, logits[:, -1] / temperature).astype(jnp.int32)
    if isinstance(drafter, Draft) and k:
        dgraph, dstate = nnx.split(drafter.model)
        _, dcache = phases.jitted("prefill", dgraph)(dstate, prompt,
                                                     init_cache(drafter.model.cfg, B, S))
    hist = jnp.zeros((B, S), jnp.int32).at[:, :T].set(prompt).at[:, T].set(first)
    length = jnp.full((B,), T + 1, jnp.int32)
    step = _round_fn(tgraph, target.cfg, dgraph, None if dgraph is None else drafter.model.cfg,
                     k, drafter.max_ngram if isinstance(drafter, PromptLookup) else None,
                     greedy)
    accepted = []
    while int(jnp.min(length)) < T + max_new_tokens:
        hist, length, tcache, dcache, key, n = step(tstate, dstate, hist, length, tcache,
                                                    dcache, key, jnp.float32(temperature))
        accepted.append(n)
    acc = np.asarray(jnp.stack(accepted)) if accepted else np.zeros((0, B), np.int32)
    return Result(np.asarray(hist[:, :T + max_new_tokens]), acc, k)
