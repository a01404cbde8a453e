"""The public API: init, init_cache, forward, prefill, decode_step, generate.

Each call runs the jitted pure phase from `refmodel.phases`; compiled code is cached per graph
and shape. Inputs are checked here, on the host, before anything runs, so a bad one raises a
ValueError naming the argument, the value and what is allowed instead of giving NaN or a wrong
answer: token ids (integer dtype, in [0, vocab_size), checked before the cast to int32, so an
int64 id past 2**31 cannot wrap around), a cache of this model's kind and of the tokens' batch,
room in the cache (a sequence that would pass `max_len` raises instead of wrapping), and the
sampling temperature. The jitted phases themselves check nothing, so the decode loop of
`generate` pays for none of it.

What a call costs on the host beside the step is kept small, since a loop pays it per token:

  * The module's split (graphdef, state) and its jitted phases are kept per model: `nnx.split`
    walks the whole module graph, milliseconds for a model of a few hundred modules and
    Variables. `nnx.split` hands back the model's own Variable objects, so a weight set in place
    (`w[...] = x`, `nnx.update`) is read by the next call; any change to the graph itself (a
    module, Variable or attribute replaced, added or removed) is caught by comparing every
    module's attributes with those at the split (modules, Variables and containers by
    identity, the rest by value), and the model is split anew.
  * A cache this API returned is known: already checked against the model, with its furthest
    position counted on the host (the one it was given plus the tokens fed). Its arrays are
    immutable, so that count stays true for as long as that cache object lives, and the room
    check reads nothing from the device: a read would wait for the step before it to finish.
    Any other cache (fresh from `init_cache`, or edited with `cache.replace`) is checked in full
    and its position read from the device once.
"""

from __future__ import annotations

import functools
import math
import numbers
import operator
import weakref

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
    return jnp.asarray(_host_tokens(tokens, ndim, name, vocab_size))


def _host_tokens(tokens, ndim: int, name: str, vocab_size: int) -> np.ndarray:
    """Token ids checked on the host in their own dtype, then an int32 copy on the host, which
    a jitted phase's own dispatch moves to the device faster than a jnp.asarray before it (a
    copy, because a host buffer handed to a jitted call may be aliased, and the caller may
    reuse its own). Ids given as a device array are read back to be checked: a loop that wants
    its steps queued without waiting for the last one feeds host ids (or runs `generate`)."""
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
    return ids.astype(np.int32)  # always a new array


def _temperature(temperature) -> float:
    try:
        t = float(temperature) if not isinstance(temperature, (bool, str, bytes)) else None
    except (TypeError, ValueError):
        t = None
    if t is None or not math.isfinite(t) or t < 0:
        raise ValueError(f"temperature={temperature!r} is not allowed; it must be a finite "
                         "number >= 0 (0: greedy)")
    return t


class _Split:
    """A model's (graphdef, state), its jitted phases, and what shows the split is current."""

    def __init__(self, model: Transformer):
        self.graphdef, self.state = nnx.split(model)
        self.mesh = model.mesh
        self.fns = {}
        self.containers, variables = [], []  # every module's attribute dict, their lists
        _containers(model, self.containers, variables, set())
        self.copies = [c.copy() for c in self.containers]
        # Modules, Variables and containers are compared by identity: their == compares
        # contents (a Variable's, its value), so a new one could compare equal to the old
        held = [(c, k, v) for c in self.containers
                for k, v in (c.items() if isinstance(c, dict) else enumerate(c))
                if isinstance(v, (nnx.Pytree, nnx.Variable, dict, list, tuple))]
        self.where = tuple(c for c, _, _ in held)
        self.keys = tuple(k for _, k, _ in held)
        self.held = tuple(v for _, _, v in held)
        ours = {id(v) for v in variables}
        theirs = jax.tree.leaves(self.state, is_leaf=lambda x: isinstance(x, nnx.Variable))
        # values set in place reach the state only if it holds the model's own Variables
        self.shared = ours == {id(v) for v in theirs}
        # What the jitted phases are handed (phases.passed_state), made again whenever a
        # Variable's value has been replaced in place (model.w[...] = ...): 147 identity
        # checks on llama-309m, some 20 microseconds.
        self.variables, self.raw, self.values = theirs, None, None

    def arrays(self):
        """The state's arrays as the jitted phases take them, current."""
        now = [v.get_raw_value() for v in self.variables]
        if self.raw is None or not all(map(operator.is_, now, self.raw)):
            self.raw, self.values = now, phases.passed_state(self.state, self.mesh)
        return self.values

    def current(self) -> bool:
        """Every attribute of every module as it was at the split: the same names and values,
        and the very same modules, Variables and containers (loops in C: tens of microseconds
        for a few hundred modules, where a split takes milliseconds)."""
        try:  # == on each attribute: identity first, then the value's own ==
            same = all(map(operator.eq, self.copies, self.containers))
        except Exception:  # noqa: BLE001  (a replaced array's == is no bool: it has changed)
            return False
        return same and self.shared and all(map(
            operator.is_, map(operator.getitem, self.where, self.keys), self.held))

    def jitted(self, name: str):
        fn = self.fns.get(name)
        if fn is None:  # phases.jitted's own cache hashes the graphdef: too slow per call
            fn = self.fns[name] = phases.jitted(name, self.graphdef, mesh=self.mesh)
        return fn


def _containers(x, found: list, variables: list, seen: set) -> None:
    """Every module's attribute dict in the graph below x and every dict and list in them
    (into `found`), and every Variable (into `variables`)."""
    if id(x) in seen:
        return
    seen.add(id(x))
    if isinstance(x, nnx.Variable):
        variables.append(x)
    if isinstance(x, nnx.Pytree):
        x = vars(x)
    if isinstance(x, (dict, list)):
        found.append(x)
    if isinstance(x, (dict, list, tuple)):
        for v in x.values() if isinstance(x, dict) else x:
            _containers(v, found, variables, seen)


_SPLITS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # model -> _Split


def _split(model: Transformer) -> _Split:
    """The model's split, made again whenever the module graph has changed since."""
    split = _SPLITS.get(model)
    if split is None or not split.current():
        split = _SPLITS[model] = _Split(model)
    return split


class _Known:
    """A cache this API returned: for which config and batch it was checked, and the
    position of its furthest sequence (None for an unbounded cache, which needs none)."""

    __slots__ = ("ref", "cfg", "batch", "pos")

    def __init__(self, ref, cfg: ModelConfig, batch: int, pos: int | None):
        self.ref, self.cfg, self.batch, self.pos = ref, cfg, batch, pos


_KNOWN: dict[int, _Known] = {}  # id(cache) -> _Known, dropped when that cache object dies


def _remember(cache: Cache, cfg: ModelConfig, batch: int, pos: int | None) -> None:
    key = id(cache)

    def forget(ref):
        if (known := _KNOWN.get(key)) is not None and known.ref is ref:
            del _KNOWN[key]

    _KNOWN[key] = _Known(weakref.ref(cache, forget), cfg, batch, pos)


def _checked_position(cfg: ModelConfig, cache, batch: int) -> int | None:
    """Check `cache` for this model and batch; return its furthest sequence's position
    (None when the cache is unbounded): from the host for a cache this API returned, else
    checked in full and read from the device."""
    known = _KNOWN.get(id(cache))
    if (known is not None and known.ref() is cache and known.batch == batch
            and (known.cfg is cfg or known.cfg == cfg)):
        return known.pos
    check_cache(cfg, cache, batch)
    if cache.max_len is None:
        return None
    return int(jnp.max(cache.pos))  # the furthest sequence (pos is [B], or a scalar)


def _check_room(cache: Cache, pos: int | None, new: int) -> None:
    if pos is not None and pos + new > cache.max_len:
        raise ValueError(f"sequence of {pos} + {new} tokens would pass the cache's max_len="
                         f"{cache.max_len}; make the cache larger with init_cache(max_len=...)")


def _append(model: Transformer, phase: str, tokens: np.ndarray, cache: Cache):
    """Run `phase` ("prefill" or "decode") on tokens [B, T] or [B] checked against `cache`."""
    B, T = tokens.shape[0], (tokens.shape[1] if tokens.ndim == 2 else 1)
    pos = _checked_position(model.cfg, cache, B)
    _check_room(cache, pos, T)
    split = _split(model)
    logits, cache = split.jitted(phase)(split.arrays(), tokens, cache)
    _remember(cache, model.cfg, B, None if pos is None else pos + T)
    return logits, cache


def forward(model: Transformer, tokens) -> jax.Array:
    """int32 [B, T] -> float32 logits [B, T, V], causal, without a cache."""
    cfg = model.cfg
    tokens = _host_tokens(tokens, 2, "tokens", cfg.vocab_size)
    if cfg.position == "learned" and tokens.shape[1] > cfg.max_position:
        raise ValueError(f"tokens of length {tokens.shape[1]} pass max_position="
                         f"{cfg.max_position} of the learned position embedding")
    split = _split(model)
    return split.jitted("forward")(split.arrays(), tokens)


def prefill(model: Transformer, tokens, cache: Cache) -> tuple[jax.Array, Cache]:
    """Append tokens [B, T] to the cache (which may already hold tokens: chunked prefill).
    Returns logits [B, T, V] and the cache; the cache passed in is donated."""
    tokens = _host_tokens(tokens, 2, "tokens", model.cfg.vocab_size)
    return _append(model, "prefill", tokens, cache)


def decode_step(model: Transformer, token, cache: Cache) -> tuple[jax.Array, Cache]:
    """One token per sequence [B] -> logits [B, V] and the cache (donated) advanced by one."""
    return _append(model, "decode", _host_tokens(token, 1, "token", model.cfg.vocab_size), cache)


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
    split = _split(model)
    state, step = split.arrays(), split.jitted("decode")
    logits, cache = split.jitted("prefill")(state, prompt, cache)
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
    split = _split(model)
    return _router_stats(split.graphdef, split.arrays(),
                         _tokens(tokens, 2, "tokens", model.cfg.vocab_size))


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
