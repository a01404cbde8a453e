"""Serving measured: the engine under a seeded chat trace, per policy, rate and pool size.

What `python -m microbench serve` runs, in this order, on one model and one trace shape. The
workload and the method are fixed here, before anything is measured:

- Workload (`sharegpt`, the default): a shared system prompt, then each request's own prompt
  and output with ShareGPT's mean lengths as the vLLM paper reports them (161.31 and 337.99
  tokens), scaled by `length_scale` (1/8: the small model and the time budget), lognormal with
  a long tail (refmodel.serving.workloads.chat_like), Poisson arrivals.
- SLOs, defined once: `slo_scale` x the unloaded TTFT and TPOT of one reference request (the
  workload's mean prompt and output lengths, prefix cache off) served alone by the reference
  model `slo_model` on this engine. Every policy and rate is judged against the same two
  numbers; a different served model keeps them (they are not its own batch-1 latency).
- Saturation, measured: the `mixed` policy's completion rate with every request queued at
  once (metrics.completion_rate), the median of 3 runs. The swept rates are `rate_fractions`
  of it, from light load to 1.5x past it. It is measured again after the sweep: on a shared
  machine whose speed drifts, the two differ, and the figure says so.
- Goodput and attainment in a steady-state window: the requests arriving between the `trim`
  first and last arrivals (metrics.steady), so warm-up and drain do not count.

1. Policies x rates: each policy (static batching is the baseline) on the same trace at each
   rate; transformers' static batches as a peer at the lowest rate only, on the trace's first
   `peer_requests` requests (it saturates far below that rate, and its generate loop takes
   minutes per trace of these lengths).
2. Prefix caching at matched, unsaturated load: the cache-off saturation measured the same
   way, then one trace at `prefix_load` x it, served with the radix cache on and off:
   prefill tokens computed and TTFT with and without, and both attainments (both runs must be
   below saturation for the ratio to mean what it says).
3. Pool size: the mixed run at the swept rate nearest `pool_rate_fraction` again with smaller
   pools: hit rate, preemptions, and readmissions after preemption (what they re-prefill and
   how much of it the radix cache still holds).
4. Decode step: the engine's decode step with B running sequences at context S against the
   plain batched `Phases` decode at the same B and S, timed in the same run (`decode_ratio`);
   where the engine's page kernels are native, again with XLA's (a gathered view per layer).

Every run is warmed up first: all its shapes are compiled before the clock starts (each run
records `compiles`, the shapes compiled during the run itself: 0 when warmup covered them).
"""

from __future__ import annotations

import dataclasses
import math
import time

import jax
import numpy as np

import refmodel
from microbench.phases.report import LLAMA_MODEL, llama_spec
from refmodel.serving import Request, metrics, workloads
from refmodel.serving.engine import Engine
from refmodel.serving.pool import pages_for

KIND = "serve"


@dataclasses.dataclass(frozen=True)
class Setup:
    """Everything a serve measurement depends on (recorded in the results)."""

    model: str = "small"
    attention: str | None = None
    workload: str = "sharegpt"  # a key of WORKLOADS
    requests: int = 128  # per run of the policy sweep
    system_len: int = 256  # shared system prompt (sharegpt, shared; few-shot prefix)
    length_scale: float = 0.125  # x ShareGPT's mean lengths (and vLLM's length filter)
    prompt_len: float | None = None  # other workloads' means; None: ShareGPT's x length_scale
    output_len: float | None = None
    spread: float = workloads.CHAT_SPREAD  # sigma of the log lengths
    page_size: int = 16
    token_budget: int = 256
    max_running: int = 8
    policies: tuple[str, ...] = ("mixed", "prefill-first", "decode-first", "static")
    rate_fractions: tuple[float, ...] = (0.25, 0.5, 0.75, 1.0, 1.25, 1.5)  # of saturation
    rates: tuple[float, ...] | None = None  # requests/s; given, they replace the fractions
    trim: float = 0.1  # steady-state window: drop this fraction of arrivals at each end
    slo_scale: float = 5.0
    slo_model: str = "small"  # the reference model the SLOs are scaled from
    attainment_target: float = 0.9
    prefix_load: float = 0.25  # the prefix-cache pair's rate, x the cache-off saturation
    prefix_requests: int = 64
    pool_rate_fraction: float = 0.75  # pool runs at the swept rate nearest this fraction
    pool_fractions: tuple[float, ...] = (0.3, 0.2, 0.12)  # of the pool that holds everything
    decode_batch: int = 8
    decode_context: int = 511
    decode_steps: int = 40  # decode steps timed per round of the comparison
    decode_rounds: int = 3
    peer: bool = True  # transformers' static-batch generate on the policy traces, if installed
    peer_rates: int = 1  # ... at the lowest this many swept rates (it saturates far below)
    peer_requests: int = 32  # ... on this many of the trace's first requests (it is slow)
    seed: int = 0

    def check(self) -> None:
        for name in ("requests", "system_len", "page_size", "token_budget", "max_running",
                     "prefix_requests", "decode_batch", "decode_context", "decode_steps",
                     "decode_rounds", "peer_rates", "peer_requests"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name}={value!r} must be a positive integer")
        if self.workload not in WORKLOADS:
            raise ValueError(f"workload={self.workload!r}: choose one of {sorted(WORKLOADS)}")
        for name in ("length_scale", "slo_scale", "prefix_load", "pool_rate_fraction"):
            _positive(name, getattr(self, name))
        for name in ("prompt_len", "output_len"):
            if getattr(self, name) is not None:
                if self.workload == "sharegpt":
                    raise ValueError(f"{name}={getattr(self, name)!r}: the sharegpt workload "
                                     "takes its lengths from length_scale; give it another "
                                     f"workload ({sorted(set(WORKLOADS) - {'sharegpt'})})")
                _positive(name, getattr(self, name))
        if not (math.isfinite(self.spread) and self.spread >= 0):
            raise ValueError(f"spread={self.spread!r} must be a number >= 0")
        if not 0 <= self.trim < 0.5:
            raise ValueError(f"trim={self.trim!r} must be in [0, 0.5)")
        if not 0 < self.attainment_target <= 1:
            raise ValueError(f"attainment_target={self.attainment_target!r} must be in (0, 1]")
        for name in ("rate_fractions", "pool_fractions", "rates"):
            values = getattr(self, name)
            if values is None and name == "rates":
                continue
            if not values or not all(math.isfinite(v) and v > 0 for v in values):
                raise ValueError(f"{name}={values!r}: give one or more positive numbers")
        if any(f > 1 for f in self.pool_fractions):
            raise ValueError(f"pool_fractions={self.pool_fractions!r}: each must be <= 1 (a "
                             "fraction of the pool that holds every request at once)")
        from refmodel.serving.scheduler import POLICIES
        if not self.policies:
            raise ValueError(f"policies is empty: give at least one of {POLICIES}")
        for p in self.policies:
            if p not in POLICIES:
                raise ValueError(f"policy {p!r}: choose from {POLICIES}")


def _positive(name: str, value) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or \
            not (math.isfinite(value) and value > 0):
        raise ValueError(f"{name}={value!r} must be a positive number")


def config(setup: Setup, preset: str | None = None) -> refmodel.ModelConfig:
    """The served model's config (or `preset`'s, e.g. the SLO reference model's)."""
    names = sorted(refmodel.presets.PRESETS)
    for field, name in (("model", setup.model), ("slo_model", setup.slo_model)):
        if name not in names:
            raise ValueError(f"{field}={name!r}: choose one of {names}")
    cfg = refmodel.presets.get(preset or setup.model)
    if setup.attention is not None:
        kinds = refmodel.attention.registered()
        if setup.attention not in kinds:
            raise ValueError(f"attention={setup.attention!r}: choose one of {list(kinds)}")
        if preset is None:  # the served model's override; a reference stays as preset
            cfg = dataclasses.replace(cfg, attention=setup.attention, layer_pattern=None)
    return cfg


def mean_lengths(setup: Setup) -> tuple[float, float]:
    """The workload's asked mean own-prompt and output lengths (before vLLM's filter)."""
    p, o = (workloads.SHAREGPT[k] * setup.length_scale for k in ("input_mean", "output_mean"))
    if setup.workload == "sharegpt":
        return p, o
    return setup.prompt_len or p, setup.output_len or o


# Workloads (refmodel.serving.workloads), each called with the setup's lengths:
# system_len is the shared part (system prompt; few-shot prefix; ignored by random and chat).
def _sharegpt(s, n, rate, vocab, seed):
    return workloads.chat_like(n, rate, s.length_scale, s.system_len, s.spread, vocab, seed)


def _shared(s, n, rate, vocab, seed):
    p, o = mean_lengths(s)
    return workloads.shared_prefix(n, rate, system_len=s.system_len, prompt_len=p,
                                   output_len=o, vocab=vocab, seed=seed, spread=s.spread)


def _random(s, n, rate, vocab, seed):
    p, o = mean_lengths(s)
    return workloads.random_requests(n, rate, prompt_len=p, output_len=o, vocab=vocab,
                                     seed=seed, spread=s.spread)


def _few_shot(s, n, rate, vocab, seed):
    p, o = mean_lengths(s)
    return workloads.few_shot(n, rate, shots=4, shot_len=s.system_len / 4, question_len=p,
                              output_len=o, tasks=2, vocab=vocab, seed=seed, spread=s.spread)


def _chat(s, n, rate, vocab, seed):
    p, o = mean_lengths(s)
    return workloads.multi_turn(max(1, n // 3), 3, rate, user_len=p, output_len=o,
                                think_time=1.0 / rate if math.isfinite(rate) else 0.0,
                                vocab=vocab, seed=seed, spread=s.spread)


WORKLOADS = {"sharegpt": _sharegpt, "shared": _shared, "random": _random,
             "few-shot": _few_shot, "chat": _chat}


def trace(setup: Setup, cfg, rate: float, n: int | None = None, seed: int | None = None):
    """The run's requests from the setup's workload at `rate` requests/s."""
    return WORKLOADS[setup.workload](setup, n or setup.requests, rate, cfg.vocab_size,
                                     setup.seed if seed is None else seed)


def describe(requests) -> dict:
    """What a trace's lengths are: means, spread and tail of its prompts and outputs."""
    out = {}
    for key, xs in (("prompt", [len(r.prompt) for r in requests]),
                    ("output", [r.max_new_tokens for r in requests])):
        x = np.asarray(xs, dtype=float)
        out[key] = {"mean": float(x.mean()), "cv": float(x.std() / x.mean()),
                    "p50": float(np.median(x)), "p99": float(np.percentile(x, 99)),
                    "max": int(x.max())}
    return out


def _max_len(setup: Setup, requests) -> int:
    longest = max(len(r.prompt) + r.max_new_tokens for r in requests)
    return pages_for(longest, setup.page_size) * setup.page_size


def _engine(model, setup: Setup, num_pages: int, max_len: int, policy: str = "mixed",
            prefix_cache: bool | None = None, array_pages: int | None = None) -> Engine:
    engine = Engine(model, num_pages=num_pages, page_size=setup.page_size, policy=policy,
                    token_budget=setup.token_budget, max_running=setup.max_running,
                    prefix_cache=prefix_cache, max_len=max_len, array_pages=array_pages)
    engine.warmup()
    return engine


def record(run, requests, slo: dict, label: dict, trim: float = 0.1) -> dict:
    """One run as JSON: its settings, whole-run summary, steady-state window, prefill and
    readmission counts, per-request latencies and pool usage."""
    timelines = [run.timelines[r.id] for r in requests]
    summary = metrics.summarize(timelines, slo["ttft_s"], slo["tpot_s"])
    first_hits = run.hit_tokens - run.readmit_hit_tokens
    first_all = run.hit_tokens + run.miss_tokens - run.readmit_tokens
    return {
        **label,
        "summary": summary,
        "steady": _steady(timelines, slo, trim),
        "mean_ttft_s": float(np.mean([t.ttft for t in timelines])),
        "prefill_tokens": sum(s.prefill_tokens for s in run.steps),
        "prompt_tokens": sum(len(r.prompt) for r in requests),
        "hit_rate": metrics.hit_rate(run.hit_tokens, run.miss_tokens),
        "hit_tokens": run.hit_tokens, "miss_tokens": run.miss_tokens,
        # the hit rate of first admissions alone (readmissions after preemption left out)
        "first_admission_hit_rate": first_hits / first_all if first_all else 0.0,
        "readmissions": run.readmissions, "readmit_tokens": run.readmit_tokens,
        "readmit_hit_tokens": run.readmit_hit_tokens,
        "preemptions": run.preemptions, "evicted_pages": run.evicted_pages,
        "compiles": run.compiles, "prefix_cache": run.prefix_cache,
        "num_pages": run.num_pages,
        "utilization": metrics.utilization(run.usage, run.num_pages),
        "steps": len(run.steps),
        "requests": [{"id": r.id, "arrival_s": r.arrival, "prompt": len(r.prompt),
                      "output": r.max_new_tokens, "ttft_s": run.timelines[r.id].ttft,
                      "tpot_s": _num(run.timelines[r.id].tpot),
                      "e2e_s": run.timelines[r.id].e2e} for r in requests],
        "usage": [[round(t, 6), u, c] for t, u, c in run.usage],
    }


def _steady(timelines, slo: dict, trim: float) -> dict | None:
    """metrics.steady, or None where the window is empty (every request at once)."""
    try:
        return metrics.steady(timelines, slo["ttft_s"], slo["tpot_s"], trim)
    except ValueError:
        return None


def _num(x: float) -> float | None:
    return None if math.isnan(x) else float(x)


def reference_requests(setup: Setup, cfg, repeats: int = 3) -> list[Request]:
    """The SLO reference request, `repeats` times (fresh random tokens each): the workload's
    mean lengths, system prompt included, alone (arrivals far apart)."""
    p, o = mean_lengths(setup)
    shared = setup.system_len if setup.workload in ("sharegpt", "shared", "few-shot") else 0
    rng = np.random.default_rng(setup.seed + 1)
    return [Request(i, tuple(int(t) for t in rng.integers(0, cfg.vocab_size,
                                                          shared + round(p))),
                    max(1, round(o)), arrival=0.0) for i in range(repeats)]


def reference_slo(model, setup: Setup, cfg, max_len: int, pool: int) -> dict:
    """The SLOs, once for the whole measurement: slo_scale x the TTFT and TPOT of the reference
    request served alone by `slo_model` (medians of 3, prefix cache off: the cold latency of a
    first request). With slo_model the served model, the engine has the policy runs' shapes
    (max_len, `pool` array rows), so their compiles are shared."""
    ref_cfg = config(setup, setup.slo_model)
    reqs = reference_requests(setup, ref_cfg)
    if setup.slo_model != setup.model or setup.attention is not None:
        model = refmodel.init(ref_cfg, seed=setup.seed)
        max_len = _max_len(setup, reqs)
        pool = pages_for(max_len, setup.page_size) + 1
    engine = _engine(model, setup, pool, max_len, prefix_cache=False, array_pages=pool)
    out = {"ttft_s": [], "tpot_s": [], "e2e_s": []}
    for r in reqs:
        t = engine.run([r]).timelines[r.id]
        for k, v in (("ttft_s", t.ttft), ("tpot_s", t.tpot), ("e2e_s", t.e2e)):
            out[k].append(v)
    alone = {k: float(np.median(v)) for k, v in out.items()}
    return {"ttft_s": setup.slo_scale * alone["ttft_s"],
            "tpot_s": setup.slo_scale * alone["tpot_s"], "scale": setup.slo_scale,
            "reference": {"model": setup.slo_model, "label": refmodel.attention.label(ref_cfg),
                          "prompt": len(reqs[0].prompt), "output": reqs[0].max_new_tokens,
                          "prefix_cache": False, "repeats": len(reqs), **alone}}


def saturation(model, setup: Setup, cfg, max_len: int, pool: int, n: int,
               prefix_cache: bool = True, policy: str = "mixed", repeats: int = 3) -> dict:
    """The rate this engine sustains: `policy`'s completion rate (metrics.completion_rate)
    with n requests of the workload all queued at t = 0; the median of `repeats` runs (one
    run moves by 20-30% on a shared machine)."""
    reqs = trace(setup, cfg, math.inf, n=n)
    rates = []
    for _ in range(repeats):
        engine = _engine(model, setup, pool, max_len, policy, prefix_cache=prefix_cache,
                         array_pages=pool)
        run = engine.run(reqs)
        rates.append(metrics.completion_rate(list(run.timelines.values()), setup.trim))
    rate = float(np.median(rates))
    return {"requests_per_s": rate, "runs_requests_per_s": rates, "policy": policy,
            "prefix_cache": prefix_cache, "requests": n, "trim": setup.trim,
            "output_tokens_per_s": rate * float(np.mean([r.max_new_tokens for r in reqs]))}


def decode_ratio(model, setup: Setup, repeats: int = 40, rounds: int = 3,
                 kernels: str = "auto") -> dict:
    """Tokens/s of the engine's decode steps with B sequences at context S against the jitted
    `Phases` decode at (B, S) (a contiguous cache of S + 1 tokens), in the same run. The
    engine's view is the same S + 1 tokens (rounded up to a page): its requests' prompts are
    S - repeats long and decode up to position S, so both attend over arrays of one length.

    Two comparisons, each like with like and each a median over `rounds` rounds of a ratio
    measured within one round (the machine drifts between rounds, not within one):
    - `ratio`: a whole step of `Engine.run` (schedule, the paged model call, commit), median
      over the decode-only steps of B requests, against a Phases call made after each of those
      steps (between steps, outside their clock: step for step, so drift within the round
      falls on both; a block of Phases calls before the run drifts apart from the run's steps
      by a different amount in every round);
    - `call_ratio`: the paged model call alone (gather, model, scatter) of the B decoding
      sequences against the Phases call, timed alternately, call for call (each evicts the
      other's data from the caches, so both are slower than back to back).

    `kernels` is the Engine's option (how a step reads the pages: native decode attention in
    place, or a view gathered by XLA); the result names the one used."""
    B, S, ps = setup.decode_batch, setup.decode_context, setup.page_size
    if S <= repeats:
        raise ValueError(f"decode_context={S} must exceed the {repeats} decode steps timed")
    contiguous_call = _ContiguousDecode(model, B, S)
    rng = np.random.default_rng(setup.seed)
    max_len = pages_for(S + 1, ps) * ps
    reqs = [refmodel.serving.Request(i, tuple(rng.integers(0, model.cfg.vocab_size,
                                                          S - repeats)), repeats + 1)
            for i in range(B)]
    out = {"phases_step_s": [], "engine_step_s": [], "phases_interleaved_s": [],
           "engine_call_s": []}
    for _ in range(rounds):
        medians, used = _ratio_round(model, setup, reqs, max_len, repeats, kernels,
                                     contiguous_call)
        for key, x in zip(out, medians, strict=True):
            out[key].append(x)
    ratios = [p / e for p, e in zip(out["phases_step_s"], out["engine_step_s"], strict=True)]
    calls = [p / e for p, e in zip(out["phases_interleaved_s"], out["engine_call_s"],
                                   strict=True)]
    step_s, phases_s = float(np.median(out["engine_step_s"])), \
        float(np.median(out["phases_step_s"]))
    return {"batch": B, "context": S, "view_tokens": max_len, "steps_per_round": repeats,
            "kernels": used,
            "rounds": rounds, **{f"{k}_by_round": v for k, v in out.items()},
            "engine_step_s": step_s, "phases_step_s": phases_s,
            "engine_tokens_per_s": B / step_s, "phases_tokens_per_s": B / phases_s,
            "ratio_by_round": ratios, "call_ratio_by_round": calls,
            "ratio": float(np.median(ratios)), "call_ratio": float(np.median(calls))}


class _ContiguousDecode:
    """The jitted `Phases` decode at (B, S) on a contiguous cache of S + 1 tokens, compiled
    and warm; each call is one step at context S, its seconds returned."""

    def __init__(self, model, batch: int, context: int):
        phases = refmodel.Phases(model)
        self.state, self.token, cache = phases.example_args("decode", batch, context, fill=True)
        self.fn = phases.jitted["decode"]
        _, self.cache = self.fn(self.state, self.token, cache)  # compile and warm

    def __call__(self) -> float:
        self.cache = self.cache.replace(pos=self.cache.pos - 1)  # stay at context S
        t = time.perf_counter()
        out, self.cache = self.fn(self.state, self.token, self.cache)
        jax.block_until_ready(out)
        return time.perf_counter() - t


def _decode_engine(model, setup: Setup, max_len: int, kernels: str) -> Engine:
    B, ps = setup.decode_batch, setup.page_size
    e = Engine(model, num_pages=B * pages_for(max_len, ps), page_size=ps, policy="mixed",
               token_budget=max_len, max_running=B, prefix_cache=False,
               max_len=max_len, shapes="fixed", kernels=kernels)
    e.warmup()
    return e


def _ratio_round(model, setup: Setup, reqs: list, max_len: int, repeats: int, kernels: str,
                 contiguous_call) -> tuple[list[float], str]:
    """One round of `decode_ratio`: the medians of (Phases calls after each step, the engine's
    decode steps, Phases calls alternating with, the engine's paged calls alone), and the
    page kernels the engine used."""
    B = setup.decode_batch
    after: list[float] = []  # a Phases call after every step of the run
    run = _decode_engine(model, setup, max_len, kernels).run(
        reqs, progress=lambda _, a=after: a.append(contiguous_call()))
    pairs = [(s.seconds, p) for s, p in zip(run.steps, after, strict=True)
             if s.decode_rows == B and not s.prefill]  # the prompts' steps, then decodes
    steps, block = [e for e, _ in pairs], [p for _, p in pairs]
    # the same requests, stopped once all B decode: that call alone
    alone = _decode_engine(model, setup, max_len, kernels)
    alone.scheduler.submit(reqs)
    plan = alone.scheduler.schedule(0.0)
    while plan.prefill or len(plan.decode) < B:  # one prompt's prefill per step
        alone.scheduler.commit(plan, alone.execute(plan), 0.0)
        plan = alone.scheduler.schedule(0.0)
    calls, contiguous = [], []
    for _ in range(repeats):
        contiguous.append(contiguous_call())
        t = time.perf_counter()
        np.asarray(alone._call(plan.decode, B, 1))  # rewrites the same positions
        calls.append(time.perf_counter() - t)
    return [float(np.median(xs)) for xs in (block, steps, contiguous, calls)], alone.kernels



@dataclasses.dataclass
class _Load:
    """What every run of one serve measurement shares: the SLOs, the measured saturation, the
    pool that holds every running sequence, and the swept rates with their traces."""

    cfg: refmodel.ModelConfig
    slo: dict
    saturation: dict
    max_len: int
    full_pool: int
    fractions: tuple
    rates: list
    traces: list


def _load(model, setup: Setup, cfg, say) -> _Load:
    """The SLOs, the saturation they do not depend on, and the traces at each rate, with the
    pool sized for the longest request of any run."""
    def full_pool(max_len: int) -> int:
        return setup.max_running * pages_for(max_len, setup.page_size) + \
            pages_for(setup.system_len, setup.page_size)

    # lengths do not depend on the rate (same seed, same draws): size the pool first
    probe = trace(setup, cfg, 1.0) + trace(setup, cfg, math.inf) + \
        trace(setup, cfg, 1.0, n=setup.prefix_requests) + \
        trace(setup, cfg, math.inf, n=setup.prefix_requests) + reference_requests(setup, cfg)
    max_len = _max_len(setup, probe)
    say("unloaded latency of the SLO reference")
    slo = reference_slo(model, setup, cfg, max_len, full_pool(max_len))
    say("saturation (every request queued at once)")
    sat = saturation(model, setup, cfg, max_len, full_pool(max_len), setup.requests)
    fractions = setup.rate_fractions if setup.rates is None else \
        tuple(r / sat["requests_per_s"] for r in setup.rates)
    rates = [f * sat["requests_per_s"] for f in fractions]
    traces = [trace(setup, cfg, rate) for rate in rates]
    if _max_len(setup, [r for t in traces for r in t]) > max_len:  # chat's lengths may vary
        max_len = _max_len(setup, [r for t in traces for r in t] + probe)
    return _Load(cfg, slo, sat, max_len, full_pool(max_len), fractions, rates, traces)


def measure(setup: Setup, progress=None) -> dict:
    """Every part of the serve measurement; `progress(str)` is told what runs next."""
    setup.check()
    cfg = config(setup)
    model = refmodel.init(cfg, seed=setup.seed)
    say = progress or (lambda _: None)
    load = _load(model, setup, cfg, say)
    runs = _policy_runs(model, setup, load, say)
    say("saturation again, after the sweep (has the machine's speed drifted?)")
    sat_after = saturation(model, setup, cfg, load.max_len, load.full_pool, setup.requests)
    peer_runs, peer = _peer_runs(setup, load, say)
    prefix_runs, sat_off = _prefix_runs(model, setup, load, say)
    runs += peer_runs + prefix_runs + _pool_runs(model, setup, load, say)
    say("decode step: engine vs Phases")
    steps, rounds = setup.decode_steps, setup.decode_rounds
    ratio = decode_ratio(model, setup, steps, rounds)
    if ratio["kernels"] == "native":  # the same comparison on XLA's path, for the record
        say("decode step: engine (XLA's page gather) vs Phases")
        xla = decode_ratio(model, setup, steps, rounds, kernels="xla")
        ratio["xla"] = {k: xla[k] for k in ("ratio", "call_ratio", "ratio_by_round",
                                            "call_ratio_by_round", "engine_step_s",
                                            "phases_step_s")}
    result = {"kind": KIND, "setup": dataclasses.asdict(setup),
              "model": {"preset": setup.model, "label": refmodel.attention.label(cfg),
                        "dtype": cfg.dtype, "params": refmodel.costs.param_counts(cfg)["total"]},
              "workload": {"name": setup.workload, "length_scale": setup.length_scale,
                           "spread": setup.spread, "sharegpt": workloads.SHAREGPT,
                           "lengths": describe(load.traces[0])},
              "slo": load.slo, "saturation": load.saturation, "saturation_after": sat_after,
              "saturation_no_cache": sat_off,
              "full_pool_pages": load.full_pool, "max_len": load.max_len, "runs": runs,
              "decode": ratio, "peer": peer}
    result["claims"] = claims(result)
    return result


def _policy_runs(model, setup: Setup, load: _Load, say) -> list[dict]:
    """Each policy on the same trace at each rate, with the full pool."""
    runs = []
    for policy in setup.policies:
        for frac, rate, reqs in zip(load.fractions, load.rates, load.traces, strict=True):
            say(f"{policy} at {rate:.2f} requests/s")
            engine = _engine(model, setup, load.full_pool, load.max_len, policy,
                             array_pages=load.full_pool)
            runs.append(record(engine.run(reqs), reqs, load.slo,
                               {"experiment": "policy", "policy": policy, "rate": rate,
                                "rate_fraction": frac}, setup.trim))
    return runs


def _peer_runs(setup: Setup, load: _Load, say) -> tuple[list[dict], dict]:
    """transformers' static batches on the policy traces (setup.peer): (its runs, what it
    was or why it did not run)."""
    if not setup.peer:
        return [], {"name": HF_NAME, "error": "not asked for (peer=False)"}
    say("transformers generate, static batches")
    lowest = sorted(range(len(load.rates)), key=lambda i: load.rates[i])[:setup.peer_rates]
    traces = [load.traces[i][:setup.peer_requests] for i in lowest]
    peer = hf_static(load.cfg, traces, setup.max_running)
    runs = []
    for i, reqs, done in zip(lowest, traces, peer.get("runs", [None] * len(lowest)),
                             strict=True):
        frac, rate = load.fractions[i], load.rates[i]
        if done is None:
            break
        runs.append(peer_record(done, reqs, load.slo, {"experiment": "peer",
                                                       "policy": "hf static", "rate": rate,
                                                       "rate_fraction": frac}, setup.trim))
    return runs, {k: v for k, v in peer.items() if k != "runs"}


def _prefix_runs(model, setup: Setup, load: _Load, say) -> tuple[list[dict], dict]:
    """The radix cache on and off at one rate below both saturations: the cache-off
    saturation measured as the cache-on one was, then a trace at prefix_load x it served
    both ways (mixed, full pool). Returns the two runs and the cache-off saturation."""
    n = setup.prefix_requests
    say("saturation without the prefix cache")
    sat_off = saturation(model, setup, load.cfg, load.max_len, load.full_pool, n,
                         prefix_cache=False)
    rate = setup.prefix_load * min(sat_off["requests_per_s"],
                                   load.saturation["requests_per_s"])
    reqs = trace(setup, load.cfg, rate, n=n)
    runs = []
    for cache in (True, False):
        say(f"prefix cache {'on' if cache else 'off'} at {rate:.2f} requests/s")
        engine = _engine(model, setup, load.full_pool, load.max_len, "mixed",
                         prefix_cache=cache, array_pages=load.full_pool)
        runs.append(record(engine.run(reqs), reqs, load.slo,
                           {"experiment": f"prefix cache {'on' if cache else 'off'}",
                            "policy": "mixed", "rate": rate,
                            "rate_fraction": rate / load.saturation["requests_per_s"]},
                           setup.trim))
    return runs, sat_off


def pool_rate_index(setup: Setup, fractions) -> int:
    """Which swept rate the pool runs use: the one nearest pool_rate_fraction."""
    return int(np.argmin([abs(f - setup.pool_rate_fraction) for f in fractions]))


def _pool_runs(model, setup: Setup, load: _Load, say) -> list[dict]:
    """The mixed run at the pool rate again with smaller pools (the full pool's run is the
    policy run at that rate)."""
    i = pool_rate_index(setup, load.fractions)
    rate, reqs, frac = load.rates[i], load.traces[i], load.fractions[i]
    smallest = pages_for(load.max_len, setup.page_size)  # one sequence must fit
    runs = []
    for pool_frac in setup.pool_fractions:
        pages = max(smallest, int(round(pool_frac * load.full_pool)))
        say(f"pool of {pages} pages")
        engine = _engine(model, setup, pages, load.max_len, "mixed",
                         array_pages=load.full_pool)
        runs.append(record(engine.run(reqs), reqs, load.slo,
                           {"experiment": "pool", "policy": "mixed", "rate": rate,
                            "rate_fraction": frac, "pool_fraction": pool_frac}, setup.trim))
    return runs


def peer_record(done: list[dict], requests, slo: dict, label: dict, trim: float = 0.1) -> dict:
    """A peer's run in the shape of `record` (no pool, no cache: those fields are None)."""
    tl = {d["id"]: metrics.Timeline(d["arrival"], tuple(d["token_times"])) for d in done}
    timelines = [tl[r.id] for r in requests]
    return {
        **label,
        "summary": metrics.summarize(timelines, slo["ttft_s"], slo["tpot_s"]),
        "steady": _steady(timelines, slo, trim),
        "mean_ttft_s": float(np.mean([t.ttft for t in timelines])),
        "prefill_tokens": None, "prompt_tokens": sum(len(r.prompt) for r in requests),
        "hit_rate": None, "hit_tokens": None, "miss_tokens": None,
        "first_admission_hit_rate": None, "readmissions": None, "readmit_tokens": None,
        "readmit_hit_tokens": None, "preemptions": None, "evicted_pages": None,
        "compiles": None, "prefix_cache": False, "num_pages": None,
        "utilization": None, "steps": None,
        "requests": [{"id": r.id, "arrival_s": r.arrival, "prompt": len(r.prompt),
                      "output": r.max_new_tokens, "ttft_s": tl[r.id].ttft,
                      "tpot_s": _num(tl[r.id].tpot), "e2e_s": tl[r.id].e2e} for r in requests],
        "usage": [],
    }


def claims(result: dict) -> dict:
    """What serve.md and the figures lead with, computed from the runs (None where a run is
    missing): per policy the highest swept rate whose steady-state SLO attainment meets the
    target and the peak goodput; goodput and attainment at each rate; the prefix-cache pair;
    the readmissions behind the smallest pool's hit rate; the decode-step ratio."""
    runs, target = result["runs"], result["setup"]["attainment_target"]
    swept = [r for r in runs if r["experiment"] in ("policy", "peer") and r.get("steady")]
    out = {"decode_engine_over_phases": (result.get("decode") or {}).get("ratio"),
           "saturation_requests_per_s": (result.get("saturation") or {}).get("requests_per_s"),
           "attainment_target": target}
    by_rate: dict = {}
    for r in swept:
        row = by_rate.setdefault(r["rate"], {"rate": r["rate"],
                                             "rate_fraction": r.get("rate_fraction")})
        row[r["policy"]] = {"goodput": r["steady"]["goodput_requests_per_s"],
                            "attainment": r["steady"]["slo_attainment"]}
    out["by_rate"] = [by_rate[k] for k in sorted(by_rate)]
    policies = list(dict.fromkeys(r["policy"] for r in swept))
    out["max_rate_at_target"] = {p: max((r["rate"] for r in swept if r["policy"] == p
                                         and r["steady"]["slo_attainment"] >= target),
                                        default=None) for p in policies}
    out["peak_goodput"] = {p: max(r["steady"]["goodput_requests_per_s"] for r in swept
                                  if r["policy"] == p) for p in policies}
    out["prefix_cache"] = prefix_claim(runs, target)
    out["pool"] = pool_claim(runs)
    return out


def prefix_claim(runs: list[dict], target: float) -> dict | None:
    """The prefix-cache pair: TTFT with and without, prefill tokens saved, both attainments
    and whether both runs were below saturation (attainment at the target or above)."""
    on = next((r for r in runs if r["experiment"] == "prefix cache on"), None)
    off = next((r for r in runs if r["experiment"] == "prefix cache off"), None)
    if on is None or off is None:
        return None
    att = [(r.get("steady") or r["summary"])["slo_attainment"] for r in (on, off)]
    return {"rate": on["rate"], "policy": on["policy"], "requests": on["summary"]["requests"],
            "mean_ttft_on_s": on["mean_ttft_s"], "mean_ttft_off_s": off["mean_ttft_s"],
            "p50_ttft_on_s": on["summary"]["ttft_s"]["p50"],
            "p50_ttft_off_s": off["summary"]["ttft_s"]["p50"],
            "ttft_off_over_on": off["mean_ttft_s"] / on["mean_ttft_s"],
            "prefill_tokens_on": on["prefill_tokens"], "prefill_tokens_off": off["prefill_tokens"],
            "prefill_tokens_saved": off["prefill_tokens"] - on["prefill_tokens"],
            "hit_rate_on": on["hit_rate"], "attainment_on": att[0], "attainment_off": att[1],
            "both_unsaturated": min(att) >= target}


def pool_claim(runs: list[dict]) -> dict | None:
    """The smallest pool's run: its hit rate against its first admissions' alone, and the
    readmissions after preemption that make the difference."""
    pool = [r for r in runs if r["experiment"] == "pool" and r.get("num_pages")]
    if not pool:
        return None
    r = min(pool, key=lambda x: x["num_pages"])
    return {k: r[k] for k in ("num_pages", "rate", "hit_rate", "first_admission_hit_rate",
                              "preemptions", "readmissions", "readmit_tokens",
                              "readmit_hit_tokens")}


# ---- the peer: Hugging Face transformers' generate with static batches ---------------------
HF_NAME = "transformers generate, static batches (PyTorch, f32)"
HF_SCRIPT = r"""
import json, sys, time
spec = json.loads(sys.stdin.read())
""" + LLAMA_MODEL + r"""
from transformers import LogitsProcessor, LogitsProcessorList


class Stamp(LogitsProcessor):
    # called once per generated position, when its logits exist: the token's time
    def __init__(self, clock):
        self.clock, self.times = clock, []

    def __call__(self, input_ids, scores):
        self.times.append(self.clock())
        return scores


def generate(batch, clock):
    width = max(len(r["prompt"]) for r in batch)
    ids = torch.zeros((len(batch), width), dtype=torch.long)
    mask = torch.zeros((len(batch), width), dtype=torch.long)
    for i, r in enumerate(batch):  # left padding, as decoder-only batching needs
        ids[i, width - len(r["prompt"]):] = torch.tensor(r["prompt"])
        mask[i, width - len(r["prompt"]):] = 1
    n = max(r["max_new"] for r in batch)
    stamp = Stamp(clock)
    model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=n, min_new_tokens=n,
                   do_sample=False, pad_token_id=0, eos_token_id=None,
                   logits_processor=LogitsProcessorList([stamp]))
    return stamp.times


with torch.inference_mode():
    generate(spec["requests"][:1], time.perf_counter)  # warm up
    out = []
    for trace in spec["traces"]:
        pending = sorted(trace, key=lambda r: r["arrival"])
        t0, skew = time.perf_counter(), 0.0
        clock = lambda: time.perf_counter() - t0 + skew
        done = []
        while pending:
            now = clock()
            if pending[0]["arrival"] > now:
                skew += pending[0]["arrival"] - now
            now = clock()
            batch = [r for r in pending if r["arrival"] <= now][:spec["max_batch"]]
            pending = [r for r in pending if r not in batch]
            times = generate(batch, clock)
            for r in batch:
                done.append({"id": r["id"], "arrival": r["arrival"],
                             "token_times": times[:r["max_new"]]})
        out.append(done)
print(json.dumps({"runs": out, "torch": torch.__version__,
                  "threads": torch.get_num_threads()}))
"""


def hf_static(cfg, traces: list[list], max_batch: int, timeout: float = 1800) -> dict:
    """Each trace served by transformers' `generate` in static batches of up to `max_batch`
    arrived requests (a batch runs to its longest output before the next is admitted), on a
    Llama of cfg's shape with random weights. Per request: arrival and token times on the
    same kind of clock as the engine's. A non-Llama shape or a missing install is an error
    entry, not an exception."""
    import json
    import subprocess
    import sys

    from refmodel.attention import kinds_in

    if kinds_in(cfg) not in (("gqa",), ("mha",), ("mqa",)) or cfg.ffn != "dense" or \
            cfg.mlp_act != "swiglu":
        return {"name": HF_NAME, "error": f"{refmodel.attention.label(cfg)} is not a Llama "
                "shape (GQA attention, dense SwiGLU FFN): no transformers peer"}
    spec = {**llama_spec(cfg), "max_batch": max_batch,
            "requests": [{"prompt": list(r.prompt), "max_new": r.max_new_tokens}
                         for r in traces[0][:1]],
            "traces": [[{"id": r.id, "arrival": r.arrival, "prompt": list(r.prompt),
                         "max_new": r.max_new_tokens} for r in t] for t in traces]}
    try:
        proc = subprocess.run([sys.executable, "-c", HF_SCRIPT], input=json.dumps(spec),
                              capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"name": HF_NAME, "error": f"timed out after {timeout:.0f} s"}
    if proc.returncode != 0:
        last = (proc.stderr.strip().splitlines() or ["?"])[-1]
        return {"name": HF_NAME, "error": f"not run: {last} (pip install -e '.[peers]')"}
    return {"name": HF_NAME, **json.loads(proc.stdout.strip().splitlines()[-1])}
