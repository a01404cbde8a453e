"""Notebook 01's checks on what it measures, each fed a right and a wrong measurement."""

from __future__ import annotations

import pytest
from notebook_checks import load_checks

CHECKS = load_checks("01_roofline")


def _rate(median, spread=0.1, n=5):
    return {"median": median, "p10": median * (1 - spread / 2),
            "p90": median * (1 + spread / 2), "n": n}


def test_gemm_rates():
    check = CHECKS["check_gemm_rates"]
    check([_rate(150e9), _rate(200e9)], 236e9, 3)
    check([_rate(150e9)], None, 3)  # no spec: only the spread among the sizes
    with pytest.raises(AssertionError, match="theoretical peak"):
        check([_rate(150e9), _rate(400e9)], 236e9, 3)  # faster than the silicon
    with pytest.raises(AssertionError, match="100x below"):
        check([_rate(1e9), _rate(200e9)], 236e9, 3)  # a timer that stops early
    with pytest.raises(AssertionError, match="samples"):
        check([_rate(200e9, n=2)], 236e9, 3)


def test_cache_faster():
    check = CHECKS["check_cache_faster"]
    check(150e9, 40e9)
    with pytest.raises(AssertionError, match="wrong byte count"):
        check(40e9, 41e9)


def test_datacenter_ridges():
    check = CHECKS["check_datacenter_ridges"]
    check({"H100 SXM": 295.3, "TPU v6e": 714.0})
    with pytest.raises(AssertionError, match="H100"):
        check({"H100 SXM": 29.5})  # a bandwidth ten times too high


def test_under_roofline():
    check = CHECKS["check_under_roofline"]
    beta = {"median": 40e9, "p10": 38e9, "p90": 42e9}
    check(_rate(30e9), 1.0, beta, 0.25, 236e9)  # I x beta = 40 GFLOP/s
    check(_rate(200e9), 16.0, beta, 0.25, None)  # compute side, no spec
    with pytest.raises(AssertionError, match="above I x beta"):
        check(_rate(80e9), 1.0, beta, 0.25, 236e9)  # cache-resident "main memory"
    with pytest.raises(AssertionError, match="theoretical peak"):
        check(_rate(400e9), 64.0, beta, 0.25, 236e9)
