"""The public API: init, init_cache, forward, prefill, decode_step, generate.

Each call splits the module and runs the jitted pure phase from `refmodel.phases`; compiled
code is cached per graph and shape. The capacity of the cache is checked here, on the host,
before anything runs: a sequence that would pass `max_len` raises instead of wrapping.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from flax import nnx

from refmodel import phases
from refmodel.config import ModelConfig
from refmodel.model import Cache, Transformer
from refmodel.model import init_cache as init_cache  # re-exported


def init(cfg: ModelConfig, seed: int = 0) -> Transformer:
    """A freshly initialised model (Flax NNX module) for `cfg`."""
    if not isinstance(cfg, ModelConfig):
        raise TypeError(f"cfg must be a ModelConfig, got {type(cfg).__name__}")
    return Transformer(cfg, rngs=nnx.Rngs(seed))


def _tokens(tokens, ndim: int, name: str) -> jax.Array:
    tokens = jnp.asarray(tokens)
    if tokens.ndim != ndim or not jnp.issubdtype(tokens.dtype, jnp.integer):
        want = "[B, T]" if ndim == 2 else "[B]"
        raise ValueError(f"{name} must be an integer array {want}, got {tokens.dtype} "
                         f"{tuple(tokens.shape)}")
    return tokens.astype(jnp.int32)


def _check_room(cache: Cache, new: int) -> None:
    if cache.max_len is None:
        return
    pos = int(cache.pos)
    if pos + new > cache.max_len:
        raise ValueError(f"sequence of {pos} + {new} tokens would pass the cache's max_len="
                         f"{cache.max_len}; make the cache larger with init_cache(max_len=...)")


def forward(model: Transformer, tokens) -> jax.Array:
    """int32 [B, T] -> float32 logits [B, T, V], causal, without a cache."""
    tokens = _tokens(tokens, 2, "tokens")
    cfg = model.cfg
    if cfg.position == "learned" and tokens.shape[1] > cfg.max_position:
        raise ValueError(f"tokens of length {tokens.shape[1]} pass max_position="
                         f"{cfg.max_position} of the learned position embedding")
    graphdef, state = nnx.split(model)
    return phases.jitted("forward", graphdef)(state, tokens)


def prefill(model: Transformer, tokens, cache: Cache) -> tuple[jax.Array, Cache]:
    """Append tokens [B, T] to the cache (which may already hold tokens: chunked prefill).
    Returns logits [B, T, V] and the cache; the cache passed in is donated."""
    tokens = _tokens(tokens, 2, "tokens")
    _check_room(cache, tokens.shape[1])
    graphdef, state = nnx.split(model)
    return phases.jitted("prefill", graphdef)(state, tokens, cache)


def decode_step(model: Transformer, token, cache: Cache) -> tuple[jax.Array, Cache]:
    """One token per sequence [B] -> logits [B, V] and the cache (donated) advanced by one."""
    token = _tokens(token, 1, "token")
    _check_room(cache, 1)
    graphdef, state = nnx.split(model)
    return phases.jitted("decode", graphdef)(state, token, cache)


def generate(model: Transformer, prompt, max_new_tokens: int, temperature: float = 0.0,
             seed: int = 0) -> jax.Array:
    """Prompt [B, T] -> [B, T + max_new_tokens]: greedy at temperature 0, else sampled."""
    prompt = _tokens(prompt, 2, "prompt")
    if not isinstance(max_new_tokens, int) or max_new_tokens < 0:
        raise ValueError(f"max_new_tokens={max_new_tokens!r} must be a non-negative integer")
    if temperature < 0:
        raise ValueError(f"temperature={temperature} must be >= 0")
    B, T = prompt.shape
    if max_new_tokens == 0:
        return prompt
    cache = init_cache(model.cfg, B, T + max_new_tokens)
    graphdef, state = nnx.split(model)
    step = phases.jitted("decode", graphdef)
    logits, cache = phases.jitted("prefill", graphdef)(state, prompt, cache)
    logits, key, out = logits[:, -1], jax.random.key(seed), [prompt]
    for i in range(max_new_tokens):
        if temperature == 0:
            token = jnp.argmax(logits, axis=-1).astype(jnp.int32)
        else:
            token = jax.random.categorical(jax.random.fold_in(key, i), logits / temperature)
            token = token.astype(jnp.int32)
        out.append(token[:, None])
        if i + 1 < max_new_tokens:  # room was checked above: T + max_new_tokens slots
            logits, cache = step(state, token, cache)
    return jnp.concatenate(out, axis=1)


def router_stats(model: Transformer, tokens) -> dict[int, jax.Array]:
    """Tokens routed to each expert, per MoE layer: {layer: int32 [E]} for tokens [B, T].

    Runs the causal forward block by block and asks each MoE layer's router where its inputs
    go (the notebooks' view of load balance; nothing here is on a hot path).
    """
    graphdef, state = nnx.split(model)
    return _router_stats(graphdef, state, _tokens(tokens, 2, "tokens"))


@functools.partial(jax.jit, static_argnums=0)
def _router_stats(graphdef, state, tokens):
    model = nnx.merge(graphdef, state)
    x = model.embed_tokens(tokens, jnp.zeros((), jnp.int32))
    stats = {}
    for i, block in enumerate(model.blocks):
        x, _ = block.mix(x, jnp.zeros((), jnp.int32), None)
        if block.ffn_kind == "moe":
            h = block.ffn_norm(x).reshape(-1, model.cfg.d_model)
            _, idx = block.ffn.route(h)
            stats[i] = jnp.bincount(idx.reshape(-1), length=model.cfg.n_experts)
        x = block.feed(x)
    return stats
