"""Every check a notebook makes on a measurement is shown able to fail: each top-level check_*
function of notebooks/NN_*.py is fed a deliberately wrong measurement by a test that names it
(tests/test_checks_NN*.py), and the notebook calls every check it defines."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest
from notebook_checks import NOTEBOOKS, check_names, load_checks

TESTS = Path(__file__).resolve().parent
NAMES = sorted(p.stem for p in NOTEBOOKS.glob("[0-9][0-9]_*.py"))


def _calls(source: str) -> set[str]:
    return {n.func.id for n in ast.walk(ast.parse(source))
            if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)}


@pytest.mark.parametrize("notebook", NAMES)
def test_every_check_is_called_and_tested_with_a_wrong_measurement(notebook):
    source = (NOTEBOOKS / f"{notebook}.py").read_text()
    names = check_names(source)
    assert set(load_checks(notebook)) == set(names)
    assert not set(names) - _calls(source), "a check the notebook defines but never runs"
    tests = "".join(p.read_text() for p in TESTS.glob(f"test_checks_{notebook[:2]}*.py"))
    untested = [n for n in names if not re.search(rf"\b{n}\b", tests)]
    assert untested == [], f"no test feeds these a wrong measurement: {untested}"


def test_the_notebooks_make_checks():
    """The convention is in use: the notebooks that measure state their checks as functions."""
    with_checks = [n for n in NAMES if check_names((NOTEBOOKS / f"{n}.py").read_text())]
    assert len(with_checks) >= 8, with_checks
