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
# # 01 · The roofline: arithmetic intensity, roofs and the ridge point
#
# Every kernel does some work (FLOPs) and moves some data (bytes). Its **arithmetic
# intensity** is the ratio
#
# $$ I = \frac{\text{FLOPs}}{\text{bytes moved}} \quad [\text{FLOP/byte}] $$
#
# A chip has two ceilings: a peak compute rate $P$ (FLOP/s) and a memory bandwidth $\beta$
# (byte/s). (In every notebook $P$ is a peak FLOP/s; a parameter count is $\Theta$.)
# A kernel of intensity $I$ cannot run faster than
#
# $$ \text{attainable}(I) = \min(P,\; I\,\beta), $$
#
# the *roofline* (Williams, Waterman & Patterson, CACM 2009). The two roofs meet at the
# **ridge point** $I^* = P / \beta$: below it a kernel is memory-bound, above it compute-bound.
#
# Each step below builds a kernel from `microbench`, counts it, times it on this machine with
# `microbench.harness.time_fn`, and checks it. `QUICK` (the default, what CI runs) uses small
# sizes and short budgets; `LAB_FULL=1` uses publication sizes.
#
# To put any model's phases on any chip's roofline (spec sheets, or the roofs measured here),
# batch, context and precision as you choose, open [the explorer](../book/explorer.md).

# %%
# %matplotlib inline
import os

import jax
import numpy as np
from IPython.display import display
from matplotlib.figure import Figure

from microbench import hardware, harness, plots
from microbench.roofline import predict
from microbench.roofs import bandwidth, compute, guard, intensity, native, peaks
from refmodel.compiler_check import cost_analysis

# %%
QUICK = os.environ.get("LAB_FULL", "0") != "1"  # parameter: LAB_FULL=1 for publication size
jax.config.update("jax_default_matmul_precision", "highest")  # float32 GEMMs stay float32
BUDGET = dict(budget_s=0.15, min_samples=3, min_sample_s=1e-3) if QUICK else \
    dict(budget_s=1.0, min_samples=5, min_sample_s=2e-3)
ENV = harness.environment()
SPEC = hardware.device_for_environment(ENV)  # this machine's ceilings (None if unknown)
print(peaks.machine_label(ENV), "| quick" if QUICK else "| full")
# Checks on measurements (the check_* functions, each fed a wrong measurement by
# tests/test_checks_01.py): a value may exceed the value it is bounded by only within the
# spread of the two, spread = (p90 - p10) / median of each, plus NOISE: on this shared
# machine two measurements of the same kernel taken a minute apart differ by 10-20%.
NOISE = 0.25

# %% [markdown]
# ## Step 1 · Count the intensity of a matrix multiply
#
# $C = AB$ with $A \in \mathbb{R}^{M\times K}$, $B \in \mathbb{R}^{K\times N}$ does one
# multiply-add per $(m, k, n)$: $2MKN$ FLOPs. At the minimum it reads $A$ and $B$ once and
# writes $C$ once: $s(MK + KN + MN)$ bytes for $s$-byte elements. For a square float32 GEMM
# ($s=4$) that is $I = 2n^3 / 12n^2 = n/6$: intensity grows with size, which is why big
# matrix multiplies are compute-bound.

# %%
GEMM_SIZES = (128, 256, 512) if QUICK else (256, 512, 1024, 2048)
gemm, gemm_label = compute.gemm_fn("float32")
print("kernel:", gemm_label)
counted = {n: (compute.gemm_flops(n, n, n), compute.gemm_bytes(n, n, n, "float32"))
           for n in GEMM_SIZES}
for n, (f, b) in counted.items():
    print(f"n={n:5d}: {f:.3e} FLOPs, {b:.3e} bytes, I = {f / b:7.1f} FLOP/byte")

# %%
# CHECK: the counts are the compiler's own (XLA's cost analysis of the compiled kernel), and
# the square-GEMM intensity is n / 6.
for n, (f, b) in counted.items():
    a_, b_ = compute.gemm_inputs(n, n, n, "float32")
    xla = cost_analysis(harness.compile_fn(gemm, a_, b_))
    np.testing.assert_allclose([xla["flops"], xla["bytes accessed"]], [f, b], rtol=1e-6)
    np.testing.assert_allclose(f / b, n / 6, rtol=1e-12)
print("GEMM FLOPs and bytes agree with XLA; I = n/6")

# %% [markdown]
# ## Step 2 · Measure the compute roof: GEMM FLOP/s
#
# `harness.time_fn` compiles outside the timer, warms up, blocks on the result, and repeats
# until the spread is small or the budget is spent. FLOP/s = counted FLOPs / median time.
# The best size is this machine's matrix roof $P$.

# %%
gemm_points = []
for n in GEMM_SIZES:
    a_, b_ = compute.gemm_inputs(n, n, n, "float32")
    t = harness.time_fn(gemm, a_, b_, **BUDGET)
    f, b = counted[n]
    point = peaks.entry("gemm", t, f, b, dtype="float32", shape=[n, n, n])
    guard.flag_compute(point, SPEC)  # above the theoretical peak = a measurement error
    gemm_points.append(point)
    print(f"n={n:5d}: {plots.fmt_si(point['flops_per_s']['median'], 'FLOP/s'):>14s} "
          f"(p10-p90 {plots.fmt_si(point['flops_per_s']['p10'], '')}-"
          f"{plots.fmt_si(point['flops_per_s']['p90'], '')}), stop: {t.stop}"
          + (f"  SUSPECT: {point['reason']}" if point["suspect"] else ""))
best_gemm = max(gemm_points, key=lambda p: p["flops_per_s"]["median"])
P = best_gemm["flops_per_s"]["median"]

# %%
def check_gemm_rates(rates, peak, min_samples):
    """CHECK (fails on a wrong measurement): each GEMM rate ({median, p10, p90} in FLOP/s,
    with its sample count n) kept at least min_samples, none beats the theoretical float32
    peak (None: no spec to bound it) by more than its spread (p90 - p10) / median, and none
    is 100x below the best (a timer that stops before the work ends, or one that times
    compilation, breaks one of the two)."""
    best = max(r["median"] for r in rates)
    for r in rates:
        assert r["n"] >= min_samples, f"{r['n']} samples, fewer than {min_samples}"
        if peak is not None:
            assert r["median"] <= peak * (1 + (r["p90"] - r["p10"]) / r["median"]), (
                f"{r['median']:.3g} FLOP/s beats the theoretical peak {peak:.3g}")
        assert r["median"] > best / 100, f"{r['median']:.3g} FLOP/s: 100x below the best"


# the theoretical peak: cores x FMA pipes x lanes x 2 x clock, `hardware.cpu_device`
PEAK32 = SPEC.peak_flops["float32"] if SPEC is not None and "float32" in SPEC.peak_flops \
    else None
check_gemm_rates([{**p["flops_per_s"], "n": p["timing"]["n"]} for p in gemm_points], PEAK32,
                 BUDGET["min_samples"])
print(f"GEMM: best {plots.fmt_si(P, 'FLOP/s')}" + (
    f" = {P / SPEC.peak_flops['float32']:.0%} of the theoretical f32 peak"
    if SPEC is not None and "float32" in SPEC.peak_flops else " (no spec peak to bound it)"))

# %% [markdown]
# ## Step 3 · Measure the memory roof: STREAM triad
#
# Triad, $a_i = b_i + s\,c_i$, does 2 FLOPs per element and moves 12 bytes in float32 (read
# $b$ and $c$, write $a$): $I = 1/6$ FLOP/byte, far left of any ridge, so its speed is the
# bandwidth $\beta$. The arrays are several times the last-level cache, so the bytes come from
# DRAM. On a CPU a store to a line not in cache first reads it (*write-allocate*): the
# hardware moves one more array than the algorithm needs; we report the algorithmic bytes, and
# also time an in-place scale ($a_i \leftarrow s\,a_i$, donated), which reads the line it
# writes and so pays no write-allocate. The faster of the two is the bandwidth roof, as in
# `microbench.roofs.peaks.derive_roofs`.

# %%
llc = max((size for _, size in peaks.memory_levels(ENV, SPEC)), default=32 << 20)
array_bytes = max(2 * llc, 32 << 20) if QUICK else peaks.make_plan(False, llc).dram_array_bytes
n_elem = array_bytes // 4
triad = bandwidth.KERNELS["triad"]
triad_args = bandwidth.kernel_args(triad, n_elem)
triad_bytes = bandwidth.kernel_bytes(triad, n_elem, 4, donated=True)
print(f"3 arrays of {array_bytes / 2**20:.0f} MiB (last-level cache {llc / 2**20:.0f} MiB); "
      f"bytes per call: {triad_bytes}")

# %%
t = harness.time_fn(triad.fn, *triad_args, donate_argnums=(0,), **BUDGET)
triad_point = peaks.entry("triad", t, bandwidth.kernel_flops(triad, n_elem),
                          triad_bytes["algorithmic"], dtype="float32", n=n_elem)
print(f"triad: {plots.fmt_si(triad_point['bytes_per_s']['median'], 'B/s')} algorithmic, "
      f"{plots.fmt_si(triad_bytes['write_allocate'] / t.median, 'B/s')} with write-allocate")
scale = bandwidth.KERNELS["scale"]
scale_args = bandwidth.kernel_args(scale, n_elem)
t = harness.time_fn(scale.fn, *scale_args, donate_argnums=(0,), **BUDGET)
scale_point = peaks.entry("scale", t, bandwidth.kernel_flops(scale, n_elem),
                          bandwidth.kernel_bytes(scale, n_elem, 4, donated=True)["algorithmic"],
                          dtype="float32", n=n_elem)
print(f"scale in place: {plots.fmt_si(scale_point['bytes_per_s']['median'], 'B/s')}")
for point in (triad_point, scale_point):
    guard.flag_memory(point, SPEC, "DRAM")
best_bw = max((triad_point, scale_point), key=lambda p: p["bytes_per_s"]["median"])
BETA = best_bw["bytes_per_s"]["median"]
del scale_args

# %%
# CHECK: XLA counts the same FLOPs and bytes for triad (to the 4-byte scalar, which it may
# fold away), and write-allocate adds exactly one array (the destination is written without
# being read).
xla = cost_analysis(harness.compile_fn(triad.fn, *triad_args))
np.testing.assert_allclose([xla["flops"], xla["bytes accessed"]],
                           [2 * n_elem, triad_bytes["algorithmic"]], rtol=1e-6)
assert triad_bytes["write_allocate"] - triad_bytes["algorithmic"] == 4 * n_elem
assert bandwidth.kernel_bytes(scale, n_elem, 4, donated=True)["write_allocate"] == \
    scale_point["bytes"]  # in place: the line is read before it is written
np.testing.assert_allclose(triad_point["flops"] / triad_point["bytes"], 1 / 6, rtol=1e-6)
del triad_args
print("triad counts agree with XLA; I = 1/6")

# %% [markdown]
# A bandwidth measured on arrays that still sit in a cache is not main memory's. The check
# below times the same in-place scale on an array a quarter of the last-level cache: the memory
# hierarchy says it must be faster than main memory.

# %%
# XLA:CPU splits only large elementwise ops across cores: this in-cache scale may run on one
# core while the main-memory one ran on all of them, so XLA's two numbers need not be ordered.
def check_cache_faster(cached_bytes_per_s, main_bytes_per_s):
    """CHECK (fails on a wrong byte count or a cache-resident "main memory"): at a fixed
    thread count (the native read of microbench.roofs.native, every core on its own slice) a
    working set a quarter of the cache level below the last reads faster than one of 8x the
    last. Not a quarter of the last level itself: a VM shares it with its neighbours, whose
    data may hold most of it, so such a working set can read no faster than main memory."""
    assert cached_bytes_per_s > main_bytes_per_s, (
        f"main memory read faster ({main_bytes_per_s:.3g} B/s) than the cache "
        f"({cached_bytes_per_s:.3g} B/s) at a fixed thread count: wrong byte count?")


n_small = llc // 16  # a quarter of the last-level cache, in float32
t = harness.time_fn(scale.fn, *bandwidth.kernel_args(scale, n_small), donate_argnums=(0,),
                    **BUDGET)
cache_point = peaks.entry("scale", t, bandwidth.kernel_flops(scale, n_small),
                          bandwidth.kernel_bytes(scale, n_small, 4, donated=True)["algorithmic"],
                          dtype="float32", n=n_small)
cache_bw = cache_point["bytes_per_s"]
print(f"XLA scale in place, {n_small * 4 >> 20} MiB (in cache): "
      f"{plots.fmt_si(cache_bw['median'], 'B/s')} vs main memory {plots.fmt_si(BETA, 'B/s')}")
if native.available():
    threads = len(ENV["affinity"])
    levels = [size for _, size in peaks.memory_levels(ENV, SPEC)]
    cached = (levels[-2] if len(levels) > 1 else llc) // 4
    rate = {}
    for size in (cached, 8 * llc):
        (pt,) = native.sweep(size, size, 2.0, 64 << 20, threads)
        rate[size] = pt["bytes"] * pt["repeats"] / float(np.median(pt["seconds"]))
    print(f"native read, {threads} threads: {cached >> 10} KiB "
          f"{plots.fmt_si(rate[cached], 'B/s')}, {8 * llc >> 20} MiB "
          f"{plots.fmt_si(rate[8 * llc], 'B/s')}")
    check_cache_faster(rate[cached], rate[8 * llc])
else:
    print("SKIPPED: no C compiler for the fixed-thread-count check")

# %% [markdown]
# ## Step 4 · The ridge point, here and on datacenter chips
#
# $I^* = P/\beta$. A kernel needs at least $I^*$ FLOPs per byte to use the compute it paid
# for. The spec database (`microbench.hardware`, vendor datasheets with sources) gives the
# dense bf16 peak and HBM bandwidth of datacenter accelerators; `hardware.ridge_point`
# computes their ridges below (they differ by more than 2x between chips, TPU v6e's being the
# highest listed). Every one is in the hundreds of FLOP/byte, so anything that reads each
# weight for only a few tokens is memory-bound there.

# %%
ridge_here = P / BETA
CHIPS = ("H100 SXM", "H200 SXM", "B200", "MI300X", "TPU v5e", "TPU v6e")
chips = {name: hardware.get(name) for name in CHIPS}
ridges = {name: hardware.ridge_point(dev) for name, dev in chips.items()}
print(f"datacenter ridges (bf16, spec): {min(ridges.values()):.0f} ({min(ridges, key=ridges.get)})"
      f" to {max(ridges.values()):.0f} ({max(ridges, key=ridges.get)}) FLOP/byte")
print(f"this machine: P = {plots.fmt_si(P, 'FLOP/s')} (GEMM f32), beta = "
      f"{plots.fmt_si(BETA, 'B/s')} ({best_bw['name']}) -> ridge {ridge_here:.1f} FLOP/byte")
for name, dev in chips.items():
    print(f"{name:10s}: bf16 {plots.fmt_si(dev.peak_flops['bfloat16'], 'FLOP/s'):>14s}, "
          f"{dev.main_memory} {plots.fmt_si(dev.memory_bandwidth[dev.main_memory], 'B/s'):>10s}"
          f" -> ridge {hardware.ridge_point(dev):6.0f} FLOP/byte")


def attainable(i, peak, bw):
    """The roofline at intensity i (microbench.roofline.predict on 1 byte of traffic)."""
    return predict(i, 1.0, {"name": "", "value": peak}, {"level": "", "value": bw})["flops_per_s"]


def check_datacenter_ridges(ridges):
    """CHECK (fails on a wrong spec entry): every datacenter chip's bf16 ridge ({name:
    FLOP/byte}) lies in the hundreds of FLOP/byte, as the text says: above 100 and below
    1000."""
    for name, r in ridges.items():
        assert 100 < r < 1000, f"{name}: ridge {r:.0f} FLOP/byte, not in the hundreds"


# %%
# The ridge is the datasheet's peak over its bandwidth (H100 SXM: 989.4 TFLOP/s dense bf16
# over 3.35 TB/s = 295 FLOP/byte): an independent check of the spec database's entry.
np.testing.assert_allclose(ridges["H100 SXM"], 989.4e12 / 3.35e12, rtol=1e-3)
check_datacenter_ridges(ridges)
print("ridges:", {n: round(r) for n, r in ridges.items()})

# %% [markdown]
# ## Step 5 · Trace the roofline with one kernel: the AI sweep
#
# The Empirical Roofline Toolkit's trick (`microbench.roofs.intensity`): an FMA chain in place on a
# DRAM-sized buffer. Per element it reads 4 bytes, writes 4, and runs $k$ chains of $K$
# multiply-adds: $I = (2Kk + k - 1)/8$ FLOP/byte for float32. Sweeping $(K, k)$ walks along
# the bandwidth roof, then bends onto the vector-unit roof. On a CPU that roof can sit *above*
# the float32 GEMM measured in step 2: a GEMM at `Precision.HIGHEST` through XLA's CPU
# library is not the machine's peak, and the theoretical peak (`hardware.cpu_device()`,
# cores x FMA pipes x lanes x clock) is higher still. Each roof is a measurement of one
# kernel, which is why the figure labels every line with what produced it.

# %%
SWEEP = ((1, 1), (4, 4), (16, 8), (64, 8)) if QUICK else intensity.POINTS
x0 = bandwidth.kernel_args(bandwidth.KERNELS["scale"], n_elem)[0]
sweep_points = []
for K, k in SWEEP:
    _, a_, b_ = compute.fma_inputs(1, k, "float32")
    t = harness.time_fn(intensity.kernel(K, k), x0, a_, b_, donate_argnums=(0,), **BUDGET)
    e = peaks.entry("fma_chain_inplace", t, intensity.flops(n_elem, K, k),
                    intensity.bytes_moved(n_elem, k), K=K, k=k,
                    flops_per_byte=intensity.intensity(K, k))
    sweep_points.append(e)
    print(f"K={K:3d} k={k}: I = {e['flops_per_byte']:6.2f} FLOP/byte -> "
          f"{plots.fmt_si(e['flops_per_s']['median'], 'FLOP/s')}")

# %%
def check_under_roofline(rate, intensity, beta, noise, peak):
    """CHECK (fails on a wrong measurement): a sweep point's rate ({median, p10, p90} in
    FLOP/s) at `intensity` FLOP/byte sits under the roofline min(peak, I x beta), beta the
    memory roof ({median, p10, p90} in B/s; peak the theoretical float32 peak or None), within
    the spreads (p90 - p10) / median of point and roof plus `noise`: a point above it means a
    wrong byte count, a cache-resident buffer or a timer that stops early."""
    def spread_of(r):
        return (r["p90"] - r["p10"]) / r["median"]

    tol = 1 + spread_of(rate) + spread_of(beta) + noise
    assert rate["median"] <= intensity * beta["median"] * tol, (
        f"{rate['median']:.3g} FLOP/s at {intensity:.3g} FLOP/B is above I x beta = "
        f"{intensity * beta['median']:.3g} (tolerance {tol:.2f})")
    if peak is not None:
        assert rate["median"] <= peak * (1 + spread_of(rate)), (
            f"{rate['median']:.3g} FLOP/s beats the theoretical peak {peak:.3g}")


# The sweep's counted FLOPs and bytes are XLA's, and its intensity formula holds (pure
# counting); then the measurement: every point under the roofline (check_under_roofline).
for (K, k), e in zip(SWEEP, sweep_points, strict=True):
    _, a_, b_ = compute.fma_inputs(1, k, "float32")
    xla = cost_analysis(harness.compile_fn(intensity.kernel(K, k), x0, a_, b_,
                                           donate_argnums=(0,)))
    np.testing.assert_allclose([xla["flops"], xla["bytes accessed"]], [e["flops"], e["bytes"]],
                               rtol=1e-6)  # to the few scalar bytes XLA may fold away
    np.testing.assert_allclose(e["flops"] / e["bytes"], e["flops_per_byte"], rtol=1e-5)
for i, e in enumerate(sweep_points):
    roof = best_bw["bytes_per_s"]
    try:
        check_under_roofline(e["flops_per_s"], e["flops_per_byte"], roof, NOISE, PEAK32)
    except AssertionError:
        # flagged: time it once more, and the in-place scale (the memory roof's kernel) right
        # after it: a machine whose bandwidth drifts by tens of percent within minutes needs
        # the roof of the point's own moment (the roof is the faster of the two measurements)
        print(f"K={e['K']} k={e['k']}: "
              f"{e['flops_per_s']['median'] / (e['flops_per_byte'] * BETA):.2f} "
              "of I x beta, above the roof: re-timing it and the roof")
        _, a_, b_ = compute.fma_inputs(1, e["k"], "float32")
        t = harness.time_fn(intensity.kernel(e["K"], e["k"]), x0, a_, b_, donate_argnums=(0,),
                            **BUDGET)
        e = sweep_points[i] = peaks.entry(
            "fma_chain_inplace", t, intensity.flops(n_elem, e["K"], e["k"]),
            intensity.bytes_moved(n_elem, e["k"]), K=e["K"], k=e["k"],
            flops_per_byte=e["flops_per_byte"])
        t = harness.time_fn(scale.fn, x0, jax.numpy.asarray(0.999, "float32"), donate_argnums=(0,),
                            **BUDGET)
        now = peaks.entry("scale", t, bandwidth.kernel_flops(scale, n_elem),
                          bandwidth.kernel_bytes(scale, n_elem, 4, donated=True)["algorithmic"])
        print(f"  the in-place scale now: {plots.fmt_si(now['bytes_per_s']['median'], 'B/s')} "
              f"(step 3: {plots.fmt_si(BETA, 'B/s')})")
        if now["bytes_per_s"]["median"] > roof["median"]:
            roof = now["bytes_per_s"]
        check_under_roofline(e["flops_per_s"], e["flops_per_byte"], roof, NOISE, PEAK32)
    print(f"K={e['K']:3d} k={e['k']}: "
          f"{e['flops_per_s']['median'] / (e['flops_per_byte'] * roof['median']):.2f} of "
          f"I x beta")
del x0
print("AI-sweep counts agree with XLA; every point under the roofline")

# %%
fig = Figure(figsize=(11, 7.5), layout="constrained")
ax = fig.add_subplot()
xs = np.geomspace(1 / 16, 2048, 200)
for j, (name, dev) in enumerate(chips.items()):
    peak, bw = dev.peak_flops["bfloat16"], dev.memory_bandwidth[dev.main_memory]
    ax.plot(xs, [attainable(x, peak, bw) for x in xs], "--", lw=1.4,
            color=plots.PALETTE[(j + 2) % 10],
            label=f"{name} (spec, bf16): ridge {hardware.ridge_point(dev):.0f} FLOP/B")
ax.plot(xs, [attainable(x, P, BETA) for x in xs], "-", lw=2.5, color="black",
        label=f"this machine (measured GEMM f32, {best_bw['name']}): ridge {ridge_here:.1f} FLOP/B")
ax.plot([ridge_here], [P], "D", color="black", ms=8)
vec = max(e["flops_per_s"]["median"] for e in sweep_points)
ax.hlines(vec, vec / BETA, xs[-1], colors=["0.45"],
          label=f"this machine: vector FMA roof (best of the sweep) {plots.fmt_si(vec, 'FLOP/s')}")
if SPEC is not None and "float32" in SPEC.peak_flops:
    ax.axhline(SPEC.peak_flops["float32"], color="0.45", ls=":",
               label=f"this machine: theoretical f32 peak "
                     f"{plots.fmt_si(SPEC.peak_flops['float32'], 'FLOP/s')}")
ys = [e["flops_per_s"]["median"] for e in sweep_points]
ax.errorbar([e["flops_per_byte"] for e in sweep_points], ys, fmt="o:", color=plots.PALETTE[0],
            yerr=[[y - e["flops_per_s"]["p10"] for y, e in zip(ys, sweep_points, strict=True)],
                  [e["flops_per_s"]["p90"] - y for y, e in zip(ys, sweep_points, strict=True)]],
            capsize=3, label="this machine: AI sweep (FMA chain in place; median, p10-p90)")
ax.set_xscale("log", base=2)
ax.set_yscale("log")
ax.set_xlabel("Arithmetic intensity (FLOP / byte)")
ax.set_ylabel("Attainable performance (FLOP / s)")
ax.set_title("Roofline of this machine (solid, measured) and of datacenter chips (dashed, "
             "vendor specs)")
ax.legend(loc="lower right", fontsize=9)
display(fig)

# %% [markdown]
# **What to take away.** Every chip is a bandwidth diagonal and a compute ceiling. A kernel's
# intensity, counted from its shapes, says which one limits it before anything is run; the
# measurement then says how close to that roof the code gets. The next notebook puts the two
# phases of LLM inference, prefill and decode, on this chart.
