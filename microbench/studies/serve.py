"""Serving measured: the engine under a seeded trace, per policy, rate and pool size.

What `python -m microbench serve` runs, in this order, all on one model and one trace shape
(a shared system prompt before each request's own prompt, Poisson arrivals):

1. Unloaded latency: one request alone (median of a few) gives the TTFT and TPOT that the SLOs
   are scaled from (`slo_scale` x unloaded, as DistServe states SLOs), and a naive capacity,
   max_running / unloaded end-to-end time, that the request rates are fractions of.
2. Policies x rates: each policy (and static batching, the baseline) on the same trace at each
   rate: latency percentiles, throughput, goodput under the SLOs, pool usage over time.
3. Prefix caching: the middle rate's mixed run again with the radix cache off: mean TTFT
   with / without.
4. Pool size: the middle rate's mixed run with smaller pools: hit rate, preemptions, TTFT.
5. Decode step: the engine's decode step with B running sequences at context S against the
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
from refmodel.serving import metrics, workloads
from refmodel.serving.engine import Engine
from refmodel.serving.pool import pages_for

KIND = "serve"


@dataclasses.dataclass(frozen=True)
class Setup:
    """Everything a serve measurement depends on (recorded in the results)."""

    model: str = "small"
    attention: str | None = None
    workload: str = "shared"  # a key of WORKLOADS
    requests: int = 64  # per run
    system_len: int = 512
    prompt_len: int = 48
    output_len: int = 32
    page_size: int = 16
    token_budget: int = 256
    max_running: int = 8
    policies: tuple[str, ...] = ("mixed", "prefill-first", "decode-first", "static")
    rate_fractions: tuple[float, ...] = (0.125, 0.25, 0.5, 1.0)  # of the naive capacity
    rates: tuple[float, ...] | None = None  # requests/s; given, they replace the fractions
    pool_fractions: tuple[float, ...] = (1.0, 0.3, 0.2, 0.12)  # of the pool that holds everything
    slo_scale: float = 5.0
    decode_batch: int = 8
    decode_context: int = 511
    decode_steps: int = 40  # decode steps timed per round of the comparison
    decode_rounds: int = 3
    peer: bool = True  # transformers' static-batch generate on the policy traces, if installed
    seed: int = 0

    def check(self) -> None:
        for name in ("requests", "system_len", "prompt_len", "output_len", "page_size",
                     "token_budget", "max_running", "decode_batch", "decode_context",
                     "decode_steps", "decode_rounds"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"{name}={value!r} must be a positive integer")
        if self.workload not in WORKLOADS:
            raise ValueError(f"workload={self.workload!r}: choose one of {sorted(WORKLOADS)}")
        for name in ("rate_fractions", "pool_fractions", "rates"):
            values = getattr(self, name)
            if values is None and name == "rates":
                continue
            if not values or not all(math.isfinite(v) and v > 0 for v in values):
                raise ValueError(f"{name}={values!r}: give one or more positive numbers")
        if any(f > 1 for f in self.pool_fractions):
            raise ValueError(f"pool_fractions={self.pool_fractions!r}: each must be <= 1 (a "
                             "fraction of the pool that holds every request at once)")
        if not (math.isfinite(self.slo_scale) and self.slo_scale > 0):
            raise ValueError(f"slo_scale={self.slo_scale!r} must be a positive number")
        from refmodel.serving.scheduler import POLICIES
        for p in self.policies:
            if p not in POLICIES:
                raise ValueError(f"policy {p!r}: choose from {POLICIES}")
        if not self.policies:
            raise ValueError("policies is empty: give at least one of "
                             f"{POLICIES}")


def config(setup: Setup) -> refmodel.ModelConfig:
    names = sorted(refmodel.presets.PRESETS)
    if setup.model not in names:
        raise ValueError(f"model={setup.model!r}: choose one of {names}")
    cfg = refmodel.presets.get(setup.model)
    if setup.attention is not None:
        kinds = refmodel.attention.registered()
        if setup.attention not in kinds:
            raise ValueError(f"attention={setup.attention!r}: choose one of {list(kinds)}")
        cfg = dataclasses.replace(cfg, attention=setup.attention, layer_pattern=None)
    return cfg


# Workloads (refmodel.serving.workloads), each called with the setup's lengths:
# system_len is the shared part (system prompt; few-shot prefix; ignored by random and chat).
WORKLOADS = {
    "shared": lambda s, n, rate, vocab, seed: workloads.shared_prefix(
        n, rate, system_len=s.system_len, prompt_len=s.prompt_len, output_len=s.output_len,
        vocab=vocab, seed=seed),
    "random": lambda s, n, rate, vocab, seed: workloads.random_requests(
        n, rate, prompt_len=s.prompt_len, output_len=s.output_len, vocab=vocab, seed=seed),
    "few-shot": lambda s, n, rate, vocab, seed: workloads.few_shot(
        n, rate, shots=4, shot_len=s.system_len / 4, question_len=s.prompt_len,
        output_len=s.output_len, tasks=2, vocab=vocab, seed=seed),
    "chat": lambda s, n, rate, vocab, seed: workloads.multi_turn(
        max(1, n // 3), 3, rate, user_len=s.prompt_len, output_len=s.output_len,
        think_time=1.0 / rate if math.isfinite(rate) else 0.0, vocab=vocab, seed=seed),
}


def trace(setup: Setup, cfg, rate: float, n: int | None = None, seed: int | None = None):
    """The run's requests from the setup's workload at `rate` requests/s."""
    return WORKLOADS[setup.workload](setup, n or setup.requests, rate, cfg.vocab_size,
                                     setup.seed if seed is None else seed)


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


def record(run, requests, slo: dict, label: dict) -> dict:
    """One run as JSON: its settings, summary, per-request latencies and pool usage."""
    timelines = [run.timelines[r.id] for r in requests]
    summary = metrics.summarize(timelines, slo["ttft_s"], slo["tpot_s"])
    return {
        **label,
        "summary": summary,
        "mean_ttft_s": float(np.mean([t.ttft for t in timelines])),
        "hit_rate": metrics.hit_rate(run.hit_tokens, run.miss_tokens),
        "hit_tokens": run.hit_tokens, "miss_tokens": run.miss_tokens,
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


def _num(x: float) -> float | None:
    return None if math.isnan(x) else float(x)


def unloaded_trace(setup: Setup, cfg, repeats: int = 3):
    return trace(setup, cfg, rate=math.inf, n=repeats, seed=setup.seed + 1)


def unloaded(model, setup: Setup, cfg, max_len: int, pool: int, repeats: int = 3) -> dict:
    """TTFT, TPOT and end-to-end time of one request alone (medians of `repeats` requests,
    prefix cache off: the cold latency a user's first request sees). The engine has the
    policy runs' shapes (max_len, `pool` array rows), so their compiles are shared."""
    reqs = unloaded_trace(setup, cfg, repeats)
    engine = _engine(model, setup, pool, max_len, prefix_cache=False, array_pages=pool)
    out = {"ttft_s": [], "tpot_s": [], "e2e_s": []}
    for r in reqs:
        t = engine.run([r]).timelines[r.id]
        for k, v in (("ttft_s", t.ttft), ("tpot_s", t.tpot), ("e2e_s", t.e2e)):
            out[k].append(v)
    return {k: float(np.median(v)) for k, v in out.items()}


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
    """What every run of one serve measurement shares: its SLOs, the pool that holds every
    running sequence, and the rates (fractions of the naive capacity) with their traces."""

    cfg: refmodel.ModelConfig
    unloaded: dict
    slo: dict
    capacity: float
    max_len: int
    full_pool: int
    fractions: tuple
    rates: list
    traces: list


def _load(model, setup: Setup, cfg) -> _Load:
    """The unloaded latency, the SLOs and capacity scaled from it, and the traces at each
    rate, with the pool sized for the longest request of any of them."""
    def full_pool(max_len: int) -> int:
        return setup.max_running * pages_for(max_len, setup.page_size) + \
            pages_for(setup.system_len, setup.page_size)

    # lengths do not depend on the rate (same seed, same draws): size the pool first
    probe = trace(setup, cfg, 1.0) + unloaded_trace(setup, cfg)
    max_len = _max_len(setup, probe)
    base = unloaded(model, setup, cfg, max_len, full_pool(max_len))
    slo = {"ttft_s": setup.slo_scale * base["ttft_s"], "tpot_s": setup.slo_scale * base["tpot_s"]}
    capacity = setup.max_running / base["e2e_s"]
    fractions = setup.rate_fractions if setup.rates is None else \
        tuple(r / capacity for r in setup.rates)
    rates = [f * capacity for f in fractions]
    traces = [trace(setup, cfg, rate) for rate in rates]
    if _max_len(setup, [r for t in traces for r in t]) > max_len:  # chat's lengths may vary
        max_len = _max_len(setup, [r for t in traces for r in t] + probe)
    return _Load(cfg, base, slo, capacity, max_len, full_pool(max_len), fractions, rates,
                 traces)


def measure(setup: Setup, progress=None) -> dict:
    """Every part of the serve measurement; `progress(str)` is told what runs next."""
    setup.check()
    cfg = config(setup)
    model = refmodel.init(cfg, seed=setup.seed)
    say = progress or (lambda _: None)
    say("unloaded latency")
    load = _load(model, setup, cfg)
    runs = _policy_runs(model, setup, load, say)
    peer_runs, peer = _peer_runs(setup, load, say)
    runs += peer_runs + _cache_and_pool_runs(model, setup, load, say)
    say("decode step: engine vs Phases")
    steps, rounds = setup.decode_steps, setup.decode_rounds
    ratio = decode_ratio(model, setup, steps, rounds)
    if ratio["kernels"] == "native":  # the same comparison on XLA's path, for the record
        say("decode step: engine (XLA's page gather) vs Phases")
        xla = decode_ratio(model, setup, steps, rounds, kernels="xla")
        ratio["xla"] = {k: xla[k] for k in ("ratio", "call_ratio", "ratio_by_round",
                                            "call_ratio_by_round", "engine_step_s",
                                            "phases_step_s")}
    return {"kind": KIND, "setup": dataclasses.asdict(setup),
            "model": {"preset": setup.model, "label": refmodel.attention.label(cfg),
                      "dtype": cfg.dtype, "params": refmodel.costs.param_counts(cfg)["total"]},
            "unloaded": load.unloaded, "slo": load.slo,
            "capacity_requests_per_s": load.capacity, "full_pool_pages": load.full_pool,
            "max_len": load.max_len, "runs": runs, "claims": claims(runs, ratio),
            "decode": ratio, "peer": peer}


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
                                "rate_fraction": frac}))
    return runs


def _peer_runs(setup: Setup, load: _Load, say) -> tuple[list[dict], dict]:
    """transformers' static batches on the policy traces (setup.peer): (its runs, what it
    was or why it did not run)."""
    if not setup.peer:
        return [], {"name": HF_NAME, "error": "not asked for (peer=False)"}
    say("transformers generate, static batches")
    peer = hf_static(load.cfg, load.traces, setup.max_running)
    runs = []
    for frac, rate, reqs, done in zip(load.fractions, load.rates, load.traces,
                                      peer.get("runs", [None] * len(load.rates)), strict=True):
        if done is None:
            break
        runs.append(peer_record(done, reqs, load.slo, {"experiment": "peer",
                                                       "policy": "hf static", "rate": rate,
                                                       "rate_fraction": frac}))
    return runs, {k: v for k, v in peer.items() if k != "runs"}


def _cache_and_pool_runs(model, setup: Setup, load: _Load, say) -> list[dict]:
    """The middle rate's mixed run again with the prefix cache off, then with smaller pools."""
    mid = len(load.rates) // 2
    rate, reqs, frac = load.rates[mid], load.traces[mid], load.fractions[mid]
    say("prefix cache off")
    no_cache = _engine(model, setup, load.full_pool, load.max_len, "mixed", prefix_cache=False,
                       array_pages=load.full_pool)
    runs = [record(no_cache.run(reqs), reqs, load.slo, {"experiment": "prefix cache off",
                                                        "policy": "mixed", "rate": rate,
                                                        "rate_fraction": frac})]
    smallest = pages_for(load.max_len, setup.page_size)  # one sequence must fit
    for pool_frac in setup.pool_fractions:
        pages = max(smallest, int(round(pool_frac * load.full_pool)))
        say(f"pool of {pages} pages")
        engine = _engine(model, setup, pages, load.max_len, "mixed",
                         array_pages=load.full_pool)
        runs.append(record(engine.run(reqs), reqs, load.slo,
                           {"experiment": "pool", "policy": "mixed", "rate": rate,
                            "rate_fraction": frac, "pool_fraction": pool_frac}))
    return runs


def peer_record(done: list[dict], requests, slo: dict, label: dict) -> dict:
    """A peer's run in the shape of `record` (no pool, no cache: those fields are None)."""
    tl = {d["id"]: metrics.Timeline(d["arrival"], tuple(d["token_times"])) for d in done}
    timelines = [tl[r.id] for r in requests]
    return {
        **label,
        "summary": metrics.summarize(timelines, slo["ttft_s"], slo["tpot_s"]),
        "mean_ttft_s": float(np.mean([t.ttft for t in timelines])),
        "hit_rate": None, "hit_tokens": None, "miss_tokens": None, "preemptions": None,
        "evicted_pages": None, "compiles": None, "prefix_cache": False, "num_pages": None,
        "utilization": None, "steps": None,
        "requests": [{"id": r.id, "arrival_s": r.arrival, "prompt": len(r.prompt),
                      "output": r.max_new_tokens, "ttft_s": tl[r.id].ttft,
                      "tpot_s": _num(tl[r.id].tpot), "e2e_s": tl[r.id].e2e} for r in requests],
        "usage": [],
    }


def claims(runs: list[dict], decode: dict) -> dict:
    """The three speed ratios serve.md leads with, from the runs (None where a run is
    missing): the engine's decode step over Phases', prefix caching's TTFT speedup, goodput
    per policy at each rate."""
    def find(**kw):
        return [r for r in runs if all(r.get(k) == v for k, v in kw.items())]

    policy_mid = {r["policy"]: r for r in find(experiment="policy")
                  if r["rate"] == next((x["rate"] for x in find(experiment="prefix cache off")),
                                       None)}
    off = find(experiment="prefix cache off")
    on = policy_mid.get("mixed")
    out = {"decode_engine_over_phases": decode["ratio"]}
    # mean TTFT without the radix cache / with it, same trace, rate and policy
    out["prefix_cache_ttft_speedup"] = off[0]["mean_ttft_s"] / on["mean_ttft_s"] \
        if on and off else None
    by_rate = {}
    for r in find(experiment="policy") + find(experiment="peer"):
        by_rate.setdefault(r["rate"], {})[r["policy"]] = r["summary"]["goodput_requests_per_s"]
    out["goodput_by_rate"] = [{"rate": k, **v} for k, v in sorted(by_rate.items())]
    return out


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
