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


def test_steady_window_leaves_out_warm_up_and_drain():
    # ten requests one second apart, each served in 0.5 s (TTFT 0.1 s, 5 tokens), except the
    # last two, which wait 3 s: the window drops the first and the last (trim 0.1 of 10)
    runs = [Timeline(float(i), tuple(i + (3.0 if i >= 8 else 0.0) + 0.1 * k
                                     for k in range(1, 6))) for i in range(10)]
    s = metrics.steady(runs, ttft_slo=1.0, tpot_slo=0.5, trim=0.1)
    assert (s["start_s"], s["end_s"], s["requests"]) == (1.0, 8.0, 8)
    assert s["arrival_rate"] == pytest.approx(1.0)  # 7 gaps of 1 s
    assert s["slo_attainment"] == pytest.approx(7 / 8)  # request 8 (TTFT 3.1) misses
    assert s["goodput_requests_per_s"] == pytest.approx(7 / 8)
    # completed inside [1, 8]: requests 1..7 (ending 1.5 .. 7.5), over 7 s
    assert s["completed_requests_per_s"] == pytest.approx(7 / 7)
    # over the whole run the same requests read slower: the drain is counted
    assert metrics.summarize(runs, 1.0, 0.5)["requests_per_s"] < 1.0
    with pytest.raises(ValueError, match="trim=0.5"):
        metrics.steady(runs, 1.0, 0.5, trim=0.5)
    with pytest.raises(ValueError, match="finite arrival rate"):
        metrics.steady([Timeline(0.0, (1.0,))] * 5, 1.0, 0.5)
    with pytest.raises(ValueError, match="at least 2 must remain"):
        metrics.steady(runs[:3], 1.0, 0.5, trim=0.4)


def test_completion_rate_is_the_rate_under_a_full_queue():
    # all at t = 0, one completion every 0.25 s: 4 per second between the 10th and 90th
    runs = [Timeline(0.0, (0.25 * (i + 1),)) for i in range(20)]
    assert metrics.completion_rate(runs, trim=0.1) == pytest.approx(4.0)
    with pytest.raises(ValueError, match="complete at once"):
        metrics.completion_rate([Timeline(0.0, (1.0,))] * 10)
