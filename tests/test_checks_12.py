"""Notebook 12's checks: on what XLA compiled, fed a right and a wrong count; on the Pallas
kernel, fed the reference's output and a wrong one."""

from __future__ import annotations

import numpy as np
import pytest
from notebook_checks import load_checks

CHECKS = load_checks("12_kernels")


def test_no_cache_copies():
    check = CHECKS["check_no_cache_copies"]
    check({1: 0, 2: 0})
    with pytest.raises(AssertionError, match="batch 1: 16 copies"):
        check({1: 16, 2: 0})


def test_pallas_equals_reference():
    check = CHECKS["check_pallas_equals_reference"]
    want = np.random.default_rng(0).standard_normal((2, 2, 4, 16))
    assert check(want + 1e-7, want, 1e-5) < 1e-5
    wrong = want.copy()
    wrong[1, 0, 2] = want[1, 0, 1]  # one query head's output given another's
    with pytest.raises(AssertionError, match="differs from the reference by"):
        check(wrong, want, 1e-5)
