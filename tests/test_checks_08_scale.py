"""Notebook 08's checks on its at-scale results (steps 3-6), fed a right result and a wrong
one: each must pass the first and raise AssertionError on the second."""

from __future__ import annotations

import pytest
from notebook_checks import load_checks

CHECKS = load_checks("08_serving_at_scale")

CASES = {  # name: (arguments that hold, arguments that contradict the lesson)
    # 70B on TP 4 against 8B: the step ratio is the bytes per chip ratio; not divided by TP: 4x
    "check_tp_divides_weight_reads": ((2.41, 2.41), (9.4, 2.41)),
    # all-reduces on NVLink ~9% of a step; priced on a scale-out link, a third of it
    "check_allreduce_share": ((1.1e-3, 12.5e-3), (4.2e-3, 12.5e-3)),
    # the queue past capacity: p99 TTFT grows; a run at capacity past the SLO, or no growth
    "check_queue_past_capacity": (((0.5, 1.0, 2.0, 4.0), (0.019, 0.020, 0.18, 0.40), 2.0),
                                  ((0.5, 1.0, 2.0, 4.0), (0.019, 0.020, 0.021, 0.022), 2.0)),
    "check_kv_moved": ((128 * 1024 * 2048, 2048, 32, 8, 128, 2),
                       (64 * 1024 * 2048, 2048, 32, 8, 128, 2)),  # K or V alone
    "check_decodes_free_of_prefill": ((26.1e-3, 5.7e-3), (5.0e-3, 5.7e-3)),
    "check_afd_gain_needs_pooling": ((1.04, 250.6, 124.8), (1.30, 36.5, 70.4)),
    "check_behind_expert_parallelism": ((0.83, "ep"), (1.5, "ep")),
    # LPUs: faster per user at batch 1, slower per chip at best
    "check_sram_tradeoff": (([414, 356], [152, 95], [0.67, 23.1], [19.0, 764.0]),
                            ([414, 356], [152, 95], [0.67, 900.0], [19.0, 764.0])),
    "check_hybrid_decode": ((2.42e-3, 6.59e-3), (8.0e-3, 6.59e-3)),
}


def test_every_at_scale_check_is_exercised():
    mine = {n for n in CHECKS if n in CASES}
    assert mine == set(CASES), sorted(set(CASES) - mine)


@pytest.mark.parametrize("name", sorted(CASES))
def test_check_passes_a_right_result_and_fails_a_wrong_one(name):
    right, wrong = CASES[name]
    CHECKS[name](*right)
    with pytest.raises(AssertionError):
        CHECKS[name](*wrong)


def test_afd_check_accepts_a_loss_whatever_the_intensities():
    CHECKS["check_afd_gain_needs_pooling"](0.64, 18.5, 36.4)
    CHECKS["check_behind_expert_parallelism"](1.23, "tp")  # the claim is about EP only


def test_queue_check_fails_a_queue_below_capacity():
    with pytest.raises(AssertionError, match="below capacity"):
        CHECKS["check_queue_past_capacity"]((0.5, 1.0, 2.0), (2.5, 3.0, 9.0), 2.0)
