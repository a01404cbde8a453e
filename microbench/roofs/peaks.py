"""Measure this machine's roofs and write them: `measure_peaks(quick, out_dir)`.

Runs, in order: GEMM per dtype (matrix roof), the FMA-chain sweep (vector roof), the STREAM
kernels on main-memory arrays (fresh output and donated), the memory hierarchy at a fixed
thread count (microbench.roofs.hierarchy, a native read), XLA's own working-set sweep, and the
arithmetic-intensity sweep; interleaved with them, rounds of the main roofs beside peer
programs (microbench.roofs.rounds: at the start, in the middle and at the end, so drift shows).

The roofs are the hardware's: each main roof is the best program of the rounds (ours or a
peer), labelled with that program; what XLA reaches is kept as `roofs.compiler`. Cache levels
come from the native sweep and are checked monotone. Every value is checked against the
machine's theoretical ceiling (guard.py), every point against the roof it sits under
(roofline.above), and roofs are taken only from unflagged values. Main-memory arrays are
max(1 GiB, 16 x the last-level cache), bounded by the memory available.
Writes peaks.json (schema.py), peaks.csv and roofline.png into out_dir, each atomically.
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass

import numpy as np
from tqdm import tqdm

from microbench import hardware, harness, roofline, sysinfo
from microbench.roofs import (
    bandwidth,
    compute,
    guard,
    hierarchy,
    intensity,
    overhead,
    plateaus,
    probe,
    rounds,
)
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
    rounds: int = 3
    probe_bytes: int = 128 << 20


def main_array_bytes(llc_bytes: int, available: float | None = None) -> int:
    """max(1 GiB, 16 x LLC), at most a twelfth of the available memory (a triad holds three
    arrays, plus their copies and the peers' own), and never below 4x the LLC."""
    want = max(1 << 30, 16 * llc_bytes)
    if available:
        want = min(want, int(available) // 12)
    return max(want, 4 * llc_bytes, 64 << 20) // 4096 * 4096


def make_plan(quick: bool, llc_bytes: int, available: float | None = None) -> Plan:
    """Default: minutes; quick: about a minute and a half on 2 cores."""
    main = main_array_bytes(llc_bytes, available)
    n_probe = probe.probe_elements(llc_bytes, main // 4)
    if quick:
        return Plan((1024, 2048), ((4096, 1024, 256),), (1024,), (16, 64), (1, 8), 1 << 17,
                    main, 4 << 10, main, 1.6, intensity.QUICK_POINTS, 0.3, 3, rounds=2,
                    probe_bytes=4 * n_probe)
    return Plan((512, 1024, 2048, 4096), ((8192, 2048, 256), (16384, 1024, 128)),
                (1024, 2048), (1, 4, 16, 64, 128), (1, 2, 4, 8), 1 << 17, main, 4 << 10,
                main, 1.4, intensity.POINTS, 0.6, 5, rounds=3, probe_bytes=4 * n_probe)


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
    n, main = plan.dram_array_bytes // 4, roofline.main_memory_name(env)
    # Donated (in place) for every kernel that writes; fresh output only for scale, to show
    # what page faults on new output cost (on a VM a slow path: seconds per GiB).
    jobs = [(kern, donated) for kern in bandwidth.KERNELS.values()
            for donated in (((False, True) if kern.name == "scale" else (True,))
                            if kern.can_donate else (False,))]
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
    found = plateaus.find_plateaus([p["working_set_bytes"] for p in points],
                                   [p["bytes_per_s"]["median"] for p in points], caches,
                                   roofline.main_memory_name(env))
    for p in points:
        level = next((q.name for q in found if q.lo_bytes <= p["working_set_bytes"] <= q.hi_bytes),
                     None)
        if level:
            guard.flag_memory(p, spec, level)
    return {"kernel": "in-place scale (donated), repeated R times per call by lax.fori_loop",
            "byte_convention": "algorithmic = actual (the destination is read first)",
            "cache_capacities": [list(c) for c in caches], "points": points,
            "plateaus": [vars(q) for q in found]}


COMPUTE_SIDE_FLOP_PER_BYTE = 8.0  # above this the AI sweep is compute-bound on any CPU here


def measure_intensity(plan: Plan, spec, source: np.ndarray, progress: bool = True) -> dict:
    """The FMA chain in place at rising intensity: on the main-memory array while the point
    can be memory-bound, on an eighth of it beyond COMPUTE_SIDE_FLOP_PER_BYTE (where a call
    over GiBs would take seconds and residency cannot matter: time is compute)."""
    points = []
    for K, k in _bar(plan.intensity_points, "intensity sweep", progress):
        n = plan.dram_array_bytes // 4
        if intensity.intensity(K, k) > COMPUTE_SIDE_FLOP_PER_BYTE:
            n //= 8
        _, a, b = compute.fma_inputs(k=k, n=1, dtype="float32")
        x = bandwidth.kernel_args(bandwidth.KERNELS["scale"], n, source=source)[0]
        t = _time(plan, intensity.kernel(K, k), x, a, b, donate=(0,))
        e = entry("fma_chain_inplace", t, intensity.flops(n, K, k), intensity.bytes_moved(n, k),
                  dtype="float32", K=K, k=k, n=n, flops_per_byte=intensity.intensity(K, k),
                  working_set_bytes=4 * n)
        points.append(guard.flag_compute(e, spec))
        del x
    return {"kernel": "FMA chain in place on a donated buffer (main-memory sized while the "
                      "point can be memory-bound)",
            "working_set_bytes": plan.dram_array_bytes, "points": points}


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


def _compute(dtype: str) -> dict:
    """What places a compute roof: its kind and dtype."""
    return {"kind": "compute", "dtype": dtype}


def _memory(memory: str, access: str, main: bool = True) -> dict:
    """What places a memory roof: its kind and level (roofline.level_fields)."""
    return {"kind": "memory", **roofline.level_fields(memory, access, main)}


def _roof(name, key: dict, value_entry, rate, source, spec) -> dict:
    r = value_entry[rate]
    roof = {"name": name, **key, "value": r["median"], "p10": r["p10"], "p90": r["p90"],
            "source": source}
    return guard.flag_roof(roof, spec)


def _main_roof(name: str, key: dict, block: dict, spec) -> dict:
    """A roof from a rounds.derive block: the best program's median over the rounds."""
    n = len(block["round_values"])
    roof = {"name": name, **key, "value": block["value"], "p10": block["p10"], "p90": block["p90"],
            "source": f"{block['program']}, median of {n} interleaved round"
                      f"{'s' if n > 1 else ''}",
            "program": block["program"], "ours_is_roof": block["ours_is_roof"],
            "spread": block["spread"], "unstable": block["unstable"],
            "ratio_roof_over_best_peer": block["ratio_roof_over_best_peer"],
            "ratio_ours_over_best_peer": block["ratio_ours_over_best_peer"]}
    return guard.flag_roof(roof, spec)


def _compiler_roofs(result: dict, main: str) -> list[dict]:
    """What XLA itself reaches, kept beside the hardware's roofs (never drawn as a roof)."""
    out = []
    mr = result.get("main_roofs", {})
    for metric, name, key in (("gemm_float32", "GEMM float32 (XLA)", _compute("float32")),
                              ("main_read", f"{main} read-only (XLA jnp.sum)",
                               _memory(main, roofline.READ)),
                              ("main_rw", f"{main} (XLA in-place scale)",
                               _memory(main, roofline.READ_WRITE))):
        ours = (mr.get(metric) or {}).get("ours")
        if ours:
            out.append({"name": name, **key, "value": ours["median"], "p10": ours["min"],
                        "p90": ours["max"], "source": ours["program"], "suspect": False,
                        "reason": None})
    for q in result["sweep"]["plateaus"]:
        if q["name"] != main:
            out.append({"name": f"{q['name']} (XLA sweep)",
                        **_memory(q["name"], roofline.READ_WRITE, main=False),
                        "value": q["bytes_per_s"], "p10": q["p10"],
                        "p90": q["p90"], "source": "XLA in-place scale sweep plateau "
                        f"{q['lo_bytes']:.0f}-{q['hi_bytes']:.0f} B", "suspect": False,
                        "reason": None})
    return out


def _cache_roofs(result: dict, main: str, spec) -> list[dict]:
    """Cache levels from the native all-core sweep (else XLA's sweep), hierarchy-checked."""
    hier = result.get("hierarchy")
    if hier:  # the native read kernel
        found, program = hier["all_cores"]["plateaus"], hier["all_cores"]["program"]
        access = roofline.READ
    else:  # XLA's in-place scale
        found, program = result["sweep"]["plateaus"], "XLA in-place scale sweep (no C peer)"
        access = roofline.READ_WRITE
    bad = {c["larger"]: c["reason"] for c in (hier or {}).get("checks", []) if not c["ok"]}
    out = []
    for q in found:
        if q["name"] == main:
            continue
        roof = guard.flag_roof({"name": q["name"], **_memory(q["name"], access, main=False),
                                "value": q["bytes_per_s"], "p10": q["p10"], "p90": q["p90"],
                                "source": f"{program}, plateau {q['lo_bytes'] / 1024:.0f}-"
                                          f"{q['hi_bytes'] / 1024:.0f} KiB",
                                "program": program}, spec)
        if q["name"] in bad:
            roof["suspect"], roof["reason"] = True, bad[q["name"]]
        out.append(roof)
    return out


def _flag_the_untrusted(check: dict, read: dict, memory_roofs: list[dict], result: dict
                        ) -> None:
    """Main memory's read-only roof above the last cache level's plateau: one of the two is
    not what it claims. A read roof taken in the rounds over an array of at least 16x the
    last-level cache cannot have been served by that cache (a smaller array, partly
    cache-resident, can read far above main memory), so the plateau is the untrusted one: a
    "cache" slower than main memory at these sizes is not a cache this machine gives these
    threads (a VM's L3 shared with other guests, or a size it misreports). Otherwise the read
    roof is the suspect. The check records which one was flagged."""
    llc = roofline.last_level_bytes(result["hierarchy"]["all_cores"]["cache_capacities"])
    array = (result.get("plan") or {}).get("dram_array_bytes") or 0
    cache = next((r for r in memory_roofs if r["name"] == check["smaller"]), None)
    if cache is not None and llc and array >= 16 * llc and (result.get("main_roofs") or {}
                                                            ).get("main_read"):
        check["reason"] = (
            f"{check['smaller']} ({cache['value'] / 1e9:.1f} GB/s) reads slower than main "
            f"memory ({read['value'] / 1e9:.1f} GB/s read-only, measured in the rounds over "
            f"{array / 2**30:.2f} GiB, {array / llc:.0f}x the last-level cache, so not served "
            f"by it): this plateau is not a cache level these threads get at these sizes "
            f"(likely a VM's last-level cache shared with other guests, or its size "
            f"misreported); flagged, not drawn as a roof")
        check["flagged"] = check["smaller"]
        cache["suspect"], cache["reason"] = True, check["reason"]
        return
    check["flagged"] = read["name"]
    read["suspect"], read["reason"] = True, check["reason"]


def derive_roofs(result: dict, spec) -> dict:
    """The hardware's roofs: main roofs from the rounds (best program), cache levels from the
    fixed-thread-count sweep, other dtypes and the vector unit from their own sections."""
    main = roofline.main_memory_name(result["environment"])
    mr = result.get("main_roofs") or {}
    compute_roofs = []
    if "gemm_float32" in mr:
        compute_roofs.append(_main_roof("GEMM float32", _compute("float32"), mr["gemm_float32"],
                                        spec))
    for dtype in dict.fromkeys(e["dtype"] for e in result["gemm"]):
        if dtype == "float32" and "gemm_float32" in mr:
            continue
        best = _best([e for e in result["gemm"] if e["dtype"] == dtype], "flops_per_s")
        if best:
            src = f"GEMM {'x'.join(map(str, best['shape']))} ({best['ran']})"
            compute_roofs.append(_roof(f"GEMM {dtype}", _compute(dtype), best, "flops_per_s",
                                       src, spec))
    # The vector roof: the best FMA chain, from the (K, k) sweep or the in-place AI sweep
    # (both are the same kernel; the AI sweep's high-intensity end often finds more ILP).
    chains = result["vector"] + [p for p in result["intensity"]["points"]
                                 if p["flops_per_byte"] >= 8]
    best = _best(chains, "flops_per_s")
    if best:
        compute_roofs.append(_roof("vector FMA float32", _compute("float32"), best,
                                   "flops_per_s", f"FMA chain ({best['name']}) K={best['K']} "
                                   f"k={best['k']}", spec))
    memory_roofs = _cache_roofs(result, main, spec)
    for metric, name, access in (("main_rw", main, roofline.READ_WRITE),
                                 ("main_read", f"{main} read-only", roofline.READ)):
        if metric in mr:
            memory_roofs.append(_main_roof(name, _memory(main, access), mr[metric], spec))
    if not mr:  # results without rounds (synthetic data): the best STREAM kernel
        stream = _best(result["bandwidth"], "bytes_per_s")
        if stream:
            memory_roofs.append(_roof(main, _memory(main, roofline.READ_WRITE), stream,
                                      "bytes_per_s", f"STREAM {stream['name']}, algorithmic "
                                      "bytes", spec))
    read = roofline.main_roof(memory_roofs, roofline.READ, include_suspect=True)
    hier = result.get("hierarchy")
    if hier and read:  # the last step of the ladder: the last cache level vs main memory
        hier["checks"] = hierarchy.check_monotone(hier["all_cores"]["plateaus"], read)
        for c in hier["checks"]:
            if not c["ok"] and c["larger"] == read["name"]:
                _flag_the_untrusted(c, read, memory_roofs, result)
    return {"compute": compute_roofs, "memory": memory_roofs,
            "compiler": _compiler_roofs(result, main),
            "ridges": roofline.ridges(compute_roofs, memory_roofs)}


def flag_points(result: dict) -> None:
    """Flag every measured point above the roof it runs under by more than that roof's spread:
    AI-sweep points against min(vector roof, I x main memory), sweep points in main memory
    against the main read+write roof. Suspect points are never roofs."""
    roofs = result["roofs"]
    rw = roofline.main_roof(roofs["memory"], roofline.READ_WRITE, include_suspect=True)
    vec = next((r for r in roofs["compute"] if r["name"].startswith("vector")), None)
    for p in result["intensity"]["points"]:
        if p["suspect"] or rw is None:
            continue
        mem_bound = {**rw, "value": rw["value"] * p["flops_per_byte"],
                     "p10": rw["p10"] * p["flops_per_byte"], "p90": rw["p90"] * p["flops_per_byte"]}
        bound = min((b for b in (mem_bound, vec) if b), key=lambda b: b["value"])
        if roofline.above(p["flops_per_s"]["median"], bound):
            p["suspect"], p["reason"] = True, (
                f"{p['flops_per_s']['median'] / 1e9:.1f} GFLOP/s at {p['flops_per_byte']:.3g} "
                f"FLOP/B is above its roof {bound['value'] / 1e9:.1f} (min of the vector roof "
                f"and I x {rw['name']}) beyond the roof's spread: part of the buffer stayed in "
                f"cache, or the byte count is wrong")
    llc = roofline.last_level_bytes(result["sweep"].get("cache_capacities")) or None
    for p in result["sweep"]["points"]:
        if p["suspect"] or rw is None or llc is None or p["working_set_bytes"] < 4 * llc:
            continue
        if roofline.above(p["bytes_per_s"]["median"], rw):
            p["suspect"], p["reason"] = True, (
                f"{p['bytes_per_s']['median'] / 1e9:.1f} GB/s at "
                f"{p['working_set_bytes'] / 2**20:.0f} MiB (>= 4x the last-level cache) is "
                f"above the {rw['name']} roof {rw['value'] / 1e9:.1f} GB/s "
                f"({rw.get('program', rw['source'])}) "
                f"beyond its spread: not a main-memory figure")


def machine_label(env: dict) -> str:
    if env["backend"] == "cpu":
        return f"cpu: {env.get('cpu_model') or 'unknown'}, {len(env['affinity'])} cores"
    return f"{env['backend']}: {env['device_kind']}"


def _source_array(plan: Plan) -> np.ndarray:
    """One random-normal float32 buffer big enough for every main-memory-sized argument
    (a triad's three arrays), tiled from 4 MiB of random values so GiBs take a second."""
    return probe.host_array(max(3 * plan.dram_array_bytes, plan.sweep_hi) // 4)


def _best_square(gemm: list[dict]) -> list[int]:
    ok = [e for e in gemm if e["dtype"] == "float32" and not e["suspect"]
          and e["shape_kind"] == "square"]
    return max(ok, key=lambda e: e["flops_per_s"]["median"])["shape"]


def measure(quick: bool, progress: bool = True, n_rounds: int | None = None) -> dict:
    """Run every measurement and return the validated result object (writes nothing)."""
    t0 = time.perf_counter()
    env = harness.environment()
    spec = hardware.device_for_environment(env)
    llc = max((size for _, size in memory_levels(env, spec)), default=64 << 20)
    plan = make_plan(quick, llc, sysinfo.mem_available_bytes())
    if n_rounds:
        plan = Plan(**{**vars(plan), "rounds": n_rounds})
    source = _source_array(plan)
    result = {"schema_version": SCHEMA_VERSION, "kind": KIND_PEAKS, "machine": machine_label(env),
              "quick": quick, "environment": env, "spec": spec.to_dict() if spec else None,
              "plan": vars(plan)}
    threads = len(env["affinity"])
    result["gemm"] = measure_gemm(plan, env, spec, progress)
    result["overhead"] = overhead.measure()
    ours = rounds.Ours(_best_square(result["gemm"]), plan.dram_array_bytes // 4,
                       plan.probe_bytes // 4, source)
    peers = rounds.Peers(ours.gemm_shape, ours.n_main, threads)
    done = []

    def a_round():
        if progress:
            print(f"round {len(done) + 1}/{plan.rounds}: XLA, numpy and C on the main roofs",
                  file=sys.stderr)
        done.append(rounds.measure_round(len(done), ours, peers))

    a_round()
    result["vector"] = measure_vector(plan, spec, progress)
    result["bandwidth"] = measure_bandwidth(plan, spec, env, source, progress)
    if plan.rounds > 2:
        a_round()
    main = roofline.main_memory_name(env)
    if env["backend"] == "cpu":
        result["hierarchy"] = hierarchy.measure(env, main, plan.dram_array_bytes, quick)
    result["sweep"] = measure_sweep(plan, spec, env, source, progress)
    result["intensity"] = measure_intensity(plan, spec, source, progress)
    while len(done) < plan.rounds:
        a_round()
    peers.close()
    result["rounds"] = done
    result["main_roofs"] = rounds.derive(done)
    result["drift"] = {m: rounds.drift(done, m) for m in rounds.METRICS}
    result["roofs"] = derive_roofs(result, spec)
    flag_points(result)
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


def measure_peaks(quick: bool, out_dir, progress: bool = True, rounds_: int | None = None
                  ) -> dict:
    """Measure (with `rounds_` interleaved rounds, default the plan's) and write
    peaks.json, peaks.csv, roofline.png and hierarchy.png as one set (files.output_set: the
    output folder is checked before anything is measured, and an interrupted run leaves the
    previous set)."""
    from microbench import plots
    from microbench.files import output_set

    with output_set(out_dir) as out:
        result = measure(quick, progress, rounds_)
        harness.write_json_atomic(out / "peaks.json", validate_result(result))
        harness.write_csv_atomic(out / "peaks.csv", csv_rows(result))
        plots.save(plots.roofline_figure([result]), out / "roofline.png")
        plots.save(plots.hierarchy_figure([result]), out / "hierarchy.png")
    return result


def quick_roofs(n_gemm: int = 1024, array_bytes: int | None = None, budget_s: float = 0.1,
                min_samples: int = 3) -> dict:
    """A peaks-like {machine, roofs, main_roofs, environment, sweep} in a few seconds, for
    notebooks: one round of the main roofs (microbench.roofs.rounds) -- XLA's f32 GEMM, read and
    in-place scale beside numpy and the native C read/scale/triad -- on a main-memory array
    (max(1 GiB, 16 x LLC); a smaller `array_bytes` is raised to at least 8 x LLC, so at most
    an eighth of it can sit in the cache). Each roof is the best program, labelled with its
    name; guard rails applied."""
    env = harness.environment()
    spec = hardware.device_for_environment(env)
    main = roofline.main_memory_name(env)
    llc = max((size for _, size in memory_levels(env, spec)), default=32 << 20)
    if array_bytes is None:
        array_bytes = main_array_bytes(llc, sysinfo.mem_available_bytes())
    array_bytes = max(int(array_bytes), 8 * llc) // 4096 * 4096
    n = array_bytes // 4
    ours = rounds.Ours((n_gemm, n_gemm, n_gemm), n, probe.probe_elements(llc, n),
                       budget_s=budget_s)
    peers = rounds.Peers(ours.gemm_shape, n, len(env["affinity"]))
    one = [rounds.measure_round(0, ours, peers)]
    peers.close()
    del ours
    mr = rounds.derive(one)
    roofs = {"compute": [_main_roof("GEMM float32", _compute("float32"), mr["gemm_float32"],
                                    spec)],
             "memory": [_main_roof(main, _memory(main, roofline.READ_WRITE), mr["main_rw"],
                                   spec),
                        _main_roof(f"{main} read-only", _memory(main, roofline.READ),
                                   mr["main_read"], spec)]}
    roofs["ridges"] = roofline.ridges(roofs["compute"], roofs["memory"])
    return {"machine": machine_label(env), "roofs": roofs, "main_roofs": mr,
            "environment": env, "sweep": {"cache_capacities": []}}
