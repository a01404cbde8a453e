"""Prefill/decode disaggregation: separate prefill and decode instances, the KV cache of
each prompt moved between them (Splitwise, Patel et al. 2024; DistServe, Zhong et al. 2024).

Colocated serving runs prefill and decode on the same instances, so a long prefill stalls
the decodes beside it (or chunked prefill slows them a little every step). Disaggregated
serving gives each phase its own instances and its own parallelism, and pays for it by
moving every prompt's KV cache over a link. Both are simulated here with the serving
engine's own scheduler (refmodel.sim.simulator), one Simulator per instance:

    colocated(requests, make, n)        n instances, requests dealt round-robin in arrival
                                        order, each instance prefills and decodes its own
    disaggregated(requests, make_prefill, make_decode, x, y, kv_bytes, link)
        1. x prefill instances: each request with max_new_tokens = 1 (its first token)
        2. its prompt's KV (kv_bytes(request), from the cost model) crosses `link`:
           arrival at decode = first token + link.send(bytes)
        3. y decode instances: the request as prompt + first token, max_new_tokens - 1; the
           prompt's KV is installed, not computed: the decode instance's predictor is
           wrapped by `installed`, which charges the step's decodes and, for a sequence
           whose KV just arrived, one decode of its first token at context len(prompt)
        The timeline is the first token's time from (1) and the rest from (3): TTFT is
        the prefill instance's, the transfer shows in the first inter-token gap.

Routing is round-robin (in arrival order) on both sides: simple and stated; a real router
balances load (DistServe places by queue length). The timelines are judged elsewhere
(microbench.studies.scale: p99 TTFT and TPOT against published SLOs, per chip the design uses).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from refmodel.serving import metrics
from refmodel.serving.request import Chunk, Plan, Request
from refmodel.sim.cluster import Link
from refmodel.sim.simulator import Simulator

FIRST_TOKEN = 0  # stands for the first output token in the decode side's prompt


def deal(requests: Sequence[Request], n: int) -> list[list[Request]]:
    """Round-robin in arrival order."""
    if not isinstance(n, int) or n < 1:
        raise ValueError(f"instances={n!r}: must be a positive integer")
    ordered = sorted(requests, key=lambda r: (r.arrival, r.id))
    return [ordered[i::n] for i in range(n)]


def colocated(requests: Sequence[Request], make: Callable[[], Simulator], n: int
              ) -> dict[int, metrics.Timeline]:
    """Each of n instances (Simulators from `make`) serves its round-robin share."""
    out = {}
    for share in deal(requests, n):
        if share:
            out.update(make().run(share).timelines)
    return out


def installed(step_time: Callable[[Plan], float]) -> Callable[[Plan], float]:
    """A decode instance's predictor: prefill chunks are KV arriving, not computed; a chunk
    that ends a prompt is its first token's decode (at context start + len - 1)."""
    def time_of(plan: Plan) -> float:
        decode = list(plan.decode)
        for c in plan.prefill:
            if c.samples:
                pos = c.start + len(c.tokens) - 1
                decode.append(Chunk(c.seq, pos, (c.tokens[-1],), True))
        return step_time(Plan(plan.step, [], decode)) if decode else 0.0
    return time_of


def disaggregated(requests: Sequence[Request], make_prefill: Callable[[], Simulator],
                  make_decode: Callable[[], Simulator], x: int, y: int,
                  kv_bytes: Callable[[Request], float], link: Link) -> dict:
    """Timelines of every request through x prefill and y decode instances, and the KV
    transfers: {"timelines": {id: Timeline}, "transfers": {id: {bytes, seconds}}}.
    `make_decode` must build Simulators whose predictor is wrapped by `installed`."""
    firsts: dict[int, float] = {}
    for share in deal(requests, x):
        if share:
            run = make_prefill().run([Request(r.id, r.prompt, 1, r.arrival) for r in share])
            firsts.update({i: t.token_times[0] for i, t in run.timelines.items()})
    transfers, onward = {}, []
    for r in requests:
        nbytes = float(kv_bytes(r))
        seconds = link.send(nbytes)
        transfers[r.id] = {"bytes": nbytes, "seconds": seconds}
        if r.max_new_tokens > 1:
            onward.append(Request(r.id, r.prompt + (FIRST_TOKEN,), r.max_new_tokens - 1,
                                  firsts[r.id] + seconds))
    rest: dict[int, tuple[float, ...]] = {}
    for share in deal(onward, y):
        if share:
            rest.update({i: t.token_times for i, t in make_decode().run(share).timelines.items()})
    timelines = {r.id: metrics.Timeline(r.arrival, (firsts[r.id],) + rest.get(r.id, ()))
                 for r in requests}
    return {"timelines": timelines, "transfers": transfers}

