"""Multi-head latent attention (MLA): DeepSeek-V2 (arXiv:2405.04434) and DeepSeek-V3
(arXiv:2412.19437).

Keys and values are not cached per head. Each token is compressed to one latent
c = RMSNorm(x W_DKV) of rank R (kv_lora_rank) plus one decoupled RoPE key of Q channels
(qk_rope_dim) shared by all N heads, so the cache holds R + Q numbers per token per layer
(DeepSeek-V3: 512 + 64 = 576, against N (P + Q + U) = 40,960 for the per-head keys and values
it stands for). The per-head keys and values are linear in the latent: k_nope = c W_UK,
v = c W_UV, with W_UK and W_UV the two halves of `wkv_b` [R, N, P + U].

Letters local to this file (the rest are the package alphabet, `refmodel/__init__.py`):
Y q_lora_rank (compressed query), P qk_nope_dim, Q qk_rope_dim, U v_head_dim,
H = P + Q the query/key head dim (as in GQA). Softmax scale H**-0.5 (no YaRN mscale).

Two ways to attend, selected by `cfg.mla_absorb` (both give the same logits):

- naive: expand every cached latent to per-head keys [B, N, S, P] and values [B, N, S, U]
  through `wkv_b` on every call ("kv_expand": 2 B S R N (P + U) FLOPs), then standard
  attention with head dims H and U;
- absorbed: fold W_UK into the query (q_latent = q_nope W_UK, [B, T, N, R]) and W_UV into the
  output ("absorb"), so scores = q_latent . c + q_rope . k_rope and the softmax-weighted sum
  runs over the latents themselves; no per-head key or value ever exists.

The lesson is the decode intensity of the absorbed form. One decode step (B sequences, one new
token each, S cached) reads the cache once, B S (R + Q) c bytes (c bytes per cached number),
and does 2 B N S (R + Q) FLOPs of scores plus 2 B N S R of values: since all N heads share one
latent, the attention intensity is about

    2 N (2 R + Q) / ((R + Q) c)  ~=  3.8 N / c  FLOPs per byte  (R = 512, Q = 64),

growing with N (DeepSeek-V3, N = 128, bf16: ~240) where GQA's is about G = N / K. The naive
form reads the same cache bytes but spends 2 B S R N (P + U) FLOPs re-expanding it every step
(and writes and reads back the expanded [B, N, S, P + U] activations): for V3 that is ~120x
the FLOPs of the absorbed scores and values per cached token. Prefill is the other way
round: there T ~ S and every latent is expanded once for T queries, while absorption would make
each score cost R + Q instead of P + Q (576 against 192 for V3). DeepSeek therefore runs the
naive form for prefill and the absorbed form for decode; here one config runs one form for
both, so each is counted and tested alone.

Cache: `MLACache(latent [B, S, R], k_rope [B, S, Q])`, a full cache of max_len slots written at
`start` (each row at its own if start is [B]) and masked with `causal_mask` over
arange(max_len), exactly as GQA.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
from flax import nnx, struct

from refmodel import ops
from refmodel.attention.base import AttentionLayer
from refmodel.attention.common import (
    ATTN_SOFTMAX_FLOPS,
    NEG_INF,
    ROPE_FLOPS,
    attend,
    causal_mask,
    from_heads,
    positions_of,
    rope_pair,
    rope_table_flops,
    to_heads,
    write_at,
)
from refmodel.config import ModelConfig, non_negative, positive
from refmodel.counting import Cost, Dtypes, matmul
from refmodel.layers import NORM_FLOPS as _NORM_FLOPS
from refmodel.layers import param
from refmodel.quant import cache_read, cache_zeros, dense
from refmodel.registry import register

NORM_FLOPS = _NORM_FLOPS["rmsnorm"]  # the q and kv latent RMSNorms, per element


@struct.dataclass
class MLACache:
    """Float, or (cfg.kv_format) `QuantCache`s with one scale per latent row and per rope key:
    scales [B, S] each."""

    latent: jax.Array  # [B, S, R], after kv_norm
    k_rope: jax.Array  # [B, S, Q], after RoPE; one key shared by all N heads


@register("mla")
class MultiHeadLatentAttention(AttentionLayer):
    """DeepSeek's MLA: a low-rank latent KV cache plus a decoupled shared RoPE key."""

    MEASURE = {"mla absorbed": ("context", "quick")}
    # wo [N, U, D] takes two input axes; the 3-D weights enter einsums dequantized.
    MATRICES = {"wq_a": (0, 1), "wq_b": (0, 1), "wq": (0, 1), "wkv_a": (0, 1), "wkv_b": (0, 1),
                "wo": (0, 2)}
    # Kept as declared by a backend that stores weights its own way: every form slices it.
    IN_PLACE = ("wkv_b",)
    # Options of the softmax variants this implementation does not have.
    UNSUPPORTED = ("attn_bias", "qk_norm", "attn_out_gate", "attn_sinks", "attn_softcap",
                   "query_scale")

    @classmethod
    def validate(cls, cfg: ModelConfig, kind: str) -> None:
        for f in ("kv_lora_rank", "qk_nope_dim", "qk_rope_dim", "v_head_dim"):
            positive(f, getattr(cfg, f))
        non_negative("q_lora_rank", cfg.q_lora_rank)  # 0: no query compression
        if cfg.qk_rope_dim % 2:
            raise ValueError(f"qk_rope_dim={cfg.qk_rope_dim} must be even (RoPE pairs)")
        for f in cls.UNSUPPORTED:
            if getattr(cfg, f) not in (False, None):
                raise ValueError(f"{f}={getattr(cfg, f)!r} is not implemented for "
                                 f"attention={kind!r}; leave it unset (False / None)")

    @classmethod
    def option_sets(cls, kind: str) -> dict[str, dict]:
        return {f"{kind} naive": {"mla_absorb": False}, f"{kind} absorbed": {"mla_absorb": True}}

    @classmethod
    def label(cls, cfg: ModelConfig, kind: str) -> str:
        return f"{kind} absorbed" if cfg.mla_absorb else f"{kind} naive"

    def __init__(self, cfg: ModelConfig, *, kind: str, rngs: nnx.Rngs):
        D, N, Y, R = cfg.d_model, cfg.n_heads, cfg.q_lora_rank, cfg.kv_lora_rank
        P, Q, U = cfg.qk_nope_dim, cfg.qk_rope_dim, cfg.v_head_dim
        dtype = jnp.dtype(cfg.dtype)
        self.cfg = cfg
        if Y > 0:
            self.wq_a = param(rngs, (D, Y), D, dtype)  # [D, Y]
            self.q_norm = nnx.RMSNorm(Y, epsilon=cfg.norm_eps, param_dtype=dtype, rngs=rngs)
            self.wq_b = param(rngs, (Y, N, P + Q), Y, dtype)  # [Y, N, H]
        else:
            self.wq = param(rngs, (D, N, P + Q), D, dtype)  # [D, N, H]
        self.wkv_a = param(rngs, (D, R + Q), D, dtype)  # [D, R + Q]
        self.kv_norm = nnx.RMSNorm(R, epsilon=cfg.norm_eps, param_dtype=dtype, rngs=rngs)
        self.wkv_b = param(rngs, (R, N, P + U), R, dtype)  # [R, N, P + U] = [W_UK | W_UV]
        self.wo = param(rngs, (N, U, D), N * U, dtype)  # [N, U, D]

    def project(self, x: jax.Array, positions: jax.Array):
        """x [B, T, D] -> q_nope [B, T, N, P], q_rope [B, T, N, Q], latent [B, T, R],
        k_rope [B, T, Q] (RoPE applied to both rope parts)."""
        cfg, P, R = self.cfg, self.cfg.qk_nope_dim, self.cfg.kv_lora_rank
        with jax.named_scope("qkv_proj"):
            if cfg.q_lora_rank > 0:
                cq = self.q_norm(x @ self.wq_a[...])  # [B, T, Y]
                q = to_heads(cq, self.wq_b[...])  # [B, T, N, H]
            else:
                q = to_heads(x, self.wq[...])  # [B, T, N, H]
            kv = x @ self.wkv_a[...]  # [B, T, R + Q]
            latent = self.kv_norm(kv[..., :R])  # [B, T, R]
        q_nope, q_rope, k_rope = q[..., :P], q[..., P:], kv[..., R:]
        if cfg.position == "rope":
            with jax.named_scope("rope"):
                q_rope, k_rope = rope_pair(q_rope, k_rope, positions, cfg.qk_rope_dim,
                                           cfg.rope_theta)
        return q_nope, q_rope, latent, k_rope

    @property
    def scale(self) -> float:
        return (self.cfg.qk_nope_dim + self.cfg.qk_rope_dim) ** -0.5

    @ops.op("mla.naive")
    def naive(self, q_nope, q_rope, latent, k_rope, mask):
        """Expand the latents to per-head keys and values, then softmax attention: keys
        [B, N, S, P + Q] (the shared RoPE key appended to every head's), values [B, N, S, U]
        -> [B, T, N, U]."""
        P = self.cfg.qk_nope_dim
        with jax.named_scope("kv_expand"):
            w = dense(self.wkv_b[...])
            k_nope = jnp.einsum("BSR,RNP->BNSP", latent, w[..., :P])  # [B, N, S, P]
            v = jnp.einsum("BSR,RNU->BNSU", latent, w[..., P:])  # [B, N, S, U]
            B, N, S, _ = k_nope.shape
            k_shared = jnp.broadcast_to(k_rope[:, None], (B, N, S, k_rope.shape[-1]))
            k = jnp.concatenate([k_nope, k_shared], axis=-1)  # [B, N, S, H]
        q = jnp.concatenate([q_nope, q_rope], axis=-1)[:, :, :, None]  # [B, T, N, 1, H]
        return attend(q, k, v, mask, self.scale)[:, :, :, 0]  # [B, T, N, U]

    def absorbed(self, q_nope, q_rope, latent, k_rope, mask):
        """Attend in the latent space (W_UK folded into q, W_UV after) -> [B, T, N, U]."""
        P = self.cfg.qk_nope_dim
        w = dense(self.wkv_b[...])
        with jax.named_scope("absorb"):
            q_lat = jnp.einsum("BTNP,RNP->BTNR", q_nope, w[..., :P])  # [B, T, N, R]
        # The T N queries of a sequence share its latent keys (MQA-like): one product of M = T N
        # query rows with the S keys per sequence, and the values the same way.
        B, T, N, R = q_lat.shape
        with jax.named_scope("attn_scores"):
            s = jnp.einsum("BMR,BSR->BMS", q_lat.reshape(B, T * N, R), latent)  # [B, M, S]
            s = s + jnp.einsum("BMQ,BSQ->BMS", q_rope.reshape(B, T * N, -1), k_rope)
            s = s.reshape(B, T, N, -1) * self.scale  # [B, T, N, S]
            s = jnp.where(mask[:, :, None] if mask.ndim == 3 else mask[:, None], s, NEG_INF)
        with jax.named_scope("attn_softmax"):
            p = jax.nn.softmax(s, axis=-1)
        with jax.named_scope("attn_values"):
            o_lat = jnp.einsum("BMS,BSR->BMR", p.reshape(B, T * N, -1).astype(latent.dtype),
                               latent).reshape(B, T, N, R)  # [B, T, N, R]
        with jax.named_scope("absorb"):
            return jnp.einsum("BTNR,RNU->BTNU", o_lat, w[..., P:])  # [B, T, N, U]

    def write(self, cache: MLACache, latent, k_rope, start) -> MLACache:
        with jax.named_scope("kv_write"):  # each row at its own start if start is [B]
            return MLACache(latent=write_at(cache.latent, latent, start, 1),
                            k_rope=write_at(cache.k_rope, k_rope, start, 1))

    @ops.op("mla.attend_cache")
    def attend_cache(self, q_nope, q_rope, cache: MLACache, positions) -> jax.Array:
        """The queries at `positions` over every cached latent up to their own, in the form
        the config names (absorbed or naive) -> [B, T, N, U]."""
        k_pos = jnp.arange(cache.latent.shape[1], dtype=jnp.int32)  # [S]
        latent, k_rope = cache_read(cache.latent, q_nope.dtype), cache_read(cache.k_rope,
                                                                             q_nope.dtype)
        core = self.absorbed if self.cfg.mla_absorb else self.naive
        return core(q_nope, q_rope, latent, k_rope, causal_mask(positions, k_pos))

    def __call__(self, x: jax.Array, start: jax.Array, cache: MLACache | None):
        positions = positions_of(start, x.shape[1])  # [T], or [B, T] for a start per row
        q_nope, q_rope, latent, k_rope = self.project(x, positions)
        if cache is None:  # causal forward within x: the naive form
            o = self.naive(q_nope, q_rope, latent, k_rope, causal_mask(positions, positions))
        else:
            cache = self.write(cache, latent, k_rope, start)
            o = self.attend_cache(q_nope, q_rope, cache, positions)  # [B, T, N, U]
        with jax.named_scope("out_proj"):
            return from_heads(o, self.wo[...]), cache  # [B, T, D]

    def sharding(self, mesh_shape: dict) -> dict[str, tuple]:
        """Heads split over "tensor" (the up-projections and the output, row-parallel: one
        all-reduce after it); the down-projections to the latent and the latent cache are
        shared by every head, so every device keeps them whole: MLA's cache does not shrink
        with the tensor degree (GQA's does, down to one KV head per device)."""
        tp = mesh_shape.get("tensor", 1)
        if self.cfg.n_heads % tp:
            raise ValueError(f"tensor={tp} does not divide n_heads={self.cfg.n_heads}: "
                             "choose a tensor degree that divides the query heads")
        heads = (None, "tensor", None)
        return {"wq": heads, "wq_b": heads, "wkv_b": heads, "wo": ("tensor", None, None)}

    @classmethod
    def tensor_config(cls, cfg: ModelConfig, kind: str, tensor: int) -> dict:
        """N / tensor heads per device; the latent (rank R) and its cache stay whole."""
        if cfg.n_heads % tensor:
            raise ValueError(f"tensor={tensor} does not divide n_heads={cfg.n_heads}: "
                             "choose a tensor degree that divides the query heads")
        # n_kv_heads is not read by MLA (its presets set it to N); kept a divisor of N / tensor
        return {"n_heads": cfg.n_heads // tensor,
                "n_kv_heads": math.gcd(cfg.n_heads // tensor, cfg.n_kv_heads)}

    @classmethod
    def init_cache(cls, cfg: ModelConfig, kind: str, batch: int, max_len: int) -> MLACache:
        dtype, fmt = jnp.dtype(cfg.dtype), cfg.kv_format
        return MLACache(latent=cache_zeros((batch, max_len, cfg.kv_lora_rank), dtype, fmt),
                        k_rope=cache_zeros((batch, max_len, cfg.qk_rope_dim), dtype, fmt))

    # Costs ------------------------------------------------------------------------------------

    @classmethod
    def param_counts(cls, cfg: ModelConfig, kind: str) -> dict[str, int]:
        D, N, Y, R = cfg.d_model, cfg.n_heads, cfg.q_lora_rank, cfg.kv_lora_rank
        P, Q, U = cfg.qk_nope_dim, cfg.qk_rope_dim, cfg.v_head_dim
        q = {"wq_a": D * Y, "q_norm": Y, "wq_b": Y * N * (P + Q)} if Y > 0 \
            else {"wq": D * N * (P + Q)}
        return {**q, "wkv_a": D * (R + Q), "kv_norm": R, "wkv_b": R * N * (P + U),
                "wo": N * U * D}

    @classmethod
    def cache_bytes(cls, cfg: ModelConfig, kind: str, batch: int, context: int,
                    dt: Dtypes) -> float:
        return latent_bytes(cfg, batch * context, dt)

    @classmethod
    def costs(cls, cfg: ModelConfig, kind: str, batch: int, new: int, context: int,
              dt: Dtypes) -> dict[str, Cost]:
        """One layer with a cache: `new` queries per sequence attend to keys = context + new
        positions, in the form `cfg.mla_absorb` selects (the cache-free forward is naive)."""
        D, N, Y, R = cfg.d_model, cfg.n_heads, cfg.q_lora_rank, cfg.kv_lora_rank
        P, Q, U = cfg.qk_nope_dim, cfg.qk_rope_dim, cfg.v_head_dim
        BT, keys = batch * new, context + new  # query tokens, key positions per sequence
        if Y > 0:
            qkv = matmul(BT, D, Y, dt) + matmul(BT, Y, N * (P + Q), dt)
            qkv = qkv + Cost(flops=NORM_FLOPS * BT * Y, weight_bytes=Y * dt.param_size)
        else:
            qkv = matmul(BT, D, N * (P + Q), dt)
        qkv = qkv + matmul(BT, D, R + Q, dt) + Cost(flops=NORM_FLOPS * BT * R,
                                                    weight_bytes=R * dt.param_size)
        rope_cost = Cost(flops=ROPE_FLOPS * BT * (N + 1) * Q + rope_table_flops(BT, Q)) \
            if cfg.position == "rope" else Cost()
        ops = {"qkv_proj": qkv, "rope": rope_cost,
               "kv_write": Cost(kv_bytes=latent_bytes(cfg, BT, dt)),
               "attn_softmax": Cost(flops=ATTN_SOFTMAX_FLOPS * BT * N * keys),
               "out_proj": matmul(BT, N * U, D, dt)}
        core = absorbed_costs if cfg.mla_absorb else naive_costs
        return {**ops, **core(cfg, batch, new, keys, dt)}


def latent_bytes(cfg: ModelConfig, tokens: float, dt: Dtypes, rope_key: bool = True) -> float:
    """Cache bytes of `tokens` latent rows (R) and rope keys (Q), each a vector with its own
    scale when the cache is quantized."""
    R, Q = cfg.kv_lora_rank, cfg.qk_rope_dim
    return dt.kv_bytes(1.0 * tokens * R, R) + (dt.kv_bytes(1.0 * tokens * Q, Q) if rope_key
                                               else 0.0)


def naive_costs(cfg: ModelConfig, batch: int, new: int, keys: int,
                dt: Dtypes) -> dict[str, Cost]:
    """Every step re-expands all `keys` latents to per-head K and V through wkv_b; the
    expanded [B, N, S, P + U] is written once and read back once (activation bytes)."""
    N, R, P, Q, U = (cfg.n_heads, cfg.kv_lora_rank, cfg.qk_nope_dim, cfg.qk_rope_dim,
                     cfg.v_head_dim)
    BT, BS = batch * new, batch * keys
    expand = Cost(flops=2.0 * BS * R * N * (P + U), weight_bytes=dt.matrix_bytes(R, N * (P + U)),
                  kv_bytes=latent_bytes(cfg, BS, dt, rope_key=False),
                  act_bytes=2.0 * BS * N * (P + U) * dt.act_size)
    return {"kv_expand": expand, "absorb": Cost(),
            "attn_scores": Cost(flops=2.0 * BT * N * keys * (P + Q),
                                kv_bytes=dt.kv_bytes(1.0 * BS * Q, Q)),
            "attn_values": Cost(flops=2.0 * BT * N * keys * U)}


def absorbed_costs(cfg: ModelConfig, batch: int, new: int, keys: int,
                   dt: Dtypes) -> dict[str, Cost]:
    """W_UK folded into the queries and W_UV into the outputs (per head: N batched products);
    scores over R + Q channels read the latent cache once and the values reuse it."""
    N, R, P, Q, U = (cfg.n_heads, cfg.kv_lora_rank, cfg.qk_nope_dim, cfg.qk_rope_dim,
                     cfg.v_head_dim)
    BT, BS = batch * new, batch * keys
    absorb = N * matmul(BT, P, R, dt, weight=False) + N * matmul(BT, R, U, dt, weight=False)
    absorb = absorb + Cost(weight_bytes=dt.matrix_bytes(R, N * (P + U)))  # wkv_b, read once
    # + BT N keys: the sum of the latent and the rope score.
    scores = Cost(flops=2.0 * BT * N * keys * (R + Q) + BT * N * keys,
                  kv_bytes=latent_bytes(cfg, BS, dt))
    return {"kv_expand": Cost(), "absorb": absorb, "attn_scores": scores,
            "attn_values": Cost(flops=2.0 * BT * N * keys * R)}
