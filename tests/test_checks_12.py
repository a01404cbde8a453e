"""Notebook 12's check on what XLA compiled, fed a right and a wrong count."""

from __future__ import annotations

import pytest
from notebook_checks import load_checks

CHECKS = load_checks("12_kernels")


def test_no_cache_copies():
    check = CHECKS["check_no_cache_copies"]
    check({1: 0, 2: 0})
    with pytest.raises(AssertionError, match="batch 1: 16 copies"):
        check({1: 16, 2: 0})
