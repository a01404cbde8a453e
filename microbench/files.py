"""Result files written whole or not at all, and read with limits, without importing JAX.

Every writer serialises first, writes a temporary file in the target's folder, fsyncs it and
`os.replace`s it in, so a reader never sees a half-written file and a failure leaves nothing
behind. `output_set` does the same for the several files of one run: they are written into a
hidden temporary folder inside the output folder and moved into place together at the end, so
an interrupted run leaves the previous complete set (or nothing of its own) and no temporary
files. `check_writable_dir` is called before a long measurement, so a bad `--out` fails in a
second rather than after minutes of work. `read_json` reads a user's file with a size and a
nesting limit checked before parsing, and every error names the file in one line.
"""

from __future__ import annotations

import contextlib
import csv
import io
import itertools
import json
import os
import re
import shutil
import signal
import tempfile
import threading
from collections.abc import Iterator, Sequence
from pathlib import Path

# Limits of `read_json`: result files are ~1 MB (figures/data), device files ~2 kB, and the
# deepest result nests ~8 levels; CPython's parser recurses once per level.
MAX_JSON_BYTES = 64 * 2**20
MAX_JSON_DEPTH = 64
PARTIAL = ".partial-"  # prefix of the temporary folder of an `output_set`
# Signals held back while a set's files are moved into place (SIGKILL cannot be).
_HELD = {signal.SIGINT, signal.SIGTERM, signal.SIGHUP}


def check_writable_dir(path: str | Path) -> Path:
    """Make sure results can be written into folder `path` before spending minutes measuring:
    create it if needed, then write and remove a probe file. Raises ValueError naming it."""
    path = Path(path)
    if path.exists() and not path.is_dir():
        raise ValueError(f"output folder {str(path)!r}: exists and is not a folder")
    try:
        path.mkdir(parents=True, exist_ok=True)
        with _signals_held():  # an interrupt lands after the probe file is gone
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
    tmp = None
    try:  # created with signals held, inside the try: an interrupt cannot orphan it
        with _signals_held():
            fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
        readable(tmp)
        with os.fdopen(fd, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if tmp is not None:
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


def read_json(path: str | Path, max_bytes: int = MAX_JSON_BYTES,
              max_depth: int = MAX_JSON_DEPTH):
    """Parse the JSON file `path`, refusing (ValueError naming the file, one line) a missing
    or unreadable file, a folder, a file over `max_bytes` (read no further than that, so
    /dev/zero is refused, not read until memory runs out), nesting deeper than `max_depth`
    (checked before parsing) and text that is not valid UTF-8 JSON."""
    path = Path(path)
    try:
        with open(path, "rb") as f:
            data = f.read(max_bytes + 1)
    except OSError as e:
        raise ValueError(f"{path}: cannot read ({e.strerror or e})") from None
    if len(data) > max_bytes:
        raise ValueError(f"{path}: larger than the {max_bytes / 2**20:g} MiB allowed for a "
                         "JSON input; is it the right file?")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ValueError(f"{path}: not valid JSON (not UTF-8 text: {e.reason} at byte "
                         f"{e.start})") from None
    depth = json_depth(text)
    if depth > max_depth:
        raise ValueError(f"{path}: JSON nested {depth} levels deep; at most {max_depth} allowed")
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise ValueError(f"{path}: not valid JSON ({e})") from None


def json_depth(text: str) -> int:
    """The deepest nesting of [ and { in JSON text, strings left out, without parsing it."""
    brackets = re.sub(r'"(?:[^"\\]|\\.)*"|[^\[\]{}"]+', "", text)
    steps = (1 if c in "[{" else -1 for c in brackets if c != '"')
    return max(itertools.accumulate(steps, initial=0))


def printable(text: str) -> str:
    """`text` with control and other non-printable characters escaped (\\x1b, \\n), so a name
    from a user's file cannot move the cursor, recolour or clear the terminal."""
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in str(text))


def printable_lines(text: str) -> str:
    """`printable` line by line: the line breaks kept, everything else escaped."""
    return "\n".join(printable(line) for line in str(text).split("\n"))


@contextlib.contextmanager
def output_set(out_dir: str | Path) -> Iterator[Path]:
    """Write the files of one run as one set: yields a fresh hidden folder inside `out_dir`;
    on success every file in it is moved into `out_dir` (same relative path, each replacing
    the file of the previous run), on any exception or interrupt the folder is removed.

    `out_dir` is checked (creatable, writable, not a file) on entry, before any measuring.
    The moves are os.replace calls within one file system, done with SIGINT, SIGTERM and
    SIGHUP held back, so those signals land before the set is published (nothing of it in
    out_dir) or after (all of it). Only SIGKILL or a crash can interrupt the moves; the
    folder such a run leaves is removed by the next `output_set` on the same folder.
    """
    tmp = None
    try:  # a signal held back lands at the end of a held block: inside this try, so cleaned up
        with _signals_held():
            out = check_writable_dir(out_dir)
            _remove_stale(out)
            tmp = Path(tempfile.mkdtemp(prefix=f"{PARTIAL}{os.getpid()}-", dir=out))
        yield tmp
        with _signals_held():
            for src in sorted(p for p in tmp.rglob("*") if p.is_file()):
                dst = out / src.relative_to(tmp)
                dst.parent.mkdir(parents=True, exist_ok=True)
                os.replace(src, dst)
            shutil.rmtree(tmp, ignore_errors=True)
    except BaseException:
        with _signals_held():
            if tmp is not None:
                shutil.rmtree(tmp, ignore_errors=True)
        raise


@contextlib.contextmanager
def _signals_held():
    """SIGINT and SIGTERM wait until the block is done. This thread's mask blocks them, and in
    the main thread their handlers are swapped for ones that only record them: a signal sent
    to the process may land on any of its threads (jax's, OpenBLAS's), and Python then runs the
    handler in the main thread whatever that thread's mask says. On exit the handlers come
    back and what arrived is raised again (an enclosing hold records it in turn)."""
    pending: list[int] = []
    handlers = {}
    if threading.current_thread() is threading.main_thread():
        for s in _HELD:
            handlers[s] = signal.signal(s, lambda n, _frame: pending.append(n))
    mask = (signal.pthread_sigmask(signal.SIG_BLOCK, _HELD)
            if hasattr(signal, "pthread_sigmask") else None)
    try:
        yield
    finally:
        if mask is not None:
            signal.pthread_sigmask(signal.SIG_SETMASK, mask)  # a blocked one is recorded now
        for s, h in handlers.items():
            signal.signal(s, signal.SIG_DFL if h is None else h)
        for n in dict.fromkeys(pending):
            signal.raise_signal(n)


def _remove_stale(out: Path) -> None:
    """Remove the temporary folders of runs into `out` whose process no longer exists."""
    for d in out.glob(f"{PARTIAL}*"):
        pid = d.name[len(PARTIAL):].partition("-")[0]
        if pid.isdigit() and int(pid) != os.getpid() and not _alive(int(pid)):
            shutil.rmtree(d, ignore_errors=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True
    return True
