"""The simulator: hand-computed timelines, conservation, and a replay of a real engine run.

A step-time rule of `A + B x tokens` seconds makes every timestamp computable by hand; the
cases are one request, two requests sharing a prefix, and a pool that forces eviction. The
replay drives the simulator with the engine's own step intervals and checks it plans the
same steps, so the only thing the simulator replaces is the model's time.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import refmodel
from refmodel.serving import Request, pages_for, workloads
from refmodel.sim.simulator import OUTPUT_TOKEN, Simulator

A, B = 0.001, 0.0001  # seconds per step, per token


def per_token(plan) -> float:
    return A + B * plan.num_tokens


def test_one_request_by_hand():
    r = Request(0, tuple(range(10)), max_new_tokens=4, arrival=0.5)
    run = Simulator(per_token, num_pages=8, page_size=4).run([r])
    t = run.timelines[0]
    # prefill 10 tokens at 0.5 -> first token; then 3 decodes of 1 token each
    first = 0.5 + A + 10 * B
    expect = [first + k * (A + B) for k in range(4)]
    np.testing.assert_allclose(t.token_times, expect, rtol=0, atol=1e-12)
    assert t.ttft == pytest.approx(A + 10 * B, abs=1e-12)
    assert t.tpot == pytest.approx(A + B, abs=1e-12)
    assert run.outputs[0] == [OUTPUT_TOKEN] * 4
    assert [s.prefill_tokens for s in run.steps] == [10, 0, 0, 0]


def test_two_requests_sharing_a_prefix_by_hand():
    shared = tuple(range(100, 108))  # two whole pages of 4
    r0 = Request(0, shared + (1, 2, 3), max_new_tokens=2, arrival=0.0)
    r1 = Request(1, shared + (7, 8), max_new_tokens=2, arrival=1.0)  # after r0 finished
    sim = Simulator(per_token, num_pages=16, page_size=4)
    run = sim.run([r0, r1])
    # r1 finds the 8 shared tokens cached: it prefills only its own 2
    assert run.hit_tokens == 8
    assert [s.prefill_tokens for s in run.steps] == [11, 0, 2, 0]
    t1 = run.timelines[1]
    np.testing.assert_allclose(t1.token_times, [1.0 + A + 2 * B, 1.0 + 2 * A + 3 * B],
                               atol=1e-12)
    # without the cache it prefills all 10
    cold = Simulator(per_token, num_pages=16, page_size=4, prefix_cache=False).run([r0, r1])
    assert cold.timelines[1].ttft == pytest.approx(A + 10 * B, abs=1e-12)


def test_pool_that_forces_eviction_by_hand():
    # 4 pages of 4 tokens: r0 (8 + 1 tokens held) leaves 2 cached pages; r1 needs 3 pages,
    # so one of r0's cached pages is evicted; r2 then repeats r0's prompt and finds only
    # what is left of it.
    p0 = tuple(range(200, 208))
    r0 = Request(0, p0, 2, 0.0)
    r1 = Request(1, tuple(range(300, 309)), 2, 1.0)
    r2 = Request(2, p0, 2, 2.0)
    run = Simulator(per_token, num_pages=4, page_size=4).run([r0, r1, r2])
    assert run.evicted_pages >= 1
    steps = [s.prefill_tokens for s in run.steps if s.prefill_tokens]
    assert steps[0] == 8 and steps[1] == 9
    # r2 reuses at most the one page LRU kept: it prefills 8 - 4 = 4 or all 8 tokens
    assert steps[2] in (4, 8)
    assert run.hit_tokens == 8 - steps[2]
    assert run.timelines[2].ttft == pytest.approx(A + steps[2] * B, abs=1e-12)


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 10_000), policy=st.sampled_from(
    ["mixed", "prefill-first", "decode-first", "static"]),
    extra=st.integers(0, 28), cache=st.booleans())
def test_conservation(seed, policy, extra, cache):
    """Every admitted request finishes with all its tokens, in order, and the pool is
    whole afterwards, under any policy and a pool small enough to preempt (the longest
    request's pages plus `extra`: a request that could never fit is refused at submit)."""
    reqs = workloads.shared_prefix(12, rate=50.0, system_len=16, prompt_len=8,
                                   output_len=6, vocab=100, seed=seed)
    longest = max(pages_for(len(r.prompt) + r.max_new_tokens - 1, 4) for r in reqs)
    sim = Simulator(per_token, num_pages=longest + extra, page_size=4, policy=policy,
                    token_budget=24,
                    max_running=4, prefix_cache=cache)
    run = sim.run(reqs)
    assert sorted(run.timelines) == [r.id for r in reqs]
    for r in reqs:
        assert len(run.outputs[r.id]) == r.max_new_tokens
        assert run.timelines[r.id].token_times[0] >= r.arrival
    sim.scheduler.check()
    assert sim.pool.used_pages == 0
    # the clock is the sum of the step times (plus idle gaps): no step is lost
    busy = sum(s.busy for s in run.steps)
    assert busy == pytest.approx(sum(sim.times), rel=1e-12)


def test_bad_input():
    with pytest.raises(ValueError, match="step_time"):
        Simulator(3.0, num_pages=4)
    with pytest.raises(ValueError, match="state_slot_pages"):
        Simulator(per_token, num_pages=4, state_slot_pages=1)
    sim = Simulator(lambda plan: float("nan"), num_pages=4, page_size=4)
    with pytest.raises(ValueError, match="finite time"):
        sim.run([Request(0, (1, 2), 1)])


def test_replays_an_engine_run(monkeypatch):
    """Fed the engine's own step intervals from the engine's first step on, the simulator
    plans the same steps, and its token times differ from the engine's only by the time the
    engine spent committing."""
    from refmodel.serving.engine import Engine
    from refmodel.sim import simulator

    cfg = dataclasses.replace(refmodel.presets.get("tiny"), attention="gqa")
    model = refmodel.init(cfg, seed=0)
    reqs = workloads.shared_prefix(8, rate=400.0, system_len=24, prompt_len=6,
                                   output_len=12, vocab=cfg.vocab_size, seed=3)
    kw = dict(page_size=8, policy="mixed", token_budget=16, max_running=3)
    engine = Engine(model, num_pages=7, max_len=64, **kw)
    engine.warmup()
    real = engine.run(reqs)
    # each step lasts until the engine started its next one (the last: its own length)
    starts = [s.time for s in real.steps]
    lengths = [b - a for a, b in zip(starts, starts[1:], strict=False)] + [real.steps[-1].seconds]
    intervals = iter(lengths)

    class FromTheEnginesFirstStep(simulator.VirtualClock):
        """The engine's first step starts a moment after its clock does (its first loop
        turn): started at 0, the simulator's steps would each come that moment early, and
        an arrival inside it would join a different step (seen once under load)."""

        def __init__(self):
            super().__init__()
            self.t = starts[0]

    monkeypatch.setattr(simulator, "VirtualClock", FromTheEnginesFirstStep)
    sim = Simulator(lambda plan: next(intervals), num_pages=7, **kw)
    run = sim.run(reqs)
    assert run.steps[0].time == starts[0]  # the replay starts where the engine's first step did
    plan = [(s.prefill, s.decode_rows, s.preempted) for s in real.steps]
    assert [(s.prefill, s.decode_rows, s.preempted) for s in run.steps] == plan
    assert real.preemptions > 0 and real.hit_tokens > 0  # the trace exercises the scheduler
    # The simulator's tokens come when the engine's next step began; the engine's when its
    # calls ended (before commit): later by at most the longest commit. After an idle gap
    # the engine's clock is one loop turn past the arrival the simulator jumps to exactly.
    late = max(length - s.busy for length, s in zip(lengths, real.steps, strict=True))
    for r in reqs:
        e, s = real.timelines[r.id].token_times, run.timelines[r.id].token_times
        diff = np.asarray(s) - np.asarray(e)
        assert np.all(diff <= late + 1e-9) and np.all(diff >= -1e-3), diff
