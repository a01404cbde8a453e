"""Notebook 04's checks on what it measures, each fed a right and a wrong measurement."""

from __future__ import annotations

import pytest
from notebook_checks import load_checks

CHECKS = load_checks("04_attention_variants")


def test_under_peak():
    check = CHECKS["check_under_peak"]
    check({"median": 20e9, "p10": 18e9, "p90": 22e9}, 236e9)
    check({"median": 900e9, "p10": 800e9, "p90": 1000e9}, None)  # no spec: nothing to bound
    with pytest.raises(AssertionError, match="theoretical peak"):
        check({"median": 300e9, "p10": 290e9, "p90": 310e9}, 236e9)  # FLOPs counted 10x
