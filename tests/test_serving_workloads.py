"""Workload generators: seeded, shaped as documented, and strict about their parameters."""

from __future__ import annotations

import math

import numpy as np
import pytest

from refmodel.serving import workloads


def test_same_seed_same_trace_and_ids_follow_arrivals():
    a = workloads.random_requests(50, rate=5.0, seed=1)
    assert a == workloads.random_requests(50, rate=5.0, seed=1)
    assert a != workloads.random_requests(50, rate=5.0, seed=2)
    times = [r.arrival for r in a]
    assert [r.id for r in a] == list(range(50)) and times == sorted(times) and times[0] == 0


def test_arrival_rate_and_burstiness():
    rng = np.random.default_rng(0)
    poisson = np.diff(workloads.arrivals(rng, 20_001, rate=4.0))
    bursty = np.diff(workloads.arrivals(rng, 20_001, rate=4.0, cv=3.0))
    for gaps, cv in [(poisson, 1.0), (bursty, 3.0)]:
        assert gaps.mean() == pytest.approx(0.25, rel=0.05)  # mean gap = 1 / rate
        assert gaps.std() / gaps.mean() == pytest.approx(cv, rel=0.1)
    assert np.all(workloads.arrivals(rng, 5, math.inf) == 0)  # an offline batch


def test_lengths_have_the_asked_mean_and_are_positive():
    rng = np.random.default_rng(0)
    x = workloads.lengths(rng, 50_000, mean=200, spread=0.8)
    assert x.min() >= 1 and x.mean() == pytest.approx(200, rel=0.03)
    assert np.all(workloads.lengths(rng, 10, mean=7, spread=0.0) == 7)


def test_shared_prefix_starts_every_prompt_with_the_system_prompt():
    reqs = workloads.shared_prefix(20, rate=2.0, system_len=64, seed=3)
    system = reqs[0].prompt[:64]
    assert all(r.prompt[:64] == system and len(r.prompt) > 64 for r in reqs)


def test_multi_turn_each_turn_extends_the_last():
    reqs = workloads.multi_turn(1, turns=4, rate=1.0, user_len=10, output_len=5, seed=0)
    assert len(reqs) == 4
    for prev, cur in zip(reqs, reqs[1:], strict=False):
        assert cur.prompt[:len(prev.prompt)] == prev.prompt and cur.arrival >= prev.arrival
        assert len(cur.prompt) > len(prev.prompt) + prev.max_new_tokens  # reply + new message
    assert len(workloads.multi_turn(3, 2, rate=1.0)) == 6


def test_few_shot_prompts_share_one_prefix_per_task():
    reqs = workloads.few_shot(40, rate=10.0, shots=3, shot_len=20, tasks=2, seed=0,
                              spread=0.0)
    assert len({r.prompt[:60] for r in reqs}) == 2 and all(len(r.prompt) == 110 for r in reqs)


def test_chat_lengths_have_sharegpts_means_scaled_and_a_long_tail():
    rng = np.random.default_rng(0)
    p, o = workloads.chat_lengths(rng, 40_000, scale=0.125)
    # vLLM's filter (prompt <= 1024 x scale, total <= 2048 x scale) trims the tail a little
    assert p.max() <= 128 and (p + o).max() <= 256 and p.min() >= 1 and o.min() >= 1
    assert p.mean() == pytest.approx(161.31 * 0.125, rel=0.06)
    assert o.mean() == pytest.approx(337.99 * 0.125, rel=0.06)
    assert o.std() / o.mean() > 0.8 and np.median(o) < 0.8 * o.mean()  # long-tailed


def test_chat_like_is_the_same_requests_at_every_rate():
    slow = workloads.chat_like(30, 2.0, scale=0.125, system_len=32, seed=4)
    fast = workloads.chat_like(30, math.inf, scale=0.125, system_len=32, seed=4)
    assert [(r.prompt, r.max_new_tokens) for r in slow] == \
        [(r.prompt, r.max_new_tokens) for r in fast]
    assert all(r.arrival == 0 for r in fast) and slow[-1].arrival > 0
    assert all(r.prompt[:32] == slow[0].prompt[:32] for r in slow)  # one system prompt


@pytest.mark.parametrize("call,needle", [
    (lambda: workloads.chat_like(5, 1.0, scale=0), "scale=0"),
    (lambda: workloads.chat_like(5, 1.0, system_len=-1), "system_len=-1"),
    (lambda: workloads.chat_like(0, 1.0), "n=0"),
    (lambda: workloads.random_requests(10, rate=-1.0), "rate=-1.0"),
    (lambda: workloads.random_requests(10, rate=0), "rate=0"),
    (lambda: workloads.random_requests(0, rate=1.0), "n=0"),
    (lambda: workloads.random_requests(5, rate=1.0, output_len=0), "output_len=0"),
    (lambda: workloads.random_requests(5, rate=1.0, cv=0), "cv=0"),
    (lambda: workloads.shared_prefix(5, rate=1.0, system_len=0), "system_len=0"),
    (lambda: workloads.multi_turn(0, 3, rate=1.0), "conversations=0"),
    (lambda: workloads.multi_turn(2, 0, rate=1.0), "turns=0"),
    (lambda: workloads.few_shot(5, 1.0, tasks=0), "tasks=0"),
    (lambda: workloads.random_requests(5, 1.0, vocab=1), "vocab=1"),
])
def test_bad_parameters_are_named(call, needle):
    with pytest.raises(ValueError, match=needle):
        call()
