"""The main roofs from interleaved rounds (microbench.roofs.rounds), on synthetic rounds shaped like
`measure_round`'s: the roof is the best program's median over rounds, a memory program of ours
more than 10% above the best peer of its own round (median over rounds) is flagged and never
the roof (a GEMM of ours above numpy is fine), a roof whose rounds disagree by more than 10% is
unstable, and the ratios are per round."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from microbench.roofs import rounds


def prog(metric, program, ours, value, amount=1e9):
    seconds = [amount / value] * 3
    return {"metric": metric, "program": program, "ours": ours, "amount": amount,
            "seconds": seconds, "value": value}


def make_rounds(table: dict[tuple[str, str, bool], list[float]]) -> list[dict]:
    """{(metric, program, ours): [value per round]} -> rounds as measure_round returns them."""
    n = len(next(iter(table.values())))
    out = []
    for i in range(n):
        programs = [prog(m, p, o, vals[i]) for (m, p, o), vals in table.items()]
        out.append({"round": i, "t_start": 100.0 * i, "t_end": 100.0 * i + 50.0,
                    "programs": programs, "skipped": []})
    return out


def test_roof_is_the_best_programs_median_over_rounds():
    rs = make_rounds({
        ("main_read", "XLA read", True): [30e9, 31e9, 29e9],
        ("main_read", "C read", False): [40e9, 44e9, 42e9],
        ("gemm_float32", "XLA GEMM", True): [100e9, 101e9, 99e9],
        ("gemm_float32", "numpy matmul", False): [90e9, 91e9, 89e9],
    })
    out = rounds.derive(rs)
    read = out["main_read"]
    assert read["program"] == "C read" and read["ours_is_roof"] is False
    assert read["value"] == pytest.approx(42e9)
    assert read["p10"] == pytest.approx(40e9) and read["p90"] == pytest.approx(44e9)
    assert read["round_values"] == [40e9, 44e9, 42e9]
    assert read["spread"] == pytest.approx(4e9 / 42e9)
    assert read["ours"]["program"] == "XLA read"
    assert read["best_peer"]["program"] == "C read"
    assert read["ratio_ours_over_best_peer"] == pytest.approx(30e9 / 42e9)
    assert read["ratio_roof_over_best_peer"] == pytest.approx(1.0)
    assert read["suspect"] == []
    gemm = out["gemm_float32"]
    assert gemm["program"] == "XLA GEMM" and gemm["ours_is_roof"] is True
    assert gemm["value"] == pytest.approx(100e9)
    assert gemm["ratio_roof_over_best_peer"] == pytest.approx(100 / 90)
    assert "main_rw" not in out  # a metric nobody measured has no roof


def test_memory_program_of_ours_far_above_every_peer_is_flagged_and_excluded():
    rs = make_rounds({
        ("main_rw", "XLA in-place scale", True): [60e9, 61e9, 59e9],
        ("main_rw", "C triad", False): [40e9, 41e9, 39e9],
        ("main_rw", "numpy multiply", False): [20e9, 21e9, 19e9],
    })
    rw = rounds.derive(rs)["main_rw"]
    assert rw["program"] == "C triad" and rw["value"] == pytest.approx(40e9)
    assert rw["ours_is_roof"] is False
    assert len(rw["suspect"]) == 1
    assert "XLA in-place scale" in rw["suspect"][0] and "C triad" in rw["suspect"][0]
    assert "50%" in rw["suspect"][0]  # the median of the per-round ratios, 1.5
    assert rw["ratio_ours_over_best_peer"] == pytest.approx(1.5)
    assert len(rw["programs"]) == 3  # still reported, just not the roof


def test_ours_within_ten_percent_above_the_best_peer_is_the_roof():
    rs = make_rounds({("main_read", "XLA read", True): [43e9, 44e9, 45e9],
                      ("main_read", "C read", False): [40e9, 40e9, 40e9]})
    read = rounds.derive(rs)["main_read"]
    assert read["suspect"] == [] and read["program"] == "XLA read" and read["ours_is_roof"]
    # exactly at the threshold is not flagged; just above is
    edge = 40e9 * (1 + rounds.SUSPECT_ABOVE_PEER)
    rs = make_rounds({("main_read", "XLA read", True): [edge] * 3,
                      ("main_read", "C read", False): [40e9] * 3})
    assert rounds.derive(rs)["main_read"]["suspect"] == []
    rs = make_rounds({("main_read", "XLA read", True): [edge * 1.001] * 3,
                      ("main_read", "C read", False): [40e9] * 3})
    assert len(rounds.derive(rs)["main_read"]["suspect"]) == 1


def test_a_gemm_of_ours_above_numpy_is_not_flagged():
    rs = make_rounds({("gemm_float32", "XLA GEMM", True): [200e9] * 2,
                      ("gemm_float32", "numpy matmul", False): [100e9] * 2})
    gemm = rounds.derive(rs)["gemm_float32"]
    assert gemm["suspect"] == [] and gemm["program"] == "XLA GEMM"
    assert gemm["value"] == pytest.approx(200e9)


def test_ours_alone_is_the_roof_without_peers():
    rs = make_rounds({("main_read", "XLA read", True): [30e9, 33e9]})
    read = rounds.derive(rs)["main_read"]
    assert read["program"] == "XLA read" and read["best_peer"] is None
    assert read["ratio_ours_over_best_peer"] is None and read["suspect"] == []
    assert read["round_ratios_ours_over_best_peer"] == []


@pytest.mark.parametrize("values, unstable", [([40e9, 44e9, 42e9], False),
                                              ([40e9, 45e9, 42e9], True),
                                              ([42e9], False)])
def test_unstable_when_rounds_disagree_by_more_than_ten_percent(values, unstable):
    rs = make_rounds({("main_read", "C read", False): values})
    read = rounds.derive(rs)["main_read"]
    v = np.asarray(values)
    assert read["spread"] == pytest.approx((v.max() - v.min()) / np.median(v))
    assert read["unstable"] is unstable


def test_round_ratios_compare_within_each_round():
    # drift: both halve in round 2; within each round ours is 0.8 then 0.9 of the best peer
    rs = make_rounds({("main_read", "XLA read", True): [32e9, 18e9],
                      ("main_read", "C read", False): [40e9, 20e9],
                      ("main_read", "C slow", False): [10e9, 10e9]})
    assert rounds._round_ratios(rs, "main_read") == pytest.approx([0.8, 0.9])
    assert rounds.derive(rs)["main_read"]["round_ratios_ours_over_best_peer"] == \
        pytest.approx([0.8, 0.9])
    assert rounds._round_ratios(rs, "main_rw") == []


def test_drift_follows_the_best_program_of_each_round():
    rs = make_rounds({("main_read", "XLA read", True): [30e9, 10e9, 30e9],
                      ("main_read", "C read", False): [40e9, 20e9, 36e9]})
    d = rounds.drift(rs, "main_read")
    assert [p["value"] for p in d["points"]] == [40e9, 20e9, 36e9]
    assert [p["t"] for p in d["points"]] == [0.0, 100.0, 200.0]
    assert d["spread"] == pytest.approx((40e9 - 20e9) / 36e9)
    assert rounds.drift(rs, "main_rw") == {"metric": "main_rw", "points": [], "spread": 0.0}


def test_probes_are_derived_like_roofs():
    rs = make_rounds({("probe", "XLA probe read", True): [5e9, 6e9, 7e9],
                      ("probe_gemm", "XLA probe GEMM", True): [1e10, 1e10, 1e10]})
    out = rounds.derive(rs)
    assert out["probe"]["value"] == pytest.approx(6e9)
    assert out["probe_gemm"]["value"] == pytest.approx(1e10)


def test_flag_compares_within_rounds_so_drift_does_not_flag():
    """Ours ran in fast rounds more often than the best peer's median suggests; within each
    round ours is at most 5% above that round's best peer (one round's 2.5x is an outlier)."""
    rs = make_rounds({("main_read", "XLA read", True): [50e9, 50e9, 20e9],
                      ("main_read", "C read", False): [48e9, 20e9, 19e9]})
    read = rounds.derive(rs)["main_read"]
    assert read["suspect"] == []
    assert read["program"] == "XLA read" and read["value"] == pytest.approx(50e9)
    # the same medians with ours far above the peer in most rounds is flagged
    rs = make_rounds({("main_read", "XLA read", True): [50e9, 50e9, 20e9],
                      ("main_read", "C read", False): [20e9, 40e9, 19e9]})
    read = rounds.derive(rs)["main_read"]
    assert len(read["suspect"]) == 1 and read["program"] == "C read"


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.floats(1e9, 1e11), st.floats(1e9, 1e11), st.floats(1e9, 1e11)),
                min_size=1, max_size=6))
def test_roof_is_the_best_unflagged_program(vals):
    ours, c, npy = zip(*vals, strict=True)
    rs = make_rounds({("main_rw", "XLA scale", True): list(ours),
                      ("main_rw", "C triad", False): list(c),
                      ("main_rw", "numpy", False): list(npy)})
    rw = rounds.derive(rs)["main_rw"]
    per_round = [o / max(a, b) for o, a, b in vals]
    assert rounds._round_ratios(rs, "main_rw") == pytest.approx(per_round)
    flagged = np.median(per_round) > 1 + rounds.SUSPECT_ABOVE_PEER
    assert bool(rw["suspect"]) == flagged
    medians = {"XLA scale": np.median(ours), "C triad": np.median(c), "numpy": np.median(npy)}
    allowed = {k: v for k, v in medians.items() if not (flagged and k == "XLA scale")}
    assert rw["value"] == pytest.approx(max(allowed.values()))
    assert rw["program"] in allowed
    assert rw["value"] >= max(medians["C triad"], medians["numpy"]) * (1 - 1e-12)
