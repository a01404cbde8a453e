"""The test run's notebook executions, kept for the book.

nbmake already executes every notebook in `notebooks/` (the README's test command). This
wraps its `NotebookRun.execute` so that a notebook that ran without error is also written,
atomically and stamped with its cache key, to `build/book/executed/<name>.ipynb`
(`book/nbcache.py`); `book/build.py`, and so `book/test_book.py` at the end of the same run,
then build the book from those executions instead of running each notebook a second time.
The committed notebooks are not touched: nbmake executes a copy in memory.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

_spec = importlib.util.spec_from_file_location(
    "lab_book_nbcache", Path(__file__).resolve().parent / "book" / "nbcache.py")
nbcache = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(nbcache)

try:
    from nbmake.nb_run import NotebookRun
except ImportError:  # nbmake is a dev dependency; without it there is nothing to keep
    NotebookRun = None

if NotebookRun is not None and not getattr(NotebookRun.execute, "_lab_book", False):
    _execute = NotebookRun.execute

    def execute(self):
        res = _execute(self)
        notebook = Path(self.filename).resolve()
        if res.error is None and notebook.parent == nbcache.NOTEBOOKS:
            nbcache.store(res.nb, notebook, nbcache.mode(), executed_by="nbmake")
        return res

    execute._lab_book = True
    NotebookRun.execute = execute
