"""What the operating system says about the machine: CPU model, ISA flags, caches, clock.

Everything here reads `/proc/cpuinfo`, `/sys/devices/system/cpu/...` and `os.sched_getaffinity`
(Linux); on other systems each reader returns None or an empty value rather than guessing.
The clock reader follows the order of trust used by likwid and the ERT: the kernel's cpufreq
maximum if the OS exposes it, else two measured dependent chains that must agree (register adds,
one per cycle, and imuls, one per 3 cycles, on every x86 core of the last decade; compiled on the
fly with gcc; not adds of an immediate, which Golden Cove folds at rename), else the nominal
`cpu MHz` line, which under a hypervisor is the TSC rate and may be below the boost clock.
"""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

CPU_SYS = Path("/sys/devices/system/cpu")

# ISA flags worth recording for dense linear algebra (x86 names as /proc/cpuinfo spells them,
# plus the Arm ones).
ISA_FLAGS = (
    "avx", "avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vl", "avx512_bf16",
    "avx512_fp16", "avx512_vnni", "avx_vnni", "amx_tile", "amx_bf16", "amx_int8", "amx_fp16",
    "asimd", "sve", "sve2", "sme", "bf16", "i8mm",
)


def read_cpuinfo(path: str | Path = "/proc/cpuinfo") -> dict[str, str]:
    """First processor block of /proc/cpuinfo as {key: value}; {} when absent."""
    try:
        text = Path(path).read_text()
    except OSError:
        return {}
    out: dict[str, str] = {}
    for line in text.splitlines():
        if not line.strip():
            if out:
                break
            continue
        key, _, value = line.partition(":")
        out.setdefault(key.strip(), value.strip())
    return out


def cpu_model(info: dict[str, str] | None = None) -> str | None:
    info = read_cpuinfo() if info is None else info
    return info.get("model name") or info.get("Hardware") or info.get("CPU part")


def isa_flags(info: dict[str, str] | None = None) -> dict[str, bool]:
    """{flag: present} for the flags in ISA_FLAGS (x86 'flags' or Arm 'Features' line)."""
    info = read_cpuinfo() if info is None else info
    present = set((info.get("flags") or info.get("Features") or "").split())
    return {f: f in present for f in ISA_FLAGS}


def cpu_family(info: dict[str, str] | None = None) -> dict[str, int | str | None]:
    info = read_cpuinfo() if info is None else info

    def _int(key):
        try:
            return int(info[key], 0)
        except (KeyError, ValueError):
            return None

    return {"vendor": info.get("vendor_id"), "family": _int("cpu family"), "model": _int("model")}


def affinity() -> list[int]:
    """CPUs this process may run on (all online CPUs where sched_getaffinity is missing)."""
    if hasattr(os, "sched_getaffinity"):
        return sorted(os.sched_getaffinity(0))
    return list(range(os.cpu_count() or 1))


def _parse_size(text: str) -> int | None:
    text = text.strip().upper()
    mult = {"K": 1024, "M": 1024**2, "G": 1024**3}
    try:
        if text and text[-1] in mult:
            return int(text[:-1]) * mult[text[-1]]
        return int(text)
    except ValueError:
        return None


def _count_cpus(cpu_list: str) -> int:
    n = 0
    for part in cpu_list.strip().split(","):
        if "-" in part:
            lo, hi = part.split("-")
            n += int(hi) - int(lo) + 1
        elif part:
            n += 1
    return n


def cache_sizes(root: Path = CPU_SYS / "cpu0" / "cache") -> list[dict]:
    """Data/unified caches of cpu0: [{level, name, size_bytes, shared_by_cpus}], small first."""
    out = []
    for idx in sorted(root.glob("index*")):
        try:
            kind = (idx / "type").read_text().strip()
            if kind == "Instruction":
                continue
            level = int((idx / "level").read_text())
            size = _parse_size((idx / "size").read_text())
            shared = _count_cpus((idx / "shared_cpu_list").read_text())
        except (OSError, ValueError):
            continue
        if size:
            out.append({"level": level, "name": f"L{level}", "size_bytes": size,
                        "shared_by_cpus": shared})
    return sorted(out, key=lambda c: c["level"])


def mem_available_bytes(path: str | Path = "/proc/meminfo") -> float | None:
    """MemAvailable from /proc/meminfo (bytes), or None where there is no such file."""
    try:
        for line in Path(path).read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return float(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def aggregate_cache_bytes(caches: list[dict], n_cpus: int) -> list[tuple[str, int]]:
    """[(name, bytes)] that n_cpus threads can hold together: a private cache counts once per
    core used, a shared one once per sharing group."""
    out = []
    for c in caches:
        groups = max(1, -(-n_cpus // max(1, c["shared_by_cpus"])))
        out.append((c["name"], c["size_bytes"] * groups))
    return out


# Two dependent chains whose latency is the same on every x86 core of the last decade: an add
# of two registers (1 cycle) and a 64-bit imul (3 cycles). Not an add of an immediate: Golden
# Cove and later fold chains of those at rename (several adds per cycle: no clock at all).
# Both must agree within 10%, else no clock is claimed.
_CLOCK_C = r"""
#include <stdio.h>
#include <stdint.h>
#include <time.h>
static double now(void){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);
  return t.tv_sec+1e-9*t.tv_nsec;}
#define ADD8 "add %1,%0\n\tadd %1,%0\n\tadd %1,%0\n\tadd %1,%0\n\t" \
             "add %1,%0\n\tadd %1,%0\n\tadd %1,%0\n\tadd %1,%0"
#define MUL8 "imul %1,%0\n\timul %1,%0\n\timul %1,%0\n\timul %1,%0\n\t" \
             "imul %1,%0\n\timul %1,%0\n\timul %1,%0\n\timul %1,%0"
int main(void){uint64_t x=1,one=1,three=3;long n=4000000;double add=1e9,mul=1e9;
  __asm__ volatile("":"+r"(one),"+r"(three));
  for(int r=0;r<300;r++){double t0=now();
    for(long i=0;i<n;i+=8){__asm__ volatile(ADD8:"+r"(x):"r"(one));}
    double t=now()-t0; if(t<add) add=t;
    t0=now();
    for(long i=0;i<n;i+=8){__asm__ volatile(MUL8:"+r"(x):"r"(three));}
    t=now()-t0; if(t<mul) mul=t;}
  printf("%.0f %.0f\n", n/add, 3*n/mul); return (int)(x==0);}
"""


def _measured_clock_hz() -> float | None:
    """Clock from dependent chains of register adds (1 cycle) and imuls (3 cycles); x86 with
    gcc only; None unless the two agree within 10%."""
    gcc = shutil.which("gcc")
    if gcc is None or os.uname().machine not in ("x86_64", "i686"):
        return None
    with tempfile.TemporaryDirectory() as tmp:
        src, exe = Path(tmp) / "clk.c", Path(tmp) / "clk"
        src.write_text(_CLOCK_C)
        try:
            subprocess.run([gcc, "-O2", str(src), "-o", str(exe)], check=True,
                           capture_output=True, timeout=60)
            res = subprocess.run([str(exe)], check=True, capture_output=True, text=True,
                                 timeout=60)
            return _agreed_clock(*(float(v) for v in res.stdout.split()))
        except (subprocess.SubprocessError, OSError, ValueError, TypeError):
            return None


def _agreed_clock(add_hz: float, mul_hz: float) -> float | None:
    """The faster of two chain clocks if they agree within 10% (a chain can only run slower
    than the clock, by interruption), else None."""
    if min(add_hz, mul_hz) <= 0 or max(add_hz, mul_hz) > 1.1 * min(add_hz, mul_hz):
        return None
    return max(add_hz, mul_hz)


@functools.lru_cache(maxsize=1)
def clock_hz() -> tuple[float | None, str]:
    """(Hz, how it was found), trying cpufreq max, then a measurement, then cpuinfo MHz."""
    override = os.environ.get("MICROBENCH_CPU_HZ")
    if override:
        return float(override), "MICROBENCH_CPU_HZ environment variable"
    try:
        khz = int((CPU_SYS / "cpu0" / "cpufreq" / "cpuinfo_max_freq").read_text())
        return khz * 1e3, "cpufreq cpuinfo_max_freq (maximum boost the OS allows)"
    except (OSError, ValueError):
        pass
    t0 = time.perf_counter()
    hz = _measured_clock_hz()
    if hz:
        return hz, (f"measured: dependent chains of register adds (1/cycle) and imuls (1 per 3 "
                    f"cycles), fastest of 300 runs ({time.perf_counter() - t0:.1f} s incl. gcc)")
    mhz = read_cpuinfo().get("cpu MHz")
    if mhz:
        return float(mhz) * 1e6, ("/proc/cpuinfo 'cpu MHz' (nominal; under a hypervisor the "
                                  "TSC rate, possibly below the boost clock)")
    return None, "unknown"
