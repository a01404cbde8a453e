"""A continuous-batching scheduler that never touches the model: each step it writes a Plan.

Requests wait until they arrive, join the running batch when memory and the step's token
budget allow, and leave it as soon as they have their `max_new_tokens` (iteration-level
scheduling, Orca: Yu et al. 2022). A sequence's state is its tokens (prompt + output so far)
and `computed`, how many of them have KV in the pool; each step feeds it `pending =
len(tokens) - computed` tokens or fewer, and the step that finishes its pending tokens
samples its next token. A decode is the case pending == 1.

Policies (what one step's token budget is spent on):

    prefill-first  prefill chunks whenever any prefill can run, decodes wait (vLLM's first
                   scheduler: best TTFT, but decodes stall while prompts arrive)
    decode-first   every decode first, then whole prompts that fit what is left (a prompt
                   longer than the whole budget runs alone, chunked)
    mixed          every decode first, then chunked prefill fills the budget exactly:
                   stall-free batching (Sarathi-Serve, Agrawal et al. 2024)
    static         admit a batch only when the running batch is empty, then prefill it and
                   decode it to the end (the baseline continuous batching is measured against)

Admission is cache-aware when a RadixCache is given: waiting requests go longest cached
prefix first, then oldest (SGLang's "lpm" order, Zheng et al. 2024). When a page cannot be
had, the cache evicts LRU leaves; if that is not enough the newest running sequence is
preempted by recompute (vLLM, Kwon et al. 2023): its pages are freed, it goes back to the
queue with its output so far, and it is prefilled again on readmission (not in the step that
preempted it: that would thrash). A request that could never fit the pool is refused at
`submit` with a ValueError, so nothing is silently cut. A prompt's pages enter the cache as
soon as its prefill ends, not only when the request finishes, so later arrivals share them.

The engine loop:  plan = s.schedule(now); sampled = run(plan); s.commit(plan, sampled, now).
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable, Mapping

from refmodel.serving.pool import PagePool, integer
from refmodel.serving.radix import RadixCache
from refmodel.serving.request import Chunk, Plan, Request, Sequence

POLICIES = ("prefill-first", "decode-first", "mixed", "static")


class Scheduler:
    """Continuous batching over a PagePool (and optionally a RadixCache) under a policy."""

    def __init__(self, pool: PagePool, policy: str = "mixed", token_budget: int = 256,
                 max_running: int = 32, cache: RadixCache | None = None,
                 cache_aware: bool = True, slots: int = 0):
        if not isinstance(policy, str) or policy not in POLICIES:
            raise ValueError(f"policy={policy!r}: choose one of {POLICIES}")
        token_budget, max_running = integer("token_budget", token_budget), \
            integer("max_running", max_running)
        slots = integer("slots", slots, minimum=0)
        if not isinstance(cache_aware, bool):
            raise ValueError(f"cache_aware={cache_aware!r}: must be True or False")
        self.pool, self.policy, self.cache, self.cache_aware = pool, policy, cache, cache_aware
        self.token_budget, self.max_running, self.slots = token_budget, max_running, slots
        self.pending: list[tuple[float, int, Request]] = []  # a heap of future arrivals
        self.waiting: list[Sequence] = []
        self.running: list[Sequence] = []  # in admission order: the newest is preempted first
        self.finished: dict[int, Sequence] = {}
        self.usage: list[tuple[float, int, int]] = []  # (time, used pages, cached pages)
        self.steps = self.preemptions = 0
        # readmissions after preemption: how many, the tokens each brought back (prompt and
        # output so far) and how many of those the radix cache held (its earlier pages)
        self.readmissions = self.readmit_tokens = self.readmit_hit_tokens = 0
        self._ids: set[int] = set()

    # ---- the outside ----------------------------------------------------------------------
    def submit(self, requests: Iterable[Request]) -> None:
        """Queue requests, all or none; one that could never fit the pool is a ValueError."""
        requests, ids = list(requests), set()
        for r in requests:
            if r.id in self._ids or r.id in ids:
                raise ValueError(f"request id {r.id} was submitted twice")
            ids.add(r.id)
            held = len(r.prompt) + r.max_new_tokens - 1  # the last token's KV is never needed
            self.pool.capacity_check(held, self.slots, f"request {r.id}")
        for r in requests:
            self._ids.add(r.id)
            heapq.heappush(self.pending, (r.arrival, r.id, r))

    def next_arrival(self) -> float | None:
        return self.pending[0][0] if self.pending else None

    @property
    def done(self) -> bool:
        return not (self.pending or self.waiting or self.running)

    def schedule(self, now: float) -> Plan:
        """Admit arrivals up to `now` and plan one step under the policy."""
        while self.pending and self.pending[0][0] <= now:
            r = heapq.heappop(self.pending)[2]
            self.waiting.append(Sequence(r, list(r.prompt)))
        plan = Plan(self.steps)
        if self.policy == "static":
            if not self.running:
                for seq in self._admission_order()[:self.max_running]:
                    if not self._admit(seq):
                        break
            self._prefill(plan, chunked=True, admit=False)
        elif self.policy == "prefill-first":
            self._prefill(plan, chunked=True, admit=True)
        else:
            self._decode(plan)
            self._prefill(plan, chunked=self.policy == "mixed", admit=True)
        if not plan.prefill and not plan.decode:
            self._decode(plan)
        return plan

    def commit(self, plan: Plan, sampled: Mapping[int, int], now: float) -> None:
        """Record the step's outcome: `sampled[id]` is the next token of each id in
        plan.samples, produced at time `now`. Finished sequences leave and are cached."""
        if set(sampled) != set(plan.samples):
            raise ValueError(f"step {plan.step}: sampled tokens for {sorted(sampled)}, "
                             f"the plan samples {sorted(plan.samples)}")
        by_id = {s.id: s for s in self.running}
        work = [(c, True) for c in plan.prefill] + [(c, False) for c in plan.decode]
        for c, prefill in work:
            seq = by_id[c.seq]
            seq.computed += len(c.tokens)
            if c.samples:
                if prefill and self.cache is not None:
                    self._share(seq)
                seq.tokens.append(int(sampled[c.seq]))
                seq.token_times.append(now)
                if len(seq.output) == seq.request.max_new_tokens:
                    self._finish(seq)
        self.steps += 1
        self.usage.append((now, self.pool.used_pages, self.pool.cached_pages))

    # ---- one step's plan ----------------------------------------------------------------
    def _decode(self, plan: Plan) -> None:
        for seq in list(self.running):
            if plan.num_tokens >= self.token_budget:
                break
            if seq in self.running and seq.decoding and self._reserve(plan, seq, 1, True):
                plan.decode.append(Chunk(seq.id, seq.computed, (seq.tokens[-1],), True))

    def _prefill(self, plan: Plan, chunked: bool, admit: bool) -> None:
        for seq in list(self.running):
            if seq in self.running and not seq.decoding:
                self._chunk(plan, seq, chunked, may_preempt=True)
        if not admit or plan.preempted:  # memory is short: readmitting now would thrash
            return
        if not self.waiting or len(self.running) >= self.max_running or \
                plan.num_tokens >= self.token_budget:
            return  # nobody can join: skip ordering the queue (a prefix match per request)
        for seq in self._admission_order():
            if len(self.running) >= self.max_running or plan.num_tokens >= self.token_budget:
                return
            if not self._admit(seq):
                return
            if not self._chunk(plan, seq, chunked, may_preempt=False):
                self._release(seq, cancel=True)
                return

    def _chunk(self, plan: Plan, seq: Sequence, chunked: bool, may_preempt: bool) -> bool:
        """Plan the next prefill chunk of `seq` if budget and pages allow."""
        left, pending = self.token_budget - plan.num_tokens, seq.pending
        if chunked or (pending > self.token_budget and plan.num_tokens == 0):
            n = min(pending, left)
        else:
            n = pending if pending <= left else 0
        if n <= 0 or not self._reserve(plan, seq, n, may_preempt):
            return False
        toks = tuple(seq.tokens[seq.computed:seq.computed + n])
        plan.prefill.append(Chunk(seq.id, seq.computed, toks, n == pending))
        return True

    def _admission_order(self) -> list[Sequence]:
        def key(s: Sequence):
            hit = self.cache.match_length(s.tokens, len(s.tokens) - 1) \
                if self.cache is not None and self.cache_aware else 0
            return (-hit, s.request.arrival, s.id)
        return sorted(self.waiting, key=key)

    # ---- memory -------------------------------------------------------------------------
    def _room(self, pages: int) -> bool:
        """Evict cached prefixes until `pages` pages are free, if possible."""
        short = pages - self.pool.free_pages
        if short > 0 and self.cache is not None:
            self.cache.evict(short)
        return self.pool.free_pages >= pages

    def _admit(self, seq: Sequence) -> bool:
        """Move `seq` from waiting to running, reusing its longest cached prefix."""
        if self.cache is not None:
            seq.match = self.cache.acquire(seq.tokens, len(seq.tokens) - 1)
        shared = seq.match.pages if seq.match else ()
        if not self._room(self.slots * self.pool.slot_pages):
            if seq.match:
                self.cache.release(seq.match, cancel=True)
                seq.match = None
            return False
        self.pool.open(seq.id, shared, self.slots)
        seq.computed = seq.match.length if seq.match else 0
        self.waiting.remove(seq)
        self.running.append(seq)
        if seq.preemptions:
            self._count_readmission(seq, +1)
        return True

    def _count_readmission(self, seq: Sequence, sign: int) -> None:
        self.readmissions += sign
        self.readmit_tokens += sign * len(seq.tokens)
        self.readmit_hit_tokens += sign * seq.computed

    def _reserve(self, plan: Plan, seq: Sequence, n: int, may_preempt: bool) -> bool:
        """Pages for `n` more tokens of `seq`; preempts the newest running sequence (perhaps
        `seq` itself) while short, if allowed."""
        while not self._room(self.pool.pages_needed(seq.id, n)):
            if not may_preempt:
                return False
            victim = self.running[-1]
            if victim is seq and len(self.running) == 1:
                raise RuntimeError(f"sequence {seq.id} alone cannot fit: the capacity check "
                                   "in submit should have refused it")
            self._release(victim, cancel=False)
            self.preemptions += 1
            victim.preemptions += 1
            plan.preempted.append(victim.id)
            plan.prefill = [c for c in plan.prefill if c.seq != victim.id]
            plan.decode = [c for c in plan.decode if c.seq != victim.id]
            if victim is seq:
                return False
        self.pool.append(seq.id, n)
        return True

    def _release(self, seq: Sequence, cancel: bool) -> None:
        """Back to the queue with its pages freed (its KV will be recomputed); `cancel`: its
        admission in this step is taken back (and not counted)."""
        if cancel and seq.preemptions:
            self._count_readmission(seq, -1)
        self.pool.close(seq.id)
        if seq.match is not None:
            self.cache.release(seq.match, cancel=cancel)
            seq.match = None
        seq.computed = 0
        self.running.remove(seq)
        self.waiting.append(seq)

    def _share(self, seq: Sequence) -> None:
        """Cache `seq`'s prefilled pages now, not only when it finishes, so that requests
        arriving meanwhile can reuse them (SGLang's cache_unfinished_req): insert them, lock
        the longer path in place of the old one, and adopt the tree's copy of any page."""
        done = seq.tokens[:seq.computed]
        self.cache.insert(done, self.pool.block_table(seq.id))
        match = self.cache.acquire(done, count=False)
        if seq.match is not None:
            self.cache.release(seq.match)
        seq.match = match
        self.pool.share_prefix(seq.id, match.pages)

    def _finish(self, seq: Sequence) -> None:
        """`seq` has all its tokens: cache its whole pages, unlock, free the rest."""
        if self.cache is not None:
            self.cache.insert(seq.tokens[:seq.computed], self.pool.block_table(seq.id))
            if seq.match is not None:
                self.cache.release(seq.match)
        self.pool.close(seq.id)
        self.running.remove(seq)
        self.finished[seq.id] = seq

    def check(self) -> None:
        """Assert the pool's and the cache's invariants and that every running sequence
        holds exactly its computed tokens (call between steps)."""
        self.pool.check()
        if self.cache is not None:
            self.cache.check()
        assert sorted(self.pool.sequences) == sorted(s.id for s in self.running)
        for s in self.running:
            assert self.pool.length(s.id) == s.computed, (s.id, s.computed)
