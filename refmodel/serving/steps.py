"""How a Plan becomes model calls, and what a run records: shared by the engine, which runs
the calls, and the simulator (refmodel/sim), which predicts their time. No JAX here.

The engine makes one call per prefill chunk (B = 1, T padded to a power of two, or to the
token budget with shapes="fixed"; a model with state layers, whose state would absorb
padding, runs a chunk of 13 tokens as calls of 8, 4 and 1) and one batched call for all of a
step's decodes (rows padded to a power of two, or to max_running with shapes="fixed"). So the
shapes are few and known in advance, and a table of their measured times predicts a step.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass

from refmodel.serving.metrics import Timeline
from refmodel.serving.request import Chunk, Plan, Request
from refmodel.serving.scheduler import Scheduler

SHAPES = ("pow2", "fixed")


def powers_of_two(n: int) -> list[int]:
    """n as a sum of distinct powers of two, largest first: 13 -> [8, 4, 1]."""
    return [1 << k for k in reversed(range(n.bit_length())) if n >> k & 1]


def bucket(n: int) -> int:
    """The power of two >= n (>= 1): shapes the jitted step is compiled for."""
    return 1 << max(0, math.ceil(math.log2(max(n, 1))))


def view_pages(max_len: int, page_size: int, T: int) -> int:
    """Pages in the fixed view of a call of T tokens: max_len's pages, plus room for T - 1
    padding tokens past the end (a write running off the view would be clamped back onto
    real tokens)."""
    return -(-max_len // page_size) + (-(-(T - 1) // page_size) if T > 1 else 0)


@dataclass(frozen=True)
class Call:
    """One model call: `chunks` (one per real row) padded to `rows` rows of `tokens` tokens."""

    chunks: tuple[Chunk, ...]
    rows: int  # B
    tokens: int  # T

    @property
    def shape(self) -> tuple[int, int]:
        return self.rows, self.tokens


def plan_calls(plan: Plan, has_state: bool, shapes: str, token_budget: int,
               max_running: int) -> list[Call]:
    """The engine's calls for `plan`, in the order it makes them."""
    calls = []
    for c in plan.prefill:
        if has_state:  # a state would absorb padding: pieces of 2^k tokens
            off = 0
            for n in powers_of_two(len(c.tokens)):
                piece = Chunk(c.seq, c.start + off, c.tokens[off:off + n],
                              c.samples and off + n == len(c.tokens))
                calls.append(Call((piece,), 1, n))
                off += n
            continue
        T = token_budget if shapes == "fixed" else bucket(len(c.tokens))  # one call, padded
        calls.append(Call((c,), 1, T))
    if plan.decode:
        B = max_running if shapes == "fixed" else bucket(len(plan.decode))
        calls.append(Call(tuple(plan.decode), B, 1))
    return calls


def call_shapes(has_state: bool, shapes: str, token_budget: int,
                max_running: int) -> list[tuple[int, int]]:
    """Every (rows, tokens) shape `plan_calls` can produce (what warmup compiles)."""
    pieces = [(1, 1 << k) for k in range(token_budget.bit_length())]  # state: 2^k pieces
    if shapes == "fixed":
        out = [(max_running, 1)] + (pieces if has_state else [(1, token_budget)])
    else:
        out = [(bucket(b), 1) for b in range(1, max_running + 1)]
        out += pieces if has_state else [(1, bucket(t)) for t in range(1, token_budget + 1)]
    return list(dict.fromkeys(out))


@dataclass
class Step:
    """What one step did and how long it took (seconds on the run's clock)."""

    time: float  # when the step started (schedule)
    seconds: float  # until the next step could start (schedule, calls, commit)
    busy: float  # until its tokens existed (schedule and calls): their time is time + busy
    prefill: tuple[tuple[int, int], ...]  # (sequence id, tokens) of each prefill chunk
    decode_rows: int
    preempted: int

    @property
    def prefill_tokens(self) -> int:
        return sum(n for _, n in self.prefill)


@dataclass
class Run:
    """The outcome of serving requests to the end (engine or simulator): every request's
    output and timeline, and the run's log."""

    outputs: dict[int, list[int]]
    timelines: dict[int, Timeline]
    steps: list[Step]
    usage: list[tuple[float, int, int]]  # (time, used pages, cached pages) after each step
    hit_tokens: int
    miss_tokens: int
    preemptions: int
    evicted_pages: int
    compiles: int
    prefix_cache: bool
    num_pages: int
    # requests readmitted after a preemption: how many times, the tokens they brought back
    # (prompt + output so far) and how many of those were prefix-cache hits
    readmissions: int = 0
    readmit_tokens: int = 0
    readmit_hit_tokens: int = 0


class WallClock:
    """Seconds since the run started, jumping over idle gaps (the engine's clock)."""

    def __init__(self):
        self.t0, self.skew = time.perf_counter(), 0.0

    def now(self) -> float:
        return time.perf_counter() - self.t0 + self.skew

    def skip(self, seconds: float) -> None:
        self.skew += seconds


class VirtualClock:
    """A simulated clock: it moves only when told (the simulator's clock)."""

    def __init__(self):
        self.t = 0.0

    def now(self) -> float:
        return self.t

    def skip(self, seconds: float) -> None:
        self.t += seconds


def serve(sched: Scheduler, requests: list[Request], execute: Callable[[Plan], dict],
          clock, progress: Callable[[int], None] | None = None,
          compiles: Callable[[], int] = lambda: 0) -> Run:
    """Serve `requests` to the end: plan = schedule(now); sampled = execute(plan); commit at
    the time the step ends. With nothing to run, the clock skips to the next arrival. The
    engine's `execute` runs the model on a wall clock; the simulator's advances a virtual
    clock by the step's predicted time. Returns this run's part of the logs."""
    sched.submit(requests)
    cache = sched.cache
    usage0, preempt0, compiles0 = len(sched.usage), sched.preemptions, compiles()
    readmit0 = sched.readmissions, sched.readmit_tokens, sched.readmit_hit_tokens
    hit0, miss0 = (cache.hit_tokens, cache.miss_tokens) if cache else (0, 0)
    evict0 = cache.evicted_pages if cache else 0
    steps: list[Step] = []
    while not sched.done:
        t = clock.now()
        plan = sched.schedule(t)
        if not plan.prefill and not plan.decode:
            nxt = sched.next_arrival()
            if nxt is None or sched.running:
                raise RuntimeError(f"step {plan.step}: nothing planned with "
                                   f"{len(sched.running)} running, {len(sched.waiting)} "
                                   "waiting")
            clock.skip(max(0.0, nxt - t))
            continue
        sampled = execute(plan)
        end = clock.now()  # the step's tokens exist from here on
        sched.commit(plan, sampled, end)
        steps.append(Step(t, clock.now() - t, end - t, tuple((c.seq, len(c.tokens))
                                                    for c in plan.prefill),
                          len(plan.decode), len(plan.preempted)))
        if progress is not None:
            progress(len(sampled))
    done = {r.id: sched.finished[r.id] for r in requests}
    return Run(outputs={i: list(s.output) for i, s in done.items()},
               timelines={i: Timeline.of(s) for i, s in done.items()},
               steps=steps, usage=sched.usage[usage0:],
               hit_tokens=cache.hit_tokens - hit0 if cache else 0,
               miss_tokens=cache.miss_tokens - miss0 if cache else
               sum(len(r.prompt) for r in requests),
               preemptions=sched.preemptions - preempt0,
               evicted_pages=cache.evicted_pages - evict0 if cache else 0,
               compiles=compiles() - compiles0,
               prefix_cache=cache is not None, num_pages=sched.pool.num_pages,
               readmissions=sched.readmissions - readmit0[0],
               readmit_tokens=sched.readmit_tokens - readmit0[1],
               readmit_hit_tokens=sched.readmit_hit_tokens - readmit0[2])
