"""The public API: init, init_cache, forward, prefill, decode_step, generate.

Each call splits the module and runs the jitted pure phase from `refmodel.phases`; compiled
code is cached per graph and shape. Inputs are checked here, on the host, before anything runs,
so a bad one raises a ValueError naming the argument, the value and what is allowed instead of
giving NaN or a wrong answer: token ids (integer dtype, in [0, vocab_size), checked before the
cast to int32, so an int64 id past 2**31 cannot wrap around), a cache of this model's kind and
of the tokens' batch, room in the cache (a sequence that would pass `max_len` raises instead of
wrapping), and the sampling temperature. The jitted phases themselves check nothing, so the
decode loop of `generate` pays for none of it.
"""

from __future__ import annotations

import functools
import math
import numbers

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from refmodel import phases
from refmodel.config import ModelConfig
from refmodel.model import Cache, Transformer, check_cache
from refmodel.model import init_cache as init_cache  # re-exported


def init(cfg: ModelConfig, seed: int = 0) -> Transformer:
    """A freshly initialised model (Flax NNX module) for `cfg`."""
    if not isinstance(cfg, ModelConfig):
        raise TypeError(f"cfg must be a ModelConfig, got {type(cfg).__name__}")
    return Transformer(cfg, rngs=nnx.Rngs(seed))


# Temperatures below float32's smallest normal number sample as greedy: dividing float32
# logits by one overflows to inf or flushes it to 0 (0 / 0 = NaN), and the distribution such a
# temperature stands for is the argmax anyway.
GREEDY_BELOW = float(np.finfo(np.float32).tiny)


def _tokens(tokens, ndim: int, name: str, vocab_size: int) -> jax.Array:
    """Token ids checked on the host in their own dtype, then int32 on the device."""
    ids = np.asarray(tokens)
    want = "[B, T]" if ndim == 2 else "[B]"
    if ids.ndim != ndim or not np.issubdtype(ids.dtype, np.integer):
        raise ValueError(f"{name} must be an integer array {want}, got {ids.dtype} "
                         f"{tuple(ids.shape)}")
    if ids.size == 0:
        raise ValueError(f"{name} of shape {tuple(ids.shape)} is empty; allowed: at least one "
                         "sequence of at least one token")
    low, high = ids.min(), ids.max()
    if low < 0 or high >= vocab_size:
        bad = low if low < 0 else high
        at = tuple(int(i) for i in np.argwhere(ids == bad)[0])
        raise ValueError(f"{name}[{', '.join(map(str, at))}]={int(bad)} is not a token id; "
                         f"allowed: integers in [0, {vocab_size - 1}] (vocab_size={vocab_size})")
    return jnp.asarray(ids, jnp.int32)


def _temperature(temperature) -> float:
    try:
        t = float(temperature) if not isinstance(temperature, (bool, str, bytes)) else None
    except (TypeError, ValueError):
        t = None
    if t is None or not math.isfinite(t) or t < 0:
        raise ValueError(f"temperature={temperature!r} is not allowed; it must be a finite "
                         "number >= 0 (0: greedy)")
    return t


def _check_room(cache: Cache, new: int) -> None:
    if cache.max_len is None:
        return
    pos = int(jnp.max(cache.pos))  # the furthest sequence (pos is [B], or a scalar)
    if pos + new > cache.max_len:
        raise ValueError(f"sequence of {pos} + {new} tokens would pass the cache's max_len="
                         f"{cache.max_len}; make the cache larger with init_cache(max_len=...)")


def forward(model: Transformer, tokens) -> jax.Array:
    """int32 [B, T] -> float32 logits [B, T, V], causal, without a cache."""
    cfg = model.cfg
    tokens = _tokens(tokens, 2, "tokens", cfg.vocab_size)
    if cfg.position == "learned" and tokens.shape[1] > cfg.max_position:
        raise ValueError(f"tokens of length {tokens.shape[1]} pass max_position="
                         f"{cfg.max_position} of the learned position embedding")
    graphdef, state = nnx.split(model)
    return phases.jitted("forward", graphdef, mesh=model.mesh)(state, tokens)


def prefill(model: Transformer, tokens, cache: Cache) -> tuple[jax.Array, Cache]:
    """Append tokens [B, T] to the cache (which may already hold tokens: chunked prefill).
    Returns logits [B, T, V] and the cache; the cache passed in is donated."""
    tokens = _tokens(tokens, 2, "tokens", model.cfg.vocab_size)
    check_cache(model.cfg, cache, tokens.shape[0])
    _check_room(cache, tokens.shape[1])
    graphdef, state = nnx.split(model)
    return phases.jitted("prefill", graphdef, mesh=model.mesh)(state, tokens, cache)


def decode_step(model: Transformer, token, cache: Cache) -> tuple[jax.Array, Cache]:
    """One token per sequence [B] -> logits [B, V] and the cache (donated) advanced by one."""
    token = _tokens(token, 1, "token", model.cfg.vocab_size)
    check_cache(model.cfg, cache, token.shape[0])
    _check_room(cache, 1)
    graphdef, state = nnx.split(model)
    return phases.jitted("decode", graphdef, mesh=model.mesh)(state, token, cache)


def generate(model: Transformer, prompt, max_new_tokens: int, temperature: float = 0.0,
             seed: int = 0) -> jax.Array:
    """Prompt [B, T] -> [B, T + max_new_tokens]: greedy at temperature 0 (and below
    GREEDY_BELOW), else sampled from softmax(logits / temperature)."""
    prompt = _tokens(prompt, 2, "prompt", model.cfg.vocab_size)
    if (not isinstance(max_new_tokens, numbers.Integral) or isinstance(max_new_tokens, bool)
            or max_new_tokens < 0):
        raise ValueError(f"max_new_tokens={max_new_tokens!r} must be a non-negative integer")
    max_new_tokens = int(max_new_tokens)
    temperature = _temperature(temperature)
    B, T = prompt.shape
    if max_new_tokens == 0:
        return prompt
    cache = init_cache(model.cfg, B, T + max_new_tokens)
    graphdef, state = nnx.split(model)
    step = phases.jitted("decode", graphdef, mesh=model.mesh)
    logits, cache = phases.jitted("prefill", graphdef, mesh=model.mesh)(state, prompt, cache)
    logits, key, out = logits[:, -1], jax.random.key(seed), [prompt]
    for i in range(max_new_tokens):
        if temperature < GREEDY_BELOW:
            token = jnp.argmax(logits, axis=-1).astype(jnp.int32)
        else:  # shifted so the largest scaled logit is 0: a tiny temperature gives -inf, not NaN
            scaled = (logits - logits.max(axis=-1, keepdims=True)) / temperature
            token = jax.random.categorical(jax.random.fold_in(key, i), scaled)
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
    return _router_stats(graphdef, state, _tokens(tokens, 2, "tokens", model.cfg.vocab_size))


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
