"""A synthetic result file with known roofs, for tests and for trying figures without measuring.

Every value is derived from the few rates passed in, through the same code paths a real run
uses (peaks.entry, plateaus.find_plateaus, peaks.derive_roofs, guard), so a figure or check
that works on it works on a real peaks.json.
"""

from __future__ import annotations

from microbench import hardware, harness
from microbench.roofs import guard, intensity, peaks, plateaus
from microbench.schema import KIND_PEAKS, SCHEMA_VERSION

CACHES = (("L1", 64 << 10), ("L2", 2 << 20), ("L3", 32 << 20))
LEVEL_BW = {"L1": 4e11, "L2": 2e11, "L3": 1e11, "DRAM": 5e10}


def _timing(seconds: float) -> harness.Timing:
    return harness.Timing(tuple(seconds * f for f in (1.0, 1.03, 0.98, 1.01, 1.05)), 1, "cv")


def spec(peak_f32: float = 4.7e11, dram: float | None = None) -> hardware.Device:
    return hardware.device_from_dict({
        "name": "synthetic cpu", "vendor": "none", "kind": "cpu", "dense": True,
        "peak_flops": {"float32": peak_f32, "bfloat16": 2 * peak_f32},
        "memory_bandwidth": {"DRAM": dram} if dram else {}, "main_memory": "DRAM",
        "memory_bytes": 2**34, "sources": ["synthetic: made up for tests"]})


def _level_of(size: int) -> str:
    return next((name for name, cap in CACHES if size <= cap), "DRAM")


def result(machine: str = "synthetic machine", gemm_f32: float = 2e11, vector: float = 1.8e11,
           extra_gemm: float | None = None, dram_ceiling: float | None = None) -> dict:
    """A valid result; `extra_gemm` adds a float32 GEMM at that rate (e.g. above the peak)."""
    sp = spec(dram=dram_ceiling)
    m = 1024
    fl, by = 2.0 * m**3, 12.0 * m * m
    gemm = [peaks.entry("gemm", _timing(fl / gemm_f32), fl, by, dtype="float32",
                        shape=[m, m, m], ran="float32, HIGHEST"),
            peaks.entry("gemm", _timing(fl / (0.8 * gemm_f32)), fl, by / 2, dtype="bfloat16",
                        shape=[m, m, m], ran="bfloat16, DEFAULT")]
    if extra_gemm:
        gemm.append(peaks.entry("gemm", _timing(fl / extra_gemm), fl, by, dtype="float32",
                                shape=[m // 2, m, m], ran="float32, HIGHEST"))
    vec = [peaks.entry("fma_chain", _timing(1e9 / vector), 1e9, 1e6, dtype="float32", K=64,
                       k=8, n=1 << 17)]
    n = 1 << 25
    stream = [peaks.entry("scale", _timing(8.0 * n / LEVEL_BW["DRAM"]), n, 8.0 * n,
                          dtype="float32", donated=True, n=n, level="DRAM")]
    sizes = [4096 * 2**i for i in range(18)]
    sweep = [peaks.entry("scale_inplace_sweep", _timing(2.0 * s / LEVEL_BW[_level_of(s)]),
                         s / 4, 2.0 * s, dtype="float32", working_set_bytes=s) for s in sizes]
    found = plateaus.find_plateaus(sizes, [p["bytes_per_s"]["median"] for p in sweep], CACHES)
    ai_points = []
    for K, k in intensity.QUICK_POINTS:
        ai = intensity.intensity(K, k)
        rate = min(vector, ai * LEVEL_BW["DRAM"])
        ai_points.append(peaks.entry("fma_chain_inplace", _timing(ai * 8e6 / rate), ai * 8e6,
                                     8e6, dtype="float32", K=K, k=k, flops_per_byte=ai))
    res = {"schema_version": SCHEMA_VERSION, "kind": KIND_PEAKS, "machine": machine,
           "quick": True, "spec": sp.to_dict(),
           "environment": {"backend": "cpu", "device_kind": "cpu", "affinity": [0, 1],
                           "date_utc": "2026-01-01T00:00:00+00:00"},
           "gemm": [guard.flag_compute(e, sp) for e in gemm],
           "vector": [guard.flag_compute(e, sp) for e in vec],
           "bandwidth": [guard.flag_memory(e, sp, "DRAM") for e in stream],
           "sweep": {"kernel": "synthetic", "points": sweep, "plateaus": [vars(q) for q in found],
                     "cache_capacities": [list(c) for c in CACHES]},
           "intensity": {"kernel": "synthetic", "points": ai_points}}
    res["roofs"] = peaks.derive_roofs(res, sp)
    return res
