"""Serving metrics on hand-made timelines with answers worked out by hand."""

from __future__ import annotations

import math

import numpy as np
import pytest

from refmodel.serving import metrics
from refmodel.serving.metrics import Timeline

A = Timeline(arrival=1.0, token_times=(1.5, 1.7, 2.0, 2.1))  # TTFT .5, ITL .2 .3 .1
B = Timeline(arrival=0.0, token_times=(2.0, 3.0, 4.0))  # TTFT 2, TPOT 1
C = Timeline(arrival=3.0, token_times=(3.2,))  # one token: no TPOT


def test_per_request_latencies():
    assert A.ttft == pytest.approx(0.5) and A.e2e == pytest.approx(1.1)
    np.testing.assert_allclose(A.itl, [0.2, 0.3, 0.1])
    assert A.tpot == pytest.approx(0.2)  # (2.1 - 1.5) / 3 = mean ITL
    assert B.tpot == 1.0 and math.isnan(C.tpot) and C.itl.size == 0
    assert A.meets(0.5, 0.201) and not A.meets(0.4, 1.0) and not A.meets(1.0, 0.199)
    assert C.meets(0.25, 0.0)  # no TPOT to miss


def test_percentiles_interpolate_and_skip_nan():
    p = metrics.percentiles(list(range(101)) + [math.nan])
    assert p == {"mean": 50.0, "p50": 50.0, "p90": 90.0, "p99": 99.0}
    assert math.isnan(metrics.percentiles([math.nan])["p50"])


def test_run_rates_and_goodput():
    runs = [A, B, C]
    assert metrics.duration(runs) == pytest.approx(4.0)  # arrival 0 .. last token 4
    assert metrics.throughput(runs) == pytest.approx(8 / 4.0)
    # SLO TTFT <= 1, TPOT <= 0.5: A and C meet it, B (TTFT 2) does not
    assert metrics.slo_attainment(runs, 1.0, 0.5) == pytest.approx(2 / 3)
    assert metrics.goodput(runs, 1.0, 0.5) == pytest.approx(2 / 4.0)
    assert metrics.goodput(runs, 1.0, 0.5, span=10.0) == pytest.approx(0.2)
    s = metrics.summarize(runs, ttft_slo=1.0, tpot_slo=0.5)
    assert s["requests"] == 3 and s["goodput_requests_per_s"] == pytest.approx(0.5)
    assert s["ttft_s"]["p50"] == pytest.approx(0.5) and s["itl_s"]["mean"] == pytest.approx(
        (0.2 + 0.3 + 0.1 + 1.0 + 1.0) / 5)


def test_hit_rate_and_time_weighted_utilization():
    assert metrics.hit_rate(30, 70) == 0.3 and metrics.hit_rate(0, 0) == 0.0
    u = metrics.utilization([(0.0, 2, 0), (1.0, 4, 2), (3.0, 0, 0)], num_pages=8)
    # 2 pages for 1 s, then 4 used (+2 cached) for 2 s
    assert u["used"] == pytest.approx((2 * 1 + 4 * 2) / 3 / 8)
    assert u["held"] == pytest.approx((2 * 1 + 6 * 2) / 3 / 8)
    assert metrics.utilization([(5.0, 3, 1)], 4) == {"used": 0.75, "held": 1.0}


def test_bad_timelines_are_refused():
    with pytest.raises(ValueError, match="token_times is empty"):
        Timeline(0.0, ())
    with pytest.raises(ValueError, match="not before the arrival"):
        Timeline(1.0, (0.5,))
    with pytest.raises(ValueError, match="timelines is empty"):
        metrics.duration([])
    with pytest.raises(ValueError, match="duration=0.0"):
        metrics.throughput([Timeline(1.0, (1.0,))])
