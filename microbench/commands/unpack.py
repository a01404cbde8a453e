"""`unpack`: an accelerator run's .tar.gz (from `pack`) into figures/data/<machine>/, drawn.

`python -m microbench unpack FILE` reads only the archive's known members (pack.MEMBERS:
regular files, each at most MAX_MEMBER_BYTES, no path of its own), checks the results
(schema.validate_result) and that they come from one machine, writes them into
figures/data/<machine>/ as one set (machine from the environment block: machines.slug) and
draws that folder's figures into figures/<machine>/, beside the CPU's. No JAX.

Drawn as every main job's folder is (`plots.saved.draw_roofline`): the summary lists what
the path skipped, and the memory hierarchy figure is left out (the device path measures none).
"""

from __future__ import annotations

import json
import tarfile
from pathlib import Path

from microbench.commands.pack import MEMBERS

MAX_MEMBER_BYTES = 64 * 2**20


def add_args(p) -> None:
    p.add_argument("archive", help="the .tar.gz written by `pack` (scripts/accelerator_run.sh)")
    p.add_argument("--data", default=None,
                   help="root of the saved results (default: the checkout's figures/data)")
    p.add_argument("--figures", default=None,
                   help="root of the figures (default: the data root's parent, figures/)")


def read_members(archive) -> dict[str, bytes]:
    """{member: bytes} of the archive's known members; ValueError naming the file otherwise."""
    try:
        tar = tarfile.open(archive, "r:gz")
    except (OSError, tarfile.TarError) as e:
        raise ValueError(f"{archive}: not a readable .tar.gz ({e})") from None
    out = {}
    with tar:
        for info in tar.getmembers():
            if info.name not in MEMBERS:
                continue  # figures and anything else are redrawn or ignored, never extracted
            if not info.isfile() or info.size > MAX_MEMBER_BYTES:
                raise ValueError(f"{archive}: member {info.name!r} is not a regular file of at "
                                 f"most {MAX_MEMBER_BYTES >> 20} MiB")
            out[info.name] = tar.extractfile(info).read()
    if "microbench/peaks.json" not in out:
        raise ValueError(f"{archive}: no microbench/peaks.json in it (members: "
                         f"{', '.join(MEMBERS)})")
    return out


def _results(members: dict[str, bytes], archive) -> dict[str, dict]:
    from microbench.schema import validate_result

    out = {}
    for name in ("microbench/peaks.json", "microbench/phases.json"):
        if name in members:
            try:
                out[Path(name).name] = validate_result(json.loads(members[name]))
            except (ValueError, UnicodeDecodeError) as e:
                raise ValueError(f"{archive}: {name}: {e}") from None
    return out


def unpack(archive, data_root=None, figures_root=None) -> tuple[Path, list[Path]]:
    """(figures/data/<machine>, the files written there and drawn from it)."""
    from microbench import machines
    from microbench.files import output_set

    data_root = Path(data_root) if data_root else machines.DATA_ROOT
    figures_root = Path(figures_root) if figures_root else data_root.parent
    members = read_members(archive)
    slug = machines.check_one_machine(_results(members, archive), str(archive))
    if slug is None:
        raise ValueError(f"{archive}: its peaks.json records no machine (environment block)")
    dest = data_root / slug
    with output_set(dest) as tmp:
        for name, data in members.items():
            (tmp / Path(name).name).write_bytes(data)
    written = [dest / Path(n).name for n in members]
    from microbench.plots.saved import draw_roofline

    return dest, written + draw_roofline(figures_root / slug, dest)


def run(args) -> int:
    dest, files = unpack(args.archive, args.data, args.figures)
    for f in files:
        print(f"wrote {f}")
    print(f"unpacked into {dest}")
    return 0
