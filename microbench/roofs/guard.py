"""Guard rails: a measurement above its ceiling is a bug signal, never a result.

The ceiling of a compute measurement is the spec's peak for its dtype (the vendor's dense
figure, or the theoretical peak of the computed "cpu" entry); the ceiling of a bandwidth
measurement at a memory level is the spec's bandwidth for that level when it has one. Typical
causes of a value above its ceiling: wrong units, a sparse figure taken as dense,
the wrong dtype, a cache-resident buffer counted as DRAM, bytes or FLOPs counted twice, or
work the compiler removed (constant folding, fusion across what should be separate passes).
"""

from __future__ import annotations

from microbench import roofline
from microbench.hardware import Device, spec_dtype

TOLERANCE = 1.0  # flag anything strictly above the ceiling: the ceilings are upper bounds


def compute_ceiling(spec: Device | None, dtype: str) -> float | None:
    if spec is None:
        return None
    return spec.peak_flops.get(spec_dtype(dtype))


def memory_ceiling(spec: Device | None, memory: str, main: bool | None = None) -> float | None:
    """The spec's bandwidth of level `memory`; for main memory (`main`, by default
    roofline.is_main_memory of the name) the spec's main-memory bandwidth, whatever its name."""
    if spec is None:
        return None
    if memory in spec.memory_bandwidth:
        return spec.memory_bandwidth[memory]
    main = roofline.is_main_memory(memory) if main is None else main
    if main and spec.main_memory in spec.memory_bandwidth:
        return spec.memory_bandwidth[spec.main_memory]
    return None


def check(value: float | None, ceiling: float | None, what: str, unit: str,
          spec_name: str) -> tuple[bool, str | None]:
    """(suspect, reason) for one value against one ceiling."""
    if value is None or ceiling is None or value <= ceiling * TOLERANCE:
        return False, None
    scale = 1e9
    return True, (f"{what}: measured {value / scale:.1f} G{unit} exceeds the ceiling "
                  f"{ceiling / scale:.1f} G{unit} of '{spec_name}' ({value / ceiling:.2f}x): "
                  f"a measurement error (units, dtype, sparse-vs-dense, cache residency, "
                  f"double counting or removed work), not a roof")


def flag_compute(entry: dict, spec: Device | None) -> dict:
    """Set entry['suspect'/'reason'] from its flops_per_s median and its dtype."""
    rate = (entry.get("flops_per_s") or {}).get("median")
    dtype = entry.get("dtype", "float32")
    suspect, reason = check(rate, compute_ceiling(spec, dtype), f"{entry['name']} {dtype}",
                            "FLOP/s", spec.name if spec else "")
    entry["suspect"], entry["reason"] = suspect, reason
    return entry


def flag_memory(entry: dict, spec: Device | None, level: str) -> dict:
    """Set entry['suspect'/'reason'] from its bytes_per_s median at memory `level`."""
    rate = (entry.get("bytes_per_s") or {}).get("median")
    suspect, reason = check(rate, memory_ceiling(spec, level), f"{entry['name']} at {level}",
                            "B/s", spec.name if spec else "")
    entry["suspect"], entry["reason"] = suspect, reason
    return entry


def flag_roof(roof: dict, spec: Device | None) -> dict:
    if roof["kind"] == "compute":
        ceiling, unit = compute_ceiling(spec, roof["dtype"]), "FLOP/s"
    else:
        level = roofline.levels(roof)
        ceiling, unit = memory_ceiling(spec, level["memory"], level["main"]), "B/s"
    roof["suspect"], roof["reason"] = check(roof["value"], ceiling, roof["name"], unit,
                                            spec.name if spec else "")
    return roof
