"""Peer programs for `peaks --compare`: the best other code on this machine reaches.

A roof is only as credible as its distance to what others reach on the same machine in the
same run. Peers:
  * numpy (OpenBLAS) `a @ b` in float32 at the shape of our best GEMM, and numpy's in-place
    `np.multiply(x, s, out=x)` on a DRAM-sized array. Run in a subprocess whose environment
    drops OPENBLAS_CORETYPE and OPENBLAS_L2_SIZE (a pinned core type made OpenBLAS 4x slower
    here; the variables are removed for this child only, never globally);
  * STREAM-style C kernels (triad, in-place scale, read) compiled on the fly with
    `gcc -O3 -march=native -fopenmp` and run on every allowed core, if gcc exists.
Ratios are ours / best peer under the same byte convention (algorithmic bytes).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from microbench import harness

PEER_ENV_DROP = ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE")

_NUMPY_SCRIPT = r"""
import json, sys, time
import numpy as np
cfg = json.loads(sys.argv[1])
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
gemm = samples(lambda: a @ b, cfg["samples"])
x = rng.standard_normal(cfg["n"], dtype=np.float32)
s = np.float32(0.999)
scale = samples(lambda: np.multiply(x, s, out=x), cfg["samples"])
print(json.dumps({"gemm": gemm, "scale_inplace": scale, "numpy": np.__version__}))
"""

_C_SOURCE = r"""
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
static double now(void) { return omp_get_wtime(); }
int main(int argc, char **argv) {
  long n = atol(argv[1]); int reps = atoi(argv[2]);
  float *a = aligned_alloc(64, n * sizeof(float)), *b = aligned_alloc(64, n * sizeof(float));
  float *c = aligned_alloc(64, n * sizeof(float)); const float s = 0.999f;
  #pragma omp parallel for schedule(static)
  for (long i = 0; i < n; i++) { a[i] = 1.0f + (i % 7); b[i] = 0.5f * (i % 5); c[i] = 0.25f; }
  volatile float sink = 0.0f;
  printf("{\"threads\": %d", omp_get_max_threads());
  const char *names[3] = {"triad", "scale_inplace", "read"};
  for (int kern = 0; kern < 3; kern++) {
    printf(", \"%s\": [", names[kern]);
    for (int r = -2; r < reps; r++) {
      double t0 = now(); float sum = 0.0f;
      if (kern == 0) {
        #pragma omp parallel for simd schedule(static)
        for (long i = 0; i < n; i++) a[i] = b[i] + s * c[i];
      } else if (kern == 1) {
        #pragma omp parallel for simd schedule(static)
        for (long i = 0; i < n; i++) a[i] = s * a[i];
      } else {
        #pragma omp parallel for simd schedule(static) reduction(+:sum)
        for (long i = 0; i < n; i++) sum += a[i];
      }
      double t = now() - t0; sink += sum;
      if (r >= 0) printf("%s%.9f", r ? ", " : "", t);
    }
    printf("]");
  }
  printf("}\n"); return sink == 12345.0f;
}
"""
_C_BYTES = {"triad": 12, "scale_inplace": 8, "read": 4}  # algorithmic bytes per element


def peer_environment() -> dict:
    """This process's environment minus the OpenBLAS pins (for peer children only)."""
    return {k: v for k, v in os.environ.items() if k not in PEER_ENV_DROP}


def run_numpy(shape: list[int], n: int, samples: int = 10) -> dict:
    cfg = json.dumps({"gemm": list(shape), "n": n, "samples": samples})
    res = subprocess.run([sys.executable, "-c", _NUMPY_SCRIPT, cfg], env=peer_environment(),
                         capture_output=True, text=True, timeout=600, check=True)
    return json.loads(res.stdout)


def run_c(n: int, reps: int = 10) -> dict | None:
    """Compile and run the C kernels; None (and a message) when gcc is missing."""
    gcc = shutil.which("gcc")
    if gcc is None:
        print("peaks --compare: gcc not found, skipping the C STREAM peer", file=sys.stderr)
        return None
    with tempfile.TemporaryDirectory() as tmp:
        src, exe = Path(tmp) / "stream.c", Path(tmp) / "stream"
        src.write_text(_C_SOURCE)
        subprocess.run([gcc, "-O3", "-march=native", "-fopenmp", str(src), "-o", str(exe)],
                       check=True, capture_output=True, timeout=120)
        res = subprocess.run([str(exe), str(n), str(reps)], capture_output=True, text=True,
                             timeout=600, check=True)
    return json.loads(res.stdout)


def _peer(name: str, amount: float, samples: list[float], **extra) -> dict:
    t = harness.summarize(samples)
    return {"name": name, **extra, "samples": samples, "rate": harness.rates(amount, t)}


def _ratio_block(ours: dict | None, peers: list[dict], unit: str) -> dict:
    best = max(peers, key=lambda p: p["rate"]["median"], default=None)
    ratio = ours["value"] / best["rate"]["median"] if ours and best else None
    return {"unit": unit, "ours": ours, "peers": peers,
            "best_peer": best["name"] if best else None, "ratio_ours_over_best_peer": ratio}


def _ours_now(best_gemm: dict, n_dram: int) -> tuple[float, float]:
    """Our f32 GEMM (best shape) and donated in-place DRAM scale, timed right now."""
    from microbench import bandwidth, compute

    m, k, n = best_gemm["shape"]
    fn, _ = compute.gemm_fn("float32")
    t = harness.time_fn(fn, *compute.gemm_inputs(m, k, n, "float32"), budget_s=1.0,
                        min_samples=5)
    kern = bandwidth.KERNELS["scale"]
    args = bandwidth.kernel_args(kern, n_dram)
    d = harness.time_fn(kern.fn, *args, donate_argnums=(0,), budget_s=1.0, min_samples=5)
    return 2.0 * m * k * n / t.median, 8.0 * n_dram / d.median


def _peers_now(best_gemm: dict, n_dram: int) -> tuple[list[dict], list[dict], list[str]]:
    m, k, n = best_gemm["shape"]
    npy = run_numpy([m, k, n], n_dram)
    gemm = [_peer(f"numpy {npy['numpy']} matmul (OpenBLAS)", 2.0 * m * k * n, npy["gemm"],
                  shape=[m, k, n])]
    dram = [_peer(f"numpy {npy['numpy']} in-place multiply (1 thread)", 8.0 * n_dram,
                  npy["scale_inplace"], n=n_dram)]
    c = run_c(n_dram)
    for kern, per_elem in _C_BYTES.items() if c else ():
        dram.append(_peer(f"C {kern} (gcc -O3 -march=native -fopenmp, {c['threads']} threads)",
                          float(per_elem * n_dram), c[kern], n=n_dram))
    return gemm, dram, [] if c else ["C STREAM peer: gcc not found"]


def compare(result: dict, progress: bool = True, rounds: int = 3) -> dict:
    """Peers at our best GEMM shape and DRAM size, interleaved with re-timings of ours.

    On a shared machine the load drifts, so each round times ours and then the peers back to
    back; `ratio_ours_over_best_peer` compares the run's roofs with the best peer, and
    `interleaved_ratios` the adjacent pairs (their median is the fairer number under load).
    """
    best_gemm = max((e for e in result["gemm"] if e["dtype"] == "float32" and not e["suspect"]),
                    key=lambda e: e["flops_per_s"]["median"])
    n_dram = result["bandwidth"][0]["n"]
    gemm_roof = next((r for r in result["roofs"]["compute"] if r["name"] == "GEMM float32"), None)
    dram_roof = next((r for r in result["roofs"]["memory"] if r["level"] in ("DRAM", "HBM")),
                     None)
    gemm_peers, dram_peers, pairs, skipped = [], [], [], []
    for r in range(rounds):
        if progress:
            print(f"compare round {r + 1}/{rounds}: ours, then numpy and C peers", file=sys.stderr)
        ours_gemm, ours_dram = _ours_now(best_gemm, n_dram)
        g, d, skipped = _peers_now(best_gemm, n_dram)
        gemm_peers += g
        dram_peers += d
        pairs.append({"gemm_float32": ours_gemm / max(p["rate"]["median"] for p in g),
                      "dram": ours_dram / max(p["rate"]["median"] for p in d),
                      "ours_gemm_flops_per_s": ours_gemm, "ours_dram_bytes_per_s": ours_dram})
    out = {"gemm_float32": _ratio_block(gemm_roof, gemm_peers, "FLOP/s"),
           "dram": _ratio_block(dram_roof, dram_peers, "B/s (algorithmic)"),
           "interleaved_ratios": pairs, "peer_env_dropped": list(PEER_ENV_DROP),
           "skipped": skipped}
    for key in ("gemm_float32", "dram"):
        out[key]["interleaved_median_ratio"] = float(
            sorted(p[key] for p in pairs)[len(pairs) // 2])
    return out
