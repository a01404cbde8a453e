"""Multi-head, grouped-query and multi-query attention: one code path, K = N, 1 < K < N, K = 1.

Vaswani et al. 2017 (MHA); Shazeer 2019, "Fast Transformer Decoding" (MQA); Ainslie et al.
2023, "GQA". N query heads share K key/value heads in groups of G = N / K, so the cache holds
2 K H numbers per token per layer and every decode step reads all of them: the attention
intensity of decode is about G FLOPs per byte (bf16 cache: G), whatever the batch.

Options used by real presets: q/k/v/o biases (GPT-2, gpt-oss), per-head RMSNorm on q and k
(Qwen3, Gemma 3), a sigmoid output gate (Qwen3-Next), learned sink logits (gpt-oss), logit
soft-capping (Gemma 2), partial rotary, and learned absolute positions handled by the model.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx, struct

from refmodel import ops
from refmodel.attention.base import AttentionLayer
from refmodel.attention.common import (
    ATTN_SOFTMAX_FLOPS,
    ROPE_FLOPS,
    SINK_FLOPS,
    attend,
    causal_mask,
    from_heads,
    positions_of,
    rope_pair,
    rope_table_flops,
    to_heads,
    write_at,
)
from refmodel.config import ModelConfig
from refmodel.counting import Cost, Dtypes, matmul
from refmodel.layers import NORM_FLOPS, SIGMOID_FLOPS, SOFTCAP_FLOPS, param, zeros
from refmodel.quant import cache_read, cache_zeros
from refmodel.registry import register

# Per-head RMSNorm on q and k (Qwen3, Gemma 3), per element.
QK_NORM_FLOPS = NORM_FLOPS["rmsnorm"]
# Output gate o * sigmoid(g): the sigmoid, then the product, per element.
GATE_FLOPS = SIGMOID_FLOPS + 1


def kv_heads(cfg: ModelConfig, kind: str) -> int:
    """K for this kind: N for "mha", 1 for "mqa", cfg.n_kv_heads for "gqa" (and its kin)."""
    return {"mha": cfg.n_heads, "mqa": 1}.get(kind, cfg.n_kv_heads)


def tensor_heads(N: int, K: int, tensor: int, replicate: bool = False) -> None:
    """Raise a ValueError unless N query heads and K key/value heads split over `tensor`
    devices (`refmodel.parallel`). Engines give each device one KV head when K < tensor
    (replicated, `replicate=True`: the cost model's engine count); this code does not: kept
    whole beside queries split by head, XLA's partitioner split the cache writes by the
    query heads' layout and all-gathered the whole cache on every step (measured in the HLO
    of tiny at tensor=4, K=2), so it asks for a degree that divides K."""
    if N % tensor:
        raise ValueError(f"tensor={tensor} does not divide n_heads={N}: choose a tensor "
                         "degree that divides the query heads")
    if K % tensor and not (replicate and tensor % K == 0):
        raise ValueError(f"tensor={tensor} does not divide n_kv_heads={K}: choose a tensor "
                         "degree that divides the key/value heads")


@struct.dataclass
class KVCache:
    """Keys and values, float or (cfg.kv_format) a `QuantCache` with one scale per head's
    key or value vector: q [B, K, S, H], scale [B, K, S]."""

    k: jax.Array  # [B, K, S, H]
    v: jax.Array  # [B, K, S, H]


@register("mha", "gqa", "mqa")
class GroupedQueryAttention(AttentionLayer):
    """Softmax attention with K key/value heads shared by groups of G query heads."""

    MEASURE = {"mha": ("context",), "gqa": ("context", "quick", "quick context")}
    # {weight: (stacked axes, input axes)}: wo [N, H, D] takes two input axes
    MATRICES = {"wq": (0, 1), "wk": (0, 1), "wv": (0, 1), "wo": (0, 2), "wg": (0, 1)}

    def __init__(self, cfg: ModelConfig, *, kind: str, rngs: nnx.Rngs):
        D, N, H, K = cfg.d_model, cfg.n_heads, cfg.resolved_head_dim, kv_heads(cfg, kind)
        dtype = jnp.dtype(cfg.dtype)
        self.cfg, self.K = cfg, K
        self.wq = param(rngs, (D, N, H), D, dtype)  # [D, N, H]
        self.wk = param(rngs, (D, K, H), D, dtype)  # [D, K, H]
        self.wv = param(rngs, (D, K, H), D, dtype)  # [D, K, H]
        self.wo = param(rngs, (N, H, D), N * H, dtype)  # [N, H, D]
        if cfg.attn_bias:
            self.bq, self.bo = zeros((N, H), dtype), zeros((D,), dtype)
            self.bk, self.bv = zeros((K, H), dtype), zeros((K, H), dtype)
        if cfg.attn_out_gate:
            self.wg = param(rngs, (D, N, H), D, dtype)  # [D, N, H]
        if cfg.qk_norm:
            self.q_norm = nnx.RMSNorm(H, epsilon=cfg.norm_eps, param_dtype=dtype, rngs=rngs)
            self.k_norm = nnx.RMSNorm(H, epsilon=cfg.norm_eps, param_dtype=dtype, rngs=rngs)
        if cfg.attn_sinks:
            self.sinks = zeros((N,), dtype)

    def sharding(self, mesh_shape: dict) -> dict[str, tuple]:
        """Megatron's split: q, k, v (and the gate) column-parallel by heads, the output
        projection row-parallel (one all-reduce of [B, T, D] after it). The sparse variant's
        indexer is not listed: replicated."""
        tensor_heads(self.cfg.n_heads, self.K, mesh_shape.get("tensor", 1))
        kv = "tensor"
        return {"wq": (None, "tensor", None), "wk": (None, kv, None), "wv": (None, kv, None),
                "wo": ("tensor", None, None), "wg": (None, "tensor", None), "bq": ("tensor", None),
                "bk": (kv, None), "bv": (kv, None), "sinks": ("tensor",)}

    @classmethod
    def tensor_config(cls, cfg: ModelConfig, kind: str, tensor: int) -> dict:
        """N / tensor query heads and K / tensor key/value heads per device; with fewer KV
        heads than devices, one each (engines replicate them; `sharding` refuses)."""
        tensor_heads(cfg.n_heads, kv_heads(cfg, kind), tensor, replicate=True)
        return {"n_heads": cfg.n_heads // tensor, "head_dim": cfg.resolved_head_dim,
                "n_kv_heads": max(1, kv_heads(cfg, kind) // tensor)}

    @classmethod
    def cache_sharding(cls, cfg: ModelConfig, kind: str, mesh_shape: dict) -> dict[str, tuple]:
        tensor_heads(cfg.n_heads, kv_heads(cfg, kind), mesh_shape.get("tensor", 1))
        return {"k": ("batch", "tensor", None, None), "v": ("batch", "tensor", None, None)}

    # The three steps, reused by the sliding-window and sparse variants ----------------------

    def project(self, x: jax.Array, positions: jax.Array):
        """x [B, T, D] -> q [B, T, K, G, H], k and v [B, K, T, H], with RoPE and norms
        (positions [T], or [B, T] for a position per sequence)."""
        cfg = self.cfg
        B, T, _ = x.shape
        with jax.named_scope("qkv_proj"):
            # q [B, T, N, H], k and v [B, T, K, H]
            q, k, v = ops.contract_each(x, (self.wq[...], self.wk[...], self.wv[...]))
            if cfg.attn_bias:
                q, k, v = q + self.bq[...], k + self.bk[...], v + self.bv[...]
        if cfg.qk_norm:
            q, k = self.q_norm(q), self.k_norm(k)
        if cfg.position == "rope":
            with jax.named_scope("rope"):
                q, k = rope_pair(q, k, positions, cfg.rotary_dim, cfg.rope_theta)
        q = q.reshape(B, T, self.K, -1, q.shape[-1])  # [B, T, K, G, H]: G heads per KV head
        return q, k.transpose(0, 2, 1, 3), v.transpose(0, 2, 1, 3)

    def output(self, x: jax.Array, o: jax.Array) -> jax.Array:
        """o [B, T, K, G, H] -> [B, T, D] (gated by x if the config says so)."""
        B, T, K, G, H = o.shape
        o = o.reshape(B, T, K * G, H)  # [B, T, N, H]
        with jax.named_scope("out_proj"):
            if self.cfg.attn_out_gate:
                o = o * jax.nn.sigmoid(to_heads(x, self.wg[...]))
            y = from_heads(o, self.wo[...])  # [B, T, D]
            return y + self.bo[...] if self.cfg.attn_bias else y

    @ops.op("gqa.attend")
    def attend(self, q: jax.Array, k: jax.Array, v: jax.Array, mask: jax.Array) -> jax.Array:
        """Softmax attention with this layer's options (scale, soft-cap, sinks): q [B, T, K,
        G, H] over k, v [B, K, S, H] where mask [T, S] or [B, T, S] -> [B, T, K, G, H]."""
        return attend(q, k, v, mask, self.cfg.softmax_scale, self.cfg.attn_softcap,
                      self.sink_logits())

    def sink_logits(self) -> jax.Array | None:
        """The learned sink logit of each query head as [K, G], or None without sinks."""
        return self.sinks[...].reshape(self.K, -1) if self.cfg.attn_sinks else None

    @ops.op("gqa.attend_within")
    def attend_within(self, q: jax.Array, k: jax.Array, v: jax.Array,
                      positions: jax.Array) -> jax.Array:
        """Causal attention of a chunk over its own keys (no cache, positions from 0)."""
        return self.attend(q, k, v, causal_mask(positions, positions))

    @ops.op("gqa.write")
    def write(self, cache: KVCache, k: jax.Array, v: jax.Array, start: jax.Array) -> KVCache:
        """The chunk's keys and values k, v [B, K, T, H] into the cache from `start` (each row
        at its own start if start is [B])."""
        with jax.named_scope("kv_write"):
            return KVCache(k=write_at(cache.k, k, start, 2), v=write_at(cache.v, v, start, 2))

    @ops.op("gqa.attend_cache")
    def attend_cache(self, q: jax.Array, cache: KVCache, positions: jax.Array) -> jax.Array:
        """Attention of the queries at `positions` over every cached key up to their own."""
        k_pos = jnp.arange(cache.k.shape[2], dtype=jnp.int32)  # [S]
        k, v = cache_read(cache.k, q.dtype), cache_read(cache.v, q.dtype)  # [B, K, S, H]
        return self.attend(q, k, v, causal_mask(positions, k_pos))  # mask [T, S] or [B, T, S]

    def __call__(self, x: jax.Array, start: jax.Array, cache: KVCache | None):
        positions = positions_of(start, x.shape[1])  # [T], or [B, T] for a start per row
        q, k, v = self.project(x, positions)  # [B, T, K, G, H], [B, K, T, H] x 2
        if cache is None:  # causal attention within x
            return self.output(x, self.attend_within(q, k, v, positions)), None
        cache = self.write(cache, k, v, start)
        return self.output(x, self.attend_cache(q, cache, positions)), cache

    @classmethod
    def init_cache(cls, cfg: ModelConfig, kind: str, batch: int, max_len: int) -> KVCache:
        shape = (batch, kv_heads(cfg, kind), max_len, cfg.resolved_head_dim)
        dtype = jnp.dtype(cfg.dtype)
        return KVCache(k=cache_zeros(shape, dtype, cfg.kv_format),
                       v=cache_zeros(shape, dtype, cfg.kv_format))

    # Costs ------------------------------------------------------------------------------------

    @classmethod
    def param_counts(cls, cfg: ModelConfig, kind: str) -> dict[str, int]:
        D, N, H, K = cfg.d_model, cfg.n_heads, cfg.resolved_head_dim, kv_heads(cfg, kind)
        out = {"wq": D * N * H, "wk": D * K * H, "wv": D * K * H, "wo": N * H * D}
        if cfg.attn_bias:
            out["biases"] = N * H + 2 * K * H + D
        if cfg.attn_out_gate:
            out["wg"] = D * N * H
        if cfg.qk_norm:
            out["qk_norm"] = 2 * H
        if cfg.attn_sinks:
            out["sinks"] = N
        return out

    @classmethod
    def cache_bytes(cls, cfg: ModelConfig, kind: str, batch: int, context: int,
                    dt: Dtypes) -> float:
        H = cfg.resolved_head_dim
        return dt.kv_bytes(2.0 * batch * context * kv_heads(cfg, kind) * H, H)

    @classmethod
    def costs(cls, cfg: ModelConfig, kind: str, batch: int, new: int, context: int,
              dt: Dtypes) -> dict[str, Cost]:
        return gqa_costs(cfg, kv_heads(cfg, kind), batch, new, context + new, dt)


def gqa_costs(cfg: ModelConfig, K: int, batch: int, new: int, keys: int,
              dt: Dtypes) -> dict[str, Cost]:
    """One layer: `new` queries per sequence attend to `keys` cached positions each."""
    D, N, H = cfg.d_model, cfg.n_heads, cfg.resolved_head_dim
    BT = batch * new  # query tokens
    qkv = matmul(BT, D, (N + 2 * K) * H, dt)
    if cfg.attn_bias:
        qkv = qkv + Cost(flops=BT * (N + 2 * K) * H, weight_bytes=(N + 2 * K) * H * dt.param_size)
    rope_cost = Cost(flops=ROPE_FLOPS * BT * (N + K) * cfg.rotary_dim
                     + rope_table_flops(BT, cfg.rotary_dim)) if cfg.position == "rope" else Cost()
    qk_norm = Cost(flops=QK_NORM_FLOPS * BT * (N + K) * H, weight_bytes=2 * H * dt.param_size) \
        if cfg.qk_norm else Cost()
    # Cache bytes by `Dtypes.kv_bytes`: a quantized cache also moves one scale per H-vector.
    scores = Cost(flops=2.0 * BT * N * keys * H, kv_bytes=dt.kv_bytes(batch * keys * K * H, H))
    if cfg.attn_softcap is not None:
        scores = scores + Cost(flops=SOFTCAP_FLOPS * BT * N * keys)
    softmax = Cost(flops=ATTN_SOFTMAX_FLOPS * BT * N * keys + (SINK_FLOPS * BT * N if cfg.attn_sinks
                                                         else 0))
    if cfg.attn_sinks:
        softmax = softmax + Cost(weight_bytes=N * dt.param_size)
    values = Cost(flops=2.0 * BT * N * keys * H, kv_bytes=dt.kv_bytes(batch * keys * K * H, H))
    write = Cost(kv_bytes=dt.kv_bytes(2.0 * BT * K * H, H))
    out = matmul(BT, N * H, D, dt)
    if cfg.attn_out_gate:
        out = out + matmul(BT, D, N * H, dt) + Cost(flops=GATE_FLOPS * BT * N * H)
    if cfg.attn_bias:
        out = out + Cost(flops=BT * D, weight_bytes=D * dt.param_size)
    return {"qkv_proj": qkv, "qk_norm": qk_norm, "rope": rope_cost, "kv_write": write,
            "attn_scores": scores, "attn_softmax": softmax, "attn_values": values,
            "out_proj": out}
