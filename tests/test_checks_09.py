"""Notebook 09's checks on what it measures, each fed a right and a wrong measurement."""

from __future__ import annotations

import pytest
from notebook_checks import load_checks

CHECKS = load_checks("09_speculative_decoding")


def test_rejection_sampling():
    check = CHECKS["check_rejection_sampling"]
    check(0.006, 0.35, 0.651, 0.65)
    with pytest.raises(AssertionError, match="not distributed as p"):
        check(0.30, 0.35, 0.651, 0.65)  # a rule that emits the draft's distribution
    with pytest.raises(AssertionError, match="acceptance"):
        check(0.006, 0.35, 0.90, 0.65)


def test_speedup_prediction():
    check = CHECKS["check_speedup_prediction"]
    runs = [{"drafter": "draft", "k": 4, "predicted": 1.45, "rounds": [1.30, 1.38, 1.42]},
            {"drafter": "lookup", "k": 2, "predicted": 2.34, "rounds": [1.15, 2.51, 1.53]}]
    check(runs, (0.75, 1.25))  # a noisy run: the prediction inside its rounds' range
    with pytest.raises(AssertionError, match="lookup k=8"):
        check(runs + [{"drafter": "lookup", "k": 8, "predicted": 1.6,
                       "rounds": [3.1, 3.2, 3.4]}],
              (0.75, 1.25))  # a speculative time that left out the verify
    with pytest.raises(AssertionError, match="outside"):
        check([{"drafter": "draft", "k": 4, "predicted": 1.45, "rounds": [0.5, 0.55]}],
              (0.75, 1.25))  # a prediction far above every round


def test_no_control_characters_in_the_text():
    """LaTeX in a Python string is where a control character hides ('\\a' of '\\approx' in a
    string that is not raw is a BEL): the notebook's text, and every string constant of its
    code, carry none."""
    import ast

    from notebook_checks import NOTEBOOKS

    text = (NOTEBOOKS / "09_speculative_decoding.py").read_text()
    strings = [n.value for n in ast.walk(ast.parse(text))
               if isinstance(n, ast.Constant) and isinstance(n.value, str)]
    bad = [repr(c) for t in [text, *strings] for c in t if ord(c) < 32 and c not in "\n\t"]
    assert not bad, bad[:5]
