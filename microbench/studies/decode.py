"""The decode race: our decode step against the memory, the FMA units and the best CPU engine,
all in the same interleaved rounds.

Each round runs back to back: the all-core C read (microbench.roofs.native: what main memory
does), numpy's GEMM (what the FMA units do), our decode step at each batch with XLA's products
on the weights as written (`backend="xla"`), on weights stored output-major
(`"output-major"`), with the native kernel on weights stored in its panels (`"native"`,
refmodel.kernels), and the same weights quantized in the native kernel: int8 weights alone
(`"native-int8"`, weight-only), int8 and int4 weights with int8 activations (`"w8a8"`,
`"w4a8"`: microbench.studies.decode_formats); a prefill of `prefill_len` tokens in w8a8 and in
float32 (where the CPU has an int8 dot-product instruction); then the same weights in llama.cpp,
in F32 and in its own Q8_0, Q4_0 and Q4_K_M files (a GGUF written from our model and quantized
by llama.cpp itself, microbench.studies.llamacpp), and in Hugging Face transformers when
installed (the `peers` extra: microbench.studies.decode_peers); then the C read again. The
machine drifts by tens of percent over minutes (the README's method section), so every
comparison is a ratio taken inside one round, and the median over rounds is reported with its
spread and its rounds.

After the rounds: greedy tokens of each pair of formats from one prompt (their agreement),
the quality of each format on held-out text of a trained model (KL divergence from our float32
model: microbench.studies.decode_quality), and the public `refmodel.decode_step` beside the raw
jitted step (microbench.studies.host).

The roof of a decode step at batch B is the slower of its two limits, counted by the cost model
for the same step: bytes / read bandwidth (the weights, the KV cache, the activations) and
FLOPs / GEMM rate. `roof_fraction` = that time / the measured step time (1.0: at the roof).

Targets (TARGETS, reported, never asserted in tests): batch 1 >= 1.0x llama.cpp and >= 0.9 of
the C read; batches 2-8 >= 0.8 of their roof; w8a8 >= 1.0x Q8_0 and w4a8 >= 1.0x Q4_0, each
streaming its weights at >= 0.85 of the C read; a w8a8 prefill >= 1.5x the float32 one.
"""

from __future__ import annotations

import dataclasses
import shutil
import tempfile
import time
from pathlib import Path

import jax
import numpy as np

from microbench.studies.decode_formats import OURS, THEIRS, our_model, pair_rows, short
from microbench.studies.decode_peers import Peers, race_greedy
from microbench.studies.decode_quality import measure_quality

TARGETS = {"vs_llamacpp": 1.0, "vs_read": 0.9, "small_batch_roof": 0.8, "int8_vs_q8_0": 1.0,
           "int4_vs_q4_0": 1.0, "quant_vs_read": 0.85, "w8a8_prefill": 1.5}
# our programs: the float32 weight products (ModelConfig.backend), then the quantized ones
# (decode_formats.OURS), each with its own roof; the float ones are set against llama.cpp's F32
# and transformers, the quantized ones against llama.cpp's formats (decode_formats.PAIRS)
PROGRAMS = ("xla", "output-major", "native", "native-int8", "w8a8", "w4a8")
FLOAT_PROGRAMS = PROGRAMS[:3]
FLOAT_PEERS = ("llama.cpp", "transformers")
NO_INT8_DOT = "skipped: no VNNI/i8mm"
PREFILL = ("native", "w8a8")  # the prefill race: float32 against int8 weights and activations


@dataclasses.dataclass(frozen=True)
class Setup:
    model: str = "llama-309m"
    context: int = 128
    batches: tuple[int, ...] = (1, 2, 4, 8)
    rounds: int = 3
    budget_s: float = 2.0  # timing budget of one decode point
    peer_steps: int = 24  # llama.cpp / transformers steps per round
    peers: bool = True
    gemm: tuple[int, int, int] = (2048, 2048, 2048)
    product_rows: tuple[int, ...] = (16,)  # rows at which the products alone are also timed
    prefill_len: int = 512  # tokens of the w8a8 vs float32 prefill (batch 1)
    agree_tokens: int = 32  # greedy tokens compared per pair of formats
    quality_model: str = "target"  # a recipe of refmodel.training: KL on its held-out text
    quality_windows: int = 4
    quality_len: int = 256  # tokens per held-out window
    public: bool = True  # the public decode_step beside the raw one (microbench.studies.host)

    def check(self) -> None:
        import refmodel
        from refmodel.training import recipes

        refmodel.presets.get(self.model)  # an unknown preset names the valid ones
        recipes.get(self.quality_model)  # an unknown recipe names the valid ones
        for name in ("context", "rounds", "peer_steps", "prefill_len", "agree_tokens",
                     "quality_windows", "quality_len"):
            if not isinstance(getattr(self, name), int) or getattr(self, name) < 1:
                raise ValueError(f"{name}={getattr(self, name)!r} must be a positive integer")
        if not self.batches or any(not isinstance(b, int) or b < 1 for b in self.batches):
            raise ValueError(f"batches={self.batches!r} must be positive integers")
        if self.budget_s <= 0:
            raise ValueError(f"budget_s={self.budget_s!r} must be > 0")


QUICK = Setup(model="bench", context=64, batches=(1, 4), rounds=2, budget_s=0.3, peer_steps=8,
              peers=False, gemm=(1024, 1024, 1024), product_rows=(), prefill_len=64,
              agree_tokens=8, quality_model="micro", quality_windows=1, quality_len=64)


def _read_bytes_per_s(server) -> float:
    c = server.stream(5)
    return 4.0 * c["n"] / float(np.median(c["read"]))


def _chain(product, k_axis: int | None):
    """Every weight in turn (its inputs on `k_axis`; None: a stored weight's own `k`), each
    product's input cut or tiled from the last product's output: one dependent chain, as in a
    step."""

    def run(x, ws):
        D = x.shape[1]
        for w in ws:
            x = _fit(_fit(x, D) * 1e-3, w.k if k_axis is None else w.shape[k_axis])
            x = product(x, w).reshape(x.shape[0], -1)
        return x.sum()

    return run


def _fit(x, n: int):
    import jax.numpy as jnp

    if x.shape[1] >= n:
        return x[:, :n]
    return jnp.tile(x, (1, -(-n // x.shape[1])))[:, :n]


class _Ours:
    """One model per program, compiled once per batch; re-timed every round. `backends`: the
    backend each program runs on; `bits`: bits per weight of each program's format
    (decode_formats.our_bits); a program that cannot be made is left out, its reason in
    `skipped`."""

    def __init__(self, setup: Setup, programs: tuple[str, ...], skipped: list):
        import refmodel
        from refmodel import backends

        cfg = refmodel.presets.get(setup.model)
        base = refmodel.init(cfg, seed=0)
        self.model = base
        self.models, self.backends, self.bits = {"xla": base}, {"xla": "xla"}, {}
        for p in programs[1:]:
            if p not in OURS:
                self.models[p], self.backends[p] = backends.use(base, p), p
                continue
            try:
                self.models[p], self.backends[p], note, self.bits[p] = our_model(base, p)
            except (ValueError, RuntimeError) as e:  # a format not made, or no native kernels
                skipped.append(f"{p}: {short(e)}")
                continue
            if note:
                skipped.append(note)
        self.programs = tuple(p for p in programs if p in self.models)
        self.phases = {p: refmodel.Phases(m) for p, m in self.models.items()}
        self.setup = setup
        self._chains = {}

    def products(self, rows: int, repeats: int = 7) -> list[dict]:
        """The step's weight products alone, chained (each product's input made from the last
        one's output, as in a step), with `rows` rows: XLA on [K, N] (x @ w), XLA on [N, K]
        (dot_general over the stored K axis) and the native kernel on its panels."""
        import jax
        import jax.numpy as jnp
        from flax import nnx

        from refmodel.quant import matrices

        def weights(model, unwrap: bool = True) -> list:  # the 2-D matrices, in module order
            ws = [getattr(m, n)[...] for _, m in nnx.iter_modules(model) for n in matrices(m)]
            if unwrap:  # OutputMajor -> its [N, K] array
                ws = [getattr(w, "w", w) for w in ws]
            return [w for w in ws if len(w.shape) == 2]

        kn = weights(self.models["xla"])
        forms = {"xla [K, N]": (lambda x, w: x @ w, 0, kn)}
        if "output-major" in self.models:  # its weights are already stored [N, K]
            nk = weights(self.models["output-major"])
            forms["xla [N, K]"] = (lambda x, w: jax.lax.dot_general(
                x, w, (((1,), (1,)), ((), ()))), 1, nk)
        for program, form in (("native", "native panels"), ("native-int8", "native int8 panels")):
            if program in self.models:  # Panels: x @ w is the kernel (shape: [K, N])
                forms[form] = (lambda x, w: x @ w, 0, weights(self.models[program], unwrap=False))
        for program in ("w8a8", "w4a8"):  # the integer kernel's QuantPanels, any declared shape
            if self.backends.get(program) == "native":
                qs = [getattr(m, n)[...] for _, m in nnx.iter_modules(self.models[program])
                      for n in matrices(m)]
                forms[f"native {program}"] = (lambda x, w: x @ w, None,
                                              [w for w in qs if hasattr(w, "k")])
        out = []
        for form, (product, k_axis, ws) in forms.items():
            if form not in self._chains:
                self._chains[form] = jax.jit(_chain(product, k_axis))
            fn = self._chains[form]
            x = jnp.ones((rows, self.model.cfg.d_model), jnp.float32)
            fn(x, ws).block_until_ready()
            times = []
            for _ in range(repeats):
                t0 = time.perf_counter()
                fn(x, ws).block_until_ready()
                times.append(time.perf_counter() - t0)
            out.append({"form": form, "rows": rows, "seconds": float(np.median(times)),
                        "bytes": float(sum(w.nbytes for w in ws)), "products": len(ws)})
        del forms
        return out

    def measure(self, program: str, batch: int, phase: str = "decode") -> dict:
        """One timed point: a decode step at `batch` (context `setup.context`), or a prefill
        of `setup.prefill_len` tokens (batch 1)."""
        from microbench.phases.points import Budget, measure_point

        s = self.setup
        tokens = s.context if phase == "decode" else s.prefill_len
        p = measure_point(self.phases[program], phase, batch, tokens, None,
                          Budget(budget_s=s.budget_s, min_samples=3 if phase == "prefill" else 5))
        return {"program": program, "batch": batch, "step_s": p["timing"]["median"],
                "samples": p["timing"]["samples"], "flops": p["flops"], "bytes": p["bytes"],
                "weight_bytes": p["weight_bytes"], "kernels": p["kernels"]}


def inline_dispatch() -> str:
    """Have JAX run each jitted call on the calling thread ("inline"; its CPU client's async
    dispatch off), as llama.cpp runs its step. With async dispatch the calling thread goes on
    (the call's outputs, its own next lines) while the kernels' two threads run: three threads
    on a 2-core machine; the w4a8 llama-309m step was 0.37 ms faster inline (median of 7
    process pairs, faster in all 7). The setting takes effect only before JAX's CPU client
    exists; returns which mode the race runs in."""
    from jax._src import xla_bridge

    if not xla_bridge.backends_are_initialized():
        jax.config.update("jax_cpu_enable_async_dispatch", False)
    if jax.config.read("jax_cpu_enable_async_dispatch"):
        return "async (JAX's CPU client existed before the race began)"
    return "inline"


def measure(setup: Setup, progress=lambda what: None) -> dict:
    """Every round of the race, then the pairs' greedy tokens, each format's quality and the
    public step; returns the result dict (`summarize` adds the ratios)."""
    from microbench.roofs import native
    from microbench.roofs.rounds import NumpyPeer
    from refmodel import kernels

    setup.check()
    dispatch = inline_dispatch()
    skipped = []
    programs = PROGRAMS if kernels.available() else ("xla", "output-major", "w8a8", "w4a8")
    if "native" not in programs:
        skipped.append(f"native kernels: {kernels.why_not()}")
    if not native.available():
        raise ValueError("the decode race needs the C read peer, built with gcc (not found): "
                         "the memory roof every ratio divides by is what it measures")
    reader = native.Server(main_array_floats(), None)
    read_program = f"C read ({native.label(reader_threads(reader))})"
    numpy_peer = NumpyPeer(setup.gemm, 1 << 20)
    progress("compiling our decode steps")
    ours = _Ours(setup, programs, skipped)
    prefill_why = _prefill_why(ours)
    peers = Peers()
    gguf_dir = Path(tempfile.mkdtemp(prefix="decode_race_"))
    rounds = []
    try:
        if setup.peers:
            peers.start(ours.model, setup, gguf_dir, skipped, progress)
        for i in range(setup.rounds):
            rounds.append(_round(i, setup, ours, reader, numpy_peer, prefill_why is None,
                                 progress))
            peers.steps(rounds[-1], i, setup, ours.model.cfg, skipped, progress)
            progress(f"round {i + 1}: C read")
            rounds[-1]["read_bytes_per_s"].append(_read_bytes_per_s(reader))
            rounds[-1]["t_end"] = time.time()
        greedy = race_greedy(ours, peers.servers, setup, progress) if peers.servers else []
    finally:
        reader.close()
        numpy_peer.close()
        peers.close()
        shutil.rmtree(gguf_dir, ignore_errors=True)  # the GGUFs: the model's size again
    result = _result(setup, ours, peers, rounds, greedy, prefill_why, skipped)
    result["read_program"] = read_program
    result["dispatch"] = dispatch
    result["quality"] = measure_quality(setup, skipped, progress)
    result["public_step"] = _public_step(setup, skipped, progress)
    result["skipped"] = sorted(set(skipped))
    return summarize(result)


def _result(setup: Setup, ours: _Ours, peers, rounds: list, greedy: list,
            prefill_why: str | None, skipped: list) -> dict:
    import refmodel

    cfg = ours.model.cfg
    formats = {p: {"side": "ours", "format": OURS[p][2], "backend": ours.backends[p], **bits}
               for p, bits in ours.bits.items()}
    formats |= {peer: {"side": "llama.cpp", "format": THEIRS[peer] or "F32",
                       **{k: v for k, v in f.items() if k != "path"}}
                for peer, f in peers.files.items() if peer in peers.servers}
    first = next(iter(peers.servers.values()), None)
    return {
        "setup": dataclasses.asdict(setup), "model": cfg.name,
        "params": refmodel.costs.param_counts(cfg)["total"], "programs": list(ours.programs),
        "backends": ours.backends, "formats": formats,
        "llamacpp": ({"version": first.version, "threads": first.threads,
                      "system": first.system} if first is not None else None),
        "greedy": greedy, "prefill_skipped": prefill_why,
        "rounds": rounds, "skipped": skipped, "targets": TARGETS,
        "gemm_program": f"numpy matmul {'x'.join(map(str, setup.gemm))}",
    }


def _round(i: int, setup: Setup, ours: _Ours, reader, numpy_peer, prefill: bool,
           progress) -> dict:
    """Round i up to its peers: the C read and numpy's GEMM, then our step per program and
    batch, the w8a8 and float32 prefills (`prefill`), then the weight products alone."""
    entry = {"round": i, "t_start": time.time(), "read_bytes_per_s": [], "points": [],
             "peers": [], "prefill": []}
    progress(f"round {i + 1}: C read and numpy GEMM")
    entry["read_bytes_per_s"].append(_read_bytes_per_s(reader))
    g = numpy_peer.measure()
    m, k, n = setup.gemm
    entry["gemm_flops_per_s"] = 2.0 * m * k * n / float(np.median(g["gemm"]))
    for program in ours.programs:
        for b in setup.batches:
            progress(f"round {i + 1}: ours ({program}) batch {b}")
            entry["points"].append(ours.measure(program, b))
    for program in (PREFILL if i % 2 == 0 else PREFILL[::-1]) if prefill else ():  # alternate
        progress(f"round {i + 1}: prefill of {setup.prefill_len} tokens, {program}")
        entry["prefill"].append(ours.measure(program, 1, "prefill"))
    entry["products"] = []
    for rows in sorted({*setup.batches, *setup.product_rows}):
        progress(f"round {i + 1}: the products alone, {rows} rows")
        entry["products"] += ours.products(rows)
    return entry


def _prefill_why(ours: _Ours) -> str | None:
    """Why the w8a8 prefill is not timed (NO_INT8_DOT where the CPU has no int8 dot-product
    instruction: the integer path would time the fallback, not the instruction), or None."""
    from refmodel import kernels

    if "native" not in ours.backends:
        return "skipped: the native kernels cannot run here"
    int8_dot = getattr(kernels, "int8_dot", None)
    if int8_dot is None:
        return "skipped: refmodel.kernels.int8_dot is missing (which instruction would run?)"
    if int8_dot() is None:
        return NO_INT8_DOT
    if ours.backends.get("w8a8") != "native":
        return "skipped: w8a8 does not run on the native kernel here"
    return None


# The public step's host cost is resolvable only where the step itself is short: the tiny
# preset (a fraction of a millisecond), then beside the race's own model.
PUBLIC_MODELS = (("tiny", 64),)


def _public_step(setup: Setup, skipped: list, progress) -> list | None:
    """The public refmodel.decode_step beside the raw jitted step it runs
    (microbench.studies.host.public_overhead), on the tiny preset and on the race's model and
    context, or None with the reason skipped."""
    if not setup.public:
        return None
    try:
        from microbench.studies.host import public_overhead
    except ImportError as e:
        skipped.append(f"public step: microbench.studies.host.public_overhead is missing ({e})")
        return None
    progress("the public decode_step beside the raw one")
    out = []
    for model, context in dict.fromkeys((*PUBLIC_MODELS, (setup.model, setup.context))):
        r = public_overhead(model=model, context=context)
        keys = ("raw_s", "public_s", "overhead_s", "call_overhead_s")
        out.append({"model": model, "context": context, **{k: r[k] for k in keys},
                    "rounds": [{k: x[k] for k in keys} for x in r["rounds"]]})
    return out


def main_array_floats() -> int:
    """The C read's array: max(1 GiB, 16 x LLC) bounded by free memory (peaks' rule)."""
    from microbench import hardware, harness, sysinfo
    from microbench.roofs.peaks import main_array_bytes, memory_levels

    env = harness.environment()
    levels = memory_levels(env, hardware.device_for_environment(env))
    llc = max((size for _, size in levels), default=32 << 20)
    return main_array_bytes(llc, sysinfo.mem_available_bytes()) // 4


def reader_threads(server) -> int | None:
    return getattr(server, "threads", None)


def _median(xs) -> float | None:
    xs = [x for x in xs if x is not None]
    return float(np.median(xs)) if xs else None


def _spread(xs) -> float | None:
    xs = [x for x in xs if x is not None]
    return float((max(xs) - min(xs)) / np.median(xs)) if len(xs) > 1 else None


def summarize(result: dict) -> dict:
    """Per round: each of our points' roof time, roof fraction, bytes/s over the round's read
    and speed over each float peer's; then, per (program, batch), the medians over rounds; per
    pair of formats, ours' speed over llama.cpp's (decode_formats.pair_rows); the prefill's."""
    for r in result["rounds"]:
        read, gemm = max(r["read_bytes_per_s"]), r["gemm_flops_per_s"]
        peers = {p["program"]: p["step_s"] for p in r["peers"] if p["program"] in FLOAT_PEERS}
        for p in r["points"]:
            p["roof_s"] = max(p["bytes"] / read, p["flops"] / gemm)
            p["bound"] = "memory" if p["bytes"] / read >= p["flops"] / gemm else "compute"
            p["roof_fraction"] = p["roof_s"] / p["step_s"]
            p["over_read"] = p["bytes"] / p["step_s"] / read
            if "weight_bytes" in p:  # the weights alone: what a quantized format shrinks
                p["weights_over_read"] = p["weight_bytes"] / p["step_s"] / read
            p["speed_over"] = ({name: s / p["step_s"] for name, s in peers.items()}
                               if p["batch"] == 1 and p["program"] in FLOAT_PROGRAMS else {})
    reads = [max(r["read_bytes_per_s"]) for r in result["rounds"]]
    result["table"] = _table(result)
    result["peer_table"] = _peer_table(result)
    result["products"] = _products(result)
    result["pairs"] = pair_rows(result)
    result["prefill"] = _prefill_table(result)
    result["read"] = {"median": _median(reads), "spread": _spread(reads), "rounds": reads}
    return result


def _table(result: dict) -> list[dict]:
    """Per (program, batch): the medians over rounds, and the per-round float peer ratios."""
    table = []
    for program in result["programs"]:
        for b in result["setup"]["batches"]:
            pts = [p for r in result["rounds"] for p in r["points"]
                   if p["program"] == program and p["batch"] == b]
            row = {"program": program, "batch": b,
                   "step_s": _median(p["step_s"] for p in pts),
                   "step_spread": _spread([p["step_s"] for p in pts]),
                   "roof_s": _median(p["roof_s"] for p in pts),
                   "bound": pts[0]["bound"] if pts else None,
                   "roof_fraction": _median(p["roof_fraction"] for p in pts),
                   "over_read": _median(p["over_read"] for p in pts),
                   "weights_over_read": _median(p.get("weights_over_read") for p in pts)}
            for peer in sorted({k for p in pts for k in p["speed_over"]}):
                row[f"over_{peer}"] = _median(p["speed_over"].get(peer) for p in pts)
                row[f"over_{peer}_rounds"] = [p["speed_over"].get(peer) for p in pts]
            table.append(row)
    return table


def _peer_table(result: dict) -> dict:
    """Per peer: its median step and spread over rounds, and (llama.cpp) its weight bytes per
    step over the round's C read."""
    peers = {}
    for name in sorted({p["program"] for r in result["rounds"] for p in r["peers"]}):
        pts = [(p, max(r["read_bytes_per_s"])) for r in result["rounds"] for p in r["peers"]
               if p["program"] == name]
        peers[name] = {"step_s": _median(p["step_s"] for p, _ in pts),
                       "step_spread": _spread([p["step_s"] for p, _ in pts]),
                       "weights_over_read": _median(p["weight_bytes"] / p["step_s"] / read
                                                    for p, read in pts if "weight_bytes" in p)}
    return peers


def _products(result: dict) -> list[dict]:
    products = []
    keys = sorted({(p["form"], p["rows"]) for r in result["rounds"] for p in r.get("products", [])},
                  key=lambda k: (k[1], k[0]))
    for form, rows in keys:
        pts = [(p, max(r["read_bytes_per_s"])) for r in result["rounds"]
               for p in r.get("products", []) if p["form"] == form and p["rows"] == rows]
        products.append({"form": form, "rows": rows, "products": pts[0][0]["products"],
                         "bytes": pts[0][0]["bytes"],
                         "seconds": _median(p["seconds"] for p, _ in pts),
                         "over_read": _median(p["bytes"] / p["seconds"] / read
                                              for p, read in pts)})
    return products


def _prefill_table(result: dict) -> dict:
    """The prefill race: per round, float32's time over w8a8's (w8a8's speedup), and the median;
    or why it did not run (`prefill_skipped`)."""
    why = result.get("prefill_skipped")
    ratios, steps = [], {p: [] for p in PREFILL}
    for r in result["rounds"]:
        times = {p["program"]: p["step_s"] for p in r.get("prefill", [])}
        if all(p in times for p in PREFILL):
            ratios.append(times["native"] / times["w8a8"])
            for p in PREFILL:
                steps[p].append(times[p])
    if why or not ratios:
        return {"skipped": why or "skipped: no round timed both prefills"}
    return {"tokens": result["setup"]["prefill_len"], "speedup": _median(ratios),
            "rounds": ratios, **{f"{p}_s": _median(steps[p]) for p in PREFILL}}
