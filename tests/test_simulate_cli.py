"""`python -m microbench simulate --quick`: the check against the engine and the on-paper
studies run end to end, write one set of files whose numbers hang together, and bad
options are refused before anything runs."""

from __future__ import annotations

import json

import numpy as np
import pytest

from microbench.cli import main
from microbench.studies.simulate import errors, mape, pair_mape, pair_mapes


def test_quick_simulate_writes_results_and_figures(tmp_path, peaks_here):
    out = tmp_path / "sim"  # the roofline predictor needs this machine's roofs
    assert main(["simulate", "--quick", "--models", "tiny", "--peaks", str(peaks_here),
                 "--out", str(out)]) == 0
    names = {p.name for p in out.iterdir()}
    assert {"simulate.json", "simulate.md", "simulate_check.png"} <= names
    r = json.loads((out / "simulate.json").read_text())
    check = r["check"]
    assert [m["model"] for m in check["models"]] == list(check["check"]["models"])
    repeats = check["check"]["engine_repeats"]
    for m in check["models"]:
        # the roofline's cost per kernel, measured on one call, and every call's kernels
        assert m["machine"]["per_kernel_s"] > 0
        assert set(m["machine"]["kernels"]) == set(m["table_before_s"])
        for run in m["runs"]:
            assert len(run["engine_runs"]) == len(run["steps"]) == repeats
            for name in ("engine", "table", "roofline"):
                assert run[name]["e2e_s"] >= run[name]["ttft_s"] > 0
            # a pair of runs per pair; each simulator's MAPE against the runs' mean
            assert len(run["engine"]["pairs"]["e2e_s"]) == repeats * (repeats - 1) // 2
            assert run["table"]["mape"]["e2e_s"] == pytest.approx(
                mape(run["table"]["requests"]["e2e_s"], run["engine"]["requests"]["e2e_s"]))
            # every step of every engine run priced, one row per step shape
            assert run["step"]["steps"] == sum(run["steps"]) == sum(
                s["steps"] for s in run["step"]["shapes"])
    # the verdict is recomputable from what each trace saved
    err = check["errors"]
    runs = [r for m in check["models"] for r in m["runs"]]
    pairs = [x for r in runs for x in r["engine"]["pairs"]["ttft_s"]]
    assert err["spread"]["ttft_s"] == pytest.approx(float(np.median(pairs)))
    assert err["table"]["ttft_ratio"] == pytest.approx(err["table"]["ttft_s"]
                                                       / err["spread"]["ttft_s"])
    assert err["table"]["steps"] == err["roofline"]["steps"] == sum(sum(r["steps"])
                                                                   for r in runs)
    paper = r["paper"]
    assert paper["scale_out"][0]["tp"] >= 1
    pd = paper["pd"]["mixes"][0]["rates"][0]["designs"]
    assert {d["design"] for d in pd} >= {"2 colocated", "1P1D"}
    text = (out / "simulate.md").read_text()
    assert "engine spread" in text and "Per step" in text


@pytest.mark.parametrize(("args", "message"), [
    (["--parts", "everything"], "--parts"),
    (["--models", "gpt-5"], "gpt-5"),
    (["--models", "tiny+flash"], "flash"),
    (["--device", "Z80"], "Z80"),
    (["--requests", "0"], "requests"),
    (["--engine-repeats", "1"], "engine_repeats"),
    (["--peaks", "no/such.json"], "no/such.json"),
])
def test_bad_options_are_refused_before_running(tmp_path, capsys, args, message):
    with pytest.raises(SystemExit) as err:
        main(["simulate", "--quick", "--out", str(tmp_path / "s"), *args])
    assert err.value.code == 2
    assert message in capsys.readouterr().err


def test_spread_and_errors_by_hand():
    """A pair's MAPE is symmetric over the pair's mean; the spread is the median over pairs;
    a simulator's MAPE pools every request of every trace; undefined values (a TPOT of one
    token) are left out."""
    assert pair_mape([1.0, 3.0], [3.0, 3.0]) == pytest.approx(0.5)  # |1 - 3| / 2, then 0
    assert pair_mape([3.0, 3.0], [1.0, 3.0]) == pair_mape([1.0, 3.0], [3.0, 3.0])
    assert pair_mape([None, 2.0], [1.0, 2.2]) == pytest.approx(0.2 / 2.1)
    assert pair_mapes([[1.0], [1.0], [3.0]]) == pytest.approx([0.0, 1.0, 1.0])
    assert mape([1.1, None, 2.0], [1.0, 5.0, 2.5]) == pytest.approx((0.1 + 0.2) / 2)

    def trace(pairs: list[float], sim: float, n: int) -> dict:
        metrics = ("ttft_s", "tpot_s", "e2e_s")
        return {"engine": {"pairs": dict.fromkeys(metrics, pairs),
                           "requests": dict.fromkeys(metrics, [1.0])},
                "table": {"mape": dict.fromkeys(metrics, sim), "n": dict.fromkeys(metrics, n),
                          "requests": dict.fromkeys(metrics, [1.0])}}

    runs = [trace([0.1, 0.1, 0.3], 0.1, 10), trace([0.05], 0.4, 30)]
    err = errors([{"model": "m", "runs": runs}])
    assert err["spread"]["ttft_s"] == pytest.approx(0.1)  # median of 0.05, 0.1, 0.1, 0.3
    assert err["table"]["ttft_s"] == pytest.approx((0.1 * 10 + 0.4 * 30) / 40)
    assert err["table"]["ttft_ratio"] == pytest.approx(3.25)
    assert err["table"]["within_spread"] is False and err["spread_ok"] is True
    runs[1]["table"]["mape"] = dict.fromkeys(("ttft_s", "tpot_s", "e2e_s"), 0.1)
    assert errors([{"model": "m", "runs": runs}])["table"]["within_spread"] is True
