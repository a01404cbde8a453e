"""The "pallas" backend: the Pallas kernels of `refmodel/pallas` behind the model's ops.

Each implementation takes the cases its kernel computes (a plain softmax: no soft-cap, no
sinks; a float cache of any float dtype, float32 or bfloat16; plain array weights) and returns
NotImplemented for the rest, which then run on the "xla" backend. On a CPU the kernels run in
interpret mode: this backend is there checked for correctness, not timed.

- GQA, MHA, MQA: a decode step's attention over the cache (`pallas/decode.py`), or over the
  serving engine's pages where they lie (`pallas/paged.py`, on a TPU `paged_tpu.py`;
  `PagedKV`: see `refmodel.backends` for how a page argument picks its kernel by the
  layer's backend);
- sliding window: a decode step over the ring's written slots only, the same kernel
  (`native.py` gives the reasoning: the ring is written in order from position 0, so after a
  step's write it holds its row's last min(p + 1, W) positions in its first slots);
- MoE: w_gate, w_up and w_down each as one grouped matmul over every expert's rows
  (`pallas/grouped.py`).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from refmodel import ops
from refmodel.backends.native import KERNEL_SCOPE
from refmodel.layers import GATED
from refmodel.moe import grouped_ffn
from refmodel.pallas import (
    decode_attention,
    grouped_matmul,
    paged_attention,
    paged_attention_tpu,
    platform,
)


def plain_softmax(cfg) -> bool:
    """A float cache with a plain softmax (no soft-capping, no sinks): what the attention
    kernels compute, in float32 inside whatever the cache's float dtype."""
    return cfg.kv_format == "none" and cfg.attn_softcap is None and not cfg.attn_sinks


def _decode(layer, q, k, v, positions):
    """q [B, 1, K, G, H] over k, v [B, K, S, H], each row seeing min(position + 1, S) keys
    (past the cache's end, every key, as XLA's clamped write and mask do) -> [B, 1, K, G, H]."""
    B, S = q.shape[0], k.shape[2]
    lens = jnp.broadcast_to(jnp.minimum(positions + 1, S), (B, 1))[:, 0]  # [B]
    with jax.named_scope(KERNEL_SCOPE):
        return decode_attention(q[:, 0], k, v, lens, layer.cfg.softmax_scale)[:, None]


@ops.implements("gqa.attend_cache", "pallas")
def gqa_attend_cache(layer, q, cache, positions):
    """A decode step (T = 1) over the contiguous cache; a chunk is XLA's."""
    if q.shape[1] != 1 or not plain_softmax(layer.cfg):
        return NotImplemented
    return _decode(layer, q, cache.k, cache.v, positions)


@ops.implements("sliding.attend_ring", "pallas")
def sliding_attend_ring(layer, q, cache, positions):
    """The ring's first min(p + 1, W) slots, read as a cache of W keys."""
    if not plain_softmax(layer.cfg):
        return NotImplemented
    return _decode(layer, q, cache.k, cache.v, positions)


def gqa_attend_pages(layer, q, cache, positions):
    """A decode step over the engine's pages (`PagedKV`) where they lie: the page ids read
    from the tables inside the kernel, or on a TPU by scalar prefetch (`paged_tpu.py`)."""
    lens = jnp.broadcast_to(positions + 1, q.shape[:2])[:, 0]  # [B]
    kernel = paged_attention_tpu if platform() == "tpu" else paged_attention
    with jax.named_scope(KERNEL_SCOPE):
        o = kernel(q[:, 0], cache.k, cache.v, cache.tables, lens, layer.cfg.softmax_scale)
    return o[:, None]


@ops.implements("moe.grouped", "pallas")
def moe_grouped(layer, xs, sizes, pairs=None):
    """Each expert matrix as one grouped matmul over the rows sorted by expert: an expert no
    row chose is never read. Rows past sum(sizes) stay zero. Weights stored other than as
    float arrays (quantized) are XLA's."""
    cfg = layer.cfg
    names = ("w_gate", "w_up", "w_down") if cfg.mlp_act in GATED else ("w_up", "w_down")
    if not all(isinstance(getattr(layer, n)[...], jax.Array) for n in names):
        return NotImplemented
    return grouped_ffn(layer, xs, sizes, lambda w, h, sizes: grouped_matmul(h, w, sizes))


ops.provide("pallas")
