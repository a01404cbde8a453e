"""Quantization measured: which formulation of a quantized product XLA runs fast, the decode
and prefill steps at every precision beside their counted bytes, and the quality each costs.

Three parts, one JSON (`python -m microbench quant`; --quick shrinks every part):

- `formulations`: one [K, N] weight times 1 and 8 activation rows, every way of writing the
  product in JAX (float32 and bfloat16 dots; int8 dequantize-then-dot, dot with
  `preferred_element_type`, int8 x int8 -> int32, and refmodel's fused multiply-and-reduce
  over the output-major weight; int4 and float8 the same way), timed in interleaved rounds;
  bandwidth is the stored weight bytes over the time and each is a ratio to float32 of the
  same round. The lesson: bytes only become speed when the kernel streams them.
- `steps`: the `medium` model's decode step (batch 1, and a batch of 8) and a prefill at each
  precision (float32, bfloat16, int8, int8 with int8 activations, float8, int4; and an int8 KV
  cache at long context), interleaved rounds; counted bytes (`refmodel.costs`), bytes per
  second, speedup over float32 in the same round, and the bytes-over-bandwidth prediction when
  a peaks.json gives this machine's DRAM read roof.
- `quality`: bits per byte on the trained byte-level target's validation split
  (`refmodel.training`; --quick: the seconds-trained micro model) for each weight format and
  KV format, with the counted weight and KV bytes; also the relative max logit error against
  the float model on the same tokens.
"""

from __future__ import annotations

import dataclasses
import statistics
import time
from dataclasses import dataclass

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

# (label, dtype, weight_format, kv_format, quant_activations) of each step precision.
PRECISIONS = {
    "float32": ("float32", "none", "none", False),
    "bfloat16": ("bfloat16", "none", "none", False),
    "int8": ("float32", "int8", "none", False),
    "int8 w8a8": ("float32", "int8", "none", True),
    "float8": ("float32", "float8", "none", False),
    "int4": ("float32", "int4", "none", False),
}
KV_PRECISIONS = ("none", "int8", "float8")


@dataclass(frozen=True)
class Setup:
    k: int = 4096  # the formulation weight [K, N]
    n: int = 4096
    rows: tuple[int, ...] = (1, 8)
    rounds: int = 3  # interleaved timing rounds
    repeats: int = 7  # calls per round (median)
    model: str = "medium"
    precisions: tuple[str, ...] = tuple(PRECISIONS)
    batches: tuple[int, ...] = (1, 8)
    context: int = 256  # cached tokens of the decode steps
    prefill_len: int = 256
    kv_context: int = 4096  # the long-context decode where the KV cache's bytes matter
    quality_model: str = "target"  # a recipe of refmodel.training
    weight_formats: tuple[str, ...] = ("none", "int8", "float8", "int4")

    def check(self) -> None:
        from refmodel import presets
        from refmodel.training import recipes

        presets.get(self.model)
        recipes.get(self.quality_model)
        for f in ("k", "n", "rounds", "repeats", "context", "prefill_len", "kv_context"):
            v = getattr(self, f)
            if not isinstance(v, int) or v < 1:
                raise ValueError(f"quant setup: {f}={v!r} must be a positive integer")
        bad = set(self.precisions) - set(PRECISIONS)
        if bad or not self.precisions or "float32" not in self.precisions:
            raise ValueError(f"quant setup: precisions={self.precisions!r}; choose among "
                             f"{list(PRECISIONS)}, float32 included (the reference)")


QUICK = Setup(k=1024, n=1024, rounds=2, repeats=3, model="small", batches=(1,), context=32,
              prefill_len=32, kv_context=256, quality_model="micro",
              precisions=("float32", "int8", "int4"))


# Formulations ----------------------------------------------------------------------------------

def formulations(k: int, n: int, seed: int = 0) -> dict:
    """{name: (format, used by refmodel, fn, args)}: every product of x [M, K] with the weight."""
    from refmodel import quant

    rng = np.random.default_rng(seed)
    w = jnp.asarray(rng.standard_normal((k, n)), jnp.float32) * k**-0.5
    q8, q4, f8 = (quant.quantize_matrix(w, f) for f in ("int8", "int4", "float8"))
    q8_kn = jnp.asarray(np.asarray(q8.q).T.copy())  # int8 [K, N], input-major like the float
    wb = w.astype(jnp.bfloat16)
    s = q8.scale
    return {
        "float32 dot": ("float32", True, lambda x, w: x @ w, (w,)),
        "bfloat16 dot": ("bfloat16", False, lambda x, w: jnp.dot(
            x.astype(jnp.bfloat16), w, preferred_element_type=jnp.float32), (wb,)),
        "int8 dequantize then dot": ("int8", False,
                                     lambda x, q, s: x @ (q.astype(jnp.float32) * s), (q8_kn, s)),
        "int8 dot, preferred f32": ("int8", False, lambda x, q, s: jax.lax.dot(
            x, q, preferred_element_type=jnp.float32) * s, (q8_kn, s)),
        "int8 x int8 -> int32 dot": ("int8", False, _w8a8, (q8_kn, s)),
        "int8 multiply-reduce [N, K]": ("int8", True, quant.matmul, (q8,)),
        "int4 multiply-reduce [N, K/2]": ("int4", True, quant.matmul, (q4,)),
        "float8 multiply-reduce [N, K]": ("float8", True, quant.matmul, (f8,)),
    }


def _w8a8(x, q, s):
    sx = jnp.max(jnp.abs(x), axis=-1, keepdims=True) / 127
    xq = jnp.clip(jnp.round(x / sx), -127, 127).astype(jnp.int8)
    return jax.lax.dot(xq, q, preferred_element_type=jnp.int32).astype(jnp.float32) * sx * s


def _stored_bytes(args) -> int:
    return sum(getattr(a, "nbytes", 0) for a in jax.tree.leaves(args))


def _median_seconds(fn, args, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        jax.block_until_ready(fn(*args))
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def measure_formulations(setup: Setup, progress) -> dict:
    forms = formulations(setup.k, setup.n)
    rng = np.random.default_rng(1)
    rows = []
    for m in setup.rows:
        x = jnp.asarray(rng.standard_normal((m, setup.k)), jnp.float32)
        fns = {name: jax.jit(f) for name, (_, _, f, _) in forms.items()}
        ref = np.asarray(fns["float32 dot"](x, *forms["float32 dot"][3]))
        for name, (_, _, _, args) in forms.items():
            out = np.asarray(fns[name](x, *args))  # compile, and check it is the product
            err = float(np.abs(out - ref).max() / np.abs(ref).max())
            if err > 0.2:
                raise AssertionError(f"formulation {name!r} is not the product: error {err:.3f}")
        seconds = {name: [] for name in forms}
        for r in range(setup.rounds):
            progress(f"formulations, {m} rows: round {r + 1} of {setup.rounds}")
            for name, (_, _, _, args) in forms.items():
                seconds[name].append(_median_seconds(fns[name], (x, *args), setup.repeats))
        for name, (fmt, used, _, args) in forms.items():
            t = statistics.median(seconds[name])
            ratios = [a / b for a, b in zip(seconds["float32 dot"], seconds[name], strict=True)]
            rows.append({"name": name, "format": fmt, "rows": m, "used": used,
                         "stored_bytes": _stored_bytes(args), "seconds": t,
                         "rounds": seconds[name], "bytes_per_s": _stored_bytes(args) / t,
                         "speedup": statistics.median(ratios)})
    return {"k": setup.k, "n": setup.n, "results": rows}


# Steps -----------------------------------------------------------------------------------------

def _phase_call(model, phase: str, batch: int, context: int):
    """A zero-argument call of the jitted phase (refmodel.phases: the cache donated and each
    call's updated cache passed to the next, as `microbench phases` times it), compiled."""
    import refmodel
    from refmodel.phases import donation

    phases = refmodel.Phases(model)
    args = list(phases.example_args(phase, batch, context, fill=True))
    donate, carry = donation(phase)
    fn = phases.jitted[phase]

    def call():
        out = fn(*args)
        jax.block_until_ready(out)
        for i, v in zip(donate, carry(out), strict=True):
            args[i] = v

    call()
    return call


def step_models(setup: Setup) -> dict:
    """{label: model} of the step precisions, all from one float32 draw of the weights."""
    import refmodel
    from refmodel import presets, quant

    base = refmodel.init(presets.get(setup.model), seed=0)
    out = {}
    for label in setup.precisions:
        dtype, wf, _, acts = PRECISIONS[label]
        if dtype != "float32":
            g, state = nnx.split(nnx.eval_shape(lambda dtype=dtype: refmodel.init(
                base.cfg.replace(dtype=dtype), seed=0)))
            cast = jax.tree.map(lambda a, like: a.astype(like.dtype), nnx.state(base), state)
            out[label] = nnx.merge(g, cast)
        elif wf != "none":
            out[label] = quant.quantize(base, weights=wf, activations=acts)
        else:
            out[label] = base
    return out


def measure_steps(setup: Setup, memory_roof: float | None, progress) -> dict:
    from refmodel import costs, quant

    models = step_models(setup)
    cases = []  # (label, phase, batch, context, kv)
    for label in setup.precisions:
        for b in setup.batches:
            cases.append((label, "decode", b, setup.context, "none"))
        cases.append((label, "prefill", 1, setup.prefill_len, "none"))
    for kv in KV_PRECISIONS:
        cases.append(("float32", "decode", 1, setup.kv_context, kv))
    calls = {}
    for case in cases:
        label, phase, b, ctx, kv = case
        progress(f"compiling {label} {phase} batch {b} (KV {kv})")
        model = models[label] if kv == "none" else quant.quantize(models[label], kv=kv)
        calls[case] = (_phase_call(model, phase, b, ctx), model.cfg)
    seconds = {case: [] for case in cases}
    for r in range(setup.rounds):
        progress(f"steps: round {r + 1} of {setup.rounds}")
        for case, (call, _) in calls.items():
            seconds[case].append(_median_seconds(call, (), setup.repeats))
    rows = []
    for case, (_, cfg) in calls.items():
        label, phase, b, ctx, kv = case
        ref = ("float32", phase, b, ctx, "none")
        t = statistics.median(seconds[case])
        c = costs.phase_costs(cfg, phase, b, ctx)
        ratios = [a / s for a, s in zip(seconds[ref], seconds[case], strict=True)]
        row = {"precision": label, "phase": phase, "batch": b, "context": ctx,
               "kv_format": kv, "weight_format": cfg.weight_format, "dtype": cfg.dtype,
               "activations": "int8" if cfg.quant_activations else cfg.dtype,
               "seconds": t, "rounds": seconds[case], "speedup": statistics.median(ratios),
               "flops": c["flops"], "bytes": c["bytes"], "weight_bytes": c["weight_bytes"],
               "kv_bytes": c["kv_bytes"], "intensity": c["intensity"],
               "bytes_per_s": c["bytes"] / t, "flops_per_s": c["flops"] / t}
        if memory_roof:
            row["predicted_s"] = c["bytes"] / memory_roof
            row["measured_over_predicted"] = row["predicted_s"] / t
        rows.append(row)
    return {"model": setup.model, "memory_roof": memory_roof, "results": rows}


# Quality ---------------------------------------------------------------------------------------

def measure_quality(setup: Setup, progress) -> dict:
    import refmodel
    from refmodel import costs, quant
    from refmodel.training import bits_per_byte, recipes, trained

    progress(f"quality: model {setup.quality_model} (trained first if not cached)")
    model = trained(setup.quality_model, progress=False)
    toks = jnp.asarray(np.random.default_rng(0).integers(1, 257, (2, 128)), jnp.int32)
    ref = refmodel.forward(model, toks)
    cases = [(w, "none") for w in setup.weight_formats] + \
            [("none", kv) for kv in KV_PRECISIONS if kv != "none"]
    rows = []
    for w, kv in cases:
        progress(f"quality: weights {w}, KV {kv}")
        q = quant.quantize(model, weights=None if w == "none" else w,
                           kv=None if kv == "none" else kv)
        if kv == "none":
            err = float(jnp.abs(refmodel.forward(q, toks) - ref).max() / jnp.abs(ref).max())
        else:  # the cache only rounds what decode reads back: prefill half, decode the rest
            err = _kv_logit_error(model, q, toks)
        cfg = q.cfg
        decode = costs.phase_costs(cfg, "decode", 1, 1024)
        rows.append({"weight_format": w, "kv_format": kv,
                     "bits_per_byte": bits_per_byte(q, setup.quality_model),
                     "logit_error": err, "weight_bytes": _param_bytes(q),
                     "kv_bytes_per_token": costs.kv_bytes_per_token(
                         cfg, costs.dtypes(cfg).kv),
                     "decode_bytes": decode["bytes"]})
    base = rows[0]["bits_per_byte"]
    for row in rows:
        row["delta_bits_per_byte"] = row["bits_per_byte"] - base
    r = recipes.get(setup.quality_model)
    return {"recipe": r.name, "preset": r.model, "metric": "bits per byte, validation split",
            "results": rows}


def _param_bytes(model) -> int:
    return sum(x.nbytes for x in jax.tree.leaves(nnx.state(model, nnx.Param)))


def _kv_logit_error(float_model, kv_model, toks) -> float:
    """Relative max logit error of decoding the second half of toks token by token after
    prefilling the first, quantized cache vs float cache (the same weights)."""
    import refmodel

    def decode_logits(model):
        T = toks.shape[1]
        cache = refmodel.init_cache(model.cfg, toks.shape[0], T)
        _, cache = refmodel.prefill(model, toks[:, :T // 2], cache)
        out = []
        for t in range(T // 2, T):
            logits, cache = refmodel.decode_step(model, toks[:, t], cache)
            out.append(logits)
        return jnp.stack(out, axis=1)

    ref = decode_logits(float_model)
    return float(jnp.abs(decode_logits(kv_model) - ref).max() / jnp.abs(ref).max())


def measure(setup: Setup, memory_roof: float | None = None, progress=lambda what: None) -> dict:
    """Everything the module docstring lists, as one JSON-ready dict."""
    setup.check()
    t0 = time.perf_counter()
    out = {"kind": "quant", "setup": dataclasses.asdict(setup)}
    out["formulations"] = measure_formulations(setup, progress)
    out["steps"] = measure_steps(setup, memory_roof, progress)
    out["quality"] = measure_quality(setup, progress)
    out["wall_s"] = time.perf_counter() - t0
    return out
