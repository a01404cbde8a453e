"""Notebook 11's check on the measured collectives, fed a right and a wrong measurement."""

from __future__ import annotations

import pytest
from notebook_checks import load_checks

CHECKS = load_checks("11_parallelism")


def test_latency_then_bandwidth():
    check = CHECKS["check_latency_then_bandwidth"]
    check({"all_reduce": {1024: 5e6, 65536: 2e8, 8 << 20: 1.25e9, 64 << 20: 4e8}})
    with pytest.raises(AssertionError, match="all_gather"):  # a timer that times the launch
        check({"all_reduce": {1024: 5e6, 8 << 20: 1.25e9},
               "all_gather": {1024: 2e9, 8 << 20: 1e9}})
