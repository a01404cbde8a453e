"""Which machine made a result, named once, and one machine per figure.

A result's environment block (harness.environment) records the CPU's vendor, family and model
(`cpu_id`), its core count, the JAX backend and, on an accelerator, the device. From it:
`describe` is the machine as a caption names it ("AMD EPYC, family 25 model 17 (Zen 4
(Genoa)), 2 cores"), `slug` the folder name its committed results live under
(`figures/data/<slug>/`, the figures in `figures/<slug>/`): two runs with the same slug are the
same kind of machine (microarchitecture, core count, accelerator), so their numbers may sit on
one figure; two different slugs may not. A run of an accelerator's code path forced on a CPU
(environment `forced_platform`, microbench.roofs.platform) is the CPU's, named as forced in
both, so it never shares a folder with the CPU's own results nor claims the accelerator.
`check_one_machine` refuses a set of results that mixes machines, including a roofs
cross-reference (a study predicting with another file's roofs) taken from a different machine.
No JAX: figures redraw wherever matplotlib runs.
"""

from __future__ import annotations

import re
from pathlib import Path

from microbench import hardware

# The committed results of the checkout this package runs from (figures/data/<machine>/).
DATA_ROOT = Path(__file__).resolve().parents[1] / "figures" / "data"


def _words(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")


def microarchitecture_name(env: dict) -> str | None:
    """'Zen 4 (Genoa)' from an environment block's cpu_id (and ISA flags), or None."""
    cpu = env.get("cpu_id") or {}
    flags = env.get("isa_flags") if isinstance(env.get("isa_flags"), dict) else None
    arch = hardware.microarchitecture(cpu, flags) if cpu else None
    return arch["name"] if arch else None


def _accelerator(env: dict) -> bool:
    return env.get("backend") not in (None, "cpu") and bool(env.get("device_kind"))


def describe(env: dict | None) -> str:
    """'<CPU model>, family F model M (<microarchitecture>), N cores' (on an accelerator:
    'D x <device kind> on ...'); 'machine not recorded' without an environment block."""
    env = env or {}
    if not env.get("cpu_model") and not env.get("cpu_id") and not _accelerator(env):
        return "machine not recorded"
    cpu = env.get("cpu_id") or {}
    where = f", family {cpu['family']} model {cpu['model']}" if cpu.get("family") else ""
    arch = microarchitecture_name(env)
    name = f"{env.get('cpu_model') or 'unknown CPU'}{where}{f' ({arch})' if arch else ''}"
    if env.get("cpu_count"):
        name += f", {env['cpu_count']} cores"
    if _accelerator(env):
        name = f"{env.get('device_count') or 1} x {env['device_kind']} on {name}"
    if env.get("forced_platform"):
        name += f" ({env['forced_platform']} code path forced on this CPU: no " \
                f"{env['forced_platform']} measured)"
    return name


def slug(env: dict | None) -> str | None:
    """The folder name of a machine: 'amd-zen-4-genoa-2cpu', 'nvidia-h100-80gb-hbm3-x1'
    ('amd-zen-4-genoa-2cpu-forced-gpu-path' for the GPU path forced on that CPU);
    None for a result without an environment block (computed on paper, no machine)."""
    env = env or {}
    if _accelerator(env):
        return f"{_words(env['device_kind'])}-x{env.get('device_count') or 1}"
    cpu = env.get("cpu_id") or {}
    if not cpu and not env.get("cpu_model"):
        return None
    vendor = {"AuthenticAMD": "amd", "GenuineIntel": "intel"}.get(cpu.get("vendor"),
                                                                 _words(cpu.get("vendor") or "cpu"))
    arch = microarchitecture_name(env)
    core = _words(arch) if arch else f"family-{cpu.get('family')}-model-{cpu.get('model')}"
    path = env.get("forced_platform")
    forced = f"-forced-{_words(path)}-path" if path else ""
    return f"{vendor}-{core}-{env.get('cpu_count') or '?'}cpu{forced}"


def this_machine() -> str | None:
    """The slug of the machine this process runs on (JAX's default backend and device, the
    CPU from /proc/cpuinfo): what a study compares a saved file's machine with."""
    import os

    import jax

    from microbench import sysinfo

    info = sysinfo.read_cpuinfo()
    dev = jax.devices()[0]
    return slug({"backend": jax.default_backend(), "device_kind": dev.device_kind,
                 "device_count": jax.device_count(), "cpu_model": sysinfo.cpu_model(info),
                 "cpu_id": sysinfo.cpu_family(info), "isa_flags": sysinfo.isa_flags(info),
                 "cpu_count": os.cpu_count()})


def result_machine(result: dict) -> str | None:
    """The slug of a result file's own environment block (None when it records none)."""
    return slug(result.get("environment")) if isinstance(result, dict) else None


def roofs_machine(result: dict) -> str | None:
    """The machine of the roofs a study predicted with (its `roofs` block), when recorded."""
    roofs = result.get("roofs") if isinstance(result, dict) else None
    return roofs.get("machine") if isinstance(roofs, dict) else None


def check_one_machine(results: dict[str, dict], where: str) -> str | None:
    """The one machine of {file name: result} (None when no file records one); ValueError
    naming the files when two machines are mixed, or when a study's roofs came from a machine
    other than its own."""
    seen: dict[str, str] = {}
    for name, result in sorted(results.items()):
        own = result_machine(result)
        if own is not None:
            seen.setdefault(own, name)
        roofs = roofs_machine(result)
        if roofs is not None and own is not None and roofs != own:
            raise ValueError(f"{where}/{name}: measured on {own} but predicted with roofs "
                             f"measured on {roofs}; a figure shows one machine: re-run it with "
                             "--peaks of the same machine")
    if len(seen) > 1:
        files = ", ".join(f"{name} ({m})" for m, name in seen.items())
        raise ValueError(f"{where}: results from {len(seen)} machines ({files}); a figure shows "
                         "one machine: keep each machine's files in its own folder "
                         "(figures/data/<machine>/)")
    return next(iter(seen), None)


def machine_folders(root: str | Path) -> list[Path]:
    """The folders of saved results under `root`: `root` itself when it holds result files
    (one machine's folder, e.g. a study's --out), else each subfolder that does."""
    root = Path(root)
    if any(root.glob("*.json")):
        return [root]
    return sorted(p for p in root.iterdir() if p.is_dir() and any(p.glob("*.json"))) \
        if root.is_dir() else []


def data_folder(*names: str, root: str | Path = DATA_ROOT, machine: str | None = None) -> Path:
    """The committed folder under `root` holding every NAME.json of `names` (the one named
    `machine` when given, else the first in name order): what a notebook reads its saved runs
    from, so the files it puts side by side come from one machine. ValueError when none does."""
    folders = [f for f in machine_folders(root)
               if all((f / f"{n}.json").is_file() for n in names)
               and (machine is None or f.name == machine)]
    if not folders:
        wanted = ", ".join(f"{n}.json" for n in names)
        raise ValueError(f"{root}: no machine folder holds {wanted}"
                         + (f" for machine {machine!r}" if machine else ""))
    return folders[0]


def figures_folder(*names: str, root: str | Path = DATA_ROOT, machine: str | None = None) -> Path:
    """figures/<machine>/: where `figures` draws the folder that data_folder(*names) finds."""
    return Path(root).parent / data_folder(*names, root=root, machine=machine).name


def peaks_here(path: str | Path | None = None) -> Path | None:
    """This machine's peaks.json: `path` when given (ValueError if missing, or measured on
    another kind of machine), else the main job's results/microbench/peaks.json, else the
    committed figures/data/<this machine>/peaks.json, each only when this kind of machine
    measured it; None when there is none. What a study or notebook predicts this machine with:
    another machine's roofs would put two machines on one figure."""
    from microbench.files import read_json

    here = this_machine()
    if path is not None:
        if not Path(path).is_file():
            raise ValueError(f"--peaks {path}: no such file")
        theirs = result_machine(read_json(path))
        if theirs is not None and theirs != here:
            raise ValueError(f"--peaks {path}: measured on {theirs}, and this machine is "
                             f"{here}; a study predicts with its own machine's roofs")
        return Path(path)
    for candidate in (Path("results/microbench/peaks.json"), DATA_ROOT / str(here) / "peaks.json"):
        if candidate.is_file() and result_machine(read_json(candidate)) == here:
            return candidate
    return None
