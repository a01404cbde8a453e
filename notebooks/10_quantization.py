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
# # 10 · Quantization: fewer bytes per weight, and when that is speed
#
# Notebook 02 showed that a decode step is memory-bound: at small batch it reads every weight
# (and the KV cache) to produce one token per sequence, so its time is about
# $\text{bytes} / \beta$ ($\beta$: the memory bandwidth). Every byte count in this lab has a
# factor $s$, the bytes per stored element: $s = 4$ in float32, $2$ in bfloat16. Storing the
# weights in int8, float8 or int4 (with a few float32 **scales** to map the small numbers
# back) shrinks $s$, and with it the bytes, the time, and the memory the model occupies.
#
# Six steps, with `refmodel.quant` and the cost model `refmodel.costs`:
#
# 1. bytes per token: real models counted in each format, and the decode point on a roofline;
# 2. the formats: what `quantize_matrix` stores, its error bound, its bytes;
# 3. the step follows the bytes, with a kernel that streams them: this machine's decode step
#    on the native kernel and on XLA, against the bytes each format saves;
# 4. the KV cache in int8: more sequences in the same memory;
# 5. quality: bits per byte and KL divergence of a trained model in each format, activations
#    rounded to int8 as llama.cpp's Q8_0 and Q4_0 round them included;
# 6. when quantization pays.

# %%
# %matplotlib inline
import dataclasses
import json
import os
import time

import jax
import jax.numpy as jnp
import numpy as np
from IPython.display import display
from matplotlib.figure import Figure

from microbench import hardware, harness, machines, roofline
from microbench.plots import quant as quant_plots
from microbench.studies import quant as quant_study
from refmodel import costs, presets, quant
from refmodel.counting import BYTES, Dtypes

# %%
QUICK = os.environ.get("LAB_FULL", "0") != "1"  # parameter: LAB_FULL=1 for publication size
RECIPE = "micro" if QUICK else "target"  # step 5's trained model (target: ~20 min to train)
ROUNDS, REPEATS = (5, 3) if QUICK else (9, 7)  # step 3's interleaved rounds, calls per round
SPEC_GPU, CONTEXT = "H100 SXM", 1024  # the spec device (steps 1, 4), step 1's context
FORMATS = ("float32", "bfloat16", "int8", "float8", "int4")
DATA = machines.data_folder("quant")  # figures/data/<machine>/: one machine's runs
ENV = harness.environment()
print(machines.describe(ENV), f"| quality model {RECIPE!r}", "| quick" if QUICK else "| full")


def in_format(cfg, fmt):
    """cfg with its weight matrices stored in fmt (a float dtype, or a quantized format
    beside the config's float dtype for vectors and the embedding)."""
    return cfg.replace(weight_format=fmt) if fmt in quant.WEIGHT_FORMATS else \
        cfg.replace(dtype=fmt, weight_format="none")


def embedding_bytes(cfg):
    """The input embedding table's bytes (0 when tied: it is then the LM head's matrix)."""
    return 0 if cfg.tie_embeddings else cfg.vocab_size * cfg.d_model * \
        costs.dtypes(cfg).param_size


def stored_bytes(cfg):
    """Bytes of every parameter of cfg's model as stored: a decode step's weight bytes (every
    matrix once, with its scales, and every vector) at a batch so large that it touches every
    expert of a MoE, less the embedding rows it gathers, plus the whole embedding table."""
    c = costs.phase_costs(cfg, "decode", 2**40, 0)
    return c["weight_bytes"] - c["ops"]["embed"]["weight_bytes"] + embedding_bytes(cfg)

# %% [markdown]
# ## Step 1 · Bytes per token
#
# A batch-1 decode step of a dense model with $\Theta$ parameters does about $2\Theta$ FLOPs
# and reads about $s\Theta$ bytes of weights, so its arithmetic intensity is about $2/s$
# FLOP/byte and its time about $s\Theta / \beta$. Halving $s$ halves the time, as long as the
# step stays on the memory roof, which at $2/s \ll$ the ridge (hundreds of FLOP/byte on a GPU)
# it does by a wide margin.
#
# Quantized formats are not exactly $s$ bytes per weight: `refmodel.counting.Dtypes` counts
# the scales too (int8, float8: one float32 per output channel; int4: one per group of 32
# inputs, so more than 4 bits per weight; the bits each format costs are printed below,
# counted, not assumed). Counted below: Llama 3 8B
# in every format, and DeepSeek-V3 (MoE: only the routed experts' weights are read) as it
# ships, float8 (`presets.shipped`), batch 1 at context 1024, KV cache and activations in
# bfloat16, and the time on an H100's spec bandwidth.

# %%
gpu = hardware.get(SPEC_GPU)
gpu_compute, gpu_memory = roofline.spec_roofs(gpu, "bfloat16")
rows1 = []
for name in ("llama3-8b", "deepseek-v3"):
    ship = presets.shipped(name).weight_format
    for fmt in FORMATS:
        cfg = in_format(presets.get(name), fmt)
        c = costs.phase_costs(cfg, "decode", 1, CONTEXT, kv_dtype="bfloat16",
                              act_dtype="bfloat16")
        t = roofline.predict(c["flops"], c["bytes"], gpu_compute, gpu_memory)
        rows1.append({"model": name, "fmt": fmt, "shipped": fmt == ship,
                      "stored": stored_bytes(cfg), "weight_bytes": c["weight_bytes"],
                      "bytes": c["bytes"], "flops": c["flops"], "intensity": c["intensity"],
                      "bound": t["bound"], "time_s": t["time_s"]})
print(f"decode, batch 1, context {CONTEXT}, on {SPEC_GPU} spec "
      f"({gpu_memory['value'] / 1e12:.2f} TB/s)")
print(f"{'model':>12} {'weights':>9} {'stored GB':>9} {'read GB':>8} {'FLOP/B':>7} "
      f"{'ms/token':>8} {'tok/s':>6}")
for r in rows1:
    print(f"{r['model']:>12} {r['fmt'] + ('*' if r['shipped'] else ''):>9} "
          f"{r['stored'] / 1e9:9.1f} {r['bytes'] / 1e9:8.2f} {r['intensity']:7.2f} "
          f"{1e3 * r['time_s']:8.2f} {1 / r['time_s']:6.0f}")
print("* the format the release ships")

# %%
# CHECK: the counted bytes per parameter (the embedding table, kept in bfloat16, left out)
# are the format's, scales included: a large matrix's bytes per weight (`matrix_bytes` over
# its weights) within 0.5% (the few vectors and odd-sized matrices); every batch-1 step is
# memory-bound with intensity about 2/s, so its time is its bytes over the bandwidth: int4's
# under 0.36 of bfloat16's.
PER_WEIGHT = {fmt: Dtypes(weight=fmt).matrix_bytes(4096, 4096) / 4096**2 for fmt in FORMATS}
print("bits per weight, scales included:",
      ", ".join(f"{fmt} {8 * b:.3g}" for fmt, b in PER_WEIGHT.items()))
for name in ("llama3-8b", "deepseek-v3"):
    by = {r["fmt"]: r for r in rows1 if r["model"] == name}
    cfg = presets.get(name)
    n_params = costs.param_counts(cfg)["total"] - cfg.vocab_size * cfg.d_model
    for fmt, per_param in PER_WEIGHT.items():
        got = (by[fmt]["stored"] - embedding_bytes(in_format(cfg, fmt))) / n_params
        assert per_param * 0.995 <= got <= per_param * 1.005, (name, fmt, got)
    for fmt, r in by.items():
        assert r["bound"] == "memory", (name, fmt)
        assert 0.8 * 2 / BYTES[fmt] <= r["intensity"] <= 1.25 * 2 / BYTES[fmt], (name, fmt)
    assert by["int4"]["time_s"] < 0.36 * by["bfloat16"]["time_s"], name
print("bytes per parameter as counted; every batch-1 decode memory-bound: time ~ bytes")

# %% [markdown]
# On the roofline the point moves right, from $2/s$ = 0.5 FLOP/byte in float32 to a little
# under 4 in int4 (the scales keep it from 4; int8 and float8 coincide), and up the sloped
# memory roof by the same factor: **fewer bytes per weight move the roofline point**, and a
# memory-bound step's time falls with its bytes. It is still about 90 times left of the
# ridge: the GPU's compute stays idle either way, and the whole gain is bytes. DeepSeek-V3
# (squares: hollow, the formats it does not ship) stores 671B parameters, but a token reads
# only its active ones (~37B: attention, the shared expert and the 8 routed experts it
# picks), so at batch 1 it decodes at the bytes of a 37B dense model while occupying 673 GB
# in float8: quantization buys it both the speed and the fit.

# %%
fig = Figure(figsize=(7.5, 4.2))
ax = fig.subplots()
peak, bw = gpu_compute["value"], gpu_memory["value"]
xs = np.logspace(-1, 3.5, 200)
ax.loglog(xs, np.minimum(peak, bw * xs), color="k", lw=1, label=f"{SPEC_GPU} bf16 roof")
ax.axvline(peak / bw, color="gray", ls=":", lw=1)
for name, marker in (("llama3-8b", "o"), ("deepseek-v3", "s")):
    for fmt, color in zip(FORMATS, ("C0", "C1", "C2", "C3", "C4"), strict=True):
        r = next(r for r in rows1 if r["model"] == name and r["fmt"] == fmt)
        filled = r["shipped"] or name == "llama3-8b"
        label = f"{name} {fmt}" if filled else \
            (f"{name}, other formats" if fmt == "float32" else None)
        ax.loglog(r["intensity"], r["flops"] / r["time_s"], marker, color=color,
                  mfc=color if filled else "none", label=label)
ax.set_xlabel("FLOP / byte")
ax.set_ylabel("attainable FLOP/s")
ll = {r["fmt"]: r for r in rows1 if r["model"] == "llama3-8b"}
ax.set_title(f"Batch-1 decode: int4 reads {ll['bfloat16']['bytes'] / ll['int4']['bytes']:.1f}x "
             f"fewer bytes than bf16; ridge at {peak / bw:.0f} FLOP/B", fontsize=9)
ax.legend(fontsize=7, ncol=2)
display(fig)

# %% [markdown]
# ## Step 2 · The formats
#
# `quant.quantize_matrix(w, fmt)` takes a float weight $w$ [n_in, n_out] (its inputs and
# outputs) and returns a `Quantized`: the values $q$ stored **output-major**, [n_out, n_in]
# (each output channel's inputs contiguous, the order a batch-1 product reads them), and
# scales (float32, one per channel; int4's one per group of 32 inputs, as wide as
# `refmodel.counting` counts it), all symmetric and rounded to nearest:
#
# | format | values | scale $s$ | bound on $\lvert w - \hat w \rvert$ |
# |---|---|---|---|
# | int8 | integers in $[-127, 127]$ | $m/127$, $m$ per output channel | $s/2$ |
# | int4 | integers in $[-8, 7]$, two per byte | $m/7$, $m$ per 32 inputs of a channel | $s/2$ |
# | float8 | e4m3 (3 mantissa bits, max 448) | $m/448$, per channel | $2^{-4}\lvert w\rvert$ |
#
# ($m$: the largest $\lvert w \rvert$ of the channel or group; $\hat w = s\,q$ is what the
# product uses.)
#
# The integer formats have a uniform absolute error set by the largest weight of the channel
# (or group): one outlier coarsens everyone's step, which is why int4 needs small groups.
# float8 has a relative error instead: small weights keep their precision (down to the
# smallest normal number, $2^{-6}s$; below it the absolute error is at most $2^{-10}s$).
# A matrix with 300 inputs (not a multiple of 32: int4 pads each channel to whole groups) and
# a few outliers:

# %%
KQ, NQ = 300, 200
rng = np.random.default_rng(0)
w_np = rng.standard_normal((KQ, NQ)).astype(np.float32) * KQ**-0.5
w_np[rng.integers(0, KQ, 20), rng.integers(0, NQ, 20)] *= 8.0  # a few outliers
w = jnp.asarray(w_np)
qmatrix = jax.jit(quant.quantize_matrix, static_argnums=1)  # one compile, not many eager ops
qs = {fmt: qmatrix(w, fmt) for fmt in quant.WEIGHT_FORMATS}
for fmt, qw in qs.items():
    print(f"{fmt:>6}: q {qw.q.dtype} {tuple(qw.q.shape)}, scale {qw.scale.dtype} "
          f"{tuple(qw.scale.shape)}; {qw.nbytes:,} bytes, counted "
          f"{Dtypes(weight=fmt).matrix_bytes(KQ, NQ):,.0f}; float32 {w.nbytes:,}")
print("int8 channel 0, first 8 values:", np.asarray(qs["int8"].q[0, :8]).tolist(),
      f"x scale {float(qs['int8'].scale[0]):.5f}")
print("int4 channel 0, first 4 bytes:", [f"{b & 0xFF:08b}" for b in
                                          np.asarray(qs["int4"].q[0, :4]).tolist()],
      "(low nibble value j, high nibble value j + K'/2)")

# %%
errors = {}
for fmt, qw in qs.items():
    err = np.abs(np.asarray(qw.dequantize()) - w_np)  # [n_in, n_out]
    if fmt == "int4":  # the scale of each (input, output) element's group
        s = np.repeat(np.asarray(qw.scale), 32, axis=-1)[:, :KQ].T
        bound = s / 2
    elif fmt == "int8":
        bound = np.broadcast_to(np.asarray(qw.scale)[None, :] / 2, err.shape)
    else:
        s = np.asarray(qw.scale)[None, :]
        bound = np.maximum(2.0**-4 * np.abs(w_np), 2.0**-10 * s)
    errors[fmt] = err
    print(f"{fmt:>6}: max |error| / bound = {(err / bound).max():.3f}, "
          f"RMS error / RMS weight = {np.sqrt((err**2).mean() / (w_np**2).mean()):.4f}")
    # CHECK: every element within the format's bound (a little slack for float32 rounding)
    assert (err <= bound * (1 + 1e-5) + 1e-12).all(), fmt
    # CHECK: the arrays hold exactly the bytes the cost model counts
    assert qw.nbytes == Dtypes(weight=fmt).matrix_bytes(KQ, NQ), fmt

# %%
fig = Figure(figsize=(11, 3.2))
for ax, fmt in zip(fig.subplots(1, 3, sharey=True), quant.WEIGHT_FORMATS, strict=True):
    ax.loglog(np.abs(w_np).ravel(), errors[fmt].ravel(), ".", ms=1, alpha=0.3)
    ax.set_ylim(1e-7, 1)  # exact values (error 0) are left out
    ax.set_title(f"{fmt}: {8 * qs[fmt].nbytes / w_np.size:.2f} bits/weight", fontsize=9)
    ax.set_xlabel("|w|")
fig.axes[0].set_ylabel("|w - dequantized|")
fig.suptitle("Integer formats: an absolute error set by the channel's (group's) largest "
             "weight; float8: relative to |w|", fontsize=9)
fig.tight_layout()
display(fig)

# %% [markdown]
# The same counting holds for a whole model: `quant.quantize(model, weights=fmt)` replaces
# every matrix by its `Quantized` form (norms, biases and the embedding stay float), and the
# bytes its parameters occupy are exactly what `refmodel.costs` counts for its config (checked
# in step 5, on the trained model).

# %% [markdown]
# ## Step 3 · The step follows the bytes, with a kernel that streams them
#
# Step 1 moved the decode point along the memory roof: with $s$ bytes per weight instead of 4,
# a memory-bound step reads about $4/s$ times fewer bytes and, still at the memory's speed,
# takes that many times less time. Two numbers per format say whether that happens here:
#
# - the **bytes ratio**: float32's counted bytes of the step over the format's
#   (`refmodel.costs`: scales, the cache and the float parts of the step included), the
#   speedup the roofline promises;
# - the **speedup**: float32's measured step time over the format's, the median of the
#   ratios of interleaved rounds (every case once per round, so drift hits all alike).
#
# A step **follows its bytes** when the two agree: its point lies on the line y = x. That
# happens only if the weight product **streams** the small bytes: reads the int8 (or packed
# int4) values, widens them in registers and multiplies, at the memory's speed. The same
# quantized model runs on two paths:
#
# - the **native kernel** (`backends.use(model, "native")`, `refmodel/kernels`): each matrix
#   stored in the kernel's panels, the int8 values converted as they are loaded; with
#   `activations=True` the activation row is rounded to int8 per block of 32 and the product
#   is an integer dot product (w8a8: int8 weights; w4a8: int4), as llama.cpp runs Q8_0 and
#   Q4_0 (step 5);
# - **XLA's path** (`backend="xla"`): `quant.matmul`, the product written in JAX and compiled
#   by XLA:CPU, which has no kernel for these formats.
#
# Each is compared with float32 **on the same path**. The model is `medium` cut to the fewest
# layers whose int8 weights are at least twice this machine's last-level cache
# (`quant_study.quick_setup`; `LAB_FULL=1`: all 20 layers): a step whose weights fit in the
# cache would measure the cache, not the memory-bound step this lesson is about. Where the
# native kernels cannot run (no C++ compiler, not a CPU) or lack a format, the study says so
# and skips it: nothing is timed on XLA under the kernel's name.

# %%
LLC = quant_study.llc_bytes()
SETUP = dataclasses.replace(quant_study.quick_setup(LLC) if QUICK else quant_study.Setup(),
                            rounds=ROUNDS, repeats=REPEATS, batches=(1,), prefill_len=0,
                            kv_formats=(), xla=("float32", "int8") if QUICK else
                            ("float32", "int8", "int4"))  # XLA's int4: saved run, or LAB_FULL
cfg3 = quant_study.step_config(SETUP)
W_BYTES = {f: quant_study.weight_bytes(cfg3, f, SETUP.context) for f in ("none", "int8")}
print(f"{SETUP.model}, {cfg3.n_layers} layers, batch 1, {SETUP.context} cached tokens: decode "
      f"weights {W_BYTES['none'] / 1e6:.0f} MB in float32, {W_BYTES['int8'] / 1e6:.0f} MB in "
      f"int8; last-level cache {LLC / 2**20:.0f} MiB")
t0 = time.perf_counter()
steps = quant_study.measure_steps(SETUP, None, lambda what: None)
result3 = {"kind": "quant", "setup": dataclasses.asdict(SETUP), "steps": steps,
           "environment": ENV}
print(f"timed in {time.perf_counter() - t0:.0f} s, {SETUP.rounds} interleaved rounds")
print(f"{'path':>6} {'precision':>10} {'ms':>7} {'speedup':>8} {'rounds':>12} "
      f"{'bytes ratio':>11} {'speedup/ratio':>13}")
for r in steps["results"]:
    lo, hi = min(r["speedup_rounds"]), max(r["speedup_rounds"])
    print(f"{r['path']:>6} {r['precision']:>10} {1e3 * r['seconds']:7.2f} {r['speedup']:7.2f}x "
          f"{lo:6.2f}-{hi:4.2f}x {r['bytes_ratio']:10.2f}x {r['speedup'] / r['bytes_ratio']:13.2f}")
for skip in steps["skipped"]:
    print(f"{skip['path']} {skip['precision'] or '(every precision)'}: {skip['reason']}")


# %%
def check_native_follows_bytes(float32_s, int8_s, bytes_ratio, share=0.5):
    """CHECK (fails on a wrong measurement): the native int8 decode step's speedup over native
    float32 (the median of the per-round ratios of `float32_s` to `int8_s`, seconds per round)
    is at least `share` of its bytes ratio: the step follows the bytes (where the weights
    exceed the last-level cache: the caller says)."""
    median = float(np.median([f / q for f, q in zip(float32_s, int8_s, strict=True)]))
    assert median >= share * bytes_ratio, (
        f"native int8 step {median:.2f}x float32's speed for {bytes_ratio:.2f}x fewer bytes: "
        f"under {share:.0%} of the ratio")


def check_kernel_beats_xla(native_speedups, xla_speedups, factor=1.5):
    """CHECK (fails on a wrong measurement): the same int8 weights, the same bytes: the native
    kernel's speedup over its float32 (per round) is at least `factor` times XLA's over its
    float32, in the median: the kernel, not the format, makes the bytes speed."""
    native, xla = float(np.median(native_speedups)), float(np.median(xla_speedups))
    assert native >= factor * xla, (f"native int8 {native:.2f}x against XLA's {xla:.2f}x: not "
                                    f"{factor}x XLA's")


by3 = {(r["path"], r["precision"]): r for r in steps["results"]}
native8 = by3.get(("native", "int8"))
if native8 is None:
    why = next((s["reason"] for s in steps["skipped"] if s["path"] == "native"), "not measured")
    print(f"native int8 checks skipped: {why}")
elif W_BYTES["int8"] <= LLC:
    print(f"native int8 checks skipped: the int8 weights ({W_BYTES['int8'] / 2**20:.0f} MiB) "
          f"fit in the last-level cache ({LLC / 2**20:.0f} MiB)")
else:
    check_native_follows_bytes(by3["native", "float32"]["rounds"], native8["rounds"],
                               native8["bytes_ratio"])
    check_kernel_beats_xla(native8["speedup_rounds"], by3["xla", "int8"]["speedup_rounds"])
    print(f"native int8: {native8['speedup']:.2f}x float32 for {native8['bytes_ratio']:.2f}x "
          f"fewer bytes ({native8['speedup'] / native8['bytes_ratio']:.0%} of the ratio); "
          f"XLA's int8: {by3['xla', 'int8']['speedup']:.2f}x")

# %% [markdown]
# Why at least half the bytes ratio, and not all of it: a decode step is more than its weight
# products (attention over the cache, norms, the embedding row, the float parts the bytes
# count too), and a shared machine's rounds spread (the `rounds` column: this run's lowest and
# highest ratio). Half still separates a kernel that streams the int8 values from one that
# does not: XLA's int8 step reads the same bytes and lands near 1x or below it.

# %%
display(quant_plots.follow_figure(result3))

# %% [markdown]
# ### XLA's path: what a compiler does without the kernel
#
# The hollow points are the same formats compiled by XLA from the JAX in `quant.matmul`.
# Written the obvious way, `x @ (q.astype(float32) * s)` (dequantize, then dot), XLA:CPU first
# writes the whole float weight back to memory and then reads it again: more bytes than the
# float32 product, not fewer. `quant.matmul` writes the batch-1 product as a fused
# multiply-and-reduce over each output channel's contiguous int8 values, the fastest
# formulation XLA was found to run (`python -m microbench quant` times every one, at 1 and 8
# rows; the saved table below), and still reads them well below the memory's speed; int4
# (shift and sign-extend two nibbles) and float8 (convert e4m3 to float32) need per-element
# work before the multiply that XLA:CPU does not vectorize. A compiler emits fast code for the
# patterns it knows; a quantized GEMV with per-channel or per-group scales is not one of them
# here. Engines ship hand-written kernels for exactly this (llama.cpp's ggml on CPUs; Marlin
# and Machete for int4 and cuBLASLt's FP8 GEMMs on GPUs): the bytes of step 1 are what such a
# kernel reaches, not what the compiler gets on its own. The saved full-size run, if present:

# %%
saved_file = DATA / "quant.json"
saved = json.loads(saved_file.read_text()) if saved_file.exists() else None
if saved is None:
    print(f"{saved_file} does not exist yet: run `python -m microbench quant` to make it")
else:
    print(f"saved ({saved_file}), model {saved['steps']['model']}:")
    for b in quant_plots.decode_batches(saved):
        print(" ", quant_plots.follow_claim(saved, b))
    f_ = saved["formulations"]
    print(f"\nXLA's formulations, [{f_['k']}, {f_['n']}] weight ('*': the one refmodel uses)")
    print(f"{'rows':>4} {'':>32} {'MB':>6} {'ms':>8} {'GB/s':>6} {'vs float32':>10}")
    for r in f_["results"]:
        print(f"{r['rows']:>4} {r['name'] + ('*' if r['used'] else ''):>32} "
              f"{r['stored_bytes'] / 1e6:6.2f} {1e3 * r['seconds']:8.2f} "
              f"{r['bytes_per_s'] / 1e9:6.1f} {r['speedup']:9.2f}x")


def check_dots_slower(speedups, at_most):
    """CHECK (fails on a wrong measurement): every int8 product written as a dot ({name:
    float32 time / its time} at one row) is several times slower than the float32 GEMV: its
    speedup at most `at_most`."""
    for name, v in speedups.items():
        assert v <= at_most, f"{name}: {v:.2f}x float32's speed, not {1 / at_most:.0f}x slower"


if saved is not None:
    one = [r for r in saved["formulations"]["results"] if r["rows"] == 1]
    f32 = next(r for r in one if r["name"] == "float32 dot")
    dots = {r["name"]: r for r in one if r["format"] == "int8" and "dot" in r["name"]}
    ms = [1e3 * r["seconds"] for r in dots.values()]
    print(f"\nint8 written as a dot, 1 row: {min(ms):.1f}-{max(ms):.1f} ms against the float32 "
          f"GEMV's {1e3 * f32['seconds']:.2f} ms, "
          f"{min(f32['seconds'] / r['seconds'] for r in dots.values()):.2f}-"
          f"{max(f32['seconds'] / r['seconds'] for r in dots.values()):.2f}x its speed")
    check_dots_slower({n: r["speedup"] for n, r in dots.items()}, 0.5)

# %% [markdown]
# ## Step 4 · The KV cache: capacity
#
# The cache is the other thing a decode step reads, and at long context and large batch it is
# most of the memory. An int8 (or float8) cache stores 1 byte per element plus one float32
# scale per cached vector (a head's key or value, 128 elements in Llama 3 8B): $1 + 4/128$
# bytes against bfloat16's 2, 0.52 times the bytes. The sequences that fit in a device's
# memory are
#
# $$ B_\text{max} = \left\lfloor \frac{M - \text{weights}}{\text{KV bytes per sequence}}
#    \right\rfloor $$
#
# counted for Llama 3 8B at context 8192 on an 80 GB device (activations and the engine's
# workspace left out), with the decode step at that batch timed on the spec roofs: a bigger
# batch reads the weights once for more tokens, so throughput grows with it.

# %%
MEM, CTX_KV = gpu.memory_bytes, 8192
llama = presets.get("llama3-8b")
print(f"llama3-8b KV bytes per token: bfloat16 {costs.kv_bytes_per_token(llama):,.0f}, "
      f"int8 {costs.kv_bytes_per_token(llama, 'int8'):,.0f}")
rows4 = []
for wf, kv in (("bfloat16", "bfloat16"), ("bfloat16", "int8"), ("int8", "int8"),
               ("int4", "int8")):
    cfg = in_format(llama, wf)
    weights = stored_bytes(cfg)
    per_seq = costs.kv_cache_bytes(cfg, CTX_KV, 1, kv)
    b = int((MEM - weights) // per_seq)
    c = costs.phase_costs(cfg, "decode", b, CTX_KV, kv_dtype=kv, act_dtype="bfloat16")
    t = roofline.predict(c["flops"], c["bytes"], gpu_compute, gpu_memory)
    rows4.append({"weights": wf, "kv": kv, "weight_gb": weights / 1e9,
                  "kv_seq_gb": per_seq / 1e9, "batch": b, "step_ms": 1e3 * t["time_s"],
                  "tok_s": b / t["time_s"], "kv_share": c["kv_bytes"] / c["bytes"]})
print(f"\n{MEM / 1e9:.0f} GB, context {CTX_KV}, on {SPEC_GPU} spec roofs")
print(f"{'weights':>8} {'KV':>8} {'weights GB':>10} {'KV GB/seq':>9} {'max batch':>9} "
      f"{'step ms':>7} {'KV share':>8} {'tok/s':>7}")
for r in rows4:
    print(f"{r['weights']:>8} {r['kv']:>8} {r['weight_gb']:10.1f} {r['kv_seq_gb']:9.3f} "
          f"{r['batch']:9d} {r['step_ms']:7.1f} {r['kv_share']:8.0%} {r['tok_s']:7.0f}")

# %%
# CHECK: int8 KV is (1 + 4/head_dim) / 2 of bfloat16's bytes per token; it at least nearly
# doubles the batch that fits, and quantized weights free more room on top; at these batches
# the cache, not the weights, is most of what a step reads.
ratio = costs.kv_bytes_per_token(llama, "int8") / costs.kv_bytes_per_token(llama)
np.testing.assert_allclose(ratio, (1 + 4 / llama.head_dim) / 2, rtol=1e-12)
assert rows4[1]["batch"] >= 1.9 * rows4[0]["batch"], rows4
assert rows4[0]["batch"] < rows4[1]["batch"] < rows4[2]["batch"] < rows4[3]["batch"]
assert all(r["kv_share"] > 0.5 for r in rows4)
assert rows4[2]["tok_s"] > 1.9 * rows4[0]["tok_s"]
print(f"int8 KV: {ratio:.3f} x the bytes per token; batch {rows4[0]['batch']} -> "
      f"{rows4[1]['batch']} -> {rows4[2]['batch']} with int8 weights too")

# %% [markdown]
# ## Step 5 · Quality, and what llama.cpp's Q8_0 and Q4_0 do
#
# Fewer bits cost accuracy. `quant.quantize(model, weights=..., kv=..., activations=...)`
# quantizes a trained model after training (no calibration, no retraining). Two measures of
# what that costs, on the recipe's validation text:
#
# - **bits per byte** (`bits_per_byte(model, recipe)`): the validation loss per byte of text
#   (lower is better), through the cache when the cache is quantized (every key and value
#   written and read back rounded, as decode would);
# - the **KL divergence** of the next-token distribution $q$ from the float model's $p$, the
#   mean over positions of $\sum_v p(v) \log (p(v) / q(v))$ in nats
#   (`quant_study.kl_nats`; llama.cpp's `perplexity --kl-divergence` reports the same). It
#   sees every change to the distribution, not only to the right token's probability, and is
#   0 exactly when nothing changed.
#
# llama.cpp stores Q8_0 as blocks of 32 int8 weights with one float16 scale (34 bytes: 8.5
# bits per weight) and Q4_0 as 32 4-bit weights with one (18 bytes: 4.5 bits). Its CPU dot
# products do not widen the weights to float: they round the **activation row** to Q8_0 too,
# per block of 32 (scale max|x| / 127 over the block), take an integer dot product block by
# block and scale each block's int32 sum by both scales. `activations=True` rounds our
# activations the same way (`quant.round_activations`): int8 w8a8 (our int8 keeps one scale per
# output channel) and int4 w4a8 (a scale per 32 inputs, as Q4_0), the native kernel's integer
# paths of step 3. In quick mode the model is `micro` (40 training steps: seconds); `LAB_FULL=1`
# uses `target` (~9.6M parameters; about 20 minutes to train if its checkpoint is not cached).
# The micro model has barely learned anything, so its weights carry little that rounding can
# destroy: expect small differences there, larger ones on `target`.

# %%
t0 = time.perf_counter()
SETUP5 = dataclasses.replace(SETUP, quality_model=RECIPE)
quality = quant_study.measure_quality(SETUP5, lambda what: None)
rows5 = [r for r in quality["results"] if "skipped" not in r]
cfg5 = presets.get(quality["preset"])
for r in rows5:  # the bytes the cost model counts for the format's config
    r["counted"] = stored_bytes(cfg5.replace(weight_format=r["weight_format"],
                                             kv_format=r["kv_format"],
                                             quant_activations=r["activations"] == "int8"))
base = next(r["bits_per_byte"] for r in rows5
            if r["precision"] == "float32" and r["kv_format"] == "none")
print(f"{RECIPE} ({quality['preset']}), KL over {quality['kl_tokens'][0]} x "
      f"{quality['kl_tokens'][1]} validation tokens: {time.perf_counter() - t0:.1f} s")
print(f"{'weights':>10} {'KV':>7} {'weights KB':>10} {'(counted)':>10} {'KV B/token':>10} "
      f"{'bits/byte':>9} {'delta':>8} {'KL nats':>8}")
for r in rows5:
    print(f"{r['precision']:>10} {r['kv_format']:>7} {r['weight_bytes'] / 1e3:10.1f} "
          f"{r['counted'] / 1e3:10.1f} {r['kv_bytes_per_token']:10.0f} "
          f"{r['bits_per_byte']:9.4f} {r['bits_per_byte'] - base:+8.4f} {r['kl_nats']:8.2g}")
for r in quality["results"]:
    if "skipped" in r:
        print(f"{r['precision']:>10} {r['kv_format']:>7} {r['skipped']}")


# %%
def check_quality(bits_per_byte, base):
    """CHECK (fails on a wrong measurement): int8 weights (with or without int8 activations),
    float8 weights and an int8 or float8 cache cost under 0.05 bits per byte against float32's
    `base` ({(weights, KV): bits per byte}); int4 (4 bits, a scale per 32) is no better than
    int8 beyond noise (0.005)."""
    for case in (("int8", "none"), ("int8 w8a8", "none"), ("float8", "none"),
                 ("float32", "int8"), ("float32", "float8")):
        if case in bits_per_byte:
            assert abs(bits_per_byte[case] - base) < 0.05, (
                f"{case}: {bits_per_byte[case]:.4f} bits/byte against float32's {base:.4f}")
    assert bits_per_byte["int4", "none"] >= bits_per_byte["int8", "none"] - 0.005, (
        f"int4 {bits_per_byte['int4', 'none']:.4f} beats int8 "
        f"{bits_per_byte['int8', 'none']:.4f} bits/byte")


def check_kl(kl, bound=0.002):
    """CHECK (fails on a wrong measurement): every 8-bit format ({name: KL from float32 in
    nats}: int8, int8 w8a8, float8 weights, an int8 or float8 cache) moves the next-token
    distribution by under `bound` nats; int4's weights move it more than int8's, and rounding
    the activations to int8 (w8a8) less than int4's weights do."""
    for name in ("int8", "int8 w8a8", "float8", "int8 KV", "float8 KV"):
        if name in kl:
            assert kl[name] < bound, f"{name}: KL {kl[name]:.3g} nats, over {bound}"
    assert kl["int4"] > kl["int8"], f"int4 KL {kl['int4']:.3g} <= int8's {kl['int8']:.3g}"
    if "int8 w8a8" in kl:
        assert kl["int8 w8a8"] < kl["int4"], (f"int8 w8a8 KL {kl['int8 w8a8']:.3g} >= int4's "
                                              f"{kl['int4']:.3g}")


# The quantized model's parameters occupy exactly the counted bytes (the arrays against the
# cost model); then the measured quality.
assert all(r["weight_bytes"] == r["counted"] for r in rows5), \
    [(r["precision"], r["weight_bytes"], r["counted"]) for r in rows5]
bpb = {(r["precision"], r["kv_format"]): r["bits_per_byte"] for r in rows5}
kl5 = {r["precision"] if r["kv_format"] == "none" else f"{r['kv_format']} KV": r["kl_nats"]
       for r in rows5 if (r["precision"], r["kv_format"]) != ("float32", "none")}
check_quality(bpb, base)
check_kl(kl5)
print("8-bit formats within 0.05 bits/byte and 0.002 nats of float32; int4 costs more")

# %%
fig = Figure(figsize=(10, 3.8))
ax1, ax2 = fig.subplots(1, 2, sharey=True)
weights5 = [r for r in rows5 if r["kv_format"] == "none" and r["precision"] != "float32"]
for i, r in enumerate(weights5):
    ax1.semilogy(r["weight_bytes"] / 1e3, r["kl_nats"], "os^Dv<"[i % 6],
                 color=quant_plots.COLORS.get(r["precision"], "C0"), ms=9 - i, ls="",
                 label=f"{r['precision']}: {r['kl_nats']:.2g} nats")
ax1.set_xlim(0, max(r["weight_bytes"] for r in weights5) / 1e3 * 1.15)
ax1.set_xlabel("weights stored (KB)")
ax1.set_ylabel("KL from float32's next token (nats)")
ax1.legend(fontsize=8, loc="lower left")
ax1.set_title(f"{RECIPE}: int4 moves the distribution {kl5['int4'] / kl5['int8']:.0f}x more "
              "than int8", fontsize=9)
for r in (r for r in rows5 if r["kv_format"] != "none"):
    ax2.semilogy(r["kv_bytes_per_token"], r["kl_nats"], "s", ms=8, ls="",
                 label=f"{r['kv_format']} KV: {r['kl_nats']:.2g} nats")
ax2.set_xlim(0, max(r["kv_bytes_per_token"] for r in rows5) * 1.15)  # float32's: the right end
ax2.set_xlabel("KV cache bytes per token")
ax2.legend(fontsize=8, loc="upper right")
ax2.set_title("the cache's formats, float32 weights", fontsize=9)
fig.tight_layout()
display(fig)

# %%
if saved is not None and "quality" in saved:
    qq = saved["quality"]
    print(f"saved ({saved_file}): {qq['recipe']} ({qq['preset']}), {qq['metric']}")
    print(quant_plots.quality_claim(saved) + ".")
    print(quant_plots.kl_claim(saved) + ".")

# %% [markdown]
# ## Step 6 · When quantization pays
#
# - **Memory-bound decode, with a kernel that streams the small bytes.** At small batch a
#   decode step's time is its bytes over the bandwidth, and int8 / float8 / int4 weights cut
#   the bytes 2 to 6 times against float32 (step 1): the roofline point moves. On a CPU the
#   step follows only where the product reads the quantized values directly, as the native
#   kernel does (step 3); compiled by XLA from the JAX reference, the same bytes ran no faster
#   than float32, and dequantizing to a float weight first is slower than not quantizing at
#   all. Formats that need unpacking (int4, float8 on a CPU) need a kernel that vectorizes it.
#   Compute-bound work (prefill, large batches) gains from smaller weights only when the
#   arithmetic itself is low precision: the int8 dot products of w8a8 and w4a8 (VNNI on a
#   CPU), FP8 tensor cores on a GPU.
# - **Capacity.** Smaller weights and an int8 / float8 KV cache leave room for more
#   sequences and longer contexts (step 4): at long context the cache is most of the memory and
#   most of the bytes read, so the KV format matters as much as the weights'.
# - **Quality.** 8 bits (int8 per channel, float8 e4m3, int8 activations per block of 32 as
#   llama.cpp rounds them) cost little, measured here in bits per byte and KL and widely
#   reported; 4 bits cost more and need small groups (and, in practice, outlier-aware methods
#   such as GPTQ or AWQ) to stay close. Measure the loss on your own model before you ship.
