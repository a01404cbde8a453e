"""The discrete-event simulator: the serving engine's own Scheduler, PagePool and RadixCache,
with the model replaced by a step-time predictor.

Nothing is re-implemented: `Simulator.run` is `refmodel.serving.steps.serve`, the loop the
engine runs, on a virtual clock. Each step the scheduler plans as it would under the engine
(admission, chunking, eviction, preemption, prefix hits: the same code, the same decisions);
instead of running the plan's model calls the simulator asks `step_time(plan)` how long the
step takes and moves the clock by that much. Sampled tokens are a placeholder, OUTPUT_TOKEN
(-1, never a prompt token), so outputs never extend a cached prefix here; the engine's real
outputs could, by chance: on the traces of this project prompts never contain earlier outputs.

So the simulator's error against the engine is the predictor's error compounded through the
queue; with a predictor that returns the engine's measured step times, the two timelines
are identical (tests/test_sim_simulator.py replays an engine run to check exactly that).

    sim = Simulator(step_time, num_pages=512, page_size=16, policy="mixed")
    run = sim.run(requests)        # a refmodel.serving.steps.Run, like Engine.run's

`host_time=True` adds the real time this process spends in the scheduler (schedule, commit:
the same Python the engine runs between its model calls) to the virtual clock, measured as
the simulation runs: what the engine pays on this machine beyond its calls. Off by default
(a simulated H100 does not run its scheduler on this CPU) and then every run is exactly
reproducible.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable

from refmodel.serving.pool import PagePool
from refmodel.serving.radix import RadixCache
from refmodel.serving.request import Plan, Request
from refmodel.serving.scheduler import Scheduler
from refmodel.serving.steps import Run, VirtualClock, serve

OUTPUT_TOKEN = -1


class HostClock(VirtualClock):
    """Virtual time plus the real time spent outside the predictor (the scheduler)."""

    def __init__(self):
        super().__init__()
        self.mark = time.perf_counter()

    def now(self) -> float:
        t = time.perf_counter()
        self.t, self.mark = self.t + (t - self.mark), t
        return self.t

    def resume(self) -> None:
        """Stop counting real time spent since the last `now` (the predictor's own)."""
        self.mark = time.perf_counter()


class Simulator:
    """A Scheduler over a PagePool (+ RadixCache) whose steps take `step_time(plan)` seconds.

    `state_slot_pages` > 0 models a model with state layers (a sliding ring, a recurrent
    state): each sequence holds a slot of that many pages and, as in the engine, the prefix
    cache is refused."""

    def __init__(self, step_time: Callable[[Plan], float], num_pages: int, page_size: int = 16,
                 policy: str = "mixed", token_budget: int = 256, max_running: int = 32,
                 prefix_cache: bool = True, cache_aware: bool = True,
                 state_slot_pages: int = 0, host_time: bool = False):
        if not callable(step_time):
            raise ValueError(f"step_time={step_time!r}: give a callable plan -> seconds")
        if not isinstance(state_slot_pages, int) or state_slot_pages < 0:
            raise ValueError(f"state_slot_pages={state_slot_pages!r}: must be an integer >= 0")
        if prefix_cache and state_slot_pages:
            raise ValueError("prefix_cache=True with state_slot_pages > 0: a cached prefix "
                             "cannot restore a state (the engine refuses it too)")
        self.step_time = step_time
        self.pool = PagePool(num_pages, page_size, max(1, state_slot_pages))
        self.cache = RadixCache(self.pool) if prefix_cache else None
        self.scheduler = Scheduler(self.pool, policy, token_budget, max_running, self.cache,
                                   cache_aware, slots=1 if state_slot_pages else 0)
        self.host_time = bool(host_time)
        self.clock = HostClock() if self.host_time else VirtualClock()
        self.times: list[float] = []  # each step's predicted seconds

    def execute(self, plan: Plan) -> dict[int, int]:
        self.clock.now()  # (host time) the scheduler's time up to here counts
        seconds = float(self.step_time(plan))
        if not seconds >= 0:  # also NaN
            raise ValueError(f"step {plan.step}: step_time gave {seconds!r} seconds; a step "
                             "takes a finite time >= 0")
        self.times.append(seconds)
        self.clock.skip(seconds)
        if self.host_time:
            self.clock.resume()  # the predictor's own time does not
        return {seq: OUTPUT_TOKEN for seq in plan.samples}

    def run(self, requests: Iterable[Request]) -> Run:
        """Serve `requests` to the end; the clock starts at 0, as the engine's does."""
        self.clock = HostClock() if self.host_time else VirtualClock()
        return serve(self.scheduler, list(requests), self.execute, self.clock)
