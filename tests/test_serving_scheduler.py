"""The scheduler, driven by a fake paged model.

The fake model keeps a token store shaped like the engine's KV arrays (page id -> page_size
slots), writes each planned token through the sequence's block table, and "samples" the next
token as a hash of the tokens it reads back through the block table. So a request's output
equals the oracle (the same hash applied to the request alone) only if every position was
written once, to the right page, and shared prefix pages held the right tokens - the
serving golden test, without a model.
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from refmodel.serving import PagePool, RadixCache, Request, Scheduler, workloads

VOCAB = 50


def next_token(tokens) -> int:
    return hash(tuple(tokens)) % VOCAB


def oracle(r: Request) -> list[int]:
    toks = list(r.prompt)
    for _ in range(r.max_new_tokens):
        toks.append(next_token(toks))
    return toks[len(r.prompt):]


def run(sched: Scheduler, requests, max_steps: int = 5_000) -> list:
    """Drive `sched` to completion on the fake model; returns every step's plan."""
    pool, ps, store, plans = sched.pool, sched.pool.page_size, {}, []
    sched.submit(requests)
    now = 0.0
    while not sched.done:
        assert len(plans) < max_steps, "the scheduler stopped making progress"
        before = {s.id for s in sched.running}
        plan = sched.schedule(now)
        if not plan.prefill and not plan.decode:
            assert not sched.running and sched.next_arrival() > now, "stuck with work queued"
            now = sched.next_arrival()
            continue
        assert plan.num_tokens <= sched.token_budget
        if sched.policy == "static":
            assert not before or {s.id for s in sched.running} <= before, "joined a batch"
        if sched.policy == "prefill-first":
            assert not (plan.prefill and plan.decode)
        sampled = {}
        for c in plan.prefill + plan.decode:
            table = pool.block_table(c.seq)
            for j, tok in enumerate(c.tokens):
                pos = c.start + j
                assert pool.ref[table[pos // ps]] == 1, "wrote into a shared page"
                store.setdefault(table[pos // ps], [None] * ps)[pos % ps] = tok
            if c.samples:
                end = c.start + len(c.tokens)
                sampled[c.seq] = next_token(store[table[p // ps]][p % ps] for p in range(end))
        now += 0.01 + 1e-4 * plan.num_tokens  # a step costs a fixed part plus per token
        sched.commit(plan, sampled, now)
        sched.check()
        plans.append(plan)
    return plans


def assert_served(sched: Scheduler, requests) -> None:
    """Every request finished with exactly its tokens, and no page is held."""
    assert sorted(sched.finished) == sorted(r.id for r in requests)
    for r in requests:
        seq = sched.finished[r.id]
        assert seq.output == oracle(r) and len(seq.token_times) == r.max_new_tokens
    counts = sched.pool.check()
    assert counts["used"] == 0 and all(ref == 0 for ref in sched.pool.ref)
    if sched.cache is not None:
        sched.cache.check()
        assert sched.cache.evict(sched.pool.num_pages) == counts["cached"]
    assert sched.pool.free_pages == sched.pool.num_pages


def traffic(seed=0, n=12, rate=50.0):
    return workloads.shared_prefix(n, rate, system_len=24, prompt_len=10, output_len=8,
                                   vocab=VOCAB, seed=seed)


@pytest.mark.parametrize("policy", ["prefill-first", "decode-first", "mixed", "static"])
@pytest.mark.parametrize("use_cache", [False, True])
def test_every_policy_serves_every_request_exactly(policy, use_cache):
    pool = PagePool(64, page_size=4)
    cache = RadixCache(pool) if use_cache else None
    sched = Scheduler(pool, policy, token_budget=32, max_running=6, cache=cache)
    reqs = traffic()
    plans = run(sched, reqs)
    assert_served(sched, reqs)
    assert any(c.start > 0 and not c.samples for p in plans for c in p.prefill) or \
        any(len(c.tokens) < len(r.prompt) for p in plans for c in p.prefill for r in reqs
            if r.id == c.seq), "expected some chunked prefill with a 32-token budget"
    if policy == "mixed":
        assert any(p.prefill and p.decode for p in plans)


def test_a_tiny_pool_preempts_and_recovers():
    reqs = workloads.random_requests(8, float("inf"), prompt_len=20, output_len=20,
                                     vocab=VOCAB, seed=3, spread=0.0)
    pool = PagePool(12, page_size=4)  # one request at its longest holds 10 pages
    sched = Scheduler(pool, "mixed", token_budget=64, max_running=8, cache=RadixCache(pool))
    plans = run(sched, reqs)
    assert sched.preemptions > 0 and any(p.preempted for p in plans)
    assert any(s.preemptions for s in sched.finished.values())
    assert_served(sched, reqs)


def test_readmissions_after_preemption_are_counted_with_their_hits():
    system = tuple(range(100, 116))  # 16 shared tokens: 4 pages of 4
    reqs = [Request(i, system + tuple(range(i * 10, i * 10 + 10)), 12) for i in range(8)]
    pool = PagePool(20, page_size=4)
    sched = Scheduler(pool, "mixed", token_budget=64, max_running=8, cache=RadixCache(pool))
    plans = run(sched, reqs)
    assert_served(sched, reqs)
    # from the plans alone: the first chunk a preempted request runs after its preemption
    # starts at what the radix cache held for it (its prompt so far, and its output)
    waiting, starts = set(), []
    for plan in plans:
        for c in plan.prefill:
            if c.seq in waiting:
                starts.append(c.start)
                waiting.discard(c.seq)
        waiting |= set(plan.preempted)
    assert sched.readmissions == len(starts) > 0
    assert sched.readmit_hit_tokens == sum(starts)
    assert sched.readmit_hit_tokens > len(starts) * len(system)  # past the shared prompt
    assert sched.readmit_tokens >= sched.readmit_hit_tokens + sched.readmissions


def test_shared_system_prompt_is_a_prefix_hit():
    system = tuple(range(100, 132))  # 32 tokens: 8 whole pages of 4
    reqs = [Request(i, system + (i, 1, 2), max_new_tokens=3, arrival=float(i))
            for i in range(5)]  # one per second: each is done before the next arrives
    pool = PagePool(64, page_size=4)
    cache = RadixCache(pool)
    sched = Scheduler(pool, "mixed", token_budget=64, cache=cache)
    run(sched, reqs)
    assert_served(sched, reqs)
    assert cache.hit_tokens == 4 * 32
    assert cache.hit_tokens + cache.miss_tokens == sum(len(r.prompt) for r in reqs)


def test_cache_aware_order_admits_the_longest_hit_first():
    pool = PagePool(64, page_size=2)
    cache = RadixCache(pool)
    sched = Scheduler(pool, "mixed", token_budget=64, max_running=1, cache=cache)
    run(sched, [Request(0, (5, 6, 7, 8, 9), 1)])
    cold, warm = Request(1, (1, 2, 3), 1, 1.0), Request(2, (5, 6, 7, 8, 1), 1, 1.5)
    sched.submit([cold, warm])
    plan = sched.schedule(now=2.0)
    assert [c.seq for c in plan.prefill] == [2] and plan.prefill[0].start == 4


def test_impossible_requests_are_refused_up_front():
    sched = Scheduler(PagePool(4, page_size=4))
    with pytest.raises(ValueError, match="request 0 of 17 tokens .* only 4"):
        sched.submit([Request(0, tuple(range(10)), max_new_tokens=8)])
    sched.submit([Request(1, (1,), 2)])
    with pytest.raises(ValueError, match="submitted twice"):
        sched.submit([Request(1, (1,), 2)])
    with pytest.raises(ValueError, match="policy='fifo'.*mixed"):
        Scheduler(PagePool(4, 4), policy="fifo")
    plan = sched.schedule(0.0)
    with pytest.raises(ValueError, match="the plan samples"):
        sched.commit(plan, {}, 1.0)


@settings(max_examples=100, deadline=None)
@given(st.sampled_from(["prefill-first", "decode-first", "mixed", "static"]),
       st.booleans(), st.integers(1, 4), st.integers(0, 20), st.integers(4, 40),
       st.integers(1, 6), st.integers(0, 1000))
def test_random_runs_are_exact_and_leak_free(policy, use_cache, page_size, spare, budget,
                                             max_running, seed):
    reqs = workloads.multi_turn(3, 3, rate=20.0, user_len=6, output_len=5, think_time=0.05,
                                vocab=VOCAB, seed=seed) + \
        workloads.few_shot(4, 20.0, shots=2, shot_len=6, question_len=4, output_len=4,
                           vocab=VOCAB, seed=seed)
    reqs = [Request(i, r.prompt, r.max_new_tokens, r.arrival) for i, r in enumerate(reqs)]
    biggest = max(-(-(len(r.prompt) + r.max_new_tokens - 1) // page_size) for r in reqs)
    pool = PagePool(biggest + spare, page_size)
    cache = RadixCache(pool) if use_cache else None
    sched = Scheduler(pool, policy, budget, max_running, cache=cache)
    run(sched, reqs)
    assert_served(sched, reqs)


def test_concurrent_identical_prefixes_end_up_in_one_page():
    pool = PagePool(16, page_size=4)
    sched = Scheduler(pool, "mixed", token_budget=64, cache=RadixCache(pool))
    system = (9, 8, 7, 6, 5, 4, 3, 2)  # two whole pages
    sched.submit([Request(0, system + (1,), 4), Request(1, system + (2,), 4)])
    plan = sched.schedule(0.0)
    assert [c.start for c in plan.prefill] == [0, 0]  # both miss: nothing was cached yet
    sched.commit(plan, {i: 0 for i in plan.samples}, 0.1)
    a, b = pool.block_table(0), pool.block_table(1)
    assert a[:2] == b[:2] and a[2] != b[2] and [pool.ref[p] for p in a] == [2, 2, 1]
    assert pool.check() == {"free": 12, "used": 4, "cached": 0}  # the copy was freed
    sched.check()


def test_prefix_caching_cuts_ttft_on_the_simulated_clock():
    """The engine loop of refmodel.serving's docstring, with metrics: on a shared 128-token
    system prompt and a 32-token budget, a hit skips four of five prefill steps."""
    from refmodel.serving import metrics

    reqs = workloads.shared_prefix(30, rate=5.0, system_len=128, prompt_len=8,
                                   output_len=4, vocab=VOCAB, seed=0)
    ttft = {}
    for use_cache in (False, True):
        pool = PagePool(256, page_size=8)
        cache = RadixCache(pool) if use_cache else None
        sched = Scheduler(pool, "mixed", token_budget=32, cache=cache)
        run(sched, reqs)
        report = metrics.summarize([metrics.Timeline.of(s) for s in sched.finished.values()],
                                   ttft_slo=0.1, tpot_slo=0.05)
        ttft[use_cache] = report["ttft_s"]["mean"]
        assert report["requests"] == 30 and metrics.utilization(sched.usage, 256)["used"] > 0
    assert ttft[True] < 0.5 * ttft[False]
    assert cache.hit_rate > 0.8
