"""The reference transformer: embedding, L blocks of (mixer, FFN), final norm, LM head.

A pre-norm decoder in the style of GPT-2 / Llama (Radford et al. 2019; Touvron et al. 2023):
each block adds its mixer's output (an attention variant from the registry, or nothing) and
then its FFN's output (dense, MoE, or nothing) to the residual stream. The per-layer caches
live in one explicit immutable pytree, `Cache`, passed in and returned; the position of each
sequence's next token ([B]: rows may sit at different positions) is a field of that pytree,
advanced by the caller of the layers, never by a layer.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from flax import nnx, struct

from refmodel import attention, ops, quant
from refmodel.config import ModelConfig
from refmodel.layers import DenseFFN, norm, param, soft_cap
from refmodel.moe import MoE


@struct.dataclass
class Cache:
    """Every layer's cache plus the number of tokens each sequence has already processed.

    `pos` is per sequence, so the rows of a batch may sit at different positions (continuous
    batching): caches of single sequences stack row-wise along axis 0 of every leaf. A scalar
    `pos` (one position shared by the batch) is still accepted by the model."""

    layers: tuple  # one variant cache (or None for a layer without a mixer) per layer
    pos: jax.Array  # int32 [B]: position of each sequence's next token
    max_len: int | None = struct.field(pytree_node=False, default=None)  # None: unbounded


class Block(nnx.Module):
    """x + mixer(norm(x)), then x + ffn(norm(x)); Gemma adds a norm after each."""

    def __init__(self, cfg: ModelConfig, layer: int, *, rngs: nnx.Rngs):
        D = cfg.d_model
        self.kind, self.ffn_kind = cfg.layer_kinds[layer], cfg.layer_ffns[layer]
        self.post_norms = cfg.post_norms
        if self.kind != "none":
            self.attn_norm = norm(cfg, D, rngs)
            self.attn = attention.get(self.kind)(cfg, kind=self.kind, rngs=rngs)
            if cfg.post_norms:
                self.attn_post_norm = norm(cfg, D, rngs)
        if self.ffn_kind != "none":
            self.ffn_norm = norm(cfg, D, rngs)
            self.ffn = MoE(cfg, rngs=rngs) if self.ffn_kind == "moe" \
                else DenseFFN(cfg, cfg.d_ff, rngs=rngs)
            if cfg.post_norms:
                self.ffn_post_norm = norm(cfg, D, rngs)

    def mix(self, x: jax.Array, start: jax.Array, cache, snapshots: bool = False):
        """[B, T, D] -> ([B, T, D], cache), or with snapshots=True (x, cache, snaps): the
        mixer's `verify`, which keeps what a rollback needs (speculative decoding)."""
        if self.kind == "none":
            return (x, cache, None) if snapshots else (x, cache)
        with jax.named_scope("attention"):
            h = self.attn_norm(x)
            h, cache, snaps = self.attn.verify(h, start, cache) if snapshots \
                else (*self.attn(h, start, cache), None)
            if self.post_norms:
                h = self.attn_post_norm(h)
        return (x + h, cache, snaps) if snapshots else (x + h, cache)

    def feed(self, x: jax.Array) -> jax.Array:  # [B, T, D] -> [B, T, D]
        if self.ffn_kind == "none":
            return x
        with jax.named_scope("ffn"):
            h = self.ffn(self.ffn_norm(x))
            if self.post_norms:
                h = self.ffn_post_norm(h)
        return x + h


class Transformer(nnx.Module):
    MATRICES = {"lm_head": (0, 1)}  # the embedding table stays float (a gather, not a product)

    def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
        V, D, dtype = cfg.vocab_size, cfg.d_model, jnp.dtype(cfg.dtype)
        self.cfg = cfg
        self.mesh = None  # the device mesh refmodel.parallel.shard put the model on
        self.embed = nnx.Embed(V, D, param_dtype=dtype, dtype=dtype,
                               embedding_init=nnx.initializers.normal(1.0), rngs=rngs)
        if cfg.position == "learned":
            self.pos_embed = param(rngs, (cfg.max_position, D), 1, dtype)  # [max_position, D]
        self.blocks = nnx.List([Block(cfg, i, rngs=rngs) for i in range(cfg.n_layers)])
        self.final_norm = norm(cfg, D, rngs)
        if not cfg.tie_embeddings:
            self.lm_head = param(rngs, (D, V), D, dtype)  # [D, V]
        if cfg.weight_format != "none":  # drawn in float, then quantized (refmodel/quant.py)
            quant.quantize_weights(self, cfg.weight_format, cfg.quant_activations)
        ops.prepare(self)  # stored as the backend multiplies them (refmodel/ops.py)

    def sharding(self, mesh_shape: dict) -> dict[str, tuple]:
        """The LM head split by vocabulary over "tensor" (refmodel.parallel; every device then
        holds V / tensor logits, gathered at the end), kept whole when the degree does not
        divide V; the embedding table stays whole (a gather of B T rows)."""
        tp = mesh_shape.get("tensor", 1)
        return {"lm_head": (None, "tensor" if self.cfg.vocab_size % tp == 0 else None)}

    def embed_tokens(self, tokens: jax.Array, start: jax.Array) -> jax.Array:
        """tokens int32 [B, T] from position start (int32 scalar or [B]) -> x [B, T, D]."""
        with jax.named_scope("embed"):
            x = self.embed(tokens)
            if self.cfg.position == "learned":
                T, table = tokens.shape[1], self.pos_embed[...]  # [max_position, D]
                if jnp.ndim(start) == 0:
                    x = x + jax.lax.dynamic_slice_in_dim(table, start, T)[None]  # [1, T, D]
                else:  # each row from its own start, clamped as the slice is
                    x = x + jnp.take(table, start[:, None] + jnp.arange(T), axis=0,
                                     mode="clip")  # [B, T, D]
        return x

    def head(self, x: jax.Array) -> jax.Array:
        """x [B, T, D] -> float32 logits [B, T, V]."""
        x = self.final_norm(x)
        with jax.named_scope("lm_head"):
            if self.cfg.tie_embeddings:
                logits = self.embed.attend(x)
            else:
                logits = x @ self.lm_head[...]
            logits = logits.astype(jnp.float32)
            if self.cfg.final_softcap is not None:
                logits = soft_cap(logits, self.cfg.final_softcap)
        return logits

    def __call__(self, tokens: jax.Array, cache: Cache | None = None):
        """tokens [B, T] -> (logits [B, T, V], cache advanced by T); no cache: causal forward."""
        if cache is None:
            return self.run(tokens, None, False)[0], None
        logits, cache, _ = self.run(tokens, cache, False)
        return logits, cache

    def verify(self, tokens: jax.Array, cache: Cache):
        """A speculative chunk: (logits [B, T, V], cache advanced by T, snaps), snaps holding
        per layer what `rollback` needs to take back any of the T tokens."""
        return self.run(tokens, cache, True)

    def run(self, tokens: jax.Array, cache: Cache | None, snapshots: bool):
        start = jnp.zeros((), jnp.int32) if cache is None else cache.pos
        x = self.embed_tokens(tokens, start)
        layers, snaps = [], []
        for i, block in enumerate(self.blocks):
            c = None if cache is None else cache.layers[i]
            x, c, *snap = block.mix(x, start, c, snapshots)
            x = block.feed(x)
            layers.append(c)
            snaps.append(snap[0] if snap else None)
        logits = self.head(x)
        if cache is None:
            return logits, None, None
        cache = cache.replace(layers=tuple(layers), pos=cache.pos + tokens.shape[1])
        return logits, cache, tuple(snaps)


def rollback(cfg: ModelConfig, before: Cache, after: Cache, snaps: tuple,
             keep: jax.Array) -> Cache:
    """`after` (a chunk's verify from `before`) as if only each row's first keep [B] >= 1
    tokens had been fed: every layer's variant rolls its own cache back."""
    pos = before.pos + keep
    layers = tuple(
        a if kind == "none" else attention.get(kind).rollback(cfg, kind, b, a, s, keep, pos)
        for kind, b, a, s in zip(cfg.layer_kinds, before.layers, after.layers, snaps,
                                 strict=True))
    return after.replace(layers=layers, pos=pos)


def init_cache(cfg: ModelConfig, batch: int, max_len: int) -> Cache:
    """An empty cache for `batch` sequences of at most `max_len` tokens (a sliding window or a
    recurrent state holds less whatever max_len is; only full attention is bounded by it)."""
    if not isinstance(batch, int) or batch <= 0:
        raise ValueError(f"batch={batch!r} must be a positive integer")
    if not isinstance(max_len, int) or max_len <= 0:
        raise ValueError(f"max_len={max_len!r} must be a positive integer")
    if cfg.position == "learned" and max_len > cfg.max_position:
        raise ValueError(f"max_len={max_len} exceeds max_position={cfg.max_position} of the "
                         "learned position embedding")
    layers, bounded = [], cfg.position == "learned"
    for kind in cfg.layer_kinds:
        if kind == "none":
            layers.append(None)
            continue
        cls = attention.get(kind)
        layers.append(cls.init_cache(cfg, kind, batch, max_len))
        bounded |= cls.capacity_bound
    return Cache(layers=tuple(layers), pos=jnp.zeros((batch,), jnp.int32),
                 max_len=max_len if bounded else None)


def check_cache(cfg: ModelConfig, cache, batch: int, name: str = "cache") -> None:
    """Raise ValueError unless `cache` is one `init_cache(cfg, batch, ...)` would make: a
    `Cache` whose every layer holds this model's variant cache, with the same shapes and dtypes
    (so `batch` rows). Checked on the host from shapes alone; nothing is computed."""
    if not isinstance(cache, Cache):
        raise ValueError(f"{name} must be a Cache from refmodel.init_cache(cfg, batch, max_len), "
                         f"got {type(cache).__name__}")
    pos_shape = tuple(jnp.shape(cache.pos))
    if pos_shape not in ((), (batch,)):
        raise ValueError(f"{name} holds {pos_shape[0]} sequences ({name}.pos has shape "
                         f"{pos_shape}) but the tokens have batch {batch}; allowed: tokens of "
                         f"batch {pos_shape[0]}, or init_cache(cfg, {batch}, ...)")
    want = _cache_shapes(cfg, batch, cache.max_len or 1)
    if len(cache.layers) != len(want.layers):
        raise ValueError(f"{name} holds {len(cache.layers)} layers; this model has "
                         f"n_layers={cfg.n_layers}: make it with init_cache(model.cfg, ...)")
    for i, (got, exp) in enumerate(zip(cache.layers, want.layers, strict=True)):
        if type(got) is not type(exp):
            raise ValueError(
                f"{name}.layers[{i}] is a {type(got).__name__}, but layer {i} of this model "
                f"({cfg.layer_kinds[i]!r}) needs a {type(exp).__name__}: make the cache with "
                "init_cache(model.cfg, ...)")
        leaves = jax.tree_util.tree_leaves_with_path(got)
        for (path, a), b in zip(leaves, jax.tree.leaves(exp), strict=True):
            where = f"{name}.layers[{i}]{jax.tree_util.keystr(path)}"
            if a.shape[1:] == b.shape[1:] and a.shape[:1] != b.shape[:1] and a.ndim > 1:
                raise ValueError(f"{name} holds {a.shape[0]} sequences ({where} has shape "
                                 f"{tuple(a.shape)}) but the tokens have batch {batch}; allowed: "
                                 f"tokens of batch {a.shape[0]}, or init_cache(cfg, {batch}, ...)")
            if a.shape != b.shape or a.dtype != b.dtype:
                raise ValueError(f"{where} is {a.dtype} {tuple(a.shape)}; this model's cache for "
                                 f"batch {batch} has {b.dtype} {tuple(b.shape)}: make it with "
                                 "init_cache(model.cfg, ...)")


@functools.lru_cache(maxsize=64)
def _cache_shapes(cfg: ModelConfig, batch: int, max_len: int) -> Cache:
    return jax.eval_shape(lambda: init_cache(cfg, batch, max_len))
