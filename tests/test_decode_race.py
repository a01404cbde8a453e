"""The decode race (microbench.studies.decode): ratios are taken inside each round, the roof is the
slower of the counted bytes and FLOPs, the summary and figure say what the data say, and bad
options are named. Synthetic rounds: the measurement itself is `python -m microbench decode`."""

from __future__ import annotations

import copy

import pytest

from microbench import cli
from microbench.plots.decode import decode_summary, draw_decode, title
from microbench.studies.decode import TARGETS, Setup, summarize

GB = 1e9


def _point(program, batch, step_s, nbytes=1.2e9, flops=None):
    return {"program": program, "batch": batch, "step_s": step_s, "samples": [step_s],
            "bytes": nbytes, "flops": flops if flops is not None else 0.6 * batch * nbytes,
            "kernels": 100}


def _result():
    """Two rounds; round 2's memory is 20% slower and every program with it."""
    rounds = []
    for i, f in enumerate((1.0, 1.2)):
        rounds.append({
            "round": i, "t_start": 0.0, "t_end": 1.0,
            "read_bytes_per_s": [20 * GB / f, 24 * GB / f], "gemm_flops_per_s": 120 * GB,
            "points": [_point("xla", 1, 0.070 * f), _point("native", 1, 0.055 * f),
                       _point("xla", 8, 0.200 * f), _point("native", 8, 0.080 * f)],
            "peers": [{"program": "llama.cpp", "batch": 1, "step_s": 0.060 * f,
                       "samples": [0.060 * f]}],
            "products": [{"form": "xla [K, N]", "rows": 1, "seconds": 0.080 * f,
                          "bytes": 1.1e9, "products": 113},
                         {"form": "native panels", "rows": 1, "seconds": 0.055 * f,
                          "bytes": 1.1e9, "products": 113}]})
    return {"setup": {"model": "llama-309m", "context": 128, "batches": [1, 8]},
            "model": "llama-309m", "params": 309e6, "programs": ["xla", "native"],
            "rounds": rounds, "skipped": [], "targets": TARGETS, "greedy_vs_llamacpp": None,
            "read_program": "C read (2 threads)", "gemm_program": "numpy matmul 2048x2048x2048",
            "environment": {"cpu_model": "test CPU", "cpu_count": 2, "backend": "cpu"}}


def test_ratios_are_taken_inside_each_round():
    r = summarize(_result())
    row = next(x for x in r["table"] if x["program"] == "native" and x["batch"] == 1)
    # 0.060 / 0.055 in both rounds: the drift cancels inside a round
    assert row["over_llama.cpp_rounds"] == pytest.approx([0.060 / 0.055] * 2)
    # the round's roof is its faster read (24 GB/s, then 20): 1.2e9 / 0.055 / 24e9 both times
    assert row["over_read"] == pytest.approx(1.2e9 / 0.055 / 24e9)
    assert row["bound"] == "memory" and row["roof_fraction"] == pytest.approx(
        (1.2e9 / 24e9) / 0.055)


def test_the_roof_is_the_slower_limit():
    res = _result()
    for rnd in res["rounds"]:  # batch 8 with 100x the FLOPs: compute-bound
        for p in rnd["points"]:
            if p["batch"] == 8:
                p["flops"] = 100 * p["bytes"]
    row = next(x for x in summarize(res)["table"] if x["program"] == "xla" and x["batch"] == 8)
    assert row["bound"] == "compute"
    assert row["roof_s"] == pytest.approx(100 * 1.2e9 / 120e9)


def test_summary_and_title_state_the_measured_ratios(tmp_path):
    r = summarize(_result())
    text = decode_summary(r)
    assert "| native | 1 | 60.50 | memory |" in text  # median of 55 and 66 ms
    assert f"{0.060 / 0.055:.2f}x" in text and "llama.cpp: 66.00 ms per step" in text
    t = title(r)
    assert f"native kernel {1.2e9 / 0.055 / 24e9:.2f} of the C read" in t
    assert f"{0.060 / 0.055:.2f}x llama.cpp" in t
    assert f"batch 8, share of its roof: XLA [K, N] {(1.2e9 / 24e9) / 0.200:.2f}" in t
    (png,) = draw_decode(r, tmp_path)
    assert png.stat().st_size > 20_000


def test_a_round_without_llamacpp_claims_nothing_about_it():
    res = _result()
    for rnd in res["rounds"]:
        rnd["peers"] = []
    r = summarize(res)
    assert "llama.cpp" not in title(r)
    assert all("over_llama.cpp" not in row for row in r["table"])


def test_bad_setups_are_named():
    with pytest.raises(ValueError, match="batches"):
        Setup(batches=(1, 0)).check()
    with pytest.raises(ValueError, match="rounds=0"):
        Setup(rounds=0).check()
    with pytest.raises(ValueError, match="no-such"):
        Setup(model="no-such").check()
    with pytest.raises(SystemExit) as e:
        cli.main(["decode", "--batches", "1,x", "--out", "/tmp"])
    assert e.value.code == 2


def test_summarize_does_not_need_the_peers():
    res = copy.deepcopy(_result())
    res["programs"] = ["xla"]
    for rnd in res["rounds"]:
        rnd["points"] = [p for p in rnd["points"] if p["program"] == "xla"]
    r = summarize(res)
    assert [x["program"] for x in r["table"]] == ["xla", "xla"]


def test_products_alone_are_reported_per_form_and_rows():
    r = summarize(_result())
    got = {(p["form"], p["rows"]): p for p in r["products"]}
    assert got[("native panels", 1)]["over_read"] == pytest.approx(1.1e9 / 0.055 / 24e9)
    assert got[("xla [K, N]", 1)]["seconds"] == pytest.approx(0.088)  # median of 80, 96 ms
    assert "| 1 | native panels | 1.10 | 60.50 |" in decode_summary(r)


def test_a_ratio_above_the_read_is_flagged_not_passed_over():
    """Nothing above 1 in the base result: no flag. A product chain timed at 44 GB/s in rounds
    whose reads were 20-24 GB/s is listed, with the run's reads and its fastest read."""
    assert "Above the C read" not in decode_summary(summarize(_result()))
    res = _result()
    for rnd in res["rounds"]:
        rnd["products"][1]["seconds"] = 1.1e9 / 44e9  # 44 GB/s
    text = decode_summary(summarize(res))
    assert "Above the C read of their rounds (median > 1): native panels at 1 rows (44.0 GB/s)" \
        in text
    assert "Faster than every read of the run (24.0 GB/s): native panels at 1 rows" in text
    res["rounds"][0]["read_bytes_per_s"][1] = 50 * GB  # a read taken in a fast moment
    text = decode_summary(summarize(res))
    assert "None is faster than the fastest read of the run (50.0 GB/s)" in text
