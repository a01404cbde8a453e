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
# *shapes* (who waits, what sharing saves, where continuous batching wins) are the lesson.
# The last step leaves the machine and counts, for Llama 3 8B on an H100, why memory and not
# FLOPs limits how many sequences a server can batch.

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
from refmodel.serving import PagePool, RadixCache, metrics, workloads
from refmodel.serving.engine import Engine
from refmodel.serving.pool import pages_for

# %%
QUICK = os.environ.get("LAB_FULL", "0") != "1"  # parameter: LAB_FULL=1 for publication size
PRESET = "tiny" if QUICK else "small"
N_REQUESTS = 48 if QUICK else 128
SYSTEM_LEN, PROMPT_LEN, OUTPUT_LEN = 48, 16, 16  # tokens: shared system prompt, own, output
PAGE, BUDGET, MAX_RUNNING = 16, 64, 8  # page size, token budget per step, rows per decode
RATE_FRACTIONS = (0.25, 0.5, 1.0)  # of a naive capacity (below)
SLO_SCALE = 5.0  # SLOs = 5 x the unloaded TTFT and TPOT, as DistServe states them
MACHINE = peaks.machine_label(harness.environment())
print(MACHINE, "| preset", PRESET, "| quick" if QUICK else "| full")

cfg = refmodel.presets.get(PRESET)
model = refmodel.init(cfg, seed=0)


def trace(rate, n=N_REQUESTS, seed=0):
    """A shared system prompt before each request's own prompt, Poisson arrivals at `rate`."""
    return workloads.shared_prefix(n, rate, system_len=SYSTEM_LEN, prompt_len=PROMPT_LEN,
                                   output_len=OUTPUT_LEN, vocab=cfg.vocab_size, seed=seed,
                                   spread=0.3)


# One view length for every model call (vLLM's max_model_len) and shapes="fixed": the engine
# compiles one decode shape and one prefill shape, once, in warmup() before its clock starts.
longest = max(len(r.prompt) + r.max_new_tokens for r in trace(1.0) + trace(1.0, 5, seed=1))
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
# CHECK: every token after the first came from a decode step; every prompt token was either
# computed in a prefill chunk or found in the prefix cache (nothing was preempted here).
assert len(decode_steps) == focus.max_new_tokens - 1, (decode_steps, focus.max_new_tokens)
computed = {r.id: sum(n for _, n in chunks_of[r.id]) for r in few}
assert sum(computed.values()) + run.hit_tokens == sum(len(r.prompt) for r in few)
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
# CHECK: the shared pages are the same ids in both tables and have two holders; the match is
# whole pages of the system prompt (a page is shared only if all its tokens agree).
shared = pool.block_table(a.id)[:match.length // PAGE]
assert pool.block_table(b.id)[:len(shared)] == shared and all(pool.ref[p] == 2 for p in shared)
assert match.length == SYSTEM_LEN // PAGE * PAGE
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
# Now the engine at a moderate load, recording (time, used pages, cached pages) after every
# step. "Used" pages are held by running sequences (shared ones counted once); "cached" ones
# are held by nobody but kept by the radix cache until eviction needs them.

# %%
unloaded_engine = engine(prefix_cache=False)
alone_runs = [unloaded_engine.run([r]).timelines[r.id] for r in trace(math.inf, n=5, seed=1)]
UNLOADED = {k: float(np.median([getattr(t, k) for t in alone_runs])) for k in
            ("ttft", "tpot", "e2e")}
SLO = {"ttft": SLO_SCALE * UNLOADED["ttft"], "tpot": SLO_SCALE * UNLOADED["tpot"]}
CAPACITY = MAX_RUNNING / UNLOADED["e2e"]  # requests/s if MAX_RUNNING ran at unloaded speed
RATES = [f * CAPACITY for f in RATE_FRACTIONS]
print(f"unloaded: TTFT {1e3 * UNLOADED['ttft']:.2f} ms, TPOT {1e3 * UNLOADED['tpot']:.3f} ms, "
      f"end-to-end {1e3 * UNLOADED['e2e']:.2f} ms -> naive capacity {CAPACITY:.0f} requests/s")
print(f"SLOs: TTFT <= {1e3 * SLO['ttft']:.2f} ms, TPOT <= {1e3 * SLO['tpot']:.3f} ms")

runs = {(p, f): engine(p).run(trace(rate)) for p in ("mixed", "static")
        for f, rate in zip(RATE_FRACTIONS, RATES, strict=True)}

# %%
mid = RATE_FRACTIONS[len(RATE_FRACTIONS) // 2]
t, used, cached = np.asarray(runs["mixed", mid].usage, dtype=float).T
fig = Figure(figsize=(9, 4), layout="constrained")
ax = fig.add_subplot()
ax.step(1e3 * t, used, where="post", label="used (held by running sequences)")
ax.step(1e3 * t, used + cached, where="post", label="used + cached (radix cache)")
ax.axhline(NUM_PAGES, color="black", ls="--", label=f"pool: {NUM_PAGES} pages")
ax.set_xlabel("Time since first arrival [ms]")
ax.set_ylabel("Pages")
ax.set_title(f"KV pool of '{PRESET}', mixed policy at {mid * CAPACITY:.0f} requests/s ({MACHINE})")
ax.legend()
display(fig)
util = metrics.utilization(runs["mixed", mid].usage, NUM_PAGES)
print(f"time-weighted: {util['used']:.0%} of the pool used, {util['held']:.0%} used or cached")

# %% [markdown]
# **What to notice.** Used pages rise as requests are admitted and fall as they finish, a page
# at a time: nothing is reserved for a request's maximum length. The cached line stays above
# the used one: the system prompt's pages (and finished prompts' pages) remain in the radix
# cache after their requests leave, free memory that later arrivals can reuse for nothing.
#
# ## Step 3 · Latency under load, and goodput: continuous vs static batching
#
# Same trace, three arrival rates, two policies. **Static** batching admits a batch only when
# the previous one has fully finished: a request that arrives meanwhile waits for the batch's
# longest output, and finished rows sit idle. **Continuous** batching (`mixed`) admits new
# requests every step, prefill chunks riding alongside the decodes.
#
# Goodput (DistServe) counts only requests that meet *both* SLOs, per second.

# %%
summaries = {k: metrics.summarize(list(r.timelines.values()), SLO["ttft"], SLO["tpot"])
             for k, r in runs.items()}
print(f"{'policy':7s} {'rate/s':>7s} {'TTFT p50':>9s} {'TTFT p90':>9s} {'TPOT p50':>9s} "
      f"{'attain':>7s} {'goodput/s':>9s}")
for (p, f), s in summaries.items():
    print(f"{p:7s} {f * CAPACITY:7.0f} {1e3 * s['ttft_s']['p50']:7.2f}ms "
          f"{1e3 * s['ttft_s']['p90']:7.2f}ms {1e3 * s['tpot_s']['p50']:7.3f}ms "
          f"{s['slo_attainment']:7.0%} {s['goodput_requests_per_s']:9.1f}")

# %%
fig = Figure(figsize=(11, 4), layout="constrained")
ax1, ax2 = fig.subplots(1, 2)
for p, marker in (("mixed", "o"), ("static", "s")):
    ax1.plot(RATES, [summaries[p, f]["goodput_requests_per_s"] for f in RATE_FRACTIONS],
             marker=marker, label=p)
    ax2.plot(RATES, [1e3 * summaries[p, f]["ttft_s"]["p90"] for f in RATE_FRACTIONS],
             marker=marker, label=p)
ax1.plot(RATES, RATES, color="gray", ls=":", label="offered rate")
ax1.set_ylabel("Goodput [requests/s meeting both SLOs]")
ax2.axhline(1e3 * SLO["ttft"], color="black", ls="--", label="TTFT SLO")
ax2.set_ylabel("p90 TTFT [ms]")
for ax in (ax1, ax2):
    ax.set_xlabel("Offered rate [requests/s]")
    ax.legend()
fig.suptitle(f"'{PRESET}' served on {MACHINE}")
display(fig)

# %%
goodput = {p: np.array([summaries[p, f]["goodput_requests_per_s"] for f in RATE_FRACTIONS])
           for p in ("mixed", "static")}
for rate, g_mixed, g_static in zip(RATES, goodput["mixed"], goodput["static"], strict=True):
    print(f"at {rate:4.0f} requests/s: goodput mixed {g_mixed:6.1f}/s, static {g_static:6.1f}/s"
          f" -> continuous / static = {g_mixed / max(g_static, 1e-9):.2f}")
ratio = goodput["mixed"].sum() / max(goodput["static"].sum(), 1e-9)
print(f"over all rates: continuous / static goodput = {ratio:.2f}")

# %% [markdown]
# **What to notice.** Read the printed ratios. Where one is above 1, continuous batching
# delivered more requests within their SLOs at that rate: under static batching a request that
# arrives mid-batch waits for the whole batch to drain, so TTFT (right plot) grows with the
# batch's longest output, not with the request's own work. If it is near 1 on your machine,
# the rates were too low for queues to form or the run too short and noisy (these are
# millisecond steps; rerun with `LAB_FULL=1`). Compare the TPOT columns too: static batching
# never mixes prefill into a decode step, so its TPOT can be the lower one; continuous batching
# trades a little TPOT (decodes share steps with prefill chunks) for much shorter queues. As
# the rate approaches what the engine can sustain, goodput of both falls behind the offered
# rate: the queue grows and TTFT with it, which is why DistServe reports the highest rate
# whose SLO attainment stays above a target (e.g. 90%).
#
# ## Step 4 · What prefix caching buys
#
# The middle rate's `mixed` run again, with the radix cache off: every request prefills its
# system prompt from scratch.

# %%
on = runs["mixed", mid]
off = engine(prefix_cache=False).run(trace(mid * CAPACITY))
mean_ttft = {k: float(np.mean([t.ttft for t in r.timelines.values()]))
             for k, r in (("on", on), ("off", off))}
prefilled = {k: sum(s.prefill_tokens for s in r.steps) for k, r in (("on", on), ("off", off))}
print(f"hit rate with the cache: {metrics.hit_rate(on.hit_tokens, on.miss_tokens):.0%} of "
      f"prompt tokens ({on.hit_tokens} of {on.hit_tokens + on.miss_tokens})")
print(f"prefill tokens computed: {prefilled['on']} with, {prefilled['off']} without "
      f"({prefilled['off'] / prefilled['on']:.2f}x)")
print(f"mean TTFT: {1e3 * mean_ttft['on']:.2f} ms with, {1e3 * mean_ttft['off']:.2f} ms "
      f"without -> without / with = {mean_ttft['off'] / mean_ttft['on']:.2f}")

# %%
# CHECK: the same requests give the same greedy tokens with and without the cache: a cached
# page holds exactly the KV the request would have computed.
assert on.outputs == off.outputs
print("outputs identical with and without the prefix cache")

# %% [markdown]
# **What to notice.** The hit rate is bounded by the shared fraction of each prompt, rounded
# down to whole pages ($48/(48+16) = 75\%$ here, less for the first request, which has nothing
# to hit). The prefill tokens saved are exact; the TTFT gain is measured: if the TTFT ratio is
# well above 1, prefill was a large part of waiting, as it is for long system prompts on real
# GPUs. It can differ from the token ratio either way: for this tiny model a prefill chunk
# costs little more than a decode step, which shrinks the gain, while under load less prefill
# also shortens everyone's queue, which compounds it (and millisecond steps are noisy).
#
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
fits = {}
print(f"{'context':>8s} {'fit':>5s} {'step intensity at fit':>22s} {'at batch 10^5':>14s}")
for S in CONTEXTS:
    fits[S] = int(free // costs.kv_cache_bytes(llama, S))
    at_fit = costs.phase_costs(llama, "decode", max(fits[S], 1), S)["intensity"]
    limit = costs.phase_costs(llama, "decode", 100_000, S)["intensity"]
    print(f"{S:8d} {fits[S]:5d} {at_fit:16.1f} FLOP/B {limit:10.1f} FLOP/B")

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
# Bandwidth: even ignoring capacity, the whole decode step's intensity (last column) stays far
# below the ridge, because attention reads each sequence's own KV: adding sequences adds KV
# bytes in proportion, so the step's intensity tends to a limit set by the attention, not the
# batch. This is why serving engines fight for KV memory: paging (no reservation for the
# maximum length), prefix sharing (one copy of a system prompt), GQA/MLA and KV quantization
# (fewer bytes per token; notebook 04) all buy batch, and batch is throughput.
