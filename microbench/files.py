"""Result files written whole or not at all, without importing JAX.

Every writer serialises first, writes a temporary file in the target's folder, fsyncs it and
`os.replace`s it in, so a reader never sees a half-written file and a failure leaves nothing
behind. `check_writable_dir` is called before a long measurement, so a bad `--out` fails in a
second rather than after minutes of work.
"""

from __future__ import annotations

import csv
import io
import json
import os
import tempfile
from collections.abc import Sequence
from pathlib import Path


def check_writable_dir(path: str | Path) -> Path:
    """Make sure results can be written into folder `path` before spending minutes measuring:
    create it if needed, then write and remove a probe file. Raises ValueError naming it."""
    path = Path(path)
    if path.exists() and not path.is_dir():
        raise ValueError(f"output folder {str(path)!r}: exists and is not a folder")
    try:
        path.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=".write-check.", dir=path)
        os.close(fd)
        os.unlink(tmp)
    except OSError as e:
        raise ValueError(f"output folder {str(path)!r}: not writable ({e.strerror})") from None
    return path


def write_text_atomic(path: str | Path, text: str) -> Path:
    """Write to a temporary file in the target's folder, fsync, then os.replace it in."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    readable(tmp)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def readable(path: str | Path) -> None:
    """Give a temporary file the permissions a plain open() would (mkstemp makes it 0600)."""
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(path, 0o666 & ~umask)


def write_json_atomic(path: str | Path, obj) -> Path:
    """Serialise first (a failure leaves nothing behind), then replace `path` atomically."""
    return write_text_atomic(path, json.dumps(obj, indent=1, allow_nan=False) + "\n")


def write_csv_atomic(path: str | Path, rows: Sequence[dict]) -> Path:
    """Rows of flat dicts as CSV (columns: union of keys in first-seen order), atomically."""
    cols: list[str] = []
    for row in rows:
        cols += [k for k in row if k not in cols]
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=cols, lineterminator="\n")
    writer.writeheader()
    writer.writerows(rows)
    return write_text_atomic(path, buf.getvalue())
