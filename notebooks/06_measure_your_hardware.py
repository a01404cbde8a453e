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
# # 06 · Measure your hardware, compare with other machines
#
# This notebook runs the project's measurement on *your* machine: the ceilings
# (`microbench.roofs.peaks`: GEMM per dtype, the vector FMA chain, STREAM bandwidth, the
# working-set sweep that names the cache levels, the AI sweep) and a few phase points of the
# reference model (`microbench.phases.points`), then compares them with the results bundled in
# `figures/data/` (measured by `python -m microbench run` on the machine named in each file).
#
# Quick mode (the default) runs a very small plan in well under a minute: one GEMM size per
# dtype, one FMA chain, short budgets. Its numbers are indicative. `LAB_FULL=1` runs the same
# plan as `python -m microbench run` (minutes). For a publication-grade run of everything, use
# that command: it also writes the figures and a summary table.

# %%
# %matplotlib inline
import dataclasses
import json
import os

import jax
import numpy as np
from IPython.display import display

import refmodel
from microbench import hardware, harness, machines, plots, roofline
from microbench.phases import sweeps
from microbench.phases.points import Budget, measure_point
from microbench.roofs import peaks
from microbench.schema import validate_result

# %%
QUICK = os.environ.get("LAB_FULL", "0") != "1"  # parameter: LAB_FULL=1 for publication size
DATA = machines.data_folder("peaks", "phases")  # figures/data/<machine>/: one machine's runs
jax.config.update("jax_default_matmul_precision", "highest")
print("quick" if QUICK else "full", "| bundled results in", DATA.resolve())

# %% [markdown]
# ## Step 1 · What machine is this?
#
# `harness.environment()` records the backend, device, CPU model, ISA flags, caches and
# versions; every result file carries it. `hardware.device_for_environment` finds the spec
# ceilings: a datasheet entry for a known accelerator, or, on a CPU, the theoretical peak
# derived from the ISA flags, cores and clock (an upper bound the guard rails use: a
# measurement above it is an error, not a result).

# %%
env = harness.environment()
spec = hardware.device_for_environment(env)
machine = peaks.machine_label(env)
print(machine)
print({k: env[k] for k in ("backend", "device_kind", "jax_version", "cpu_count")})
if spec is not None:
    print(f"spec ceilings ({spec.name}):",  # integer GEMMs do operations, not FLOPs
          {k: plots.fmt_si(v, "OP/s" if k.startswith("int") else "FLOP/s")
           for k, v in spec.peak_flops.items()})
    print("derivation:", spec.derivation.get("formula", "vendor datasheet"))

# %%
# CHECK: the environment names the backend JAX runs on; on a CPU the spec is the CPU entry
# derived from this machine (its float32 peak: cores x FLOP/cycle/core x clock, printed).
assert env["backend"] == jax.default_backend()
if env["backend"] == "cpu":
    assert spec is not None and spec.kind == "cpu"
print("environment and spec consistent")

# %% [markdown]
# ## Step 2 · The ceilings
#
# The same functions `python -m microbench peaks` runs, with a smaller plan in quick mode.
# Each value is checked against the spec (`guard`), and the roofs are the best unflagged
# values: a matrix roof per dtype, a vector roof, and one memory roof per plateau of the
# working-set sweep (L1, L2, L3, DRAM) plus STREAM for main memory.

# %%
llc = max((size for _, size in peaks.memory_levels(env, spec)), default=32 << 20)
plan = peaks.make_plan(True, llc) if QUICK else peaks.make_plan(False, llc)
if QUICK:
    plan = dataclasses.replace(plan, gemm_square=(512,), gemm_tall=(), low_precision_square=(256,),
                               fma_K=(16,), fma_k=(8,), dram_array_bytes=max(2 * llc, 32 << 20),
                               sweep_lo=16 << 10, sweep_hi=max(2 * llc, 32 << 20), sweep_ratio=4.0,
                               intensity_points=((1, 1), (8, 8), (64, 8)), budget_s=0.08,
                               min_samples=3, min_sample_s=1e-3)
source = np.random.default_rng(0).standard_normal(
    max(3 * plan.dram_array_bytes, plan.sweep_hi) // 4, dtype=np.float32)
mine = {"schema_version": 1, "kind": "microbench.peaks", "machine": machine, "quick": QUICK,
        "environment": env, "spec": spec.to_dict() if spec else None, "plan": vars(plan)}
mine["gemm"] = peaks.measure_gemm(plan, env, spec, progress=False)
mine["vector"] = peaks.measure_vector(plan, spec, progress=False)
mine["bandwidth"] = peaks.measure_bandwidth(plan, spec, env, source, progress=False)
mine["sweep"] = peaks.measure_sweep(plan, spec, env, source, progress=False)
mine["intensity"] = peaks.measure_intensity(plan, spec, source, progress=False)
mine["roofs"] = peaks.derive_roofs(mine, spec)
del source
for r in mine["roofs"]["compute"] + mine["roofs"]["memory"]:
    unit = "B/s" if r["kind"] == "memory" else (
        "OP/s" if str(r.get("dtype", "")).startswith("int") else "FLOP/s")  # int8: OP/s
    print(f"{r['name']:22s} {plots.fmt_si(r['value'], unit):>14s}  ({r['source']})"
          + (f"  SUSPECT: {r['reason']}" if r["suspect"] else ""))

# %%
# CHECK: the result validates against the schema figures are drawn from; every GEMM entry
# counts 2MKN FLOPs (its bytes are checked against XLA's own count in notebook 01); every
# flagged value says why.
validate_result(mine)
for e in mine["gemm"]:
    m, k, n = e["shape"]
    assert e["flops"] == 2 * m * k * n, (e["name"], e["flops"])
for e in mine["gemm"] + mine["vector"] + mine["bandwidth"] + mine["intensity"]["points"]:
    assert not e["suspect"] or e["reason"], e["name"]
assert any(r["kind"] == "memory" for r in mine["roofs"]["memory"])
print("peaks result valid;", len(mine["roofs"]["compute"]), "compute and",
      len(mine["roofs"]["memory"]), "memory roofs")

# %%
display(plots.roofline_figure([mine]))

# %% [markdown]
# ## Step 3 · Phase points of the reference model on these roofs
#
# `measure_point` times prefill and decode of the model and predicts each from the roofs
# just measured (`microbench.phases.points`): every op of the phase at its own roof, one after
# another, plus a measured per-call floor,
# $t = t_\text{floor} + \sum_\text{ops} \max(\text{FLOPs}_\text{op}/P,\
# \text{bytes}_\text{op}/\beta)$, with $P$ the matrix roof of the model's dtype. Decode is
# timed cold (the caches evicted before every call, as inside a real step), so its $\beta$ is
# main memory's read roof whatever its working set; prefill, timed warm, is read at the
# bandwidth measured for its working set's size (the cache level that holds it). The floor
# is the dispatch cost plus a cost per compiled kernel, both measured
# (`microbench.roofs.overhead`). `measured / predicted` says how close the code gets to this
# machine's roofline (1.0 = on the roof).

# %%
PRESET, PROMPT = ("tiny", 64) if QUICK else ("bench", 256)
TIMING = Budget(budget_s=0.1, min_samples=3, min_sample_s=1e-3) if QUICK else Budget()
phases = refmodel.Phases(refmodel.init(refmodel.presets.get(PRESET), seed=0))
mine_points = [measure_point(phases, ph, 1, PROMPT, mine, TIMING, label="gqa")
               for ph in ("prefill", "decode")]
for p in mine_points:
    pred = p["predicted"]
    print(f"{PRESET} {p['phase']:8s}: {p['timing']['median'] * 1e3:8.3f} ms at I = "
          f"{p['intensity']:6.2f}; predicted {pred['bound']}-bound from {pred['memory_level']} "
          f"and {pred['compute_roof']}: measured/predicted {p['measured_over_predicted']:.2f}")

# %%
def check_not_above_prediction(measured_over_predicted, timing, roof):
    """CHECK (fails on a wrong measurement): a phase does not beat its roofline prediction:
    measured/predicted <= 1 within the spread of the point's timing ({median, p10, p90}) and
    of the roof that bounds it ({value, p10, p90}), spread = (p90 - p10) / median (or / value)."""
    tol = 1 + (timing["p90"] - timing["p10"]) / timing["median"] + \
        (roof["p90"] - roof["p10"]) / roof["value"]
    assert measured_over_predicted <= tol, (
        f"measured/predicted {measured_over_predicted:.2f} above {tol:.2f}: faster than its "
        "roofline, a wrong count or a cached working set")


# The memory level a prediction uses is one this machine measured (an invariant); below LOW a
# point is flagged (the overhead regime of a small model: a fixed per-call cost dominates).
LOW = 0.3
levels = {r["level"]: r for r in mine["roofs"]["memory"] if not r.get("suspect")}
gemms = {r["name"]: r for r in mine["roofs"]["compute"] if not r.get("suspect")}
for p in mine_points:
    pred = p["predicted"]
    assert pred["memory_level"] in levels
    roof = gemms[pred["compute_roof"]] if pred["bound"] == "compute" else \
        levels[pred["memory_level"]]
    check_not_above_prediction(p["measured_over_predicted"], p["timing"], roof)
    if p["measured_over_predicted"] < LOW:
        print(f"FLAG: {p['phase']}: measured/predicted {p['measured_over_predicted']:.2f} "
              "(overhead regime)")
print("no phase above its roofline")

# %% [markdown]
# ## Step 4 · Compare with the bundled results of other machines
#
# `figures/data/<machine>/peaks.json` and `phases.json` are written by a full
# `python -m microbench run` and committed with the machine named inside. If they are not
# there (a fresh checkout before the first full run), this step says so and skips the
# comparison; nothing is faked.

# %%
bundled, skipped = {}, []
for name in ("peaks", "phases"):
    path = DATA / f"{name}.json"
    if path.exists():
        bundled[name] = validate_result(json.loads(path.read_text()))
        print(f"loaded {path}: {bundled[name]['machine']} "
              f"({bundled[name]['environment'].get('date_utc', '?')[:10]})")
    else:
        skipped.append(str(path))
        print(f"SKIPPED: {path} not found, no comparison with another machine's {name}")

# %%
if "peaks" in bundled:
    theirs = bundled["peaks"]
    for kind in ("compute", "memory"):
        key = "dtype" if kind == "compute" else "level"
        ours = {r[key]: r["value"] for r in mine["roofs"][kind] if not r["suspect"]}
        for r in theirs["roofs"][kind]:
            if r[key] in ours and not r["suspect"]:
                print(f"{r['name']:22s}: here {plots.fmt_si(ours[r[key]], '')}, "
                      f"{theirs['machine']} {plots.fmt_si(r['value'], '')} "
                      f"(ratio {ours[r[key]] / r['value']:.2f})")
    display(plots.roofline_figure([mine, theirs], title="This machine vs the bundled results"))
if "phases" in bundled:
    for p in bundled["phases"]["points"]:
        if p["sweep"] == "roofline" and p["variant"] == "gqa":
            print(f"{bundled['phases']['machine']}: {p['phase']:17s} "
                  f"{p['timing']['median'] * 1e3:8.3f} ms, measured/predicted "
                  f"{p.get('measured_over_predicted', float('nan')):.2f}")
print(f"compared: {sorted(bundled) or 'nothing'}; skipped: {skipped or 'nothing'}")

# %% [markdown]
# The same spec table lets you place this machine among datacenter chips: its ridge point
# against theirs, for the dtype it measured best.

# %%
gemm_roofs = [r for r in mine["roofs"]["compute"] if r["name"].startswith("GEMM")
              and not r["suspect"]]
main = roofline.main_roof(mine["roofs"]["memory"], roofline.READ_WRITE, include_suspect=True)
if gemm_roofs and main:
    best = max(gemm_roofs, key=lambda r: r["value"])
    here = roofline.ridge(best, main)
    print(f"this machine: ridge {here['flops_per_byte']:.1f} FLOP/byte "
          f"({best['name']} over {main['name']})")
for name in sweeps.MODEL_DEVICES:
    print(f"{name:10s}: ridge {hardware.ridge_point(hardware.get(name)):.0f} FLOP/byte "
          "(bf16, spec)")
