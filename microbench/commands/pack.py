"""`pack`: one accelerator run's results as one .tar.gz (what `unpack` reads).

`python -m microbench pack RUN_DIR --out DIR` packs the files of RUN_DIR that `unpack` keeps
(MEMBERS: the main job's peaks.json and phases.json, the Pallas timings, the versions and the
log) into DIR/accelerator-<machine>.tar.gz, the machine named by the main job's environment
(machines.slug), written whole or not at all. scripts/accelerator_run.sh ends with it.
"""

from __future__ import annotations

import os
import tarfile
import tempfile
from pathlib import Path

# Paths inside a run folder (and the archive): the results and what says how they were made.
MEMBERS = ("microbench/peaks.json", "microbench/phases.json", "pallas/pallas.json",
           "versions.txt", "log.txt")
PREFIX = "accelerator-"


def add_args(p) -> None:
    p.add_argument("run_dir", help="the folder scripts/accelerator_run.sh wrote (microbench/, "
                                   "pallas/, versions.txt, log.txt)")
    p.add_argument("--out", required=True, help="folder of the .tar.gz")


def machine_of(run_dir: Path) -> str:
    """The slug of the run's main job (its peaks.json), or 'unknown-machine' without one."""
    from microbench import machines
    from microbench.files import read_json

    peaks = run_dir / "microbench" / "peaks.json"
    slug = machines.result_machine(read_json(peaks)) if peaks.is_file() else None
    return slug or "unknown-machine"


def pack(run_dir, out_dir) -> Path:
    """Write out_dir/accelerator-<machine>.tar.gz from run_dir's MEMBERS that exist."""
    run_dir, out_dir = Path(run_dir), Path(out_dir)
    present = [m for m in MEMBERS if (run_dir / m).is_file()]
    if not present:
        raise ValueError(f"{run_dir}: none of {', '.join(MEMBERS)} in it; nothing to pack")
    out_dir.mkdir(parents=True, exist_ok=True)
    target = out_dir / f"{PREFIX}{machine_of(run_dir)}.tar.gz"
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", dir=out_dir)
    os.close(fd)
    try:
        with tarfile.open(tmp, "w:gz") as tar:
            for m in present:
                tar.add(run_dir / m, arcname=m, recursive=False)
        os.chmod(tmp, 0o644)
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return target


def run(args) -> int:
    print(f"wrote {pack(args.run_dir, args.out)}")
    return 0
