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
# # 03 · Batch size: throughput is free until the ridge
#
# A decode step reads every FFN weight once, whatever the batch $B$, and does $2B$ FLOPs per
# weight. With $s$-byte weights and activations small next to them,
#
# $$ I_\text{FFN}(B) \approx \frac{2 B\, \Theta_\text{FFN}}{s\, \Theta_\text{FFN}} = \frac{2B}{s}
#    \quad(\text{bf16: } I \approx B), $$
#
# for $\Theta_\text{FFN}$ FFN parameters ($P$ is kept for a peak FLOP/s, as in notebook 01).
#
# Below the ridge point the step time is the time to read the weights, so serving $B$ users
# costs about as much as serving one: throughput (tokens/s per system) grows ~linearly with
# $B$ while each user's speed (tokens/s per user) barely drops. Two things end this. Past the
# ridge, compute sets the time and each user slows down. But every user also holds a KV cache
# that each step reads: at long contexts those reads outgrow the weights' long before the FFN
# reaches the ridge, and the step, still memory-bound, then grows with $B$ (step 3 counts
# where). And the caches must fit in memory, which caps $B$ (step 4).

# %%
# %matplotlib inline
import os

import jax
import numpy as np
from IPython.display import Image, display
from matplotlib.figure import Figure

import refmodel
from microbench import hardware, harness, machines, plots
from microbench.phases import sweeps
from microbench.phases.points import Budget, measure_point
from microbench.roofs import peaks
from microbench.schema import KIND_PHASES
from microbench.studies.scale import chip_of, links_of
from refmodel import costs
from refmodel.parallel import comms

# %%
QUICK = os.environ.get("LAB_FULL", "0") != "1"  # parameter: LAB_FULL=1 for publication size
PRESET = "small" if QUICK else "bench"
CONTEXT = 64 if QUICK else 1024
BATCHES = (1, 4, 16) if QUICK else (1, 2, 4, 8, 16, 32, 64)
TIMING = Budget(budget_s=0.1, min_samples=3, min_sample_s=1e-3) if QUICK else Budget()
jax.config.update("jax_default_matmul_precision", "highest")
ENV = harness.environment()
SPEC = hardware.device_for_environment(ENV)
MACHINE = peaks.machine_label(ENV)
print(MACHINE, "| preset", PRESET, "| quick" if QUICK else "| full")
FIGURES = machines.figures_folder("phases")  # figures/<machine>/ of the committed run

# %% [markdown]
# ## Step 1 · Count decode-FFN intensity against batch
#
# For the notebook's model (float32, $s=4$: $I \approx B/2$) and for Llama 3 70B in bf16
# ($I \approx B$), from `refmodel.costs.phase_costs(cfg, "decode_ffn", B, 0)`.

# %%
cfg = refmodel.presets.get(PRESET)
llama = refmodel.presets.get("llama3-70b")
ALL_B = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)
counted = {name: {B: costs.phase_costs(c, "decode_ffn", B, 0)["intensity"] for B in ALL_B}
           for name, c in ((PRESET, cfg), ("llama3-70b", llama))}
for name, row in counted.items():
    print(f"{name:11s}", "  ".join(f"B={B}: {i:.3g}" for B, i in row.items()))

# %%
# CHECK: 16x the batch gives ~16x the intensity (within 20%) while weights dominate the bytes;
# in bf16 a batch-1 FFN does ~1 FLOP per byte.
for name, row in counted.items():
    np.testing.assert_allclose(row[16] / row[1], 16, rtol=0.2, err_msg=name)
np.testing.assert_allclose(counted["llama3-70b"][1], 1.0, rtol=0.02)
print({name: round(row[16] / row[1], 2) for name, row in counted.items()})

# %% [markdown]
# ## Step 2 · Measure decode FFN and the whole decode step against batch
#
# First this machine's roofs (one round of XLA, numpy and C on the main roofs, as in
# notebook 02; quick mode on a 256 MiB array), then `measure_point` at each batch.

# %%
PEAKS = peaks.quick_roofs(512 if QUICK else 2048,
                         array_bytes=256 << 20 if QUICK else None,  # quick: >= 8x LLC
                         budget_s=TIMING.budget_s, min_samples=TIMING.min_samples)
phases = refmodel.Phases(refmodel.init(cfg, seed=0))
points = []
for B in BATCHES:
    for phase in ("decode_ffn", "decode"):
        p = measure_point(phases, phase, B, CONTEXT, PEAKS, TIMING, label="gqa")
        points.append({"sweep": "batch", "variant": "gqa", **p})
        print(f"B={B:3d} {phase:10s}: {p['timing']['median'] * 1e3:7.3f} ms, I = "
              f"{p['intensity']:6.2f}, {plots.fmt_si(p['flops_per_s']['median'], 'FLOP/s')}, "
              f"{p['tokens_per_s']['median']:8.0f} tokens/s")

# %%
def check_under_gemm_roof(flops_rate, gemm_roof):
    """CHECK (fails on a wrong measurement): a point's FLOP/s ({median, p10, p90}) does not
    beat the measured GEMM roof ({value, p10, p90}) beyond the spreads of roof and point,
    spread = (p90 - p10) / median (or / value)."""
    tol = 1 + (flops_rate["p90"] - flops_rate["p10"]) / flops_rate["median"] + \
        (gemm_roof["p90"] - gemm_roof["p10"]) / gemm_roof["value"]
    assert flops_rate["median"] <= gemm_roof["value"] * tol, (
        f"{flops_rate['median']:.3g} FLOP/s above the GEMM roof {gemm_roof['value']:.3g}")


def check_batching_pays(batch_lo, fastest_lo_s, batch_hi, fastest_hi_s):
    """CHECK (fails on a wrong measurement): the system's tokens/s at the largest batch is
    above the smallest batch's, each from its fastest sample (the least disturbed on a shared
    machine)."""
    lo, hi = batch_lo / fastest_lo_s, batch_hi / fastest_hi_s
    assert hi > lo, (f"batch {batch_hi}: {hi:,.0f} tokens/s, not above batch {batch_lo}'s "
                     f"{lo:,.0f}")


# measured/predicted below LOW is flagged as the overhead regime.
LOW = 0.3
gemm_roof = PEAKS["roofs"]["compute"][0]
for p in points:
    check_under_gemm_roof(p["flops_per_s"], gemm_roof)
    if p["measured_over_predicted"] < LOW:
        print(f"FLAG: B={p['batch']} {p['phase']}: measured/predicted "
              f"{p['measured_over_predicted']:.2f} (overhead regime)")
step = {p["batch"]: p["timing"] for p in points if p["phase"] == "decode"}
lo, hi = min(BATCHES), max(BATCHES)
check_batching_pays(lo, step[lo]["min"], hi, step[hi]["min"])
print(f"decode step: {hi / step[hi]['median'] / (lo / step[lo]['median']):.1f}x the tokens/s "
      f"at {hi // lo}x the batch")

# %% [markdown]
# ## Step 3 · Throughput vs interactivity: why fast tokens cost more
#
# A decode step of time $t(B)$ gives each user $1/t(B)$ tokens/s and the system $B/t(B)$.
# Cost per token is proportional to $t(B)/B$: a user who wants the fastest tokens (small $B$)
# occupies the chip for few tokens, so pays more per token. The modelled curves use the
# roofline time of a real model on spec chips (`microbench.phases.sweeps.modelled_throughput`).

# %%
steps = [p for p in points if p["phase"] == "decode"]
for p in steps:
    t = p["timing"]["median"]
    print(f"measured B={p['batch']:3d}: {1 / t:8.0f} tokens/s per user, "
          f"{p['batch'] / t:8.0f} tokens/s per system")
modelled = sweeps.modelled_throughput("llama3-8b", ("H100 SXM", "TPU v5e"),
                                      sweeps.POWERS_OF_TWO, 4096)
for r in modelled:
    if r["device"] == "H100 SXM":
        print(f"llama3-8b on H100, B={r['batch']:3d}: {r['tokens_per_s_user']:6.0f} tok/s/user, "
              f"{r['tokens_per_s_system']:7.0f} tok/s/system, {r['bound']}-bound "
              f"({r['memory_by'] if r['bound'] == 'memory' else 'FLOPs'}), "
              f"fits: {r['fits_memory']}")
h100_rows = [r for r in modelled if r["device"] == "H100 SXM"]
big = refmodel.presets.get("llama3-8b")
kv_from = next((r["batch"] for r in h100_rows if r["memory_by"] == "KV cache"), None)
compute_from = next((r["batch"] for r in h100_rows if r["bound"] == "compute"), None)
ffn_ridge = next((B for B in sweeps.POWERS_OF_TWO if sweeps.step_time(
    big, hardware.get("H100 SXM"), "decode_ffn", B, 0)["bound"] == "compute"), None)
print(f"at context {h100_rows[0]['context']}: KV-cache reads dominate the step's bytes from "
      f"batch {kv_from}; the step is compute-bound "
      + (f"from batch {compute_from}" if compute_from else "at no batch up to "
         f"{h100_rows[-1]['batch']}")
      + f" (the decode FFN alone would reach the ridge at batch {ffn_ridge})")
chip, (link, _, _) = chip_of("TPU v5e"), links_of("TPU v5e")
v5e_1 = next(r for r in modelled if r["device"] == "TPU v5e" and r["batch"] == 1)
tp2 = comms.step_time(comms.per_device(big, "decode", 1, v5e_1["context"], {"tensor": 2},
                                       weight_dtype="bfloat16"),
                      chip.flops, chip.bandwidth, link.bandwidth, link.latency)
print(f"TPU v5e, batch 1: one chip {v5e_1['step_s'] * 1e3:.1f} ms per step; split over two "
      f"by tensor parallelism {tp2['total'] * 1e3:.1f} ms (all-reduces {tp2['comm'] * 1e3:.2f} "
      "ms)")

# %%
def check_kv_before_ridge(kv_from, compute_from, ffn_ridge):
    """CHECK (fails on a wrong count): at this long context the KV cache's reads outgrow the
    weights' (from batch kv_from) before the decode FFN alone would reach the ridge (batch
    ffn_ridge), and the whole step reaches compute at no batch of the sweep (compute_from
    None), or only after the KV cache took over."""
    assert kv_from is not None, "the weights dominate the bytes at every batch"
    assert ffn_ridge is None or kv_from < ffn_ridge, (
        f"the FFN reaches the ridge at batch {ffn_ridge}, before the KV cache dominates "
        f"(batch {kv_from})")
    assert compute_from is None or compute_from > kv_from, (
        f"compute-bound from batch {compute_from}, before the KV cache dominates")


check_kv_before_ridge(kv_from, compute_from, ffn_ridge)

# %% [markdown]
# At 4096 tokens per user the throughput curve does not reach the ridge (the lines above):
# from a few tens of users on, each step reads more KV cache than weights, so the step time
# grows with the batch while the step stays memory-bound, and adding users stops being free
# well before compute is the limit. Llama 3 8B's bf16 weights (16.1 GB) fit one H100 (80 GB)
# but not one TPU v5e (16 GB): the v5e rows are a roofline of one chip, which a real
# deployment would split over two. With tensor parallelism (notebook 11) each chip reads half
# the weights and does half the FLOPs: about half the step time plus the all-reduces (the last
# line above), on twice the chips. `fits_memory` marks the batches whose weights and KV fit
# one chip; on the v5e there are none.

# %%
# CHECK (modelled, against independent arithmetic): a batch-1 step reads every weight once
# (of the embedding table, one row), so its time is those bf16 bytes over the chip's
# bandwidth (within 5%: the KV cache and activations), and below the ridge 8x the users
# cost < 1.6x the step time (context 512: weights dominate).
for dev in ("H100 SXM", "TPU v5e"):
    h = hardware.get(dev)
    t1 = sweeps.step_time(big, h, "decode", 1, 512)["time_s"]
    read = 2 * (costs.param_counts(big)["total"] - big.vocab_size * big.d_model + big.d_model)
    np.testing.assert_allclose(t1, read / h.memory_bandwidth[h.main_memory], rtol=0.05,
                               err_msg=dev)
    ratio = sweeps.step_time(big, h, "decode", 8, 512)["time_s"] / t1
    assert ratio < 1.6, (dev, ratio)
    print(f"{dev}: batch-1 step {t1 * 1e3:.2f} ms; 8 users cost {ratio:.2f}x the step time")
assert not any(r["fits_memory"] for r in modelled if r["device"] == "TPU v5e")

# %%
result = {"kind": KIND_PHASES, "machine": MACHINE, "peaks": PEAKS,
          "model": {"preset": PRESET, "params": costs.param_counts(cfg)["total"],
                    "dtype": cfg.dtype},
          "points": points, "modelled": {"throughput": modelled}}
display(plots.batch_figure([result]))
display(plots.throughput_figure([result]))

# %% [markdown]
# Above: this run (quick mode: the `small` preset, 20 MB of float32 weights, small enough to
# fit the last-level cache but timed, like every decode phase, after the caches are evicted;
# its steps are short enough for a fixed per-call cost to matter). Below, for
# comparison: the committed full-size figure (`figures/<machine>/batch.png`, drawn by
# `python -m microbench figures` from `figures/data/<machine>/phases.json`: the `bench` preset, its
# weights in DRAM).

# %%
committed = FIGURES / "batch.png"
if committed.exists():
    display(Image(filename=str(committed)))
print(f"committed full-size figure: {committed} ({'shown' if committed.exists() else 'missing'})")

# %% [markdown]
# ## Step 4 · KV bytes per user: the limit on batch
#
# Each sequence keeps $2 L K H$ numbers per token for full attention (K and V, every layer),
# so at context $S$ a user holds $2LKHS\,s$ bytes (a sliding-window layer only its last
# $\min(S, W)$ tokens). On a device of memory $M$ holding $\Theta$ weights of $s$ bytes,
#
# $$ B_\text{max} = \left\lfloor \frac{M - \Theta s}{\text{KV bytes per user}(S)} \right\rfloor . $$
#
# Long contexts shrink the batch, and with it the intensity of every decode step.

# %%
SERVE = (("llama3-8b", "H100 SXM", 1), ("mistral-7b", "H100 SXM", 1),
         ("qwen3-30b-a3b", "H100 SXM", 1), ("llama3-70b", "H200 SXM", 2))
CONTEXTS = (2048, 8192, 32768, 131072)
limits = {}
for preset, dev, n_dev in SERVE:
    c, h = refmodel.presets.get(preset), hardware.get(dev)
    weights = costs.param_counts(c)["total"] * costs.dtypes(c).weight_size
    memory = n_dev * h.memory_bytes
    for S in CONTEXTS:
        per_user = costs.kv_cache_bytes(c, S, 1, "bfloat16")
        limits[preset, S] = int((memory - weights) // per_user)
    print(f"{preset:14s} on {n_dev} x {dev}: weights {weights / 1e9:5.1f} GB of "
          f"{memory / 1e9:.0f} GB; KV/token {costs.kv_bytes_per_token(c):,.0f} B; max batch "
          + ", ".join(f"{S // 1024}K: {limits[preset, S]}" for S in CONTEXTS))

# %%
# CHECK: KV bytes are linear in batch, Llama 3 8B holds 2 x 32 layers x 8 heads x 128 x 2 B =
# 131,072 B per token (the counts against independent arithmetic), and the sliding window of
# Mistral 7B stops its cache from growing past W = 4096.
c8 = refmodel.presets.get("llama3-8b")
np.testing.assert_allclose(costs.kv_cache_bytes(c8, 8192, 7), 7 * costs.kv_cache_bytes(c8, 8192))
assert costs.kv_bytes_per_token(c8) == 131_072
mistral = refmodel.presets.get("mistral-7b")
assert costs.kv_cache_bytes(mistral, 8192) == costs.kv_cache_bytes(mistral, 4096)
print("batch limits consistent")

# %%
fig = Figure(figsize=(9, 5.5), layout="constrained")
ax = fig.add_subplot()
for j, (preset, dev, n_dev) in enumerate(SERVE):
    ax.plot(CONTEXTS, [max(limits[preset, S], 0.5) for S in CONTEXTS], "o-",
            color=plots.PALETTE[j], label=f"{preset} (bf16) on {n_dev} x {dev}")
ax.set_xscale("log", base=2)
ax.set_yscale("log")
ax.set_xlabel("Context per user (tokens)")
ax.set_ylabel("Max concurrent users (weights + KV fit)")
ax.set_title("KV cache per user caps the batch (sliding window: Mistral's cache stops at 4K)")
ax.legend()
display(fig)
