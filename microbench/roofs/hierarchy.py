"""The memory hierarchy at a fixed thread count: read bandwidth per level, checked monotone.

Regime: the native read kernel (microbench.roofs.native `sweep`) over a geometric ladder of working
sets, once with every allowed core (each thread re-reading its own slice, pinned) and once
with one core. XLA:CPU splits only large elementwise ops across cores, so a JAX sweep mixes
one-core and all-core regimes (it measured L3 above L2 on these machines); here the thread
count is fixed per series. Plateaus are found by microbench.roofs.plateaus and named after the cache
sizes the OS reports (aggregated over the cores of the series); then L1 >= L2 >= L3 >= main
memory is checked, and a level faster than a smaller one is flagged with its likely cause and
never used as a roof. The all-core series is also the working-set curve the phase predictions
interpolate (microbench.roofline.curve_bandwidth).
"""

from __future__ import annotations

from microbench import harness, roofline, sysinfo
from microbench.roofs import native, plateaus

RATIO = 1.41  # geometric step of the ladder (about two points per doubling)
MIN_BYTES = 128 << 20  # bytes moved per timed call, so small slices are timed well


def _points(raw: list[dict]) -> list[dict]:
    out = []
    for p in raw:
        amount = float(p["bytes"]) * p["repeats"]
        t = harness.summarize(p["seconds"])
        out.append({"working_set_bytes": p["bytes"], "repeats": p["repeats"],
                    "seconds": p["seconds"], "bytes_per_s": harness.rates(amount, t)})
    return out


def _series(lo: int, hi: int, threads: int, caches_env: list[dict], main: str,
            quick: bool) -> dict:
    raw = native.sweep(lo, hi, RATIO * (1.2 if quick else 1.0), MIN_BYTES // (2 if quick else 1),
                       threads)
    points = _points(raw)
    capacities = sysinfo.aggregate_cache_bytes(caches_env, threads)
    found = plateaus.find_plateaus([p["working_set_bytes"] for p in points],
                                   [p["bytes_per_s"]["median"] for p in points], capacities,
                                   main)
    return {"program": f"C read ({native.label(threads)})", "threads": threads,
            "cache_capacities": [list(c) for c in capacities], "points": points,
            "plateaus": [vars(q) for q in found]}


def check_monotone(plateau_list: list[dict], main_read: dict | None = None) -> list[dict]:
    """Each level's bandwidth must not exceed the smaller level's (beyond both spreads).

    Returns one record per adjacent pair: {smaller, larger, ok, reason}. `main_read` (a roof
    {name, level, value, p10, p90}) is appended as the last level when given, in place of
    the plateau of its level."""
    levels = [{"name": q["name"], "value": q["bytes_per_s"], "p10": q["p10"], "p90": q["p90"]}
              for q in plateau_list]
    if main_read is not None:
        main = roofline.levels(main_read)["memory"]
        levels = [lv for lv in levels if lv["name"] != main]
        levels.append({"name": main_read["name"], "value": main_read["value"],
                       "p10": main_read["p10"], "p90": main_read["p90"]})
    out = []
    for small, big in zip(levels, levels[1:], strict=False):
        ok = big["p10"] <= small["p90"] or big["value"] <= small["value"]
        reason = None if ok else (
            f"{big['name']} ({big['value'] / 1e9:.1f} GB/s) reads faster than the smaller "
            f"{small['name']} ({small['value'] / 1e9:.1f} GB/s): physically impossible at a "
            f"fixed thread count; likely causes: threads not pinned to their slices, the "
            f"machine's load changing during the sweep, or cache sizes misreported by the VM")
        out.append({"smaller": small["name"], "larger": big["name"], "ok": bool(ok),
                    "reason": reason})
    return out


def measure(env: dict, main: str, hi_bytes: int, quick: bool = False) -> dict | None:
    """Both series and the monotonicity check of the all-core one (None without gcc)."""
    if not native.available():
        return None
    caches_env = env.get("caches") or []
    threads = len(env["affinity"])
    lo = 4 << 10
    all_cores = _series(lo, hi_bytes, threads, caches_env, main, quick)
    llc_one = max((c["size_bytes"] for c in caches_env), default=32 << 20)
    one_core = _series(lo, min(hi_bytes, 8 * llc_one), 1, caches_env, main, quick)
    return {"kernel": "read: a sum with 8 independent vector accumulators, each thread "
                      "re-reading its own slice (native.sweep)",
            "byte_convention": "algorithmic: 4 bytes per element read",
            "all_cores": all_cores, "single_core": one_core,
            "checks": check_monotone(all_cores["plateaus"])}


def curve(hierarchy: dict) -> list[list[float]]:
    """[[bytes, bytes/s], ...] of the all-core series: the working-set curve."""
    pts = hierarchy["all_cores"]["points"]
    return [[float(p["working_set_bytes"]), float(p["bytes_per_s"]["median"])] for p in pts]


def level_values(hierarchy: dict) -> dict[str, float]:
    return {q["name"]: q["bytes_per_s"] for q in hierarchy["all_cores"]["plateaus"]}



