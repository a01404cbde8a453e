"""What the public API costs on the host: `refmodel.decode_step` against the jitted step it runs.

A user's loop calls `refmodel.decode_step(model, token, cache)`, which checks its inputs on the
host and then runs the jitted pure step `refmodel.phases.jitted("decode", graphdef)(state,
token, cache)`: the very callable the phase benchmarks and the decode race time. Any host work
in front of that call (splitting the module, checking the cache, reading its position back from
the device) adds to every token, and a read of the device also waits for the previous step, so
it would cost async dispatch as well. `public_overhead` times both on the same model, the same
cache contents and the same token ids, in interleaved rounds (the machine drifts over minutes,
so the comparison is taken inside each round), blocking on the logits of every step, with
compilation and one step of each path done before the clock starts. Token ids are fed as a host
numpy int32 array [B] to both, as ids from a tokenizer arrive.

The result: `raw_s`, `public_s` (a step until its logits are ready) and `overhead_s` (public_s -
raw_s within a round), each the median over rounds of that round's median; `raw_call_s`,
`public_call_s` and `call_overhead_s`, the same for the call alone, until it returns with the
step queued (the host's part, which the step time of a large model hides in its noise); each
round's values and samples under `rounds`; the model, backend, shape and machine.
"""

from __future__ import annotations

import time

import numpy as np


def public_overhead(model: str = "tiny", batch: int = 1, context: int = 64, steps: int = 32,
                    rounds: int = 5, backend: str = "auto", seed: int = 0) -> dict:
    """Seconds per decode step of the raw jitted step and of the public `decode_step`.

    `model` is a refmodel preset, `backend` a choice of `refmodel.backends.choose` ("auto":
    the native kernels where they run, for float32 weights). Each round runs `steps` steps of
    each path from a cache at position `context`."""
    for name, value in (("batch", batch), ("context", context), ("steps", steps),
                        ("rounds", rounds)):
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ValueError(f"{name}={value!r} must be a positive integer")
    net, chosen = _model(model, backend, seed)
    cache0, ids = _inputs(net, batch, context, steps, seed)
    raw, public = _paths(net)
    per_round = []
    for r in range(rounds):
        order = (("raw", raw), ("public", public))
        runs = {name: _run(fn, ids, cache0) for name, fn in (order if r % 2 == 0
                                                             else order[::-1])}
        per_round.append(_round(runs))
    keys = ("raw_s", "public_s", "overhead_s", "raw_call_s", "public_call_s", "call_overhead_s")
    med = {k: float(np.median([x[k] for x in per_round])) for k in keys}
    return {**med, "overhead_fraction": med["overhead_s"] / med["raw_s"], "rounds": per_round,
            "model": model, "backend": chosen, "batch": batch, "context": context,
            "steps": steps, "machine": _machine(), "tokens": "numpy int32 [B] on the host"}


def _round(runs: dict) -> dict:
    """One round's medians: whole steps (`*_s`) and the calls alone (`*_call_s`)."""
    out = {}
    for name, (steps, calls) in runs.items():
        out[f"{name}_s"], out[f"{name}_call_s"] = float(np.median(steps)), float(np.median(calls))
        out[f"{name}_samples"], out[f"{name}_call_samples"] = steps, calls
    out["overhead_s"] = out["public_s"] - out["raw_s"]
    out["call_overhead_s"] = out["public_call_s"] - out["raw_call_s"]
    return out


def _model(name: str, backend: str, seed: int):
    """(the model on the chosen backend, the backend's name)."""
    import refmodel
    from refmodel import backends

    cfg = refmodel.presets.get(name)
    net = refmodel.init(cfg, seed=seed)
    chosen = backends.choose(backend, cfg.dtype, cfg.weight_format)
    if chosen != cfg.backend:
        net = backends.use(net, chosen)
    return net, chosen


def _inputs(net, batch: int, context: int, steps: int, seed: int):
    """A cache at position `context` with room for one untimed and `steps` timed steps, its
    float entries random normal (never zeros), and the token ids of every step."""
    import jax
    import jax.numpy as jnp

    import refmodel

    cfg, rng = net.cfg, np.random.default_rng(seed)
    cache = refmodel.init_cache(cfg, batch, context + steps + 1)

    def fill(a):
        if not jnp.issubdtype(a.dtype, jnp.floating):
            return a
        return jnp.asarray(rng.standard_normal(a.shape, np.float32), a.dtype)

    cache = cache.replace(layers=jax.tree.map(fill, cache.layers),
                          pos=jnp.full((batch,), context, jnp.int32))
    ids = rng.integers(0, cfg.vocab_size, (steps + 1, batch)).astype(np.int32)
    return cache, ids


def _paths(net):
    """(raw, public): two functions (token, cache) -> (logits, cache) on the same weights."""
    from flax import nnx

    import refmodel

    graphdef, state = nnx.split(net)
    step = refmodel.phases.jitted("decode", graphdef, mesh=getattr(net, "mesh", None))

    def raw(token, cache):
        return step(state, token, cache)

    def public(token, cache):
        return refmodel.decode_step(net, token, cache)

    return raw, public


def _run(fn, ids: np.ndarray, cache0) -> tuple[list[float], list[float]]:
    """(seconds of each timed step of `fn` until its logits are ready, seconds until the call
    returned: the host's part, the step queued) from a copy of cache0 (the step donates its
    cache), after one untimed step that compiles (the first time) and warms the path."""
    import jax
    import jax.numpy as jnp

    cache = jax.tree.map(lambda a: jnp.array(a, copy=True), cache0)
    logits, cache = fn(ids[0], cache)
    logits.block_until_ready()
    steps, calls = [], []
    for token in ids[1:]:
        t0 = time.perf_counter()
        logits, cache = fn(token, cache)
        t1 = time.perf_counter()
        logits.block_until_ready()
        steps.append(time.perf_counter() - t0)
        calls.append(t1 - t0)
    return steps, calls


def _machine() -> str | None:
    from microbench import machines

    return machines.this_machine()
