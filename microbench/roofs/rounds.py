"""The main roofs, measured in interleaved rounds beside peer programs.

Main memory on a shared VM drifts by tens of percent over seconds to minutes (the README's
method section), so a roof measured once is the roof of one moment. Each round runs, back to
back, every program that can reach each main roof:

    metric        ours (XLA, through JAX)              peers (same machine, same round)
    gemm_float32  f32 GEMM at the best square shape    numpy (OpenBLAS) matmul
    main_rw       in-place scale, donated buffer       C in-place scale and triad (all cores),
                                                       numpy in-place multiply (1 thread)
    main_read     jnp.sum                              C read (all cores, 4 streams each)

plus the probes, a short XLA read and GEMM that later phase points repeat before and after
themselves (microbench.roofs.probe; the points' read probe is the C read itself where gcc built it,
its reference the C read's rounds), so each prediction can be scaled to its own moment.

A roof is the program that reached the most (median over rounds), labelled with its name: the
hardware's level, not the compiler's. What XLA reaches is kept beside it as the
compiler-reachable level (`roofs.compiler`), part of the explained gap. A memory program of ours
more than `SUSPECT_ABOVE_PEER` above every peer is flagged (a cache-resident buffer or removed work,
not a roof). A roof whose rounds disagree by more than `UNSTABLE_SPREAD` is reported unstable.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
import weakref

import numpy as np

from microbench import harness
from microbench.roofs import native
from microbench.roofs.peers import close_child, peer_environment

METRICS = ("gemm_float32", "main_rw", "main_read")
PROBES = ("probe", "probe_gemm")  # references for microbench.roofs.probe
# Where a peer streams at the hardware's limit, ours above it is a measurement error; a GEMM
# of ours beating numpy's is not (the compute check is the theoretical peak, guard.py).
MEMORY_METRICS = ("main_rw", "main_read")
UNSTABLE_SPREAD = 0.10  # (max - min) / median of a roof's per-round values
SUSPECT_ABOVE_PEER = 0.10  # ours above the best peer by more than this: suspect

_NUMPY_SCRIPT = r"""
import json, sys, time
import numpy as np
cfg = json.loads(sys.argv[1])
threads = None
try:
    from threadpoolctl import threadpool_info
    threads = [i.get("num_threads") for i in threadpool_info()]
except Exception:
    pass
def samples(f, n_samples, min_s=2e-3):
    f(); f()
    t0 = time.perf_counter(); f(); one = max(time.perf_counter() - t0, 1e-9)
    calls = max(1, int(np.ceil(min_s / one)))
    out = []
    for _ in range(n_samples):
        t0 = time.perf_counter()
        for _ in range(calls):
            f()
        out.append((time.perf_counter() - t0) / calls)
    return out
rng = np.random.default_rng(0)
m, k, n = cfg["gemm"]
a = rng.standard_normal((m, k), dtype=np.float32)
b = rng.standard_normal((k, n), dtype=np.float32)
block = rng.standard_normal(1 << 20, dtype=np.float32)
x = np.tile(block, -(-cfg["n"] // block.size))[:cfg["n"]].copy()
s = np.float32(0.999)
print(json.dumps({"ready": True}), flush=True)
for line in sys.stdin:  # one measurement per line, arrays allocated once
    if not line.strip():
        break
    gemm = samples(lambda: a @ b, cfg["samples"])
    scale = samples(lambda: np.multiply(x, s, out=x), cfg["samples"])
    print(json.dumps({"gemm": gemm, "scale_inplace": scale, "numpy": np.__version__,
                      "blas_threads": threads}), flush=True)
"""


class NumpyPeer:
    """numpy's matmul and in-place multiply in a long-lived child without the OpenBLAS pins
    (arrays made once; one measurement per `measure()`)."""

    def __init__(self, shape, n: int, samples: int = 5):
        cfg = json.dumps({"gemm": list(shape), "n": int(n), "samples": samples})
        self._proc = subprocess.Popen([sys.executable, "-c", _NUMPY_SCRIPT, cfg],
                                      env=peer_environment(), stdin=subprocess.PIPE,
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                      text=True)
        # ends the child when closed, collected or at exit (before modules are torn down)
        self._finalizer = weakref.finalize(self, close_child, self._proc)
        self._readline()

    def _readline(self) -> dict:
        line = self._proc.stdout.readline()
        if not line:
            raise RuntimeError("numpy peer stopped: "
                               f"{self._proc.stderr.read().strip()[-300:] or 'no output'}")
        return json.loads(line)

    def measure(self) -> dict:
        self._proc.stdin.write("go\n")
        self._proc.stdin.flush()
        return self._readline()

    def close(self) -> None:
        self._finalizer()


def _program(metric: str, name: str, ours: bool, amount: float, seconds) -> dict:
    seconds = [float(s) for s in seconds]
    return {"metric": metric, "program": name, "ours": ours, "amount": float(amount),
            "seconds": seconds, "value": amount / float(np.median(seconds))}


class Ours:
    """Our side of each round: compiled once, arrays allocated once, re-timed every round."""

    def __init__(self, gemm_shape, n_main: int, n_probe: int,
                 source: np.ndarray | None = None, budget_s: float = 0.5):
        import jax.numpy as jnp

        from microbench.roofs import bandwidth, compute, probe

        self.gemm_shape, self.n_main, self.budget_s = tuple(gemm_shape), n_main, budget_s
        self._gemm_fn, self.gemm_label = compute.gemm_fn("float32")
        self._gemm_args = compute.gemm_inputs(*self.gemm_shape, "float32")
        host = source[:n_main] if source is not None and source.size >= n_main else None
        self._array = jnp.asarray(host if host is not None else probe.host_array(n_main))
        self._read = bandwidth.KERNELS["read"]
        self._scale = bandwidth.KERNELS["scale"]
        self.probe = probe.Probe(self._array, n_probe)

    def _t(self, fn, *args, donate=()):
        return harness.time_fn(fn, *args, donate_argnums=donate, budget_s=self.budget_s,
                               min_samples=5, target_cv=0.03, min_sample_s=2e-3)

    def measure(self) -> list[dict]:
        from jax import numpy as jnp

        m, k, n = self.gemm_shape
        out = [_program("gemm_float32", f"XLA GEMM {m}x{k}x{n} ({self.gemm_label})", True,
                        2.0 * m * k * n, self._t(self._gemm_fn, *self._gemm_args).samples)]
        s = jnp.asarray(0.999, dtype=jnp.float32)
        out.append(_program("main_read", "XLA read (jnp.sum)", True, 4.0 * self.n_main,
                            self._t(self._read.fn, self._array).samples))
        out.append(_program("main_rw", "XLA in-place scale (donated)", True, 8.0 * self.n_main,
                            self._t(self._scale.fn, self._array, s, donate=(0,)).samples))
        out.append(_program("probe", self.probe.name, True, self.probe.bytes,
                            self.probe.samples()))
        out.append(_program("probe_gemm", self.probe.gemm_name, True, self.probe.gemm_flops,
                            self.probe.gemm_samples()))
        return out


class Peers:
    """Every peer program, started once (arrays allocated once), measured once per round."""

    def __init__(self, gemm_shape, n_main: int, threads: int):
        self.gemm_shape, self.n_main = tuple(gemm_shape), n_main
        self.numpy = NumpyPeer(gemm_shape, n_main)
        self.skipped = [] if native.available() else ["C peer: gcc not found"]
        self.c = native.Server(n_main, threads) if native.available() else None

    def measure(self) -> list[dict]:
        out = []
        m, k, n = self.gemm_shape
        npy = self.numpy.measure()
        blas = f", {max(npy['blas_threads'])} threads" if npy.get("blas_threads") else ""
        out.append(_program("gemm_float32", f"numpy {npy['numpy']} matmul (OpenBLAS{blas})",
                            False, 2.0 * m * k * n, npy["gemm"]))
        out.append(_program("main_rw", f"numpy {npy['numpy']} in-place multiply (1 thread)",
                            False, 8.0 * self.n_main, npy["scale_inplace"]))
        if self.c is None:
            return out
        c = self.c.stream(5)
        label = native.label(c["threads"])
        for kern, metric in (("read", "main_read"), ("scale_inplace", "main_rw"),
                             ("triad", "main_rw")):
            name = {"read": "read", "scale_inplace": "in-place scale", "triad": "triad"}[kern]
            out.append(_program(metric, f"C {name} ({label})", False,
                                native.BYTES_PER_ELEMENT[kern] * c["n"], c[kern]))
        return out

    def close(self) -> None:
        self.numpy.close()
        if self.c is not None:
            self.c.close()


def measure_round(index: int, ours: Ours, peers: Peers) -> dict:
    """Ours, then every peer, back to back; wall-clock times recorded."""
    t0 = time.time()
    programs = ours.measure() + peers.measure()
    return {"round": index, "t_start": t0, "t_end": time.time(), "programs": programs,
            "skipped": peers.skipped}


def _by_program(rounds: list[dict], metric: str) -> dict[str, dict]:
    progs: dict[str, dict] = {}
    for rnd in rounds:
        for p in rnd["programs"]:
            if p["metric"] == metric:
                entry = progs.setdefault(p["program"], {"program": p["program"],
                                                        "ours": p["ours"], "values": []})
                entry["values"].append(p["value"])
    for entry in progs.values():
        v = np.asarray(entry["values"])
        entry.update(median=float(np.median(v)), min=float(v.min()), max=float(v.max()),
                     spread=float((v.max() - v.min()) / np.median(v)))
    return progs


def derive(rounds: list[dict]) -> dict[str, dict]:
    """Per metric: the roof (best program), its stability, ours and the best peer."""
    out = {}
    for metric in METRICS + PROBES:
        progs = _by_program(rounds, metric)
        if not progs:
            continue
        ours = [p for p in progs.values() if p["ours"]]
        theirs = [p for p in progs.values() if not p["ours"]]
        best_peer = max(theirs, key=lambda p: p["median"], default=None)
        flags = []
        candidates = list(progs.values())
        for p in ours if metric in MEMORY_METRICS else ():
            # adjacent in time within each round: the fair comparison on a drifting machine
            ratios = _round_ratios(rounds, metric, p["program"])
            r = float(np.median(ratios)) if ratios else 0.0
            if best_peer and r > 1 + SUSPECT_ABOVE_PEER:
                flags.append(f"{p['program']} reads {p['median'] / 1e9:.3g} G/s, {r - 1:.0%} "
                             f"above the best peer of the same round (median over "
                             f"{len(ratios)} rounds; best peer overall {best_peer['program']}): "
                             f"a measurement to explain, not a roof")
                candidates.remove(p)
        roof = max(candidates, key=lambda p: p["median"])
        out[metric] = {
            "value": roof["median"], "program": roof["program"], "ours_is_roof": roof["ours"],
            "round_values": roof["values"], "p10": roof["min"], "p90": roof["max"],
            "spread": roof["spread"], "unstable": roof["spread"] > UNSTABLE_SPREAD,
            "ours": ours[0] if ours else None, "best_peer": best_peer,
            "ratio_roof_over_best_peer": roof["median"] / best_peer["median"] if best_peer
            else None,
            "ratio_ours_over_best_peer": (ours[0]["median"] / best_peer["median"]
                                          if ours and best_peer else None),
            "round_ratios_ours_over_best_peer": _round_ratios(rounds, metric),
            "suspect": flags, "programs": list(progs.values()),
        }
    return out


def _round_ratios(rounds: list[dict], metric: str, program: str | None = None) -> list[float]:
    """Ours (or one program of ours) / the best peer within each round (the fair comparison
    under drift)."""
    out = []
    for rnd in rounds:
        ps = [p for p in rnd["programs"] if p["metric"] == metric]
        ours = [p["value"] for p in ps if p["ours"] and program in (None, p["program"])]
        theirs = [p["value"] for p in ps if not p["ours"]]
        if ours and theirs:
            out.append(max(ours) / max(theirs))
    return out


def drift(rounds: list[dict], metric: str = "main_read") -> dict:
    """How much the best program of `metric` moved between rounds: per-round values and times."""
    out = []
    for rnd in rounds:
        vals = [p["value"] for p in rnd["programs"] if p["metric"] == metric]
        if vals:
            out.append({"t": rnd["t_start"], "value": max(vals)})
    v = np.asarray([o["value"] for o in out]) if out else np.zeros(1)
    return {"metric": metric, "points": out,
            "spread": float((v.max() - v.min()) / np.median(v)) if out else 0.0}
