# ---
# jupyter:
#   jupytext:
#     formats: ipynb,py:percent
#     text_representation:
#       extension: .py
#       format_name: percent
#       format_version: '1.3'
#       jupytext_version: 1.19.6
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # 07 · Serving: many requests, one model, one pool of KV memory
#
# Notebooks 02-05 timed one batch of equal sequences. A server sees requests arrive at random
# times with different prompt and output lengths, and must decide every step who runs. Three
# pieces, all in `refmodel.serving`, make those decisions; none of them sees the model:
#
# - a **page pool** (vLLM's PagedAttention): the KV cache is cut into pages of 16 tokens; a
#   sequence holds a *block table* of page ids that grows a page at a time;
# - a **radix cache** (SGLang's RadixAttention): prefixes already computed (a system prompt)
#   keep their pages, and a new request that starts with the same tokens reuses them;
# - a **scheduler** (continuous batching, Orca / Sarathi-Serve): each step spends a token
#   budget on one decode token per running sequence, then on chunks of waiting prompts.
#
# `refmodel.serving.engine.Engine` runs the scheduler's plans on a real model. Here it serves
# the `tiny` preset on this machine: the absolute times are this machine's and tiny's, the
# *shapes* (who waits, what sharing saves, where each policy stops keeping its promises) are
# the lesson. The last step leaves the machine and counts, for Llama 3 8B on an H100, why
# memory and not FLOPs limits how many sequences a server can batch.
#
# The workload and the method are fixed before anything is measured. Requests look like chat
# traffic: a shared system prompt, then a prompt and an output whose lengths have the means
# the vLLM paper reports for ShareGPT (161.31 and 337.99 tokens; Kwon et al. 2023, Fig. 11),
# scaled down for a small model, with a long tail (lognormal, standard deviation = mean):
# most answers are short, a few are several times the mean. The SLOs are set once, from one
# reference request served alone, and every policy is judged against the same two numbers.

# %%
# %matplotlib inline
import math
import os

import jax.numpy as jnp
import numpy as np
from IPython.display import display
from matplotlib.figure import Figure

import refmodel
from microbench import hardware, harness
from microbench.roofs import peaks
from refmodel import costs
from refmodel.serving import PagePool, RadixCache, Request, metrics, workloads
from refmodel.serving.engine import Engine
from refmodel.serving.pool import pages_for

# %%
QUICK = os.environ.get("LAB_FULL", "0") != "1"  # parameter: LAB_FULL=1 for publication size
PRESET = "tiny" if QUICK else "small"
N_REQUESTS = 128
SYSTEM_LEN = 128  # tokens of the shared system prompt
SCALE = 1 / 16 if QUICK else 1 / 8  # x ShareGPT's mean lengths: prompt ~10, output ~21 tokens
PAGE, BUDGET, MAX_RUNNING = 16, 64, 8  # page size, token budget per step, rows per decode
# of the measured saturation (Step 3); 3x as well as 1.5x: a step's time on this shared
# machine can change by 2x between two runs, and past saturation must stay past it
RATE_FRACTIONS = (0.25, 0.75, 1.5, 3.0)
SLO_SCALE = 5.0  # SLOs = 5 x the reference request's unloaded TTFT and TPOT (DistServe's way)
TARGET = 0.9  # the SLO attainment a rate must keep to count as sustained
TRIM = 0.1  # steady-state window: the first and last 10% of arrivals left out
MACHINE = peaks.machine_label(harness.environment())
print(MACHINE, "| preset", PRESET, "| quick" if QUICK else "| full")

cfg = refmodel.presets.get(PRESET)
model = refmodel.init(cfg, seed=0)


def trace(rate, n=N_REQUESTS, seed=0):
    """Chat requests: the system prompt, then ShareGPT-shaped lengths x SCALE, Poisson
    arrivals at `rate` (inf: all at once). The same seed gives the same requests at any rate."""
    return workloads.chat_like(n, rate, SCALE, system_len=SYSTEM_LEN, vocab=cfg.vocab_size,
                               seed=seed)


out_lengths = np.array([r.max_new_tokens for r in trace(1.0)])
print(f"outputs: mean {out_lengths.mean():.1f} tokens, median {np.median(out_lengths):.0f}, "
      f"max {out_lengths.max()} (std / mean {out_lengths.std() / out_lengths.mean():.2f})")

# One view length for every model call (vLLM's max_model_len) and shapes="fixed": the engine
# compiles one decode shape and one prefill shape, once, in warmup() before its clock starts.
MEAN_PROMPT = round(workloads.SHAREGPT["input_mean"] * SCALE)  # the SLO reference's (Step 3)
MEAN_OUTPUT = round(workloads.SHAREGPT["output_mean"] * SCALE)
longest = max([len(r.prompt) + r.max_new_tokens for r in trace(1.0)]
              + [SYSTEM_LEN + MEAN_PROMPT + MEAN_OUTPUT])
MAX_LEN = pages_for(longest, PAGE) * PAGE
NUM_PAGES = MAX_RUNNING * pages_for(MAX_LEN, PAGE) + pages_for(SYSTEM_LEN, PAGE)


def engine(policy="mixed", prefix_cache=None, num_pages=NUM_PAGES):
    """A fresh, warmed-up engine (fresh: an engine keeps its step log and cache across runs).
    array_pages keeps one array shape for every pool size, so nothing recompiles."""
    e = Engine(model, num_pages=num_pages, page_size=PAGE, policy=policy, token_budget=BUDGET,
               max_running=MAX_RUNNING, prefix_cache=prefix_cache, max_len=MAX_LEN,
               shapes="fixed", array_pages=NUM_PAGES)
    e.warmup()
    return e


print(f"max_len {MAX_LEN} tokens, pool {NUM_PAGES} pages of {PAGE} tokens")
# Checks on measurements: the check_* functions below, each fed a wrong measurement by
# tests/test_checks_07.py.

# %% [markdown]
# ## Step 1 · One request's life
#
# Four requests arrive together (rate = inf: an offline batch). Each step the `mixed` policy
# first gives every running sequence its one decode token, then fills the rest of the
# 64-token budget with prompt chunks. A prompt longer than what is left of the budget is
# **chunked** over several steps, and whoever comes next waits for the budget.

# %%
few = trace(math.inf, n=4)
run = engine().run(few)
print(f"{len(run.steps)} steps, {run.compiles} compiles during the run (all done in warmup)")
for i, s in enumerate(run.steps[:6]):
    chunks = ", ".join(f"req {q}: {n} tok" for q, n in s.prefill) or "-"
    print(f"step {i:2d} t={1e3 * s.time:6.2f} ms ({1e3 * s.seconds:5.2f} ms): prefill [{chunks}]"
          f"  decode rows {s.decode_rows}")
print("...")

# %%
chunks_of = {r.id: [(i, n) for i, s in enumerate(run.steps) for q, n in s.prefill if q == r.id]
             for r in few}
focus = max(few, key=lambda r: (len(chunks_of[r.id]), r.id))  # the most chunked, latest
tl = run.timelines[focus.id]
first_step = chunks_of[focus.id][0][0]
ends = [s.time + s.seconds for s in run.steps]
decode_steps = [i for i, s in enumerate(run.steps) if s.decode_rows
                and any(s.time <= t <= ends[i] for t in tl.token_times[1:])]
print(f"request {focus.id}: prompt {len(focus.prompt)} tokens, {focus.max_new_tokens} to "
      f"generate, arrives at t = {1e3 * focus.arrival:.2f} ms")
print(f"  queued      : {first_step} step(s) before its first chunk "
      f"(starts at t = {1e3 * run.steps[first_step].time:.2f} ms)")
for i, n in chunks_of[focus.id]:
    print(f"  prefill     : step {i}, {n} tokens")
print(f"  first token : at t = {1e3 * tl.token_times[0]:.2f} ms -> TTFT {1e3 * tl.ttft:.2f} ms")
print(f"  decode      : {len(decode_steps)} steps ({decode_steps[0]}..{decode_steps[-1]}), one "
      f"token each -> TPOT {1e3 * tl.tpot:.3f} ms")

# %%
def check_request_accounting(decode_steps, max_new_tokens, computed, hit_tokens, prompt_tokens):
    """CHECK (fails on a wrong step log): every output token after the first came from a
    decode step of its own, and every prompt token was either computed in a prefill chunk or
    found in the prefix cache, once (nothing was preempted here)."""
    assert decode_steps == max_new_tokens - 1, (
        f"{decode_steps} decode steps for {max_new_tokens} tokens: the first comes from the "
        "prefill, each later one from one decode step")
    assert computed + hit_tokens == prompt_tokens, (
        f"{computed} computed + {hit_tokens} cached != {prompt_tokens} prompt tokens")


computed = {r.id: sum(n for _, n in chunks_of[r.id]) for r in few}
check_request_accounting(len(decode_steps), focus.max_new_tokens, sum(computed.values()),
                         run.hit_tokens, sum(len(r.prompt) for r in few))
print("prefill tokens computed / prompt:",
      ", ".join(f"req {r.id}: {computed[r.id]}/{len(r.prompt)}" for r in few),
      f"| prefix-cache hits: {run.hit_tokens} tokens")

# %% [markdown]
# **What to notice.** TTFT = queueing + every prefill chunk: the chosen request waited for
# steps it had no part in. Requests admitted after request 0's prefill ended computed *fewer*
# tokens than their prompt: request 0's pages had entered the radix cache, and the system
# prompt's whole pages were reused (a request admitted before that, in the same step, could
# not). TPOT is the decode step time, shared with everyone decoding alongside.
#
# The engine is exact: the paged, batched, chunked computation gives the same greedy tokens as
# `refmodel.generate` on each prompt alone (the serving golden test,
# `tests/test_serving_engine.py`, checks it for every attention variant):

# %%
same = workloads.random_requests(3, math.inf, prompt_len=32, output_len=8, vocab=cfg.vocab_size,
                                 seed=2, spread=0.0)  # equal lengths: one batched generate
served = engine().run(same).outputs
alone = np.asarray(refmodel.generate(model, jnp.asarray([r.prompt for r in same]), 8))[:, 32:]
assert all(served[r.id] == alone[i].tolist() for i, r in enumerate(same))
print("engine == refmodel.generate for", len(same), "prompts:", served[same[0].id])

# %% [markdown]
# ## Step 2 · KV pages: filling, sharing, and the pool over time
#
# The pool only counts pages; the radix cache only maps token prefixes to pages. Driven by
# hand (what the scheduler does on admission and after a prefill): request A runs, its prompt's
# whole pages are inserted into the cache; request B, with the same system prompt,
# `acquire`s the longest cached prefix and opens its block table on those pages.

# %%
a, b = trace(math.inf, n=2)
pool = PagePool(num_pages=16, page_size=PAGE)
cache = RadixCache(pool)

pool.open(a.id)
pool.append(a.id, len(a.prompt))  # A's prefill: pages for its whole prompt
cache.insert(a.prompt, pool.block_table(a.id))  # its whole pages become a cached prefix

match = cache.acquire(b.prompt, len(b.prompt) - 1)  # B's admission: longest cached prefix
pool.open(b.id, shared=match.pages)
pool.append(b.id, len(b.prompt) - match.length)  # only the rest is new

for r in (a, b):
    print(f"request {r.id}: {len(r.prompt):3d} prompt tokens, block table "
          f"{pool.block_table(r.id)}")
print(f"B matched {match.length} of {len(b.prompt)} tokens ({match.length // PAGE} pages); "
      f"reference counts of A's pages: {[pool.ref[p] for p in pool.block_table(a.id)]}")
print("pool:", pool.check())

# %%
def check_shared_pages(table_a, table_b, refs, matched, system_len, page):
    """CHECK (fails on a wrong match or count): B's table starts with A's system-prompt pages,
    the same ids, each with two holders; the match is the system prompt's whole pages (a page
    is shared only if all its tokens agree, so a partial last page is not)."""
    assert matched == system_len // page * page, (
        f"matched {matched} tokens; the system prompt's whole pages hold "
        f"{system_len // page * page}")
    shared = table_a[:matched // page]
    assert table_b[:len(shared)] == shared, f"B's table {table_b} does not start with {shared}"
    assert all(refs[p] == 2 for p in shared), f"references {[refs[p] for p in shared]}, not 2"


check_shared_pages(pool.block_table(a.id), pool.block_table(b.id), pool.ref, match.length,
                   SYSTEM_LEN, PAGE)
pool.close(a.id)
pool.close(b.id)
cache.release(match)
print("after both finish:", pool.check(), "- the cached pages stay for the next request")

# %% [markdown]
# **Reading the pages.** Attention wants a sequence's keys in token order; the pages lie
# anywhere in the pool. The simple way is to gather them into a contiguous view before each
# layer (`kernels="xla"`: XLA's gather), which writes every cached byte once more and reads it
# once more than a contiguous cache does. The way vLLM does it is a kernel that reads the
# pages where they lie (PagedAttention): with the native kernels built here
# (`refmodel/kernels/attend.cc`, `kernels="auto"`), a decode step hands each GQA layer its
# pages and their block tables, and attends over them where they lie, in chunks of keys split
# over the cores, each a softmax whose maximum and sum are combined at the end (the online
# softmax's rescaling, as flash-decoding does on a GPU). The cost of
# each, against the plain batched decode of `Phases` over a contiguous cache at the same batch
# and context (`microbench.studies.serve.decode_ratio`: whole engine steps against a `Phases` call
# after each, in rounds):

# %%
from microbench.studies import serve  # noqa: E402
from refmodel import kernels  # noqa: E402

setup = serve.Setup(model=PRESET, decode_batch=4, decode_context=127)
paths = ["native", "xla"] if kernels.available() else ["xla"]
read = {k: serve.decode_ratio(model, setup, repeats=20, rounds=2, kernels=k) for k in paths}
for k, r in read.items():
    print(f"{k:6s}: engine decode step / Phases decode, batch 4 at context 127: "
          f"{r['ratio']:.2f} (rounds {', '.join(f'{x:.2f}' for x in r['ratio_by_round'])})")

# %% [markdown]
# On `tiny` a step takes a fraction of a millisecond, so the host's share of it (the
# scheduler's decisions, the call's arguments) weighs on both ratios and the two paths differ
# less than at the serve benchmark's size (`small`, batch 8, 512 tokens), where reading the
# pages in place keeps the step nearer the contiguous one than gathering them does
# (`python -m microbench serve` measures both; README, serving section).
#
# ## Step 3 · SLOs set once, the saturation measured, and goodput past it
#
# **The SLOs.** One reference request, the workload's mean shape (the system prompt plus the
# mean prompt, the mean output), served alone three times with the prefix cache off (the cold
# latency of a first request): its median TTFT and TPOT, times `SLO_SCALE`, are the two SLOs
# every policy and every rate is judged against. They are not each policy's, or each model's,
# own batch-1 latency: one yardstick for the whole comparison.

# %%
rng = np.random.default_rng(1)
reference = [Request(i, tuple(int(t) for t in rng.integers(0, cfg.vocab_size,
                                                           SYSTEM_LEN + MEAN_PROMPT)),
                     MEAN_OUTPUT) for i in range(3)]
cold = engine(prefix_cache=False)
alone_runs = [cold.run([r]).timelines[r.id] for r in reference]
UNLOADED = {k: float(np.median([getattr(t, k) for t in alone_runs])) for k in ("ttft", "tpot")}
SLO = {k: SLO_SCALE * v for k, v in UNLOADED.items()}
print(f"reference: {SYSTEM_LEN + MEAN_PROMPT}-token prompt, {MEAN_OUTPUT} tokens out, alone: "
      f"TTFT {1e3 * UNLOADED['ttft']:.2f} ms, TPOT {1e3 * UNLOADED['tpot']:.3f} ms")
print(f"SLOs for every run below: TTFT <= {1e3 * SLO['ttft']:.2f} ms, "
      f"TPOT <= {1e3 * SLO['tpot']:.3f} ms")

# %% [markdown]
# **The saturation.** What the engine sustains is measured, not guessed: every request queued
# at once, the rate at which requests complete once the queue is full (between the 10th and
# 90th percentile completions, `metrics.completion_rate`). **Static** batching admits a batch
# only when the previous one has fully finished; with long-tailed outputs, a batch's rows sit
# idle while its longest answer finishes. **Continuous** batching (`mixed`) refills a row the
# step it frees, prefill chunks riding alongside the decodes.

# %%
offline = {p: [engine(p).run(trace(math.inf)) for _ in range(3)] for p in ("mixed", "static")}
SATURATION = {p: float(np.median([metrics.completion_rate(list(r.timelines.values()), TRIM)
                                  for r in rs])) for p, rs in offline.items()}  # of 3 runs


def rows_while_waiting(run):
    """Mean rows of the decode steps up to the last step with a prefill (the last admission):
    while requests were still waiting for a row."""
    last = max(i for i, s in enumerate(run.steps) if s.prefill)
    return float(np.mean([s.decode_rows for s in run.steps[:last + 1] if s.decode_rows]))


ROWS = {p: rows_while_waiting(rs[0]) for p, rs in offline.items()}  # the same in every run
for p in offline:
    print(f"{p:6s}: saturation {SATURATION[p]:.0f} requests/s (every request queued at once); "
          f"{ROWS[p]:.2f} of {MAX_RUNNING} rows decoding per decode step while requests wait")


def check_static_idles_rows(rows_continuous, rows_static, max_running):
    """CHECK (fails on a wrong step log): while requests wait, continuous batching keeps
    nearly every row decoding (it refills a row the step it frees), static batching leaves
    rows idle while each batch's longest output finishes."""
    assert rows_continuous > 0.8 * max_running, (
        f"continuous batching decoded {rows_continuous:.2f} of {max_running} rows per step")
    assert rows_static < rows_continuous, (
        f"static batching decoded {rows_static:.2f} rows per step, continuous "
        f"{rows_continuous:.2f}")


check_static_idles_rows(ROWS["mixed"], ROWS["static"], MAX_RUNNING)

# %% [markdown]
# Idle rows are counted, not timed: the schedule with every request queued at once does not
# depend on the clock. What they cost in time depends on the step: the engine pads a decode
# call to its `max_running` rows (`shapes="fixed"`), so an idle row costs a fixed-shape step
# nothing less, while each admitted prompt costs continuous batching a prefill call of its
# own. Which saturation is the higher, on this model and this machine, is the printed pair.

# %% [markdown]
# **Goodput.** The same trace at fractions of the continuous saturation, from light load to
# 3x past it. Goodput (DistServe) counts only the requests that meet *both* SLOs, per
# second; here in a steady-state window (`metrics.steady`: the requests arriving between the
# first and last 10% of arrivals), so the empty server at the start and the drain at the end
# do not count, and goodput equals the offered rate when every request meets its SLOs.

# %%
RATES = [f * SATURATION["mixed"] for f in RATE_FRACTIONS]
runs = {(p, f): engine(p).run(trace(rate)) for p in ("mixed", "static")
        for f, rate in zip(RATE_FRACTIONS, RATES, strict=True)}
steady = {k: metrics.steady(list(r.timelines.values()), SLO["ttft"], SLO["tpot"], TRIM)
          for k, r in runs.items()}
print(f"{'policy':7s} {'rate/s':>7s} {'x sat':>6s} {'TTFT p50':>9s} {'TTFT p90':>9s} "
      f"{'TPOT p50':>9s} {'attain':>7s} {'goodput/s':>9s}")
for (p, f), s in steady.items():
    print(f"{p:7s} {f * SATURATION['mixed']:7.0f} {f:6.2f} {1e3 * s['ttft_s']['p50']:7.2f}ms "
          f"{1e3 * s['ttft_s']['p90']:7.2f}ms {1e3 * s['tpot_s']['p50']:7.3f}ms "
          f"{s['slo_attainment']:7.0%} {s['goodput_requests_per_s']:9.1f}")

# %%
fig = Figure(figsize=(11, 4), layout="constrained")
ax1, ax2 = fig.subplots(1, 2)
for p, marker in (("mixed", "o"), ("static", "s")):
    ax1.plot(RATES, [steady[p, f]["goodput_requests_per_s"] for f in RATE_FRACTIONS],
             marker=marker, label=p)
    ax2.plot(RATES, [100 * steady[p, f]["slo_attainment"] for f in RATE_FRACTIONS],
             marker=marker, label=p)
ax1.plot(RATES, RATES, color="gray", ls=":", label="offered rate")
ax1.set_ylabel("Goodput [requests/s meeting both SLOs]")
ax2.axhline(100 * TARGET, color="black", ls="--", label=f"target {TARGET:.0%}")
ax2.set_ylabel("SLO attainment [%]")
for ax in (ax1, ax2):
    ax.axvline(SATURATION["mixed"], color="gray", ls="-.", label="measured saturation")
    ax.set_xlabel("Offered rate [requests/s]")
    ax.legend()
fig.suptitle(f"'{PRESET}' served on {MACHINE}")
display(fig)


# %%
def check_knee(fractions, attainment, goodput, rates, target):
    """CHECK (fails on a wrong saturation or window): below saturation (the lightest rate)
    the continuous policy keeps the attainment target and its goodput is the offered rate
    within 15%; at the heaviest rate, at least 1.5x the measured saturation, the queue grows
    through the window, so it misses the target and its goodput falls below the offered
    rate."""
    light, heavy = fractions.index(min(fractions)), fractions.index(max(fractions))
    assert max(fractions) >= 1.5, f"the sweep stops at {max(fractions)}x the saturation"
    assert attainment[light] >= target, (
        f"{attainment[light]:.0%} within SLOs at {fractions[light]}x the saturation")
    assert abs(goodput[light] / rates[light] - 1) <= 0.15, (
        f"goodput {goodput[light]:.3g} at an offered {rates[light]:.3g} requests/s")
    assert attainment[heavy] < target, (
        f"{attainment[heavy]:.0%} within SLOs at {fractions[heavy]}x the measured saturation: "
        "was the saturation measured too low?")
    assert goodput[heavy] < 0.9 * rates[heavy], (
        f"goodput {goodput[heavy]:.3g} keeps up with {rates[heavy]:.3g} requests/s offered")


def sustained(policy):
    """The highest swept rate at which `policy` kept the attainment target (0: none)."""
    return max((f * SATURATION["mixed"] for f in RATE_FRACTIONS
                if steady[policy, f]["slo_attainment"] >= TARGET), default=0.0)


check_knee(list(RATE_FRACTIONS), [steady["mixed", f]["slo_attainment"] for f in RATE_FRACTIONS],
           [steady["mixed", f]["goodput_requests_per_s"] for f in RATE_FRACTIONS], RATES,
           TARGET)
for p in ("mixed", "static"):
    print(f"{p}: >= {TARGET:.0%} of requests within the SLOs up to {sustained(p):.0f} "
          "requests/s of the rates swept")

# %% [markdown]
# **What to notice.** Below saturation, goodput follows the offered rate (the dotted line):
# every request meets its SLOs, and the steady-state window does not charge the run for its
# empty start or its drain. Past the measured saturation the queue grows for as long as
# requests keep arriving, TTFT grows with it, and attainment collapses: no rate past
# saturation has a steady state. Static batching leaves its knee earlier (the printed rates):
# a request that arrives mid-batch waits for the batch's *longest* output, which the long
# tail makes several times the mean, so its TTFT misses the SLO at loads the continuous
# policy serves. Compare the TPOT columns too: static batching never mixes prefill into a
# decode step, so its TPOT can be the lower one; continuous batching trades a little TPOT for
# much shorter queues. `python -m microbench serve` runs the same method on `small` with four
# policies and transformers' static batches as a peer (`figures/<machine>/serve_goodput.png`).
#
# The pool over that run, at 0.75x the saturation: (time, used pages, cached pages) after
# every step. "Used" pages are held by running sequences (shared ones counted once); "cached"
# ones are held by nobody but kept by the radix cache until eviction needs them.

# %%
busy = runs["mixed", 0.75]
t, used, cached = np.asarray(busy.usage, dtype=float).T
fig = Figure(figsize=(9, 4), layout="constrained")
ax = fig.add_subplot()
ax.step(1e3 * t, used, where="post", label="used (held by running sequences)")
ax.step(1e3 * t, used + cached, where="post", label="used + cached (radix cache)")
ax.axhline(NUM_PAGES, color="black", ls="--", label=f"pool: {NUM_PAGES} pages")
ax.set_xlabel("Time since first arrival [ms]")
ax.set_ylabel("Pages")
ax.set_title(f"KV pool of '{PRESET}', mixed at {0.75 * SATURATION['mixed']:.0f} requests/s "
             f"({MACHINE})")
ax.legend()
display(fig)
util = metrics.utilization(busy.usage, NUM_PAGES)
print(f"time-weighted: {util['used']:.0%} of the pool used, {util['held']:.0%} used or cached")

# %% [markdown]
# Used pages rise as requests are admitted and fall as they finish, a page at a time: nothing
# is reserved for a request's maximum length. The cached line stays above the used one: the
# system prompt's pages (and finished prompts' pages) remain in the radix cache after their
# requests leave, free memory that later arrivals can reuse for nothing.
#
# ## Step 4 · What prefix caching buys, at a load both runs can carry
#
# Without the radix cache every request prefills its system prompt from scratch, so the
# engine saturates at a lower rate. A ratio of TTFTs means something only if *both* runs are
# below saturation: against an overloaded run it measures that run's queue, not the cache.
# So the cache-off saturation is measured the same way, and one trace at a quarter of it is
# served both ways (at half of it, the long cold prefills already stall the decodes of the
# requests around them often enough to cost TPOT misses).

# %%
SAT_OFF = metrics.completion_rate(
    list(engine(prefix_cache=False).run(trace(math.inf)).timelines.values()), TRIM)
RATE_PREFIX = 0.25 * min(SAT_OFF, SATURATION["mixed"])
pair = trace(RATE_PREFIX)
on, off = engine().run(pair), engine(prefix_cache=False).run(pair)
kept = {k: metrics.steady(list(r.timelines.values()), SLO["ttft"], SLO["tpot"], TRIM)
        for k, r in (("on", on), ("off", off))}
mean_ttft = {k: float(np.mean([t.ttft for t in r.timelines.values()]))
             for k, r in (("on", on), ("off", off))}
prefilled = {k: sum(s.prefill_tokens for s in r.steps) for k, r in (("on", on), ("off", off))}
print(f"saturation without the cache: {SAT_OFF:.0f} requests/s (with: "
      f"{SATURATION['mixed']:.0f}); both runs at {RATE_PREFIX:.0f} requests/s")
print(f"SLO attainment: {kept['on']['slo_attainment']:.0%} with the cache, "
      f"{kept['off']['slo_attainment']:.0%} without")
print(f"hit rate with the cache: {metrics.hit_rate(on.hit_tokens, on.miss_tokens):.0%} of "
      f"prompt tokens ({on.hit_tokens} of {on.hit_tokens + on.miss_tokens})")
print(f"prefill tokens computed: {prefilled['on']} with, {prefilled['off']} without "
      f"({prefilled['off'] - prefilled['on']} saved)")
print(f"mean TTFT: {1e3 * mean_ttft['on']:.2f} ms with, {1e3 * mean_ttft['off']:.2f} ms "
      f"without -> without / with = {mean_ttft['off'] / mean_ttft['on']:.2f}")


# %%
def check_prefix_pair(attainment_on, attainment_off, target, prefill_on, prefill_off,
                      ttft_on, ttft_off):
    """CHECK (fails on a wrong measurement): both runs kept the attainment target (both below
    saturation, so the TTFT ratio is not a queue's), the cache computed fewer prefill tokens,
    and its mean TTFT is the shorter."""
    for name, a in (("with", attainment_on), ("without", attainment_off)):
        assert a >= target, f"{a:.0%} within SLOs {name} the cache: that run is saturated"
    assert prefill_on < prefill_off, f"{prefill_on} prefill tokens with the cache, " \
                                     f"{prefill_off} without"
    assert ttft_on < ttft_off, f"mean TTFT {ttft_on:.3g} s with the cache, {ttft_off:.3g} " \
                               "without"


check_prefix_pair(kept["on"]["slo_attainment"], kept["off"]["slo_attainment"], TARGET,
                  prefilled["on"], prefilled["off"], mean_ttft["on"], mean_ttft["off"])
# the same requests give the same greedy tokens with and without the cache: a cached page
# holds exactly the KV the request would have computed
assert on.outputs == off.outputs
print("outputs identical with and without the prefix cache")

# %% [markdown]
# **What to notice.** The prefill tokens saved are exact: the system prompt's whole pages,
# once per request after the first. The TTFT ratio is measured at a load both runs carry, so
# it is what the cache saves each request (its system prompt's prefill), not a queue.
# Compare it with the ratio of prefill tokens: a TTFT is not proportional to the tokens
# prefilled, since a chunk of a few tokens still costs a whole model call (with
# `shapes="fixed"` every chunk is padded to the budget, and on `tiny` a call's fixed cost is
# most of it), and TTFT also holds the wait for the step in progress.
#
# **The pool's size.** With a smaller pool, the scheduler preempts the newest request when a
# page cannot be had (its pages freed, its KV to be recomputed) and readmits it later. A
# readmitted request brings back its prompt and its output so far; the radix cache still
# holds the system prompt and its own prompt's whole pages (cached when its first prefill
# ended), not its output. So the hit rate at a small pool is first admissions' rate mixed
# with readmissions' own, which may be higher or lower. The scheduler counts readmissions and
# their hits separately, which tests that this, and nothing else, moves it:

# %%
small_pool = max(pages_for(MAX_LEN, PAGE), NUM_PAGES // 8)  # one longest request fits
tight = engine(num_pages=small_pool).run(trace(0.75 * SATURATION["mixed"]))


def first_admissions(run):
    """The hit rate of first admissions alone (readmissions after preemption left out)."""
    total = run.hit_tokens + run.miss_tokens - run.readmit_tokens
    return (run.hit_tokens - run.readmit_hit_tokens) / total


for name, r in (("full pool", busy), (f"{small_pool} pages", tight)):
    print(f"{name:>10s}: hit rate {metrics.hit_rate(r.hit_tokens, r.miss_tokens):.0%}, first "
          f"admissions alone {first_admissions(r):.0%}; {r.preemptions} preemptions, "
          f"{r.readmissions} readmissions bringing back {r.readmit_tokens} tokens, "
          f"{r.readmit_hit_tokens} of them hits")


def check_readmissions_explain(full_hit, small_first, readmissions, readmit_hits,
                               system_pages_tokens):
    """CHECK (fails if something else moved the hit rate): with the small pool requests were
    readmitted, each readmission found at least the system prompt's pages still cached, and
    first admissions alone hit what the full pool's requests hit, within 5 points."""
    assert readmissions > 0, "no readmissions: the small pool preempted nobody"
    assert readmit_hits >= readmissions * system_pages_tokens, (
        f"{readmit_hits} hit tokens over {readmissions} readmissions: fewer than the system "
        "prompt's pages each")
    assert abs(small_first - full_hit) <= 0.05, (
        f"first admissions {small_first:.0%} vs {full_hit:.0%}: readmissions do not explain "
        "the difference")


check_readmissions_explain(metrics.hit_rate(busy.hit_tokens, busy.miss_tokens),
                           first_admissions(tight), tight.readmissions,
                           tight.readmit_hit_tokens, SYSTEM_LEN // PAGE * PAGE)
share = tight.readmit_hit_tokens / tight.readmit_tokens
print(f"readmissions hit {share:.0%} of what they brought back, first admissions "
      f"{first_admissions(tight):.0%}: together "
      f"{metrics.hit_rate(tight.hit_tokens, tight.miss_tokens):.0%}")

# %% [markdown]
# ## Step 5 · Why memory, not FLOPs, caps the batch
#
# Notebook 03 showed decode becomes compute-bound only once the batch passes the ridge point
# (FLOP/byte at which the compute roof meets the bandwidth roof). Can a server reach that
# batch? Each sequence holds its KV cache for its whole life; the weights are read once per
# step for the whole batch, but every sequence's KV is read once per step *for that sequence
# alone*. Counted (not run) for Llama 3 8B in bf16 on an H100 SXM, from the spec database
# (`microbench.hardware`, vendor datasheet figures):

# %%
llama = refmodel.presets.get("llama3-8b")
spec = hardware.get("H100 SXM")
ridge = hardware.ridge_point(spec)  # bf16 FLOP/s over HBM bytes/s
weights = costs.param_counts(llama)["total"] * jnp.dtype(llama.dtype).itemsize
per_token = costs.kv_bytes_per_token(llama)
free = spec.memory_bytes - weights
print(f"{spec.name}: {spec.peak_flops['bfloat16'] / 1e12:.0f} TFLOP/s bf16 dense, "
      f"{spec.memory_bandwidth['HBM'] / 1e12:.2f} TB/s, {spec.memory_bytes / 1e9:.0f} GB "
      f"-> ridge {ridge:.0f} FLOP/byte")
print(f"llama3-8b: weights {weights / 1e9:.1f} GB, KV cache {per_token / 1024:.0f} KiB per token "
      f"-> {free / 1e9:.1f} GB left hold {free / per_token / 1e3:.0f}k tokens")

B_ridge = next(B for B in range(1, 4096)
               if costs.phase_costs(llama, "decode_ffn", B, 0)["intensity"] >= ridge)
print(f"weight matmuls (FFN) reach the ridge at batch {B_ridge}")
CONTEXTS = (1024, 4096, 8192, 32768, 131072)
fits, intensities = {}, []
print(f"{'context':>8s} {'fit':>5s} {'step intensity at fit':>22s} {'at batch 10^5':>14s}")
for S in CONTEXTS:
    fits[S] = int(free // costs.kv_cache_bytes(llama, S))
    at_fit = costs.phase_costs(llama, "decode", max(fits[S], 1), S)["intensity"]
    limit = costs.phase_costs(llama, "decode", 100_000, S)["intensity"]
    intensities += [at_fit, limit]
    print(f"{S:8d} {fits[S]:5d} {at_fit:16.1f} FLOP/B {limit:10.1f} FLOP/B")


def check_memory_caps_batch(fit_longest, batch_at_ridge, step_intensities, ridge):
    """CHECK (fails on a wrong count): at the longest context fewer sequences fit than the
    batch at which the weight matmuls reach the ridge, and no whole decode step in the table
    (at the batch that fits, or at 10^5 sequences) comes within 2x of the ridge."""
    assert fit_longest < batch_at_ridge, (
        f"{fit_longest} sequences fit at the longest context, >= {batch_at_ridge}")
    assert max(step_intensities) < ridge / 2, (
        f"a decode step at {max(step_intensities):.0f} FLOP/B, within 2x of the ridge "
        f"{ridge:.0f}")


check_memory_caps_batch(fits[max(CONTEXTS)], B_ridge, intensities, ridge)

# %%
fig = Figure(figsize=(9, 4), layout="constrained")
ax = fig.add_subplot()
S_all = np.geomspace(512, 131072, 60)
ax.loglog(S_all, [free // costs.kv_cache_bytes(llama, int(S)) for S in S_all],
          label=f"sequences whose KV fits in {spec.memory_bytes / 1e9:.0f} GB after the weights")
ax.axhline(B_ridge, color="black", ls="--",
           label=f"batch where the weight matmuls reach the ridge ({B_ridge})")
ax.set_xlabel("Context per sequence [tokens]")
ax.set_ylabel("Batch [sequences]")
ax.set_title(f"llama3-8b bf16 on {spec.name} (vendor figures, counted)")
ax.legend()
display(fig)

# %%
crossover = next((S for S in S_all if free // costs.kv_cache_bytes(llama, int(S)) < B_ridge),
                 None)
print(f"above ~{crossover:.0f} tokens of context, fewer than {B_ridge} sequences fit"
      if crossover else "the compute-bound batch fits at every context shown")

# %% [markdown]
# **What to notice.** Two limits, both from memory. (1) Capacity: past the printed crossover
# context, the KV cache runs out long before the batch reaches the size at which the weight
# matmuls become compute-bound; at 128k tokens only a handful of sequences fit. (2)
# Bandwidth: even ignoring capacity, the whole decode step's intensity (last column) stays
# below half the ridge, because attention reads each sequence's own KV: adding sequences adds KV
# bytes in proportion, so the step's intensity tends to a limit set by the attention, not the
# batch. This is why serving engines fight for KV memory: paging (no reservation for the
# maximum length), prefix sharing (one copy of a system prompt), GQA/MLA and KV quantization
# (fewer bytes per token; notebook 04) all buy batch, and batch is throughput.
