# ---
# jupyter:
#   jupytext:
#     formats: ipynb,py:percent
#     text_representation:
#       extension: .py
#       format_name: percent
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
# A model of $P$ parameters stored in $s$ bytes each does about $2P$ FLOPs per token
# (one multiply-add per weight). Prefill reads the weights once for $T$ tokens, decode once
# for $B$ tokens (one per sequence):
#
# $$ I_\text{prefill} \approx \frac{2PT}{sP} = \frac{2T}{s}, \qquad
#    I_\text{decode} \approx \frac{2PB}{sP} = \frac{2B}{s}. $$
#
# At batch 1 in float32 decode sits near $0.5$ FLOP/byte, left of every ridge point
# (notebook 01): decode is memory-bound, prefill compute-bound. Here one model is counted
# (`refmodel.costs.phase_costs`) and measured (`microbench.phases.measure_point`).

# %%
# %matplotlib inline
import os

import jax
import numpy as np
from flax import nnx
from IPython.display import display
from matplotlib.figure import Figure

import refmodel
from microbench import hardware, harness, peaks, plot, sweeps
from microbench.phases import Budget, measure_point
from microbench.schema import KIND_PHASES
from refmodel import costs

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
# CHECK: decode reads each weight once (the embedding: one row per token), the whole step is
# its two halves plus embedding, final norm and LM head, decode sits below 1 FLOP/byte in
# float32, far below every spec chip's ridge, and prefill is > 10x more intense.
s = costs.dtypes(cfg).w
V, D = cfg.vocab_size, cfg.d_model
np.testing.assert_allclose(dec["weight_bytes"], s * (counts["total"] - V * D + 1 * D))
final_norm = dec["ops"]["norm"]["flops"] - att["ops"]["norm"]["flops"] - \
    ffn["ops"]["norm"]["flops"]
np.testing.assert_allclose(dec["flops"], att["flops"] + ffn["flops"] + final_norm
                           + dec["ops"]["lm_head"]["flops"] + dec["ops"]["embed"]["flops"])
assert dec["intensity"] < 1.0
ridges = {n: hardware.ridge_point(hardware.get(n)) for n in hardware.list_devices()
          if n != "cpu"}
assert dec["intensity"] < min(ridges.values()), min(ridges.items(), key=lambda kv: kv[1])
assert pre["intensity"] > 10 * dec["intensity"]
print(f"decode I = {dec['intensity']:.2f} < lowest spec ridge "
      f"{min(ridges.values()):.1f} FLOP/byte; prefill I = {pre['intensity']:.1f}")

# %% [markdown]
# ## Step 3 · Measure both phases on this machine
#
# First this machine's roofs, quickly (`microbench.peaks.quick_roofs`): a float32 GEMM (the
# matrix roof), and a read and an in-place scale of an array larger than the last-level cache
# (main memory's read-only and read+write roofs), all timed with `harness.time_fn`. Then
# `measure_point` times each compiled phase and places it beside its counted cost and its
# roofline prediction $t = \max(\text{FLOPs}/P,\ \text{bytes}/\beta)$.

# %%
PEAKS = peaks.quick_roofs(512 if QUICK else 2048, budget_s=TIMING.budget_s,
                         min_samples=TIMING.min_samples)
for r in PEAKS["roofs"]["compute"] + PEAKS["roofs"]["memory"]:
    print(f"{r['name']}: {plot.fmt_si(r['value'], 'FLOP/s' if r['kind'] == 'compute' else 'B/s')}"
          + (f"  SUSPECT: {r['reason']}" if r.get("suspect") else ""))

# %%
points = {}
for phase in refmodel.PHASES:
    context = 0 if phase == "decode_ffn" else PROMPT
    p = measure_point(phases, phase, 1, context, PEAKS, TIMING, label=cfg.attention)
    points[phase] = p
    pred = p["predicted"]
    print(f"{phase:17s}: {p['timing']['median'] * 1e3:8.3f} ms, "
          f"{plot.fmt_si(p['flops_per_s']['median'], 'FLOP/s'):>13s} at I = "
          f"{p['intensity']:6.2f}; roofline says {pred['bound']}-bound, "
          f"{pred['time_s'] * 1e3:.3f} ms -> measured/predicted {p['measured_over_predicted']:.2f}")

# %%
# CHECK: each measured point sits at its counted intensity (achieved FLOP/s over byte/s), its
# counts are the cost model's, and its throughput is tokens over the median time.
for phase, p in points.items():
    c = costs.phase_costs(cfg, phase, 1, p["context"])
    np.testing.assert_allclose([p["flops"], p["bytes"]], [c["flops"], c["bytes"]])
    np.testing.assert_allclose(p["flops_per_s"]["median"] / p["bytes_per_s"]["median"],
                               c["intensity"], rtol=1e-9)
    np.testing.assert_allclose(p["tokens_per_s"]["median"] * p["timing"]["median"],
                               p["tokens"], rtol=1e-9)
    assert p["predicted"]["bound"] in ("compute", "memory")
assert points["prefill"]["tokens"] == PROMPT and points["decode"]["tokens"] == 1
print("measured points agree with their counts")

# %% [markdown]
# On a model this small (quick mode) a decode step takes tens of microseconds, and a fixed
# per-call cost (dispatch, fusion boundaries) is most of it: measured/predicted is far below 1.
# With `LAB_FULL=1` the `bench` preset (~50M parameters, 6x the last-level cache) streams its
# weights from DRAM and decode moves toward the bandwidth roof.
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
for dev in ("H100 SXM", "TPU v5e"):
    tf = sweeps.step_time(big, hardware.get(dev), "prefill", 1, 2048)
    td = sweeps.step_time(big, hardware.get(dev), "decode", 1, 2048)
    print(f"modelled llama3-8b bf16 on {dev}: TTFT(2048) {tf['time_s'] * 1e3:.0f} ms "
          f"({tf['bound']}-bound), TPOT {td['time_s'] * 1e3:.2f} ms ({td['bound']}-bound)")

# %%
# CHECK: doubling the prompt at least doubles prefill FLOPs (linear part) and less than
# triples them (the quadratic attention part is small), and at real scale the roofline model
# puts a 2048-token prefill on the compute roof and a batch-1 decode step on the memory roof.
for T in PROMPTS:
    r = costs.phase_costs(cfg, "prefill", 1, 2 * T)["flops"] / ttft[T]["flops"]
    assert 2.0 <= r < 3.0, (T, r)
for dev in ("H100 SXM", "TPU v5e"):
    assert sweeps.step_time(big, hardware.get(dev), "prefill", 1, 2048)["bound"] == "compute"
    assert sweeps.step_time(big, hardware.get(dev), "decode", 1, 2048)["bound"] == "memory"
print("prefill scales ~linearly with T; prefill compute-bound, decode memory-bound at scale")

# %%
result = {"kind": KIND_PHASES, "machine": MACHINE, "peaks": PEAKS,
          "model": {"preset": PRESET, "params": counts["total"], "dtype": cfg.dtype},
          "points": [{"sweep": "roofline", "variant": cfg.attention, **p}
                     for p in points.values()]}
display(plot.phases_roofline_figure([result]))

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
