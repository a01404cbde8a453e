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
# # 11 · Parallelism: one model, many devices
#
# A 70B model in bfloat16 is 140 GB of weights: it does not fit one 80 GB GPU, and even where
# it fits, a decode step that reads every weight from one chip's memory takes
# $\text{bytes} / \beta$ (notebook 02). Splitting the model over $p$ chips divides both the
# memory and the bytes each chip reads by about $p$, and adds a new cost: the chips must
# exchange activations over a link that is several times slower than their memory.
#
# `refmodel.parallel` splits a model over a **mesh** of devices with three named axes:
#
# - **data**: replicas, each with the whole model and its own sequences;
# - **tensor**: Megatron tensor parallelism (Shoeybi et al. 2019), each layer's heads and FFN
#   width split, one all-reduce of the activations after each attention and FFN block;
# - **expert**: expert parallelism (GShard, Lepikhin et al. 2020), a MoE layer's experts
#   split, (token, expert) pairs sent to their expert's device and back by all-to-all.
#
# The same `refmodel.forward`, `prefill` and `decode_step` run on the split model as one SPMD
# program (every device runs the same code on its part of the data). Eight steps:
#
# 1. the devices and the mesh;
# 2. a dense model split over tensor x data: where each weight lives, and equal outputs;
# 3. the collectives XLA inserted, against the ones the cost model counts;
# 4. expert parallelism on a MoE model: the all-to-alls and their bytes;
# 5. a degree that does not divide the heads is refused;
# 6. the arithmetic at scale: Llama 3 70B over 1 to 8 H100s, DeepSeek-V3's all-to-alls;
# 7. the measured collectives of this machine;
# 8. the same code on a GPU node, a TPU slice and across hosts.

# %%
# %matplotlib inline
import json

import jax
import numpy as np
from IPython.display import display
from matplotlib.figure import Figure

import refmodel
from microbench import machines
from microbench.studies.scale import chip_of, links_of
from refmodel import costs, parallel, presets
from refmodel.moe import MoE
from refmodel.parallel import comms, hlo

# 8 emulated CPU devices. Importing starts no JAX backend; the first call that does (here,
# jax.devices() in step 1) must come after this line. On a GPU or TPU machine it is not
# needed, and changes nothing there.
jax.config.update("jax_num_cpu_devices", 8)

# %%
SEED, B, PROMPT, NEW = 0, 4, 8, 4  # steps 2-4: batch, prompt length, tokens decoded
SPEC_GPU = "H100 SXM"  # step 6's chip; its scale-up link (NVLink 4) and scale-out link
BIG, BIG_CONTEXT, BIG_BATCHES = "llama3-70b", 4096, (1, 64)
EP, EP_TOKENS = 32, (1, 4, 16, 64, 256)  # step 6: DeepSeek-V3's expert degree, tokens/device
DATA = machines.data_folder("collectives")  # figures/data/<machine>/: one machine's runs
rng = np.random.default_rng(SEED)

# %% [markdown]
# ## 1 · The devices and the mesh
#
# This machine has no accelerator: `jax_num_cpu_devices` splits its CPU backend into 8
# **emulated devices**. They are threads of one process sharing one memory, so a
# "collective" between them is a memory copy: everything below checks *what* is computed and
# communicated, and nothing here is a speed measurement (step 6 does the arithmetic for real
# chips, on paper).
#
# `make_mesh(data, tensor, expert)` arranges the first data x tensor x expert devices in a
# grid with those three named axes. The expert axis is also a batch axis: outside the MoE
# layers each device of an expert group runs attention on its own sequences (DeepSeek-V3's
# data-parallel attention), so a batch splits over data x expert (`parallel.BATCH`).

# %%
devices = jax.devices()
print(f"{len(devices)} devices: {devices[0].platform}, {[d.id for d in devices]}")
mesh8 = parallel.make_mesh(data=2, tensor=2, expert=2)
print("mesh", parallel.degrees(mesh8), "| batch axes", parallel.BATCH,
      "| a batch splits", parallel.batch_ways(mesh8), "ways")
print("device ids in the grid [data, tensor, expert]:")
print(np.vectorize(lambda d: d.id)(mesh8.devices))

# %%
# CHECK: 8 CPU devices, a 2 x 2 x 2 grid holding each once, batch over data x expert.
assert len(devices) == 8 and devices[0].platform == "cpu"
assert mesh8.devices.shape == (2, 2, 2) and mesh8.axis_names == parallel.AXES
assert sorted(d.id for d in mesh8.devices.flat) == list(range(8))
assert parallel.batch_ways(mesh8) == 4

# %% [markdown]
# ## 2 · A dense model split over tensor x data
#
# Megatron splits each block in two matrix products so that it needs **one** all-reduce.
# Attention: $W_q, W_k, W_v$ are split by **columns** (by head), so each device computes
# the queries, keys and values of its own heads and runs attention on them with no
# communication at all, since heads do not interact. $W_o$ is split by **rows** (the same
# heads): each device's product $o_i W_{o,i}$ is a partial sum of the output
# $y = \sum_i o_i W_{o,i}$, and one all-reduce of $y$ [tokens, D] completes it. The FFN is the
# same: $W_\text{gate}, W_\text{up}$ by columns (the activation is elementwise, so each
# column's $h$ is local), $W_\text{down}$ by rows, one all-reduce. Split the other way
# (rows first) and the activation would need the full sum before it: a collective in the
# middle of every block.
#
# `parallel.shard` returns a copy of the model with each parameter placed as its module's
# `sharding` rule says; the original stays on one device. On a data=2 x tensor=2 mesh each
# weight is split between the two devices of a tensor group and repeated across data.

# %%
cfg = presets.get("tiny")
model = refmodel.init(cfg, seed=SEED)
mesh = parallel.make_mesh(data=2, tensor=2)
sharded = parallel.shard(model, mesh)
print(cfg.name, f"D={cfg.d_model} N={cfg.n_heads} K={cfg.n_kv_heads} H={cfg.head_dim} "
      f"F={cfg.d_ff} V={cfg.vocab_size} L={cfg.n_layers}", "| mesh", parallel.degrees(mesh))
block = sharded.blocks[0]
weights = {"attn.wq": block.attn.wq, "attn.wk": block.attn.wk, "attn.wo": block.attn.wo,
           "ffn.w_up": block.ffn.w_up, "ffn.w_down": block.ffn.w_down,
           "lm_head": sharded.lm_head, "embed": sharded.embed.embedding}
print(f"{'weight':>11} {'shape':>10} {'spec':>20} {'one shard':>10} {'devices':>7}")
for name, w in weights.items():
    a = w[...]
    shard0 = a.addressable_shards[0].data.shape
    print(f"{name:>11} {str(a.shape):>10} {str(a.sharding.spec):>20} {str(shard0):>10} "
          f"{len(a.sharding.device_set):>7}")

# %%
# CHECK: wq [D, N, H] is split by heads (its output) and wo [N, H, D] by heads (its input)
# between the two devices of a tensor group, the pieces put back together are the unsharded
# weight, the embedding is whole everywhere.
D, N, H = cfg.d_model, cfg.n_heads, cfg.resolved_head_dim
wq, wo = block.attn.wq[...], block.attn.wo[...]
assert {s.data.shape for s in wq.addressable_shards} == {(D, N // 2, H)}
assert {s.data.shape for s in wo.addressable_shards} == {(N // 2, H, D)}
assert {s.data.shape for s in block.ffn.w_down[...].addressable_shards} == {(cfg.d_ff // 2, D)}
group = [d for d in mesh.devices[0, :, 0]]  # data row 0: its two tensor devices
pieces = {s.device: np.asarray(s.data) for s in wq.addressable_shards}
np.testing.assert_array_equal(np.concatenate([pieces[d] for d in group], axis=1),
                              np.asarray(model.blocks[0].attn.wq[...]))
assert {s.data.shape for s in sharded.embed.embedding[...].addressable_shards} == \
    {(cfg.vocab_size, D)}
assert len(model.blocks[0].attn.wq[...].sharding.device_set) == 1  # the original: untouched

# %% [markdown]
# The forward pass on the split model is the same call. Its logits must equal the
# unsharded model's, up to float32 rounding (the all-reduce sums partial products in a
# different order), and so must prefill of a prompt followed by token-by-token decode, with
# a cache that `parallel.init_cache` places on the mesh: each device keeps its sequences'
# rows (data) of its own KV heads (tensor).

# %%
tokens = rng.integers(0, cfg.vocab_size, (B, PROMPT + NEW))
want = np.asarray(refmodel.forward(model, tokens))  # [B, T, V] on one device
got = refmodel.forward(sharded, tokens)
print("forward logits", got.shape, "spec", got.sharding.spec)

cache = parallel.init_cache(sharded, B, PROMPT + NEW)
print("cache k", cache.layers[0].k.shape, "spec", cache.layers[0].k.sharding.spec)
logits, cache = refmodel.prefill(sharded, tokens[:, :PROMPT], cache)
steps = [np.asarray(logits)]
for t in range(PROMPT, PROMPT + NEW - 1):
    step, cache = refmodel.decode_step(sharded, tokens[:, t], cache)
    steps.append(np.asarray(step)[:, None])
incremental = np.concatenate(steps, axis=1)  # [B, T - 1, V]

# %%
# CHECK: sharded forward == unsharded forward; sharded prefill + decode == unsharded forward.
np.testing.assert_allclose(np.asarray(got), want, rtol=1e-4, atol=1e-4)
np.testing.assert_allclose(incremental, want[:, :-1], rtol=1e-4, atol=1e-4)
K, S = cfg.n_kv_heads, PROMPT + NEW
assert {s.data.shape for s in cache.layers[0].k.addressable_shards} == \
    {(B // 2, K // 2, S, cfg.resolved_head_dim)}  # rows by data, KV heads by tensor
print("max |sharded - unsharded|:", float(np.max(np.abs(np.asarray(got) - want))))

# %% [markdown]
# **MLA's cache does not shrink with TP.** GQA's cache holds K key/value heads, so each of
# the tensor devices keeps K / tensor of them. Multi-head latent attention (DeepSeek-V2/V3)
# caches one latent vector of rank R per token, shared by **every** head: each head's keys
# and values are up-projected from it. A device that runs N / tensor heads still needs the
# whole latent, so the latent cache is split by batch only. Per device, MLA's cache is small
# to begin with, but TP does not make it smaller; only more sequences per device (data or
# expert axes) do.

# %%
mla_cfg = cfg.replace(attention="mla")
mla_cache = parallel.shard_cache(mla_cfg, refmodel.init_cache(mla_cfg, B, PROMPT + NEW), mesh)
for field in ("latent", "k_rope"):
    a = getattr(mla_cache.layers[0], field)
    print(f"MLA {field:>7} {a.shape} spec {a.sharding.spec}, one shard "
          f"{a.addressable_shards[0].data.shape}")
print(f"GQA       k {cache.layers[0].k.shape}, one shard "
      f"{cache.layers[0].k.addressable_shards[0].data.shape}")

# %%
# CHECK: the latent cache is split over the batch axes only: each device holds all R
# dimensions of its sequences' latents, where GQA's holds K / 2 of the heads.
latent = mla_cache.layers[0].latent
assert {s.data.shape for s in latent.addressable_shards} == {(B // 2, PROMPT + NEW,
                                                              mla_cfg.kv_lora_rank)}

# %% [markdown]
# ## 3 · The collectives XLA inserted
#
# Only the batch axes are written by hand (a `shard_map` over data x expert); the tensor
# axis is left to XLA's SPMD partitioner, which sees weights split by columns and rows and
# inserts the communication itself. The compiled program's HLO text says what it chose:
# `hlo.found` lists every collective with its bytes per device. Megatron's split predicts,
# per decode step with $n$ tokens per device: one all-reduce of $[n, D]$ after each
# attention block and each FFN ($2L$ of them), and one all-gather of the float32 logits
# $[n, V]$ at the end, because the LM head is split by vocabulary. `comms.collectives` is that
# prediction, the communication half of the cost model.

# %%
phases = refmodel.Phases(sharded)
compiled = phases.jitted["decode"].lower(*phases.example_args("decode", B, PROMPT)).compile()
text = compiled.as_text()
found = hlo.found(text)
print(f"decode, batch {B} over data=2 (n = {B // 2} tokens per device), tensor=2:")
for c in found:
    print(f"  {c['kind']:>10}  {c['nbytes']:>5} B")
line = next(x for x in text.splitlines() if " all-reduce(" in x or "all-reduce-start(" in x)
print("one of them in the HLO:", line.strip()[:150], "...")
expected = comms.collectives(cfg, "decode", B, PROMPT, mesh)
print("the cost model:")
for c in expected:
    print(f"  {c.count} x {c.kind:>10}  {c.nbytes:>5.0f} B over {c.group} devices, after {c.op}")
prefill_check = hlo.check(sharded, "prefill", B, PROMPT)
print("prefill:", prefill_check["found"], "agree:", prefill_check["agree"])

# %%
# CHECK: 2L all-reduces of [n, D] float32 and one all-gather of [n, V] float32 logits,
# the same kinds, counts and bytes as comms.collectives, in decode and in prefill.
n = B // parallel.batch_ways(mesh)
reduces = [c for c in found if c["kind"] == "all-reduce"]
gathers = [c for c in found if c["kind"] == "all-gather"]
assert len(reduces) == 2 * cfg.n_layers and {c["nbytes"] for c in reduces} == {n * D * 4}
assert len(gathers) == 1 and gathers[0]["nbytes"] == n * cfg.vocab_size * 4
assert {c["group"] for c in reduces} == {2}  # within each tensor pair
assert hlo.by_kind(found) == hlo.by_kind(expected)
assert prefill_check["agree"], prefill_check

# %% [markdown]
# ## 4 · Expert parallelism
#
# A MoE layer's experts split over the expert axis: on expert=2, each device holds E / 2 of
# them. A token may choose experts held anywhere, so after routing each device sends every
# (token, expert) pair to its expert's device, which runs its experts on the rows it got and
# sends the outputs back (`MoE.expert_parallel`): **three all-to-alls per MoE layer**, the
# rows, their expert ids and the outputs.
#
# An all-to-all needs static shapes, and which device a pair goes to is only known at run
# time. This implementation sends a fixed buffer of $C = nA$ rows to each of the $ep$
# destinations ($n$ tokens per device, $A$ experts per token): room for the case where every
# pair goes to one device, so no token is ever dropped, at $ep$ times the bytes of an exact
# (ragged) all-to-all, which moves only the $nA$ rows that exist (what DeepEP does on GPUs;
# `count="engine"` in the cost model).
#
# EP needs batch. The expert axis is also a batch axis, so an expert group of $ep$ devices
# needs at least $ep$ sequences at once; and each expert's weights are read once per step
# however few tokens chose it, so it takes many tokens per expert (about $\text{batch} \cdot
# A / E$) to make that read pay. Here on all three axes (2 x 2 x 2), with a batch of 8. The
# tensor axis splits attention (its all-reduces stay); the MoE layer is not split over it,
# so both devices of a tensor pair hold the same experts and compute the same rows.

# %%
moe_cfg = cfg.replace(ffn="moe")
moe = refmodel.init(moe_cfg, seed=SEED)
moe_sharded = parallel.shard(moe, mesh8)
B_MOE = 8
w_up = moe_sharded.blocks[0].ffn.w_up[...]
print(f"E={moe_cfg.n_experts} A={moe_cfg.top_k}; w_up {w_up.shape} spec {w_up.sharding.spec}, "
      f"one shard {w_up.addressable_shards[0].data.shape}")
moe_tokens = rng.integers(0, cfg.vocab_size, (B_MOE, PROMPT))
moe_want = np.asarray(refmodel.forward(moe, moe_tokens))
moe_got = np.asarray(refmodel.forward(moe_sharded, moe_tokens))
moe_check = hlo.check(moe_sharded, "decode", B_MOE, PROMPT)
print("decode, found in the HLO:", moe_check["found"])

n_moe, A = B_MOE // parallel.batch_ways(mesh8), moe_cfg.top_k  # tokens per device, top-k
impl = comms.collectives(moe_cfg, "decode", B_MOE, PROMPT, mesh8)
exact = comms.collectives(moe_cfg, "decode", B_MOE, PROMPT, mesh8, count="engine")
print(f"n = {n_moe} tokens per device, C = nA = {n_moe * A} rows per destination")
print(f"{'op':>10} {'kind':>11} {'count':>5} {'padded B':>9}   {'exact B':>7}")
exact_of = {(e.kind, e.op): e.nbytes for e in exact}
for c in impl:
    ids = c.kind == "all-to-all" and c.nbytes == c.group * n_moe * A * comms.ID_BYTES
    ex = "      -" if ids else f"{exact_of[c.kind, c.op]:7.0f}"  # exact: no separate ids
    print(f"{c.op:>10} {c.kind:>11} {c.count:>5} {c.nbytes:>9.0f}   {ex}")

# %%
# CHECK: the EP forward equals the unsharded one; 3 all-to-alls per MoE layer, of the sizes
# the padded buffers give (rows ep C D float32, ids ep C int32), as the cost model says;
# the padded row buffers are ep times the exact all-to-all's n A D.
np.testing.assert_allclose(moe_got, moe_want, rtol=1e-4, atol=1e-4)
ep, C = parallel.degrees(mesh8)["expert"], n_moe * A
a2a = moe_check["found"]["all-to-all"]
assert a2a["count"] == 3 * moe_cfg.n_layers
assert a2a["bytes"] == moe_cfg.n_layers * (2 * ep * C * D * 4 + ep * C * 4)
assert moe_check["agree"], moe_check
rows_impl = [c.nbytes for c in impl if c.kind == "all-to-all" and c.op == "combine"]
rows_exact = [c.nbytes for c in exact if c.kind == "all-to-all" and c.op == "combine"]
assert rows_impl == [ep * rows_exact[0]] and rows_exact == [n_moe * A * D * 4]

# %% [markdown]
# ## 5 · A degree that does not divide is refused
#
# Tensor parallelism splits heads: tensor=8 cannot split `tiny`'s 4 query heads, and
# tensor=4 cannot split its 2 key/value heads. (Engines give each device one KV head when
# there are fewer KV heads than devices, replicating them; this code refuses, and the cost
# model's `tensor_config` counts the engines' way.) The batch must split over data x
# expert. Each error names the field and the fix, before anything compiles.

# %%
errors = {}
for label, make in {
    "tensor=8": lambda: parallel.shard(model, parallel.make_mesh(tensor=8)),
    "tensor=4": lambda: parallel.shard(model, parallel.make_mesh(tensor=4)),
    "batch=2 on data=4": lambda: refmodel.forward(
        parallel.shard(model, parallel.make_mesh(data=4)), tokens[:2]),
}.items():
    try:
        make()
    except ValueError as e:
        errors[label] = str(e)
        print(f"{label}: ValueError: {e}")

# %%
# CHECK: each one raised, naming what it could not split.
assert "n_heads=4" in errors["tensor=8"]
assert "n_kv_heads=2" in errors["tensor=4"]
assert "batch=2" in errors["batch=2 on data=4"] and "data=4" in errors["batch=2 on data=4"]

# %% [markdown]
# ## 6 · The arithmetic at scale
#
# Everything so far ran on 8 threads. For real chips, `comms.per_device` counts one device's
# share of a phase: FLOPs, weight and KV bytes read, and its collectives; `comms.step_time`
# puts it on a roofline (the chip's spec FLOP/s and memory bandwidth) plus the collectives on
# a link, not overlapped with compute (each all-reduce waits for the layer it sums): a step
# takes $\max(\text{compute}, \text{memory}) + \text{comm}$. A ring all-reduce of $S$ bytes
# over $p$ devices takes $2(p-1)(\ell + S / p / b)$ on a link of bandwidth $b$ and latency
# $\ell$ per message. Nothing here is measured: these are spec-sheet bounds.
#
# Llama 3 70B in bfloat16, decode at context 4096 on H100 SXM, tensor-parallel over NVLink 4
# (8 GPUs per NVLink domain):

# %%
chip = chip_of(SPEC_GPU)
nvlink, network, domain = links_of(SPEC_GPU)
big = presets.get(BIG)
print(f"{SPEC_GPU}: {chip.flops / 1e12:.0f} TFLOP/s bf16, {chip.bandwidth / 1e12:.2f} TB/s, "
      f"{chip.memory / 1e9:.0f} GB | {nvlink.name}: {nvlink.bandwidth / 1e9:.0f} GB/s per "
      f"direction, {nvlink.latency * 1e6:.1f} us | {domain} GPUs per domain | beyond: "
      f"{network.name} {network.bandwidth / 1e9:.0f} GB/s, {network.latency * 1e6:.1f} us")


def tp_row(batch, tp, link=None):
    """One device's share of a decode step at tensor=tp, timed on the chip and a link (by
    default the scale-up link within a domain; a ring that leaves it runs at the network's
    speed, its slowest hop)."""
    share = comms.per_device(big, "decode", batch, BIG_CONTEXT, {"tensor": tp},
                             weight_dtype="bfloat16")
    link = link or (nvlink if tp <= domain else network)
    t = comms.step_time(share, chip.flops, chip.bandwidth, link.bandwidth, link.latency)
    no_latency = comms.step_time(share, chip.flops, chip.bandwidth, link.bandwidth, 0.0)
    fits = share["weight_bytes"] + share["kv_bytes"] <= chip.memory
    return {"batch": batch, "tp": tp, "link": link.name, "fits": fits, **share, **t,
            "latency": t["comm"] - no_latency["comm"]}


TPS = comms.tensor_degrees(big, 64)  # 1 ... 64: the degrees that split its heads and FFN
rows6 = [tp_row(b, tp) for b in BIG_BATCHES for tp in TPS]
print(f"{'batch':>5} {'TP':>3} {'weights':>8} {'KV':>7} {'fits':>5} {'compute':>8} "
      f"{'weights':>8} {'KV':>6} {'all-red.':>8} {'step':>6} {'speedup':>7} {'GPU-ms':>6}")
print(f"{'':>9} {'GB per device':>16} {'':>5} {'ms':>8} {'ms':>8} {'ms':>6} {'ms':>8} "
      f"{'ms':>6} {'vs TP/2':>7}")
for r in rows6:
    if r["tp"] > domain:
        continue
    prev = next((p for p in rows6 if p["batch"] == r["batch"] and p["tp"] == r["tp"] // 2),
                None)
    speed = f"{prev['total'] / r['total']:7.2f}" if prev and r["tp"] > 1 else f"{'':>7}"
    print(f"{r['batch']:>5} {r['tp']:>3} {r['weight_bytes'] / 1e9:8.2f} "
          f"{r['kv_bytes'] / 1e9:7.2f} {'yes' if r['fits'] else 'no':>5} "
          f"{r['compute'] * 1e3:8.3f} {r['weights'] * 1e3:8.2f} {r['kv'] * 1e3:6.2f} "
          f"{r['comm'] * 1e3:8.3f} {r['total'] * 1e3:6.2f} {speed} "
          f"{r['tp'] * r['total'] * 1e3:6.1f}")
print("fits: weights + KV within the GPU's memory (activations and runtime left out); "
      "GPU-ms: TP x step, the cost of one step in GPU time")

# %% [markdown]
# Read the table row by row. The weights and the KV cache split by TP, so the memory time
# halves with each doubling. The all-reduces do not shrink: each moves $[n, D]$ whatever the
# degree, and costs $2(p-1)$ message latencies, two per layer, so at batch 1 the
# communication is almost all latency and grows with $p$. Each doubling buys less than 2x,
# and the GPU time per step (the column on the right) rises: TP buys latency, not
# throughput per GPU. Below, where TP stops paying: the smallest degree that holds the
# weights and the cache, and the first degree whose step is no faster than the one before,
# past the 8-GPU domain (where the ring runs at the network's speed) and, for comparison, on
# a hypothetical NVLink domain of 64 GPUs.

# %%
def first_slower(rows):
    """The first TP whose step is no faster than half its degree's (None: every one pays)."""
    pairs = zip(rows, rows[1:], strict=False)  # (TP, 2 TP)
    return next((b["tp"] for a, b in pairs if b["total"] >= a["total"]), None)


verdict = {}
for batch in BIG_BATCHES:
    rows = [r for r in rows6 if r["batch"] == batch]
    wide = [tp_row(batch, tp, nvlink) for tp in TPS]  # every GPU on NVLink
    fit = next(r["tp"] for r in rows if r["fits"])
    top = next(r for r in rows if r["tp"] == domain)
    verdict[batch] = {"fit": fit, "stop": first_slower(rows), "stop_nvlink": first_slower(wide),
                      "latency_share": top["latency"] / top["comm"]}
    v = verdict[batch]
    print(f"batch {batch:>2}: fits from TP {fit}; at TP {domain} the all-reduces are "
          f"{top['comm'] / top['total']:.0%} of the step, {v['latency_share']:.0%} of them "
          f"latency; TP {v['stop']} is no faster than TP {v['stop'] // 2} (network), "
          f"TP {v['stop_nvlink']} no faster than TP {v['stop_nvlink'] // 2} (all NVLink)")

fig = Figure(figsize=(10, 3.4))
for ax, batch in zip(fig.subplots(1, 2, sharey=True), BIG_BATCHES, strict=True):
    rows = [r for r in rows6 if r["batch"] == batch]
    x = [r["tp"] for r in rows]
    for key, label, style in (("memory", "memory (weights + KV)", "-"),
                              ("comm", "all-reduce", "-"), ("total", "step", "-o")):
        ax.plot(x, [r[key] * 1e3 for r in rows], style, label=label)
    ax.axvline(domain, color="grey", ls=":", lw=1)
    ax.text(domain * 1.08, 0.97, f"{network.name} ->", fontsize=8, color="grey", va="top",
            transform=ax.get_xaxis_transform())
    ax.set(xscale="log", yscale="log", xlabel="tensor-parallel degree", xticks=x,
           xticklabels=[str(v) for v in x], ylim=(0.1, None),
           title=f"{BIG} decode, batch {batch}")
fig.axes[1].legend(fontsize=8, loc="lower right")
fig.axes[0].set_ylabel(f"ms per step on {SPEC_GPU} (spec)")
display(fig)

# %%
# CHECK: each doubling halves the weight bytes per device while the all-reduce time grows;
# within the NVLink domain every doubling still pays, leaving it does not, and even on
# NVLink the latency of the all-reduces ends it; 70B in bf16 needs 2 GPUs at batch 1 and
# more at batch 64; at batch 1 the all-reduces are latency.
for batch in BIG_BATCHES:
    rows = {r["tp"]: r for r in rows6 if r["batch"] == batch}
    for tp in (2, 4, 8):
        ratio = rows[tp // 2]["weight_bytes"] / rows[tp]["weight_bytes"]
        assert 1.9 < ratio <= 2.0, (batch, tp, ratio)
        assert rows[tp]["total"] < rows[tp // 2]["total"]
        assert rows[tp]["comm"] > rows[tp // 2]["comm"]
    v = verdict[batch]
    assert v["stop"] == 2 * domain and domain < v["stop_nvlink"] <= max(TPS), v
assert verdict[1]["fit"] == 2 and verdict[64]["fit"] > verdict[1]["fit"]
assert verdict[1]["latency_share"] > 0.9

# %% [markdown]
# **DeepSeek-V3's expert parallelism.** 256 routed experts of 3 x 7168 x 2048 weights each,
# 8 per token, in 58 MoE layers, stored in float8 as released. With EP over 32 GPUs (4 H100
# nodes, so the all-to-all crosses the network) each GPU holds 8 experts, and attention runs
# data-parallel: each GPU has its own sequences. Per decode step and device: the expert
# weights it reads (only the experts its group's tokens touched) against the bytes its
# exact all-to-alls send (each token's 8 rows out and back, bf16), and their times: the
# read at HBM speed, the all-to-alls' bytes at the network's bandwidth, and their latency
# apart (the cost model's pairwise exchange pays one message latency per peer in turn, 116
# all-to-alls a step: an upper bound, since NCCL and DeepEP post the messages to every peer
# at once).

# %%
ds = presets.get("deepseek-v3")
dt8 = costs.dtypes(ds, "float8")
moe_layers = ds.layer_ffns.count("moe")


def expert_bytes(tokens_per_device, ep):
    """Routed-expert weight bytes one device reads per decode step (its share of the experts
    the group's tokens touch), from the MoE layer's own cost formulas."""
    c = MoE.costs(ds, tokens_per_device * ep, dt8)
    return moe_layers * (c["ffn_up"].weight_bytes + c["ffn_down"].weight_bytes) / ep


def a2a_time(collectives, bandwidth, latency):
    keys = ("kind", "axis", "group", "nbytes", "op", "count")
    return sum(comms.Collective(**{k: c[k] for k in keys}).time(bandwidth, latency)
               for c in collectives)


rows_ep = []
for tpd in EP_TOKENS:
    share = comms.per_device(ds, "decode", tpd * EP, BIG_CONTEXT, {"expert": EP},
                             weight_dtype="float8")
    a2a = [c for c in share["collectives"] if c["kind"] == "all-to-all"]
    w, t_bytes = expert_bytes(tpd, EP), a2a_time(a2a, network.bandwidth, 0.0)
    rows_ep.append({"tokens": tpd, "batch": tpd * EP, "expert_bytes": w,
                    "a2a_bytes": sum(c["wire_bytes"] for c in a2a), "t_w": w / chip.bandwidth,
                    "t_bytes": t_bytes,
                    "t_lat": a2a_time(a2a, network.bandwidth, network.latency) - t_bytes,
                    "count": sum(c["count"] for c in a2a),
                    "per_expert": tpd * EP * ds.top_k / ds.n_experts})
print(f"DeepSeek-V3 decode, EP={EP}, context {BIG_CONTEXT}, float8 experts on {SPEC_GPU}, "
      f"all-to-alls on {network.name}")
print(f"{'tokens':>6} {'batch':>6} {'tokens':>6} {'experts':>7} {'a2a':>7} {'ratio':>6} "
      f"{'read':>6} {'a2a':>6} {'a2a':>7}")
print(f"{'/dev':>6} {'':>6} {'/expert':>6} {'GB':>7} {'MB':>7} {'':>6} {'ms':>6} "
      f"{'ms':>6} {'lat. ms':>7}")
for r in rows_ep:
    print(f"{r['tokens']:>6} {r['batch']:>6} {r['per_expert']:>6.0f} "
          f"{r['expert_bytes'] / 1e9:>7.2f} {r['a2a_bytes'] / 1e6:>7.1f} "
          f"{r['expert_bytes'] / r['a2a_bytes']:>6.0f} {r['t_w'] * 1e3:>6.2f} "
          f"{r['t_bytes'] * 1e3:>6.2f} {r['t_lat'] * 1e3:>7.2f}")
cross = next((r["tokens"] for r in rows_ep if r["t_bytes"] > r["t_w"]), None)
print(f"the all-to-alls' bytes take longer than the expert-weight read from {cross} tokens "
      "per device")

# %% [markdown]
# At one token per device the expert weights are a thousand times the all-to-all's bytes,
# and each expert serves about one token: the step is a weight read, with an arithmetic
# intensity of one token per weight. As the batch grows the weights stop growing (every
# expert is touched: a device reads its 8 experts whatever the batch) while the
# all-to-all's bytes grow with every token, and on a 50 GB/s network they soon take longer
# than the weight read (and the latencies matter from the start). That is why EP needs
# batch, and why DeepSeek overlaps the all-to-alls with computation (two micro-batches in
# flight) and sends the dispatch in FP8: the batch that amortises the expert weights
# brings communication that has to be hidden.

# %%
# CHECK: the expert weights saturate at E / ep experts per device; the all-to-all bytes grow
# in proportion to the tokens, 2 per MoE layer; at one token per device the weights dominate
# the bytes, and the all-to-alls' bandwidth time overtakes the read within the sweep.
full = moe_layers * ds.n_experts // EP * 3 * ds.d_model * ds.expert_width * 1  # float8
np.testing.assert_allclose(rows_ep[-1]["expert_bytes"], full, rtol=0.01)
np.testing.assert_allclose([r["a2a_bytes"] / r["tokens"] for r in rows_ep],
                           rows_ep[0]["a2a_bytes"], rtol=1e-9)
assert {r["count"] for r in rows_ep} == {2 * moe_layers}
assert rows_ep[0]["expert_bytes"] > 100 * rows_ep[0]["a2a_bytes"]
assert cross is not None and cross > EP_TOKENS[0]

# %% [markdown]
# ## 7 · The collectives measured on this machine
#
# `python -m microbench collectives` times all-reduce, all-gather, reduce-scatter and
# all-to-all over every device JAX has, per message size, checked against numpy, and
# reports the **bus bandwidth** as nccl-tests does (the bytes each device must move per
# second, comparable with one direction of a link). On this machine the devices are
# emulated: the numbers are its memory copies and thread rendezvous, nowhere near a link's
# spec (NVLink 4 is drawn for scale). They say how this lab's CPU runs the programs of
# steps 2-4, not what a GPU interconnect does. Their shape is the one a real link's has,
# though: a small message pays a fixed cost (here the threads' rendezvous, on a link its
# latency) that its few bytes cannot amortise, so the bus bandwidth grows with the message
# size until the copies' (the link's) bandwidth sets it.

# %%
measured = DATA / "collectives.json"
result = json.loads(measured.read_text()) if measured.exists() else None
if result is None:
    print(f"no {measured}: run `python -m microbench collectives` to measure")
else:
    print(result["devices"]["count"], "devices, emulated:", result["emulated"])
    fig = Figure(figsize=(7.5, 4))
    ax = fig.subplots()
    for name in result["collectives"]:
        rs = sorted((r for r in result["results"] if r["collective"] == name),
                    key=lambda r: r["bytes"])
        x = [r["bytes"] for r in rs]
        ax.plot(x, [r["busbw"]["median"] for r in rs], "o-", ms=3, label=name)
        ax.fill_between(x, [r["busbw"]["p10"] for r in rs], [r["busbw"]["p90"] for r in rs],
                        alpha=0.2)
    ax.axhline(nvlink.bandwidth, ls="--", color="k", lw=1)
    ax.text(x[0], nvlink.bandwidth * 0.4, f"{nvlink.name} spec, one direction", fontsize=8)
    kind = "emulated CPU devices (threads of one process)" if result["emulated"] else \
        result["devices"]["device_kind"]
    ax.set(xscale="log", yscale="log", xlabel="bytes per device (S)",
           ylabel="bus bandwidth (bytes/s)",
           title=f"collectives on {result['devices']['count']} {kind}")
    ax.legend(fontsize=8)
    display(fig)
    peak = max(r["busbw"]["median"] for r in result["results"])
    print(f"best median bus bandwidth {peak / 1e9:.2f} GB/s: "
          f"{nvlink.bandwidth / peak:.0f}x below {nvlink.name}'s spec")

# %%
def check_latency_then_bandwidth(busbw_by_size):
    """CHECK (fails on a wrong measurement): for each collective ({name: {bytes: median bus
    bandwidth}}), the smallest message is latency-bound: its bus bandwidth is below a tenth of
    the collective's best, reached at a larger message (a timer that stops before the
    collective ends, or one that times only the launch, gives a flat or falling curve)."""
    for name, by_size in busbw_by_size.items():
        sizes = sorted(by_size)
        best = max(sizes, key=by_size.get)
        assert best > sizes[0] and by_size[sizes[0]] < by_size[best] / 10, (
            f"{name}: {by_size[sizes[0]]:.3g} B/s at {sizes[0]} bytes against the best "
            f"{by_size[best]:.3g} at {best}: no latency-bound small messages")


# Every measured point was checked against numpy (correctness) and emulated devices are
# labelled so; then the shape of the measured curves.
if result is not None:
    assert all(r["checked"] for r in result["results"])
    if result["emulated"]:
        assert result["devices"]["backend"] == "cpu"
    check_latency_then_bandwidth({
        name: {r["bytes"]: r["busbw"]["median"] for r in result["results"]
               if r["collective"] == name} for name in result["collectives"]})

# %% [markdown]
# ## 8 · The same code on real devices
#
# Nothing above names a CPU except the first cell's `jax_num_cpu_devices` line.
#
# - **A GPU node** (8 H100s): drop that line; `jax.devices()` lists the GPUs, and
#   `parallel.make_mesh(tensor=8)` splits the model over all of them, with the all-reduces
#   on NVLink through NCCL. `make_mesh(data=2, tensor=4)` runs two replicas of four.
# - **A TPU slice**: the same; `jax.devices()` lists the TPU chips (a v5e-8 has 8) and the
#   collectives go over the chips' ICI links.
# - **Several hosts**: every host runs the same script, and calls
#   `jax.distributed.initialize()` first (on managed clusters such as Cloud TPU or SLURM it
#   finds the coordinator itself; otherwise give it the coordinator's address, the number of
#   processes and this process's id). `jax.devices()` then lists every host's devices and
#   the mesh spans them all: `make_mesh(data=2, tensor=8)` on two 8-GPU nodes keeps each
#   tensor group inside a node (the tensor axis varies fastest over the device list, which
#   JAX orders host by host) so the all-reduces stay on NVLink, and only the data axis
#   crosses the network. Each host feeds only its own devices' rows of the batch.
#
# Step 6 is the guide to choosing: TP within a scale-up domain until the weights fit and the
# step is fast enough; replicas (data) beyond it; EP for MoE layers, with batch enough to
# amortise each expert and the all-to-alls overlapped with compute.
