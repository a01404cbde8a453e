"""Notebook 10's checks on what it measures, each fed a right and a wrong measurement."""

from __future__ import annotations

import pytest
from notebook_checks import load_checks

CHECKS = load_checks("10_quantization")


def test_native_follows_bytes():
    check = CHECKS["check_native_follows_bytes"]
    float32 = [10e-3, 11e-3, 9.5e-3, 10.5e-3, 12e-3]
    check(float32, [3.0e-3, 3.4e-3, 2.9e-3, 3.1e-3, 3.3e-3], 3.95)  # ~3.3x of 3.95x
    with pytest.raises(AssertionError, match="under 50% of the ratio"):
        check(float32, [9e-3, 10e-3, 9e-3, 10e-3, 11e-3], 3.95)  # int8 no faster: XLA's case
    with pytest.raises(AssertionError, match="under 50% of the ratio"):  # one fast round is
        check(float32, [2e-3, 8e-3, 8e-3, 8e-3, 9e-3], 3.95)  # not the median


def test_kernel_beats_xla():
    check = CHECKS["check_kernel_beats_xla"]
    check([3.2, 3.5, 2.9], [0.9, 1.0, 1.1])
    with pytest.raises(AssertionError, match="not 1.5x XLA's"):
        check([1.1, 1.0, 1.2], [0.9, 1.0, 1.1])  # a "native" step as slow as XLA's


def test_dots_slower():
    check = CHECKS["check_dots_slower"]
    check({"int8 dequantize then dot": 0.10, "int8 x int8 -> int32 dot": 0.11}, 0.5)
    with pytest.raises(AssertionError, match="int32 dot"):
        check({"int8 dequantize then dot": 0.10, "int8 x int8 -> int32 dot": 0.9}, 0.5)


def test_quality():
    check = CHECKS["check_quality"]
    bpb = {("int8", "none"): 2.001, ("int8 w8a8", "none"): 2.0012, ("float8", "none"): 2.004,
           ("int4", "none"): 2.05, ("float32", "int8"): 2.0005, ("float32", "float8"): 2.002}
    check(bpb, 2.0)
    with pytest.raises(AssertionError, match="int8"):
        check({**bpb, ("float32", "int8"): 2.3}, 2.0)  # a cache that loses its scales
    with pytest.raises(AssertionError, match="w8a8"):
        check({**bpb, ("int8 w8a8", "none"): 2.4}, 2.0)  # activations rounded without scales
    with pytest.raises(AssertionError, match="int4"):
        check({**bpb, ("int4", "none"): 1.99}, 2.0)


def test_kl():
    check = CHECKS["check_kl"]
    kl = {"int8": 2.3e-5, "int8 w8a8": 5.3e-5, "float8": 3.4e-4, "int4": 4.2e-3,
          "int4 w4a8": 4.2e-3, "int8 KV": 1.8e-5, "float8 KV": 3.8e-4}
    check(kl)
    with pytest.raises(AssertionError, match="float8 KV"):
        check({**kl, "float8 KV": 0.3})  # a cache read back without its scales
    with pytest.raises(AssertionError, match="int4 KL"):
        check({**kl, "int4": 1e-5})  # int4 closer to float32 than int8: swapped results
    with pytest.raises(AssertionError, match="int8 w8a8 KL"):
        check({**kl, "int8 w8a8": 1e-3, "int4": 9e-4})
