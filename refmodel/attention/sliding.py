"""Sliding-window (local) attention with a rolling-buffer cache of W entries per layer.

Beltagy et al. 2020, "Longformer" (local windowed attention); Jiang et al. 2023, "Mistral 7B"
(arXiv:2310.06825), whose rolling buffer cache this is; used by Gemma 2/3 and gpt-oss in
alternation with global layers. A query at position p sees the keys at positions
p - W + 1 .. p, so a layer never needs more than the last W keys: the cache is a ring of W
slots, and the token at position p lives in slot p mod W.

The ring keeps the ABSOLUTE position of every slot (`pos`, -1 = empty), so the mask is
computed from positions, never from slot order, and stays right after the ring wraps. The
positions are kept per sequence ([B, W]): rows of a batch may sit at different positions
(continuous batching), each with its own ring.

Two paths, chosen by the static chunk length T:
- decode (T = 1): write the new key into its slot first (it overwrites position p - W, which
  p no longer sees), then attend over the W slots. Empty slots are masked but still computed:
  a decode step executes W scores whatever the context (the native backend's kernel reads
  only the written slots, min(p + 1, W): it runs faster than the count, not another count).
- prefill (T > 1, on a cache that may already hold tokens): a chunk longer than W would
  overwrite its own keys, so it attends over [the W old slots ++ its own T keys] with the
  window mask first (W + T scores per query), then writes its last min(T, W) keys.

Memory is O(W) at any context: `capacity_bound` is False, the cache's `max_len` is ignored
(its shapes are the same for max_len 16 and 4096), and a model made only of sliding layers
may run past max_len. gpt-oss's sink logits and Gemma 2's soft-capping come with GQA's core.

Costs are counted twice over, kept apart by op name. `attn_scores` / `attn_softmax` /
`attn_values` count what a windowed engine reads: a query sees min(S, W - 1) cached keys and
its own new ones, so a decode step at context S reads min(S + 1, W) keys per sequence and
prefill into an empty cache reads its T new keys (masked pairs counted, as for full attention
in refmodel/counting.py). `RING_OP` counts what this fixed ring executes on top: the masked
slots it still scores (W - min(S + 1, W) at decode, the W old slots at prefill). The phase
totals of `refmodel.costs.phase_costs` include it by default (what the compiled code runs,
timed by microbench and cross-checked against XLA by refmodel/compiler_check.py); `count="engine"`
leaves it out.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import struct

from refmodel import ops
from refmodel.attention.common import causal_mask, positions_of
from refmodel.attention.gqa import GroupedQueryAttention, gqa_costs, kv_heads
from refmodel.config import ModelConfig, positive
from refmodel.counting import Cost, Dtypes
from refmodel.quant import cache_read, cache_round, cache_store, cache_zeros
from refmodel.registry import register

RING_OP = "ring_masked_slots"  # work of the fixed ring beyond a windowed engine's
RING_OPS = ("attn_scores", "attn_softmax", "attn_values")  # the ops whose keys it pads


@struct.dataclass
class RingCache:
    """k and v float, or (cfg.kv_format) `QuantCache`s with one scale per slot's head vector:
    q [B, K, W, H], scale [B, K, W]. `pos` stays int32."""

    k: jax.Array  # [B, K, W, H]
    v: jax.Array  # [B, K, W, H]
    pos: jax.Array  # int32 [B, W]: absolute position held by each slot, -1 = empty


def ring_write(cache: RingCache, k: jax.Array, v: jax.Array, positions: jax.Array) -> RingCache:
    """Write the last min(T, W) of k, v [B, K, T, H] at positions [T] (shared by the batch)
    or [B, T] (per sequence) into each row's slots pos mod W."""
    (B, W), T = cache.pos.shape, k.shape[2]
    n = min(T, W)  # static; the n positions are consecutive, so their slots are distinct
    new = positions[..., T - n:]  # [n] or [B, n]
    # quantized (q [B, K, n, H] and scale [B, K, n]) or cast; every leaf is set alike
    k, v = cache_store(k[:, :, T - n:], cache.k), cache_store(v[:, :, T - n:], cache.v)
    slots = new % W  # [n] or [B, n]
    if positions.ndim == 1:  # one slot list for every row
        def put(c, x):
            return c.at[:, :, slots].set(x)

        pos = cache.pos.at[:, slots].set(new)
    else:
        rows = jnp.arange(B)[:, None]  # [B, 1]

        def put(c, x):  # c[rows, :, slots] is [B, n, K(, H)]: the indexed axes first
            return c.at[rows, :, slots].set(jnp.moveaxis(x, 2, 1))

        pos = cache.pos.at[rows, slots].set(new)
    return RingCache(k=jax.tree.map(put, cache.k, k), v=jax.tree.map(put, cache.v, v), pos=pos)


@register("sliding")
class SlidingWindowAttention(GroupedQueryAttention):
    """GQA restricted to the last W positions, with a ring-buffer cache of W slots."""

    MEASURE = {"sliding": ("context", "quick", "quick context")}
    IMPLEMENTATION_ONLY = (RING_OP,)

    @classmethod
    def validate(cls, cfg: ModelConfig, kind: str) -> None:
        positive("window", cfg.window)

    capacity_bound = False

    @ops.op("sliding.attend_ring")
    def attend_ring(self, q: jax.Array, cache: RingCache, positions: jax.Array) -> jax.Array:
        """A decode step's attention over the ring's W slots, just written: empty slots and
        those outside the window are masked, by the positions they hold."""
        k, v = cache_read(cache.k, q.dtype), cache_read(cache.v, q.dtype)  # [B, K, W, H]
        return self.attend(q, k, v, causal_mask(positions, cache.pos, self.cfg.window))

    def attend_chunk(self, q, k, v, cache: RingCache, positions: jax.Array) -> jax.Array:
        """A chunk's attention over the ring's old slots ++ its own keys (the chunk's keys
        rounded as a quantized ring will hand them back, so a chunk equals token by token)."""
        B, T = q.shape[:2]
        keys = jnp.concatenate([cache_read(cache.k, k.dtype), cache_round(k, cache.k)], axis=2)
        values = jnp.concatenate([cache_read(cache.v, v.dtype), cache_round(v, cache.v)],
                                 axis=2)  # [B, K, W + T, H] each
        k_pos = jnp.concatenate([cache.pos, jnp.broadcast_to(positions, (B, T))], axis=1)
        return self.attend(q, keys, values, causal_mask(positions, k_pos, self.cfg.window))

    def __call__(self, x: jax.Array, start: jax.Array, cache: RingCache | None):
        positions = positions_of(start, x.shape[1])  # [T], or [B, T] for a start per row
        q, k, v = self.project(x, positions)  # [B, T, K, G, H], [B, K, T, H] x 2
        if cache is None:
            o = self.attend(q, k, v, causal_mask(positions, positions, self.cfg.window))
            return self.output(x, o), None
        if x.shape[1] == 1:  # decode: write first (over position p - W), then attend
            cache = self.write_ring(cache, k, v, positions)
            return self.output(x, self.attend_ring(q, cache, positions)), cache
        o = self.attend_chunk(q, k, v, cache, positions)  # prefill: attend, then write
        return self.output(x, o), self.write_ring(cache, k, v, positions)

    def write_ring(self, cache: RingCache, k, v, positions) -> RingCache:
        with jax.named_scope("kv_write"):
            return ring_write(cache, k, v, positions)

    @classmethod
    def rollback_limit(cls, cfg: ModelConfig, kind: str) -> int:
        return cfg.window  # a longer chunk overwrites its own first tokens

    @classmethod
    def rollback(cls, cfg: ModelConfig, kind: str, before: RingCache, after: RingCache, snaps,
                 keep: jax.Array, pos: jax.Array) -> RingCache:
        """A chunk of T <= W tokens overwrote T slots that held positions the kept tokens still
        see (position p - W of each): every slot now holding a rejected position (>= pos [B])
        gets back what it held before the chunk."""
        rejected = after.pos >= pos[:, None]  # [B, W]
        back = rejected[:, None, :]  # [B, 1, W]

        def pick(b, a):  # a float or q leaf [B, K, W, H] (mask [B, 1, W, 1]), a scale [B, K, W]
            return jnp.where(back.reshape(back.shape + (1,) * (a.ndim - 3)), b, a)

        return RingCache(k=jax.tree.map(pick, before.k, after.k),
                         v=jax.tree.map(pick, before.v, after.v),
                         pos=jnp.where(rejected, before.pos, after.pos))

    @classmethod
    def init_cache(cls, cfg: ModelConfig, kind: str, batch: int, max_len: int) -> RingCache:
        """W slots whatever max_len is (max_len is ignored: the ring never fills up)."""
        shape = (batch, kv_heads(cfg, kind), cfg.window, cfg.resolved_head_dim)
        dtype = jnp.dtype(cfg.dtype)
        return RingCache(k=cache_zeros(shape, dtype, cfg.kv_format),
                         v=cache_zeros(shape, dtype, cfg.kv_format),
                         pos=jnp.full((batch, cfg.window), -1, jnp.int32))

    # Costs ------------------------------------------------------------------------------------

    @classmethod
    def cache_bytes(cls, cfg: ModelConfig, kind: str, batch: int, context: int,
                    dt: Dtypes) -> float:
        """K and V of the last min(context, W) tokens: what a sequence needs, and what an
        engine that allocates per token (paged) holds. This ring allocates all W slots up
        front (`init_cache`), whatever the context. The W int32 positions of each sequence
        are left out: 4 B W bytes per layer."""
        keys, H = min(context, cfg.window), cfg.resolved_head_dim
        return dt.kv_bytes(2.0 * batch * keys * kv_heads(cfg, kind) * H, H)

    @classmethod
    def costs(cls, cfg: ModelConfig, kind: str, batch: int, new: int, context: int,
              dt: Dtypes) -> dict[str, Cost]:
        """The attention ops of a windowed engine (min(context, W - 1) + new keys per query:
        min(S + 1, W) at decode), plus `RING_OP`: the masked slots this ring scores on top
        (it executes W keys at decode, W + new at prefill). Only the last min(new, W) keys
        are written."""
        K, W, H = kv_heads(cfg, kind), cfg.window, cfg.resolved_head_dim
        engine = min(context, W - 1) + new
        executed = W if new == 1 else W + new
        out = gqa_costs(cfg, K, batch, new, engine, dt)
        ring = gqa_costs(cfg, K, batch, new, executed, dt)
        out[RING_OP] = sum((ring[op] + (-1.0) * out[op] for op in RING_OPS), Cost())
        out["kv_write"] = Cost(kv_bytes=dt.kv_bytes(2.0 * batch * min(new, W) * K * H, H))
        return out
