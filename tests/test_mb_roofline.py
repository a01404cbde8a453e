"""Roofline arithmetic (microbench.roofline): the ridge names both roofs, spread is relative,
`above` allows exactly the roof's spread, and the working-set curve is a log-log interpolation
that is continuous, monotone between points, exact at the points and clamped at the ends."""

import math

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from microbench import roofline

GEMM = {"name": "GEMM float32", "value": 2e11, "p10": 1.9e11, "p90": 2.1e11}
DRAM = {"name": "DRAM read-only", "value": 5e10, "p10": 4.5e10, "p90": 5.5e10}


def test_ridge_value_and_label_name_both_roofs():
    r = roofline.ridge(GEMM, DRAM)
    assert r["flops_per_byte"] == pytest.approx(4.0)
    assert r["compute"] == "GEMM float32" and r["memory"] == "DRAM read-only"
    assert "GEMM float32" in r["label"] and "DRAM read-only" in r["label"]
    assert "4 FLOP/B" in r["label"]


def test_main_memory_name():
    assert roofline.main_memory_name({"backend": "cpu"}) == "DRAM"
    assert roofline.main_memory_name({"backend": "gpu"}) == "HBM"
    assert roofline.main_memory_name({"backend": "tpu"}) == "HBM"


def test_spread_of_a_roof_and_of_a_rate():
    assert roofline.spread(GEMM) == pytest.approx(0.1)
    assert roofline.spread({"median": 10.0, "p10": 9.0, "p90": 12.0}) == pytest.approx(0.3)
    # a roof's "value" wins over a "median" key, and a zero centre gives 0, never a division
    assert roofline.spread({"value": 20.0, "median": 10.0, "p10": 9.0, "p90": 11.0}) == \
        pytest.approx(0.1)
    assert roofline.spread({"value": 0.0, "p10": 0.0, "p90": 1.0}) == 0.0
    # inverted percentiles never give a negative spread
    assert roofline.spread({"value": 10.0, "p10": 11.0, "p90": 9.0}) == 0.0


def test_above_allows_exactly_the_roofs_spread():
    roof = {"value": 100.0, "p10": 95.0, "p90": 105.0}  # spread 0.10
    edge = 100.0 * (1 + roofline.spread(roof))
    assert not roofline.above(edge, roof)  # exactly at roof x (1 + spread): not above
    assert roofline.above(edge * (1 + 1e-9), roof)
    assert not roofline.above(100.0, roof) and not roofline.above(50.0, roof)
    assert not roofline.above(115.0, roof, extra=0.05)
    assert roofline.above(115.1, roof, extra=0.05)
    tight = {"value": 100.0, "p10": 100.0, "p90": 100.0}
    assert roofline.above(100.0001, tight) and not roofline.above(100.0, tight)


CURVE = [[16e3, 4e11], [1e6, 2e11], [32e6, 1e11], [512e6, 2.5e10]]


def test_curve_exact_at_points_and_clamped_at_ends():
    for s, b in CURVE:
        assert roofline.curve_bandwidth(CURVE, s) == pytest.approx(b, rel=1e-12)
    assert roofline.curve_bandwidth(CURVE, 1.0) == 4e11
    assert roofline.curve_bandwidth(CURVE, 1e15) == 2.5e10
    # order of the input does not matter
    assert roofline.curve_bandwidth(CURVE[::-1], 5e6) == roofline.curve_bandwidth(CURVE, 5e6)
    with pytest.raises(ValueError):
        roofline.curve_bandwidth([], 1e6)


def test_curve_is_log_log_linear_not_linear():
    # halfway in log(size) between two points is the geometric mean of their bandwidths
    mid = math.sqrt(1e6 * 32e6)
    assert roofline.curve_bandwidth(CURVE, mid) == pytest.approx(math.sqrt(2e11 * 1e11))


def _curve_strategy():
    sizes = st.lists(st.floats(1e3, 1e11), min_size=2, max_size=8, unique=True)
    return sizes.flatmap(lambda s: st.tuples(
        st.just(sorted(s)),
        st.lists(st.floats(1e8, 1e13), min_size=len(s), max_size=len(s))))


@settings(max_examples=150, deadline=None)
@given(_curve_strategy(), st.floats(0.0, 1.0))
def test_curve_interpolates_log_log_between_neighbours(curve_parts, w):
    sizes, bws = curve_parts  # neighbours far enough apart that logs are not rounding noise
    assume(all(b / a >= 1.001 for a, b in zip(sizes, sizes[1:], strict=False)))
    curve = list(zip(sizes, bws, strict=True))
    for (s0, b0), (s1, b1) in zip(curve, curve[1:], strict=False):
        x = math.exp(math.log(s0) + w * (math.log(s1) - math.log(s0)))
        x = min(max(x, s0), s1)
        got = roofline.curve_bandwidth(curve, x)
        lo, hi = min(b0, b1), max(b0, b1)
        # monotone between the two points: never outside their range
        assert lo * (1 - 1e-9) <= got <= hi * (1 + 1e-9)
        # and exactly the log-log line through them
        wx = (math.log(x) - math.log(s0)) / (math.log(s1) - math.log(s0))
        want = math.exp(math.log(b0) + wx * (math.log(b1) - math.log(b0)))
        assert got == pytest.approx(want, rel=1e-9)


@settings(max_examples=150, deadline=None)
@given(_curve_strategy(), st.floats(1e2, 1e12), st.floats(1e-6, 1e-2))
def test_curve_is_continuous(curve_parts, x, eps):
    """A small step in size moves log(bandwidth) by at most the steepest segment's log-log
    slope times the step: no cliffs, anywhere (including the ends)."""
    sizes, bws = curve_parts
    assume(all(b / a >= 1.001 for a, b in zip(sizes, sizes[1:], strict=False)))
    curve = list(zip(sizes, bws, strict=True))
    slope = max(abs(math.log(b1 / b0) / math.log(s1 / s0))
                for (s0, b0), (s1, b1) in zip(curve, curve[1:], strict=False))
    a = roofline.curve_bandwidth(curve, x)
    b = roofline.curve_bandwidth(curve, x * (1 + eps))
    assert abs(math.log(b / a)) <= slope * math.log1p(eps) * (1 + 1e-6) + 1e-9


@settings(max_examples=100, deadline=None)
@given(st.lists(st.floats(1e3, 1e11), min_size=2, max_size=8, unique=True),
       st.lists(st.floats(1e3, 1e11), min_size=2, max_size=20))
def test_a_decreasing_curve_gives_a_non_increasing_bandwidth(sizes, xs):
    sizes = sorted(sizes)
    curve = [[s, 1e12 / (i + 1)] for i, s in enumerate(sizes)]
    vals = [roofline.curve_bandwidth(curve, x) for x in sorted(xs)]
    assert all(b <= a * (1 + 1e-12) for a, b in zip(vals, vals[1:], strict=False))
