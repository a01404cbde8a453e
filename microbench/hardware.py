"""Spec database: vendor peaks (dense only, with sources) and this machine's CPU ceiling.

`data/hardware.json` is copied from the project's reviewed reference table (NVIDIA, AMD,
Google, Groq, Cerebras and Apple datasheets; each entry cites its sources and keeps the notes
on where sources disagree). The "cpu" entry is computed on the machine that runs it, from the
ISA flags, the usable cores and the clock (see `cpu_device`); it is an upper bound used by the
guard rails, not a promise.

The "links" table holds the interconnects between chips (NVLink, Infinity Fabric, TPU ICI,
PCIe, Groq chip-to-chip, InfiniBand, RoCE): bandwidth in bytes/s per direction per chip, a
per-message latency (one hop), sources and notes saying which figures are derived (a
bidirectional datasheet figure halved) and which are assumed. A device names its scale-up link
and domain size (`scale_up`) and its scale-out link (`scale_out`) where known.

Public API:
    Device                       frozen dataclass (name, vendor, kind, peak_flops, ...,
                                 scale_up {link, chips} | None, scale_out link name | None)
    get(name) -> Device          unknown names raise KeyError listing the valid ones
    list_devices() -> list[str]
    LinkSpec                     frozen dataclass (name, kind, bandwidth, latency, sources, notes)
    get_link(name) -> LinkSpec   unknown names raise KeyError listing the valid ones
    list_links() -> list[str]
    link_from_dict(d, prefix="") -> LinkSpec   validate one link object (errors name the field)
    link(spec) -> refmodel.sim.cluster.Link    the simulator's view of a link
    load_device(path) -> Device  a user's own device as JSON (at most 1 MiB, 16 levels
                                 deep); bad fields raise ValueError naming the file
    add_device(device, replace=False)  make a loaded device visible to get()/list_devices();
                                 a name already taken (a built-in) needs replace=True
    cpu_device() -> Device       this machine's CPU, derived from ISA x cores x clock
    device_for_environment(env) -> Device | None   the spec that matches a harness environment
    ridge_point(device, dtype=None, level=None) -> float   FLOP per byte
    spec_dtype(dtype) -> str     "float8_e4m3fn" -> "float8" etc.
"""

from __future__ import annotations

import functools
import json
import math
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path

from microbench import roofline, sysinfo
from microbench.files import read_json

DATA = Path(__file__).parent / "data" / "hardware.json"
DTYPES = ("float32", "tf32", "bfloat16", "float16", "float8", "int8", "float4")
KINDS = ("cpu", "gpu", "tpu", "sram", "soc")
LINK_KINDS = ("scale-up", "scale-out", "chip-to-chip", "host")
_PREFERRED = ("bfloat16", "float16", "float32")


@dataclass(frozen=True)
class Device:
    name: str
    vendor: str
    kind: str
    peak_flops: dict  # {dtype: FLOP/s}, dense
    memory_bandwidth: dict  # {level: bytes/s}
    main_memory: str  # key of memory_bandwidth holding the off-chip (or SRAM-only) roof
    memory_bytes: float | None
    sources: tuple[str, ...]
    notes: tuple[str, ...] = ()
    dense: bool = True
    memory_type: str | None = None
    derivation: dict = field(default_factory=dict)
    cache_bytes: dict = field(default_factory=dict)  # {level: bytes}, small to large
    scale_up: dict | None = None  # {"link": a links-table name, "chips": chips in one domain}
    scale_out: str | None = None  # a links-table name (the NIC between scale-up domains)

    def to_dict(self) -> dict:
        d = asdict(self)
        d["sources"], d["notes"] = list(self.sources), list(self.notes)
        return d


@dataclass(frozen=True)
class LinkSpec:
    """One interconnect as seen by one chip: bytes/s in one direction, seconds per message
    (one hop), and where those figures come from."""

    name: str
    kind: str  # one of LINK_KINDS
    bandwidth: float  # bytes/s, one direction, per chip
    latency: float  # seconds per message, one hop
    sources: tuple[str, ...]
    notes: tuple[str, ...] = ()

    def to_dict(self) -> dict:
        d = asdict(self)
        d["sources"], d["notes"] = list(self.sources), list(self.notes)
        return d


def _bad(path: str, value, allowed: str, what: str = "device") -> ValueError:
    return ValueError(f"{what} field '{path}': got {value!r}; allowed: {allowed}")


def _positive(path: str, value, what: str = "device") -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not (
            math.isfinite(value) and value > 0):
        raise _bad(path, value, "a finite positive number", what)
    return float(value)


def _str(d: dict, key: str, prefix: str, what: str = "device") -> str:
    value = d.get(key)
    if not isinstance(value, str) or not value.strip():
        raise _bad(prefix + key, value, "a non-empty string", what)
    return value


def _citations(d: dict, prefix: str, what: str) -> tuple[tuple[str, ...], tuple[str, ...]]:
    sources = d.get("sources")
    if not (isinstance(sources, list) and sources and all(isinstance(s, str) and s.strip()
                                                          for s in sources)):
        raise _bad(prefix + "sources", sources, "a non-empty list of citation strings", what)
    notes = d.get("notes", [])
    if not (isinstance(notes, list) and all(isinstance(s, str) for s in notes)):
        raise _bad(prefix + "notes", notes, "a list of strings", what)
    return tuple(sources), tuple(notes)


def link_from_dict(d: dict, prefix: str = "") -> LinkSpec:
    """Validate one link object; each error names the field, the value and what is allowed."""
    if not isinstance(d, dict):
        raise _bad(prefix.rstrip(".") or "link", d, "a JSON object", "link")
    name = _str(d, "name", prefix, "link")
    kind = d.get("kind")
    if kind not in LINK_KINDS:
        raise _bad(prefix + "kind", kind, " | ".join(LINK_KINDS), "link")
    bandwidth = _positive(prefix + "bandwidth", d.get("bandwidth"), "link")
    latency = _positive(prefix + "latency", d.get("latency"), "link")
    sources, notes = _citations(d, prefix, "link")
    return LinkSpec(name=name, kind=kind, bandwidth=bandwidth, latency=latency,
                    sources=sources, notes=notes)


def _link_name(path: str, value, links) -> str:
    if not isinstance(value, str) or value not in links:
        raise _bad(path, value, "a link name, one of " + ", ".join(links))
    return value


def _scale_up(d: dict, prefix: str, links) -> dict | None:
    value = d.get("scale_up")
    if value is None:
        return None
    if not isinstance(value, dict) or set(value) != {"link", "chips"}:
        raise _bad(prefix + "scale_up", value,
                   "an object {link: a link name, chips: an integer >= 2} or absent")
    chips = value["chips"]
    if isinstance(chips, bool) or not isinstance(chips, int) or chips < 2:
        raise _bad(prefix + "scale_up.chips", chips,
                   "an integer >= 2 (chips in one scale-up domain)")
    return {"link": _link_name(prefix + "scale_up.link", value["link"], links), "chips": chips}


def _rate_table(d: dict, key: str, prefix: str, allowed_keys=None) -> dict:
    table = d.get(key)
    if not isinstance(table, dict):
        raise _bad(prefix + key, table, "an object {name: positive number}")
    for k, v in table.items():
        if allowed_keys is not None and k not in allowed_keys:
            raise _bad(f"{prefix}{key}.{k}", k, "one of " + ", ".join(allowed_keys))
        _positive(f"{prefix}{key}.{k}", v)
    return {k: float(v) for k, v in table.items()}


def device_from_dict(d: dict, prefix: str = "", links=None) -> Device:
    """Validate one device object; each error names the field, the value and what is allowed.

    `scale_up.link` and `scale_out` must name a link in `links` (default: the built-in links
    table)."""
    if not isinstance(d, dict):
        raise _bad(prefix.rstrip(".") or "device", d, "a JSON object")
    kind = d.get("kind")
    if kind not in KINDS:
        raise _bad(prefix + "kind", kind, " | ".join(KINDS))
    if d.get("dense") is not True:
        raise _bad(prefix + "dense", d.get("dense"),
                   "true (dense peaks only; halve 2:4-sparse headline figures)")
    flops = _rate_table(d, "peak_flops", prefix, DTYPES)
    caches = _rate_table(d, "cache_bytes", prefix) if "cache_bytes" in d else {}
    if not flops:
        raise _bad(prefix + "peak_flops", flops, "at least one dtype")
    bw = _rate_table(d, "memory_bandwidth", prefix)
    main = d.get("main_memory")
    if not isinstance(main, str) or (bw and main not in bw):
        raise _bad(prefix + "main_memory", main, "a key of memory_bandwidth " + str(sorted(bw)))
    mem = d.get("memory_bytes")
    if mem is not None:
        _positive(prefix + "memory_bytes", mem)
    sources, notes = _citations(d, prefix, "device")
    links = list_links() if links is None else list(links)
    scale_up = _scale_up(d, prefix, links)
    scale_out = d.get("scale_out")
    if scale_out is not None:
        _link_name(prefix + "scale_out", scale_out, links)
    derivation = d.get("derivation")
    if derivation is not None and not isinstance(derivation, dict):
        raise _bad(prefix + "derivation", derivation, "an object {name: value} or absent")
    memory_type = d.get("memory_type")
    if memory_type is not None and not isinstance(memory_type, str):
        raise _bad(prefix + "memory_type", memory_type, "a string or absent")
    return Device(name=_str(d, "name", prefix), vendor=_str(d, "vendor", prefix), kind=kind,
                  peak_flops=flops, memory_bandwidth=bw, main_memory=main,
                  memory_bytes=None if mem is None else float(mem), sources=sources,
                  notes=notes, memory_type=d.get("memory_type"),
                  derivation=dict(d.get("derivation") or {}), cache_bytes=caches,
                  scale_up=scale_up, scale_out=scale_out)


# A device file is one object of ~2 kB nested 3 levels deep: anything far bigger or deeper is
# not one, and is refused before parsing.
DEVICE_FILE_BYTES = 2**20
DEVICE_FILE_DEPTH = 16


def load_device(path: str | Path) -> Device:
    """A user's device file: one device object (same fields as data/hardware.json entries)."""
    obj = read_json(path, max_bytes=DEVICE_FILE_BYTES, max_depth=DEVICE_FILE_DEPTH)
    try:
        return device_from_dict(obj)
    except ValueError as e:
        raise ValueError(f"{path}: {e}") from None


@functools.lru_cache(maxsize=1)
def _doc() -> dict:
    return json.loads(DATA.read_text())


@functools.lru_cache(maxsize=1)
def _builtin() -> dict[str, Device]:
    return {name: device_from_dict(d, f"devices[{name!r}].")
            for name, d in _doc()["devices"].items()}


def _links_from_table(table) -> dict[str, LinkSpec]:
    """Validate a {name: link object} table; an entry's name must be its key."""
    if not isinstance(table, dict):
        raise _bad("links", table, "an object {name: link object}", "link")
    out = {}
    for key, d in table.items():
        spec = link_from_dict(d, f"links.{key}.")
        if spec.name != key:
            raise _bad(f"links.{key}.name", spec.name, f"the table key {key!r}", "link")
        out[key] = spec
    return out


@functools.lru_cache(maxsize=1)
def _builtin_links() -> dict[str, LinkSpec]:
    return _links_from_table(_doc().get("links", {}))


def list_links() -> list[str]:
    return list(_builtin_links())


def get_link(name: str) -> LinkSpec:
    found = _builtin_links().get(name)
    if found is None:
        raise KeyError(f"unknown link {name!r}; valid: {', '.join(list_links())}")
    return found


def link(spec: LinkSpec):
    """The simulator's Link (refmodel.sim.cluster.Link) for a LinkSpec: same name, bytes/s per
    direction per chip, seconds per message."""
    from refmodel.sim.cluster import Link

    return Link(name=spec.name, bandwidth=spec.bandwidth, latency=spec.latency)


_EXTRA: dict[str, Device] = {}


def add_device(device: Device, replace: bool = False) -> None:
    """Make `device` visible to get(); a name already taken by another device (a built-in,
    "cpu" or one added before) raises ValueError unless `replace`."""
    builtin = device.name == "cpu" or device.name in _builtin()
    other = _EXTRA.get(device.name)
    if not replace and (builtin or (other is not None and other != device)):
        where = "a built-in device" if builtin else "a device added before"
        raise ValueError(f"device name {device.name!r} is already taken by {where}; rename "
                         "yours, or replace it explicitly (replace=True, `hardware --replace`)")
    _EXTRA[device.name] = device


def list_devices() -> list[str]:
    return [*_builtin(), *(n for n in _EXTRA if n not in _builtin() and n != "cpu"), "cpu"]


def get(name: str) -> Device:
    if name == "cpu" and name not in _EXTRA:
        return cpu_device()
    found = _EXTRA.get(name) or _builtin().get(name)
    if found is None:
        raise KeyError(f"unknown device {name!r}; valid: {', '.join(list_devices())}")
    return found


def spec_dtype(dtype: str) -> str:
    """Map a JAX dtype name to the spec table's key (float8_e4m3fn -> float8)."""
    for prefix in ("float8", "float4"):
        if dtype.startswith(prefix):
            return prefix
    return dtype


def ridge_point(device: Device, dtype: str | None = None, level: str | None = None) -> float:
    """FLOP/byte where the compute roof of `dtype` meets the bandwidth roof of `level`
    (defaults: bfloat16, else float16, else float32; the main memory)."""
    dtype = dtype or next(d for d in (*_PREFERRED, *device.peak_flops)
                          if d in device.peak_flops)
    level = level or device.main_memory
    if level not in device.memory_bandwidth:
        raise KeyError(f"{device.name}: no bandwidth for {level!r}; "
                       f"have {sorted(device.memory_bandwidth)}")
    compute = {"name": f"{device.name} {dtype}", "value": device.peak_flops[spec_dtype(dtype)]}
    memory = {"name": f"{device.name} {level}", "value": device.memory_bandwidth[level]}
    return roofline.ridge(compute, memory)["flops_per_byte"]


# ---------------------------------------------------------------------------- this machine

def _simd_f32_lanes(flags: dict[str, bool]) -> tuple[int, str]:
    if flags.get("avx512f"):
        return 16, "avx512f: 512-bit vectors, 16 f32 lanes"
    if flags.get("avx2") or flags.get("fma"):
        return 8, "avx2/fma: 256-bit vectors, 8 f32 lanes"
    if flags.get("asimd"):
        return 4, "asimd: 128-bit NEON vectors, 4 f32 lanes"
    return 4, "no wide-vector flag found: assumed 128-bit (SSE) vectors"


def _low_precision_rates(flags: dict[str, bool], f32_cycle: float) -> tuple[dict, list[str]]:
    """Per-core FLOP/cycle for bf16/int8/fp16 from the instructions the flags advertise."""
    rates, why = {}, []
    if flags.get("amx_bf16"):
        rates["bfloat16"] = 1024.0
        why.append("bfloat16: AMX-BF16 tile multiply, 1024 FLOP/cycle/core")
    elif flags.get("avx512_bf16"):
        rates["bfloat16"] = 2 * f32_cycle
        why.append("bfloat16: AVX512-BF16 VDPBF16PS, 2 products per f32 lane -> 2x f32")
    if flags.get("amx_int8"):
        rates["int8"] = 2048.0
        why.append("int8: AMX-INT8, 2048 OP/cycle/core")
    elif flags.get("avx512_vnni") or flags.get("avx_vnni"):
        rates["int8"] = 4 * f32_cycle
        why.append("int8: VNNI VPDPBUSD, 4 products per 32-bit lane -> 4x f32")
    if flags.get("avx512_fp16") or flags.get("amx_fp16"):
        rates["float16"] = 2 * f32_cycle
        why.append("float16: AVX512-FP16, 2x f32 lanes")
    return rates, why


def _mem_total_bytes() -> float | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return float(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


# Vector datapath per microarchitecture: FMA pipes per core and the width each pipe executes
# per cycle (a 512-bit instruction on a 256-bit datapath takes two cycles). Keyed by
# (vendor, family, model range or list) and, where a VM's model number misleads, by the ISA
# flags ("requires", "lacks"); sources are the vendors' optimisation guides.
INTEL = "GenuineIntel"
MICROARCH = (
    {"vendor": "AuthenticAMD", "family": 0x17, "models": (0x00, 0x2F), "name": "Zen / Zen+",
     "fma_pipes": 2, "datapath_bits": 128,
     "source": "AMD Software Optimization Guide for Family 17h (doc 55723): 2 x 128-bit FMA"},
    {"vendor": "AuthenticAMD", "family": 0x17, "models": (0x30, 0x9F), "name": "Zen 2",
     "fma_pipes": 2, "datapath_bits": 256,
     "source": "AMD Software Optimization Guide for Family 17h Models 30h+ (doc 56305): "
               "2 x 256-bit FMA"},
    {"vendor": "AuthenticAMD", "family": 0x19, "models": (0x00, 0x0F), "name": "Zen 3 (Milan)",
     "fma_pipes": 2, "datapath_bits": 256,
     "source": "AMD Software Optimization Guide for Family 19h (doc 56665): 2 x 256-bit FMA"},
    {"vendor": "AuthenticAMD", "family": 0x19, "models": (0x20, 0x5F), "name": "Zen 3 (client)",
     "fma_pipes": 2, "datapath_bits": 256,
     "source": "AMD Software Optimization Guide for Family 19h (doc 56665): 2 x 256-bit FMA"},
    {"vendor": "AuthenticAMD", "family": 0x19, "models": (0x10, 0x1F), "name": "Zen 4 (Genoa)",
     "fma_pipes": 2, "datapath_bits": 256,
     "source": "AMD Software Optimization Guide for Family 19h Models 10h+ (doc 57647): "
               "AVX-512 executed as two 256-bit halves"},
    {"vendor": "AuthenticAMD", "family": 0x19, "models": (0x60, 0xAF), "name": "Zen 4",
     "fma_pipes": 2, "datapath_bits": 256,
     "source": "AMD Software Optimization Guide for Family 19h Models 10h+ (doc 57647): "
               "AVX-512 executed as two 256-bit halves"},
    {"vendor": "AuthenticAMD", "family": 0x1A, "models": (0x00, 0x1F), "name": "Zen 5 (Turin)",
     "fma_pipes": 2, "datapath_bits": 512,
     "source": "AMD Software Optimization Guide for Family 1Ah (doc 58455): full 512-bit "
               "datapath on server and desktop parts"},
    {"vendor": "AuthenticAMD", "family": 0x1A, "models": (0x40, 0x4F), "name": "Zen 5 (desktop)",
     "fma_pipes": 2, "datapath_bits": 512,
     "source": "AMD Software Optimization Guide for Family 1Ah (doc 58455): full 512-bit "
               "datapath on server and desktop parts"},
    {"vendor": "AuthenticAMD", "family": 0x1A, "models": (0x20, 0x2F), "name": "Zen 5 (mobile)",
     "fma_pipes": 2, "datapath_bits": 256,
     "source": "AMD Software Optimization Guide for Family 1Ah (doc 58455): mobile parts "
               "execute 512-bit ops on a 256-bit datapath"},
    # Intel: the Optimization Reference Manual (doc 248966) per core. Intel's model numbers are
    # listed one by one; "lacks" names flags the part does not have, so a VM that reports a
    # client model number with a server part's flags (e.g. model 0xA7, Rocket Lake, with AMX
    # and AVX512-FP16) falls through to the entry its flags identify.
    {"vendor": INTEL, "family": 6, "model_list": (0x3C, 0x3F, 0x45, 0x46, 0x3D, 0x47, 0x4F,
                                                  0x56, 0x4E, 0x5E, 0x8E, 0x9E, 0xA5, 0xA6),
     "name": "Haswell to Comet Lake", "fma_pipes": 2, "datapath_bits": 256,
     "lacks": ("avx512f",),
     "source": "Intel 64 and IA-32 Architectures Optimization Reference Manual (doc 248966): "
               "two 256-bit FMA units (ports 0 and 1)"},
    {"vendor": INTEL, "family": 6, "model_list": (0x55,), "name": "Skylake-SP / Cascade Lake",
     "fma_pipes": 2, "datapath_bits": 512, "lacks": ("amx_tile",),
     "source": "Intel Optimization Reference Manual (doc 248966): a 512-bit FMA on ports 0+1 "
               "and one on port 5 (Xeon Gold 6000 / Platinum; Bronze, Silver and some Gold "
               "5000 parts have only the first, so for them this is an upper bound)"},
    {"vendor": INTEL, "family": 6, "model_list": (0x6A, 0x6C), "name": "Ice Lake-SP",
     "fma_pipes": 2, "datapath_bits": 512, "lacks": ("amx_tile",),
     "source": "Intel Optimization Reference Manual (doc 248966): two 512-bit FMA units "
               "(ports 0+1 fused, port 5)"},
    {"vendor": INTEL, "family": 6, "model_list": (0x7D, 0x7E, 0x8C, 0x8D, 0xA7),
     "name": "Ice Lake / Tiger Lake / Rocket Lake (client)", "fma_pipes": 2,
     "datapath_bits": 256, "lacks": ("amx_tile", "avx512_fp16"),
     "source": "Intel Optimization Reference Manual (doc 248966): client Sunny/Willow/Cypress "
               "Cove has one 512-bit FMA (ports 0+1 fused), i.e. two 256-bit FMAs' worth"},
    {"vendor": INTEL, "family": 6, "model_list": (0x8F, 0xCF, 0xAD, 0xAE),
     "name": "Sapphire / Emerald / Granite Rapids", "fma_pipes": 2, "datapath_bits": 512,
     "source": "Intel Optimization Reference Manual (doc 248966): Golden Cove server cores have "
               "two 512-bit FMA units (ports 0+1 fused, port 5)"},
    {"vendor": INTEL, "family": 6, "requires": ("amx_tile",),
     "name": "Sapphire Rapids or later (identified by its AMX tiles)", "fma_pipes": 2,
     "datapath_bits": 512,
     "source": "Intel Optimization Reference Manual (doc 248966): every Xeon with AMX (Sapphire "
               "Rapids and later) has two 512-bit FMA units per core"},
)


def _model_matches(entry: dict, model: int | None) -> bool:
    if "requires" in entry and "models" not in entry and "model_list" not in entry:
        return True  # identified by its flags alone
    if model is None:
        return False
    if "model_list" in entry:
        return model in entry["model_list"]
    lo, hi = entry["models"]
    return lo <= model <= hi


def _flags_match(entry: dict, flags: dict | None) -> bool:
    if flags is None:
        return "requires" not in entry
    return (all(flags.get(f) for f in entry.get("requires", ()))
            and not any(flags.get(f) for f in entry.get("lacks", ())))


def microarchitecture(cpu_id: dict, flags: dict | None = None) -> dict | None:
    """The MICROARCH entry for {vendor, family, model} whose flag conditions `flags` meet
    (without flags: the model number's entry, flag-identified entries excluded), or None."""
    for entry in MICROARCH:
        if (cpu_id.get("vendor") == entry["vendor"] and cpu_id.get("family") == entry["family"]
                and _model_matches(entry, cpu_id.get("model")) and _flags_match(entry, flags)):
            return entry
    return None


def _contradicted(cpu_id: dict, flags: dict) -> list[str]:
    """Why the part's model number was not believed: entries it names whose flags disagree."""
    out = []
    for entry in MICROARCH:
        if (cpu_id.get("vendor") == entry["vendor"] and cpu_id.get("family") == entry["family"]
                and ("models" in entry or "model_list" in entry)
                and _model_matches(entry, cpu_id.get("model"))
                and not _flags_match(entry, flags)):
            bad = [f for f in entry.get("lacks", ()) if flags.get(f)]
            out.append(f"model {cpu_id['model']:#x} is {entry['name']}, which lacks "
                       f"{', '.join(bad)}; this CPU advertises them (a VM's model number), so "
                       f"the flags identify the part")
    return out


def _datapath(flags: dict, cpu_id: dict) -> tuple[int, int, list[str], bool]:
    """(FMA pipes, f32 lanes per pipe per cycle, why, known) from the flags and the table."""
    lanes, lanes_why = _simd_f32_lanes(flags)
    arch = microarchitecture(cpu_id, flags)
    doubts = _contradicted(cpu_id, flags)
    if arch is None:
        return 2, lanes, [lanes_why, *doubts, "unknown microarchitecture: 2 FMA pipes of the "
                          "widest advertised vector assumed (an upper bound)"], False
    path = arch["datapath_bits"] // 32
    why = [lanes_why, *doubts, f"{arch['name']}: {arch['fma_pipes']} FMA pipes x "
           f"{arch['datapath_bits']}-bit datapath ({arch['source']})"]
    return arch["fma_pipes"], min(lanes, path), why, True


@functools.lru_cache(maxsize=1)
def cpu_device() -> Device:
    """Theoretical CPU peak: usable cores x FMA pipes x f32 lanes x 2 FLOP x clock.

    The pipes and the lanes each pipe executes per cycle come from MICROARCH (keyed by
    vendor/family/model, from the vendors' optimisation guides) capped by the widest vector
    the ISA flags advertise; an unknown part assumes 2 full-width pipes and is labelled an
    upper bound. The clock comes from sysinfo.clock_hz (cpufreq max, else measured, else
    nominal). DRAM bandwidth is not derivable from what a VM exposes, so it is left out.
    """
    info = sysinfo.read_cpuinfo()
    flags = sysinfo.isa_flags(info)
    cores = len(sysinfo.affinity())
    hz, hz_how = sysinfo.clock_hz()
    hz = hz or 1e9
    cpu_id = sysinfo.cpu_family(info)
    fma_pipes, lanes, why, known = _datapath(flags, cpu_id)
    f32_cycle = fma_pipes * lanes * 2.0
    low, low_why = _low_precision_rates(flags, f32_cycle)
    per_cycle = {"float32": f32_cycle, **low}
    arch = microarchitecture(cpu_id, flags)
    derivation = {
        "formula": "cores x FLOP/cycle/core x clock; f32 FLOP/cycle = FMA pipes x lanes x 2",
        "cores": cores, "fma_pipes": fma_pipes, "f32_lanes": lanes, "clock_hz": hz,
        "clock_source": hz_how, "flop_per_cycle_per_core": per_cycle,
        "microarchitecture": arch["name"] if arch else None,
        "why": [*why, *low_why], "cpu_id": cpu_id,
        "bound": "theoretical peak" if known else "upper bound (unknown microarchitecture)",
    }
    notes = ["Theoretical peak from the datapath table, not a vendor figure" if known else
             "Upper bound: this part is not in the datapath table (hardware.MICROARCH)",
             "No DRAM bandwidth ceiling: a VM does not expose the memory channels and speed."]
    return Device(
        name="cpu", vendor=cpu_id.get("vendor") or "unknown", kind="cpu",
        peak_flops={k: cores * v * hz for k, v in per_cycle.items()},
        memory_bandwidth={}, main_memory=roofline.DRAM, memory_bytes=_mem_total_bytes(),
        sources=(f"derived on this machine from /proc/cpuinfo flags, sched_getaffinity and "
                 f"the clock ({hz_how}); model {sysinfo.cpu_model(info)!r}",
                 *([arch["source"]] if arch else [])),
        notes=tuple(notes), derivation=derivation)


_ALIASES = (
    (r"H100.*(SXM|HBM3)|^NVIDIA H100$", "H100 SXM"), (r"H200", "H200 SXM"),
    (r"GB200", "GB200 (per GPU)"), (r"B200", "B200"), (r"MI300X", "MI300X"),
    (r"MI325X", "MI325X"), (r"MI355X", "MI355X"), (r"TPU v5 ?lite|TPU v5e", "TPU v5e"),
    (r"TPU v5p|TPU v5$", "TPU v5p"), (r"TPU v6", "TPU v6e"), (r"TPU7x|TPU v7", "TPU7x (Ironwood)"),
)


def device_for_environment(env: dict) -> Device | None:
    """The spec entry for a harness.environment() block: the computed CPU entry on the CPU
    backend, a vendor entry matched on device_kind otherwise, None if nothing matches."""
    if env.get("backend") == "cpu":
        return cpu_device()
    kind = env.get("device_kind") or ""
    for pattern, name in _ALIASES:
        if re.search(pattern, kind, flags=re.IGNORECASE):
            return get(name)
    return None
