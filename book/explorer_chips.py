"""The explorer page's chips: every spec chip of microbench/data/hardware.json (vendor peaks,
drawn dashed), every machine whose measured roofs are committed in figures/data/<machine>/
(drawn solid, its spec peaks dashed, its measured phase points with their measured/predicted
ratio), and the reader's own results/microbench/ when the book is built where it exists.

A chip gives, per weight format of `explorer.DTYPES`, the compute roof a phase of that format
is held to and one memory roof (the roofs `microbench.roofline` predicts with), and its memory
size for the batch that fits.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import explorer  # noqa: E402  (book/explorer.py, beside this file)

ROOT = explorer.ROOT
READER = ROOT / "results" / "microbench"


def spec_chip(device) -> dict | None:
    """A spec device's roofs (roofline.spec_roofs: the format's peak, else the highest); None
    for a device without a main-memory bandwidth (this machine's derived CPU entry)."""
    from microbench import roofline

    if device.main_memory not in device.memory_bandwidth:
        return None
    compute = []
    for d in explorer.DTYPES:
        peak, memory = roofline.spec_roofs(device, d)
        listed = d in device.peak_flops
        best = max(device.peak_flops, key=device.peak_flops.get)
        compute.append({"value": peak["value"], "name": f"{device.name} {d if listed else best}"
                        f" peak{'' if listed else f' (no {d} figure: its highest)'}"})
    return {"id": f"spec:{device.name}", "label": device.name, "kind": "spec",
            "compute": compute, "memory": {"value": memory["value"],
                                           "name": f"{device.name} {memory['level']}"},
            "memory_bytes": device.memory_bytes, "source": device.sources[0]}


def spec_chips() -> list[dict]:
    from microbench import hardware

    chips = [spec_chip(hardware.get(n)) for n in hardware.list_devices()]
    return [c for c in chips if c is not None]


def measured_chip(folder: Path, chip_id: str, label: str, models: dict) -> dict | None:
    """One machine's measured roofs (peaks.json) and phase points (phases.json), or None
    without peaks.json."""
    from microbench import machines, roofline

    if not (folder / "peaks.json").exists():
        return None
    peaks = json.loads((folder / "peaks.json").read_text(encoding="utf-8"))
    roofs, env = peaks["roofs"], peaks.get("environment") or {}
    memory = roofline.main_roof(roofs["memory"], roofline.READ) or \
        roofline.main_roof(roofs["memory"], roofline.READ_WRITE)
    compute = []
    for d in explorer.DTYPES:
        r = roofline.compute_roof(roofs, d)
        note = "" if r.get("dtype") == d else f" (no {d} roof measured: its best)"
        compute.append({"value": r["value"], "name": f"measured {r['name']}{note}"})
    spec = peaks.get("spec") or {}
    spec_peaks = [spec.get("peak_flops", {}).get(d) for d in explorer.DTYPES]
    machine = machines.describe(env)
    phases = folder / "phases.json"
    points = measured_points(json.loads(phases.read_text(encoding="utf-8")), machine, models) \
        if phases.exists() else []
    return {"id": chip_id, "label": label, "kind": "measured", "machine": machine,
            "date": env.get("date_utc", "?"), "compute": compute,
            "memory": {"value": memory["value"], "name": f"measured {memory['name']}"},
            "spec_peaks": spec_peaks, "memory_bytes": spec.get("memory_bytes"),
            "source": f"{folder.relative_to(ROOT).as_posix()}/peaks.json", "points": points}


def measured_points(result: dict, machine: str, models: dict) -> list[dict]:
    """Every measured phase point of a phases result, tagged with the model keys whose config
    is the point's (its preset with its variant's changes)."""
    from microbench.phases import sweeps
    from refmodel import presets

    date = (result.get("environment") or {}).get("date_utc", "?")
    known, out = sweeps.variants(), []
    for p in result.get("points", []):
        if p.get("model") not in presets.names() or p.get("variant") not in known:
            continue
        cfg = dataclasses.replace(presets.get(p["model"]), **known[p["variant"]])
        keys = [k for k, c in models.items() if c == cfg]
        if not keys or not p.get("flops_per_s"):
            continue
        out.append({"models": keys, "phase": p["phase"], "batch": p["batch"],
                    "context": p["context"], "dtype": p["dtype"], "intensity": p["intensity"],
                    "flops_per_s": p["flops_per_s"]["median"],
                    "ratio": p.get("measured_over_predicted"), "suspect": bool(p.get("suspect")),
                    "machine": machine, "date": date, "variant": p["variant"]})
    return out


def measured_chips(models: dict) -> list[dict]:
    """Every committed machine folder, then the reader's results/microbench/ if it exists."""
    out = []
    data = ROOT / "figures" / "data"
    for folder in sorted(p for p in data.iterdir() if p.is_dir()) if data.exists() else []:
        chip = measured_chip(folder, f"measured:{folder.name}", f"measured: {folder.name}",
                             models)
        if chip:
            out.append(chip)
    mine = measured_chip(READER, "reader", "your machine (results/microbench/)", models)
    return out + ([mine] if mine else [])
