"""Build the native kernels once per machine and register them with XLA's FFI.

The C++ sources beside this file are compiled on first use with the C++ compiler on PATH
(`CXX`, else g++, else c++) against the FFI headers that ship in jaxlib
(`jax.ffi.include_dir()`), with `-O3 -march=native`: the ISA is the machine's own, so the
library is cached under a key of the source, the flags, the compiler, jaxlib's version and
the CPU's model and flags (a home directory shared by two kinds of CPU gets two builds).
The cache lives in `$REFMODEL_KERNEL_CACHE`, else `$XDG_CACHE_HOME/inference-lab/kernels`, else
`~/.cache/inference-lab/kernels`; a build is written to a temporary name and renamed, so a
half-written library is never loaded. `python -m refmodel kernels` builds and checks it.

No compiler, or a failed build, is not an error here: `load()` returns False and `why_not()`
says why; the model then runs on backend="xla" (the default), and asking for
`backend="native"` raises with that reason.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import platform
import shutil
import subprocess
import tempfile
from pathlib import Path

import jax

HERE = Path(__file__).parent
SOURCES = ("rows.cc", "qdot.cc", "pages.cc", "attend.cc", "attend_rows.cc", "latent.cc",
           "sparse.cc", "recurrence.cc")
HEADERS = ("common.h", "panels.h")  # hashed with the sources: a change rebuilds
FLAGS = ("-O3", "-march=native", "-ffp-contract=fast", "-std=c++17", "-fPIC", "-shared",
         "-fno-math-errno")
# symbol in the library -> the FFI target name it is registered under
TARGETS = {"RowsF32": "refmodel_rows_f32", "RowsI8": "refmodel_rows_int8",
           "RowsAtF32": "refmodel_rows_at_f32", "RowsAtI8": "refmodel_rows_at_int8",
           "RowsGroupsF32": "refmodel_rows_groups_f32",
           "RowsGroupsI8": "refmodel_rows_groups_int8",
           "QRowsI8": "refmodel_qrows_int8", "QRowsI4": "refmodel_qrows_int4",
           "QRowsManyI8": "refmodel_qrows_many_int8", "QRowsManyI4": "refmodel_qrows_many_int4",
           "GatherPagesAny": "refmodel_gather_pages",
           "PagedAttentionF32": "refmodel_paged_attention_f32",
           "AttendRowsF32": "refmodel_attend_rows_f32",
           "AttendLatentF32": "refmodel_attend_latent_f32",
           "SparseAttendF32": "refmodel_sparse_attend_f32",
           "StateStepF32": "refmodel_state_step_f32"}

_why_not: list[str] = []


def compiler() -> str | None:
    for name in (os.environ.get("CXX"), "g++", "c++", "clang++"):
        if name and shutil.which(name):
            return shutil.which(name)
    return None


def cache_dir() -> Path:
    if os.environ.get("REFMODEL_KERNEL_CACHE"):
        return Path(os.environ["REFMODEL_KERNEL_CACHE"])
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "inference-lab" / "kernels"


def _cpu_id() -> str:
    """The CPU's model name and ISA flags (what -march=native compiles for)."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return platform.processor() or platform.machine()
    keep = [line for line in text.splitlines()
            if line.startswith(("model name", "flags", "Features", "CPU part"))]
    return "\n".join(sorted(set(keep)))


def _version(cxx: str) -> str:
    out = subprocess.run([cxx, "--version"], capture_output=True, text=True, timeout=60)
    return out.stdout.splitlines()[0] if out.stdout else cxx


def library_path(cxx: str) -> Path:
    import jaxlib

    h = hashlib.sha256()
    for name in SOURCES + HEADERS:
        h.update((HERE / name).read_bytes())
    for part in (*FLAGS, _version(cxx), jaxlib.__version__, _cpu_id()):
        h.update(part.encode())
    return cache_dir() / f"refmodel_kernels_{h.hexdigest()[:16]}.so"


def build(cxx: str) -> Path:
    """Compile (if not cached) and return the library's path; raises RuntimeError on failure."""
    path = library_path(cxx)
    if path.exists():
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(suffix=".so", dir=path.parent)
    os.close(fd)
    cmd = [cxx, *FLAGS, "-isystem", jax.ffi.include_dir(),
           *(str(HERE / s) for s in SOURCES), "-o", tmp]
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
        if out.returncode != 0:
            raise RuntimeError(f"`{' '.join(cmd)}` failed ({out.returncode}):\n"
                               f"{out.stderr[-2000:]}")
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)
    return path


@functools.cache
def library() -> ctypes.CDLL | None:
    """Build, load and register the kernels for XLA:CPU, once: the loaded library, or None
    (see `why_not`) if impossible."""
    cxx = compiler()
    if cxx is None:
        _why_not.append("no C++ compiler on PATH (set CXX, or install g++ or clang++)")
        return None
    try:
        lib = ctypes.cdll.LoadLibrary(str(build(cxx)))
    except (RuntimeError, OSError, subprocess.TimeoutExpired) as e:
        _why_not.append(f"building the native kernels failed: {e}")
        return None
    for symbol, target in TARGETS.items():
        jax.ffi.register_ffi_target(target, jax.ffi.pycapsule(getattr(lib, symbol)),
                                    platform="cpu")
    return lib


def load() -> bool:
    """The kernels are built, loaded and registered (`library`); False (see `why_not`) if
    impossible."""
    return library() is not None


def require() -> None:
    """`load()`, or a RuntimeError saying why the kernels cannot run here (`why_not`)."""
    if not load():
        raise RuntimeError(f"the native kernels are not available: {why_not()}")


def why_not() -> str | None:
    """Why `load()` returned False; None when the kernels are loaded (or not yet tried)."""
    return _why_not[-1] if _why_not else None
