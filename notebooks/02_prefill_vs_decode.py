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
# # 02 · Prefill vs decode: why the second is memory-bound
#
# Serving a prompt of $T$ tokens has two phases:
#
# - **prefill** runs all $T$ prompt tokens through the model at once and fills the KV cache;
#   its latency is the *time to first token* (TTFT);
# - **decode** then produces one token per sequence per step, reading the cache; its latency
#   is the *time per output token* (TPOT).
#
# A model of $\Theta$ parameters stored in $s$ bytes each does about $2\Theta$ FLOPs per token
# (one multiply-add per weight; $P$ stays the peak FLOP/s of notebook 01). Counting only the
# weights' bytes, prefill reads them once for $T$ tokens, decode once for $B$ tokens (one per
# sequence):
#
# $$ I_\text{prefill} \approx \frac{2\Theta T}{s\Theta} = \frac{2T}{s}, \qquad
#    I_\text{decode} \approx \frac{2\Theta B}{s\Theta} = \frac{2B}{s}. $$
#
# The decode estimate holds (the activations of $B$ tokens are tiny next to the weights); the
# prefill one only while $T$ is small, as step 2 shows. At batch 1 in float32 decode sits
# near $0.5$ FLOP/byte, left of every ridge point (notebook 01): decode is memory-bound,
# prefill compute-bound. Here one model is counted
# (`refmodel.costs.phase_costs`) and measured (`microbench.phases.points.measure_point`).

# %%
# %matplotlib inline
import os

import jax
import numpy as np
from flax import nnx
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
PRESET = "tiny" if QUICK else "bench"
PROMPT = 64 if QUICK else 256  # T: prompt tokens; decode then runs at context T
PROMPTS = (16, 64) if QUICK else (64, 128, 256, 512)  # TTFT vs prompt length
TIMING = Budget(budget_s=0.1, min_samples=3, min_sample_s=1e-3) if QUICK else Budget()
jax.config.update("jax_default_matmul_precision", "highest")
ENV = harness.environment()
SPEC = hardware.device_for_environment(ENV)
MACHINE = peaks.machine_label(ENV)
print(MACHINE, "| preset", PRESET, "| quick" if QUICK else "| full")
FIGURES = machines.figures_folder("phases")  # figures/<machine>/ of the committed run

# %% [markdown]
# ## Step 1 · Build the model
#
# `refmodel.init` builds a Flax NNX transformer; `refmodel.Phases` splits it once and jits
# each phase alone: `prefill`, `decode`, and the two halves of a decode step,
# `decode_attention` and `decode_ffn`. `refmodel.costs.param_counts` counts its parameters
# from the config alone.

# %%
cfg = refmodel.presets.get(PRESET)
model = refmodel.init(cfg, seed=0)
phases = refmodel.Phases(model)
counts = costs.param_counts(cfg)
print(f"{PRESET}: D={cfg.d_model} L={cfg.n_layers} N={cfg.n_heads} K={cfg.n_kv_heads} "
      f"F={cfg.d_ff} V={cfg.vocab_size}, {cfg.dtype}")
print({k: f"{v:,}" for k, v in counts["components"].items() if v})

# %%
# CHECK: the counted parameters are exactly the elements the model created.
created = sum(x.size for x in jax.tree.leaves(nnx.state(model, nnx.Param)))
assert counts["total"] == created, (counts["total"], created)
print(f"{created:,} parameters, counted == created")

# %% [markdown]
# ## Step 2 · Count both phases
#
# `phase_costs(cfg, phase, batch, context)` sums the FLOPs and bytes of every op, each formula
# written beside the code that runs it. Decode reads every weight once per step, except the
# embedding table, of which it gathers one row per token.

# %%
pre = costs.phase_costs(cfg, "prefill", 1, PROMPT)
dec = costs.phase_costs(cfg, "decode", 1, PROMPT)
att = costs.phase_costs(cfg, "decode_attention", 1, PROMPT)
ffn = costs.phase_costs(cfg, "decode_ffn", 1, 0)
for c in (pre, dec, att, ffn):
    print(f"{c['phase']:17s} B={c['batch']} ctx={c['context']:4d}: {c['flops']:.3e} FLOPs, "
          f"{c['bytes']:.3e} bytes (weights {c['weight_bytes']:.2e}, KV {c['kv_bytes']:.2e}, "
          f"activations {c['act_bytes']:.2e}) -> I = {c['intensity']:.2f} FLOP/byte")
print("decode, FLOP/byte per op:", {op: round(v["intensity"], 2) for op, v in dec["ops"].items()
                                   if v["intensity"] is not None})

# %%
def check_decode_memory_bound(decode_intensity, prefill_intensity, lowest_ridge):
    """CHECK (fails on a wrong count): decode sits below 1 FLOP/byte in float32 and below the
    lowest spec chip's ridge, and prefill is more than 10x as intense."""
    assert decode_intensity < 1.0, f"decode at {decode_intensity:.2f} FLOP/byte, not below 1"
    assert decode_intensity < lowest_ridge, (
        f"decode at {decode_intensity:.2f} FLOP/byte reaches a ridge of {lowest_ridge:.1f}")
    assert prefill_intensity > 10 * decode_intensity, (
        f"prefill {prefill_intensity:.2f} FLOP/byte is not 10x decode's {decode_intensity:.2f}")


# Decode reads each weight once (the embedding: one row per token), and the whole step is its
# two halves plus embedding, final norm and LM head (the counts against independent sums).
s = costs.dtypes(cfg).weight_size
V, D = cfg.vocab_size, cfg.d_model
np.testing.assert_allclose(dec["weight_bytes"], s * (counts["total"] - V * D + 1 * D))
final_norm = dec["ops"]["norm"]["flops"] - att["ops"]["norm"]["flops"] - \
    ffn["ops"]["norm"]["flops"]
np.testing.assert_allclose(dec["flops"], att["flops"] + ffn["flops"] + final_norm
                           + dec["ops"]["lm_head"]["flops"] + dec["ops"]["embed"]["flops"])
ridges = {n: hardware.ridge_point(hardware.get(n)) for n in hardware.list_devices()
          if n != "cpu"}
check_decode_memory_bound(dec["intensity"], pre["intensity"], min(ridges.values()))
print(f"decode I = {dec['intensity']:.2f} < lowest spec ridge "
      f"{min(ridges.values()):.1f} FLOP/byte; prefill I = {pre['intensity']:.1f}")

# %% [markdown]
# Prefill's intensity is well below $2T/s$ (with `LAB_FULL=1`, $T = 256$ in float32: 128
# predicted, about 80 counted). The estimate counted only the weights, but a GEMM of $T$
# tokens, $[T, D] \times [D, F]$, also reads its input and writes its output:
#
# $$ I_\text{GEMM} = \frac{2TDF}{s\,(TD + DF + TF)}
#    = \frac{2/s}{1/T + 1/D + 1/F}
#    \;\xrightarrow{T \to \infty}\; \frac{2DF}{s\,(D + F)} . $$
#
# It is $\approx 2T/s$ only while $T \ll D, F$, and saturates at $2DF/(s(D+F))$ however long
# the prompt: prefill's intensity is bounded by the model's width. The norms and residual
# adds (about 1 FLOP per byte) pull the whole phase lower still.

# %%
D, F = cfg.d_model, cfg.d_ff
gemm_I = (2 / s) / (1 / PROMPT + 1 / D + 1 / F)
print(f"T={PROMPT}, D={D}, F={F}, s={s}: 2T/s = {2 * PROMPT / s:.1f}; GEMM formula {gemm_I:.1f};"
      f" counted ffn_down {pre['ops']['ffn_down']['intensity']:.1f}; saturation 2DF/(s(D+F)) ="
      f" {2 * D * F / (s * (D + F)):.1f}; whole prefill {pre['intensity']:.1f} FLOP/byte")

# %%
# CHECK: the counted FFN down-projection has the GEMM intensity derived above (the formula
# is below both 2T/s and its saturation value for any T, D, F), and the whole phase, with its
# norms and residual adds, is below the GEMM's.
np.testing.assert_allclose(pre["ops"]["ffn_down"]["intensity"], gemm_I, rtol=1e-12)
assert pre["intensity"] < gemm_I, (pre["intensity"], gemm_I)
print("prefill intensity: below 2T/s, as the GEMM formula says")

# %% [markdown]
# ## Step 3 · Measure both phases on this machine
#
# First this machine's roofs, quickly (`microbench.roofs.peaks.quick_roofs`): one round of the main
# roofs (`microbench.roofs.rounds`) on a main-memory array of max(1 GiB, 16 x the last-level cache)
# (quick mode: 256 MiB, at least 8x the last-level cache, so up to an eighth of it may still be
# cached and the memory roofs read a little high): XLA's float32 GEMM, read and in-place scale
# beside numpy's matmul and a C read, scale and triad on every core. Each roof is the program that
# reached the most, named beside its value; what XLA alone reaches is kept as the compiler level.
# Then `measure_point` times each compiled phase and places it beside its counted cost and its
# roofline prediction (`microbench.phases.points`): the phase's ops run one after another, each
# at its own roof, after a measured per-call floor,
#
# $$ t = t_\text{floor} + \sum_\text{ops} \max\left(\frac{\text{FLOPs}_\text{op}}{P},\
#    \frac{\text{bytes}_\text{op}}{\beta}\right), $$
#
# $t_\text{floor}$ the dispatch cost plus a cost per compiled kernel (both measured,
# `microbench.roofs.overhead`). A decode phase is timed cold (the caches evicted before every
# call, as inside a real step, where every other layer's bytes pass through them), so its
# $\beta$ is main memory's read roof; prefill, timed warm, is read at the bandwidth of its
# working set's size. The max of the whole phase's two times is the bound of a program that
# overlaps all its compute with all its memory traffic, which no sequence of kernels does.

# %%
PEAKS = peaks.quick_roofs(512 if QUICK else 2048,
                         array_bytes=256 << 20 if QUICK else None,  # quick: >= 8x LLC
                         budget_s=TIMING.budget_s, min_samples=TIMING.min_samples)
for r in PEAKS["roofs"]["compute"] + PEAKS["roofs"]["memory"]:
    print(f"{r['name']}: {plots.fmt_si(r['value'], 'FLOP/s' if r['kind'] == 'compute' else 'B/s')}"
          + (f"  SUSPECT: {r['reason']}" if r.get("suspect") else ""))

# %%
points = {}
for phase in refmodel.PHASES:
    context = 0 if phase == "decode_ffn" else PROMPT
    p = measure_point(phases, phase, 1, context, PEAKS, TIMING, label=cfg.attention)
    points[phase] = p
    pred = p["predicted"]
    print(f"{phase:17s}: {p['timing']['median'] * 1e3:8.3f} ms, "
          f"{plots.fmt_si(p['flops_per_s']['median'], 'FLOP/s'):>13s} at I = "
          f"{p['intensity']:6.2f}; roofline says {pred['bound']}-bound, "
          f"{pred['time_s'] * 1e3:.3f} ms -> measured/predicted {p['measured_over_predicted']:.2f}")

# %%
def check_under_roofs(flops_rate, bytes_rate, gemm_roof, memory_roof, from_memory):
    """CHECK (fails on a wrong measurement): a phase beats neither roof. Its FLOP/s ({median,
    p10, p90}) stays under the measured GEMM roof ({value, p10, p90}) and, when its bytes come
    from main memory (`from_memory`: timed cold, or a working set past the last-level cache),
    its byte/s under main memory's best roof, each within the spreads of roof and point,
    spread = (p90 - p10) / median (or / value)."""
    def spread_of(d):
        return (d["p90"] - d["p10"]) / d.get("median", d.get("value"))

    assert flops_rate["median"] <= gemm_roof["value"] * (
        1 + spread_of(flops_rate) + spread_of(gemm_roof)), (
        f"{flops_rate['median']:.3g} FLOP/s above the GEMM roof {gemm_roof['value']:.3g}")
    if from_memory:
        assert bytes_rate["median"] <= memory_roof["value"] * (
            1 + spread_of(bytes_rate) + spread_of(memory_roof)), (
            f"{bytes_rate['median']:.3g} B/s above main memory's roof "
            f"{memory_roof['value']:.3g}: the bytes came from a cache, or a count is wrong")


# measured/predicted is then <= 1 within the spreads for those phases; a phase below LOW is
# flagged: it runs in the overhead regime (a fixed per-call cost dominates), where the
# roofline says little.
LOW = 0.3
llc = max((size for _, size in peaks.memory_levels(ENV, SPEC)), default=32 << 20)
gemm_roof = PEAKS["roofs"]["compute"][0]
best_mem = max(PEAKS["roofs"]["memory"], key=lambda r: r["value"])
for phase, p in points.items():
    in_dram = bool(p.get("cold")) or p["working_set_bytes"] > llc
    check_under_roofs(p["flops_per_s"], p["bytes_per_s"], gemm_roof, best_mem, in_dram)
    ratio = p["measured_over_predicted"]
    note = "" if ratio >= LOW else "  FLAG: overhead regime"
    where = ("main memory, timed cold" if p.get("cold") else "main memory") if in_dram \
        else "cache"
    print(f"{phase:17s}: measured/predicted {ratio:.2f}, working set "
          f"{p['working_set_bytes'] / 2**20:.1f} MiB ({where}){note}")

# %% [markdown]
# On a model this small (quick mode) a decode step takes tens of microseconds, and a fixed
# per-call cost (dispatch, fusion boundaries) is most of it: measured/predicted is far below 1
# (flagged above). With `LAB_FULL=1` the `bench` preset (~50M float32 parameters, several
# times the last-level cache) streams its weights from DRAM and decode moves toward the
# bandwidth roof. The committed full-size figure, below the quick one in step 4, shows it.
#
# ## Step 4 · TTFT and time per output token
#
# $$ \text{TTFT}(T) \approx t_\text{prefill}(T), \qquad
#    \text{TPOT} \approx t_\text{decode}(\text{context}), \qquad
#    \text{latency}(n) \approx \text{TTFT} + (n-1)\,\text{TPOT}. $$
#
# Prefill's FLOPs grow about linearly with $T$ (plus a $T^2$ attention term); a decode step
# costs about the same whatever came before, until the KV cache rivals the weights.

# %%
ttft = {T: measure_point(phases, "prefill", 1, T, PEAKS, TIMING) for T in PROMPTS}
tpot = points["decode"]["timing"]["median"]
for T, p in ttft.items():
    print(f"T={T:4d}: TTFT {p['timing']['median'] * 1e3:7.3f} ms "
          f"({p['tokens_per_s']['median']:.0f} prompt tokens/s)")
print(f"TPOT at context {PROMPT}: {tpot * 1e3:.3f} ms ({1 / tpot:.0f} tokens/s per sequence)")
print(f"latency of 128 new tokens after a {PROMPT}-token prompt: "
      f"{(points['prefill']['timing']['median'] + 127 * tpot) * 1e3:.1f} ms")
big = refmodel.presets.get("llama3-8b")
big_weights = costs.param_counts(big)["total"] * 2  # bf16
for dev in ("H100 SXM", "TPU v5e"):
    h = hardware.get(dev)
    tf = sweeps.step_time(big, h, "prefill", 1, 2048)
    td = sweeps.step_time(big, h, "decode", 1, 2048)
    fits = "fit" if big_weights <= h.memory_bytes else \
        "do NOT fit: it needs 2 chips, modelled as one"
    print(f"modelled llama3-8b bf16 on one {dev}: TTFT(2048) {tf['time_s'] * 1e3:.0f} ms "
          f"({tf['bound']}-bound), TPOT {td['time_s'] * 1e3:.2f} ms ({td['bound']}-bound); "
          f"its {big_weights / 1e9:.1f} GB of weights {fits} ({h.memory_bytes / 1e9:.0f} GB)")
chip, (link, _, _) = chip_of("TPU v5e"), links_of("TPU v5e")
tp2 = {ph: comms.step_time(comms.per_device(big, ph, 1, 2048, {"tensor": 2},
                                            weight_dtype="bfloat16"),
                           chip.flops, chip.bandwidth, link.bandwidth, link.latency)
       for ph in ("prefill", "decode")}
print(f"split over 2 TPU v5e by tensor parallelism (notebook 11's model, {link.name}): "
      f"TTFT(2048) {tp2['prefill']['total'] * 1e3:.0f} ms, TPOT "
      f"{tp2['decode']['total'] * 1e3:.2f} ms, of which the all-reduces "
      f"{tp2['decode']['comm'] * 1e3:.2f} ms")

# %% [markdown]
# The TPU v5e line is a roofline of one chip's peak and bandwidth: Llama 3 8B's bf16 weights
# (16.1 GB) do not fit its 16 GB, so a real deployment splits them over two chips. With
# tensor parallelism (notebook 11) each chip then reads half the weights and does half the
# FLOPs, so a step takes about half the one-chip time, plus the all-reduces that join the
# halves (the last line above): faster tokens, on twice the chips.

# %%
def check_ttft_grows(fastest_short_s, fastest_long_s):
    """CHECK (fails on a wrong measurement): measured TTFT grows with the prompt: the fastest
    sample of the longest prompt is slower than the fastest of the shortest (on this shared
    machine the spread of a sub-millisecond call can exceed its median)."""
    assert fastest_long_s > fastest_short_s, (
        f"the longest prompt's prefill ({fastest_long_s * 1e3:.3f} ms) is not slower than the "
        f"shortest's ({fastest_short_s * 1e3:.3f} ms)")


check_ttft_grows(ttft[min(PROMPTS)]["timing"]["min"], ttft[max(PROMPTS)]["timing"]["min"])
# Doubling the prompt at least doubles prefill FLOPs and less than triples them (the quadratic
# attention part is small); at real scale the roofline model puts a 2048-token prefill on the
# compute roof and a batch-1 decode step on the memory roof, and two chips halve the time.
for T in PROMPTS:
    r = costs.phase_costs(cfg, "prefill", 1, 2 * T)["flops"] / ttft[T]["flops"]
    assert 2.0 <= r < 3.0, (T, r)
for dev in ("H100 SXM", "TPU v5e"):
    assert sweeps.step_time(big, hardware.get(dev), "prefill", 1, 2048)["bound"] == "compute"
    assert sweeps.step_time(big, hardware.get(dev), "decode", 1, 2048)["bound"] == "memory"
one_chip = sweeps.step_time(big, hardware.get("TPU v5e"), "decode", 1, 2048)["time_s"]
assert 0.45 < tp2["decode"]["total"] / one_chip < 0.6, tp2["decode"]["total"] / one_chip
print("prefill scales ~linearly with T; prefill compute-bound, decode memory-bound at scale")

# %%
result = {"kind": KIND_PHASES, "machine": MACHINE, "peaks": PEAKS,
          "model": {"preset": PRESET, "params": counts["total"], "dtype": cfg.dtype},
          "points": [{"sweep": "roofline", "variant": cfg.attention, **p}
                     for p in points.values()]}
display(plots.phases_roofline_figure([result]))

# %%
fig = Figure(figsize=(8, 5), layout="constrained")
ax = fig.add_subplot()
ax.plot(list(ttft), [p["timing"]["median"] * 1e3 for p in ttft.values()], "s-",
        label="TTFT = prefill time (measured)")
ax.axhline(tpot * 1e3, color="0.3", ls="--", label=f"TPOT = one decode step at context {PROMPT}")
ax.set_xscale("log", base=2)
ax.set_yscale("log")
ax.set_xlabel("Prompt length T (tokens)")
ax.set_ylabel("Time (ms)")
ax.set_title(f"'{PRESET}' on {MACHINE}: prefill grows with T, a decode step does not")
ax.legend()
display(fig)

# %% [markdown]
# Above: this run (quick mode, the `tiny` preset unless `LAB_FULL=1`). Below, for comparison:
# the committed full-size figure (`figures/<machine>/phases_roofline.png`, drawn by
# `python -m microbench figures` from `figures/data/<machine>/phases.json`: the preset
# and the machine named in its title), whose points sit near the roofs.

# %%
committed = FIGURES / "phases_roofline.png"
if committed.exists():
    display(Image(filename=str(committed)))
print(f"committed full-size figure: {committed} ({'shown' if committed.exists() else 'missing'})")
