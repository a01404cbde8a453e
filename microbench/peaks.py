"""Measure this machine's roofs and write them: `measure_peaks(quick, out_dir)`.

Runs, in order: GEMM per dtype (matrix roof), the FMA-chain sweep (vector roof), the STREAM
kernels on DRAM-sized arrays (fresh output and donated), the working-set sweep with its
plateaus named against the OS's cache sizes, and the arithmetic-intensity sweep. Every value is
checked against the machine's ceiling (guard.py); roofs are taken only from unflagged values.
Writes peaks.json (schema.py), peaks.csv and roofline.png into out_dir, each atomically.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from tqdm import tqdm

from microbench import bandwidth, compute, guard, hardware, harness, intensity, plateaus, sysinfo
from microbench.schema import KIND_PEAKS, SCHEMA_VERSION, validate_result


@dataclass(frozen=True)
class Plan:
    """What to measure and how long to spend on each point."""

    gemm_square: tuple[int, ...]
    gemm_tall: tuple[tuple[int, int, int], ...]
    low_precision_square: tuple[int, ...]
    fma_K: tuple[int, ...]
    fma_k: tuple[int, ...]
    fma_n: int
    dram_array_bytes: int
    sweep_lo: int
    sweep_hi: int
    sweep_ratio: float
    intensity_points: tuple[tuple[int, int], ...]
    budget_s: float
    min_samples: int
    target_cv: float = 0.03
    min_sample_s: float = 2e-3


def make_plan(quick: bool, llc_bytes: int) -> Plan:
    """Default: minutes; quick: about a minute on 2 cores. DRAM arrays are >= 4x the LLC."""
    dram = max(4 * llc_bytes, 64 << 20)
    if quick:
        return Plan((1024, 2048), ((4096, 1024, 256),), (1024,), (16, 64), (1, 8), 1 << 17,
                    dram, 4 << 10, dram, 1.5, intensity.QUICK_POINTS, 0.3, 3)
    return Plan((512, 1024, 2048, 4096), ((8192, 2048, 256), (16384, 1024, 128)),
                (1024, 2048), (1, 4, 16, 64, 128), (1, 2, 4, 8), 1 << 17, dram, 4 << 10,
                max(16 * llc_bytes, 512 << 20), 1.25, intensity.POINTS, 1.0, 5)


def _time(plan: Plan, fn, *args, donate=()):
    return harness.time_fn(fn, *args, donate_argnums=donate, budget_s=plan.budget_s,
                           min_samples=plan.min_samples, target_cv=plan.target_cv,
                           min_sample_s=plan.min_sample_s)


def entry(name: str, timing: harness.Timing, flops: float, nbytes: float, **params) -> dict:
    """One measurement record (schema.py): counts, raw timing, rates, guard fields."""
    return {"name": name, **params, "flops": flops, "bytes": nbytes,
            "timing": timing.to_dict(),
            "flops_per_s": harness.rates(flops, timing) if flops else None,
            "bytes_per_s": harness.rates(nbytes, timing) if nbytes else None,
            "suspect": False, "reason": None}


def _bar(items, desc: str, progress: bool):
    return tqdm(items, desc=desc, disable=not progress, leave=False, unit="pt")


def measure_gemm(plan: Plan, env: dict, spec, progress: bool = True) -> list[dict]:
    dtypes = compute.gemm_dtypes(env)
    jobs = [("float32", (s, s, s)) for s in plan.gemm_square]
    jobs += [("float32", shape) for shape in plan.gemm_tall]
    for dtype in dtypes:
        if dtype != "float32":
            jobs += [(dtype, (s, s, s)) for s in plan.low_precision_square]
            jobs += [(dtype, shape) for shape in plan.gemm_tall[:1]]
    out = []
    for dtype, (m, k, n) in _bar(jobs, "GEMM", progress):
        fn, label = compute.gemm_fn(dtype)
        a, b = compute.gemm_inputs(m, k, n, dtype)
        t = _time(plan, fn, a, b)
        e = entry("gemm", t, compute.gemm_flops(m, k, n), compute.gemm_bytes(m, k, n, dtype),
                  dtype=dtype, shape=[m, k, n], ran=label, why_measured=dtypes[dtype],
                  shape_kind="square" if m == k == n else "tall-skinny")
        out.append(guard.flag_compute(e, spec))
    return out


def measure_vector(plan: Plan, spec, progress: bool = True) -> list[dict]:
    out, n = [], plan.fma_n
    jobs = [(K, k) for K in plan.fma_K for k in plan.fma_k]
    for K, k in _bar(jobs, "FMA chain", progress):
        x, a, b = compute.fma_inputs(n, k, "float32")
        t = _time(plan, compute.fma_chain_fn(K, k), x, a, b)
        e = entry("fma_chain", t, compute.fma_flops(n, K, k), compute.fma_bytes(n, k, "float32"),
                  dtype="float32", K=K, k=k, n=n)
        out.append(guard.flag_compute(e, spec))
    return out


def measure_bandwidth(plan: Plan, spec, env: dict, source: np.ndarray,
                      progress: bool = True) -> list[dict]:
    n, main = plan.dram_array_bytes // 4, main_memory_name(env)
    jobs = [(kern, donated) for kern in bandwidth.KERNELS.values()
            for donated in ((False, True) if kern.can_donate else (False,))]
    out = []
    for kern, donated in _bar(jobs, "STREAM @ DRAM", progress):
        args = bandwidth.kernel_args(kern, n, source=source)
        t = _time(plan, kern.fn, *args, donate=(0,) if donated else ())
        nbytes = bandwidth.kernel_bytes(kern, n, 4, donated)
        e = entry(kern.name, t, bandwidth.kernel_flops(kern, n), nbytes["algorithmic"],
                  dtype="float32", donated=donated, n=n, level=main,
                  working_set_bytes=4 * n * kern.n_arrays,
                  bytes_write_allocate=nbytes["write_allocate"],
                  bytes_per_s_write_allocate=harness.rates(nbytes["write_allocate"], t))
        out.append(guard.flag_memory(e, spec, main))
        del args
    return out


def measure_sweep(plan: Plan, spec, env: dict, source: np.ndarray,
                  progress: bool = True) -> dict:
    sizes = bandwidth.sweep_sizes(plan.sweep_lo, plan.sweep_hi, plan.sweep_ratio)
    points = []
    for ws in _bar(sizes, "working-set sweep", progress):
        n, R = ws // 4, bandwidth.sweep_repeats(ws)
        x = bandwidth.kernel_args(bandwidth.KERNELS["scale"], n, source=source)
        t = _time(plan, bandwidth.sweep_fn(R), *x, donate=(0,))
        points.append(entry("scale_inplace_sweep", t, float(n * R), bandwidth.sweep_bytes(n, 4, R),
                            dtype="float32", working_set_bytes=ws, repeats=R))
    caches = memory_levels(env, spec)
    memory_name = main_memory_name(env)
    found = plateaus.find_plateaus([p["working_set_bytes"] for p in points],
                                   [p["bytes_per_s"]["median"] for p in points], caches,
                                   memory_name)
    for p in points:
        level = next((q.name for q in found if q.lo_bytes <= p["working_set_bytes"] <= q.hi_bytes),
                     None)
        if level:
            guard.flag_memory(p, spec, level)
    return {"kernel": "in-place scale (donated), repeated R times per call by lax.fori_loop",
            "byte_convention": "algorithmic = actual (the destination is read first)",
            "cache_capacities": [list(c) for c in caches], "points": points,
            "plateaus": [vars(q) for q in found]}


def measure_intensity(plan: Plan, spec, source: np.ndarray, progress: bool = True) -> dict:
    n = plan.dram_array_bytes // 4
    points = []
    for K, k in _bar(plan.intensity_points, "intensity sweep", progress):
        x, a, b = compute.fma_inputs(k=k, n=1, dtype="float32")
        x = bandwidth.kernel_args(bandwidth.KERNELS["scale"], n, source=source)[0]
        t = _time(plan, intensity.kernel(K, k), x, a, b, donate=(0,))
        e = entry("fma_chain_inplace", t, intensity.flops(n, K, k), intensity.bytes_moved(n, k),
                  dtype="float32", K=K, k=k, n=n, flops_per_byte=intensity.intensity(K, k))
        points.append(guard.flag_compute(e, spec))
    return {"kernel": "FMA chain in place on a DRAM-sized donated buffer",
            "working_set_bytes": 4 * n, "points": points}


def main_memory_name(env: dict) -> str:
    return "DRAM" if env["backend"] == "cpu" else "HBM"


def memory_levels(env: dict, spec) -> list[tuple[str, int]]:
    """[(level, bytes)] small to large: on a CPU the OS's caches, aggregated over the cores
    this process may use; on an accelerator the spec entry's on-chip caches (the host's
    caches say nothing about the device)."""
    if env["backend"] == "cpu":
        return sysinfo.aggregate_cache_bytes(env.get("caches") or [], len(env["affinity"]))
    return sorted(((k, int(v)) for k, v in (spec.cache_bytes if spec else {}).items()),
                  key=lambda kv: kv[1])


def _best(entries: list[dict], rate: str) -> dict | None:
    ok = [e for e in entries if not e["suspect"] and e.get(rate)]
    return max(ok, key=lambda e: e[rate]["median"], default=None)


def _roof(name, kind, key, value_entry, rate, source, spec) -> dict:
    r = value_entry[rate]
    roof = {"name": name, "kind": kind, ("dtype" if kind == "compute" else "level"): key,
            "value": r["median"], "p10": r["p10"], "p90": r["p90"], "source": source}
    return guard.flag_roof(roof, spec)


SWEEP_AGREEMENT = 1.2  # the sweep's main-memory plateau may exceed STREAM by this factor


def derive_roofs(result: dict, spec) -> dict:
    """Best unflagged value per dtype (GEMM, vector) and per memory level (plateaus, STREAM)."""
    compute_roofs = []
    for dtype in dict.fromkeys(e["dtype"] for e in result["gemm"]):
        best = _best([e for e in result["gemm"] if e["dtype"] == dtype], "flops_per_s")
        if best:
            src = f"GEMM {'x'.join(map(str, best['shape']))} ({best['ran']})"
            compute_roofs.append(_roof(f"GEMM {dtype}", "compute", dtype, best, "flops_per_s",
                                       src, spec))
    best = _best(result["vector"], "flops_per_s")
    if best:
        compute_roofs.append(_roof("vector FMA float32", "compute", "float32", best,
                                   "flops_per_s", f"FMA chain K={best['K']} k={best['k']}", spec))
    memory_roofs = []
    for q in result["sweep"]["plateaus"]:
        memory_roofs.append({"name": q["name"], "kind": "memory", "level": q["name"],
                             "value": q["bytes_per_s"], "p10": q["p10"], "p90": q["p90"],
                             "source": f"sweep plateau {q['lo_bytes']:.0f}-{q['hi_bytes']:.0f} B"})
    stream = _best(result["bandwidth"], "bytes_per_s")
    main = main_memory_name(result["environment"])
    sweep_main = next((r for r in memory_roofs if r["level"] == main), None)
    if stream:
        # Main memory's roof is the best STREAM kernel on arrays >= 4x the last-level cache.
        # The sweep's last plateau is kept only if it agrees: on this project's VM it read
        # 55-83 GB/s at >= 273 MiB, above every peer program (a 2-thread C in-place scale:
        # 47-65 GB/s), so there it is flagged as a measurement to explain, not a roof.
        memory_roofs = [r for r in memory_roofs if r["level"] != main]
        kind = "donated" if stream["donated"] else "fresh output"
        memory_roofs.append(_roof(main, "memory", main, stream, "bytes_per_s",
                                  f"STREAM {stream['name']} ({kind}), algorithmic bytes", spec))
        if sweep_main and sweep_main["value"] > SWEEP_AGREEMENT * memory_roofs[-1]["value"]:
            memory_roofs.append({**sweep_main, "name": f"{main} sweep plateau",
                                 "level": f"{main} sweep", "suspect": True,
                                 "reason": f"sweep plateau {sweep_main['value'] / 1e9:.1f} GB/s "
                                           f"exceeds the best STREAM kernel by more than "
                                           f"{SWEEP_AGREEMENT - 1:.0%}: not a roof"})
    # Inference streams weights and caches: a read-only roof is the one its phases can reach
    # (on this VM reads alone peak well below reads + writes together).
    read = _best([e for e in result["bandwidth"] if e["name"] == "read"], "bytes_per_s")
    if read:
        memory_roofs.append(_roof(f"{main} read-only", "memory", f"{main} read", read,
                                  "bytes_per_s", "STREAM read (a sum), algorithmic bytes", spec))
    return {"compute": compute_roofs,
            "memory": [r if r.get("suspect") else guard.flag_roof(r, spec) for r in memory_roofs]}


def machine_label(env: dict) -> str:
    if env["backend"] == "cpu":
        return f"cpu: {env.get('cpu_model') or 'unknown'}, {len(env['affinity'])} cores"
    return f"{env['backend']}: {env['device_kind']}"


def _source_array(plan: Plan) -> np.ndarray:
    """One random-normal float32 buffer big enough for every DRAM-sized argument."""
    size = max(3 * plan.dram_array_bytes, plan.sweep_hi) // 4
    return np.random.default_rng(0).standard_normal(size, dtype=np.float32)


def measure(quick: bool, progress: bool = True) -> dict:
    """Run every measurement and return the validated result object (writes nothing)."""
    t0 = time.perf_counter()
    env = harness.environment()
    spec = hardware.device_for_environment(env)
    llc = max((size for _, size in memory_levels(env, spec)), default=64 << 20)
    plan = make_plan(quick, llc)
    source = _source_array(plan)
    result = {"schema_version": SCHEMA_VERSION, "kind": KIND_PEAKS, "machine": machine_label(env),
              "quick": quick, "environment": env, "spec": spec.to_dict() if spec else None,
              "plan": vars(plan)}
    result["gemm"] = measure_gemm(plan, env, spec, progress)
    result["vector"] = measure_vector(plan, spec, progress)
    result["bandwidth"] = measure_bandwidth(plan, spec, env, source, progress)
    result["sweep"] = measure_sweep(plan, spec, env, source, progress)
    result["intensity"] = measure_intensity(plan, spec, source, progress)
    result["roofs"] = derive_roofs(result, spec)
    result["wall_s"] = time.perf_counter() - t0
    return validate_result(result)


def csv_rows(result: dict) -> list[dict]:
    """One flat row per measurement, for spreadsheets."""
    rows = []
    sections = [("gemm", result["gemm"]), ("vector", result["vector"]),
                ("bandwidth", result["bandwidth"]), ("sweep", result["sweep"]["points"]),
                ("intensity", result["intensity"]["points"])]
    for section, entries in sections:
        for e in entries:
            st = e["timing"]
            rows.append({"section": section, "name": e["name"], "dtype": e.get("dtype"),
                         "shape": "x".join(map(str, e.get("shape", []))) or None,
                         "K": e.get("K"), "k": e.get("k"), "donated": e.get("donated"),
                         "working_set_bytes": e.get("working_set_bytes"),
                         "flops": e["flops"], "bytes": e["bytes"], "median_s": st["median"],
                         "p10_s": st["p10"], "p90_s": st["p90"], "cv": st["cv"],
                         "n_samples": st["n"],
                         "flops_per_s": (e["flops_per_s"] or {}).get("median"),
                         "bytes_per_s": (e["bytes_per_s"] or {}).get("median"),
                         "suspect": e["suspect"], "reason": e["reason"]})
    return rows


def measure_peaks(quick: bool, out_dir, progress: bool = True, compare: bool = False) -> dict:
    """Measure, optionally run the peer programs, and write peaks.json/.csv/roofline.png."""
    result = measure(quick, progress)
    if compare:
        from microbench import peers

        result["compare"] = peers.compare(result, progress)
    out = Path(out_dir)
    harness.write_json_atomic(out / "peaks.json", validate_result(result))
    harness.write_csv_atomic(out / "peaks.csv", csv_rows(result))
    from microbench import plot

    plot.save(plot.roofline_figure([result]), out / "roofline.png")
    return result


def quick_roofs(n_gemm: int = 512, array_bytes: int | None = None, budget_s: float = 0.1,
                min_samples: int = 3) -> dict:
    """A peaks-like {machine, roofs, sweep} in a second or two, for notebooks: one float32
    GEMM (the matrix roof), and a read and an in-place scale over an array larger than the
    last-level cache (main memory's read-only and read+write roofs). Guard rails applied."""
    env = harness.environment()
    spec = hardware.device_for_environment(env)
    main = main_memory_name(env)
    if array_bytes is None:
        llc = max((size for _, size in memory_levels(env, spec)), default=32 << 20)
        array_bytes = max(2 * llc, 32 << 20)
    plan = make_plan(True, array_bytes)
    plan = Plan(**{**vars(plan), "budget_s": budget_s, "min_samples": min_samples})
    fn, label = compute.gemm_fn("float32")
    t = _time(plan, fn, *compute.gemm_inputs(n_gemm, n_gemm, n_gemm, "float32"))
    gemm = entry("gemm", t, compute.gemm_flops(n_gemm, n_gemm, n_gemm), 0.0)
    roofs = {"compute": [_roof("GEMM float32", "compute", "float32", gemm, "flops_per_s",
                               f"GEMM {n_gemm}^3 ({label})", spec)], "memory": []}
    n = array_bytes // 4
    for kern, level, donate in (("read", f"{main} read", ()), ("scale", main, (0,))):
        k = bandwidth.KERNELS[kern]
        t = _time(plan, k.fn, *bandwidth.kernel_args(k, n), donate=donate)
        nbytes = bandwidth.kernel_bytes(k, n, 4, bool(donate))["algorithmic"]
        name = f"{main} read-only" if kern == "read" else main
        roofs["memory"].append(_roof(name, "memory", level, entry(kern, t, 0.0, nbytes),
                                     "bytes_per_s", f"{kern}, {array_bytes >> 20} MiB", spec))
    return {"machine": machine_label(env), "roofs": roofs, "environment": env,
            "sweep": {"cache_capacities": []}}
