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
# # 05 · Mixture of experts: why MoE decode needs large batches
#
# An MoE layer replaces one FFN by $E$ experts and a router; each token runs only the top
# $A$ of them. Per token it does the FLOPs of $A$ experts, but the model stores all $E$:
# **active** parameters set the FLOPs, **total** parameters set the memory.
#
# In decode, a batch of $B$ tokens makes $BA$ (token, expert) pairs, about $BA/E$ per expert
# once the batch touches them all. An expert's weights are read once per step for the tokens
# routed to it, so its intensity in bf16 is
#
# $$ I_\text{expert}(B) \approx \frac{BA}{E_\text{touched}(B)}, \qquad
#    E_\text{touched}(B) = E\left(1 - (1 - A/E)^B\right) $$
#
# (`refmodel.moe.expected_distinct_experts`): it tends to $BA/E$, i.e. $E/A$ times less than a
# dense FFN at the same batch. To reach a ridge of a few hundred FLOP/byte (notebook 01) the
# batch must be $E/A$ times larger.

# %%
# %matplotlib inline
import dataclasses
import os

import jax
import jax.numpy as jnp
import numpy as np
from IPython.display import display
from matplotlib.figure import Figure

import refmodel
from microbench import hardware, harness, plots
from microbench.phases import sweeps
from microbench.phases.points import Budget, measure_point
from microbench.roofline import predict, spec_roofs
from microbench.roofs import peaks
from refmodel import costs
from refmodel.moe import expected_distinct_experts

# %%
QUICK = os.environ.get("LAB_FULL", "0") != "1"  # parameter: LAB_FULL=1 for publication size
PRESET = "tiny" if QUICK else "small"
ROUTE_B, ROUTE_T = (4, 32) if QUICK else (16, 256)
BATCHES = (1, 4, 16) if QUICK else (1, 2, 4, 8, 16, 32, 64)
TIMING = Budget(budget_s=0.1, min_samples=3, min_sample_s=1e-3) if QUICK else Budget()
jax.config.update("jax_default_matmul_precision", "highest")
MACHINE = peaks.machine_label(harness.environment())
print(MACHINE, "| preset", PRESET, "| quick" if QUICK else "| full")

# %% [markdown]
# ## Step 1 · Routing: tokens per expert
#
# The router scores every expert for every token and keeps the top $A$.
# `refmodel.router_stats` runs the model and counts where each MoE layer sends its tokens.
# A freshly initialised router is close to uniform, but not exactly: some experts get more.

# %%
cfg = dataclasses.replace(refmodel.presets.get(PRESET), ffn="moe")
model = refmodel.init(cfg, seed=0)
tokens = jax.random.randint(jax.random.key(0), (ROUTE_B, ROUTE_T), 0, cfg.vocab_size, jnp.int32)
stats = {layer: np.asarray(n) for layer, n in refmodel.router_stats(model, tokens).items()}
E, A = cfg.n_experts, cfg.top_k
for layer, n in stats.items():
    print(f"layer {layer}: tokens per expert {n.tolist()}  (uniform: "
          f"{ROUTE_B * ROUTE_T * A / E:.0f}; max/mean {n.max() / n.mean():.2f})")

# %%
# CHECK: every token is routed to exactly A experts, so the counts sum to B*T*A per layer,
# and every MoE layer is reported.
for layer, n in stats.items():
    assert n.shape == (E,) and (n >= 0).all()
    assert n.sum() == ROUTE_B * ROUTE_T * A, (layer, n.sum())
assert sorted(stats) == [i for i, f in enumerate(cfg.layer_ffns) if f == "moe"]
print("tokens per expert sum to B*T*A =", ROUTE_B * ROUTE_T * A)

# %%
fig = Figure(figsize=(9, 4.5), layout="constrained")
ax = fig.add_subplot()
width = 0.8 / len(stats)
for j, (layer, n) in enumerate(stats.items()):
    ax.bar(np.arange(E) + (j - (len(stats) - 1) / 2) * width, n, width, label=f"layer {layer}")
ax.axhline(ROUTE_B * ROUTE_T * A / E, color="black", ls="--", label="uniform B·T·A/E")
ax.set_xlabel("Expert")
ax.set_ylabel("Tokens routed")
ax.set_title(f"Router load of '{PRESET}' MoE (E={E}, A={A}) on {ROUTE_B}x{ROUTE_T} random tokens")
ax.legend()
display(fig)

# %% [markdown]
# ### A trained router
#
# A random router is close to uniform; a trained one is not, and nothing in this model asks it
# to be (no load-balancing loss). `python -m refmodel train --recipe target-moe` trains
# `byte-target-moe` (top-2 of 8 experts, ~6M of ~17M parameters active) on the Python
# standard library's source (`refmodel.training`; the README gives its time; the checkpoint
# is cached per user). With `LAB_FULL=1` (which trains it first if it is not cached) the
# cells below route validation text, which it never trained on, through it and through the
# same architecture freshly initialised.

# %%
from refmodel import training  # noqa: E402

moe_recipe = training.recipes.get("target-moe")
TRAINED = not QUICK  # the quick run (CI) leaves it out: loading and routing take ~15 s
if TRAINED:
    trained_moe = training.trained("target-moe")
    untrained = refmodel.init(trained_moe.cfg, seed=0)
    text = jnp.asarray(training.data.load().val[:8 * 256].reshape(8, 256).astype(np.int32))
    loads = {name: {layer: np.asarray(n) for layer, n in refmodel.router_stats(m, text).items()}
             for name, m in (("trained", trained_moe), ("initialised", untrained))}
    imbalance = {name: np.mean([n.max() / n.mean() for n in s.values()])
                 for name, s in loads.items()}
    for layer, n in loads["trained"].items():
        print(f"layer {layer}: {n.tolist()}  max/mean {n.max() / n.mean():.2f}")
    print({k: round(float(v), 2) for k, v in imbalance.items()}, "(mean over layers of max/mean)")
else:
    print("quick run: the trained router is shown with LAB_FULL=1")

# %%
def check_trained_less_even(imbalance_trained, imbalance_initialised):
    """CHECK (fails on a wrong measurement): training made the router's load less even than
    the same router freshly initialised (each: the mean over layers of max/mean tokens per
    expert)."""
    assert imbalance_trained > imbalance_initialised, (
        f"trained max/mean {imbalance_trained:.2f} is not above the initialised router's "
        f"{imbalance_initialised:.2f}")


# Every validation token is routed to top_k experts in every layer (an invariant), and the
# measured load is checked.
if TRAINED:
    tokens_a = text.size * trained_moe.cfg.top_k
    assert all(n.sum() == tokens_a for s in loads.values() for n in s.values())
    check_trained_less_even(imbalance["trained"], imbalance["initialised"])
    fig = Figure(figsize=(9, 4), layout="constrained")
    ax = fig.add_subplot()
    n_layers, E_t = len(loads["trained"]), trained_moe.cfg.n_experts
    width = 0.8 / n_layers
    for j, (layer, n) in enumerate(loads["trained"].items()):
        ax.bar(np.arange(E_t) + (j - (n_layers - 1) / 2) * width, n / n.sum(), width,
               label=f"layer {layer}")
    ax.axhline(1 / E_t, color="black", ls="--", label="uniform 1/E")
    ax.set_xlabel("Expert")
    ax.set_ylabel("Share of routed tokens")
    ax.set_title(f"Trained byte-target-moe on {text.size} validation bytes: max/mean "
                 f"{imbalance['trained']:.2f} (initialised: {imbalance['initialised']:.2f})")
    ax.legend(ncol=2, fontsize=8)
    display(fig)

# %% [markdown]
# ## Step 2 · Active vs total parameters of real MoE models
#
# `refmodel.costs.param_counts` derives both from the architecture alone (no fitted numbers);
# the model cards state them, so the counts can be checked.

# %%
CARDS = {  # model card: (total, active, which count the card uses for "active")
    "mixtral-8x7b": (46.7e9, 12.9e9, "active"),
    "deepseek-v3": (671e9, 37e9, "active"),
    "qwen3-30b-a3b": (30.5e9, 3.3e9, "active"),
    "gpt-oss-120b": (116.83e9, 5.13e9, "active_without_embedding"),
}
counted = {name: costs.param_counts(refmodel.presets.get(name)) for name in CARDS}
for name, pc in counted.items():
    c = refmodel.presets.get(name)
    print(f"{name:14s}: total {pc['total'] / 1e9:7.2f}B, active {pc[CARDS[name][2]] / 1e9:6.2f}B "
          f"({pc[CARDS[name][2]] / pc['total']:.1%}); E={c.n_experts}, A={c.top_k}; card "
          f"{CARDS[name][0] / 1e9:g}B / {CARDS[name][1] / 1e9:g}B")

# %%
# CHECK: the counts (from the architecture alone) match the model cards within 3%, and
# active < total.
for name, pc in counted.items():
    assert pc["active"] < pc["total"]
    np.testing.assert_allclose([pc["total"], pc[CARDS[name][2]]], CARDS[name][:2], rtol=0.03,
                               err_msg=name)
print("active/total parameters match the model cards")

# %% [markdown]
# ## Step 3 · Expert intensity at batch B
#
# Counted for DeepSeek-V3 (E = 256, A = 8) in bf16: the routed experts' up and down
# projections, against $BA/E_\text{touched}(B)$ (until, at batches of many thousands, the
# activations' bytes start to rival the weights'). Then measured: the decode FFN of the
# notebook's MoE model at a few batches. The model runs each expert on its own rows only
# (`MoE.grouped_experts`: with XLA's products a loop per expert of ceil(rows / tile) trips, zero
# trips for an expert no token chose; with the native kernels one grouped call per matrix, each
# expert with rows read once), so, like a grouped GPU kernel, it reads only the touched experts,
# which is what the count models. DeepSeek-V3 is counted in bf16, though its weights ship in fp8: in
# fp8 every intensity below about doubles (the same FLOPs from half the weight bytes).

# %%
ds = refmodel.presets.get("deepseek-v3")
ALL_B = (1, 4, 16, 64, 256, 1024, 4096)


def routed_intensity(c, B):
    ops = costs.phase_costs(c, "decode_ffn", B, 0)["ops"]
    up, down = ops["ffn_up"], ops["ffn_down"]
    return (up["flops"] + down["flops"]) / (up["bytes"] + down["bytes"])


ds_int = {B: routed_intensity(ds, B) for B in ALL_B}
for B, i in ds_int.items():
    touched = expected_distinct_experts(B, ds.n_experts, ds.top_k)
    print(f"B={B:6d}: experts touched {touched:6.1f} of {ds.n_experts}, per-expert tokens "
          f"{B * ds.top_k / touched:7.1f}, routed-expert I = {i:7.1f} FLOP/byte")
phases = refmodel.Phases(model)
moe_pts = {B: measure_point(phases, "decode_ffn", B, 0, None, TIMING, label="moe")
           for B in BATCHES}
for B, p in moe_pts.items():
    print(f"measured '{PRESET}' MoE decode FFN B={B:3d}: {p['timing']['median'] * 1e3:.3f} ms, "
          f"I = {p['intensity']:.2f}, {plots.fmt_si(p['flops_per_s']['median'], 'FLOP/s')}")

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


# Routed-expert intensity is B*A / E_touched(B) (within 10%: the activation function adds
# FLOPs, the activations add bytes), tending to B*A/E (the count against the formula).
for B, i in ds_int.items():
    touched = expected_distinct_experts(B, ds.n_experts, ds.top_k)
    np.testing.assert_allclose(i, B * ds.top_k / touched, rtol=0.1, err_msg=str(B))
np.testing.assert_allclose(ds_int[4096], 4096 * ds.top_k / ds.n_experts, rtol=0.1)
np.testing.assert_allclose(expected_distinct_experts(1, E, A), A)
SPEC = hardware.device_for_environment(harness.environment())
PEAK32 = SPEC.peak_flops["float32"] if SPEC is not None and "float32" in SPEC.peak_flops \
    else None
for p in moe_pts.values():
    check_under_peak(p["flops_per_s"], PEAK32)
print("expert intensity ~ B*A/E_touched; measured points under the spec peak")

# %% [markdown]
# ## Step 4 · The batch that reaches the ridge
#
# With the roofline model of a decode FFN step (`microbench.phases.sweeps.step_time`, bf16
# weights on an H100), find the smallest batch at which the FFN becomes compute-bound, for a
# dense model and for MoE models: the MoE needs about $E/A$ times the batch.
#
# Stated simplifications: none of these models' bf16 weights fits one H100 (80 GB) except
# Qwen3-30B-A3B (printed below); the roofline of one H100 still gives the answer, because
# split over $n$ chips (tensor or expert parallelism) each chip does $1/n$ of the FLOPs and
# reads $1/n$ of the bytes, so the intensity, hence the batch at the ridge, is unchanged.
# Every model is counted in bf16. DeepSeek-V3 ships fp8 weights, and what that changes depends
# on the arithmetic: fp8 weights widened to bf16 for bf16 arithmetic halve the weight bytes at
# the same FLOPs and bf16 ridge, so the FFN reaches it at about half the batch; computed in
# fp8 on fp8 tensor cores, the peak doubles too (an H100's fp8 ridge is twice its bf16 one),
# the two cancel, and the batch is about the one of bf16. Both are counted after the table.

# %%
h100 = hardware.get("H100 SXM")
POW2 = tuple(2**i for i in range(0, 17))
MODELS = ("llama3-70b", "mixtral-8x7b", "qwen3-30b-a3b", "deepseek-v3")


def ridge_batch(c):
    """Smallest power-of-two batch whose decode FFN is compute-bound on the H100."""
    return next((B for B in POW2
                 if sweeps.step_time(c, h100, "decode_ffn", B, 0)["bound"] == "compute"), None)


need = {name: ridge_batch(refmodel.presets.get(name)) for name in MODELS}
for name, B in need.items():
    c = refmodel.presets.get(name)
    ea = f"E/A = {c.n_experts / c.top_k:g}" if c.ffn == "moe" else "dense"
    n_h100 = -(-2 * costs.param_counts(c)["total"] // h100.memory_bytes)
    print(f"{name:14s} ({ea:9s}): decode FFN compute-bound on H100 roofs from batch ~{B} "
          f"(bf16 weights need {n_h100:.0f} H100)")


def ridge_batch_fp8(c, compute):
    """ridge_batch with fp8 weights, activations in `compute` (bfloat16: weights widened for
    bf16 arithmetic; float8: fp8 arithmetic), on the H100's roofs of that dtype."""
    roofs = spec_roofs(h100, compute)
    for B in POW2:
        k = costs.phase_costs(c, "decode_ffn", B, 0, weight_dtype="float8", kv_dtype=compute,
                              act_dtype=compute, count="engine")
        if predict(k["flops"], k["bytes"], *roofs)["bound"] == "compute":
            return B
    return None


ds_fp8 = {compute: ridge_batch_fp8(ds, compute) for compute in ("bfloat16", "float8")}
print(f"deepseek-v3 with its fp8 weights: bf16 arithmetic from batch ~{ds_fp8['bfloat16']} "
      f"(ridge {hardware.ridge_point(h100):.0f}), fp8 arithmetic from batch "
      f"~{ds_fp8['float8']} (ridge {hardware.ridge_point(h100, 'float8'):.0f})")

# %%
def check_moe_ridge_batches(dense, moe, deepseek, fp8_bf16_math, fp8_math):
    """CHECK (fails on a wrong count): every MoE model ({name: batch}) needs a larger batch at
    the ridge than the dense one, DeepSeek-V3 (E/A = 32) more than 10x; its fp8 weights with
    bf16 arithmetic reach the ridge at about half its bf16 batch (a quarter to three
    quarters), with fp8 arithmetic at about the same batch (half to twice)."""
    for name, b in moe.items():
        assert b > dense, f"{name} reaches the ridge at batch {b}, not after dense's {dense}"
    assert deepseek >= 10 * dense, f"deepseek-v3 at batch {deepseek}, not 10x dense's {dense}"
    assert 0.25 * deepseek <= fp8_bf16_math <= 0.75 * deepseek, (
        f"fp8 weights, bf16 arithmetic: batch {fp8_bf16_math} against bf16's {deepseek}")
    assert 0.5 * deepseek <= fp8_math <= 2 * deepseek, (
        f"fp8 arithmetic: batch {fp8_math} against bf16's {deepseek}")


check_moe_ridge_batches(need["llama3-70b"], {n: need[n] for n in MODELS[1:]},
                        need["deepseek-v3"], ds_fp8["bfloat16"], ds_fp8["float8"])
# A batch-1 decode step reads exactly the active weights (all but the embedding table, of
# which one row), about 5% of the model.
pc = counted["deepseek-v3"]
w1 = costs.phase_costs(ds, "decode", 1, 16)["weight_bytes"]
np.testing.assert_allclose(w1, 2 * (pc["active"] - ds.vocab_size * ds.d_model + ds.d_model))
assert w1 < 0.1 * 2 * pc["total"]
print("MoE decode needs", need["deepseek-v3"] // need["llama3-70b"], "x the dense batch")

# %%
fig = Figure(figsize=(9, 6), layout="constrained")
ax = fig.add_subplot()
for j, name in enumerate(MODELS):
    c = refmodel.presets.get(name)
    ax.plot(POW2, [costs.phase_costs(c, "decode_ffn", B, 0)["intensity"] for B in POW2], "o-",
            ms=4, color=plots.PALETTE[j], label=f"{name}" + (f" (E={c.n_experts}, A={c.top_k})"
                                                            if c.ffn == "moe" else " (dense)"))
ax.axhline(hardware.ridge_point(h100), color="black", ls="--",
           label=f"H100 bf16 ridge {hardware.ridge_point(h100):.0f} FLOP/B")
ax.set_xscale("log", base=2)
ax.set_yscale("log")
ax.set_xlabel("Batch (tokens decoded per step)")
ax.set_ylabel("Decode-FFN intensity (FLOP / byte, bf16)")
ax.set_title("MoE FFN intensity grows ~B·A/E: it reaches the ridge E/A times later")
ax.legend()
display(fig)
