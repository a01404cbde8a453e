"""Notebook 06's check on what it measures, fed a right and a wrong measurement."""

from __future__ import annotations

import pytest
from notebook_checks import load_checks

CHECKS = load_checks("06_measure_your_hardware")


def test_not_above_prediction():
    check = CHECKS["check_not_above_prediction"]
    timing = {"median": 5e-3, "p10": 4.9e-3, "p90": 5.3e-3}
    roof = {"value": 34e9, "p10": 33e9, "p90": 35e9}
    check(0.93, timing, roof)
    check(1.1, timing, roof)  # within the spreads (0.08 + 0.06)
    with pytest.raises(AssertionError, match="faster than its roofline"):
        check(1.6, timing, roof)  # a working set that stayed cached
