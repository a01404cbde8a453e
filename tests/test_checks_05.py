"""Notebook 05's checks on what it measures and counts, each fed a right and a wrong value."""

from __future__ import annotations

import pytest
from notebook_checks import load_checks

CHECKS = load_checks("05_moe")


def test_trained_less_even():
    check = CHECKS["check_trained_less_even"]
    check(1.9, 1.2)
    with pytest.raises(AssertionError, match="not above"):
        check(1.1, 1.2)


def test_under_peak():
    check = CHECKS["check_under_peak"]
    check({"median": 20e9, "p10": 18e9, "p90": 22e9}, 236e9)
    with pytest.raises(AssertionError, match="theoretical peak"):
        check({"median": 300e9, "p10": 290e9, "p90": 310e9}, 236e9)


def test_moe_ridge_batches():
    check = CHECKS["check_moe_ridge_batches"]
    moe = {"mixtral-8x7b": 1024, "deepseek-v3": 16384}
    check(512, moe, 16384, 8192, 16384)
    with pytest.raises(AssertionError, match="not after dense"):
        check(512, {**moe, "mixtral-8x7b": 256}, 16384, 8192, 16384)
    with pytest.raises(AssertionError, match="not 10x"):
        check(4096, {"deepseek-v3": 16384}, 16384, 8192, 16384)
    with pytest.raises(AssertionError, match="bf16 arithmetic"):
        check(512, moe, 16384, 16384, 16384)  # fp8 weights counted at bf16's bytes
