"""`python -m microbench simulate --quick`: the check against the engine and the on-paper
studies run end to end, write one set of files whose numbers hang together, and bad
options are refused before anything runs."""

from __future__ import annotations

import json

import pytest

from microbench.cli import main

PEAKS = "figures/data/peaks.json"  # committed roofs: the roofline predictor needs some


def test_quick_simulate_writes_results_and_figures(tmp_path):
    out = tmp_path / "sim"
    assert main(["simulate", "--quick", "--models", "tiny", "--peaks", PEAKS,
                 "--out", str(out)]) == 0
    names = {p.name for p in out.iterdir()}
    assert {"simulate.json", "simulate.md", "simulate_check.png"} <= names
    r = json.loads((out / "simulate.json").read_text())
    check = r["check"]
    assert [m["model"] for m in check["models"]] == list(check["check"]["models"])
    for m in check["models"]:
        for run in m["runs"]:
            assert len(run["engine_runs"]) == check["check"]["engine_repeats"]
            for name in ("engine", "table", "roofline"):
                assert run[name]["e2e_s"] >= run[name]["ttft_s"] > 0
            # the per-run MAPE is recomputable from the saved run means
    err = check["errors"]
    runs = [r for m in check["models"] for r in m["runs"]]
    table = sum(abs(r["table"]["e2e_s"] - r["engine"]["e2e_s"]) / r["engine"]["e2e_s"]
                for r in runs) / len(runs)
    assert err["table"]["e2e_s"] == pytest.approx(table)
    assert err["engine_vs_engine"]["runs"] == len(runs)
    paper = r["paper"]
    assert paper["scale_out"][0]["tp"] >= 1
    pd = paper["pd"]["mixes"][0]["rates"][0]["designs"]
    assert {d["design"] for d in pd} >= {"2 colocated", "1P1D"}
    text = (out / "simulate.md").read_text()
    assert "MAPE" in text


@pytest.mark.parametrize(("args", "message"), [
    (["--parts", "everything"], "--parts"),
    (["--models", "gpt-5"], "gpt-5"),
    (["--models", "tiny+flash"], "flash"),
    (["--device", "Z80"], "Z80"),
    (["--requests", "0"], "requests"),
    (["--peaks", "no/such.json"], "no/such.json"),
])
def test_bad_options_are_refused_before_running(tmp_path, capsys, args, message):
    with pytest.raises(SystemExit) as err:
        main(["simulate", "--quick", "--out", str(tmp_path / "s"), *args])
    assert err.value.code == 2
    assert message in capsys.readouterr().err
