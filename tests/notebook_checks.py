"""The checks a notebook makes on what it measured, loaded from the notebook's own source.

A notebook states each check on a measurement as a top-level function `check_<what>(...)` that
takes the measured values and raises AssertionError when they contradict the lesson; the cell
that measures then calls it. `load_checks` compiles those functions, and nothing else of the
notebook, from its jupytext .py (the same text the learner reads), so a test can feed each one
a deliberately wrong measurement and see it fail, and a right one and see it pass.
"""

from __future__ import annotations

import ast
import math
from pathlib import Path

import numpy as np

NOTEBOOKS = Path(__file__).resolve().parent.parent / "notebooks"


def check_names(source: str) -> list[str]:
    """The names of the top-level `check_*` functions in a notebook's source."""
    return [n.name for n in ast.parse(source).body
            if isinstance(n, ast.FunctionDef) and n.name.startswith("check_")]


def load_checks(notebook: str) -> dict:
    """{name: function} of notebooks/<notebook>.py's top-level check_* functions, compiled
    alone with math and numpy (as np) in scope: a check uses nothing else of the notebook."""
    path = NOTEBOOKS / f"{notebook}.py"
    tree = ast.parse(path.read_text())
    defs = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name.startswith("check_")]
    namespace = {"math": math, "np": np}
    exec(compile(ast.Module(body=defs, type_ignores=[]), str(path), "exec"), namespace)
    return {n.name: namespace[n.name] for n in defs}
