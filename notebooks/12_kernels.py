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
# # 12 · The kernels layer: decode at the speed of memory on a CPU
#
# An inference engine is a model, a scheduler and, under both, **kernels**: the hand-written
# loops that make a step's few big operations run at the speed of the hardware (llama.cpp's
# ggml, vLLM's attention and GEMM kernels, FlashAttention). Notebook 02 showed that a decode
# step is memory-bound; notebook 10 that a format only saves time if the product streams its
# bytes. This notebook is about the one operation that decides a CPU decode step: the weight
# product with a few rows of activations, and `refmodel.kernels`, the native C++ kernel for it
# that JAX calls through `jax.ffi`.
#
# Step 0 shows the reference model and its backends side by side; then seven steps:
#
# 1. a decode step is a chain of weight products with few rows: llama-309m's bytes, FLOPs and
#    intensity at batch 1 to 8, against this machine's ridge;
# 2. the layout lesson: one row times a weight stored input-major [K, N], output-major
#    [N, K] or in the kernel's panels, timed here;
# 3. few rows: XLA's two layouts and the kernel at 1 to 8 rows, against their roof;
# 4. inside the kernel, and checks that it computes the right thing, alone and in a model;
# 5. the committed race against llama.cpp (`figures/data/<machine>/decode.json`) and its targets;
# 6. what is left, and how to race your own machine;
# 7. kernels the JAX way: a Pallas kernel for decode attention, the same ideas for a GPU or TPU.
#
# Shapes follow `refmodel/kernels/rows.py`: x [M, K] (M rows: the step's tokens), a weight
# [K, N] as the model is written (K inputs, N outputs), [N, K] stored output-major, or
# [ceil(N / 32), K, 32] stored in the kernel's panels.

# %%
# %matplotlib inline
import inspect
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

import refmodel
from microbench import machines, sysinfo
from microbench.roofs import native
from microbench.roofs.peaks import main_array_bytes
from microbench.roofs.rounds import NumpyPeer
from refmodel import backends, compiler_check, costs, kernels, pallas, presets
from refmodel.kernels import build
from refmodel.pallas import decode as pallas_decode

# %%
QUICK = os.environ.get("LAB_FULL", "0") != "1"  # parameter: LAB_FULL=1 for publication size
MODEL, CONTEXT, BATCHES = "llama-309m", 128, (1, 2, 4, 8)  # step 1: the race's model, context
K_W, N_W = 1024, 4096  # steps 2-3: a weight [K, N] of llama-309m's FFN shape, 16 MB in float32
ROWS = (1, 2, 4, 8)  # rows of x timed in steps 2-3
ROUNDS, REPEATS = (4, 3) if QUICK else (9, 5)  # interleaved timing rounds, calls per round
GEMM = (1024,) * 3 if QUICK else (2048,) * 3  # numpy's GEMM, the compute roof
LLC = max((c["size_bytes"] for c in sysinfo.cache_sizes()), default=32 << 20)
# weights chained per call, at least 4x the last-level cache: 8 (128 MB) with a 32 MiB L3
STACK = 32 if not QUICK else min(32, max(8, -(-4 * LLC // (4 * K_W * N_W))))
READ_BYTES = max(128 << 20, 4 * LLC) if QUICK else main_array_bytes(LLC)  # the read's array
DATA = machines.data_folder("decode")  # figures/data/<machine>/: one machine's runs
RACE_FILE = DATA / "decode.json"  # the committed race (step 5), written by microbench decode
race = json.loads(RACE_FILE.read_text()) if RACE_FILE.exists() else None
# the race's float32 kernel product form: "native panels" (this kernel), or "native [N, K]" in
# a run made before it (the earlier kernel over [N, K] rows, which left 1 row to XLA's GEMV);
# "native int8 panels" is the same kernel on int8 weights, a program of its own
FORMS_RUN = {p["form"] for p in (race or {}).get("products", [])}
NATIVE_FORM = "native panels" if "native panels" in FORMS_RUN else next(
    (f for f in sorted(FORMS_RUN) if f.startswith("native") and "int8" not in f), None)
print(f"weights [{K_W}, {N_W}] x {STACK}, last-level cache {LLC / 2**20:.0f} MiB; {ROUNDS} "
      f"rounds of {REPEATS} calls", "| quick" if QUICK else "| full")

t0 = time.perf_counter()
HAVE_KERNEL = kernels.available()  # compiles rows.cc on first use, then loads the cached build
print(f"native kernels: {'available' if HAVE_KERNEL else 'NOT available'} "
      f"({time.perf_counter() - t0:.1f} s to build or load)"
      + ("" if HAVE_KERNEL else f": {kernels.why_not()}"))

# %% [markdown]
# ## Step 0 · The reference, and the backends beside it
#
# The model you read in `refmodel/attention/gqa.py` is the reference: einsums over per-head
# shapes, an explicit causal mask, the cache in and out. The steps a faster implementation may
# replace are named ops (`@ops.op` in the model files); `ModelConfig.backend` picks who runs
# them, in one place (`refmodel/ops.py`): `"reference"` (the files' own code), `"xla"` (the
# same ops in layouts XLA's CPU compiler runs faster: `refmodel/backends/xla.py`),
# `"native"` (the C++ kernels of this notebook, `refmodel/backends/native.py`), or `"pallas"`
# (kernels in JAX's own kernel language for GPUs and TPUs, step 7; not timed on a CPU, where
# they run interpreted). Below: one model on each (but "pallas"), the same weights
# (`backends.use`), the same logits, and what each buys for a decode step on this machine,
# timed in interleaved rounds in this run.

# %%
print("ops and the backends that implement them:")
for op_name, impls in refmodel.ops.registered().items():
    print(f"  {op_name:22s} {', '.join(impls) or '(the reference only)'}")
ref_model = refmodel.init(presets.get("bench").replace(backend="reference"), seed=0)
on = {"reference": ref_model, "xla": backends.use(ref_model, "xla")}
if HAVE_KERNEL:
    on["native"] = backends.use(ref_model, "native")
step_args = {}
for name, m in on.items():
    ph = refmodel.Phases(m)
    step_args[name] = (ph.jitted["decode"], ph.example_args("decode", 1, CONTEXT, fill=True))
    fn, (st, tok, cache) = step_args[name]
    step_args[name] = (fn, (st, tok, fn(st, tok, cache)[1]))  # compiled, cache carried


def time_step(name: str) -> float:
    fn, (st, tok, cache) = step_args[name]
    t = time.perf_counter()
    logits, cache = fn(st, tok, cache)
    jax.block_until_ready(logits)
    step_args[name] = (fn, (st, tok, cache))
    return time.perf_counter() - t


step_ms = {name: [] for name in on}
for _ in range(ROUNDS):  # interleaved: each round times every backend once per repeat
    for _ in range(REPEATS):
        for name in on:
            step_ms[name].append(1e3 * time_step(name))
ref_ms = statistics.median(step_ms["reference"])
for name, ts in step_ms.items():
    print(f"{name:10s} decode step, bench, batch 1, context {CONTEXT}: "
          f"{statistics.median(ts):7.2f} ms (median of {len(ts)}), "
          f"{ref_ms / statistics.median(ts):.2f}x the reference's speed")

# %%
toks = jnp.asarray(np.random.default_rng(0).integers(0, 256, (1, 8)), jnp.int32)
want = np.asarray(refmodel.forward(ref_model, toks))
for m in on.values():
    np.testing.assert_allclose(np.asarray(refmodel.forward(m, toks)), want, rtol=3e-5,
                               atol=3e-5 * np.abs(want).max())
print("every backend's logits equal the reference's (to float32 rounding)")

# %% [markdown]
# ## Step 1 · A decode step is a chain of weight products with few rows
#
# A decode step feeds one token per sequence through the model: at batch $B$ every weight
# matrix [K, N] is multiplied by an activation x [B, K] of only $B$ rows. The product reads the
# whole weight, $4KN$ bytes in float32, and does $2BKN$ FLOPs, so its intensity is
# $B/2$ FLOP/byte: 0.5 at batch 1. The step's other bytes (the KV cache, the activations) are
# small at short context. Counted by `refmodel.costs.phase_costs` for llama-309m (309M
# parameters, float32: the model of the committed race, counted here, never built), context
# 128.
#
# Whether that is memory- or compute-bound depends on the machine's **ridge**: its FLOP rate
# over its read bandwidth. Both are measured here as the race measures them: the read by
# `microbench.roofs.native`'s all-core C read (a program with no compiler in the way; if gcc is
# missing, XLA's `jnp.sum` over the same array, a lower bound), the FLOP rate by numpy's
# GEMM in a child process (`microbench.roofs.rounds.NumpyPeer`).

# %%
class Roofs:
    """This machine's read bandwidth (bytes/s) and GEMM rate (FLOP/s), measured on demand."""

    def __init__(self):
        self.server = native.Server(READ_BYTES // 4, None) if native.available() else None
        if self.server is None:
            self.array = jnp.ones(READ_BYTES // 4, jnp.float32)
            self.sum = jax.jit(jnp.sum)
            self.sum(self.array).block_until_ready()
        self.read_label = (f"C read ({native.label(self.server.threads)})" if self.server
                           else "jnp.sum (gcc not found: no C read)")
        self.numpy = NumpyPeer(GEMM, 1 << 20, samples=3)

    def read(self) -> float:
        if self.server is not None:  # as microbench/studies/decode.py's _read_bytes_per_s
            c = self.server.stream(3)
            return 4.0 * c["n"] / float(np.median(c["read"]))
        ts = []
        for _ in range(3):
            t = time.perf_counter()
            self.sum(self.array).block_until_ready()
            ts.append(time.perf_counter() - t)
        return READ_BYTES / min(ts)

    def gemm(self) -> float:
        m, k, n = GEMM
        return 2.0 * m * k * n / float(np.median(self.numpy.measure()["gemm"]))

    def close(self):
        if self.server is not None:
            self.server.close()
        self.numpy.close()


roofs = Roofs()
read1, gemm1 = max(roofs.read(), roofs.read()), roofs.gemm()
ridge = gemm1 / read1
print(f"read {read1 / 1e9:.1f} GB/s ({roofs.read_label}); numpy GEMM "
      f"{'x'.join(map(str, GEMM))} {gemm1 / 1e9:.0f} GFLOP/s; ridge {ridge:.1f} FLOP/byte")

cfg309 = presets.get(MODEL)
decode = {b: costs.phase_costs(cfg309, "decode", b, CONTEXT) for b in BATCHES}
print(f"\n{MODEL}, decode at context {CONTEXT}, float32")
print(f"{'batch':>5} {'GFLOP':>7} {'GB':>6} {'weights':>8} {'FLOP/B':>7} {'bound here':>10} "
      f"{'roof ms':>8} {'tok/s at roof':>13}")
for b, c in decode.items():
    t_mem, t_flop = c["bytes"] / read1, c["flops"] / gemm1
    print(f"{b:>5} {c['flops'] / 1e9:7.2f} {c['bytes'] / 1e9:6.3f} "
          f"{c['weight_bytes'] / c['bytes']:8.1%} {c['intensity']:7.2f} "
          f"{'memory' if t_mem >= t_flop else 'compute':>10} {1e3 * max(t_mem, t_flop):8.1f} "
          f"{b / max(t_mem, t_flop):13.0f}")

# %%
# CHECK (counting): FLOPs grow exactly with the batch, the weight bytes not at all, so the
# intensity grows almost in proportion (less, by the KV cache and activations each sequence
# adds), from about 1/2 FLOP/byte at batch 1 (2 FLOPs per 4-byte weight).
c1 = decode[1]
assert 0.45 < c1["intensity"] < 0.55, c1["intensity"]
for b, c in decode.items():
    assert c["flops"] == b * c1["flops"], b
    assert abs(c["weight_bytes"] / c1["weight_bytes"] - 1) < 1e-3, b
    assert 0.9 * b * c1["intensity"] <= c["intensity"] <= b * c1["intensity"], b
print("FLOPs x batch, weight bytes constant, intensity ~ batch x",
      f"{c1['intensity']:.3f} FLOP/byte")

# %%
fig = Figure(figsize=(6.5, 3.8))
ax = fig.subplots()
xs = np.logspace(-1, 2, 200)
ax.loglog(xs, np.minimum(gemm1, read1 * xs), color="k", lw=1, label="this machine's roof")
ax.axvline(ridge, color="gray", ls=":", lw=1, label=f"ridge {ridge:.1f} FLOP/B")
for b, c in decode.items():
    ax.loglog(c["intensity"], min(gemm1, read1 * c["intensity"]), "o", label=f"batch {b}")
ax.set_xlabel("FLOP / byte")
ax.set_ylabel("attainable FLOP/s")
ax.set_title(f"{MODEL} decode: batch {BATCHES[-1]} at {decode[BATCHES[-1]]['intensity']:.1f} "
             f"FLOP/B, ridge {ridge:.1f}", fontsize=9)
ax.legend(fontsize=7)
display(fig)

# %% [markdown]
# A step at batch 1 to 8 reads the same weights (most of its bytes: the "weights" column)
# and does 1 to 8 times the arithmetic: if the products ran at the memory's speed, batch 8
# would cost little more than batch 1 where the table says "memory". Whether they do is a
# property of the code that multiplies, measured next.
#
# ## Step 2 · The layout lesson
#
# `x @ w` with w [K, N] (input-major, how the model is written) computes each output $n$ as
# $\sum_k x_k w_{k,n}$: a column of w, whose elements lie N floats apart. A GEMV over that
# layout must either walk down columns or keep N partial sums and sweep the rows of w, adding
# a multiple of each to all of them. Stored **output-major**, wt [N, K] (ggml and llama.cpp
# store weights this way), each output is the dot product of x with one contiguous row of wt:
# a core streams its own block of rows front to back, and one row of x stays in registers.
# The expectation is that output-major reads closer to the memory's speed; how much closer is
# a property of XLA's CPU code and of the machine, so it is measured, not assumed. The native
# kernel takes a third layout, **panels**: `kernels.panels(w)` turns w [K, N] into
# wp [ceil(N / 32), K, 32], 32 outputs side by side for every input, each panel contiguous
# (the packed operand of a BLAS GEMM, packed once at load time). A core streams its own
# panels front to back, and each 128-byte row of a panel meets every row of x (step 4).
#
# Timed here: `x @ w`; `jax.lax.dot_general(x, wt, (((1,), (1,)), ((), ())))`, the same
# product over the stored K axis of wt (what `backend="output-major"` runs); and
# `kernels.rows(x, wp, N)`, the native kernel over the panels (what `x @ w` runs with
# `backend="native"`). The rounds below time 1, 2, 4 and 8 rows of x together; this step reads
# the 1-row column, step 3 the rest. A single 16 MB weight may sit in the last-level cache,
# and a product repeated on it would time the cache, while a decode step reads each weight
# once per step. So each call chains `STACK` different weights, each product's input made
# from the last one's output (all of it, so no work can be dropped), as
# `microbench/studies/decode.py` chains a step's 113 products. Interleaved rounds, every form
# once per round (the machine drifts: see the README's method section), the median over rounds.

# %%
rng = np.random.default_rng(0)
ws = [jnp.asarray(rng.standard_normal((K_W, N_W), dtype=np.float32) * K_W**-0.5)
      for _ in range(STACK)]  # [K, N] each
wts = [jnp.swapaxes(w, 0, 1) for w in ws]  # [N, K] copies: what OutputMajor stores
wps = [kernels.panels(w) for w in ws]  # [N / 32, K, 32] copies: what Panels stores
W_BYTES = sum(w.nbytes for w in ws)
print(f"{STACK} weights [{K_W}, {N_W}]: {W_BYTES / 2**20:.0f} MiB per call, "
      f"{W_BYTES / LLC:.1f}x the last-level cache")


def chain(product):
    """jit of x [M, K] through every weight in turn: y [M, N] folded to [M, K] by summing its
    N / K slices (every output used), the next product's input."""

    def run(x, ws):
        for w in ws:
            y = product(x, w)
            x = y.reshape(x.shape[0], N_W // K_W, K_W).sum(axis=1) * (K_W / N_W) ** 0.5
        return x

    return jax.jit(run)


XN, NK, KR = "XLA x @ w [K, N]", "XLA dot_general [N, K]", "kernels.rows panels"
FORMS = {XN: (chain(lambda x, w: x @ w), ws),
         NK: (chain(lambda x, w: jax.lax.dot_general(x, w, (((1,), (1,)), ((), ())))), wts)}
if HAVE_KERNEL:
    FORMS[KR] = (chain(lambda x, wp: kernels.rows(x, wp, N_W)), wps)
else:
    print(f"kernels.rows left out of steps 2-3: {kernels.why_not()}")


def best_of(fn, args, n):
    ts = []
    for _ in range(n):
        t = time.perf_counter()
        jax.block_until_ready(fn(*args))
        ts.append(time.perf_counter() - t)
    return min(ts)


xs = {m: jnp.asarray(np.random.default_rng(m).standard_normal((m, K_W)), jnp.float32)
      for m in ROWS}  # x [M, K]
outs = {(f, m): np.asarray(fn(xs[m], w)) for f, (fn, w) in FORMS.items()
        for m in ROWS}  # compile and warm up
secs, reads, gemms = {k: [] for k in outs}, [], []
for _ in range(ROUNDS):  # per round: the read, numpy's GEMM, every form at every M, the read
    read0 = roofs.read()
    gemms.append(roofs.gemm())
    for m in ROWS:
        for f, (fn, w) in FORMS.items():
            secs[f, m].append(best_of(fn, (xs[m], w), REPEATS))
    reads.append(max(read0, roofs.read()))  # the better of the two, as microbench decode
roofs.close()  # the read's child process and numpy's


def committed_products(rows_list):
    """The committed race's products alone (step 5's file), as fractions of its C read."""
    if race is None or not race.get("products"):
        print(f"(no committed products to compare: {RACE_FILE} missing or without them)")
        return
    env = race.get("environment", {})
    f32 = next(p for p in race["products"] if p["form"].startswith("xla"))  # float32 weights
    print(f"the committed race ({env.get('cpu_model')} x {env.get('cpu_count')}, the "
          f"{f32['products']} products of a {race['model']} step chained, "
          f"{f32['bytes'] / 1e9:.2f} GB in float32), fraction of its C read:")
    if NATIVE_FORM and NATIVE_FORM != "native panels":
        print(f"  ({NATIVE_FORM}: a run made before the panel kernel, the earlier kernel over "
              "[N, K] rows)")
    for m in rows_list:
        got = {p["form"]: p["over_read"] for p in race["products"] if p["rows"] == m}
        print(f"  {m} row{'s' if m > 1 else ' '}: " +
              ", ".join(f"{f} {v:.2f}" for f, v in sorted(got.items())))


print(f"1 row, median of {ROUNDS} rounds (read {min(reads) / 1e9:.1f}-{max(reads) / 1e9:.1f} "
      "GB/s over the rounds)")
print(f"{'':>24} {'ms':>7} {'GB/s':>6} {'of the read':>11} {'vs x @ w':>8}")
gbs1, frac1 = {}, {}
for f in FORMS:
    t = statistics.median(secs[f, 1])
    frac1[f] = statistics.median(W_BYTES / s / r for s, r in zip(secs[f, 1], reads, strict=True))
    ratio = statistics.median(a / b for a, b in zip(secs[XN, 1], secs[f, 1], strict=True))
    gbs1[f] = W_BYTES / t
    print(f"{f:>24} {1e3 * t:7.2f} {gbs1[f] / 1e9:6.1f} {frac1[f]:11.2f} {ratio:7.2f}x")
om = statistics.median(a / b for a, b in zip(secs[XN, 1], secs[NK, 1], strict=True))
verdict = ("faster, as expected" if om > 1.05 else "slower: the expectation does not hold here"
           if om < 0.95 else "about even (within 5%): the layout makes no difference here")
print(f"XLA over the output-major copy: {om:.2f}x the speed of x @ w [K, N] (median of "
      f"per-round ratios): {verdict}")
if max(frac1.values()) > 1.02:
    print("(a fraction above 1: the products outran the round's read, itself a measurement "
          "that drift or other load on the machine slowed)")
committed_products((1,))

# %%
# CHECK (correctness only: speed is never asserted): every form computes the same chain.
for m in ROWS:
    ref = outs[XN, m]
    for f in FORMS:
        np.testing.assert_allclose(outs[f, m], ref, rtol=1e-4, atol=1e-4 * np.abs(ref).max(),
                                   err_msg=f"{f}, {m} rows")
print(f"every form gives the same outputs at {ROWS} rows")

# %%
fig = Figure(figsize=(6.5, 3.2))
ax = fig.subplots()
names = list(FORMS)
ax.barh(names, [gbs1[f] / 1e9 for f in names], color=["C0", "C1", "C2"][:len(names)])
ax.axvline(max(reads) / 1e9, color="k", ls="--", lw=1, label=f"{roofs.read_label}, best round")
ax.set_xlabel("GB/s of weights streamed (1 row of x)")
ax.invert_yaxis()
ax.set_title(f"One row through {STACK} weights [{K_W}, {N_W}] ({W_BYTES / 2**20:.0f} MiB)",
             fontsize=9)
fig.legend(fontsize=7, loc="lower center")
fig.tight_layout(rect=(0, 0.08, 1, 1))
display(fig)

# %% [markdown]
# The last lines are the committed race's answer to the same question, on its machine
# (`xla [K, N]` is `x @ w`, `xla [N, K]` the `dot_general`, `native panels` the kernel over
# its panels; a race run before the panel kernel names it `native [N, K]`, the earlier kernel
# over output-major rows), each as a fraction of that machine's C read. Whichever form streams
# fastest at one row here, the table above says; `backend="native"` does not choose by rows:
# `x @ w` with a `kernels.Panels` weight runs the kernel at 1 row too, as for a few rows and
# for a prefill, so every `x @ w` of a native model is the kernel's, whatever the batch.
#
# ## Step 3 · Few rows
#
# With $M$ rows of x the product reads the same weight and does $M$ times the FLOPs, so until
# its intensity $M/2$ reaches the ridge its time should stay the weight's bytes over the
# bandwidth. The **roof** of each point is the slower of its two limits,
# $\max(\text{bytes}/\beta_\text{read},\ \text{FLOPs}/\text{GEMM rate})$, both measured in
# the same round (the better of a read before and after the round's products, numpy's GEMM
# once per round); the fraction of the roof is taken per round and the median reported.

# %%
def roof_s(m, read, gemm):
    return max(W_BYTES / read, 2.0 * m * K_W * N_W * STACK / gemm)


read_med, gemm_med = statistics.median(reads), statistics.median(gemms)
print(f"median of {ROUNDS} rounds; read {read_med / 1e9:.1f} GB/s, GEMM {gemm_med / 1e9:.0f} "
      f"GFLOP/s, ridge {gemm_med / read_med:.1f} FLOP/B (medians)")
print(f"{'rows':>4} {'FLOP/B':>6} {'bound':>7} {'roof ms':>7}   " +
      "".join(f"{f:>24}" for f in FORMS))
frac = {}
for m in ROWS:
    bound = "memory" if W_BYTES / read_med >= 2.0 * m * K_W * N_W * STACK / gemm_med \
        else "compute"
    cells = []
    for f in FORMS:
        frac[f, m] = statistics.median(roof_s(m, r, g) / s for s, r, g in
                                       zip(secs[f, m], reads, gemms, strict=True))
        cells.append(f"{1e3 * statistics.median(secs[f, m]):9.2f} ms, {frac[f, m]:4.2f} roof")
    print(f"{m:>4} {m / 2:6.1f} {bound:>7} {1e3 * roof_s(m, read_med, gemm_med):7.2f}   " +
          "".join(f"{c:>24}" for c in cells))

if max(frac.values()) > 1.02:
    print("(above 1: faster than the round's roof, whose read drift or other load slowed)")

best = {m: max(FORMS, key=lambda f: frac[f, m]) for m in ROWS}
print("\nclosest to its roof: " + "; ".join(f"{m} rows {best[m]} ({frac[best[m], m]:.2f})"
                                           for m in ROWS))
for f in FORMS:
    growth = statistics.median(secs[f, ROWS[-1]]) / statistics.median(secs[f, 1])
    print(f"{f}: {growth:.2f}x the time from 1 to {ROWS[-1]} rows, for {ROWS[-1]}x the FLOPs")
print()
committed_products(ROWS)

# %%
fig = Figure(figsize=(7, 4))
ax = fig.subplots()
for f in FORMS:
    ax.plot(ROWS, [1e3 * statistics.median(secs[f, m]) for m in ROWS], "o-", label=f)
ax.plot(ROWS, [1e3 * roof_s(m, read_med, gemm_med) for m in ROWS], "k--",
        label="roof: max(bytes / read, FLOPs / GEMM)")
ax.set_xscale("log", base=2)
ax.set_xticks(ROWS, [str(m) for m in ROWS])
ax.set_ylim(bottom=0)
ax.set_xlabel("rows of x (M)")
ax.set_ylabel("ms per call")
ax.set_title(f"{STACK} products [{K_W}, {N_W}] ({W_BYTES / 2**20:.0f} MiB): time against the "
             "roof", fontsize=9)
ax.legend(fontsize=7)
display(fig)

# %% [markdown]
# ## Step 4 · Inside the kernel, and checking it
#
# `refmodel/kernels/rows.cc` computes y [M, N] = x [M, K] w for w [K, N] stored in panels,
# wp [ceil(N / 32), K, 32], for any number of rows of x, in about 150 lines of C++ (comments
# aside):
#
# - **Panels, packed once.** `kernels.panels(w)` (in `rows.py`) lays w out as panels of 32
#   outputs: wp[p, k, j] = w[k, 32p + j], each panel contiguous, outputs past N zero. This is
#   the packed B operand of a BLAS GEMM, but packed once when the model is loaded
#   (`kernels.Panels.of`) instead of on every call.
# - **Broadcast x, accumulate in registers.** The inner loop (`tile<B>`) takes B rows of x
#   against a panel over all of K. For every input k it loads the panel's 128-byte row (2
#   vectors with AVX-512, taken 2 vectors at a time with AVX2 or SSE), broadcasts x[m, k] to
#   every lane for each of the B rows (a broadcast *load*, `bcast` in `common.h`: written
#   `0 + x` it compiled to a scalar add and a register broadcast, which on Intel runs on port
#   5, one of its two 512-bit FMA ports), and does B fused multiply-adds per vector. The B x 32
#   outputs of the tile stay in vector registers over all K, each output in its own lane, so
#   no horizontal sum is needed. The earlier kernel took dot products of rows of an [N, K]
#   weight and summed each across its lanes. With fewer than 8 accumulators (1 to 3 rows of
#   x) each output keeps 2 or 4 partial sums, so that at least 8 independent FMA chains hide
#   the FMA latency even for one row.
# - **Passes over a panel in L2.** A pass takes at most MB = 12 rows of x with AVX-512's 32
#   registers (24 accumulators; 6 rows with AVX2's 16, 12 accumulators, as in BLIS's Haswell
#   kernel; `MB` in `panels.h`): enough independent sums to hide
#   the FMA latency on a core that runs 512-bit work at full width. More rows make more
#   passes over the panel, which is K x 128 bytes and stays in L2, so a panel comes from memory once
#   whatever M is. The kernel is a GEMV at 1 row, a few-rows product in a small batch or a
#   speculative verify, and a GEMM for a prefill.
# - **Packed x.** x is first copied in blocks of MB rows, each block transposed ([K, MB]), so
#   the inputs a step broadcasts are adjacent.
# - **Pinned loads.** An empty `asm` (`PIN`) keeps each loaded vector of w in a register;
#   without it GCC folds the load into every FMA, one load per FMA instead of one per B.
# - **Prefetch into L2.** While a tile runs, every line of the panel row 32 inputs ahead (4
#   KiB) is prefetched into L2 (`__builtin_prefetch(..., 0, 2)`; near a panel's end that is
#   the next panel). Per the comment at the top of `rows.cc`, no prefetch and a non-temporal
#   hint were slower, and other distances no better.
# - **Blocks of panels per thread on XLA's pool.** The panels are cut into 4 contiguous blocks
#   per thread, taken from a shared counter by the calling thread and by tasks on XLA's own
#   intra-op thread pool (the FFI's `ThreadPool` context). So the kernel uses the cores XLA
#   uses and never oversubscribes them, and each core streams whole contiguous panels: with
#   1-6 rows of x, 2 or 4 of its panels side by side, and from 7 rows of float32 weights the
#   first pass reads a panel's inputs in 4 parts side by side (`KSPLIT` in `panels.h`): more
#   reads in flight per core, which a core needs to pull its share of the memory's
#   bandwidth (`python -m microbench decode` times the product against the C read).
# - **Built here.** `build.py` compiles it on first use with the C++ compiler on PATH, with
#   `-O3 -march=native` (AVX-512, AVX2 or SSE, whichever this CPU has), against the FFI
#   headers in jaxlib, and caches the library under a key of the source, flags, compiler,
#   jaxlib and CPU. No compiler is not an error: `kernels.available()` is False and
#   `kernels.why_not()` says why; the model then stays on XLA (`backend="xla"`, the default).
#   `rows.py` registers it with `jax.ffi.register_ffi_target` and calls it with
#   `jax.ffi.ffi_call`. `Panels` is the weight type whose `x @ w` calls it for every number of
#   rows; `OutputMajor` stores [N, K] for `backend="output-major"` and leaves every product to
#   XLA.
#
# A fast kernel is worth nothing if it is wrong. The checks below can fail. First the kernel
# alone against a float64 numpy oracle, on sizes that hit every tail: M past a pass of rows
# (6 with AVX2, 12 with AVX-512) and several passes, K not a multiple of the unrolling, N
# ending inside a panel or inside a vector, or smaller than a panel.
# Float32 sums in another order differ from float64 by about the float32 rounding of the
# partial sums, which grows like $\sqrt{K}$: the tolerance is rtol $10^{-5}$, atol
# $10^{-5}\sqrt{K}$ (the test suite's). numpy's own float32 product (its BLAS) is shown
# beside it for scale.

# %%
build_flags = " ".join(build.FLAGS)
if not HAVE_KERNEL:
    print(f"skipped: the native kernels are not available here ({kernels.why_not()})")
else:
    print(f"built with {build.compiler()} {build_flags}")
    SIZES = [(1, 7, 5), (2, 100, 333), (3, 129, 17), (4, 1024, 1000), (5, 33, 300),
             (8, 1024, 4096), (9, 150, 64), (16, 96, 257), (17, 64, 31),
             (33, 101, 70)]  # (M, K, N)
    print(f"{'M':>3} {'K':>5} {'N':>5} {'kernel max err':>14} {'numpy f32 err':>13} "
          f"{'max |y|':>8}")
    for i, (M, K, N) in enumerate(SIZES):
        r = np.random.default_rng(i)
        x = r.standard_normal((M, K)).astype(np.float32)
        w = r.standard_normal((K, N)).astype(np.float32)  # [K, N], as the model writes it
        oracle = x.astype(np.float64) @ w.astype(np.float64)
        got = np.asarray(kernels.rows(jnp.asarray(x), kernels.panels(jnp.asarray(w)), N))
        f32 = x @ w
        print(f"{M:>3} {K:>5} {N:>5} {np.abs(got - oracle).max():14.2e} "
              f"{np.abs(f32 - oracle).max():13.2e} {np.abs(oracle).max():8.1f}")
        # CHECK: the kernel within float32 rounding of the float64 product
        np.testing.assert_allclose(got, oracle, rtol=1e-5, atol=1e-5 * np.sqrt(K),
                                   err_msg=f"M={M} K={K} N={N}")
    print("kernels.rows == float64 numpy to float32 rounding at every size")

# %% [markdown]
# Then in a model. Choosing the kernel is one config field,
# `refmodel.init(cfg.replace(backend="native"), seed=0)`, or `backends.use(model, "native")` for a
# model you already have (a copy with the same weights stored in the kernel's panels). The
# weights are drawn in float, then stored in panels, so the same seed gives the same model. On
# the `tiny` preset: a forward pass over 2 x 8 tokens (16 rows per product) against the XLA
# model, the greedy tokens of `refmodel.generate` at batch 2 (prefill of 12 rows, then 2 rows
# per decode step), and the compiled decode step at batch 1 and 2 and a prefill of 8 tokens,
# each of which must call the kernel once per `x @ w` product (q, k, v, o, gate, up, down per
# layer, plus the LM head): the kernel at every number of rows, 1 included, with no silent
# fallback to XLA.

# %%
if not HAVE_KERNEL:
    print(f"skipped: the native kernels are not available here ({kernels.why_not()}); "
          "backend='native' would raise:")
    try:
        refmodel.init(presets.get("tiny").replace(backend="native"), seed=0)
    except RuntimeError as e:
        print(" ", e)
else:
    cfg = presets.get("tiny")
    xla_model = refmodel.init(cfg, seed=0)
    native_model = refmodel.init(cfg.replace(backend="native"), seed=0)
    converted = backends.use(xla_model, "native")  # the same, from a model you already have
    wq_xla = np.asarray(xla_model.blocks[0].attn.wq[...])  # [D, N*H]
    wq_native = native_model.blocks[0].attn.wq[...]  # Panels: w [ceil(N*H / 32), D, 32]
    print(f"{cfg.name}: wq {list(wq_xla.shape)} stored in panels "
          f"{list(wq_native.w.shape)}, {type(wq_native).__name__}(shape={wq_native.shape})")

    toks = np.random.default_rng(1).integers(0, cfg.vocab_size, (2, 8))
    want = np.asarray(refmodel.forward(xla_model, toks))  # [B, T, V]
    got = np.asarray(refmodel.forward(native_model, toks))
    scale = max(1.0, float(np.sqrt(np.mean(want.astype(np.float64) ** 2))))
    print(f"forward [2, 8]: max |native - xla| = {np.abs(got - want).max():.2e} "
          f"(logits RMS {scale:.2f})")

    prompt = np.random.default_rng(2).integers(0, cfg.vocab_size, (2, 6))
    gen = {name: np.asarray(refmodel.generate(m, prompt, 10)) for name, m in
           (("xla", xla_model), ("native", native_model))}
    print("greedy continuations (xla):   ", gen["xla"][:, 6:].tolist())
    print("greedy continuations (native):", gen["native"][:, 6:].tolist())

    calls = {}
    phases = refmodel.Phases(native_model)
    for phase, batch in (("decode", 1), ("decode", 2), ("prefill", 1)):
        text = phases.jitted[phase].lower(*phases.example_args(phase, batch, 8)).as_text()
        calls[phase, batch] = text.count(build.TARGETS["RowsF32"])
    print(f"custom calls to {build.TARGETS['RowsF32']}: decode step at batch 1 "
          f"{calls['decode', 1]}, at batch 2 {calls['decode', 2]}, prefill of 8 tokens "
          f"{calls['prefill', 1]} ({cfg.n_layers} layers x 7 + LM head = "
          f"{7 * cfg.n_layers + 1})")

    # CHECK: same weights; logits within float32 rounding (the kernel sums each output in its
    # own order; 3e-5 of the logits' scale, the test suite's bound); identical greedy tokens;
    # backends.use(model, "native") stores exactly what init(backend="native") does; the
    # kernel once per x @ w product at 1 row, 2 rows and 8 (tests/test_kernels.py's count).
    np.testing.assert_array_equal(np.asarray(wq_native.dequantize()), wq_xla)
    np.testing.assert_allclose(got, want, rtol=3e-5, atol=3e-5 * scale)
    np.testing.assert_array_equal(gen["native"], gen["xla"])
    for a, b in zip(jax.tree.leaves(nnx.state(converted, nnx.Param)),
                    jax.tree.leaves(nnx.state(native_model, nnx.Param)), strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))  # backends.use == init
    assert set(calls.values()) == {7 * cfg.n_layers + 1}, calls
    print("native model == XLA model: same weights, logits to rounding, same greedy tokens")

# %% [markdown]
# ## Step 5 · The committed race
#
# `python -m microbench decode` runs llama-309m's whole decode step at batch 1, 2, 4 and 8 in
# three programs (`backend="xla"`, `"output-major"`, `"native"`), beside the C read, numpy's
# GEMM and the same weights in llama.cpp (an F32 GGUF written from our model) and transformers,
# all in interleaved rounds; every ratio is taken inside a round and the median over rounds
# reported. Its result is committed in `figures/data/<machine>/decode.json`; the table below is read
# from it (its machine's environment is printed: most likely not this one). Its targets, as
# `microbench/studies/decode.py` defines them (reported, never asserted): batch 1 at least
# as fast as llama.cpp (`vs_llamacpp`) and at `vs_read` or more of the C read; batches 2-8 at
# `small_batch_roof` or more of their roof; the values are read from the file.
#
# Which kernel the committed run's `native` program ran is printed from its product forms:
# `native panels` is this notebook's panel kernel, at every batch. `native [N, K]` is a run
# from before it: the earlier kernel over [N, K] rows for batches 2-8, and at batch 1 XLA's
# GEMV over the same output-major weights (then `native` and `output-major` measured the same
# batch-1 program twice). A run with the program `native-int8` also ran the same weights
# quantized to int8 (`quant.quantize(model, weights="int8")`, one scale per output) through the
# same kernel: a quarter of the bytes and its own roof; `w8a8` and `w4a8` ran int8 and int4
# weights with int8 activations in the integer dot kernel (`qdot.cc`), raced against
# llama.cpp's Q8_0 and Q4_0 (notebook 10). The targets are the float32 model's, so the
# verdicts below leave the quantized programs out.

# %%
if race is None:
    print(f"{RACE_FILE} does not exist: run `python -m microbench decode` to make it")
else:
    env = race.get("environment", {})
    print(f"{race['model']} ({race['params'] / 1e6:.0f}M parameters), context "
          f"{race['setup']['context']}, {race['setup']['rounds']} rounds; "
          f"{env.get('cpu_model')} x {env.get('cpu_count')}, jax {env.get('jax_version')}, "
          f"{env.get('date_utc')}")
    print(f"{race['read_program']}: {race['read']['median'] / 1e9:.1f} GB/s (spread "
          f"{race['read']['spread']:.0%}); {race['gemm_program']}")
    if race.get("llamacpp"):
        print(f"llama.cpp {race['llamacpp']['version']}, {race['llamacpp']['threads']} threads, "
              f"{1e3 * race['peer_table']['llama.cpp']['step_s']:.1f} ms per batch-1 step")
    if race.get("skipped"):
        print("skipped in that run:", race["skipped"])
    if NATIVE_FORM == "native panels":
        print("its native program: the panel kernel (step 4) at every batch")
    elif NATIVE_FORM is not None:
        print(f"its native program ({NATIVE_FORM!r}): a run made before the panel kernel, the "
              "earlier kernel over [N, K] rows at batch 2-8 and XLA's GEMV at batch 1")
    else:
        print("its native program: not named in its products (none in the file)")
    print(f"\n{'program':>12} {'batch':>5} {'step ms':>8} {'of roof':>7} {'vs llama.cpp':>12} "
          f"{'per round':>20}")
    for r in race["table"]:
        vs = r.get("over_llama.cpp")
        per = ", ".join(f"{v:.2f}" for v in r.get("over_llama.cpp_rounds", []) if v)
        print(f"{r['program']:>12} {r['batch']:>5} {1e3 * r['step_s']:8.2f} "
              f"{r['roof_fraction']:7.2f} {f'{vs:.2f}x' if vs else '-':>12} {per:>20}")
    print("\ntargets:", race["targets"])

# %%
if race is not None:
    tg = race["targets"]
    verdicts = []  # (target, program, value, threshold)
    for r in race["table"]:
        if r["program"] not in ("xla", "output-major", "native"):  # the targets are for
            continue  # float32; the quantized programs race llama.cpp's formats (notebook 10)
        if r["batch"] == 1:
            if r.get("over_llama.cpp") is not None:
                verdicts.append(("batch 1 vs llama.cpp", r["program"], r["over_llama.cpp"],
                                 tg["vs_llamacpp"]))
            verdicts.append(("batch 1 of the C read", r["program"], r["over_read"],
                             tg["vs_read"]))
        else:
            verdicts.append((f"batch {r['batch']} of its roof", r["program"],
                             r["roof_fraction"], tg["small_batch_roof"]))
    print(f"{'target':>24} {'program':>12} {'value':>6} {'needs':>6}")
    for what, prog, v, need in verdicts:
        print(f"{what:>24} {prog:>12} {v:6.2f} {need:6.2f}  {'met' if v >= need else 'NOT met'}")
    # per target, the best of our programs (in a run made before the panel kernel, batch 1 ran
    # the same XLA GEMV in 'output-major' and 'native'; with it, 'native' is the kernel's)
    met, missed = [], []
    for what in dict.fromkeys(v[0] for v in verdicts):
        cands = [v for v in verdicts if v[0] == what]
        _, prog, v, need = max(cands, key=lambda c: c[2])
        (met if v >= need else missed).append(f"{what} ({prog}, {v:.2f} against {need})")
    print(f"\nmet, by our best program: {'; '.join(met) or 'none'}")
    print(f"not met: {'; '.join(missed) or 'none'}")
    for row in race["table"]:
        per_round = [v for v in row.get("over_llama.cpp_rounds", []) if v]
        if row["batch"] == 1 and per_round:
            n_ok = sum(v >= tg["vs_llamacpp"] for v in per_round)
            print(f"{row['program']} batch 1 vs llama.cpp: {n_ok} of {len(per_round)} rounds at "
                  f"or above {tg['vs_llamacpp']}x")

# %%
if race is not None:
    fig = Figure(figsize=(11, 3.8))
    ax1, ax2 = fig.subplots(1, 2)
    batches = race["setup"]["batches"]
    for prog in race["programs"]:
        rows_p = [r for r in race["table"] if r["program"] == prog]
        ax1.plot([r["batch"] for r in rows_p], [1e3 * r["step_s"] for r in rows_p], "o-",
                 label=prog)
        ax2.plot([r["batch"] for r in rows_p], [r["roof_fraction"] for r in rows_p], "o-",
                 label=prog)
    roof_ms = [1e3 * next(r["roof_s"] for r in race["table"] if r["batch"] == b)
               for b in batches]
    ax1.plot(batches, roof_ms, "k--", label="roof")
    if "llama.cpp" in race.get("peer_table", {}):
        ax1.plot([1], [1e3 * race["peer_table"]["llama.cpp"]["step_s"]], "k*", ms=12,
                 label="llama.cpp")
    ax1.set_ylim(bottom=0)
    ax1.set_ylabel("ms per decode step")
    ax1.set_title(f"{race['model']}: step time (committed run)", fontsize=9)
    ax2.axhline(race["targets"]["small_batch_roof"], color="gray", ls=":",
                label="target, batch 2-8")
    ax2.plot([1], [race["targets"]["vs_read"]], "kx", label="target, batch 1 (of the read)")
    ax2.set_ylim(0, 1.05)
    ax2.set_ylabel("fraction of the roof")
    ax2.set_title("share of max(bytes / C read, FLOPs / GEMM)", fontsize=9)
    for ax in (ax1, ax2):
        ax.set_xscale("log", base=2)
        ax.set_xticks(batches, [str(b) for b in batches])
        ax.set_xlabel("batch")
        ax.legend(fontsize=7)
    fig.tight_layout()
    display(fig)

# %% [markdown]
# ## Step 6 · What is left
#
# **Batch 8 was the kernel's compute ceiling.** At 8 rows a product does 4 FLOPs per byte (2
# FLOPs per row per 4-byte weight): compare it with the ridges of steps 1 and 3 and of the
# race, below. Near the ridge, staying on the memory roof means computing close to the GEMM's
# rate while streaming. The earlier kernel could not: it took dot products of rows of an
# [N, K] weight with rows of x and summed each output across its lanes, and batch 8 was where
# it fell below its roof. The panel kernel of step 4 broadcasts x, keeps up to 12 x 32 outputs
# in registers (6 x 16 with AVX2) and never sums across lanes, so 8 rows are no longer its
# compute ceiling. Whether that brings batch 8 to its roof while the weights stream from
# memory, the race in step 5 says (if it was run with the panel kernel: step 5 prints which).
# `python -m microbench breakdown --model llama-309m --batch 8 --backend native` shows where
# such a step's time goes. From the committed data:

# %%
if race is not None:
    pts = [p for r in race["rounds"] for p in r["points"]
           if p["program"] == "native" and p["batch"] == max(race["setup"]["batches"])]
    ridges = [r["gemm_flops_per_s"] / max(r["read_bytes_per_s"]) for r in race["rounds"]]
    if pts:
        b8 = pts[0]
        rate = statistics.median(p["flops"] / p["step_s"] for p in pts)
        need = statistics.median(p["flops"] / p["roof_s"] for p in pts)
        gemm_med = statistics.median(r["gemm_flops_per_s"] for r in race["rounds"])
        print(f"batch {b8['batch']} (native): {b8['flops'] / b8['bytes']:.2f} FLOP/byte against "
              f"a ridge of {min(ridges):.1f}-{max(ridges):.1f} over the rounds")
        print(f"  at its roof it would run {need / 1e9:.0f} GFLOP/s "
              f"({need / gemm_med:.2f} of numpy's GEMM); it ran {rate / 1e9:.0f} GFLOP/s, "
              f"{rate / need:.2f} of that")
    prods = [p for p in race.get("products", []) if p["rows"] == 8]
    for p in prods:  # FLOPs: 2 per row per weight of 4 bytes (1 in int8)
        size = 1 if "int8" in p["form"] else 4
        print(f"  the {p['products']} products alone at 8 rows, {p['form']}: "
              f"{1e3 * p['seconds']:.1f} ms, "
              f"{2 * 8 * p['bytes'] / size / p['seconds'] / 1e9:.0f} GFLOP/s, "
              f"{p['over_read']:.2f} of the C read")

# %% [markdown]
# **Batch 1 no longer copies its KV cache.** XLA:CPU (jax 0.10.2) compiled the batch-1
# decode step with 4 copies of every K and V cache array per step and none at batch 2: a dot
# over the just-written cache whose batch axis of 1 XLA drops triggered it. At context 2048
# the copies were the step's largest op. The batch-1 cache copies were removed by computing
# the batch-1 decode attention as a multiply-and-sum (`attend_summed` in
# `refmodel/backends/xla.py`), a reduce that reads the written cache directly. With one
# query head per KV head (MHA), where that sum is much slower than the einsum, and in MLA's
# absorbed form, XLA's batch 1 still copies; a native model's GQA/MHA/MQA and sliding-window
# decode attends in the serving engine's paged kernel (`refmodel/kernels/attend.cc`, the cache
# as one page per sequence), which reads the cache in place, its prefill chunks in
# `attend_rows.cc` (the scores of a block of query rows kept in L2 between two products), and
# its absorbed MLA decode in `latent.cc` (both absorbs and the attention over the latents in
# one call, wkv_b read as stored); a linear-attention layer's decode updates its state in
# `recurrence.cc` (read once, written in place), and a MoE layer's experts run as grouped
# products (each expert with rows read once per step, not once per tile of rows).
# `tests/test_cache_in_place.py` checks that no copy is
# left and keeps the trigger as a reproduction. Counted here, in this machine's compiled decode
# step of the `tiny` preset (GQA; a copy of an array of a cache array's shape, in the optimized
# HLO):

# %%
def whole_cache_copies(cfg, batch: int, context: int) -> tuple[int, int]:
    """(copies of whole cache arrays in the compiled decode step, cache arrays)."""
    return compiler_check.cache_copies(refmodel.Phases(refmodel.init(cfg, seed=0)), batch,
                                       context)


def check_no_cache_copies(copies):
    """CHECK (fails on a compiled step that copies its cache): no whole-cache copy in the
    compiled decode step ({batch: copies})."""
    for batch, n in copies.items():
        assert n == 0, f"batch {batch}: {n} copies of whole cache arrays per decode step"


copies = {}
for batch in (1, 2):
    copies[batch], arrays = whole_cache_copies(presets.get("tiny"), batch, 16)
    print(f"batch {batch}: {copies[batch]} whole-cache copies per step for {arrays} cache "
          f"arrays ({copies[batch] / arrays:.1f} per array)")
check_no_cache_copies(copies)

# %% [markdown]
# **Race your own machine.** The committed numbers are one 2-core machine's; your ratios will
# differ. To race yours (in a checkout installed with `pip install -e '.[dev]'`):
#
# ```
# pip install -e '.[peers]'             # llama.cpp (built from source) and transformers
# python -m microbench decode --quick   # the small `bench` model, no peers: under a minute
# python -m microbench decode           # the full race: results/decode/decode.{json,md,png}
# ```
#
# The `peers` extra builds llama.cpp from source (a C++ compiler and cmake, a few minutes).
# Without it the race runs without llama.cpp and transformers; without a C++ compiler it runs
# the two XLA programs only (`skipped` in the JSON says what was left out), and
# `kernels.why_not()` says why the kernel did not build. The race's JSON has the layout read in
# step 5, so pointing `RACE_FILE` above at `results/decode/decode.json` shows your machine's
# table and targets here.

# %% [markdown]
# ## Step 7 · Kernels the JAX way: Pallas
#
# The C++ kernels above speak to one kind of chip. **Pallas** (`jax.experimental.pallas`) is
# JAX's own kernel language, and its kernels compile for GPUs (through Triton, or Mosaic GPU
# on Hopper and newer) and TPUs (through Mosaic). A Pallas kernel has three parts:
#
# - **a grid**: `pl.pallas_call(kernel, grid=(B, K, splits), ...)` runs `kernel` once per
#   point of the grid, each run a *program* (a thread block on a GPU, a step of a sequential
#   loop per core on a TPU); `pl.program_id(axis)` says which;
# - **blocks**: each operand's `pl.BlockSpec(block_shape, index_map)` says which block of it a
#   program gets: `index_map(*program_ids)` gives the block's index, and before the program runs
#   the block is moved into the chip's fast memory (a TPU's VMEM; on a GPU, Triton loads it
#   into registers and shared memory); a `None` in the shape drops that axis;
# - **the computation on blocks**: the kernel reads its blocks (`ref[...]`, `ref[pl.ds(start,
#   size)]`), computes with ordinary `jnp`, and writes its output block.
#
# On a CPU Pallas runs only in **interpret mode** (`interpret=True`): the grid becomes a loop in
# XLA, each program's blocks sliced out of the arrays. It is how this project's tests check the
# kernels (`tests/test_pallas.py`): for correctness, not speed.
#
# The kernel read here is `refmodel/pallas/decode.py`'s decode attention, one query per
# sequence over a KV cache: q [B, K, G, H], k and v [B, K, S, H], row b seeing lens[b] keys.
# First the reference, a masked softmax between two einsums, as the model computes it:

# %%
print(inspect.getsource(pallas.reference_decode_attention))

# %% [markdown]
# Then the kernel, top to bottom. `decode_attention` sets up the grid (B, K, splits) and the
# BlockSpecs: program (b, h, s) gets the G query heads of KV head h (one read of the keys
# serves the whole group: GQA), the keys and values of split s, and lens[b]. `_kernel` walks
# its keys in blocks of `block_k`, and `online_step` folds each block into a running max m, a
# running sum l and an unnormalised output acc (FlashAttention's online softmax): each key and
# value is read once and the scores of the whole cache never exist. Each split writes its
# (acc, m, l) (`split_outputs`: their blocks and shapes); `combine` rescales them into one
# softmax. Blocks past lens[b] are never read.

# %%
for fn in (pallas_decode.online_step, pallas_decode._kernel, pallas_decode.combine,
           pallas_decode.split_outputs, pallas_decode.decode_attention):
    print(inspect.getsource(fn))

# %% [markdown]
# The block sizes come from a table keyed by the platform (`refmodel/pallas/blocks.py`, each
# entry saying why): small on a CPU so that the tiny shapes cross blocks and splits, a Triton
# tile on a GPU, the (8, 128) vector register on a TPU. Run here in interpret mode against the
# reference, with ragged lengths (one key, a block, past a split, the whole cache) and GQA
# groups:

# %%
def check_pallas_equals_reference(got, want, tol):
    """CHECK (fails on a kernel that computes something else): the Pallas kernel's output
    equals the reference's to `tol` (float32 summed in another order)."""
    err = float(np.max(np.abs(np.asarray(got, np.float64) - np.asarray(want, np.float64))))
    assert err <= tol, f"the Pallas kernel differs from the reference by {err:.2e} > {tol:.0e}"
    return err


PB, PK, PG, PS, PH = 4, 2, 4, 40, 16  # batch, KV heads, group, keys, head dim: tiny
pq, pk, pv = (jax.random.normal(jax.random.key(i), shape) for i, shape in
              enumerate([(PB, PK, PG, PH), (PB, PK, PS, PH), (PB, PK, PS, PH)]))
plens = jnp.array([1, 8, 21, PS], jnp.int32)
t0 = time.perf_counter()
p_got = pallas.decode_attention(pq, pk, pv, plens, PH ** -0.5, block_k=4, split_k=8)
p_want = pallas.reference_decode_attention(pq, pk, pv, plens, PH ** -0.5)
err = check_pallas_equals_reference(p_got, p_want, 1e-5)
print(f"{jax.default_backend()}, interpret={pallas.interpret_mode(None)}: grid (B, K, splits) "
      f"= ({PB}, {PK}, {PS // 8}), blocks of 4 keys; max |kernel - reference| = {err:.1e} "
      f"({time.perf_counter() - t0:.1f} s, compile included)")

# %% [markdown]
# **What the compiler would have done instead.** XLA compiles the reference as a few fused
# loops whose boundaries go through memory: the scores [B, K, G, S] are written by the first
# product and read back by the softmax and by the second product, and the work is split over
# the batch and the heads only, so a batch-1 decode on a GPU has K programs' worth of
# parallelism unless the compiler splits the reduction over S itself. The kernel fixes the
# schedule by hand: one pass over K and V, the scores kept in registers, the keys split across
# programs. The fused loops XLA made of the reference on this machine, and what each writes:

# %%
ref_hlo = jax.jit(pallas.reference_decode_attention).lower(
    pq, pk, pv, plens, PH ** -0.5).compile().as_text()
entry = ref_hlo[ref_hlo.index("ENTRY"):]
fusions = [line.split("=")[1].split("fusion(")[0].strip() for line in entry.splitlines()
           if " fusion(" in line]
print(f"XLA:{jax.default_backend()} compiled the reference into {len(fusions)} fusions "
      f"in its entry computation; their outputs:")
for shape in fusions:
    print("  ", shape)
scores = sum(shape.startswith(f"f32[{PB},{PK},{PG},{PS}]") for shape in fusions)
print(f"{scores} of them write a [B, K, G, S] array of scores (or of their exps) to memory, "
      "for the next to read back; the kernel writes only [B, K, splits, G, H] partial outputs")

# %% [markdown]
# Timed only on an accelerator: on a CPU the kernel runs interpreted, each program a step of an
# XLA loop, which measures the interpreter, not the kernel.

# %%
if jax.default_backend() == "cpu":
    print("on a CPU: interpret mode is for correctness, not speed; not timed")
else:
    TB, TS = 8, 4096  # a decode batch over a 4k-token cache
    tq, tk, tv = (jax.random.normal(jax.random.key(i), shape, jnp.bfloat16) for i, shape in
                  enumerate([(TB, 8, 4, 128), (TB, 8, TS, 128), (TB, 8, TS, 128)]))
    tlens = jnp.full((TB,), TS, jnp.int32)
    for name, fn in (("pallas", pallas.decode_attention),
                     ("xla", jax.jit(pallas.reference_decode_attention, static_argnums=4))):
        jax.block_until_ready(fn(tq, tk, tv, tlens, 128 ** -0.5))  # compile
        ts = []
        for _ in range(20):
            t = time.perf_counter()
            jax.block_until_ready(fn(tq, tk, tv, tlens, 128 ** -0.5))
            ts.append(time.perf_counter() - t)
        med = statistics.median(ts)
        print(f"{name:6s} {1e6 * med:8.1f} us, {2 * tk.nbytes / med / 1e9:6.0f} GB/s of K and V")

# %% [markdown]
# **The C++ kernels are the CPU case of the same ideas.** `refmodel/kernels/attend.cc`, the
# native decode attention, is this kernel written for a CPU core: its jobs are (sequence, KV
# head, chunk of keys), the grid; each reads its keys and values once, the G query heads of the
# group together, the blocks; an online softmax keeps the running max and sum in registers and
# the calling thread combines the chunks, flash-decoding's split; and `rows.cc`'s panels (step
# 4) are its BlockSpecs chosen once and stored. What Pallas adds is that the grid and the
# blocks are declared, and the compiler for each chip does the moving; what the C++ adds on a
# CPU is what Pallas cannot express there (prefetch distances, pinned registers, XLA's thread
# pool). `refmodel/pallas/paged.py` is the same kernel over the serving engine's pages (the
# page id read from the table inside the kernel) and `grouped.py` the MoE's grouped matmul;
# `backend="pallas"` runs all three in the model (`refmodel/backends/pallas.py`).
