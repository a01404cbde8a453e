"""The roofs of an accelerator: device memory and dense GEMM per dtype (`measure(platform)`).

Device memory (HBM): a read (XLA's reduction, `jnp.sum`) and a copy (XLA's `copy`) over an
array far larger than any on-chip memory (max(1 GiB, 16 x the spec's largest on-chip cache),
at most an eighth of the device's memory), and the same copy as a Pallas kernel
(pallas_copy.py), a program that is not XLA's code generation. A separate peer program is
used where the device image has one on PATH; none is faked where it has none. Bytes are
algorithmic: a read moves n x 4 bytes, a copy 2 x n x 4 (no write-allocate on a GPU/TPU).

Dense GEMM, square, per dtype: bfloat16; float8 (e4m3) where the chip has it, kept only when
the compiled HLO multiplies float8 operands (hlo.runs_fp8), else named as skipped with the
evidence; int8 with an int32 accumulator. Each against its spec-sheet dense peak from the
hardware database, matched by device_kind (an unknown device has none, and says so). XLA's
matmul calls the vendor library (cuBLAS on an NVIDIA GPU), named from the HLO: the GEMM peer.

Timing is the harness's: compiled first, warm-ups, `block_until_ready`, samples of >= 2 ms.
What the CPU path measures and this one does not (the C and numpy peers, the cache sweep, the
vector roof) is listed under `skipped`, each with why. The result is a peaks result
(schema.py) with empty CPU-only sections, so the same figures draw it.
"""

from __future__ import annotations

import functools
import shutil
import time
from dataclasses import dataclass

import jax
import jax.numpy as jnp

from microbench import hardware, harness, roofline
from microbench.roofs import compute, guard, hlo, overhead, pallas_copy, peaks, probe
from microbench.roofs.platform import Platform, environment, machine_label
from microbench.schema import KIND_PEAKS, SCHEMA_VERSION, validate_result

GEMM_DTYPES = ("bfloat16", "float8_e4m3fn", "int8")
PEER_PROGRAMS = ("nvbandwidth", "babelstream", "cuda-stream", "hip-stream")
UNKNOWN_ON_CHIP = 64 << 20  # assumed largest on-chip memory of a device the database lacks
SKIPPED = (
    ("C read peer", "a host C program reads the host's DRAM, not the device's memory"),
    ("numpy GEMM peer", "numpy multiplies on the host CPU; on the device the vendor library "
     "behind XLA's matmul is the GEMM peer"),
    ("cache-level working-set sweep", "its levels are the host CPU's caches; the device's "
     "on-chip sizes come from the spec sheet"),
    ("vector FMA roof and intensity sweep", "the phases' ops are matrix products and memory "
     "streams: the GEMM and HBM roofs bound them"),
    ("interleaved rounds and drift probes", "they pair XLA with the C and numpy peers on the "
     "host; each device roof here is one program's median"),
)


@dataclass(frozen=True)
class DevicePlan:
    array_bytes: int  # the memory roofs' array
    gemm: int  # square GEMM size
    block: tuple[int, int]  # the Pallas copy's block
    budget_s: float
    min_samples: int
    min_sample_s: float = 2e-3


def device_memory_bytes(env: dict, spec_memory: float | None) -> float | None:
    """What the device reports it may allocate, else the spec sheet's memory."""
    return (env.get("device_memory") or {}).get("bytes_limit") or spec_memory


def make_plan(platform: Platform, spec, env: dict, quick: bool) -> DevicePlan:
    """Sizes for the platform: a forced run on a CPU uses tiny ones (its logic, not speed)."""
    block = pallas_copy.block_for(platform.target, platform.backend)
    if platform.forced:
        return DevicePlan(4 << 20, 128, block, 0.05, 3)
    on_chip = max((spec.cache_bytes or {}).values(), default=0) if spec else 0
    want = max(1 << 30, 16 * int(on_chip or UNKNOWN_ON_CHIP))
    memory = device_memory_bytes(env, spec.memory_bytes if spec else None)
    if memory:
        want = min(want, int(memory) // 8)
    return DevicePlan(want, 4096 if quick else 8192, block, 0.3 if quick else 1.0, 5)


def _time(plan: DevicePlan, fn, *args) -> harness.Timing:
    return harness.time_fn(fn, *args, budget_s=plan.budget_s, min_samples=plan.min_samples,
                           target_cv=0.03, min_sample_s=plan.min_sample_s)


def spec_peak(spec, env: dict, dtype: str) -> tuple[float | None, str]:
    """(the spec's dense peak for dtype or None, where it comes from or why there is none)."""
    if spec is None:
        return None, f"unknown device kind {env.get('device_kind')!r}: no spec in the database"
    key = hardware.spec_dtype(dtype)
    if key not in spec.peak_flops:
        return None, f"{spec.name}: the database lists no {key} peak"
    return spec.peak_flops[key], f"{spec.name} {key} dense peak (hardware database)"


def fp8_unsupported(env: dict, spec, platform: Platform) -> str | None:
    """Why the chip has no fp8 GEMM, or None to try it (the compiled HLO then decides)."""
    if platform.forced:
        return None  # compiled for XLA:CPU: the HLO check runs and names what ran
    cc = env.get("compute_capability")
    if env.get("backend") == "gpu" and cc:
        major, minor = (int(x) for x in str(cc).split(".")[:2])
        if (major, minor) < (8, 9):
            return f"compute capability {cc} < 8.9: no float8 tensor cores"
        return None
    if spec is not None and "float8" not in spec.peak_flops:
        return f"{spec.name}: the spec sheet lists no float8 peak"
    return None


def _compiled_gemm(dtype: str, n: int):
    fn, label = compute.gemm_fn(dtype)
    a, b = compute.gemm_inputs(n, n, n, dtype)
    return jax.jit(fn).lower(a, b).compile(), (a, b), label


def gemm_entry(plan: DevicePlan, dtype: str, env: dict, spec, platform: Platform):
    """(a measured GEMM entry, None) or (None, a skipped {what, why})."""
    what, n = f"GEMM {dtype}", plan.gemm
    why = fp8_unsupported(env, spec, platform) if dtype.startswith("float8") else None
    if why:
        return None, {"what": what, "why": why}
    try:
        compiled, args, label = _compiled_gemm(dtype, n)
    except Exception as e:  # noqa: BLE001 - an unsupported dtype fails in many ways
        return None, {"what": what, "why": f"XLA cannot compile it here ({type(e).__name__}: "
                                           f"{str(e).splitlines()[0][:200] if str(e) else ''})"}
    text = compiled.as_text()
    fp8, products = hlo.runs_fp8(text)
    if dtype.startswith("float8") and not fp8:
        return None, {"what": what, "why": f"the compiled HLO does not multiply in float8: "
                                           f"{products}"}
    t = _time(plan, compiled, *args)
    peak, source = spec_peak(spec, env, dtype)
    e = peaks.entry("gemm", t, compute.gemm_flops(n, n, n), compute.gemm_bytes(n, n, n, dtype),
                    dtype=dtype, shape=[n, n, n], shape_kind="square", ran=label,
                    library=hlo.library(text) or "none: XLA's own code", hlo_products=products,
                    spec_peak=peak, spec_source=source)
    e["of_spec_peak"] = e["flops_per_s"]["median"] / peak if peak else None
    return guard.flag_compute(e, spec), None


def memory_programs(plan: DevicePlan, platform: Platform) -> list[tuple]:
    """(name, program, fn, access, bytes per element) of each device-memory measurement."""
    copy = functools.partial(pallas_copy.pallas_copy, block=plan.block,
                             interpret=platform.interpret)
    how = " (interpret mode)" if platform.interpret else ""
    return [("read", "XLA reduction (jnp.sum)", jnp.sum, roofline.READ, 4),
            ("copy", "XLA copy", jnp.copy, roofline.READ_WRITE, 8),
            ("copy", f"Pallas copy kernel{how}", copy, roofline.READ_WRITE, 8)]


def measure_memory(plan: DevicePlan, spec, platform: Platform, main: str
                   ) -> tuple[list[dict], list[dict]]:
    """The read and copy entries at main memory, and what was skipped."""
    shape = pallas_copy.shape_for(plan.array_bytes, plan.block)
    n = shape[0] * shape[1]
    x = jnp.asarray(probe.host_array(n).reshape(shape))
    out, skipped = [], []
    for name, program, fn, access, per_element in memory_programs(plan, platform):
        try:
            t = _time(plan, fn, x)
        except Exception as e:  # noqa: BLE001 - a kernel the platform cannot lower
            skipped.append({"what": program, "why": f"{type(e).__name__}: "
                                                    f"{str(e).splitlines()[0][:200]}"})
            continue
        e = peaks.entry(name, t, float(n) if name == "read" else 0.0, float(per_element * n),
                        dtype="float32", program=program, access=access, level=main, n=n,
                        working_set_bytes=per_element * n)
        out.append(guard.flag_memory(e, spec, main))
    del x
    return out, skipped + [peer_program()]


def peer_program() -> dict:
    """The separate bandwidth program on this image, as a skipped entry: none is run here."""
    found = [p for p in (shutil.which(name) for name in PEER_PROGRAMS) if p]
    if not found:
        return {"what": "bandwidth peer program",
                "why": f"no peer program on this device image (looked on PATH for "
                       f"{', '.join(PEER_PROGRAMS)})"}
    return {"what": "bandwidth peer program",
            "why": f"found {found[0]}, but reading its output is not written; not run"}


def _roof(name: str, key: dict, e: dict, rate: str, source: str, spec) -> dict:
    r = e[rate]
    return guard.flag_roof({"name": name, **key, "value": r["median"], "p10": r["p10"],
                            "p90": r["p90"], "source": source,
                            "program": e.get("program") or e.get("library")}, spec)


def _best(entries: list[dict], rate: str) -> dict | None:
    ok = [e for e in entries if not e["suspect"] and e.get(rate)]
    return max(ok, key=lambda e: e[rate]["median"], default=None)


def derive_roofs(gemm: list[dict], bandwidth: list[dict], spec, main: str) -> dict:
    """GEMM roofs per dtype; main memory's read-only roof (the read) and read+write roof (the
    best copy, labelled with its program); XLA's own copy kept under `compiler` when a peer
    beat it."""
    compute_roofs = [
        _roof(f"GEMM {e['dtype']}", {"kind": "compute", "dtype": e["dtype"]}, e, "flops_per_s",
              f"GEMM {'x'.join(map(str, e['shape']))} via XLA ({e['library']})", spec)
        for e in gemm if not e["suspect"]]
    memory, compiler = [], []
    read = _best([e for e in bandwidth if e["name"] == "read"], "bytes_per_s")
    if read:
        memory.append(_roof(f"{main} read-only", {"kind": "memory", **roofline.level_fields(
            main, roofline.READ, True)}, read, "bytes_per_s", read["program"], spec))
    copies = [e for e in bandwidth if e["name"] == "copy"]
    best = _best(copies, "bytes_per_s")
    if best:
        memory.append(_roof(main, {"kind": "memory", **roofline.level_fields(
            main, roofline.READ_WRITE, True)}, best, "bytes_per_s",
            f"{best['program']}, read + write bytes", spec))
        xla = next((e for e in copies if e["program"] == "XLA copy"), None)
        if xla and xla is not best and not xla["suspect"]:
            rw = roofline.level_fields(main, roofline.READ_WRITE, True)
            compiler.append(_roof(f"{main} (XLA copy)", {"kind": "memory", **rw}, xla,
                                  "bytes_per_s", "XLA copy", spec))
    return {"compute": compute_roofs, "memory": memory, "compiler": compiler,
            "ridges": roofline.ridges(compute_roofs, memory)}


def measure(platform: Platform, quick: bool, progress: bool = True) -> dict:
    """Every device roof, as a validated peaks result (writes nothing)."""
    t0 = time.perf_counter()
    env = environment(platform)
    spec = hardware.device_for_environment(env)
    plan = make_plan(platform, spec, env, quick)
    main = roofline.main_memory_name(env)
    gemm, skipped = [], []
    for dtype in GEMM_DTYPES:
        if progress:
            print(f"device GEMM {dtype}", flush=True)
        e, skip = gemm_entry(plan, dtype, env, spec, platform)
        gemm += [e] if e else []
        skipped += [skip] if skip else []
    bandwidth, skip = measure_memory(plan, spec, platform, main)
    skipped += skip + [{"what": w, "why": y} for w, y in SKIPPED]
    if platform.forced:
        skipped.insert(0, {"what": f"the {platform.target} itself",
                           "why": f"the {platform.target} path was forced on this CPU: every "
                                  "number here is the CPU's, measured by that path's code at "
                                  "tiny sizes (Pallas in interpret mode)"})
    caches = sorted(((k, int(v)) for k, v in ((spec.cache_bytes if spec else None) or {}
                                              ).items()), key=lambda kv: kv[1])
    result = {"schema_version": SCHEMA_VERSION, "kind": KIND_PEAKS,
              "machine": machine_label(env), "quick": quick, "environment": env,
              "spec": spec.to_dict() if spec else None, "platform": platform.to_dict(),
              "plan": {**vars(plan), "block": list(plan.block)}, "gemm": gemm, "vector": [],
              "bandwidth": bandwidth,
              "sweep": {"kernel": "not measured on the device path", "points": [],
                        "plateaus": [], "cache_capacities": [list(c) for c in caches]},
              "intensity": {"kernel": "not measured on the device path", "points": [],
                            "working_set_bytes": plan.array_bytes},
              "overhead": overhead.measure(budget_s=plan.budget_s, cold=True),
              "roofs": derive_roofs(gemm, bandwidth, spec, main), "skipped": skipped}
    result["wall_s"] = time.perf_counter() - t0
    return validate_result(result)
