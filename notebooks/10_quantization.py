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
# 3. the kernel eats the gain: a batch-1 product timed on this machine;
# 4. the KV cache in int8: more sequences in the same memory;
# 5. quality: bits per byte of a trained model in each format;
# 6. when quantization pays.

# %%
# %matplotlib inline
import json
import os
import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from IPython.display import display
from matplotlib.figure import Figure

from microbench import hardware, machines, roofline
from refmodel import costs, presets, quant
from refmodel.counting import BYTES, Dtypes
from refmodel.training import bits_per_byte, recipes, trained

# %%
QUICK = os.environ.get("LAB_FULL", "0") != "1"  # parameter: LAB_FULL=1 for publication size
RECIPE = "micro" if QUICK else "target"  # step 5's trained model (target: ~20 min to train)
K_BENCH = 2048  # step 3's square weight, K_BENCH inputs and outputs: 16 MB in float32
ROUNDS, REPEATS = (5, 5) if QUICK else (9, 9)  # interleaved timing rounds, calls per round
SPEC_GPU, CONTEXT = "H100 SXM", 1024  # the spec device (steps 1, 4), step 1's context
FORMATS = ("float32", "bfloat16", "int8", "float8", "int4")
DATA = machines.data_folder("quant")  # figures/data/<machine>/: one machine's runs
print(f"quality model {RECIPE!r}", "| quick" if QUICK else "| full")


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
# the float32 scales too (int8, float8: one per output channel; int4: one per group of 32
# inputs, 4 bytes per 16 bytes of values: 5 bits per weight, not 4). Counted below: Llama 3 8B
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
# are the format's, scales included: int8 and float8 a hair over 1 byte, int4 5 bits
# (0.5 + 4/32 bytes); every batch-1 step is memory-bound with intensity about 2/s, so its
# time is its bytes over the bandwidth: int4's under 0.36 of bfloat16's.
for name in ("llama3-8b", "deepseek-v3"):
    by = {r["fmt"]: r for r in rows1 if r["model"] == name}
    cfg = presets.get(name)
    n_params = costs.param_counts(cfg)["total"] - cfg.vocab_size * cfg.d_model
    for fmt, per_param in (("float32", 4), ("bfloat16", 2), ("int8", 1), ("float8", 1),
                           ("int4", 0.625)):
        got = (by[fmt]["stored"] - embedding_bytes(in_format(cfg, fmt))) / n_params
        assert per_param <= got <= per_param * 1.005, (name, fmt, got)
    for fmt, r in by.items():
        assert r["bound"] == "memory", (name, fmt)
        assert 0.8 * 2 / BYTES[fmt] <= r["intensity"] <= 1.25 * 2 / BYTES[fmt], (name, fmt)
    assert by["int4"]["time_s"] < 0.36 * by["bfloat16"]["time_s"], name
print("bytes per parameter as counted; every batch-1 decode memory-bound: time ~ bytes")

# %% [markdown]
# On the roofline the point moves right, from $2/s$ = 0.5 FLOP/byte in float32 to about 3.2 in
# int4 (the scales keep it from 4; int8 and float8 coincide), and up the sloped memory roof
# by the same factor. It is still about 90 times left of the ridge: the GPU's compute stays
# idle either way, and the whole gain is bytes. DeepSeek-V3 (squares: hollow, the formats it
# does not ship) stores 671B parameters, but a token reads only its active ones (~37B:
# attention, the shared expert and the 8 routed experts it picks), so at batch 1 it decodes
# at the bytes of a 37B dense model while occupying 673 GB in float8: quantization buys it
# both the speed and the fit.

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
# float32 scales, all symmetric and rounded to nearest:
#
# | format | values | scale $s$ (float32) | bound on $\lvert w - \hat w \rvert$ |
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
# ## Step 3 · The kernel eats the gain
#
# Fewer bytes are only less time if the product **streams** them: reads the small values,
# widens them in registers, and multiplies. Written in JAX the obvious way,
# `x @ (q.astype(float32) * s)` (dequantize, then dot), XLA:CPU first writes the whole float
# weight back to memory and then reads it again: more bytes than the float32 product, not
# fewer. XLA:CPU has no fast mixed-precision GEMV (a matrix-vector product), so
# `quant.matmul` writes the batch-1 product as a fused multiply-and-reduce over each output
# channel's contiguous int8 values (up to `FEW_ROWS` = 32 rows; more rows, as in a prefill,
# dequantize once and run the float GEMM, which is compute-bound anyway).
#
# Timed here: a batch-1 product with a [2048, 2048] weight in float32, in int8 via
# `quant.matmul` and via dequantize-then-dot, and in int4 and float8 via `quant.matmul`;
# interleaved rounds, each a ratio to the float32 product of the same round. Do not read much
# into one machine's milliseconds (a 16 MB float32 weight may partly sit in a large L3 cache);
# read the ratios.

# %%
x1 = jnp.asarray(np.random.default_rng(1).standard_normal((1, K_BENCH)), jnp.float32)
w_b = jnp.asarray(np.random.default_rng(2).standard_normal((K_BENCH, K_BENCH)),
                  jnp.float32) * K_BENCH**-0.5
qb = {fmt: qmatrix(w_b, fmt) for fmt in quant.WEIGHT_FORMATS}
q8_kn = jnp.asarray(np.asarray(qb["int8"].q).T.copy())  # int8 [n_in, n_out], the float's layout
CASES = {  # name: (fn, args, stored bytes)
    "float32 dot": (jax.jit(lambda x, w: x @ w), (x1, w_b), w_b.nbytes),
    "int8 quant.matmul": (jax.jit(quant.matmul), (x1, qb["int8"]), qb["int8"].nbytes),
    "int8 dequantize, dot": (jax.jit(lambda x, q, s: x @ (q.astype(jnp.float32) * s)),
                             (x1, q8_kn, qb["int8"].scale), qb["int8"].nbytes),
    "int4 quant.matmul": (jax.jit(quant.matmul), (x1, qb["int4"]), qb["int4"].nbytes),
    "float8 quant.matmul": (jax.jit(quant.matmul), (x1, qb["float8"]), qb["float8"].nbytes),
}
outs = {name: np.asarray(fn(*args)) for name, (fn, args, _) in CASES.items()}  # compile


def best_of(fn, args, n):
    ts = []
    for _ in range(n):
        t = time.perf_counter()
        jax.block_until_ready(fn(*args))
        ts.append(time.perf_counter() - t)
    return min(ts)


secs = {name: [] for name in CASES}
for _ in range(ROUNDS):  # every case once per round: drift hits all alike
    for name, (fn, args, _) in CASES.items():
        secs[name].append(best_of(fn, args, REPEATS))
print(f"x [1, {K_BENCH}] @ w [{K_BENCH}, {K_BENCH}], median of {ROUNDS} interleaved rounds")
print(f"{'':>22} {'MB':>6} {'ms':>7} {'GB/s':>6} {'vs float32':>10}")
vs_f32 = {}
for name, (_, _, nbytes) in CASES.items():
    t = statistics.median(secs[name])
    vs_f32[name] = statistics.median(a / b for a, b in zip(secs["float32 dot"], secs[name],
                                                              strict=True))
    print(f"{name:>22} {nbytes / 1e6:6.2f} {1e3 * t:7.2f} {nbytes / t / 1e9:6.1f} "
          f"{vs_f32[name]:9.2f}x")
for name in ("int4 quant.matmul", "float8 quant.matmul"):
    fewer = CASES["float32 dot"][2] / CASES[name][2]
    print(f"{name}: {fewer:.1f}x fewer bytes than float32, "
          f"{'faster' if vs_f32[name] > 1 else 'slower'} ({vs_f32[name]:.2f}x its speed)")

# %%
def check_streaming_beats_dequantize(streamed_s, dequantize_s):
    """CHECK (fails on a wrong measurement): the int8 product that streams the int8 values
    (quant.matmul) is faster than dequantize-then-dot, which writes and reads back a whole
    float32 weight (each: per-round times, compared as the median of the per-round ratios)."""
    ratio = sorted(d / s for s, d in zip(streamed_s, dequantize_s, strict=True))
    median = ratio[len(ratio) // 2]
    assert median > 1.0, (f"dequantize-then-dot ran {median:.2f}x the streamed product's "
                          "time: not slower")


check_streaming_beats_dequantize(secs["int8 quant.matmul"], secs["int8 dequantize, dot"])
# Correctness: each quantized product is the product with the dequantized weight, and close to
# the float one within its format's error.
ref = outs["float32 dot"]
TOLERANCE = {"int8": 0.02, "float8": 0.1, "int4": 0.2}  # max |error| / max |x @ w|
for name, fmt in (("int8 quant.matmul", "int8"), ("int8 dequantize, dot", "int8"),
                  ("int4 quant.matmul", "int4"), ("float8 quant.matmul", "float8")):
    exact = np.asarray(x1 @ qb[fmt].dequantize())
    np.testing.assert_allclose(outs[name], exact, rtol=1e-3, atol=1e-3 * np.abs(exact).max())
    rel = np.abs(outs[name] - ref).max() / np.abs(ref).max()
    assert rel < TOLERANCE[fmt], (name, rel)
print("every formulation computes x @ dequantize(w)")

# %% [markdown]
# At a large weight (`python -m microbench quant` times a [4096, 4096] one;
# figures/<machine>/quant.md) every int8 product written as a dot (dequantize then dot, a dot with
# `preferred_element_type`, an int8 x int8 -> int32 dot) is several times **slower** than the
# float32 GEMV it was meant to beat (the saved numbers, printed and checked below). Only the
# fused multiply-and-reduce reads the int8 values without first writing a float copy; whether
# it then beats float32 depends on the machine and the size (the ratio above is this
# machine's). int4 and float8 need per-element work before the multiply (shift and
# sign-extend two nibbles; convert e4m3 to float32) that XLA:CPU does not vectorize: they read
# 4 to 6 times fewer bytes than float32, and the lines under step 3's table say whether they
# still took longer here. GPU engines ship hand-written kernels for exactly this
# (Marlin and Machete for int4, the FP8 GEMMs of cuBLASLt): the bytes of step 1 are what
# such a kernel can reach, not what a naive one gets. The benchmark's saved numbers, if
# present (all formulations at 1 and 8 rows; whole decode and prefill steps per precision):

# %%
saved_file = DATA / "quant.json"
saved = json.loads(saved_file.read_text()) if saved_file.exists() else None
if saved is None:
    print(f"{saved_file} does not exist yet: run `python -m microbench quant` to make it")
else:
    f_ = saved["formulations"]
    print(f"formulations, [{f_['k']}, {f_['n']}] weight ('*': the one refmodel uses)")
    print(f"{'rows':>4} {'':>32} {'MB':>6} {'ms':>8} {'GB/s':>6} {'vs float32':>10}")
    for r in f_["results"]:
        print(f"{r['rows']:>4} {r['name'] + ('*' if r['used'] else ''):>32} "
              f"{r['stored_bytes'] / 1e6:6.2f} {1e3 * r['seconds']:8.2f} "
              f"{r['bytes_per_s'] / 1e9:6.1f} {r['speedup']:9.2f}x")
    st = saved["steps"]
    print(f"\nsteps of '{st['model']}' (counted bytes over measured time)")
    print(f"{'precision':>10} {'phase':>8} {'batch':>5} {'context':>7} {'KV':>6} {'ms':>8} "
          f"{'MB':>7} {'GB/s':>6} {'vs float32':>10}")
    for r in st["results"]:
        print(f"{r['precision']:>10} {r['phase']:>8} {r['batch']:>5} {r['context']:>7} "
              f"{r['kv_format']:>6} {1e3 * r['seconds']:8.2f} {r['bytes'] / 1e6:7.1f} "
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
# ## Step 5 · Quality
#
# Fewer bits cost accuracy. `quant.quantize(model, weights=..., kv=...)` quantizes a trained
# model after training (no calibration, no retraining); `bits_per_byte(model, recipe)` is its
# validation loss in bits per byte of text (lower is better), through the cache when the cache
# is quantized (every key and value written and read back rounded, as decode would).
# In quick mode the model is `micro` (40 training steps: seconds); `LAB_FULL=1` uses `target`
# (~9.6M parameters; about 20 minutes to train if its checkpoint is not cached). The micro
# model has barely learned anything, so its weights carry little that rounding can destroy:
# expect small differences there, larger ones on `target`.

# %%
t0 = time.perf_counter()
model = trained(RECIPE, progress=False)
CASES5 = [("none", "none"), ("int8", "none"), ("float8", "none"), ("int4", "none"),
          ("none", "int8"), ("none", "float8")]
rows5 = []
for wf, kv in CASES5:
    qm = quant.quantize(model, weights=None if wf == "none" else wf,
                        kv=None if kv == "none" else kv)
    rows5.append({"weights": wf, "kv": kv, "bpb": bits_per_byte(qm, RECIPE),
                  "stored": stored_bytes(qm.cfg),
                  "actual": sum(x.nbytes for x in jax.tree.leaves(nnx.state(qm, nnx.Param))),
                  "kv_token": costs.kv_bytes_per_token(qm.cfg, costs.dtypes(qm.cfg).kv)})
base = rows5[0]["bpb"]
print(f"{RECIPE} ({recipes.get(RECIPE).model}, "
      f"{costs.param_counts(model.cfg)['total']:,} parameters): "
      f"{time.perf_counter() - t0:.1f} s")
print(f"{'weights':>8} {'KV':>7} {'weights KB':>10} {'(counted)':>10} {'KV B/token':>10} "
      f"{'bits/byte':>9} {'delta':>8}")
for r in rows5:
    print(f"{r['weights']:>8} {r['kv']:>7} {r['actual'] / 1e3:10.1f} {r['stored'] / 1e3:10.1f} "
          f"{r['kv_token']:10.0f} {r['bpb']:9.4f} {r['bpb'] - base:+8.4f}")

# %%
def check_quality(bits_per_byte, base):
    """CHECK (fails on a wrong measurement): int8 weights, float8 weights and an int8 or
    float8 cache cost under 0.05 bits per byte against float32's `base` ({(weights, KV): bits
    per byte}); int4 (4 bits, a scale per 32) is no better than int8 beyond noise (0.005)."""
    for case in (("int8", "none"), ("float8", "none"), ("none", "int8"), ("none", "float8")):
        assert abs(bits_per_byte[case] - base) < 0.05, (
            f"{case}: {bits_per_byte[case]:.4f} bits/byte against float32's {base:.4f}")
    assert bits_per_byte["int4", "none"] >= bits_per_byte["int8", "none"] - 0.005, (
        f"int4 {bits_per_byte['int4', 'none']:.4f} beats int8 "
        f"{bits_per_byte['int8', 'none']:.4f} bits/byte")


# The quantized model's parameters occupy exactly the counted bytes (the arrays against the
# cost model); then the measured quality.
assert all(r["actual"] == r["stored"] for r in rows5), [(r["actual"], r["stored"]) for r in rows5]
bpb = {(r["weights"], r["kv"]): r["bpb"] for r in rows5}
check_quality(bpb, base)
print("int8 / float8 within 0.05 bits/byte of float32; int4 no better than int8")

# %%
fig = Figure(figsize=(10, 3.6))
ax1, ax2 = fig.subplots(1, 2)
for r in rows5[:4]:
    ax1.plot(r["stored"] / 1e3, r["bpb"] - base, "o")
    ax1.annotate(r["weights"] if r["weights"] != "none" else "float32",
                 (r["stored"] / 1e3, r["bpb"] - base), fontsize=8, xytext=(4, 3),
                 textcoords="offset points")
ax1.set_xlabel("weights stored (KB)")
ax1.set_ylabel(f"bits / byte above float32's {base:.3f}")
ax1.set_title(f"{RECIPE}: int4 costs {bpb['int4', 'none'] - base:+.3f} bits/byte for "
              f"{rows5[0]['stored'] / rows5[3]['stored']:.1f}x fewer bytes", fontsize=9)
for r in (rows5[0], rows5[4], rows5[5]):
    ax2.plot(r["kv_token"], r["bpb"] - base, "s")
    ax2.annotate(r["kv"] if r["kv"] != "none" else "float32", (r["kv_token"], r["bpb"] - base),
                 fontsize=8, xytext=(4, 3), textcoords="offset points")
ax2.set_xlabel("KV cache bytes per token")
ax2.set_title(f"KV int8: {bpb['none', 'int8'] - base:+.4f} bits/byte for "
              f"{rows5[0]['kv_token'] / rows5[4]['kv_token']:.1f}x fewer bytes", fontsize=9)
for ax in (ax1, ax2):
    ax.ticklabel_format(axis="y", useOffset=False)
    ax.axhline(0, color="gray", lw=0.8)
fig.tight_layout()
display(fig)

# %%
if saved is not None and "quality" in saved:
    qq = saved["quality"]
    print(f"saved ({saved_file}): {qq['recipe']} ({qq['preset']}), {qq['metric']}")
    print(f"{'weights':>8} {'KV':>7} {'bits/byte':>9} {'delta':>8} {'logit error':>11}")
    for r in qq["results"]:
        print(f"{r['weight_format']:>8} {r['kv_format']:>7} {r['bits_per_byte']:9.4f} "
              f"{r['delta_bits_per_byte']:+8.4f} {r['logit_error']:11.4f}")

# %% [markdown]
# ## Step 6 · When quantization pays
#
# - **Memory-bound decode, with a kernel that streams the small bytes.** At small batch a
#   decode step's time is its bytes over the bandwidth, and int8 / float8 / int4 weights cut
#   the bytes 2 to 6 times against float32 (step 1). The gain is real only if the product
#   reads the quantized values directly (step 3): dequantizing to a float weight first is
#   slower than not quantizing at all, and formats that need unpacking (int4, float8 on a CPU)
#   need a kernel that vectorizes it. Compute-bound work (prefill, large batches) gains
#   nothing from smaller weights unless the arithmetic itself is low precision (int8 x int8,
#   FP8 tensor cores).
# - **Capacity.** Smaller weights and an int8 / float8 KV cache leave room for more
#   sequences and longer contexts (step 4): at long context the cache is most of the memory and
#   most of the bytes read, so the KV format matters as much as the weights'.
# - **Quality.** 8 bits (int8 per channel, float8 e4m3) cost little, measured here and widely
#   reported; 4 bits cost more and need small groups (and, in practice, outlier-aware methods
#   such as GPTQ or AWQ) to stay close. Measure the loss on your own model before you ship.
