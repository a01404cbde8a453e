"""Serving: many requests, one model, one pool of KV memory. The model-independent parts.

Read in this order; each file is short and pure Python (numpy for statistics):

    request.py    Request (id, prompt tokens, max_new_tokens, arrival); Sequence, its running
                  state (tokens so far, how many have KV, output timestamps); Plan and Chunk,
                  one step's work as the scheduler hands it to the engine
    pool.py       PagePool: the paged KV memory's accounting (vLLM's PagedAttention, Kwon et
                  al. 2023): page ids, free list, reference counts, block tables, state slots
    radix.py      RadixCache: a radix tree of cached prefixes -> pages, longest-prefix match,
                  locks, LRU eviction (SGLang's RadixAttention, Zheng et al. 2024)
    scheduler.py  Scheduler: continuous batching under a token budget; policies prefill-first,
                  decode-first, mixed (Sarathi-Serve, Agrawal et al. 2024) and static;
                  cache-aware admission; preemption by recompute. Each step yields a Plan.
    workloads.py  seeded request generators: Poisson or bursty arrivals, shared system
                  prompts, multi-turn chat, few-shot prefixes, ShareGPT-shaped chat lengths
    metrics.py    TTFT, TPOT, inter-token latency, end-to-end latency, percentiles,
                  throughput, goodput under SLOs (DistServe, Zhong et al. 2024) over a run or
                  in its steady-state window, the rate a full queue sustains, utilization
    engine.py     Engine: the scheduler's plans on a real model, its caches in pages (and
                  state slots) gathered through block tables; warmup, run, per-step log

Separation (as SGLang keeps it): the pool knows which pages are free, the radix cache knows
which prefixes are cached, the scheduler decides who runs next; none of them sees the model.

What the engine (engine.py: the model's caches in pages, `Engine(model, num_pages).run(
requests)`) does with them, by hand:

    pool = PagePool(num_pages=512, page_size=16); cache = RadixCache(pool)
    sched = Scheduler(pool, policy="mixed", token_budget=512, cache=cache)
    sched.submit(workloads.shared_prefix(n=100, rate=4.0))
    while not sched.done:
        plan = sched.schedule(now)
        # for each Chunk c in plan.prefill + plan.decode: write the KV of c.tokens at
        # positions c.start.. into the pages pool.block_table(c.seq) names (row
        # table[pos // page_size], offset pos % page_size, in per-layer
        # [num_pages, page_size, ...] arrays), attend through the block table, and sample
        # where c.samples
        sched.commit(plan, sampled={seq_id: token, ...}, now=clock())
    report = metrics.summarize([metrics.Timeline.of(s) for s in sched.finished.values()],
                               ttft_slo=0.5, tpot_slo=0.05)

If nothing is running or waiting, the engine advances its clock to `sched.next_arrival()`.
"""

from refmodel.serving import metrics, workloads
from refmodel.serving.pool import OutOfPages, PagePool, pages_for
from refmodel.serving.radix import Match, RadixCache
from refmodel.serving.request import Chunk, Plan, Request, Sequence
from refmodel.serving.scheduler import POLICIES, Scheduler

__all__ = [
    "POLICIES", "Chunk", "Match", "OutOfPages", "PagePool", "Plan", "RadixCache", "Request",
    "Scheduler", "Sequence", "metrics", "pages_for", "workloads",
]
