"""Roofline arithmetic on saved results, without JAX: the roofs, which level is main memory,
the level that holds a working set, ridge points and the predicted time of a phase.

Every measurement, prediction, table and figure takes these from here, so a roof is chosen, a
level named, a ridge point computed and a roofline time predicted in one place (Williams,
Waterman & Patterson, "Roofline", CACM 2009; the measured bandwidth-vs-working-set curve is
interpolated, so a predicted time has no cliff between cache levels).

A memory roof names its level in structured fields (written by microbench.roofs.peaks):

    level   the roof's key, what a prediction's `memory_level` refers to: "L2", "DRAM"
            (main memory, read+write) or "DRAM read" (main memory, read-only)
    memory  the level itself: "L1", "L2", "L3", "Infinity Cache", "DRAM", "HBM", ...
    access  "read" | "read+write": what the program that reached the roof does to each byte
    main    True for main memory (DRAM behind a CPU, HBM behind an accelerator)

Files written before these fields existed carry only `level`; `levels(roof)` derives them from
it (the one place a level string is read) and `upgrade_roofs` stores them (schema.upgrade).

Public API:
  levels      main_memory_name(env) -> "DRAM" | "HBM";   is_main_memory(name) -> bool
              level_fields(memory, access, main) -> {level, memory, access, main}
              levels(roof) -> {memory, access, main};   is_main(roof) -> bool
              upgrade_roofs(roofs) -> roofs (fields stored where absent)
  roofs       unflagged(roofs) -> list;   main_roofs(memory, access=None) -> list
              main_roof(memory, access) -> roof | None;   gemm_roofs(compute, dtype) -> list
              compute_roof(roofs, dtype) -> roof;   spec_roofs(device, dtype) -> (compute, memory)
  working set last_level_bytes(capacities);   holding_roof(memory, capacities, working_set)
              curve_bandwidth(curve, working_set) -> bytes/s (log-log, no cliffs)
              working_set_curve(series, main_read) -> [[bytes, bytes/s], ...]
              bandwidth_at(inputs, working_set, drift=1.0) -> roof-like {name, level, value}
  ridges      ridge(compute, memory) -> {flops_per_byte, compute, memory, label}
              ridges(compute, memory) -> [ridge];   phase_ridge(roofs, dtype, level=None)
  prediction  predict(flops, nbytes, compute, memory, floor_s=0.0) -> {time_s, bound, ...}
              BAND: measured / predicted within it is "on its prediction"
              spread(entry);   above(value, roof, extra=0.0);   drift_cap(factor, roof)
"""

from __future__ import annotations

import math
from collections.abc import Sequence

# ------------------------------------------------------------------ levels

DRAM, HBM = "DRAM", "HBM"
MAIN_MEMORIES = (DRAM, HBM)  # every name main memory goes by in a result
READ, READ_WRITE = "read", "read+write"
ACCESSES = (READ, READ_WRITE)
_READ_SUFFIX = " " + READ  # an older file's read-only main roof: level "DRAM read"


def main_memory_name(env: dict) -> str:
    """The off-chip level's name: DRAM behind a CPU, HBM behind an accelerator."""
    return DRAM if env.get("backend") == "cpu" else HBM


def is_main_memory(name: str) -> bool:
    """True when a level's name (a plateau's, a measurement's) is main memory's."""
    return name in MAIN_MEMORIES


def level_fields(memory: str, access: str, main: bool) -> dict:
    """The fields that place a memory roof: its key `level` ("DRAM read" for main memory
    read-only, else the level's name) and the structured `memory`, `access`, `main`."""
    if access not in ACCESSES:
        raise ValueError(f"access={access!r}: expected one of {list(ACCESSES)}")
    level = memory + _READ_SUFFIX if main and access == READ else memory
    return {"level": level, "memory": memory, "access": access, "main": bool(main)}


def levels(roof: dict) -> dict:
    """{memory, access, main} of a memory roof: its own fields, or, for a roof of an older
    file, derived from its `level` ("DRAM read" -> DRAM, read, main; "L2" -> L2, not main;
    a cache level read by the C read kernel is a read, anything else read+write)."""
    if "memory" in roof and "access" in roof and "main" in roof:
        return {"memory": roof["memory"], "access": roof["access"], "main": roof["main"]}
    level = roof["level"]
    memory = level[:-len(_READ_SUFFIX)] if level.endswith(_READ_SUFFIX) else level
    main = is_main_memory(memory)
    by = str(roof.get("program") or roof.get("source") or "")
    read = level.endswith(_READ_SUFFIX) or (not main and by.startswith("C read"))
    return {"memory": memory, "access": READ if read else READ_WRITE, "main": main}


def upgrade_roofs(roofs: dict) -> dict:
    """Store the structured fields in every memory roof (memory, compiler) that lacks them."""
    for key in ("memory", "compiler"):
        items = roofs.get(key)
        for roof in items if isinstance(items, list) else []:
            if (isinstance(roof, dict) and roof.get("kind") == "memory"
                    and isinstance(roof.get("level"), str)):
                roof.update(levels(roof))
    return roofs


def is_main(roof: dict) -> bool:
    """True for a roof of main memory."""
    return levels(roof)["main"]


# ------------------------------------------------------------------ choosing roofs

def unflagged(roofs: Sequence[dict]) -> list[dict]:
    """The roofs not flagged suspect (a suspect roof is a measurement to explain, not a roof)."""
    return [r for r in roofs if not r.get("suspect")]


def main_roofs(memory: Sequence[dict], access: str | None = None,
               include_suspect: bool = False) -> list[dict]:
    """Main memory's roofs among `memory` (of one `access` when given), in order; unflagged
    ones only unless `include_suspect`."""
    pool = memory if include_suspect else unflagged(memory)
    return [r for r in pool if is_main(r) and access in (None, levels(r)["access"])]


def main_roof(memory: Sequence[dict], access: str, include_suspect: bool = False
              ) -> dict | None:
    """Main memory's first roof of `access` (READ: the read-only roof inference streams at;
    READ_WRITE: the in-place roof), or None."""
    return next(iter(main_roofs(memory, access, include_suspect)), None)


def gemm_roofs(compute: Sequence[dict], dtype: str) -> list[dict]:
    """The unflagged matrix (GEMM) roofs of `dtype`."""
    return [r for r in unflagged(compute)
            if r.get("dtype") == dtype and r["name"].startswith("GEMM")]


def compute_roof(roofs: dict, dtype: str) -> dict:
    """The matrix (GEMM) roof of `dtype`, or the best unflagged compute roof if none."""
    ok = unflagged(roofs["compute"])
    pool = gemm_roofs(ok, dtype) or [r for r in ok if r.get("dtype") == dtype] or ok
    if not pool:
        raise ValueError("roofs.compute: no unflagged compute roof to predict with")
    return max(pool, key=lambda r: r["value"])


def spec_roofs(device, dtype: str = "bfloat16") -> tuple[dict, dict]:
    """A spec device's (hardware.Device) roofs: its peak for `dtype` (else its highest) and
    its main memory's bandwidth, as roof-like {name, value} dicts for `predict`."""
    peak = device.peak_flops.get(dtype) or max(device.peak_flops.values())
    main = device.main_memory
    return ({"name": f"{device.name} {dtype} peak", "value": peak},
            {"name": f"{device.name} {main}", "level": main,
             "value": device.memory_bandwidth[main]})


# ------------------------------------------------------------------ the level of a working set

def last_level_bytes(capacities) -> int:
    """The largest capacity of [[level, bytes], ...] (0 without caches)."""
    return max((c for _, c in capacities or []), default=0)


def holding_roof(memory: Sequence[dict], capacities, working_set: float) -> dict:
    """The roof of the smallest cache level whose capacity holds the working set, else main
    memory's read-only roof (inference phases stream weights and caches: reads), else main
    memory's other roof. `capacities` is [[level, bytes], ...] smallest first."""
    ok = unflagged(memory)
    caches = {levels(r)["memory"]: r for r in ok if not is_main(r)}
    for name, capacity in capacities:
        if working_set <= capacity and name in caches:
            return caches[name]
    main = main_roofs(ok)
    if not main:
        raise ValueError("roofs.memory: no unflagged main-memory roof to predict with")
    return (main_roofs(ok, READ) or main)[0]


def curve_bandwidth(curve: Sequence[Sequence[float]], working_set_bytes: float) -> float:
    """Bandwidth at a working-set size from a measured curve [[bytes, bytes/s], ...]
    (sorted by size): linear interpolation in log(size)-log(bandwidth), clamped at the ends,
    so a predicted time is continuous in the bytes a phase touches."""
    pts = sorted((float(s), float(b)) for s, b in curve)
    if not pts:
        raise ValueError("curve_bandwidth: empty curve")
    if working_set_bytes <= pts[0][0]:
        return pts[0][1]
    if working_set_bytes >= pts[-1][0]:
        return pts[-1][1]
    x = math.log(working_set_bytes)
    for (s0, b0), (s1, b1) in zip(pts, pts[1:], strict=False):
        if s0 <= working_set_bytes <= s1:
            w = (x - math.log(s0)) / (math.log(s1) - math.log(s0)) if s1 > s0 else 0.0
            return math.exp(math.log(b0) + w * (math.log(b1) - math.log(b0)))
    return pts[-1][1]


def working_set_curve(series: dict, main_read: dict) -> list[list[float]]:
    """The curve predictions interpolate: a fixed-thread-count read series (hierarchy's
    `all_cores`: points and cache_capacities) up to 4x the last-level cache, ended at 16x it
    by main memory's read-only roof."""
    llc = last_level_bytes(series["cache_capacities"])
    curve = [[p["working_set_bytes"], p["bytes_per_s"]["median"]]
             for p in series["points"] if p["working_set_bytes"] <= 4 * llc]
    curve.append([max(16 * llc, (curve or [[0]])[-1][0] * 2), main_read["value"]])
    return curve


def drift_cap(factor: float, roof: dict) -> float:
    """A drift factor, capped so a roof of the moment never exceeds the best value the roof's
    program reached in any round (its p90: the max over rounds): a probe that runs faster
    than during the rounds says the machine is quiet, not that the hardware grew."""
    return min(factor, roof["p90"] / roof["value"]) if roof.get("value") else factor


def bandwidth_at(inputs: dict, working_set: float, drift: float = 1.0) -> dict:
    """Roof-like {name, level, value, spread} for a working set, from prediction inputs
    {roofs, cache_capacities, curve}: the curve (x the capped drift beyond the last-level
    cache), else the roof of the level that holds it (caches are not scaled by drift)."""
    roofs = inputs["roofs"]
    beyond = working_set > last_level_bytes(inputs.get("cache_capacities"))
    if inputs.get("curve"):
        bw = curve_bandwidth(inputs["curve"], working_set)
        main = main_roof(roofs["memory"], READ, include_suspect=True)
        level = main["level"] if beyond else "cache (working-set curve)"
        return {"name": f"working-set curve at {working_set / 2**20:.1f} MiB", "level": level,
                "value": bw * (drift_cap(drift, main) if beyond else 1.0),
                "spread": spread(main)}
    roof = holding_roof(roofs["memory"], inputs.get("cache_capacities") or [], working_set)
    return {**roof, "value": roof["value"] * (drift_cap(drift, roof) if beyond else 1.0),
            "spread": spread(roof)}


# ------------------------------------------------------------------ ridges

def ridge(compute: dict, memory: dict) -> dict:
    """FLOP/byte where a compute roof meets a memory roof, labelled with both roofs."""
    x = compute["value"] / memory["value"]
    return {"flops_per_byte": x, "compute": compute["name"], "memory": memory["name"],
            "label": f"ridge {x:.3g} FLOP/B = {compute['name']} / {memory['name']}"}


def ridges(compute: Sequence[dict], memory: Sequence[dict]) -> list[dict]:
    """Every ridge point the figures draw: each unflagged compute roof over each unflagged
    main-memory roof (read-only and read+write), each naming the two roofs it divides."""
    return [ridge(c, m) for c in unflagged(compute) for m in main_roofs(memory)]


def phase_ridge(roofs: dict, dtype: str, level: str | None = None) -> dict | None:
    """The ridge of `dtype`'s best GEMM roof over a memory roof: the one keyed `level` (a
    point's predicted["memory_level"]), else main memory's read-only roof, else its
    read+write roof. None without both roofs."""
    gemm = gemm_roofs(roofs["compute"], dtype)
    memory = unflagged(roofs["memory"])
    mem = (next((r for r in memory if r["level"] == level), None)
           or main_roof(memory, READ) or main_roof(memory, READ_WRITE))
    if not gemm or mem is None:
        return None
    return ridge(max(gemm, key=lambda r: r["value"]), mem)


# ------------------------------------------------------------------ prediction

BAND = (0.75, 1.25)  # measured / predicted within this band: "on its prediction", no note


def predict(flops: float, nbytes: float, compute: dict, memory: dict,
            floor_s: float = 0.0, ops: dict | None = None) -> dict:
    """Roofline time of a phase plus the floor. `compute` is a roof-like {name, value},
    `memory` a roof-like {level, value}.

    Without `ops`: the slower of the phase's compute and memory times, max(F / C, B / M), the
    time of a program whose compute and memory traffic overlap completely. With `ops` ({op:
    {flops, bytes}}, the phase's per-op counts, summing to flops and nbytes): the sum of every
    op's own roofline time, sum max(F_op / C, B_op / M), the time of a program that runs its
    ops one after another, each at its own roof (the per-op roofline of LLM-Viewer, Yuan et
    al. 2024, arXiv:2402.16363). The two differ only where a phase mixes compute-bound and
    memory-bound ops (a decode step at batch 32: its FFN is compute-bound, its attention reads
    the KV cache), and there the sum is what a sequential executor can reach; `t_overlap_s`
    keeps the max. `bound` is the side whose ops take the larger share of the time."""
    t_compute, t_memory = flops / compute["value"], nbytes / memory["value"]
    t_overlap = max(t_compute, t_memory)
    if ops:
        if not math.isclose(sum(o["flops"] for o in ops.values()), flops, rel_tol=1e-6) or \
                not math.isclose(sum(o["bytes"] for o in ops.values()), nbytes, rel_tol=1e-6):
            raise ValueError("predict: the ops' FLOPs and bytes must sum to the phase's")
        side = {"compute": 0.0, "memory": 0.0}
        for o in ops.values():
            tc, tm = o["flops"] / compute["value"], o["bytes"] / memory["value"]
            side["compute" if tc >= tm else "memory"] += max(tc, tm)
        t_roof = side["compute"] + side["memory"]
        bound = "compute" if side["compute"] >= side["memory"] else "memory"
    else:
        t_roof = t_overlap
        bound = "compute" if t_compute >= t_memory else "memory"
    t = floor_s + t_roof
    if floor_s > t_roof:
        bound = "overhead"
    out = {"time_s": t, "bound": bound, "t_compute_s": t_compute, "t_memory_s": t_memory,
           "floor_s": floor_s, "compute_roof": compute["name"],
           "compute_flops_per_s": compute["value"], "memory_level": memory["level"],
           "memory_roof": memory.get("name"),
           "memory_bytes_per_s": memory["value"], "flops_per_s": flops / t if t else None}
    if ops:
        out.update(per_op=True, t_overlap_s=floor_s + t_overlap,
                   t_compute_bound_ops_s=side["compute"], t_memory_bound_ops_s=side["memory"])
    return out


def spread(entry: dict) -> float:
    """Relative p10-p90 spread of a roof ({value, p10, p90}) or a rate ({median, p10, p90})."""
    centre = entry.get("value", entry.get("median"))
    if not centre:
        return 0.0
    return max(0.0, (entry["p90"] - entry["p10"]) / centre)


def above(value: float, roof: dict, extra: float = 0.0) -> bool:
    """True when `value` sits above `roof` by more than the roof's own spread (+ extra)."""
    return value > roof["value"] * (1.0 + spread(roof) + extra)
