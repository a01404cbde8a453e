"""The phases of inference as pure functions of the split model state, each jittable alone.

`prefill` (a prompt chunk into the cache), `decode` (one whole step), and the two halves of a
decode step the roofline separates: `decode_attention` (every layer's mixer on one token per
sequence, reading the cache) and `decode_ffn` (every layer's FFN on one token per sequence,
reading the FFN weights). The names are fixed: the same strings name the `jax.named_scope`s
in the code, the cost model's phases (`refmodel.costs`), the benchmark results and the figures.

Everything is a pure function of `(state, inputs, cache)` with the graph definition bound
statically, and jitted with `jax.jit` (not `nnx.jit`, which splits and merges the module state on
every call: several times slower on a decode step) with the cache donated.
`Phases(model).jitted[name]` is the very callable that the benchmarks time and that the
compiler cross-check lowers.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from refmodel.model import Cache, init_cache

PHASES = ("prefill", "decode_attention", "decode_ffn", "decode")


def forward(graphdef, state, tokens):
    """tokens [B, T] -> logits [B, T, V], causal, no cache."""
    model = nnx.merge(graphdef, state)
    with jax.named_scope("forward"):
        return model(tokens)[0]


def prefill(graphdef, state, tokens, cache: Cache):
    """tokens [B, T] appended to the cache -> (logits [B, T, V], cache)."""
    model = nnx.merge(graphdef, state)
    with jax.named_scope("prefill"):
        return model(tokens, cache)


def decode(graphdef, state, token, cache: Cache):
    """token [B] -> (logits [B, V], cache advanced by one)."""
    model = nnx.merge(graphdef, state)
    with jax.named_scope("decode"):
        logits, cache = model(token[:, None], cache)
    return logits[:, 0], cache


def decode_attention(graphdef, state, x, cache: Cache, layers: tuple[int, ...] | None = None):
    """Every layer's (or the given layers') residual mixer on x [B, D], at position cache.pos.

    Returns (x [B, D], cache with those layers' entries written). The position is not
    advanced: this is the attention half of a step, to be timed alone at a fixed context.
    """
    model = nnx.merge(graphdef, state)
    new = list(cache.layers)
    h = x[:, None]  # [B, 1, D]
    with jax.named_scope("decode_attention"):
        for i in layers if layers is not None else range(len(model.blocks)):
            h, new[i] = model.blocks[i].mix(h, cache.pos, cache.layers[i])
    return h[:, 0], cache.replace(layers=tuple(new))


def decode_ffn(graphdef, state, x, layers: tuple[int, ...] | None = None):
    """Every layer's (or the given layers') residual FFN on x [B, D] -> [B, D]."""
    model = nnx.merge(graphdef, state)
    h = x[:, None]  # [B, 1, D]
    with jax.named_scope("decode_ffn"):
        for i in layers if layers is not None else range(len(model.blocks)):
            h = model.blocks[i].feed(h)
    return h[:, 0]


# Every phase and the argument it donates, by its number in the jitted call (state, x, cache):
# the cache, whose buffers the updated cache reuses. The one table `jitted` and `donation`
# both read.
_PURE = {"forward": forward, "prefill": prefill, "decode": decode,
         "decode_attention": decode_attention, "decode_ffn": decode_ffn}
_DONATED = {"prefill": 2, "decode": 2, "decode_attention": 2}


@functools.lru_cache(maxsize=64)
def jitted(name: str, graphdef, layers: tuple[int, ...] | None = None, mesh=None):
    """The jitted phase `name` for one graph, its cache donated (cached, so each compiles once
    per shape). `Phases(model).jitted[name]` is the same callable. With a mesh (a model from
    `refmodel.parallel.shard`), one SPMD program over its devices."""
    fn = functools.partial(_PURE[name], graphdef)
    if layers is not None:
        fn = functools.partial(fn, layers=layers)
    if mesh is not None:
        from refmodel.parallel.spmd import spmd

        fn = spmd(name, fn, graphdef, mesh)
    return jax.jit(fn, donate_argnums=donation(name)[0])


def passed_state(state: nnx.State, mesh=None):
    """The split state as the jitted phases are best handed it. Every call flattens the state
    it is given and checks the structure against the compiled one, on the host, before the
    step starts: for llama-309m an nnx.State (a Python pytree node per module and Variable)
    took 0.7 ms of that, a plain dict of the same arrays 0.45 ms (`nnx.merge` takes either).
    A sharded model keeps its State: the sharding rules read the Variables' paths."""
    return state if mesh is not None else nnx.to_pure_dict(state)


class Phases:
    """A model split once into (graphdef, state) with its jitted phase functions; the state is
    the split's arrays as a plain nested dict (an nnx.State for a sharded model).

    `phases.jitted["decode"](phases.state, token, cache)` is what the benchmarks time.
    `phases.layer("decode_ffn", 0)` is the same phase restricted to one layer.
    """

    def __init__(self, model: nnx.Module):
        self.cfg = model.cfg
        self.graphdef, state = nnx.split(model)
        self.mesh = getattr(model, "mesh", None)  # refmodel.parallel.shard: one SPMD program
        self.state = passed_state(state, self.mesh)
        self.jitted = {name: jitted(name, self.graphdef, mesh=self.mesh) for name in _PURE}

    def layer(self, name: str, index: int):
        if name not in ("decode_attention", "decode_ffn"):
            raise ValueError(f"phase {name!r} has no one-layer form; use decode_attention "
                             "or decode_ffn")
        if not 0 <= index < self.cfg.n_layers:
            raise ValueError(f"layer={index} is not in [0, {self.cfg.n_layers})")
        return jitted(name, self.graphdef, (index,), self.mesh)

    def experts_touched(self, x: jax.Array) -> list[int]:
        """decode_ffn on x [B, D], routed as it runs: the number of distinct experts each MoE
        layer's B tokens choose, in layer order ([] without MoE layers). A step reads those
        experts' weights; the count (`moe.expected_distinct_experts`) assumes their
        expectation over random routing, E (1 - (1 - A/E)^B)."""
        model = nnx.merge(self.graphdef, self.state)
        h, touched = x[:, None], []
        for block in model.blocks:
            if block.ffn_kind == "moe":
                _, idx = block.ffn.route(block.ffn_norm(h).reshape(-1, h.shape[-1]))
                touched.append(int(np.unique(np.asarray(idx)).size))
            h = block.feed(h)
        return touched

    def hidden(self, batch: int, seed: int = 0) -> jax.Array:
        """A random residual-stream input x [B, D] for the decode half-phases."""
        x = np.random.default_rng(seed).standard_normal((batch, self.cfg.d_model), np.float32)
        return jnp.asarray(x, jnp.dtype(self.cfg.dtype))

    def example_args(self, phase: str, batch: int, context: int, fill: bool = False,
                     seed: int = 0) -> tuple:
        """Arguments of `jitted[phase]` at (batch, context), with the cache the cost model
        counts: max_len = context for prefill (from empty), context + 1 for the decode phases
        (at position context). fill=True fills the cache with random normal values (what the
        benchmarks time: never zeros); the compiler cross-check needs only the shapes."""
        cfg, rng = self.cfg, np.random.default_rng(seed)

        def tokens(shape):
            return jnp.asarray(rng.integers(0, cfg.vocab_size, shape), jnp.int32)

        if phase == "prefill":
            return self.state, tokens((batch, context)), init_cache(cfg, batch, context)
        if phase == "decode_ffn":
            return self.state, self.hidden(batch, seed)
        if phase not in ("decode", "decode_attention"):
            raise ValueError(f"phase={phase!r} is not one of {PHASES}")
        cache = init_cache(cfg, batch, context + 1)
        cache = cache.replace(pos=jnp.full((batch,), context, jnp.int32))  # every row at context
        if fill:
            cache = cache.replace(layers=jax.tree.map(lambda a: _random_like(a, rng),
                                                      cache.layers))
        first = self.hidden(batch, seed) if phase == "decode_attention" else tokens((batch,))
        return self.state, first, cache


def _random_like(a: jax.Array, rng: np.random.Generator) -> jax.Array:
    """Random normal values of a's shape for floating leaves; integer leaves unchanged."""
    if not jnp.issubdtype(a.dtype, jnp.floating):
        return a
    return jnp.asarray(rng.standard_normal(a.shape, np.float32), a.dtype)


def donation(name: str) -> tuple[tuple[int, ...], object]:
    """(donated argument numbers, carry) of phase `name`: which inputs the jitted phase
    donates, and a function picking from its output the values to pass in their place on
    the next call (the updated cache)."""
    if name in _DONATED:
        return (_DONATED[name],), lambda out: (out[1],)
    return (), None
