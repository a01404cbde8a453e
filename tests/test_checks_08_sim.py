"""Notebook 08's checks on its simulator-vs-engine measurement (Step 2), fed right and wrong
measurements: each passes on a plausible one and raises AssertionError on a wrong one."""

from __future__ import annotations

import math

import pytest
from notebook_checks import load_checks

CHECKS = load_checks("08_serving_at_scale")
SPREAD = {"ttft_s": 0.12, "tpot_s": 0.06, "e2e_s": 0.08}


def test_simulator_within_the_engines_spread():
    check = CHECKS["check_within_spread"]
    check({"ttft_s": 0.10, "tpot_s": 0.07, "e2e_s": 0.09}, SPREAD)  # 0.83x, 1.17x, 1.13x
    check({"ttft_s": 0.144, "tpot_s": 0.0, "e2e_s": 0.01}, SPREAD)  # exactly 1.2x passes
    # a simulator twice as far from the engine as the engine from itself, on one metric
    with pytest.raises(AssertionError, match="tpot_s"):
        check({"ttft_s": 0.10, "tpot_s": 0.12, "e2e_s": 0.09}, SPREAD)
    # a stricter factor fails what 1.2 passes
    with pytest.raises(AssertionError, match="ttft_s"):
        check({"ttft_s": 0.13, "tpot_s": 0.05, "e2e_s": 0.05}, SPREAD, factor=1.0)
    # a metric the engine's runs did not measure, a simulator error that is not a number
    with pytest.raises(AssertionError, match="not measured"):
        check({"ttft_s": 0.10, "tpot_s": 0.05, "e2e_s": 0.05}, {**SPREAD, "e2e_s": None})
    with pytest.raises(AssertionError, match="not measured"):
        check({"ttft_s": math.nan, "tpot_s": 0.05, "e2e_s": 0.05}, SPREAD)
    with pytest.raises(AssertionError, match="not measured"):  # runs that never differed
        check({"ttft_s": 0.0, "tpot_s": 0.05, "e2e_s": 0.05}, {**SPREAD, "ttft_s": 0.0})


def test_step_error_under_its_bound():
    check = CHECKS["check_step_error"]
    noise = [0.02, 0.03, 0.01, 0.04, 0.02]
    assert check([0.05, 0.08, 0.02, 0.09, 0.06], noise) == pytest.approx((0.06, 0.10))
    # a table 30% off every step
    with pytest.raises(AssertionError, match="30.0% > 10.0%"):
        check([0.3] * 5, noise)
    # a noisier engine widens the bound to 2x its own step noise, no further
    loud = [0.2, 0.25, 0.3, 0.2, 0.25]
    assert check([0.45] * 5, loud) == pytest.approx((0.45, 0.50))
    with pytest.raises(AssertionError, match="2 x the engine's own step noise 25.0%"):
        check([0.55] * 5, loud)
    with pytest.raises(AssertionError, match="31.0% > 30.0%"):
        check([0.31] * 5, loud, factor=1.2)
    # errors that do not match the steps they price
    with pytest.raises(AssertionError, match="one per step"):
        check([0.05, 0.06], noise)
    with pytest.raises(AssertionError, match="one per step"):
        check([], [])


def test_kernels_explain_the_calls():
    check = CHECKS["check_kernels_explain"]
    measured = {(1, 1): 1.0e-3, (4, 1): 1.9e-3, (1, 64): 8.0e-3}
    bare = {(1, 1): 0.1e-3, (4, 1): 0.17e-3, (1, 64): 2.75e-3}
    predicted = {(1, 1): 1.0e-3, (4, 1): 1.5e-3, (1, 64): 3.9e-3}  # 1x1 measured, 4x1: -21%
    check(measured, bare, predicted, (1, 1))  # prefill (1, 64) is not checked: -51%
    # roofs that already explain the calibrated call: no kernel cost to speak of
    with pytest.raises(AssertionError, match="not a call of kernels"):
        check(measured, {**bare, (1, 1): 0.6e-3}, predicted, (1, 1))
    # a kernel count or a per-kernel cost off by a factor (e.g. the wrong call's count)
    with pytest.raises(AssertionError, match=r"call \(4, 1\).*more than 2x apart"):
        check(measured, bare, {**predicted, (4, 1): 0.9e-3}, (1, 1))
    with pytest.raises(AssertionError, match="more than 2x apart"):
        check(measured, bare, {**predicted, (4, 1): 4.0e-3}, (1, 1))
    # no other decode call to predict: nothing was checked
    with pytest.raises(AssertionError, match="none to predict"):
        check({(1, 1): 1e-3, (1, 64): 8e-3}, bare, predicted, (1, 1))
