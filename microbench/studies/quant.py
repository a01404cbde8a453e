"""Quantization measured: the decode and prefill steps at every precision on two paths, beside
their counted bytes; which formulation of a quantized product XLA runs fast; and the quality
each format costs.

Three parts, one JSON (`python -m microbench quant`; --quick shrinks every part):

- `steps`: a decode step (batch 1, and a batch of 8) and a prefill at each precision on two
  paths, timed in interleaved rounds. The fast path is the native kernel (backend "native",
  where `backends.choose("auto")` gives it: a CPU where the kernels build): float32, int8
  weight-only, int8 weights with int8 activations (w8a8) and int4 with int8 activations
  (w4a8), the integer dot products llama.cpp's Q8_0 and Q4_0 run. XLA's path (backend "xla")
  is what a compiler without such a kernel does with the same formats: float32, bfloat16, int8,
  w8a8, float8, int4; and an int8 and a float8 KV cache at long context. Each time is a speedup
  over float32 of the same path in the same round, beside its bytes ratio (float32's counted
  bytes over the format's, `refmodel.costs`): a memory-bound step that streams its bytes has a
  speedup near its bytes ratio. A path or a format that cannot run here is recorded as
  "skipped: <why>", never timed on something else.
- `formulations`: one [K, N] weight times 1 and 8 activation rows, every way of writing the
  product in JAX (float32 and bfloat16 dots; int8 dequantize-then-dot, dot with
  `preferred_element_type`, int8 x int8 -> int32, and refmodel's fused multiply-and-reduce over
  the output-major weight; int4 and float8 the same way), interleaved rounds: which of XLA's
  formulations streams the small bytes at all.
- `quality`: bits per byte on the trained byte-level target's validation split
  (`refmodel.training`; --quick: the seconds-trained micro model) for each weight, activation
  and KV format, and the KL divergence of its next-token distribution from the float model's
  (mean over the positions of validation text, in nats, as llama.cpp's `perplexity
  --kl-divergence` reports it), with the counted weight and KV bytes.

Quick mode times the `medium` preset cut to the fewest layers whose int8 weights are at least
LLC_MARGIN times this machine's last-level cache (`quick_setup`): a step that fits in the cache
measures the cache, not the memory-bound behaviour the lesson is about.
"""

from __future__ import annotations

import dataclasses
import functools
import statistics
import time
from dataclasses import dataclass

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

# label: (dtype, weight_format, activations rounded to int8) of each precision.
PRECISIONS = {
    "float32": ("float32", "none", False),
    "bfloat16": ("bfloat16", "none", False),
    "int8": ("float32", "int8", False),
    "int8 w8a8": ("float32", "int8", True),
    "float8": ("float32", "float8", False),
    "int4": ("float32", "int4", False),
    "int4 w4a8": ("float32", "int4", True),
}
NATIVE = ("float32", "int8", "int8 w8a8", "int4 w4a8")  # what the native backend takes
XLA = ("float32", "bfloat16", "int8", "int8 w8a8", "float8", "int4")
PATHS = ("native", "xla")
KV_PRECISIONS = ("none", "int8", "float8")
LLC_MARGIN = 2  # quick mode's int8 step weights: at least this many last-level caches


@dataclass(frozen=True)
class Setup:
    k: int = 4096  # the formulation weight [K, N]
    n: int = 4096
    rows: tuple[int, ...] = (1, 8)
    rounds: int = 3  # interleaved timing rounds
    repeats: int = 7  # calls per round (median)
    model: str = "medium"
    layers: int = 0  # 0: the preset's layers; else its first `layers`
    native: tuple[str, ...] = NATIVE  # the fast path's precisions (float32 first)
    xla: tuple[str, ...] = XLA  # XLA's path's precisions
    batches: tuple[int, ...] = (1, 8)
    context: int = 256  # cached tokens of the decode steps
    prefill_len: int = 256  # 0: no prefill timed
    kv_formats: tuple[str, ...] = KV_PRECISIONS  # () : no long-context KV cases
    kv_context: int = 4096  # the long-context decode where the KV cache's bytes matter
    quality_model: str = "target"  # a recipe of refmodel.training
    quality: tuple[str, ...] = ("float32", "int8", "int8 w8a8", "float8", "int4", "int4 w4a8")

    def check(self) -> None:
        from refmodel import presets
        from refmodel.training import recipes

        presets.get(self.model)
        recipes.get(self.quality_model)
        for f in ("k", "n", "rounds", "repeats", "context", "kv_context"):
            v = getattr(self, f)
            if not isinstance(v, int) or v < 1:
                raise ValueError(f"quant setup: {f}={v!r} must be a positive integer")
        for f in ("layers", "prefill_len"):
            if not isinstance(getattr(self, f), int) or getattr(self, f) < 0:
                raise ValueError(f"quant setup: {f}={getattr(self, f)!r} must be an integer "
                                 ">= 0 (0: the preset's layers; no prefill)")
        quantized = [lab for lab, (dtype, _, _) in PRECISIONS.items() if dtype == "float32"]
        for f, allowed in (("native", NATIVE), ("xla", PRECISIONS), ("quality", quantized)):
            v = getattr(self, f)
            if set(v) - set(allowed) or (v and v[0] != "float32"):
                raise ValueError(f"quant setup: {f}={v!r}; choose among {list(allowed)}, "
                                 "float32 first (the reference), or none")
        if not self.xla:
            raise ValueError("quant setup: xla=(); XLA's path needs float32 at least")
        if set(self.kv_formats) - set(KV_PRECISIONS):
            raise ValueError(f"quant setup: kv_formats={self.kv_formats!r}; choose among "
                             f"{list(KV_PRECISIONS)}")


QUICK = Setup(k=1024, n=1024, rounds=5, repeats=3, batches=(1,), context=32, prefill_len=32,
              kv_formats=(), quality_model="micro", xla=("float32", "int8", "int4"))


def llc_bytes() -> int:
    """The last-level cache this process's threads share, as the OS reports it (sysinfo, the
    way harness.Evictor reads it); 0 where it reports none."""
    from microbench import sysinfo

    caches = sysinfo.aggregate_cache_bytes(sysinfo.cache_sizes(), len(sysinfo.affinity()))
    return max((c for _, c in caches), default=0)


def step_config(setup: Setup):
    """The config the steps time: the preset, cut to `setup.layers` layers if given."""
    from refmodel import presets

    cfg = presets.get(setup.model)
    return cfg.replace(n_layers=setup.layers) if setup.layers else cfg


def weight_bytes(cfg, fmt: str, context: int) -> int:
    """The weight bytes a batch-1 decode step of cfg reads with its matrices in `fmt`."""
    from refmodel import costs

    return costs.phase_costs(cfg.replace(weight_format=fmt), "decode", 1, context)["weight_bytes"]


def quick_setup(llc: int | None = None) -> Setup:
    """QUICK with the fewest layers of its preset whose int8 step weights are at least
    LLC_MARGIN x `llc` (default: this machine's last-level cache): float32's are 4x more."""
    llc = llc_bytes() if llc is None else llc
    cfg = step_config(QUICK)
    for n in range(1, cfg.n_layers + 1):
        if weight_bytes(cfg.replace(n_layers=n), "int8", QUICK.context) >= LLC_MARGIN * llc:
            break
    return dataclasses.replace(QUICK, layers=n)


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

def native_unavailable() -> str | None:
    """Why the fast path cannot run here, or None where it can: where `backends.choose("auto")`
    gives "native" (a CPU where the native kernels build)."""
    from refmodel import backends, kernels

    if backends.choose("auto") == "native":
        return None
    if jax.default_backend() != "cpu":
        return f"the JAX backend is {jax.default_backend()}; the native kernels run on a CPU"
    return f"no native kernels here: {kernels.why_not()}"


def int8_dot() -> str | None:
    """The CPU's int8 dot-product instruction the native kernel uses (`kernels.int8_dot`), None
    where it has none; "unknown" where the kernels do not say."""
    from refmodel import kernels

    fn = getattr(kernels, "int8_dot", None)
    return fn() if fn is not None else "unknown"


def in_format(base, label: str):
    """The float32 model `base` in precision `label` (PRECISIONS), on base's backend."""
    from refmodel import quant

    dtype, wf, acts = PRECISIONS[label]
    if dtype != "float32":  # the same weights, cast
        import refmodel

        g, state = nnx.split(nnx.eval_shape(lambda: refmodel.init(
            base.cfg.replace(dtype=dtype), seed=0)))
        cast = jax.tree.map(lambda a, like: a.astype(like.dtype), nnx.state(base), state)
        return nnx.merge(g, cast)
    if wf != "none":
        return quant.quantize(base, weights=wf, activations=acts)
    return base


def left_to_xla(model) -> int:
    """How many of a native model's matrices are still `quant.Quantized` (XLA's product), not
    in one of the kernel's forms."""
    from refmodel.quant import Quantized, matrices

    return sum(isinstance(getattr(m, name)[...], Quantized) for _, m in nnx.iter_modules(model)
               for name in matrices(m) if name not in getattr(type(m), "IN_PLACE", ()))


def native_model(make):
    """The model `make()` gives, on the native kernel, or "skipped: <why>" where quantizing
    or `backends.use` refuses it (a format whose kernel this version lacks raises ValueError)
    or leaves some of its matrices to XLA: a number timed there would be XLA's, not the
    kernel's."""
    from refmodel import backends

    try:
        model = backends.use(make(), "native")
    except ValueError as e:
        return f"skipped: {e}"
    left = left_to_xla(model)
    if left:
        return (f"skipped: backends.use left {left} matrices as quant.Quantized, multiplied by "
                "XLA, not by the kernel")
    return model


def step_models(setup: Setup) -> tuple[dict, dict]:
    """({(path, label): model}, {path or (path, label): "skipped: <why>"}), every model from one
    float32 draw of the weights (each format quantized once, shared by both paths)."""
    import refmodel

    base = refmodel.init(step_config(setup), seed=0)
    formats = {}

    def fmt(label):
        if label not in formats:
            formats[label] = in_format(base, label)
        return formats[label]

    models = {("xla", label): fmt(label) for label in setup.xla}
    skipped = {}
    why = native_unavailable() if setup.native else None
    if why:
        skipped["native"] = f"skipped: {why}"
    for label in setup.native if not why else ():
        m = native_model(lambda label=label: fmt(label))
        if isinstance(m, str):
            skipped["native", label] = m
        else:
            models["native", label] = m
    return models, skipped


def step_cases(setup: Setup, models: dict, dot: str | None) -> tuple[list, dict]:
    """The timed cases (path, label, phase, batch, context, kv) and those skipped: a prefill
    with int8 activations on the native path where the CPU has no int8 dot product."""
    cases, skipped = [], {}
    for path, label in models:
        for b in setup.batches:
            cases.append((path, label, "decode", b, setup.context, "none"))
        if setup.prefill_len:
            case = (path, label, "prefill", 1, setup.prefill_len, "none")
            if path == "native" and PRECISIONS[label][2] and dot is None:
                skipped[path, label, "prefill"] = "skipped: no VNNI/i8mm"
            else:
                cases.append(case)
    if ("xla", "float32") in models:
        cases += [("xla", "float32", "decode", 1, setup.kv_context, kv)
                  for kv in setup.kv_formats]
    return cases, skipped


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


def _reference(case: tuple) -> tuple:
    """The float32 case of the same path, phase, batch and context, with a float cache."""
    path, _, phase, b, ctx, _ = case
    return (path, "float32", phase, b, ctx, "none")


def _step_row(case: tuple, cfg, seconds: dict, memory_roof: float | None) -> dict:
    from refmodel import costs

    path, label, phase, b, ctx, kv = case
    ref = _reference(case)
    t = statistics.median(seconds[case])
    c = costs.phase_costs(cfg, phase, b, ctx)
    c_ref = costs.phase_costs(cfg.replace(dtype="float32", weight_format="none",
                                          quant_activations=False, kv_format="none"),
                              phase, b, ctx)
    ratios = [a / s for a, s in zip(seconds[ref], seconds[case], strict=True)]
    row = {"path": path, "precision": label, "phase": phase, "batch": b, "context": ctx,
           "kv_format": kv, "weight_format": cfg.weight_format, "dtype": cfg.dtype,
           "activations": "int8" if cfg.quant_activations else cfg.dtype,
           "seconds": t, "rounds": seconds[case], "speedup": statistics.median(ratios),
           "speedup_rounds": ratios, "bytes_ratio": c_ref["bytes"] / c["bytes"],
           "flops": c["flops"], "bytes": c["bytes"], "weight_bytes": c["weight_bytes"],
           "kv_bytes": c["kv_bytes"], "intensity": c["intensity"],
           "bytes_per_s": c["bytes"] / t, "flops_per_s": c["flops"] / t}
    if memory_roof:
        row["predicted_s"] = c["bytes"] / memory_roof
        row["measured_over_predicted"] = row["predicted_s"] / t
    return row


def measure_steps(setup: Setup, memory_roof: float | None, progress) -> dict:
    """Every step case on both paths, timed in interleaved rounds (module docstring)."""
    from refmodel import quant

    models, skipped = step_models(setup)
    dot = int8_dot() if any(p == "native" for p, _ in models) else None
    cases, skipped_cases = step_cases(setup, models, dot)
    calls = {}
    for case in cases:
        path, label, phase, b, ctx, kv = case
        progress(f"compiling {path} {label} {phase} batch {b} (KV {kv})")
        model = models[path, label]
        model = model if kv == "none" else quant.quantize(model, kv=kv)
        calls[case] = (_phase_call(model, phase, b, ctx), model.cfg)
    seconds = {case: [] for case in cases}
    for r in range(setup.rounds):  # every case once per round: drift hits all alike
        progress(f"steps: round {r + 1} of {setup.rounds}")
        for case, (call, _) in calls.items():
            seconds[case].append(_median_seconds(call, (), setup.repeats))
    skips = [{"path": k if isinstance(k, str) else k[0],
              "precision": None if isinstance(k, str) else k[1],
              "phase": k[2] if isinstance(k, tuple) and len(k) > 2 else None, "reason": why}
             for k, why in {**skipped, **skipped_cases}.items()]
    cfg = step_config(setup)
    return {"model": setup.model, "layers": cfg.n_layers, "llc_bytes": llc_bytes(),
            "weight_bytes": {f: weight_bytes(cfg, f, setup.context) for f in ("none", "int8")},
            "int8_dot": dot, "memory_roof": memory_roof, "skipped": skips,
            "results": [_step_row(case, cfg_, seconds, memory_roof)
                        for case, (_, cfg_) in calls.items()]}


# Quality ---------------------------------------------------------------------------------------

@functools.lru_cache(maxsize=16)
def _logits_fn(graphdef):
    """Jitted logits of every position of tokens [B, T], through a cache as prefill writes and
    reads it (a quantized cache rounds what it stores)."""
    def logits(state, toks):
        import refmodel

        model = nnx.merge(graphdef, state)
        out, _ = model(toks, refmodel.init_cache(model.cfg, *toks.shape))
        return out

    return jax.jit(logits)


def next_token_logits(model, toks: jax.Array) -> jax.Array:
    graphdef, state = nnx.split(model)
    return _logits_fn(graphdef)(state, toks)


def kl_nats(ref_logits: jax.Array, logits: jax.Array) -> float:
    """Mean over positions of KL(P_ref || P): the next-token distribution of `logits` against
    the reference's, in nats (llama.cpp's `perplexity --kl-divergence` convention)."""
    lp = jax.nn.log_softmax(ref_logits.astype(jnp.float32), axis=-1)
    lq = jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1)
    return float(jnp.mean(jnp.sum(jnp.exp(lp) * (lp - lq), axis=-1)))


def validation_tokens(recipe_name: str, sequences: int = 8) -> jax.Array:
    """The first validation batch of the recipe (at most `sequences` rows), as model input."""
    from refmodel.training import data, recipes

    r = recipes.get(recipe_name)
    corpus = data.load(max_bytes=r.max_bytes)
    batch = data.val_batches(corpus, 1, min(r.batch, sequences), r.seq_len)[0]
    return jnp.asarray(batch[:, :-1])


def quality_cases(setup: Setup) -> list[tuple[str, str]]:
    """(precision label, KV format) of every quality row: each weight and activation format
    with a float cache, then each quantized cache with float32 weights."""
    return [(label, "none") for label in setup.quality] + \
           [("float32", kv) for kv in KV_PRECISIONS if kv != "none"]


def _quality_row(model, label: str, kv: str, recipe: str, toks, ref_logits) -> dict:
    """One format's quality, or {"skipped": why} where quantize refuses it (ValueError)."""
    from refmodel import costs, quant
    from refmodel.training import bits_per_byte

    _, wf, acts = PRECISIONS[label]
    row = {"precision": label, "weight_format": wf, "kv_format": kv,
           "activations": "int8" if acts else "float32"}
    try:
        q = quant.quantize(model, weights=None if wf == "none" else wf,
                           kv=None if kv == "none" else kv, activations=acts)
    except ValueError as e:
        return {**row, "skipped": f"skipped: {e}"}
    logits = next_token_logits(q, toks)
    cfg = q.cfg
    return {**row, "bits_per_byte": bits_per_byte(q, recipe),
            "kl_nats": kl_nats(ref_logits, logits),
            "logit_error": float(jnp.abs(logits - ref_logits).max() / jnp.abs(ref_logits).max()),
            "weight_bytes": _param_bytes(q),
            "kv_bytes_per_token": costs.kv_bytes_per_token(cfg, costs.dtypes(cfg).kv),
            "decode_bytes": costs.phase_costs(cfg, "decode", 1, 1024)["bytes"]}


def measure_quality(setup: Setup, progress) -> dict:
    from refmodel.training import recipes, trained

    progress(f"quality: model {setup.quality_model} (trained first if not cached)")
    model = trained(setup.quality_model, progress=False)
    toks = validation_tokens(setup.quality_model)
    ref = next_token_logits(model, toks)
    rows = []
    for label, kv in quality_cases(setup):
        progress(f"quality: {label}, KV {kv}")
        rows.append(_quality_row(model, label, kv, setup.quality_model, toks, ref))
    base = next((r["bits_per_byte"] for r in rows if r["precision"] == "float32"
                 and r["kv_format"] == "none" and "bits_per_byte" in r), None)
    for row in rows:
        if base is not None and "bits_per_byte" in row:
            row["delta_bits_per_byte"] = row["bits_per_byte"] - base
    r = recipes.get(setup.quality_model)
    return {"recipe": r.name, "preset": r.model, "metric": "bits per byte, validation split",
            "kl_tokens": list(toks.shape), "results": rows}


def _param_bytes(model) -> int:
    return sum(x.nbytes for x in jax.tree.leaves(nnx.state(model, nnx.Param)))


def measure(setup: Setup, memory_roof: float | None = None, progress=lambda what: None) -> dict:
    """Everything the module docstring lists, as one JSON-ready dict."""
    setup.check()
    t0 = time.perf_counter()
    out = {"kind": "quant", "setup": dataclasses.asdict(setup)}
    out["steps"] = measure_steps(setup, memory_roof, progress)
    out["formulations"] = measure_formulations(setup, progress)
    out["quality"] = measure_quality(setup, progress)
    out["wall_s"] = time.perf_counter() - t0
    return out
