"""Notebook 07's checks on what it measures and counts, each fed a right and a wrong value."""

from __future__ import annotations

import pytest
from notebook_checks import load_checks

CHECKS = load_checks("07_serving")


def test_every_check_is_tested():
    tested = {name.removeprefix("test_") for name in globals() if name.startswith("test_")}
    assert {name.removeprefix("check_") for name in CHECKS} <= tested


def test_request_accounting():
    check = CHECKS["check_request_accounting"]
    check(8, 9, 150, 256, 406)
    with pytest.raises(AssertionError, match="7 decode steps for 9 tokens"):
        check(7, 9, 150, 256, 406)  # a decode step missing from the log
    with pytest.raises(AssertionError, match="computed"):
        check(8, 9, 406, 256, 406)  # cached tokens computed again


def test_shared_pages():
    check = CHECKS["check_shared_pages"]
    refs = [2, 2, 1, 1]
    check([0, 1, 2], [0, 1, 3], refs, 32, 40, 16)
    with pytest.raises(AssertionError, match="matched 40 tokens"):
        check([0, 1, 2], [0, 1, 3], refs, 40, 40, 16)  # a partial page counted as shared
    with pytest.raises(AssertionError, match="does not start with"):
        check([0, 1, 2], [0, 3, 1], refs, 32, 40, 16)  # a copy, not the same page
    with pytest.raises(AssertionError, match="references"):
        check([0, 1, 2], [0, 1, 3], [2, 1, 1, 1], 32, 40, 16)


def test_static_idles_rows():
    check = CHECKS["check_static_idles_rows"]
    check(7.9, 4.2, 8)
    with pytest.raises(AssertionError, match="continuous batching decoded 5.00 of 8"):
        check(5.0, 4.2, 8)  # rows left idle while requests wait
    with pytest.raises(AssertionError, match="static batching decoded 8.00"):
        check(7.9, 8.0, 8)


def test_knee():
    check = CHECKS["check_knee"]
    fractions, rates = [0.25, 0.75, 1.5], [25.0, 75.0, 150.0]
    check(fractions, [1.0, 0.97, 0.3], [24.0, 73.0, 45.0], rates, 0.9)
    with pytest.raises(AssertionError, match="stops at 1.0x"):
        check([0.25, 0.5, 1.0], [1.0, 0.97, 0.3], [24.0, 73.0, 45.0], rates, 0.9)
    with pytest.raises(AssertionError, match="75% within SLOs at 0.25x"):
        check(fractions, [0.75, 0.97, 0.3], [19.0, 73.0, 45.0], rates, 0.9)
    with pytest.raises(AssertionError, match="goodput 15 at an offered 25"):
        check(fractions, [1.0, 0.97, 0.3], [15.0, 73.0, 45.0], rates, 0.9)  # a wrong window
    with pytest.raises(AssertionError, match="saturation measured too low"):
        check(fractions, [1.0, 0.97, 0.95], [24.0, 73.0, 142.0], rates, 0.9)


def test_prefix_pair():
    check = CHECKS["check_prefix_pair"]
    check(1.0, 0.95, 0.9, 700, 8800, 0.002, 0.004)
    with pytest.raises(AssertionError, match="without the cache: that run is saturated"):
        check(1.0, 0.02, 0.9, 700, 8800, 0.002, 0.2)  # against an overloaded run
    with pytest.raises(AssertionError, match="prefill tokens"):
        check(1.0, 0.95, 0.9, 8800, 8800, 0.002, 0.004)
    with pytest.raises(AssertionError, match="mean TTFT"):
        check(1.0, 0.95, 0.9, 700, 8800, 0.004, 0.004)


def test_readmissions_explain():
    check = CHECKS["check_readmissions_explain"]
    check(0.80, 0.81, 12, 12 * 150, 128)
    with pytest.raises(AssertionError, match="no readmissions"):
        check(0.80, 0.81, 0, 0, 128)
    with pytest.raises(AssertionError, match="fewer than the system prompt"):
        check(0.80, 0.81, 12, 12 * 100, 128)  # hits counted on another request's pages
    with pytest.raises(AssertionError, match="readmissions do not explain"):
        check(0.80, 0.92, 12, 12 * 150, 128)  # first admissions moved too


def test_memory_caps_batch():
    check = CHECKS["check_memory_caps_batch"]
    check(3, 336, [89.7, 109.6, 3.8, 4.9], 295.3)
    with pytest.raises(AssertionError, match="400 sequences fit"):
        check(400, 336, [89.7, 109.6], 295.3)  # KV bytes counted for one layer, not all
    with pytest.raises(AssertionError, match="within 2x of the ridge"):
        check(3, 336, [89.7, 250.0], 295.3)
