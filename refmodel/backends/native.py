"""The "native" backend: the C++ kernels of `refmodel/kernels` behind the model's ops.

Each implementation takes the cases its kernel computes (float32, a plain softmax: no
soft-cap, no sinks, a float cache) and returns NotImplemented for the rest, which then run
on the "xla" backend. What each kernel buys, and why, is in its own file's header.

- weights: every float32 (or int8) matrix the modules declare (`MATRICES`) is stored in the
  kernel's panels (`kernels.Panels`), so `x @ w` is the kernel's product at any rows;
- GQA, MHA, MQA: a chunk's attention within itself or over its cache (`attend_rows.cc`), a
  decode step's over the cache as one page per sequence, or over the serving engine's pages
  where they lie (`attend.cc`, `PagedKV`);
- sliding window: a decode step over the ring's written slots only;
- sparse: the indexer's scores, the top-k and the attention over the picks (`sparse.cc`);
- MLA absorbed: a decode step's absorbs and attention over the latents (`latent.cc`);
- linear attention: a decode step's state update, in place (`recurrence.cc`);
- MoE: every expert's rows in one grouped product (`rows_groups`).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from refmodel import kernels, ops
from refmodel.attention.common import to_heads
from refmodel.kernels.latent import attend_latent
from refmodel.kernels.pages import PagedKV
from refmodel.kernels.prefill import attend_rows
from refmodel.kernels.qdot import QuantPanels
from refmodel.kernels.recurrence import state_step
from refmodel.kernels.rows import OutputMajor, Panels
from refmodel.kernels.sparse import sparse_attend
from refmodel.moe import grouped_ffn
from refmodel.quant import Quantized, dense, matrices

# The named scope of a kernel that computes scores, softmax and values in one pass: the ops it
# holds, joined by "+" (microbench.breakdown charges its time and their counted cost to one row).
KERNEL_SCOPE = "attn_scores+attn_softmax+attn_values"
LATENT_SCOPE = "absorb+" + KERNEL_SCOPE  # MLA's decode kernel holds both absorbs too
SPARSE_SCOPE = "indexer+topk_select+" + KERNEL_SCOPE  # the indexer's projections keep theirs


# Weights ---------------------------------------------------------------------------------------

def convert(model: nnx.Module, native: bool = True) -> nnx.Module:
    """Replace, in place, every float32 matrix [*lead, K, N] the modules declare (`MATRICES`)
    by its `Panels` form (the native kernel's layout), or with native=False its `OutputMajor`
    form (multiplied by XLA only); a weight declared over several axes ([D, N, H], [N, H, D])
    is stored as its matrix [prod(inputs), prod(outputs)]. With native=True an int8
    `quant.Quantized` matrix becomes int8 `Panels` too, and an int8 or int4 one with int8
    activations (not stacked) `QuantPanels`. Other weights (float8, int4 without int8
    activations, quantized stacks with int8 activations, a stack over several axes, what a
    module's `IN_PLACE` names: a kernel reads it as declared) stay."""
    if native and not kernels.available():
        raise RuntimeError(f"backend='native' needs the native kernels, which are not "
                           f"available here: {kernels.why_not()}; use backend='xla'")
    for _, module in nnx.iter_modules(model):
        for name, (lead, contract) in matrices(module).items():
            if name in getattr(type(module), "IN_PLACE", ()):
                continue
            value = getattr(module, name)[...]
            plain = not isinstance(value, (OutputMajor, Panels)) and hasattr(value, "ndim")
            matrix = plain and contract == 1 and value.ndim == lead + 2  # [*lead, n_in, n_out]
            if plain and (matrix or lead == 0):  # or unstacked over several axes
                form = Panels if native else OutputMajor
                setattr(module, name, nnx.Param(form.of(value, lead, contract)))
            elif native and isinstance(value, Quantized) and value.acts and value.lead == 0:
                setattr(module, name, nnx.Param(QuantPanels.of_quantized(value)))
            elif (native and isinstance(value, Quantized) and value.fmt == "int8"
                  and not value.acts and (value.lead == 0 or (
                      value.contract == 1 and len(value.shape) == value.lead + 2))):
                setattr(module, name, nnx.Param(Panels.of_quantized(value)))
    return model


@ops.prepares("native")
def _prepare_native(model):
    convert(model, native=True)


@ops.prepares("output-major")
def _prepare_output_major(model):
    convert(model, native=False)


ops.weight_type(Panels, ops.matrix_contract)  # x [..., *in] times the matrix it stores
ops.weight_type(OutputMajor, ops.matrix_contract)
ops.weight_type(QuantPanels, ops.matrix_contract, each=QuantPanels.contract_each)


# Attention -------------------------------------------------------------------------------------

def plain_softmax(cfg) -> bool:
    """Float32 keys and values with a plain softmax (no soft-capping, no sinks): what the
    attention kernels compute."""
    return (cfg.dtype == "float32" and cfg.kv_format == "none"
            and cfg.attn_softcap is None and not cfg.attn_sinks)


@ops.implements("gqa.attend_within", "native")
def gqa_attend_within(layer, q, k, v, positions):
    """A chunk over its own keys: key s is the chunk's token s, query t sees t + 1 of them."""
    if q.shape[1] == 1 or not plain_softmax(layer.cfg):
        return NotImplemented
    B, T = q.shape[:2]
    lens = jnp.broadcast_to(jnp.arange(1, T + 1, dtype=jnp.int32), (B, T))
    with jax.named_scope(KERNEL_SCOPE):
        return attend_rows(q, k, v, lens, layer.cfg.softmax_scale)


@ops.implements_type("gqa.write", PagedKV)
def gqa_write_pages(layer, cache, k, v, start):
    """The engine's pages: the step's key and value written into their page."""
    with jax.named_scope("kv_write"):
        return cache.write(k, v, start)


def gqa_attend_pages(layer, q, cache, positions):
    """A decode step over the engine's pages where they lie (`attend.cc`); registered for
    `PagedKV` in `refmodel.backends`, which picks the kernel the pages name."""
    lens = jnp.broadcast_to(positions + 1, q.shape[:2])[:, 0]  # [B]
    with jax.named_scope(KERNEL_SCOPE):
        return cache.attend(q, layer.cfg.softmax_scale, lens)


def _seen(positions, B, S):
    """Keys each query sees, min(position + 1, S) [B, T] (past the cache's end, every key,
    as XLA's clamped write and mask do)."""
    return jnp.broadcast_to(jnp.minimum(positions + 1, S), (B, positions.shape[-1]))


@ops.implements("gqa.attend_cache", "native")
def gqa_attend_cache(layer, q, cache, positions):
    """A chunk in `attend_rows.cc`, a decode step in `attend.cc` over the cache as one page
    per sequence."""
    if not plain_softmax(layer.cfg):
        return NotImplemented
    return _attend_contiguous(layer, q, cache.k, cache.v, positions)


def _attend_contiguous(layer, q, k, v, positions):
    B, T, S = q.shape[0], q.shape[1], k.shape[2]
    lens = _seen(positions, B, S)  # [B, T]
    with jax.named_scope(KERNEL_SCOPE):
        if T > 1:
            return attend_rows(q, k, v, lens, layer.cfg.softmax_scale)
        pages = PagedKV(k, v, jnp.arange(B, dtype=jnp.int32)[:, None])
        return pages.attend(q, layer.cfg.softmax_scale, lens[:, 0])


@ops.implements("sliding.attend_ring", "native")
def sliding_attend_ring(layer, q, cache, positions):
    """A row's ring is written in order from position 0: after this step's write it holds
    positions max(0, p - W + 1) .. p in its first min(p + 1, W) slots, and the softmax does
    not care in which order, so the kernel reads those slots as a cache and never the empty
    ones."""
    if not plain_softmax(layer.cfg):
        return NotImplemented
    return _attend_contiguous(layer, q, cache.k, cache.v, positions)


@ops.implements("sparse.attend", "native")
def sparse_attend_op(layer, x, q, k, v, k_idx, positions, causal_within):
    """The indexer's scores, the top-k and the attention over the picks in one kernel."""
    if not plain_softmax(layer.cfg):
        return NotImplemented
    B, T, S = q.shape[0], q.shape[1], k.shape[2]
    with jax.named_scope("indexer"):
        q_idx = to_heads(x, layer.wq_idx[...])  # [B, T, I, J]
        w = to_heads(x, layer.w_idx[...])  # [B, T, I]
    lens = (jnp.broadcast_to(jnp.arange(1, T + 1, dtype=jnp.int32), (B, T)) if causal_within
            else _seen(positions, B, S))
    with jax.named_scope(SPARSE_SCOPE):
        return sparse_attend(q, k, v, q_idx, w, k_idx, lens, layer.cfg.sparse_top_k,
                             layer.cfg.softmax_scale)


@ops.implements("mla.attend_cache", "native")
def mla_attend_cache(layer, q_nope, q_rope, cache, positions):
    """Absorbed decode: both absorbs and the attention over the latents in one kernel, wkv_b
    and the cache read where they lie."""
    cfg = layer.cfg
    if not (q_nope.shape[1] == 1 and cfg.mla_absorb and cfg.dtype == "float32"
            and cfg.kv_format == "none"):
        return NotImplemented
    B, S = q_nope.shape[0], cache.latent.shape[1]
    lens = _seen(positions, B, S)[:, 0]
    with jax.named_scope(LATENT_SCOPE):
        o = attend_latent(q_nope[:, 0], q_rope[:, 0], dense(layer.wkv_b[...]), cache.latent,
                          cache.k_rope, lens, layer.scale)
    return o[:, None]  # [B, 1, N, U]


@ops.implements("linear.decode", "native")
def linear_decode(layer, state, q, k, v, g, beta):
    """The state read once and written in place, as the cache holds it ([B, N, H, U])."""
    f32 = (a[:, 0].astype(jnp.float32) for a in (q, k, v, g, beta))
    o, S = state_step(state, *f32, delta=layer.rule == "gated_delta")
    return o[:, None], S  # [B, 1, K, G, U], [B, N, H, U]


# MoE -------------------------------------------------------------------------------------------

@ops.implements("moe.grouped", "native")
def moe_grouped(layer, xs, sizes, pairs=None):
    """Each of w_gate, w_up and w_down as one grouped product over every expert's rows, so an
    expert with rows is read once whatever its rows, as llama.cpp's mul_mat_id and vLLM's
    fused MoE read it. Rows past sum(sizes) stay zero."""
    if not isinstance(layer.w_up[...], Panels):
        return NotImplemented
    return grouped_ffn(layer, xs, sizes, lambda w, h, sizes: w.grouped(h, sizes))


ops.provide("native")
