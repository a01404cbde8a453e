"""The timing harness every benchmark in the project uses, plus the environment block and
atomic result writers.

Method (the README's method section; after the ERT, BabelStream and the JAX "benchmarking" FAQ):
compile outside the timer (`jax.jit(f).lower(*args).compile()`), run untimed warm-ups,
block with `jax.block_until_ready`, make every sample last at least `min_sample_s` by queueing
several calls in one sample, and repeat until the coefficient of variation falls below
`target_cv` or the time budget is spent. Raw samples are kept; every statistic is per call.

Donated buffers: `time_fn(f, *args, donate_argnums=(0,))` compiles `f` with those arguments
donated, copies them once (the caller's arrays survive) and feeds the outputs of each call back
as the donated inputs of the next, in order, so an in-place kernel stays in place and calls
chain. `f` must then return arrays of the donated arguments' shapes and dtypes (a single array
when one argument is donated, a tuple otherwise).

Public API:
    time_fn(fn, *args, min_sample_s=1e-3, warmup=2, target_cv=0.02, budget_s=2.0,
            min_samples=5, max_samples=200, donate_argnums=(), carry=None, before=None,
            clock=time.perf_counter) -> Timing
    Evictor(nbytes=None)                (before=Evictor(): every call starts with cold caches)
    compile_fn(fn, *args, donate_argnums=()) -> jax.stages.Compiled
    summarize(samples) -> dict          (median, min, p10, p90, mean, cv)
    stop_reason(samples, elapsed_s, ...) -> str | None
    rates(amount, timing) -> dict       (amount/time at the median, p10 and p90 of the rate)
    environment() -> dict               (the block every result file carries)
    write_json_atomic(path, obj), write_csv_atomic(path, rows), write_text_atomic(path, text)
"""

from __future__ import annotations

import datetime as _dt
import os
import platform
import subprocess
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import jax
import numpy as np

from microbench import sysinfo
from microbench.schema import SCHEMA_VERSION


@dataclass(frozen=True)
class Timing:
    """Seconds per call for each sample, and how sampling went."""

    samples: tuple[float, ...]
    calls_per_sample: int
    stop: str  # why sampling stopped: "cv", "budget" or "max_samples"

    @property
    def stats(self) -> dict:
        return summarize(self.samples)

    @property
    def median(self) -> float:
        return self.stats["median"]

    def to_dict(self) -> dict:
        d = asdict(self)
        d["samples"] = list(self.samples)
        d.update(self.stats)
        return d


def summarize(samples: Sequence[float]) -> dict:
    """Median, min, p10, p90, mean and coefficient of variation (sample std / mean)."""
    x = np.asarray(samples, dtype=np.float64)
    if x.size == 0:
        raise ValueError("summarize: no samples")
    mean = float(x.mean())
    std = float(x.std(ddof=1)) if x.size > 1 else 0.0
    return {
        "n": int(x.size),
        "median": float(np.median(x)),
        "min": float(x.min()),
        "p10": float(np.percentile(x, 10)),
        "p90": float(np.percentile(x, 90)),
        "mean": mean,
        "cv": std / mean if mean > 0 else float("inf"),
    }


def stop_reason(samples: Sequence[float], elapsed_s: float, *, target_cv: float,
                budget_s: float, min_samples: int, max_samples: int) -> str | None:
    """Why to stop sampling now, or None to take another sample.

    Never before `min_samples`; then at `max_samples`, when the CV reaches `target_cv`, or when
    `elapsed_s` has used the budget (the budget cannot stop the first `min_samples`).
    """
    n = len(samples)
    if n < min_samples:
        return None
    if n >= max_samples:
        return "max_samples"
    if summarize(samples)["cv"] <= target_cv:
        return "cv"
    if elapsed_s >= budget_s:
        return "budget"
    return None


def compile_fn(fn: Callable, *args, donate_argnums: Sequence[int] = ()):
    """AOT-compile `fn` for `args`; a `jax.stages.Compiled` is returned unchanged.

    With donation, unused arguments are kept (`keep_unused=True`): a kernel that only writes
    its destination (fill, copy into, triad into) must still receive that buffer to write in
    place, and jit would otherwise prune it.
    """
    if isinstance(fn, jax.stages.Compiled):
        return fn
    if donate_argnums or not hasattr(fn, "lower"):
        fn = jax.jit(fn, donate_argnums=tuple(donate_argnums), keep_unused=bool(donate_argnums))
    return fn.lower(*args).compile()


def _copy_donated(args: list, donate_argnums: Sequence[int]) -> list:
    args = list(args)
    for i in donate_argnums:
        args[i] = jax.tree.map(lambda a: jax.numpy.array(a, copy=True), args[i])  # pytrees too
    return args


def _runner(compiled, args: list, donate_argnums: Sequence[int], carry=None):
    """A function that makes `n` calls and blocks on all their outputs."""
    donate = tuple(donate_argnums)

    def run(n: int) -> None:
        outs = []
        for _ in range(n):
            out = compiled(*args)
            if donate:
                if carry is not None:
                    carried = carry(out)
                else:
                    carried = out if isinstance(out, (tuple, list)) else (out,)
                for slot, value in zip(donate, carried, strict=True):
                    args[slot] = value
                outs = [out]
            else:
                outs.append(out)
        jax.block_until_ready(outs)

    return run


def time_fn(fn: Callable, *args, min_sample_s: float = 1e-3, warmup: int = 2,
            target_cv: float = 0.02, budget_s: float = 2.0, min_samples: int = 5,
            max_samples: int = 200, donate_argnums: Sequence[int] = (),
            carry: Callable | None = None, before: Callable[[], None] | None = None,
            clock: Callable[[], float] = time.perf_counter) -> Timing:
    """Time `fn(*args)` per call (see the module docstring for the method).

    `carry(out)` picks, from one call's output, the values fed back into the donated
    arguments of the next (default: the output itself), e.g. `lambda out: (out[1],)` for a
    phase returning (logits, cache) with the cache donated. `before()`, if given, runs
    before every timed call, outside the clock (an `Evictor`: each call then starts with
    cold caches), and every sample is one call.
    """
    compiled = compile_fn(fn, *args, donate_argnums=donate_argnums)
    run = _runner(compiled, _copy_donated(list(args), donate_argnums), donate_argnums, carry)
    for _ in range(max(1, warmup)):
        run(1)
    t0 = clock()  # calibrate: calls per sample so one sample lasts >= min_sample_s
    run(1)
    one = max(clock() - t0, 1e-9)
    calls = 1 if before is not None else max(1, int(np.ceil(min_sample_s / one)))
    samples: list[float] = []
    start = clock()
    while True:
        if before is not None:
            before()
        t0 = clock()
        run(calls)
        samples.append((clock() - t0) / calls)
        reason = stop_reason(samples, clock() - start, target_cv=target_cv, budget_s=budget_s,
                             min_samples=min_samples, max_samples=max_samples)
        if reason:
            return Timing(tuple(samples), calls, reason)


class Evictor:
    """Reads a buffer larger than every cache before a timed call, so that the call finds
    none of its own data cached: what one layer's phase meets inside a real decode step,
    where every other layer's weights pass through the caches between two of its calls.
    `nbytes` defaults to 4x the last-level cache the OS reports (at least 128 MiB)."""

    def __init__(self, nbytes: int | None = None):
        import jax.numpy as jnp

        if nbytes is None:
            caches = sysinfo.aggregate_cache_bytes(sysinfo.cache_sizes(), len(sysinfo.affinity()))
            nbytes = max(4 * max((c for _, c in caches), default=0), 128 << 20)
        self.nbytes = int(nbytes) // 4 * 4
        self._buf = jnp.ones((self.nbytes // 4,), jnp.float32)
        self._read = jax.jit(jnp.max)

    def __call__(self) -> None:
        self._read(self._buf).block_until_ready()


def rates(amount: float, timing: Timing | dict) -> dict:
    """amount / time per call: median, and the rate's p10/p90 (from the time's p90/p10)."""
    st = timing.stats if isinstance(timing, Timing) else timing
    return {"median": amount / st["median"], "p10": amount / st["p90"],
            "p90": amount / st["p10"], "max": amount / st["min"]}


# ----------------------------------------------------------------------------- environment

def _git_revision() -> str | None:
    here = Path(__file__).resolve().parent
    try:
        res = subprocess.run(["git", "rev-parse", "HEAD"], cwd=here, capture_output=True,
                             text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    return res.stdout.strip() or None if res.returncode == 0 else None


def _device_memory() -> dict | None:
    try:
        stats = jax.devices()[0].memory_stats()
    except Exception:  # noqa: BLE001 - backends without memory stats raise various errors
        return None
    if not stats:
        return None
    keep = ("bytes_limit", "bytes_in_use", "peak_bytes_in_use")
    return {k: int(stats[k]) for k in keep if k in stats}


def environment() -> dict:
    """Backend, device, versions, flags, CPU, caches, date and git revision (no hostname)."""
    import jaxlib

    dev = jax.devices()[0]
    info = sysinfo.read_cpuinfo()
    hz, hz_how = sysinfo.clock_hz()
    return {
        "schema_version": SCHEMA_VERSION,
        "backend": jax.default_backend(),
        "device_kind": dev.device_kind,
        "device_count": jax.device_count(),
        "compute_capability": getattr(dev, "compute_capability", None),
        "jax_version": jax.__version__,
        "jaxlib_version": jaxlib.__version__,
        "python_version": platform.python_version(),
        "xla_flags": os.environ.get("XLA_FLAGS"),
        "jax_default_matmul_precision": jax.config.jax_default_matmul_precision,
        "cpu_model": sysinfo.cpu_model(info),
        "cpu_id": sysinfo.cpu_family(info),
        "isa_flags": sysinfo.isa_flags(info),
        "cpu_count": os.cpu_count(),
        "affinity": sysinfo.affinity(),
        "cpu_clock_hz": hz,
        "cpu_clock_source": hz_how,
        "caches": sysinfo.cache_sizes(),
        "device_memory": _device_memory(),
        "date_utc": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "git_revision": _git_revision(),
    }


# ----------------------------------------------------------------------------- writers
# Atomic writers live in microbench.files (no JAX import, so figures redraw without JAX);
# re-exported here for callers that time and write in one place.
from microbench.files import (  # noqa: E402
    check_writable_dir,
    readable,
    write_csv_atomic,
    write_json_atomic,
    write_text_atomic,
)

__all__ = ["Timing", "summarize", "stop_reason", "compile_fn", "time_fn", "rates",
           "environment", "check_writable_dir", "readable", "write_csv_atomic",
           "write_json_atomic", "write_text_atomic"]
