"""The executed copies of the notebooks that the book is made of: where they live, the key that
says whether a copy is still current, and an atomic write.

Two writers share this module. The root `conftest.py` stores each notebook that nbmake ran
without error during the test run, and `book/build.py` executes (with nbclient, as nbmake does)
only the notebooks whose copy is missing or stale. A copy is current when its key matches:
the hash of the notebook's code cells (what runs, in order), the mode (`LAB_FULL=1` is "full",
anything else "quick") and the XLA flags it ran under. A markdown edit keeps the key: the build
takes the text from the notebook as it is now and the outputs from the copy.

Why the flags: `tests/conftest.py` compiles with XLA's optimisations off to make the suite
faster, and the notebooks nbmake runs beside the tests inherit that; their outputs are right,
their timings are not what this machine does. The test run's book accepts them (`any_flags`);
a reader's `book/build.py` executes such a notebook again under its own flags.
Outputs never go back into `notebooks/`.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = ROOT / "notebooks"
OUT = ROOT / "build" / "book"  # ignored by git (build/)
KEY_VERSION = "2"  # bump to invalidate every stored copy


def mode(env=None) -> str:
    """"full" when LAB_FULL=1 (publication size), else "quick" (what the tests run)."""
    return "full" if (os.environ if env is None else env).get("LAB_FULL", "0") == "1" else "quick"


def xla_flags(env=None) -> str:
    """The XLA flags a kernel started now inherits, normalised (order and spacing ignored)."""
    return " ".join(sorted((os.environ if env is None else env).get("XLA_FLAGS", "").split()))


def executed_dir(run_mode: str) -> Path:
    """build/book/executed/ for quick copies, build/book/executed/full/ for full ones, so that a
    quick build does not throw away an hour of full-size execution."""
    return OUT / "executed" if run_mode == "quick" else OUT / "executed" / "full"


def key(notebook: Path, run_mode: str, flags: str) -> str:
    """sha256 over the notebook's code cells (their source, in order), the mode and the XLA
    flags: what the outputs depend on. Markdown, metadata and outputs do not count."""
    with open(notebook, encoding="utf-8") as f:
        cells = json.load(f)["cells"]
    code = ["".join(c["source"]) if isinstance(c["source"], list) else c["source"]
            for c in cells if c["cell_type"] == "code"]
    blob = json.dumps([KEY_VERSION, run_mode, flags, code], ensure_ascii=True)
    return hashlib.sha256(blob.encode()).hexdigest()


def stored(name: str, run_mode: str, any_flags: bool = False) -> Path | None:
    """The executed copy of notebooks/<name>.ipynb for this mode (run under the current XLA
    flags, or under any with `any_flags`), or None if missing or stale."""
    path = executed_dir(run_mode) / f"{name}.ipynb"
    try:
        with open(path, encoding="utf-8") as f:
            meta = json.load(f).get("metadata", {}).get("lab_book", {})
    except (OSError, ValueError):
        return None
    flags = meta.get("xla_flags", "") if any_flags else xla_flags()
    return path if meta.get("key") == key(NOTEBOOKS / f"{name}.ipynb", run_mode, flags) else None


def store(nb, notebook: Path, run_mode: str, executed_by: str) -> Path:
    """Write the executed notebook `nb` (an nbformat node) as the copy of `notebook`, stamped
    with its key, atomically (a temporary file in the same folder, then a rename): a reader
    never sees half a notebook, and two writers leave one whole copy."""
    import nbformat  # only when writing: conftest.py imports this module in every test run

    flags = xla_flags()
    nb.metadata["lab_book"] = {"key": key(notebook, run_mode, flags), "mode": run_mode,
                               "xla_flags": flags, "source": f"notebooks/{notebook.name}",
                               "executed_by": executed_by}
    folder = executed_dir(run_mode)
    folder.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{notebook.stem}.", suffix=".ipynb", dir=folder)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            nbformat.write(nb, f)
        os.chmod(tmp, 0o644)
        os.replace(tmp, folder / notebook.name)
    except BaseException:
        os.unlink(tmp)
        raise
    return folder / notebook.name
