"""Notebook 03's checks on what it measures and counts, each fed a right and a wrong value."""

from __future__ import annotations

import pytest
from notebook_checks import load_checks

CHECKS = load_checks("03_batch_size")


def test_under_gemm_roof():
    check = CHECKS["check_under_gemm_roof"]
    roof = {"value": 200e9, "p10": 195e9, "p90": 205e9}
    check({"median": 150e9, "p10": 140e9, "p90": 160e9}, roof)
    with pytest.raises(AssertionError, match="above the GEMM roof"):
        check({"median": 300e9, "p10": 290e9, "p90": 310e9}, roof)


def test_batching_pays():
    check = CHECKS["check_batching_pays"]
    check(1, 2.0e-3, 16, 6.0e-3)  # 500 -> 2,667 tokens/s
    with pytest.raises(AssertionError, match="not above"):
        check(1, 2.0e-3, 16, 40e-3)  # a step 20x slower at 16x the batch


def test_kv_before_ridge():
    check = CHECKS["check_kv_before_ridge"]
    check(32, None, 512)
    with pytest.raises(AssertionError, match="before the KV cache dominates"):
        check(32, None, 16)  # KV bytes counted far too low
    with pytest.raises(AssertionError, match="weights dominate"):
        check(None, None, 512)
