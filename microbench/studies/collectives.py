"""Collective bandwidth against message size: all-reduce, all-gather, reduce-scatter and
all-to-all over a 1-D mesh of every device JAX has, timed per message size, checked against
numpy, and reported the way nccl-tests reports them.

Why: tensor parallelism puts an all-reduce (or a reduce-scatter plus an all-gather) in every
layer and expert parallelism an all-to-all; their time at the message sizes of a decode step
(kilobytes, latency-bound) and of a prefill (megabytes, bandwidth-bound) decides whether
splitting a model over chips pays. This sweep measures that curve on the devices at hand.

Each collective runs inside `jax.shard_map` over `jax.make_mesh((n,), ("x",))`, jitted:
`jax.lax.psum` (all-reduce), `jax.lax.all_gather(tiled=True)`, `jax.lax.psum_scatter(tiled=True)`
(reduce-scatter) and `jax.lax.all_to_all(tiled=True)`, on float32 random normal buffers, out of
place (a fresh output buffer per call). Every size is compiled before timing, run once and
compared with numpy's result (a benchmark that moves wrong bytes is not a bandwidth), then timed
by `harness.time_fn` (untimed warm-ups, blocked calls, raw samples kept).

The byte and bandwidth convention is nccl-tests' (NVIDIA/nccl-tests, doc/PERFORMANCE.md):
  bytes S   the per-device buffer: the input of all-reduce, reduce-scatter and all-to-all, the
            OUTPUT of all-gather (n x its input), i.e. the larger of the two on each device;
  algbw     S / time;
  busbw     algbw x 2(n-1)/n for all-reduce, x (n-1)/n for all-gather, reduce-scatter and
            all-to-all: the bytes each device must send (or receive) over its own link per unit
            time, comparable with one direction of a link's bandwidth whatever n is.

Emulated devices: on a plain CPU machine the CPU backend is split into N host devices
(`jax_num_cpu_devices`, set before any backend starts). They are threads of one process and
a "collective" is a memory copy between buffers in the same DRAM, so what is measured there is
this machine's copy speed and thread rendezvous, not an interconnect. Results say so
(`emulated: true`), and the figure's title too.

Public API:
    COLLECTIVES, SIZES, QUICK_SIZES
    busbw_factor(name, n) -> float
    use_devices(requested=None, default_cpu=8) -> (devices, emulated)
    expected(name, x, n) -> np.ndarray       numpy's result on the global input
    check(name, x, out, n)                   raises RuntimeError when out is wrong
    measure(sizes, devices, emulated, repeats=10, budget_s=1.0, progress=None) -> dict
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import jax
import numpy as np
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from microbench import harness

KIB, MIB = 2**10, 2**20
SIZES = tuple(KIB * 2**i for i in range(17))  # 1 KiB ... 64 MiB per device
QUICK_SIZES = (KIB, 16 * KIB, 256 * KIB, 4 * MIB)
DTYPE = np.float32
AXIS = "x"
SOURCE = "NVIDIA/nccl-tests doc/PERFORMANCE.md (algbw = S/t; busbw = algbw x factor)"
EMULATED_NOTE = ("emulated CPU devices are threads of one process: a collective copies memory "
                 "within one DRAM, so the bandwidth is this machine's copy speed and thread "
                 "rendezvous, not an interconnect")


@dataclass(frozen=True)
class Collective:
    name: str
    op: str  # the jax.lax call, as recorded in the result
    body: Callable  # per-device function of the shard_map
    gathers: bool  # True: the input is S/n per device and the output S (all-gather)
    factor: Callable[[int], float]  # busbw / algbw for n devices (nccl-tests)


COLLECTIVES = {c.name: c for c in (
    Collective("all_reduce", "jax.lax.psum", lambda x: jax.lax.psum(x, AXIS), False,
               lambda n: 2 * (n - 1) / n),
    Collective("all_gather", "jax.lax.all_gather(tiled=True)",
               lambda x: jax.lax.all_gather(x, AXIS, tiled=True), True, lambda n: (n - 1) / n),
    Collective("reduce_scatter", "jax.lax.psum_scatter(tiled=True)",
               lambda x: jax.lax.psum_scatter(x, AXIS, tiled=True), False,
               lambda n: (n - 1) / n),
    Collective("all_to_all", "jax.lax.all_to_all(tiled=True)",
               lambda x: jax.lax.all_to_all(x, AXIS, 0, 0, tiled=True), False,
               lambda n: (n - 1) / n),
)}
FACTORS = {"all_reduce": "2(n-1)/n", "all_gather": "(n-1)/n", "reduce_scatter": "(n-1)/n",
           "all_to_all": "(n-1)/n"}


def busbw_factor(name: str, n: int) -> float:
    """busbw / algbw for collective `name` over n devices (nccl-tests' correction factor)."""
    if name not in COLLECTIVES:
        raise KeyError(f"unknown collective {name!r}; valid: {', '.join(COLLECTIVES)}")
    return COLLECTIVES[name].factor(n)


# ------------------------------------------------------------------ devices

def use_devices(requested: int | None = None, default_cpu: int = 8) -> tuple[list, bool]:
    """The devices to measure on, and whether they are emulated CPU devices.

    On a CPU backend, `requested` (default `default_cpu`) host devices are made before the
    backend starts; if it has already started with fewer, a ValueError names --devices. On a
    GPU or TPU the real devices are used and `requested` is refused.
    """
    if requested is not None and requested < 2:
        raise ValueError(f"--devices {requested}: a collective needs at least 2 devices")
    want = default_cpu if requested is None else requested
    try:
        jax.config.update("jax_num_cpu_devices", want)
    except RuntimeError:  # the backends have started: whatever they have is what there is
        pass
    backend = jax.default_backend()
    devices = jax.devices()
    if backend != "cpu":
        if requested is not None:
            raise ValueError(f"--devices {requested}: only for emulated CPU devices; the "
                             f"{backend} backend has {len(devices)} real device(s), used as is")
        if len(devices) < 2:
            raise ValueError(f"a collective needs at least 2 devices; the {backend} backend "
                             f"has {len(devices)}")
        return devices, False
    if len(devices) < want:
        raise ValueError(f"--devices {want}: JAX's CPU backend already started with "
                         f"{len(devices)} device(s); emulated devices are made before it "
                         "starts: run `python -m microbench collectives --devices N` in a "
                         "fresh process")
    return devices[:want], True


# ------------------------------------------------------------------ one collective

def elements(nbytes: int, n: int) -> int:
    """float32 elements of an S-byte per-device buffer, rounded down to a multiple of n."""
    count = nbytes // np.dtype(DTYPE).itemsize // n * n
    if count < n:
        raise ValueError(f"message size {nbytes} B: below one float32 per device ({n} devices)")
    return count


def shard_fn(name: str, mesh) -> Callable:
    """The jitted collective over `mesh`: global input [n x per-device input], sharded on x;
    the global output is the per-device outputs concatenated in device order."""
    body = COLLECTIVES[name].body
    return jax.jit(jax.shard_map(body, mesh=mesh, in_specs=P(AXIS), out_specs=P(AXIS)))


def input_length(name: str, count: int, n: int) -> int:
    """Per-device input elements for an S-element buffer (all-gather: S/n in, S out)."""
    return count // n if COLLECTIVES[name].gathers else count


def expected(name: str, x: np.ndarray, n: int) -> np.ndarray:
    """numpy's result on the global input x (n per-device inputs, concatenated)."""
    per = x.reshape(n, -1)  # [device, per-device input]
    if name == "all_reduce":  # every device holds the sum
        return np.tile(per.sum(axis=0, dtype=np.float64), n).astype(DTYPE)
    if name == "all_gather":  # every device holds every input, in device order
        return np.tile(x, n)
    if name == "reduce_scatter":  # device d holds the d-th n-th of the sum
        return per.sum(axis=0, dtype=np.float64).astype(DTYPE)
    if name == "all_to_all":  # device d holds chunk d of every device, in source order
        return per.reshape(n, n, -1).transpose(1, 0, 2).reshape(-1)
    raise KeyError(f"unknown collective {name!r}; valid: {', '.join(COLLECTIVES)}")


def check(name: str, x: np.ndarray, out: np.ndarray, n: int) -> float:
    """Raise RuntimeError when `out` is not numpy's result; return the largest error.
    Sums may round differently (float32 over n terms); moves must be exact."""
    want = expected(name, x, n)
    out = np.asarray(out)
    if out.shape != want.shape:
        raise RuntimeError(f"{name}: output shape {out.shape}, numpy's {want.shape}")
    err = float(np.max(np.abs(out.astype(np.float64) - want))) if out.size else 0.0
    tol = 1e-5 * n * max(1.0, float(np.max(np.abs(want)))) if "reduce" in name else 0.0
    if not err <= tol:
        raise RuntimeError(f"{name} on {n} devices, {out.size} elements: wrong result, largest "
                           f"error {err:.3g} against numpy (allowed {tol:.3g})")
    return err


def measure_one(name: str, nbytes: int, mesh, rng: np.random.Generator, *, repeats: int,
                budget_s: float) -> dict:
    """Compile, check against numpy, then time one collective at one per-device size."""
    n = mesh.size
    count = elements(nbytes, n)
    x = rng.standard_normal(n * input_length(name, count, n), dtype=DTYPE)
    xs = jax.device_put(x, NamedSharding(mesh, P(AXIS)))
    compiled = harness.compile_fn(shard_fn(name, mesh), xs)
    error = check(name, x, compiled(xs), n)
    del x
    timing = harness.time_fn(compiled, xs, min_samples=repeats, budget_s=budget_s,
                             max_samples=max(repeats, 200))
    size = count * np.dtype(DTYPE).itemsize
    factor = busbw_factor(name, n)
    algbw = harness.rates(size, timing)
    return {"collective": name, "bytes": size, "elements": count,
            "input_elements": input_length(name, count, n),
            "seconds": timing.median, "timing": timing.to_dict(), "algbw": algbw,
            "busbw_factor": factor, "busbw": {k: v * factor for k, v in algbw.items()},
            "checked": True, "max_abs_error": error}


# ------------------------------------------------------------------ the sweep

def _devices_block(devices: Sequence, emulated: bool) -> dict:
    d = devices[0]
    block = {"count": len(devices), "backend": d.platform, "device_kind": d.device_kind,
             "emulated": emulated}
    if emulated:
        block["note"] = EMULATED_NOTE
    return block


def measure(sizes: Sequence[int], devices: Sequence, emulated: bool, *, repeats: int = 10,
            budget_s: float = 1.0, progress: Callable[[str], None] | None = None,
            names: Sequence[str] = tuple(COLLECTIVES), seed: int = 0) -> dict:
    """Every collective in `names` at every per-device size in `sizes` (bytes) on `devices`."""
    if repeats < 1:
        raise ValueError(f"--repeats {repeats}: at least 1")
    n = len(devices)
    mesh = jax.make_mesh((n,), (AXIS,), devices=list(devices))
    rng = np.random.default_rng(seed)
    results = []
    for name in names:
        for nbytes in sizes:
            results.append(measure_one(name, int(nbytes), mesh, rng, repeats=repeats,
                                       budget_s=budget_s))
            if progress:
                progress(f"{name} {nbytes} B")
    return {"kind": "collectives", "emulated": emulated, "dtype": np.dtype(DTYPE).name,
            "devices": _devices_block(devices, emulated),
            "collectives": {c: COLLECTIVES[c].op for c in names},
            "convention": {
                "source": SOURCE,
                "bytes": "the per-device buffer: the input of all_reduce, reduce_scatter and "
                         "all_to_all, the output of all_gather (n x its input)",
                "algbw": "S / time (bytes/s)",
                "busbw": {c: f"algbw x {FACTORS[c]}" for c in names},
                "time": "per call, out of place, from compiled call to block_until_ready"},
            "setup": {"sizes": [int(s) for s in sizes], "repeats": repeats,
                      "budget_s": budget_s, "seed": seed},
            "results": results}


def links(names: Sequence[str]) -> list[dict]:
    """Vendor spec of interconnects from the hardware database, to draw beside the
    measurement: bandwidth in bytes/s per direction per chip (what busbw compares with)."""
    from microbench import hardware

    out = []
    for name in names:
        spec = hardware.get_link(name)
        out.append({"name": spec.name, "kind": spec.kind, "bandwidth": spec.bandwidth,
                    "latency": spec.latency, "sources": list(spec.sources)})
    return out
