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
# # 08 · Serving at scale: a simulator, then many chips on paper
#
# Notebook 07 served the `tiny` preset on this machine. Real deployments serve 8B-70B models
# on groups of accelerators, and the questions change: how many chips per replica, whether to
# split prefill from decode, whether to split attention from the FFN, whether SRAM-only chips
# pay. Nobody can answer those by running them here, so this notebook builds the answer in
# two moves, both in `refmodel.sim`:
#
# - a **discrete-event simulator** (`Simulator`): the engine's own `Scheduler`, `PagePool`
#   and `RadixCache` (not a copy: the same loop, `refmodel.serving.steps.serve`), with the
#   model replaced by a *step-time predictor*, a function from a step's plan to seconds.
#   First we check it against the real engine on this machine;
# - **predictors for chips we do not have**: `RooflineTime` counts each step's FLOPs and
#   bytes (`refmodel.costs`) on a `Chip`'s roofline and adds tensor-parallel all-reduces over
#   a `Link`; chips and links come from the spec database (`microbench.hardware`, vendor
#   datasheet figures with sources).
#
# Then four designs, each on paper: scale-out with tensor parallelism, prefill/decode
# disaggregation (Splitwise, DistServe), attention-FFN disaggregation (MegaScale-Infer,
# Step-3) and SRAM-only chips (Groq, Cerebras). Every number after step 2 is a **roofline
# bound** of the stated design (spec peaks, no kernel, launch or scheduling losses) that a
# real engine approaches from below. Read the *comparisons*, not the absolute values.

# %%
# %matplotlib inline
import json
import math
import os
from pathlib import Path

import numpy as np
from IPython.display import display
from matplotlib.figure import Figure

import refmodel
from microbench import harness
from microbench.roofs import peaks
from microbench.studies import scale, simulate
from refmodel import costs
from refmodel.serving import Request, metrics, workloads
from refmodel.serving.engine import Engine
from refmodel.serving.pool import pages_for
from refmodel.sim import afd, disagg, sram
from refmodel.sim.cluster import Chip
from refmodel.sim.predict import EngineCalls, RooflineTime, TableTime
from refmodel.sim.simulator import OUTPUT_TOKEN, Simulator

# %%
QUICK = os.environ.get("LAB_FULL", "0") != "1"  # parameter: LAB_FULL=1 for publication size
MACHINE = peaks.machine_label(harness.environment())
DATA = Path("..") / "figures" / "data" if Path.cwd().name == "notebooks" else \
    Path("figures") / "data"
# On paper (steps 3-6): one device, bf16 weights, KV and activations
DEVICE, DTYPE = "H100 SXM", "bfloat16"
PAPER_REQUESTS = 24 if QUICK else 160
PAPER_RATES = (0.5, 1.0, 2.0, 4.0) if QUICK else (0.25, 0.5, 0.75, 1.0, 1.5, 2.0, 4.0)
PAPER_PAGE, PAPER_BUDGET, PAPER_RUNNING = 16, 2048, 16 if QUICK else 64
SLO_SCALE = 5.0  # SLOs = 5 x one request alone, as in notebook 07
print(MACHINE, "| quick" if QUICK else "| full")

# %% [markdown]
# ## Step 1 · The simulator is the engine's scheduler on a virtual clock
#
# `Simulator(step_time, ...)` takes any `step_time(plan) -> seconds`. Each step the scheduler
# plans exactly as under the engine (admission, chunking, prefix hits, preemption); instead of
# running the plan's model calls, the simulator moves its clock by `step_time(plan)`. Sampled
# tokens are a placeholder (`OUTPUT_TOKEN`): the simulator predicts *when*, not *what*.
#
# With a step time of $A + B \times \text{tokens}$, one request of $P$ prompt tokens and $n$
# outputs is computable by hand: one prefill step of $P$ tokens gives the first token, then
# $n - 1$ decode steps of one token each:
# $\text{TTFT} = A + B P$, $\text{TPOT} = A + B$.

# %%
A, B = 2e-3, 1e-5  # seconds per step, per token
P, N_OUT = 100, 8
one = Request(0, tuple(range(1, P + 1)), N_OUT, arrival=0.25)
hand = Simulator(lambda plan: A + B * plan.num_tokens, num_pages=64, page_size=16,
                 token_budget=256).run([one])
tl = hand.timelines[0]
print(f"{len(hand.steps)} steps: prefill tokens per step "
      f"{[s.prefill_tokens for s in hand.steps]}, decode rows "
      f"{[s.decode_rows for s in hand.steps]}")
print(f"TTFT {1e3 * tl.ttft:.3f} ms (formula {1e3 * (A + B * P):.3f}), "
      f"TPOT {1e3 * tl.tpot:.3f} ms (formula {1e3 * (A + B):.3f})")

# %%
# CHECK: the timeline is the formula, to rounding; the outputs are placeholders.
np.testing.assert_allclose(tl.ttft, A + B * P, rtol=1e-12)
np.testing.assert_allclose(tl.tpot, A + B, rtol=1e-12)
np.testing.assert_allclose(tl.e2e, A + B * P + (N_OUT - 1) * (A + B), rtol=1e-12)
assert hand.outputs[0] == [OUTPUT_TOKEN] * N_OUT
print("TTFT, TPOT and end-to-end equal the hand formula")

# %% [markdown]
# ## Step 2 · Simulator against the engine, on this machine
#
# The test of a simulator is a real run. The engine of notebook 07 serves `tiny` with a
# shared system prompt; before it serves, `Engine.time_shapes` times every call shape it can
# make (with `shapes="fixed"` only two: all decode rows padded to `max_running`, and one
# prefill chunk padded to the token budget), each row reading its own pages except the
# system prompt's, which all rows share, as in the trace. That table is the predictor,
# `TableTime`: a step costs the sum of its calls' measured seconds. `host_time=True` adds the
# real time this process spends in the scheduler as the simulation runs (the engine pays that
# Python too). Same trace, same policy, two rates: the engine on a wall clock, the simulator
# on its virtual one.

# %%
SIM_REQUESTS = 24 if QUICK else 96
SYSTEM_LEN, PROMPT_LEN, OUTPUT_LEN = 48, 16, 16
PAGE, BUDGET, MAX_RUNNING = 16, 64, 8
SIM_RATES = (0.5, 0.9)  # of a capacity predicted from the table (below)
TABLE_REPEATS = 5

tiny = refmodel.presets.get("tiny")
model = refmodel.init(tiny, seed=0)


def trace(rate, n=SIM_REQUESTS, seed=0):
    return workloads.shared_prefix(n, rate, system_len=SYSTEM_LEN, prompt_len=PROMPT_LEN,
                                   output_len=OUTPUT_LEN, vocab=tiny.vocab_size, seed=seed,
                                   spread=0.3)


longest = max(len(r.prompt) + r.max_new_tokens for r in trace(1.0) + trace(1.0, 1, seed=1))
MAX_LEN = pages_for(longest, PAGE) * PAGE
NUM_PAGES = MAX_RUNNING * pages_for(MAX_LEN, PAGE) + pages_for(SYSTEM_LEN, PAGE)
CALLS = EngineCalls(has_state=False, shapes="fixed", token_budget=BUDGET,
                    max_running=MAX_RUNNING, max_len=MAX_LEN, page_size=PAGE)


def measured_engine():
    """A fresh engine, compiled, and its call table measured before it serves anything."""
    e = Engine(model, num_pages=NUM_PAGES, page_size=PAGE, policy="mixed", token_budget=BUDGET,
               max_running=MAX_RUNNING, max_len=MAX_LEN, shapes="fixed", array_pages=NUM_PAGES)
    e.warmup()
    times = e.time_shapes(TABLE_REPEATS, shared_pages=SYSTEM_LEN // PAGE)
    return e, {shape: float(np.median(ts)) for shape, ts in times.items()}


def simulator(table, host_time=True):
    return Simulator(TableTime(table, CALLS), num_pages=NUM_PAGES, page_size=PAGE,
                     policy="mixed", token_budget=BUDGET, max_running=MAX_RUNNING,
                     host_time=host_time)


_, table0 = measured_engine()
print("call table (median s):", {f"{b}x{t}": f"{1e3 * s:.3f} ms" for (b, t), s in
                                 table0.items()})
alone = simulator(table0, host_time=False).run(trace(math.inf, 1, seed=1)).timelines[0]
CAPACITY = MAX_RUNNING / alone.e2e  # requests/s if MAX_RUNNING ran at unloaded speed
print(f"one request alone, predicted: end-to-end {1e3 * alone.e2e:.2f} ms -> naive capacity "
      f"{CAPACITY:.0f} requests/s")

METRICS = ("ttft", "tpot", "e2e")
compared = {}
for frac in SIM_RATES:
    reqs = trace(frac * CAPACITY)
    eng, table = measured_engine()  # the table just before this run: drift follows
    real = eng.run(reqs)
    sim = simulator(table).run(reqs)
    mean = {name: {m: float(np.mean([getattr(r.timelines[q.id], m) for q in reqs]))
                   for m in METRICS} for name, r in (("engine", real), ("sim", sim))}
    compared[frac] = {"real": real, "sim": sim, "mean": mean, "reqs": reqs}

print(f"{'rate':>10s} {'steps eng/sim':>13s} " + " ".join(
    f"{m + ' eng':>9s} {m + ' sim':>9s} {'err':>6s}" for m in METRICS))
for frac, c in compared.items():
    errs = [(c["mean"]["sim"][m] - c["mean"]["engine"][m]) / c["mean"]["engine"][m]
            for m in METRICS]
    c["errors"] = dict(zip(METRICS, errs, strict=True))
    cols = " ".join(f"{1e3 * c['mean']['engine'][m]:7.2f}ms {1e3 * c['mean']['sim'][m]:7.2f}ms "
                    f"{e:+6.0%}" for m, e in zip(METRICS, errs, strict=True))
    print(f"{frac * CAPACITY:6.0f} r/s {len(c['real'].steps):7d}/{len(c['sim'].steps):<5d} "
          f"{cols}")

# %%
# CHECK: the simulator served every request of the trace, all their tokens, and every error
# is a finite number. (Its size is printed, not asserted: wall-clock runs of millisecond
# steps on a shared machine are noisy.)
for c in compared.values():
    ids = sorted(q.id for q in c["reqs"])
    assert sorted(c["sim"].timelines) == sorted(c["real"].timelines) == ids
    assert all(len(c["sim"].outputs[q.id]) == q.max_new_tokens for q in c["reqs"])
    assert all(np.isfinite(e) for e in c["errors"].values()), c["errors"]
worst = max(abs(e) for c in compared.values() for e in c["errors"].values())
print(f"{len(ids)} requests planned by both at each rate; largest |error| of a mean: "
      f"{worst:.0%}")

# %% [markdown]
# **Why the error grows with the load.** The simulator runs the same scheduler, so its only
# error is each step's predicted time (call-time noise, what the table misses: the engine's
# Python around its calls, the gather of pages, caches warmed differently). Alone, a step's
# error shows up once. Under load it compounds through the queue: a request waits for the steps
# of everyone ahead of it, and by queueing theory (M/M/1, and Kingman's formula for any
# single queue) the wait grows like $1/(1-\rho)$ with the utilization $\rho$. A relative error
# $\epsilon$ in service time moves the wait by about $\epsilon/(1-\rho)$: near saturation a
# small step-time error becomes a large TTFT error. Taking the offered rate over the naive
# capacity as $\rho$ (a batching server's true capacity depends on the batch it reaches, so
# this is a stand-in):

# %%
for frac, c in compared.items():
    print(f"{frac * CAPACITY:5.0f} requests/s: rho ~ {frac:.0%} -> an error in step "
          f"time is amplified ~{1 / (1 - frac):.0f}x in waiting time; measured TTFT error "
          f"{c['errors']['ttft']:+.0%}, TPOT error {c['errors']['tpot']:+.0%}")

# %% [markdown]
# A counted predictor instead of a measured one: `RooflineTime` with `EngineCalls` counts each
# call's FLOPs and bytes (the padded rows over the fixed view, plus the gather that builds
# it) on this machine's roofs from `figures/data/peaks.json` (when the bundled file exists;
# otherwise a stated guess), plus a per-call floor. It is a floor on time, not a fit:

# %%
peaks_file = DATA / "peaks.json"
if peaks_file.exists():  # the last engine of step 2 (its compiled call counts kernels)
    chip, curve, info = simulate.machine_chip(json.loads(peaks_file.read_text()), eng)
    roofs = RooflineTime(tiny, chip, CALLS, bandwidth_at=curve)
    source = f"roofs measured on '{chip.name}' (peaks.json)"
else:  # an assumption, stated: a 2-core CPU's order of magnitude
    chip = Chip("assumed CPU", flops=1e11, bandwidth=2e10, memory=2**40, dtype="float32",
                floor=1e-4)
    roofs = RooflineTime(tiny, chip, CALLS)
    source = "assumed roofs (100 GFLOP/s, 20 GB/s, 0.1 ms per call)"
print(source)
for shape, seconds in table0.items():
    print(f"call {shape[0]}x{shape[1]}: measured {1e3 * seconds:.3f} ms, roofline "
          f"{1e3 * roofs.engine_call(shape):.3f} ms -> measured / roofline "
          f"{seconds / roofs.engine_call(shape):.1f}x")

# %%
# CHECK: a roofline prediction is a positive, finite time of at least the per-call floor.
assert all(chip.floor <= roofs.engine_call(s) < math.inf for s in table0)
print("roofline call times are finite and at least the per-call floor")

# %% [markdown]
# On a CPU the tiny model's calls are short enough that dispatch dominates, so the printed
# measured / roofline ratio says how far this engine runs from its roofs. From here on the
# predictor is `RooflineTime` with `calls=None`: an ideal fused engine (one call per step over
# exactly the real tokens) on chips we don't have. Such numbers are bounds.
#
# ## Step 3 · Scale out on paper: tensor parallelism on H100s
#
# `scale.placement` picks the smallest power-of-two tensor-parallel (TP) group of one device
# that holds the weights (in 70% of 90% of its memory, so KV keeps room) and counts the KV
# pages the rest holds. `RooflineTime(cfg, chip, tp=, link=)` splits each step's FLOPs and
# bytes over the TP chips (Megatron) and adds a ring all-reduce of the step's activations
# after every attention and every FFN block over the device's scale-up link.

# %%
CHIP = scale.chip_of(DEVICE, DTYPE)
SCALE_UP, SCALE_OUT, DOMAIN = scale.links_of(DEVICE)
MIX = ("chat", 512, 128)  # name, mean prompt tokens, mean output tokens
print(f"assumptions: {CHIP.name} at {CHIP.flops / 1e12:.0f} TFLOP/s {DTYPE} dense, "
      f"{CHIP.bandwidth / 1e12:.2f} TB/s, {CHIP.memory / 1e9:.0f} GB (spec sheet); TP over "
      f"{SCALE_UP.name} ({SCALE_UP.bandwidth / 1e9:.0f} GB/s, {1e6 * SCALE_UP.latency:.1f} us "
      f"per hop, up to {DOMAIN} chips); weights, KV and activations in {DTYPE}; no launch, "
      f"kernel or scheduling losses; mixed policy, token budget {PAPER_BUDGET}, at most "
      f"{PAPER_RUNNING} running; trace: {PAPER_REQUESTS} requests, ~{MIX[1]} prompt / ~{MIX[2]} "
      "output tokens, Poisson arrivals")


def paper_trace(cfg, mix, rate, n=PAPER_REQUESTS, seed=0):
    return workloads.random_requests(n, rate, prompt_len=mix[1], output_len=mix[2],
                                     vocab=cfg.vocab_size, seed=seed)


def paper_pages(place, cfg, mix):
    """KV pages of a simulated instance: the chip's, capped at PAPER_RUNNING x the trace's
    longest request. Then, as with all the chip's pages, memory never refuses an admission:
    no decision changes, only the time the pool takes to count its pages each step."""
    longest = max(len(r.prompt) + r.max_new_tokens for r in paper_trace(cfg, mix, math.inf))
    return min(place["pages"], PAPER_RUNNING * pages_for(longest, PAPER_PAGE))


def slo_of(make, mix):
    """SLO_SCALE x one request of the mix's mean lengths alone on one instance."""
    t = make().run([Request(0, (1,) * mix[1], mix[2])]).timelines[0]
    return {"ttft": SLO_SCALE * t.ttft, "tpot": SLO_SCALE * t.tpot}


def capacity_of(make, cfg, mix, instances=1):
    """Requests/s that `instances` instances complete when the whole trace arrives at once."""
    reqs = paper_trace(cfg, mix, math.inf)
    tl = list(disagg.colocated(reqs, make, instances).values())
    return len(tl) / metrics.duration(tl)


scaled = {}
for name in ("llama3-8b", "llama3-70b"):
    cfg = refmodel.presets.get(name)
    place = scale.placement(cfg, DEVICE, PAPER_PAGE, DTYPE)
    tp = place["tp"]
    pred = RooflineTime(cfg, CHIP, tp=tp, link=place["link"] if tp > 1 else None,
                        weight_dtype=DTYPE, kv_dtype=DTYPE, act_dtype=DTYPE)

    def make(pred=pred, place=place, cfg=cfg):
        return Simulator(pred, num_pages=paper_pages(place, cfg, MIX), page_size=PAPER_PAGE,
                         policy="mixed", token_budget=PAPER_BUDGET, max_running=PAPER_RUNNING,
                         prefix_cache=False)

    slo, cap = slo_of(make, MIX), capacity_of(make, cfg, MIX)
    runs = {}
    for f in PAPER_RATES:
        tl = list(make().run(paper_trace(cfg, MIX, f * cap)).timelines.values())
        runs[f] = metrics.summarize(tl, slo["ttft"], slo["tpot"])
    decode = ((1, MIX[1]),) * PAPER_RUNNING  # one decode step of a full batch
    comm = pred.blocks * SCALE_UP.all_reduce(PAPER_RUNNING * cfg.d_model * 2, tp)
    scaled[name] = {"cfg": cfg, "place": place, "pred": pred, "slo": slo, "capacity": cap,
                    "runs": runs, "step": pred.fused(decode), "comm": comm}
    print(f"{name}: weights {place['weight_bytes'] / 1e9:.0f} GB -> TP {tp}, "
          f"{place['pages']} KV pages ({place['pages'] * PAPER_PAGE / 1e3:.0f}k tokens); "
          f"SLOs TTFT {1e3 * slo['ttft']:.1f} ms, TPOT {1e3 * slo['tpot']:.2f} ms; capacity "
          f"{cap:.1f} requests/s")
    print(f"  decode step of {PAPER_RUNNING} at {MIX[1]} tokens: {1e3 * pred.fused(decode):.2f} ms"
          f", of which all-reduces {1e3 * comm:.3f} ms ({pred.blocks} blocks)")
    for f, s in runs.items():
        print(f"  {f * cap:6.1f} requests/s: TTFT p90 {1e3 * s['ttft_s']['p90']:7.1f} ms, TPOT "
              f"p50 {1e3 * s['tpot_s']['p50']:5.2f} ms, attainment {s['slo_attainment']:4.0%}, "
              f"goodput {s['goodput_requests_per_s']:5.1f}/s = "
              f"{s['goodput_requests_per_s'] / tp:5.1f}/s per chip")

# %%
fig = Figure(figsize=(9, 4), layout="constrained")
ax = fig.add_subplot()
for name, s in scaled.items():
    rates = [f * s["capacity"] for f in PAPER_RATES]
    ax.plot(rates, [s["runs"][f]["goodput_requests_per_s"] / s["place"]["tp"]
                    for f in PAPER_RATES], marker="o",
            label=f"{name}, TP {s['place']['tp']}")
    ax.plot(rates, [r / s["place"]["tp"] for r in rates], color="gray", ls=":", lw=1)
ax.set_xscale("log")
ax.set_xlabel("Offered rate [requests/s] (dotted: offered rate per chip)")
ax.set_ylabel("Goodput per chip [requests/s]")
ax.set_title(f"Roofline-simulated serving on {DEVICE} ({DTYPE}, spec peaks)")
ax.legend()
display(fig)

# %%
# CHECK: 70B does not fit one H100 (TP > 1), and then the all-reduces cost time every step;
# 8B on one chip has none. The step is at least its communication.
s8, s70 = scaled["llama3-8b"], scaled["llama3-70b"]
assert s70["place"]["tp"] > 1 and s70["place"]["weight_bytes"] > 0.9 * CHIP.memory
assert s70["comm"] > 0 and s70["step"] > s70["comm"]
assert s8["place"]["tp"] == 1 and s8["comm"] == 0
print(f"llama3-70b: TP {s70['place']['tp']}, all-reduces {s70['comm'] / s70['step']:.1%} of a "
      f"decode step; weights {s70['place']['weight_bytes'] / s8['place']['weight_bytes']:.1f}x "
      f"8B's, decode step {s70['step'] / s8['step']:.1f}x 8B's on {s70['place']['tp']}x the "
      "chips")

# %% [markdown]
# **What to notice.** With a short trace, goodput sits below the offered rate even where
# every request meets its SLOs: it counts requests over the run's span, which includes the
# last request's whole life (`LAB_FULL=1` runs more requests). The signal is the attainment
# column: where it drops below 100% at the highest rates, queueing has pushed TTFT past its
# SLO and goodput per chip stops growing with the offered rate. Per chip, the two models differ
# by more than their step times: the 70B group spends its chips on holding and reading weights.
# Tensor parallelism splits those weight reads over the group, which is why the printed 70B
# decode step is only a few times the 8B one; the all-reduces are the printed fraction of the
# step (at these batch sizes they are latency-bound: $2(n-1)$ hops per block).
#
# ## Step 4 · Prefill/decode disaggregation
#
# Colocated instances run prefill and decode on the same chips: a long prompt's prefill
# stalls (or, chunked, slows) every decode beside it. Disaggregated serving (Splitwise,
# DistServe) gives each phase its own instances: $x$ prefill instances produce the first
# token, the prompt's KV cache crosses a link, and $y$ decode instances produce the rest.
# `disagg.disaggregated` runs one simulator per instance; the decode side's predictor is
# wrapped by `disagg.installed` (arriving KV is installed, not computed). Same chip count:
# `1P1D` against 2 colocated llama3-8b replicas (and, in full mode, 4-chip designs), for a
# long-prompt mix and a long-output mix, requests dealt round-robin.

# %%
PD_MODEL = refmodel.presets.get("llama3-8b")
PD_MIXES = (("long prompt", 2048, 32), ("long output", 128, 256))
PD_DESIGNS = ((1, 1),) if QUICK else ((1, 1), (1, 3), (2, 2), (3, 1))
PD_RATES = (0.5, 1.0) if QUICK else (0.25, 0.5, 1.0, 1.5)
PD_TPOT_SCALE = 1.5  # a tight, interactive TPOT SLO (DistServe's concern): 1.5 x unloaded
pd_place = scale.placement(PD_MODEL, DEVICE, PAPER_PAGE, DTYPE)
pd_pred = RooflineTime(PD_MODEL, CHIP, weight_dtype=DTYPE, kv_dtype=DTYPE, act_dtype=DTYPE)
print(f"assumptions: llama3-8b, one {DEVICE} per instance (TP {pd_place['tp']}); KV ({DTYPE}) "
      f"over {SCALE_OUT.name} ({SCALE_OUT.bandwidth / 1e9:.0f} GB/s); prefill instances run "
      "prefill-first, colocated ones mixed; round-robin routing; SLOs: TTFT "
      f"{SLO_SCALE:g} x and TPOT {PD_TPOT_SCALE:g} x one request alone")


def pd_sim(mix, policy="mixed", installed=False, budget=PAPER_BUDGET):
    return Simulator(disagg.installed(pd_pred) if installed else pd_pred,
                     num_pages=paper_pages(pd_place, PD_MODEL, mix), page_size=PAPER_PAGE,
                     policy=policy, token_budget=budget, max_running=PAPER_RUNNING,
                     prefix_cache=False)


def kv_bytes(r):
    return costs.kv_cache_bytes(PD_MODEL, len(r.prompt), 1, DTYPE)


pd_rows = []
for mix in PD_MIXES:
    def colo(mix=mix):
        return pd_sim(mix)

    slo = slo_of(colo, mix)
    slo["tpot"] *= PD_TPOT_SCALE / SLO_SCALE
    chips_max = max(x + y for x, y in PD_DESIGNS)
    cap = capacity_of(colo, PD_MODEL, mix, instances=chips_max)
    for f in PD_RATES:
        reqs = paper_trace(PD_MODEL, mix, f * cap)
        for n in sorted({x + y for x, y in PD_DESIGNS}):  # colocated on each chip count
            tl = disagg.colocated(reqs, colo, n)
            pd_rows.append({"mix": mix[0], "rate": f * cap, "design": f"{n} colocated",
                            "chips": n, "summary": metrics.summarize(
                                list(tl.values()), slo["ttft"], slo["tpot"]),
                            "per_chip": disagg.goodput_per_chip(tl, n, slo["ttft"],
                                                                slo["tpot"])})
        for x, y in PD_DESIGNS:
            res = disagg.disaggregated(reqs, lambda mix=mix: pd_sim(mix, "prefill-first"),
                                       lambda mix=mix: pd_sim(mix, installed=True,
                                                              budget=PAPER_RUNNING * 4096),
                                       x, y, kv_bytes, SCALE_OUT)
            tl = res["timelines"]
            pd_rows.append({"mix": mix[0], "rate": f * cap, "design": f"{x}P{y}D",
                            "chips": x + y, "summary": metrics.summarize(
                                list(tl.values()), slo["ttft"], slo["tpot"]),
                            "transfers": res["transfers"], "reqs": reqs,
                            "per_chip": disagg.goodput_per_chip(tl, x + y, slo["ttft"],
                                                                slo["tpot"])})
    print(f"{mix[0]} (~{mix[1]} prompt, ~{mix[2]} output): SLOs TTFT {1e3 * slo['ttft']:.1f} ms, "
          f"TPOT {1e3 * slo['tpot']:.2f} ms")

print(f"{'mix':12s} {'rate/s':>7s} {'design':>12s} {'TTFT p90':>9s} {'TPOT p90':>9s} "
      f"{'attain':>6s} {'goodput/chip':>12s}")
for r in pd_rows:
    s = r["summary"]
    print(f"{r['mix']:12s} {r['rate']:7.1f} {r['design']:>12s} {1e3 * s['ttft_s']['p90']:7.1f}ms "
          f"{1e3 * s['tpot_s']['p90']:7.2f}ms {s['slo_attainment']:6.0%} {r['per_chip']:12.2f}")

# %%
# CHECK: every request's prompt KV crossed the link, and its size is the cost model's count;
# that count is 2 (K and V) x layers x KV heads x head dim x 2 bytes per prompt token.
per_token = 2 * PD_MODEL.n_layers * PD_MODEL.n_kv_heads * PD_MODEL.head_dim * 2
moved_rows = [r for r in pd_rows if "transfers" in r]
assert moved_rows
for r in moved_rows:
    assert sorted(r["transfers"]) == sorted(q.id for q in r["reqs"])
    for q in r["reqs"]:
        moved = r["transfers"][q.id]
        assert moved["bytes"] == costs.kv_cache_bytes(PD_MODEL, len(q.prompt), 1, DTYPE)
        assert moved["bytes"] == per_token * len(q.prompt)
        np.testing.assert_allclose(moved["seconds"], SCALE_OUT.send(moved["bytes"]))
longest_prompt = max(len(q.prompt) for q in moved_rows[0]["reqs"])
print(f"KV moved per prompt token: {per_token / 1024:.0f} KiB; the longest prompt "
      f"({longest_prompt} tokens) moves {per_token * longest_prompt / 1e6:.0f} MB in "
      f"{1e3 * SCALE_OUT.send(per_token * longest_prompt):.1f} ms over {SCALE_OUT.name}")

# %%
def pd_winner(mix_name, rate):
    """The design with the most goodput per chip, or 'tie' when the best are within 1%."""
    here = sorted((r for r in pd_rows if r["mix"] == mix_name and r["rate"] == rate),
                  key=lambda r: -r["per_chip"])
    tie = len(here) > 1 and here[1]["per_chip"] >= 0.99 * here[0]["per_chip"]
    return ("tie" if tie else here[0]["design"]), here


pd_keys = list(dict.fromkeys((r["mix"], r["rate"]) for r in pd_rows))
for mix_name, rate in pd_keys:
    winner, here = pd_winner(mix_name, rate)
    print(f"{mix_name:12s} at {rate:6.1f} requests/s: most goodput per chip: {winner} ("
          + ", ".join(f"{r['design']} {r['per_chip']:.2f}/s" for r in here) + ")")


# %% [markdown]
# **What to notice.** Read the printed winners per mix and rate. Where both designs meet
# every SLO, goodput per chip is the same requests over about the same span, and they tie.
# Where the colocated design loses, compare the TPOT p90 columns: its decodes share steps with
# long prefill chunks, which breaks a tight TPOT SLO, while a decode instance never sees a
# prefill. The price shows in TTFT: one prefill instance queues every prompt, and each
# request's KV crosses the link (the check's numbers say how long, next to the TPOT SLO).
# Where a mix gives the prefill side little to do, a disaggregated design idles those chips.
# DistServe's point is that the best split depends on the mix, the SLOs and the rate, which is
# what a simulator lets you sweep (`LAB_FULL=1` adds 4-chip designs and more rates).
#
# ## Step 5 · Attention-FFN disaggregation
#
# A decode step reads every FFN weight once however many tokens pass, so the FFN's FLOP/byte
# grows with the tokens it sees; attention reads each sequence's own KV and cannot share. AFD
# (MegaScale-Infer, Step-3) puts attention on $n_a$ chips and the FFN (or experts) on $n_f$
# chips: the FFN then sees the tokens of all $n_a$ attention chips at once. `afd.best_ratio`
# searches the split of a chip budget (and micro-batches ping-ponged between the sides) and
# compares with the same chips as tensor-parallel replicas (`afd.colocated_step`).

# %%
AFD_CHIPS, AFD_BATCH, AFD_CONTEXT = 32, 16, 4096
AFD_MODELS = ("llama3-70b", "qwen3-30b-a3b")
print(f"assumptions: {AFD_CHIPS} x {DEVICE}, {AFD_BATCH} sequences of {AFD_CONTEXT} tokens per "
      f"attention chip, activations over {SCALE_OUT.name}, {DTYPE}, layers taken as equal")
afd_res = {}
for name in AFD_MODELS:
    cfg = refmodel.presets.get(name)
    r = afd.best_ratio(cfg, CHIP, SCALE_OUT, AFD_CHIPS, AFD_BATCH, AFD_CONTEXT,
                       weight_dtype=DTYPE, kv_dtype=DTYPE, act_dtype=DTYPE)
    afd_res[name] = (cfg, r)
    b, co = r["best"], r["colocated"]
    kind = "MoE" if "moe" in cfg.layer_ffns else "dense"
    print(f"{name} ({kind}): best split {r['n_attn']} attention : {r['n_ffn']} FFN chips, "
          f"{r['microbatches']} micro-batches, bound by {b['binds']}")
    print(f"  FFN sees {b['ffn_tokens']} tokens per pass -> {b['ffn_intensity']:.1f} FLOP/B "
          f"(AFD) vs {co['ffn_tokens']} -> {co['ffn_intensity']:.1f} FLOP/B (colocated, TP "
          f"{co['tp']}); ridge {CHIP.ridge:.0f}")
    print(f"  tokens/s per chip: AFD {b['tokens_per_s_per_chip']:.0f}, colocated "
          f"{co['tokens_per_s_per_chip']:.0f} -> gain {r['gain']:.2f}x")

# %%
# CHECK: with one micro-batch nothing overlaps: a layer takes exactly T_a + T_f + 2 T_c
# (attention, FFN, and the activations there and back), and that serial sum binds.
for name, (cfg, r) in afd_res.items():
    serial = afd.afd_step(cfg, CHIP, CHIP, SCALE_OUT, r["n_attn"], r["n_ffn"], AFD_BATCH,
                       AFD_CONTEXT, 1, DTYPE, DTYPE, DTYPE)
    lay = serial["layer"]
    np.testing.assert_allclose(lay["layer_time"],
                               lay["attention"] + lay["ffn"] + 2 * lay["comm"], rtol=1e-12)
    assert serial["binds"] == "dependency" and not serial["comm_hidden"]
    print(f"{name}, m = 1: layer {1e6 * lay['layer_time']:.1f} us = attention "
          f"{1e6 * lay['attention']:.1f} + FFN {1e6 * lay['ffn']:.1f} + 2 x comm "
          f"{1e6 * lay['comm']:.1f} us")

# %% [markdown]
# **What to notice.** Compare the two FFN intensities of each model against the ridge. For
# an MoE model each token touches only its active experts, so the colocated FFN's intensity
# is far below a dense model's at the same batch; pooling the tokens of many attention chips
# raises it. The printed gain says whether that outweighed the chips it takes off attention
# and the communication that ping-pong micro-batches must hide, for each model at this batch
# and context; the module docstring (`refmodel/sim/afd.py`) states when a gain can appear at
# all.
#
# ## Step 6 · SRAM-only chips
#
# A Groq LPU keeps weights and KV in on-chip SRAM (80 TB/s, but 230 MB per chip); a Cerebras
# WSE-3 wafer has 44 GB of SRAM. Decoding is then bandwidth-rich and capacity-poor: how many
# chips does a model need just to be held?

# %%
GROQ = scale.chip_of("Groq LPU", "float16")  # the LPU lists no bf16 peak
WSE = scale.chip_of("Cerebras WSE-3", "float16")
GROQ_LINK, _, _ = scale.links_of("Groq LPU")
SRAM_CONTEXT = 4096
need = {}
for name in ("llama3-8b", "llama3-70b"):
    cfg = refmodel.presets.get(name)
    for chip in (GROQ, WSE):
        need[name, chip.name] = sram.chips_needed(cfg, chip, "float16", "float16", 1,
                                                  SRAM_CONTEXT + 1)
        n = need[name, chip.name]
        print(f"{name:10s} on {chip.name:14s} ({chip.memory / 1e9:6.2f} GB each): weights "
              f"{n['weight_bytes'] / 1e9:5.1f} GB + KV of one {SRAM_CONTEXT}-token sequence "
              f"{n['kv_bytes'] / 1e9:4.2f} GB -> {n['chips']} chips")

# %%
# CHECK: chips = ceil((weights + KV) / capacity), counted independently here.
for (name, chip_name), n in need.items():
    cfg = refmodel.presets.get(name)
    chip = GROQ if chip_name == GROQ.name else WSE
    total = costs.param_counts(cfg)["total"] * 2 + costs.kv_cache_bytes(
        cfg, SRAM_CONTEXT + 1, 1, "float16")
    assert n["chips"] == math.ceil(total / chip.memory), (name, chip_name)
print("chip counts match ceil(bytes / capacity)")

# %% [markdown]
# Held, the model runs as a pipeline: each chip a slice of layers, activations hopping chip
# to chip, micro-batches in flight (`sram.pipeline_decode`). `sram.pareto` sweeps the batch:
# tokens/s per user (how fast one answer streams) against tokens/s per chip (what a token
# costs), for llama3-70b on Groq LPUs (as many as hold weights + KV) and on 8 H100s with
# tensor parallelism (`sram.tensor_parallel_decode`).

# %%
SRAM_MODEL = refmodel.presets.get("llama3-70b")
SRAM_BATCHES = (1, 4, 16, 64) if QUICK else (1, 2, 4, 8, 16, 32, 64, 128)
GPUS = DOMAIN
curve = sram.pareto(SRAM_MODEL, GROQ, GROQ_LINK, CHIP, SCALE_UP, GPUS, SRAM_BATCHES,
                    SRAM_CONTEXT, "float16", "float16", "float16")
print(f"{'batch':>5s} {'LPUs':>5s} {'LPU tok/s/user':>15s} {'tok/s/chip':>11s} "
      f"{'H100 tok/s/user':>16s} {'tok/s/chip':>11s}")
for s, g in zip(curve["sram"], curve["gpu"], strict=True):
    print(f"{s['batch']:5d} {s['chips']:5d} {s['tokens_per_s_per_user']:15.0f} "
          f"{s['tokens_per_s_per_chip']:11.2f} {g['tokens_per_s_per_user']:16.0f} "
          f"{g['tokens_per_s_per_chip']:11.1f}")

fig = Figure(figsize=(9, 4), layout="constrained")
ax = fig.add_subplot()
for key, label in (("sram", f"Groq LPU pipeline ({GROQ_LINK.name})"),
                   ("gpu", f"{GPUS} x {DEVICE}, TP over {SCALE_UP.name}")):
    pts = curve[key]
    ax.loglog([p["tokens_per_s_per_chip"] for p in pts],
              [p["tokens_per_s_per_user"] for p in pts], marker="o", label=label)
    for p in pts:
        ax.annotate(f"B={p['batch']}", (p["tokens_per_s_per_chip"], p["tokens_per_s_per_user"]),
                    fontsize=7, textcoords="offset points", xytext=(3, 3))
ax.set_xlabel("Tokens/s per chip")
ax.set_ylabel("Tokens/s per user")
ax.set_title(f"llama3-70b decode at {SRAM_CONTEXT} tokens (fp16, roofline bounds)")
ax.legend()
display(fig)

# %% [markdown]
# **What to notice.** Read the table along each curve. An SRAM pipeline streams one
# sequence from on-chip memory, so its tokens/s per user can exceed the GPUs', but it needs
# the printed number of chips just to hold weights and KV, so its tokens/s per *chip* is low
# unless many micro-batches fill the pipeline; the GPUs trade per-user speed for per-chip
# throughput as the batch grows. Compare the two column pairs at each batch. Which is
# cheaper depends on what a chip costs, which this notebook does not know.
#
# Prefill is compute-heavy and SRAM chips hold little, so a heterogeneous design prefills on
# GPUs and ships the KV to the SRAM pipeline (`sram.heterogeneous`): TTFT = prefill +
# transfer, TPOT = the pipeline's cycle.

# %%
lpus = need["llama3-70b", GROQ.name]["chips"]
het = sram.heterogeneous(SRAM_MODEL, CHIP, GPUS, SCALE_OUT, GROQ, GROQ_LINK, lpus,
                         SRAM_CONTEXT, 1, 1, "float16", "float16", "float16")
gpu_only = sram.tensor_parallel_decode(SRAM_MODEL, CHIP, SCALE_UP, GPUS, 1, SRAM_CONTEXT,
                                       "float16", "float16", "float16")
print(f"{SRAM_CONTEXT}-token prompt: prefill on {GPUS} x {DEVICE} {1e3 * het['prefill']:.1f} ms "
      f"+ KV {het['kv_bytes'] / 1e9:.2f} GB over {SCALE_OUT.name} {1e3 * het['transfer']:.1f} ms "
      f"-> TTFT {1e3 * het['ttft']:.1f} ms")
print(f"decode on {lpus} LPUs: TPOT {1e3 * het['tpot']:.2f} ms; on the {GPUS} GPUs alone "
      f"(batch 1): {1e3 * gpu_only['step']:.2f} ms")

# %%
# CHECK: TTFT is the sum of its parts; the transfer is the prompt's KV over the link.
np.testing.assert_allclose(het["ttft"], het["prefill"] + het["transfer"], rtol=1e-12)
assert het["kv_bytes"] == costs.kv_cache_bytes(SRAM_MODEL, SRAM_CONTEXT, 1, "float16")
np.testing.assert_allclose(het["transfer"], SCALE_OUT.send(het["kv_bytes"]), rtol=1e-12)
print(f"transfer = {het['transfer'] / het['ttft']:.0%} of TTFT")

# %% [markdown]
# ## What to take away
#
# Each line below is printed from this notebook's own numbers; rerun with `LAB_FULL=1` for
# more requests, rates and designs.

# %%
err = {f: c["errors"] for f, c in compared.items()}
lpu_best = max(p["tokens_per_s_per_user"] for p in curve["sram"])
gpu_best = max(p["tokens_per_s_per_user"] for p in curve["gpu"])
lpu_chip = max(p["tokens_per_s_per_chip"] for p in curve["sram"])
gpu_chip = max(p["tokens_per_s_per_chip"] for p in curve["gpu"])
print("1. The simulator is the engine's scheduler with a step-time predictor: on the hand "
      "case it reproduces the formula exactly; against the engine on this machine its mean "
      "TTFT error was " + ", ".join(f"{e['ttft']:+.0%} at {f:.0%}" for f, e in err.items())
      + " of the naive capacity (noisy; queueing amplifies step-time error near saturation).")
print(f"2. On paper, llama3-70b needs TP {s70['place']['tp']} on {DEVICE}; its all-reduces "
      f"were {s70['comm'] / s70['step']:.1%} of a {PAPER_RUNNING}-sequence decode step over "
      f"{SCALE_UP.name}.")
print("3. Prefill/decode disaggregation vs colocation on the same chips (TPOT SLO "
      f"{PD_TPOT_SCALE:g} x unloaded), most goodput per chip: " + "; ".join(
          f"{m} at {rate:.1f}/s: {pd_winner(m, rate)[0]}" for m, rate in pd_keys) + ".")
print("4. Attention-FFN disaggregation on " f"{AFD_CHIPS} chips: " + "; ".join(
    f"{n} gain {r['gain']:.2f}x (FFN {r['best']['ffn_intensity']:.0f} vs "
    f"{r['colocated']['ffn_intensity']:.0f} FLOP/B)" for n, (_, r) in afd_res.items()) + ".")
print(f"5. SRAM: llama3-70b needs {need['llama3-70b', GROQ.name]['chips']} Groq LPUs or "
      f"{need['llama3-70b', WSE.name]['chips']} WSE-3 wafers to be held; the LPU pipeline "
      f"reached {lpu_best:.0f} tokens/s per user vs {gpu_best:.0f} on {GPUS} H100s, at "
      f"{lpu_chip:.1f} vs {gpu_chip:.0f} tokens/s per chip at best.")

# %% [markdown]
# All of step 3 onwards are roofline bounds from spec sheets: they rank designs under stated
# assumptions; they do not predict a deployment's milliseconds. Step 2 showed how far a real
# engine can sit from such predictions even on one CPU.
