"""Notebook 10's checks on what it measures, each fed a right and a wrong measurement."""

from __future__ import annotations

import pytest
from notebook_checks import load_checks

CHECKS = load_checks("10_quantization")


def test_streaming_beats_dequantize():
    check = CHECKS["check_streaming_beats_dequantize"]
    check([1.0e-3, 1.1e-3, 0.9e-3], [9e-3, 9.5e-3, 8.8e-3])
    with pytest.raises(AssertionError, match="not slower"):
        check([9e-3, 9.5e-3, 8.8e-3], [1.0e-3, 1.1e-3, 0.9e-3])  # the two timings swapped


def test_dots_slower():
    check = CHECKS["check_dots_slower"]
    check({"int8 dequantize then dot": 0.10, "int8 x int8 -> int32 dot": 0.11}, 0.5)
    with pytest.raises(AssertionError, match="int32 dot"):
        check({"int8 dequantize then dot": 0.10, "int8 x int8 -> int32 dot": 0.9}, 0.5)


def test_quality():
    check = CHECKS["check_quality"]
    bpb = {("int8", "none"): 2.001, ("float8", "none"): 2.004, ("int4", "none"): 2.05,
           ("none", "int8"): 2.0005, ("none", "float8"): 2.002}
    check(bpb, 2.0)
    with pytest.raises(AssertionError, match="int8"):
        check({**bpb, ("none", "int8"): 2.3}, 2.0)  # a cache that loses its scales
    with pytest.raises(AssertionError, match="int4"):
        check({**bpb, ("int4", "none"): 1.99}, 2.0)
