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
# # 04 · Attention variants: what each caches, what each reads per token
#
# In decode, the FFN's cost is fixed per step, but attention reads the whole KV cache of every
# sequence, so its cost grows with the context $S$. The variants differ in what they cache
# per token per layer (for $N$ query heads of size $H$, $K$ KV heads, $G = N/K$):
#
# | variant | cached per token per layer | decode attention reads |
# |---|---|---|
# | MHA ($K=N$) | $2NH$ | all $S$ tokens |
# | GQA ($1<K<N$) | $2KH$ | all $S$ |
# | MQA ($K=1$) | $2H$ | all $S$ |
# | MLA | latent $R$ + RoPE key $d_r$ | all $S$ (absorbed: in latent space) |
# | sliding window $W$ | $2KH$, last $W$ only | $\min(S + 1, W)$ |
# | sparse (top-$k$) | $2KH$ + indexer key | indexer over $S$, attention over $k$ |
# | linear (Mamba-2, Gated DeltaNet) | a fixed state, no per-token cache | the state |
#
# The scores and values of softmax attention do $4NH$ FLOPs per cached token and read
# $2KHs$ bytes, so their intensity is $2G/s$: **$G$ in bf16, whatever the batch**. Sharing KV
# heads (GQA, MQA) and compressing them (MLA) is what buys intensity and memory.
#
# The table is what an engine reads (`costs.phase_costs(..., count="engine")`). This
# repository's sliding-window layer is a fixed ring of $W$ slots that scores all of them,
# masked or not, at every context: its measured phases are compared with that count
# (`count="implementation"`, the default; the extra work is the op `ring_masked_slots`).

# %%
# %matplotlib inline
import dataclasses
import os

import jax
import jax.numpy as jnp
import numpy as np
from IPython.display import Image, display
from matplotlib.figure import Figure

import refmodel
from microbench import hardware, harness, machines, plots
from microbench.phases import sweeps
from microbench.phases.points import Budget, measure_point
from microbench.roofline import predict, spec_roofs
from microbench.roofs import peaks
from refmodel import costs
from refmodel.parallel import comms

# %%
QUICK = os.environ.get("LAB_FULL", "0") != "1"  # parameter: LAB_FULL=1 for publication size
PRESET = "tiny" if QUICK else "small"
MEASURED = ("gqa",) if QUICK else \
    tuple(v for v in sweeps.variants() if v != sweeps.MOE)
CONTEXTS = (16, 128) if QUICK else (256, 1024, 4096)
BATCH = 4 if QUICK else 8
TIMING = Budget(budget_s=0.1, min_samples=3, min_sample_s=1e-3) if QUICK else Budget()
jax.config.update("jax_default_matmul_precision", "highest")
MACHINE = peaks.machine_label(harness.environment())
base = refmodel.presets.get(PRESET)
variants = {v: dataclasses.replace(base, **ch) for v, ch in sweeps.variants().items()
            if v != sweeps.MOE}
print(MACHINE, "| preset", PRESET, "| quick" if QUICK else "| full")
SPEC = hardware.device_for_environment(harness.environment())
FIGURES = machines.figures_folder("phases")  # figures/<machine>/ of the committed run

# %% [markdown]
# ## Step 1 · KV bytes per token: built, counted, and for real models
#
# `refmodel.init_cache` builds each variant's cache pytree; `costs.kv_cache_bytes` counts it
# from the config. A sliding-window cache is a ring of $W$ slots; a linear layer's is a state
# whose size does not depend on $S$.

# %%
S = 4 * base.window  # past the window
built = {}
for v, c in variants.items():
    leaves = jax.tree.leaves(refmodel.init_cache(c, 1, S).layers)
    built[v] = sum(x.nbytes for x in leaves if jnp.issubdtype(x.dtype, jnp.floating))
    print(f"{v:13s}: cache at S={S}: built {built[v]:8,d} B, counted "
          f"{costs.kv_cache_bytes(c, S, 1, 'float32'):8,.0f} B, per token "
          f"{costs.kv_bytes_per_token(c, 'float32'):6,.0f} B")
REAL = ("llama3-70b", "llama3.1-405b", "deepseek-v3", "mistral-7b", "gemma3-27b",
        "gpt-oss-120b", "qwen3-next-80b-a3b")
l70 = refmodel.presets.get("llama3-70b")
real = {name: refmodel.presets.get(name) for name in REAL}
real |= {"llama3-70b as MHA": dataclasses.replace(l70, attention="mha"),
         "llama3-70b as MQA": dataclasses.replace(l70, attention="mqa")}
for name, c in real.items():
    print(f"{name:20s}: {costs.kv_bytes_per_token(c):9,.0f} B/token (bf16), "
          f"{costs.kv_cache_bytes(c, 131072) / 2**30:7.2f} GiB at 128K context")
print("(every cache counted in bf16; DeepSeek-V3 and gpt-oss ship their weights in fp8 and "
      "MXFP4, which does not change these caches)")

# %%
# CHECK: the built caches are the counted bytes; the counts match published figures
# (arXiv:2505.09343 Table 1: DeepSeek-V3 70,272 B/token, Llama 3.1 405B 516,096 B/token);
# MLA < GQA < MHA and MQA < GQA per token; a sliding cache stops growing past W; a linear layer's
# state does not grow at all.
for v, c in variants.items():
    assert built[v] == costs.kv_cache_bytes(c, S, 1, "float32"), v
assert costs.kv_bytes_per_token(real["deepseek-v3"]) == 70_272
assert costs.kv_bytes_per_token(real["llama3.1-405b"]) == 516_096
per_tok = {n: costs.kv_bytes_per_token(c) for n, c in real.items()}
assert per_tok["deepseek-v3"] < per_tok["llama3-70b"] < per_tok["llama3-70b as MHA"]
assert per_tok["llama3-70b as MQA"] < per_tok["llama3-70b"]
W = base.window
kv = {v: [costs.kv_cache_bytes(c, s) for s in (W, 2 * W, 8 * W)] for v, c in variants.items()}
assert kv["sliding"][0] == kv["sliding"][1] == kv["sliding"][2]
assert kv["linear"][0] == kv["linear"][2] and kv["gqa"][2] == 8 * kv["gqa"][0]
m7 = real["mistral-7b"]
assert costs.kv_cache_bytes(m7, 131072) == costs.kv_cache_bytes(m7, m7.window)
print("caches: built == counted; published per-token figures reproduced")

# %%
fig = Figure(figsize=(10, 6), layout="constrained")
ax = fig.add_subplot()
ctx = sweeps.LONG_CONTEXTS
for j, (name, c) in enumerate(real.items()):
    ax.plot(ctx, [costs.kv_cache_bytes(c, s) / 2**30 for s in ctx], "o-", ms=4,
            color=plots.PALETTE[j % 10], label=name)
ax.set_xscale("log", base=2)
ax.set_yscale("log")
ax.set_xlabel("Context (tokens per sequence)")
ax.set_ylabel("KV cache per sequence (GiB, bf16)")
ax.set_title("Full attention grows linearly; windows flatten; MLA and linear layers stay small")
ax.legend(ncol=2, fontsize=9)
display(fig)

# %% [markdown]
# ## Step 2 · Decode-attention intensity: counted for real models, measured here
#
# Counted per op for Llama 3 70B as MHA, GQA ($G=8$) and MQA ($G=64$) at a long context:
# the scores and values sit at $\approx G$ FLOP/byte. (The whole decode-attention phase also
# reads the $q, k, v, o$ projection weights, which at batch 1 dominate when the cache is
# small.) Then the measured decode-attention points of the notebook's model.

# %%
LONG = 32768
attn_int = {}
for k in ("mha", "gqa", "mqa"):
    c = costs.phase_costs(dataclasses.replace(l70, attention=k), "decode_attention", 1, LONG)
    ops = [c["ops"][o] for o in ("attn_scores", "attn_values")]
    attn_int[k] = sum(o["flops"] for o in ops) / sum(o["bytes"] for o in ops)
    print(f"llama3-70b as {k}: scores+values {attn_int[k]:5.1f} FLOP/byte, whole phase "
          f"{c['intensity']:.2f} FLOP/byte at context {LONG}")

# %%
measured = {}  # no roofs here: the points are compared with one another and with the spec
models = {}
for v in MEASURED:
    models[v] = refmodel.init(variants[v], seed=0)
    ph = refmodel.Phases(models[v])
    for ctx_ in CONTEXTS:
        measured[v, ctx_] = measure_point(ph, "decode_attention", BATCH, ctx_, None, TIMING,
                                          label=v)
    if v == "gqa":
        ffn_point = measure_point(ph, "decode_ffn", BATCH, 0, None, TIMING, label=v)
for (v, ctx_), p in measured.items():
    print(f"{v:13s} S={ctx_:5d}: {p['timing']['median'] * 1e3:7.3f} ms, I = "
          f"{p['intensity']:5.2f} FLOP/byte, KV read {p['kv_bytes']:9,.0f} B")
print(f"decode FFN (B={BATCH}): {ffn_point['timing']['median'] * 1e3:.3f} ms")

# %%
def check_under_peak(flops_rate, peak):
    """CHECK (fails on a wrong measurement): a measured point's FLOP/s ({median, p10, p90})
    does not beat this CPU's theoretical float32 peak (None: no spec to bound it) beyond its
    spread, (p90 - p10) / median."""
    if peak is None:
        return
    spread = (flops_rate["p90"] - flops_rate["p10"]) / flops_rate["median"]
    assert flops_rate["median"] <= peak * (1 + spread), (
        f"{flops_rate['median']:.3g} FLOP/s beats the theoretical peak {peak:.3g}")


# Scores+values intensity is G in bf16 (MHA 1, GQA 8, MQA 64, within 5%) and the KV bytes a
# decode step reads grow with S for full attention (the counts against the formula above).
for k, G in (("mha", 1), ("gqa", 8), ("mqa", 64)):
    np.testing.assert_allclose(attn_int[k], G, rtol=0.05, err_msg=k)
lo, hi = min(CONTEXTS), max(CONTEXTS)
assert measured["gqa", hi]["kv_bytes"] > measured["gqa", lo]["kv_bytes"]
PEAK32 = SPEC.peak_flops["float32"] if SPEC is not None and "float32" in SPEC.peak_flops \
    else None
for p in list(measured.values()) + [ffn_point]:
    check_under_peak(p["flops_per_s"], PEAK32)
print("intensity ~ G; measured points under the spec peak")

# %% [markdown]
# ## Step 3 · MLA, naive vs absorbed: same function, different cost
#
# MLA caches a latent $c \in \mathbb{R}^R$ per token. The *naive* form up-projects the latent
# of every cached token into per-head keys and values at each step ($O(S\,R\,N H)$ FLOPs per
# step); the *absorbed* form folds $W_{UK}$ into the query and $W_{UV}$ into the output, so
# attention runs in the latent space and reads only the latent (DeepSeek-V2, Sec. 2.1.3).
# Both compute the same function of the same weights. (The cache-free forward is the naive
# form in both, so the comparison is on the cached path: one decode step over a cache of
# random latents, `refmodel.Phases.example_args(..., fill=True)`.)

# %%
token = jax.random.randint(jax.random.key(1), (2,), 0, base.vocab_size, jnp.int32)
logits = {}
for v in ("mla naive", "mla absorbed"):
    m = models.get(v) or refmodel.init(variants[v], seed=0)
    cache = refmodel.Phases(m).example_args("decode", 2, 64, fill=True, seed=3)[2]  # same seed
    logits[v], _ = refmodel.decode_step(m, token, cache)
ds = refmodel.presets.get("deepseek-v3")
mla_cost = {ab: costs.phase_costs(dataclasses.replace(ds, mla_absorb=ab), "decode_attention", 1,
                                  8192) for ab in (False, True)}
for ab, c in mla_cost.items():
    print(f"deepseek-v3 decode attention at 8K, {'absorbed' if ab else 'naive   '}: "
          f"{c['flops'] / 1e9:9.1f} GFLOP, {c['bytes'] / 1e9:6.2f} GB, KV {c['kv_bytes'] / 1e9:.3f}"
          f" GB, I = {c['intensity']:.1f}")

# %%
# CHECK: naive and absorbed MLA (same seed, same weights) give the same decode logits; they
# read the same latent cache, and at 8K context the naive form does > 50x the FLOPs of the
# absorbed one.
np.testing.assert_allclose(np.asarray(logits["mla naive"]), np.asarray(logits["mla absorbed"]),
                           atol=1e-4, rtol=1e-4)
assert mla_cost[False]["kv_bytes"] == mla_cost[True]["kv_bytes"]
assert mla_cost[False]["flops"] > 50 * mla_cost[True]["flops"]
print("naive == absorbed logits; absorbed does", round(mla_cost[False]["flops"]
                                                       / mla_cost[True]["flops"]), "x fewer FLOPs")

# %% [markdown]
# ## Step 4 · When does attention overtake the FFN?
#
# At batch $B$ the decode FFN reads the FFN weights once; decode attention reads the
# attention weights plus $B$ caches of $S$ tokens. The **crossover context** is the $S$ where
# attention's roofline time passes the FFN's: $\max(\text{FLOPs}/P, \text{bytes}/\beta)$ of
# each phase as an engine counts it (`count="engine"`: a window reads $\min(S + 1, W)$ keys)
# on the roofs of one H100, weights and KV in bf16 (`microbench.roofline.predict`).
# Fewer KV bytes per token push it later; windows and linear layers may remove it.
#
# Two simplifications, stated: (1) most of these models do not fit one H100 (80 GB; the
# number needed for the bf16 weights is printed), and the crossover is modelled on one chip.
# Split over $n$ chips by tensor parallelism, each chip does $1/n$ of the FFN's FLOPs and
# bytes, but not always $1/n$ of attention's: a cache that every head shares is not split
# (MLA's latent, MQA's single KV head: every chip reads all of it, as notebook 11 shows), and
# GQA's $K$ KV heads split only up to $n = K$ (past it each chip holds a whole head, copied).
# The table after the crossovers counts each chip's share at $n = 8$
# (`refmodel.parallel.comms.per_device`); where attention's share is above $1/n$, it overtakes
# the FFN earlier on $n$ chips than modelled here. (2) Every model is counted in bf16, though
# DeepSeek-V3 ships fp8 weights and gpt-oss MXFP4 (4-bit) experts: their FFN reads fewer bytes
# than modelled, so attention overtakes it earlier than shown.

# %%
h100 = hardware.get("H100 SXM")
B16 = 16


def engine_time(c, phase, S, dev=h100, batch=B16):
    """Roofline time of one phase as an engine counts it, bf16, on a spec device's roofs."""
    k = costs.phase_costs(c, phase, batch, S, "bfloat16", "bfloat16", "bfloat16", "engine")
    return predict(k["flops"], k["bytes"], *spec_roofs(dev, "bfloat16"))["time_s"]


def crossover(c):
    """First context of LONG_CONTEXTS where decode attention's time reaches decode FFN's."""
    ffn_t = engine_time(c, "decode_ffn", 0)
    return next((s for s in sweeps.LONG_CONTEXTS
                 if engine_time(c, "decode_attention", s) >= ffn_t), None)


cross = {name: crossover(c) for name, c in real.items()}
for name, s in cross.items():
    n_h100 = -(-2 * costs.param_counts(real[name])["total"] // h100.memory_bytes)
    print(f"{name:20s}: attention overtakes the FFN at "
          + (f"~{s:,} tokens" if s else f"> {sweeps.LONG_CONTEXTS[-1]:,} tokens (never here)")
          + f" (batch {B16}, H100 roofs, bf16; weights need {n_h100:.0f} H100)")

# %%
TP = 8
print(f"decode attention on {TP} chips (tensor parallelism), batch {B16}, context {LONG:,}: "
      f"each chip's share x {TP} (1.00 = split evenly)")
kv_share = {}
for name, c in real.items():
    one = costs.phase_costs(c, "decode_attention", B16, LONG, "bfloat16", "bfloat16",
                            "bfloat16", "engine")
    try:
        chip = comms.per_device(c, "decode_attention", B16, LONG, {"tensor": TP},
                                weight_dtype="bfloat16", kv_dtype="bfloat16",
                                act_dtype="bfloat16")
    except ValueError as e:  # a degree that does not divide its heads
        print(f"{name:20s}: {e}")
        continue
    kv_share[name] = TP * chip["kv_bytes"] / one["kv_bytes"]
    print(f"{name:20s}: KV bytes {TP * chip['kv_bytes'] / one['kv_bytes']:5.2f}, weight bytes "
          f"{TP * chip['weight_bytes'] / one['weight_bytes']:5.2f}, FLOPs "
          f"{TP * chip['flops'] / one['flops']:5.2f}")
# CHECK (the counts against the text): GQA with K = 8 KV heads splits its cache over 8 chips;
# MLA's latent and MQA's one head are read whole by every chip.
np.testing.assert_allclose(kv_share["llama3-70b"], 1.0, rtol=1e-9)
for name in ("deepseek-v3", "llama3-70b as MQA"):
    np.testing.assert_allclose(kv_share[name], TP, rtol=1e-9, err_msg=name)

# %%
# CHECK: fewer KV bytes per token move the crossover later (MHA < GQA < MQA for the same
# Llama 3 70B); Mistral's window makes attention's time stop growing past W, and below W it
# is exactly full attention of the same shape (the window has not cut anything yet), while
# this repository's ring would read all W slots from the first token.
order = [cross[n] or float("inf") for n in ("llama3-70b as MHA", "llama3-70b",
                                              "llama3-70b as MQA")]
assert order[0] < order[1] < order[2], order
t_att = [engine_time(m7, "decode_attention", s) for s in (m7.window, 4 * m7.window)]
np.testing.assert_allclose(t_att[0], t_att[1], rtol=1e-9)
m7_full = dataclasses.replace(m7, attention="gqa")
for s in (256, 1024):
    np.testing.assert_allclose(engine_time(m7, "decode_attention", s),
                               engine_time(m7_full, "decode_attention", s), rtol=1e-12)
ring = costs.phase_costs(m7, "decode_attention", B16, 256, "bfloat16", "bfloat16", "bfloat16")
assert ring["kv_bytes"] > 10 * costs.phase_costs(m7, "decode_attention", B16, 256, "bfloat16",
                                                 "bfloat16", "bfloat16", "engine")["kv_bytes"]
print("crossover ordering holds; Mistral at 256 tokens: attention/FFN",
      f"{engine_time(m7, 'decode_attention', 256) / engine_time(m7, 'decode_ffn', 0):.2f}")

# %%
fig = Figure(figsize=(13, 5.5), layout="constrained")
ax1, ax2 = fig.subplots(1, 2)
for j, v in enumerate(MEASURED):
    pts = [(s, p) for (v_, s), p in measured.items() if v_ == v]
    ax1.plot([s for s, _ in pts], [p["timing"]["median"] * 1e3 for _, p in pts], "o-",
             color=plots.PALETTE[j], label=f"{v}: decode attention")
ax1.axhline(ffn_point["timing"]["median"] * 1e3, color="0.3", ls="--",
            label=f"decode FFN (batch {BATCH})")
ax1.set_title(f"Measured: '{PRESET}', batch {BATCH}, on {MACHINE}", fontsize=11)
ax1.set_ylabel("Time per decode step, all layers (ms)")
for j, (name, c) in enumerate(real.items()):
    ffn_t = engine_time(c, "decode_ffn", 0)
    ax2.plot(sweeps.LONG_CONTEXTS,
             [engine_time(c, "decode_attention", s) / ffn_t for s in sweeps.LONG_CONTEXTS],
             "o-", ms=4, color=plots.PALETTE[j % 10], label=name)
ax2.axhline(1.0, color="black", lw=1)
ax2.set_title(f"Modelled on one H100's roofs (bf16), batch {B16}: attention / FFN time",
              fontsize=11)
ax2.set_ylabel("Decode attention time / decode FFN time")
for ax in (ax1, ax2):
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("Context (cached tokens per sequence)")
    ax.legend(fontsize=8)
fig.suptitle("When does attention overtake the FFN in decode?")
display(fig)

# %% [markdown]
# On the tiny quick-mode model (GQA only, to keep CI fast) every decode step is dominated by
# a fixed per-call cost, so the measured curve is nearly flat; the modelled panel is where the
# crossover shows. `LAB_FULL=1` measures every variant on the `small` preset: MHA, GQA, MQA,
# MLA naive and absorbed, sliding, sparse and linear attention. Below, for comparison with
# the quick run above: the committed full-size figure (`figures/<machine>/crossover.png`,
# drawn by `python -m microbench figures` from `figures/data/<machine>/phases.json`: measured
# decode attention vs context on the `bench` preset, and the modelled ratios).

# %%
committed = FIGURES / "crossover.png"
if committed.exists():
    display(Image(filename=str(committed)))
print(f"committed full-size figure: {committed} ({'shown' if committed.exists() else 'missing'})")
