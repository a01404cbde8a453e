"""Notebook 02's checks on what it counts and measures, each fed a right and a wrong value."""

from __future__ import annotations

import pytest
from notebook_checks import load_checks

CHECKS = load_checks("02_prefill_vs_decode")


def _rate(median, spread=0.1):
    return {"median": median, "p10": median * (1 - spread / 2), "p90": median * (1 + spread / 2)}


def _roof(value, spread=0.05):
    return {"value": value, "p10": value * (1 - spread / 2), "p90": value * (1 + spread / 2)}


def test_decode_memory_bound():
    check = CHECKS["check_decode_memory_bound"]
    check(0.5, 60.0, 150.0)
    with pytest.raises(AssertionError, match="not below 1"):
        check(2.0, 60.0, 150.0)  # bytes counted 4x too low
    with pytest.raises(AssertionError, match="not 10x"):
        check(0.5, 4.0, 150.0)


def test_under_roofs():
    check = CHECKS["check_under_roofs"]
    gemm, memory = _roof(200e9), _roof(40e9)
    check(_rate(180e9), _rate(2e9), gemm, memory, True)  # prefill near the compute roof
    check(_rate(20e9), _rate(38e9), gemm, memory, True)  # decode near the memory roof
    check(_rate(20e9), _rate(90e9), gemm, memory, False)  # cache-resident: no memory bound
    with pytest.raises(AssertionError, match="GEMM roof"):
        check(_rate(400e9), _rate(2e9), gemm, memory, True)
    with pytest.raises(AssertionError, match="main memory's roof"):
        check(_rate(20e9), _rate(90e9), gemm, memory, True)  # cold, yet faster than DRAM


def test_ttft_grows():
    check = CHECKS["check_ttft_grows"]
    check(0.4e-3, 1.5e-3)
    with pytest.raises(AssertionError, match="not slower"):
        check(1.5e-3, 1.4e-3)
