"""The decode race: our decode step against the memory, the FMA units and the best CPU engine,
all in the same interleaved rounds.

Each round runs back to back: the all-core C read (microbench.roofs.native: what main memory
does), numpy's GEMM (what the FMA units do), our decode step at each batch with XLA's products
on the weights as written (`backend="xla"`), on weights stored output-major
(`"output-major"`), with the native kernel on weights stored in its panels (`"native"`,
refmodel.kernels) and on the same weights quantized to int8 (`"native-int8"`: its own roof, no
peer ratio), the same weights in llama.cpp (a GGUF written from our model,
microbench.studies.llamacpp) and in Hugging Face transformers when installed (the `peers`
extra), then the C read again. The machine drifts
by tens of percent over minutes (the README's method section), so every comparison is a ratio
taken inside one round, and the median over rounds is reported with its spread.

The roof of a decode step at batch B is the slower of its two limits, counted by the cost model
for the same step: bytes / read bandwidth (the weights, the KV cache, the activations) and
FLOPs / GEMM rate. `roof_fraction` = that time / the measured step time (1.0: at the roof).

Targets (TARGETS, reported, never asserted in tests): batch 1 >= 1.0x llama.cpp and >= 0.9 of
the C read; batches 2-8 >= 0.8 of their roof.
"""

from __future__ import annotations

import dataclasses
import shutil
import tempfile
import time
from pathlib import Path

import numpy as np

TARGETS = {"vs_llamacpp": 1.0, "vs_read": 0.9, "small_batch_roof": 0.8}
# our weight products (ModelConfig.backend); "native-int8": the same weights quantized to int8
# (refmodel.quant, one scale per output) in the native kernel: a quarter of the bytes, its own
# roof, and no peer ratio (the peers run the float32 weights)
PROGRAMS = ("xla", "output-major", "native", "native-int8")
FLOAT_PROGRAMS = PROGRAMS[:3]


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

    def check(self) -> None:
        import refmodel

        refmodel.presets.get(self.model)  # an unknown preset names the valid ones
        for name in ("context", "rounds", "peer_steps"):
            if not isinstance(getattr(self, name), int) or getattr(self, name) < 1:
                raise ValueError(f"{name}={getattr(self, name)!r} must be a positive integer")
        if not self.batches or any(not isinstance(b, int) or b < 1 for b in self.batches):
            raise ValueError(f"batches={self.batches!r} must be positive integers")
        if self.budget_s <= 0:
            raise ValueError(f"budget_s={self.budget_s!r} must be > 0")


QUICK = Setup(model="bench", context=64, batches=(1, 4), rounds=2, budget_s=0.3, peer_steps=8,
              peers=False, gemm=(1024, 1024, 1024), product_rows=())


def _read_bytes_per_s(server) -> float:
    c = server.stream(5)
    return 4.0 * c["n"] / float(np.median(c["read"]))


def _chain(product, k_axis: int):
    """Every weight in turn (its inputs on `k_axis`), each product's input cut or tiled from
    the last product's output: one dependent chain, as in a step."""

    def run(x, ws):
        D = x.shape[1]
        for w in ws:
            x = _fit(_fit(x, D) * 1e-3, w.shape[k_axis])
            x = product(x, w)
        return x.sum()

    return run


def _fit(x, n: int):
    import jax.numpy as jnp

    if x.shape[1] >= n:
        return x[:, :n]
    return jnp.tile(x, (1, -(-n // x.shape[1])))[:, :n]


class _Ours:
    """One model per program, compiled once per batch; re-timed every round."""

    def __init__(self, setup: Setup, programs: tuple[str, ...]):
        import refmodel
        from refmodel import backends

        cfg = refmodel.presets.get(setup.model)
        base = refmodel.init(cfg, seed=0)
        self.model = base
        models = {"xla": base}
        for p in programs[1:]:
            if p == "native-int8":
                from refmodel import quant

                models[p] = backends.use(quant.quantize(base, weights="int8"), "native")
            else:
                models[p] = backends.use(base, p)
        self.models = models
        self.phases = {p: refmodel.Phases(m) for p, m in models.items()}
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

    def measure(self, program: str, batch: int) -> dict:
        from microbench.phases.points import Budget, measure_point

        s = self.setup
        p = measure_point(self.phases[program], "decode", batch, s.context, None,
                          Budget(budget_s=s.budget_s))
        return {"program": program, "batch": batch, "step_s": p["timing"]["median"],
                "samples": p["timing"]["samples"], "flops": p["flops"], "bytes": p["bytes"],
                "kernels": p["kernels"]}


def measure(setup: Setup, progress=lambda what: None) -> dict:
    """Every round of the race; returns the result dict (`summarize` adds the ratios)."""
    import refmodel
    from microbench.roofs import native
    from microbench.roofs.rounds import NumpyPeer
    from refmodel import kernels

    setup.check()
    skipped = []
    programs = PROGRAMS if kernels.available() else PROGRAMS[:2]
    if "native" not in programs:
        skipped.append(f"native kernels: {kernels.why_not()}")
    if not native.available():
        raise ValueError("the decode race needs the C read peer, built with gcc (not found): "
                         "the memory roof every ratio divides by is what it measures")
    reader = native.Server(main_array_floats(), None)
    numpy_peer = NumpyPeer(setup.gemm, 1 << 20)
    progress("compiling our decode steps")
    ours = _Ours(setup, programs)
    cfg = ours.model.cfg
    gguf_dir = Path(tempfile.mkdtemp(prefix="decode_race_"))
    llama, hf = _peers(ours.model, setup, gguf_dir, skipped) if setup.peers else (None, False)
    rounds = []
    try:
        for i in range(setup.rounds):
            rounds.append(_round(i, setup, programs, ours, reader, numpy_peer, progress))
            hf = _peer_steps(rounds[-1], i, setup, cfg, llama, hf, skipped, progress)
            progress(f"round {i + 1}: C read")
            rounds[-1]["read_bytes_per_s"].append(_read_bytes_per_s(reader))
            rounds[-1]["t_end"] = time.time()
        greedy = _greedy_check(ours.model, llama) if llama is not None else None
    finally:
        reader.close()
        numpy_peer.close()
        if llama is not None:
            llama.close()
        shutil.rmtree(gguf_dir, ignore_errors=True)  # the GGUF: the model's size again
    return summarize({
        "setup": dataclasses.asdict(setup), "model": cfg.name,
        "params": refmodel.costs.param_counts(cfg)["total"], "programs": list(programs),
        "llamacpp": ({"version": llama.version, "threads": llama.threads,
                      "system": llama.system} if llama is not None else None),
        "greedy_vs_llamacpp": greedy,
        "rounds": rounds, "skipped": sorted(set(skipped)), "targets": TARGETS,
        "read_program": f"C read ({native.label(reader_threads(reader))})",
        "gemm_program": f"numpy matmul {'x'.join(map(str, setup.gemm))}",
    })


def _peers(model, setup: Setup, gguf_dir: Path, skipped: list) -> tuple:
    """(llama.cpp's server or None, whether transformers runs), each absent one's reason
    appended to `skipped`."""
    llama, why = _llama_server(model, setup, gguf_dir)
    if why:
        skipped.append(why)
    if not report_peer_available():
        skipped.append("transformers: not installed (pip install -e '.[peers]')")
        return llama, False
    return llama, True


def _round(i: int, setup: Setup, programs: tuple, ours: _Ours, reader, numpy_peer,
           progress) -> dict:
    """Round i up to its peers: the C read and numpy's GEMM, then our step per program and
    batch, then the weight products alone."""
    entry = {"round": i, "t_start": time.time(), "read_bytes_per_s": [], "points": [],
             "peers": []}
    progress(f"round {i + 1}: C read and numpy GEMM")
    entry["read_bytes_per_s"].append(_read_bytes_per_s(reader))
    g = numpy_peer.measure()
    m, k, n = setup.gemm
    entry["gemm_flops_per_s"] = 2.0 * m * k * n / float(np.median(g["gemm"]))
    for program in programs:
        for b in setup.batches:
            progress(f"round {i + 1}: ours ({program}) batch {b}")
            entry["points"].append(ours.measure(program, b))
    entry["products"] = []
    for rows in sorted({*setup.batches, *setup.product_rows}):
        progress(f"round {i + 1}: the products alone, {rows} rows")
        entry["products"] += ours.products(rows)
    return entry


def _peer_steps(entry: dict, i: int, setup: Setup, cfg, llama, hf: bool, skipped: list,
                progress) -> bool:
    """The peers' batch-1 steps of round i into entry["peers"]; returns whether transformers
    still runs (once it fails, its reason is in `skipped` and it is not asked again)."""
    from microbench.phases import report

    if llama is not None:
        progress(f"round {i + 1}: llama.cpp")
        r = llama.round(setup.peer_steps)
        entry["peers"].append({"program": "llama.cpp", "batch": 1, **r})
    if not hf:
        return False
    progress(f"round {i + 1}: transformers")
    r = report.hf_peer(cfg, setup.context, steps=setup.peer_steps)
    if not r.get("step_s"):
        skipped.append(f"transformers: {r.get('error')}")
        return False
    entry["peers"].append({"program": "transformers", "batch": 1, "step_s": r["step_s"],
                           "samples": r["samples"], "torch": r.get("torch"),
                           "threads": r.get("threads")})
    return True


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


def report_peer_available() -> bool:
    import importlib.util

    return all(importlib.util.find_spec(m) is not None for m in ("torch", "transformers"))


def _llama_server(model, setup: Setup, folder: Path):
    from microbench.studies import llamacpp

    why = llamacpp.available()
    if why:
        return None, f"llama.cpp: {why}"
    path = folder / f"{setup.model}-f32.gguf"
    llamacpp.gguf_from_model(model, path)
    return llamacpp.Server(path, setup.context), None


def _greedy_check(model, llama, prompt_len: int = 16, new: int = 8) -> dict:
    """llama.cpp's greedy continuation of one prompt against refmodel.generate's."""
    import refmodel

    prompt = np.random.default_rng(0).integers(0, model.cfg.vocab_size, (1, prompt_len))
    ours = np.asarray(refmodel.generate(model, prompt, new))[0, prompt_len:].tolist()
    theirs = llama.greedy(prompt[0].tolist(), new)
    return {"prompt_len": prompt_len, "ours": ours, "llama.cpp": theirs,
            "equal": ours == list(theirs)}


def _median(xs) -> float | None:
    xs = [x for x in xs if x is not None]
    return float(np.median(xs)) if xs else None


def _spread(xs) -> float | None:
    xs = [x for x in xs if x is not None]
    return float((max(xs) - min(xs)) / np.median(xs)) if len(xs) > 1 else None


def summarize(result: dict) -> dict:
    """Per round: each of our points' roof time, roof fraction, bytes/s over the round's read
    and speed over each peer's; then, per (program, batch), the medians over rounds."""
    for r in result["rounds"]:
        read, gemm = max(r["read_bytes_per_s"]), r["gemm_flops_per_s"]
        peers = {p["program"]: p["step_s"] for p in r["peers"]}
        for p in r["points"]:
            p["roof_s"] = max(p["bytes"] / read, p["flops"] / gemm)
            p["bound"] = "memory" if p["bytes"] / read >= p["flops"] / gemm else "compute"
            p["roof_fraction"] = p["roof_s"] / p["step_s"]
            p["over_read"] = p["bytes"] / p["step_s"] / read
            p["speed_over"] = ({name: s / p["step_s"] for name, s in peers.items()}
                               if p["batch"] == 1 and p["program"] in FLOAT_PROGRAMS else {})
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
                   "over_read": _median(p["over_read"] for p in pts)}
            for peer in sorted({k for p in pts for k in p["speed_over"]}):
                row[f"over_{peer}"] = _median(p["speed_over"].get(peer) for p in pts)
                row[f"over_{peer}_rounds"] = [p["speed_over"].get(peer) for p in pts]
            table.append(row)
    peers = {}
    for name in sorted({p["program"] for r in result["rounds"] for p in r["peers"]}):
        steps = [p["step_s"] for r in result["rounds"] for p in r["peers"] if p["program"] == name]
        peers[name] = {"step_s": _median(steps), "step_spread": _spread(steps)}
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
    reads = [max(r["read_bytes_per_s"]) for r in result["rounds"]]
    result["products"] = products
    result["table"] = table
    result["peer_table"] = peers
    result["read"] = {"median": _median(reads), "spread": _spread(reads), "rounds": reads}
    return result
