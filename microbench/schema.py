"""The result-file schema (versioned) and its validator.

A results file (`peaks.json`, written by `python -m microbench peaks`) is one JSON object:

    schema_version  int     SCHEMA_VERSION; bumped when a field changes meaning or goes away
    kind            str     "microbench.peaks"
    machine         str     human label for figures ("cpu: AMD EPYC, 2 cores")
    quick           bool    measured with --quick (fewer, smaller points)
    environment     object  harness.environment(): backend, device, versions, flags, CPU, date
    spec            object|null  the ceilings used by the guard rails (hardware.Device.to_dict())
    gemm, vector, bandwidth     lists of measurements (below)
    sweep           object  {kernel, byte_convention, points: [measurement], plateaus: [...]}
    intensity       object  {kernel, working_set_bytes, points: [measurement]}
    roofs           object  {compute: [roof], memory: [roof]}
    rounds          list    optional: the interleaved rounds (microbench.roofs.rounds.measure_round)
    main_roofs      object  optional: per metric, the best program over the rounds, its
                            stability and ours/peer ratios (microbench.roofs.rounds.derive)
    drift           object  optional: per metric, the best program's value round by round
    hierarchy       object  optional: the native per-level sweep and its monotone checks
    overhead        object  optional: dispatch and per-kernel cost (microbench.roofs.overhead)
    plan, wall_s            optional: the sizes and budgets used, and the run's wall time
    platform        object  optional: the code path (roofs.platform.Platform.to_dict): requested,
                            backend, target, forced, interpret; absent on the CPU's path
    skipped         list    optional: [{what, why}] each thing the path did not measure

roofs may also hold `compiler` (what XLA itself reaches: never a roof) and `ridges`
(microbench.roofline.ridge of the matrix/vector roofs over main memory's roofs).

A measurement is {name, flops, bytes, timing, flops_per_s, bytes_per_s, suspect, reason, ...}
with kernel parameters beside them (shape, dtype, K, k, working_set_bytes, donated ...).
`flops` and `bytes` are the kernel's analytic counts per call (algorithmic bytes; bandwidth
entries also carry `bytes_write_allocate`). `timing` is harness.Timing.to_dict(): raw
`samples` (seconds per call), `calls_per_sample`, `stop`, and median/min/p10/p90/mean/cv.
A rate (`flops_per_s`, `bytes_per_s`) is {median, p10, p90, max} of amount/time.

A roof is {name, kind: "compute"|"memory", value, p10, p90, source, suspect, reason} plus
`dtype` (compute) or, for memory, its level in structured fields (microbench.roofline):

    level   str   the roof's key: "L2", "DRAM" (main memory read+write), "DRAM read" (read-only)
    memory  str   the level itself: "L1", "L2", "L3", "DRAM", "HBM", ...
    access  str   "read" | "read+write": what the program that reached it does to each byte
    main    bool  true for main memory

A suspect roof exceeded its ceiling (vendor or theoretical peak); it is a measurement error to
explain, never a result. Files written before `memory`, `access` and `main` existed are
upgraded when read (`upgrade`, run by `validate_result`): the fields are derived from `level`.
"""

from __future__ import annotations

import math

from microbench import roofline

SCHEMA_VERSION = 1
KIND_PEAKS = "microbench.peaks"
KIND_PHASES = "microbench.phases"
KIND_BREAKDOWN = "microbench.breakdown"  # phases/breakdown.py's per-op result (its own fields)
PHASE_NAMES = ("prefill", "decode_attention", "decode_ffn", "decode")
SWEEPS = ("roofline", "batch", "context")

_NUM = "number"


def _fail(path: str, value, allowed: str):
    shown = repr(value)
    if len(shown) > 80:
        shown = shown[:77] + "..."
    raise ValueError(f"{path}: got {shown}; expected {allowed}")


def _check(path: str, value, kind: str, *, positive: bool = False, nullable: bool = False):
    if value is None:
        if nullable:
            return
        _fail(path, value, kind)
    if kind == _NUM:
        ok = isinstance(value, (int, float)) and not isinstance(value, bool)
        if not ok or not math.isfinite(value) or (positive and value <= 0):
            _fail(path, value, "a finite " + ("positive " if positive else "") + "number")
    elif kind == "int":
        if not isinstance(value, int) or isinstance(value, bool) or (positive and value <= 0):
            _fail(path, value, "a positive integer" if positive else "an integer")
    elif not isinstance(value, {"str": str, "bool": bool, "list": list, "dict": dict}[kind]):
        _fail(path, value, f"a {kind}")


def _require(obj: dict, path: str, key: str):
    if key not in obj:
        raise ValueError(f"{path}.{key}: missing (required field)")
    return obj[key]


def _timing(t, path: str):
    _check(path, t, "dict")
    samples = _require(t, path, "samples")
    _check(path + ".samples", samples, "list")
    if not samples:
        _fail(path + ".samples", samples, "a non-empty list of seconds")
    for i, s in enumerate(samples):
        _check(f"{path}.samples[{i}]", s, _NUM, positive=True)
    _check(path + ".calls_per_sample", _require(t, path, "calls_per_sample"), "int",
           positive=True)
    for key in ("median", "min", "p10", "p90"):
        _check(f"{path}.{key}", _require(t, path, key), _NUM, positive=True)
    _check(path + ".cv", _require(t, path, "cv"), _NUM)


def _rate(r, path: str):
    _check(path, r, "dict", nullable=True)
    if r is not None:
        for key in ("median", "p10", "p90"):
            _check(f"{path}.{key}", _require(r, path, key), _NUM, positive=True)


def _measurement(m, path: str):
    _check(path, m, "dict")
    _check(path + ".name", _require(m, path, "name"), "str")
    _check(path + ".flops", _require(m, path, "flops"), _NUM)
    _check(path + ".bytes", _require(m, path, "bytes"), _NUM)
    _timing(_require(m, path, "timing"), path + ".timing")
    _rate(m.get("flops_per_s"), path + ".flops_per_s")
    _rate(m.get("bytes_per_s"), path + ".bytes_per_s")
    _suspect(m, path)


def _suspect(m: dict, path: str):
    _check(path + ".suspect", _require(m, path, "suspect"), "bool")
    if m["suspect"]:
        _check(path + ".reason", _require(m, path, "reason"), "str")


def _roof(r, path: str):
    _check(path, r, "dict")
    _check(path + ".name", _require(r, path, "name"), "str")
    kind = _require(r, path, "kind")
    if kind not in ("compute", "memory"):
        _fail(path + ".kind", kind, "'compute' or 'memory'")
    _check(path + "." + ("dtype" if kind == "compute" else "level"),
           _require(r, path, "dtype" if kind == "compute" else "level"), "str")
    if kind == "memory":
        _check(path + ".memory", _require(r, path, "memory"), "str")
        access = _require(r, path, "access")
        if access not in roofline.ACCESSES:
            _fail(path + ".access", access, f"one of {list(roofline.ACCESSES)}")
        _check(path + ".main", _require(r, path, "main"), "bool")
    for key in ("value", "p10", "p90"):
        _check(f"{path}.{key}", _require(r, path, key), _NUM, positive=True)
    _check(path + ".source", _require(r, path, "source"), "str")
    _suspect(r, path)


def _path_fields(obj: dict) -> None:
    """The optional `platform` block and `skipped` list of an accelerator path's result."""
    if "platform" in obj:
        block = obj["platform"]
        _check("result.platform", block, "dict")
        for key in ("requested", "backend", "target"):
            _check(f"result.platform.{key}", _require(block, "result.platform", key), "str")
        _check("result.platform.forced", _require(block, "result.platform", "forced"), "bool")
    if "skipped" in obj:
        _check("result.skipped", obj["skipped"], "list")
    for i, s in enumerate(obj.get("skipped") or []):
        _check(f"result.skipped[{i}]", s, "dict")
        for key in ("what", "why"):
            _check(f"result.skipped[{i}].{key}", _require(s, f"result.skipped[{i}]", key), "str")


def upgrade(obj) -> dict:
    """Bring a result of an older version of this code up to its fields, in place: memory
    roofs (a peaks result's, a phases result's peaks block) gain `memory`, `access` and `main`
    derived from their `level` (roofline.upgrade_roofs). A current result is left as it is."""
    if isinstance(obj, dict):
        block = obj.get("peaks") if obj.get("kind") == KIND_PHASES else obj
        roofs = block.get("roofs") if isinstance(block, dict) else None
        if isinstance(roofs, dict):
            roofline.upgrade_roofs(roofs)
    return obj


def read_result(path) -> dict:
    """Read (files.read_json: size and depth limits) and validate a result file; every error
    is one ValueError line that starts with the file's path."""
    from microbench.files import read_json

    try:
        return validate_result(read_json(path))
    except ValueError as e:
        message = str(e)
        raise ValueError(message if message.startswith(str(path)) else f"{path}: {message}") \
            from None


def validate_result(obj) -> dict:
    """Upgrade an older results object (`upgrade`), then check it against the schema; raise
    ValueError naming the bad field."""
    _check("result", obj, "dict")
    upgrade(obj)
    version = _require(obj, "result", "schema_version")
    if version != SCHEMA_VERSION:
        _fail("result.schema_version", version, f"{SCHEMA_VERSION} (this code's version)")
    kind = _require(obj, "result", "kind")
    if kind == KIND_PHASES:
        return _validate_phases(obj)
    if kind != KIND_PEAKS:
        _fail("result.kind", kind, f"{KIND_PEAKS!r} or {KIND_PHASES!r}")
    _check("result.machine", _require(obj, "result", "machine"), "str")
    _check("result.quick", _require(obj, "result", "quick"), "bool")
    env = _require(obj, "result", "environment")
    _check("result.environment", env, "dict")
    _check("result.environment.backend", _require(env, "result.environment", "backend"), "str")
    _check("result.spec", _require(obj, "result", "spec"), "dict", nullable=True)
    for key in ("gemm", "vector", "bandwidth"):
        items = _require(obj, "result", key)
        _check("result." + key, items, "list")
        for i, m in enumerate(items):
            _measurement(m, f"result.{key}[{i}]")
    for key in ("sweep", "intensity"):
        block = _require(obj, "result", key)
        _check("result." + key, block, "dict")
        points = _require(block, "result." + key, "points")
        _check(f"result.{key}.points", points, "list")
        for i, m in enumerate(points):
            _measurement(m, f"result.{key}.points[{i}]")
    _path_fields(obj)
    roofs = _require(obj, "result", "roofs")
    _check("result.roofs", roofs, "dict")
    for kind in ("compute", "memory"):
        items = _require(roofs, "result.roofs", kind)
        _check("result.roofs." + kind, items, "list")
        for i, r in enumerate(items):
            _roof(r, f"result.roofs.{kind}[{i}]")
    return obj


# Phases results (microbench.phases.suite.measure_phases) ----------------------------------
#
#     schema_version, kind = "microbench.phases", machine, quick, environment, wall_s
#     model    {preset, params, dtype, config}
#     peaks    what predictions use (microbench.phases.points.prediction_inputs): {machine, roofs,
#              cache_capacities, curve: [[bytes, bytes/s]], overhead, probe_bytes,
#              probe_reference}
#     plan     the sweep plan (microbench.phases.sweeps.PhasePlan)
#     points   [point]: {sweep, sweeps?, variant, label, phase, batch, context, tokens, dtype,
#              flops, bytes, weight_bytes, kv_bytes, act_bytes, intensity, ops: {op: counts},
#              timing, flops_per_s, bytes_per_s, tokens_per_s, working_set_bytes,
#              kernels (launched by the compiled phase), cold (caches evicted before every
#              call: the decode phases), timed ("warm: ..." | "cold: ..."),
#              drift {memory, compute, before, after} (probe factors),
#              predicted: {time_s, bound: compute|memory|overhead, floor_s, memory_level,
#              memory_roof, flops_per_s, drift, ...} | absent, measured_over_predicted,
#              suspect, reason (faster than its roof beyond the spreads),
#              outside_reason (outside 0.75-1.25: measured), breakdown {top, rows} (full run)}
#     modelled {throughput: [...], crossover: [...], kv: [...]}  (refmodel.costs on spec devices)
#     report   null, or the speed report (microbench.phases.report.measure_report)
#     platform, skipped   optional, as in a peaks result (an accelerator path's phases)
#
# A point is measured once per run and shared by every sweep that uses it: `sweeps` (optional,
# a list holding `sweep` first) names them all; a file without it has one point per sweep.


def point_sweeps(point: dict) -> list[str]:
    """Every sweep a phase point belongs to (`sweeps`, or the single `sweep` of older files)."""
    return point.get("sweeps") or [point["sweep"]]


def _point(p, path: str):
    _check(path, p, "dict")
    for key, allowed in (("sweep", SWEEPS), ("phase", PHASE_NAMES)):
        value = _require(p, path, key)
        if value not in allowed:
            _fail(f"{path}.{key}", value, f"one of {list(allowed)}")
    if "sweeps" in p:
        _check(path + ".sweeps", p["sweeps"], "list")
        if not p["sweeps"] or p["sweeps"][0] != p["sweep"] or \
                any(s not in SWEEPS for s in p["sweeps"]):
            _fail(path + ".sweeps", p["sweeps"], f"a list of {list(SWEEPS)} starting with "
                  f"sweep={p['sweep']!r}")
    _check(path + ".variant", _require(p, path, "variant"), "str")
    _check(path + ".batch", _require(p, path, "batch"), "int", positive=True)
    _check(path + ".context", _require(p, path, "context"), "int")
    for key in ("flops", "bytes", "intensity"):
        _check(f"{path}.{key}", _require(p, path, key), _NUM, positive=True)
    _timing(_require(p, path, "timing"), path + ".timing")
    _rate(_require(p, path, "flops_per_s"), path + ".flops_per_s")
    _rate(_require(p, path, "bytes_per_s"), path + ".bytes_per_s")
    if "predicted" in p:
        pred = p["predicted"]
        _check(path + ".predicted", pred, "dict")
        _check(path + ".predicted.time_s", _require(pred, path + ".predicted", "time_s"), _NUM,
               positive=True)
        _check(path + ".measured_over_predicted", _require(p, path, "measured_over_predicted"),
               _NUM, positive=True)


def _validate_phases(obj: dict) -> dict:
    _check("result.machine", _require(obj, "result", "machine"), "str")
    _check("result.quick", _require(obj, "result", "quick"), "bool")
    _check("result.environment", _require(obj, "result", "environment"), "dict")
    model = _require(obj, "result", "model")
    _check("result.model", model, "dict")
    _check("result.model.preset", _require(model, "result.model", "preset"), "str")
    peaks = _require(obj, "result", "peaks")
    _check("result.peaks", peaks, "dict")
    roofs = _require(peaks, "result.peaks", "roofs")
    for kind in ("compute", "memory"):
        for i, r in enumerate(_require(roofs, "result.peaks.roofs", kind)):
            _roof(r, f"result.peaks.roofs.{kind}[{i}]")
    points = _require(obj, "result", "points")
    _check("result.points", points, "list")
    for i, p in enumerate(points):
        _point(p, f"result.points[{i}]")
    modelled = _require(obj, "result", "modelled")
    _check("result.modelled", modelled, "dict")
    for key in ("throughput", "crossover", "kv"):
        _check(f"result.modelled.{key}", _require(modelled, "result.modelled", key), "list")
    _check("result.report", _require(obj, "result", "report"), "dict", nullable=True)
    _path_fields(obj)
    return obj
