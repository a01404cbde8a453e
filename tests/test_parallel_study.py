"""`python -m microbench parallel`: the study's numbers follow from refmodel.parallel.comms (the
stacked parts sum to the step, no communication at TP 1, all-to-all bytes as counted by hand,
expert reads saturating at the experts held), "where TP stops paying" is derived from the data,
the figures and summary are drawn from a saved result, and bad options exit 2 naming them."""

from __future__ import annotations

import json

import pytest

from microbench import cli
from microbench.commands.figures import saved_figures
from microbench.plots import parallel as plots
from microbench.studies import parallel
from microbench.studies.scale import chip_of, links_of
from refmodel import presets
from refmodel.parallel import comms

SMALL = dict(models=("llama3-8b",), batches=(1, 64), ep_degrees=(8, 16), ep_batches=(1, 16, 256))


@pytest.fixture(scope="module")
def small():
    return parallel.study(parallel.Setup(**SMALL))


# ------------------------------------------------------------------ tensor parallel

def test_tp_rows_follow_from_comms(small):
    cfg = presets.get("llama3-8b")
    up, _, _ = links_of("H100 SXM")
    chip = chip_of("H100 SXM")
    for s in small["tp"]["series"]:
        assert [r["tp"] for r in s["rows"]] == [1, 2, 4, 8]
        for r in s["rows"]:
            t = r["time"]
            assert sum(r["parts"].values()) == pytest.approx(t["total"], rel=1e-12)
            assert r["chip_s_per_token"] == pytest.approx(t["total"] * r["tp"] / s["batch"])
            assert (t["comm"] == 0 and r["collectives"] == []) == (r["tp"] == 1)
            assert r["assumptions"]["count"] == "engine"
            assert r["assumptions"]["bound"] == parallel.BOUND
    # one row recomputed straight from the cost model
    row = next(s for s in small["tp"]["series"] if s["batch"] == 64
               and s["link"] == up.name)["rows"][2]
    share = comms.per_device(cfg, "decode", 64, 4096, {"tensor": 4}, None, "bfloat16",
                             "bfloat16", "engine")
    assert row["time"] == comms.step_time(share, chip.flops, chip.bandwidth, up.bandwidth,
                                          up.latency)
    # the slower link only adds communication: same memory time, more comm
    pcie = next(s for s in small["tp"]["series"] if s["batch"] == 64
                and s["link"] == "PCIe 5.0 x16")["rows"][2]
    assert pcie["time"]["memory"] == row["time"]["memory"]
    assert pcie["time"]["comm"] > row["time"]["comm"]


def _rows(totals, weights, comm):
    return [{"tp": 2 ** i, "time": {"total": t, "compute": 0.0, "memory": t - c,
                                    "weights": w, "comm": c}}
            for i, (t, w, c) in enumerate(zip(totals, weights, comm, strict=True))]


def test_stops_paying_is_derived_from_the_data():
    # 8 -> 4 (2x) -> 3 (1.33x) -> 2.9: pays up to TP 2 at 1.5x, up to TP 4 at 1.3x
    rows = _rows([8.0, 4.0, 3.0, 2.9], [7.0, 3.5, 1.75, 0.875], [0.0, 0.0, 1.0, 1.9])
    steps = parallel.doublings(rows)
    assert [s["speedup"] for s in steps] == pytest.approx([2.0, 4 / 3, 3 / 2.9])
    assert parallel.stops_paying(steps, 1.5) == 2
    assert parallel.stops_paying(steps, 1.3) == 4
    assert parallel.stops_paying(steps, 1.01) is None
    # comm added 1.0 at 2 -> 4 < weights saved 1.75; 0.9 at 4 -> 8 > 0.875 saved
    assert [s["comm_exceeds_weights_saved"] for s in steps] == [False, False, True]
    assert steps[2]["weights_saved_s"] == pytest.approx(0.875)
    assert steps[2]["comm_added_s"] == pytest.approx(0.9)


def test_series_summaries_match_their_doublings(small):
    for s in small["tp"]["series"]:
        assert s["stops_paying_after"] == parallel.stops_paying(s["doublings"], s["threshold"])
        fits = [r["tp"] for r in s["rows"] if r["fits"]]
        assert s["smallest_fitting_tp"] == (fits[0] if fits else None)


# ------------------------------------------------------------------ expert parallel

def test_ep_all_to_all_and_expert_bytes(small):
    cfg = presets.shipped("deepseek-v3")
    layers = sum(f == "moe" for f in cfg.layer_ffns)
    ep = small["ep"]
    for r in ep["rows"]:
        p, n = r["ep"], r["tokens_per_device"]
        # dispatch + combine, each n A rows of D bf16 per MoE layer, (p - 1) / p leaving
        by_hand = 2 * layers * n * cfg.top_k * cfg.d_model * 2 * (p - 1) / p
        assert r["a2a"]["wire_bytes"] == pytest.approx(by_hand)
        assert r["a2a"]["s"] == pytest.approx(r["a2a"]["bandwidth_s"] + r["a2a"]["latency_s"])
        assert r["link"] == ("NVLink 4" if p <= 8 else "InfiniBand NDR")
        assert r["experts"]["read"] <= r["experts"]["held"] * (1 + 1e-12)
        assert sum(r["parts"].values()) == pytest.approx(r["time"]["total"])
    for p in (8, 16):
        mine = [r for r in ep["rows"] if r["ep"] == p]
        # the all-to-all grows with the tokens; the expert reads saturate at those held
        assert mine[-1]["a2a"]["wire_bytes"] == pytest.approx(256 * mine[0]["a2a"]["wire_bytes"])
        assert mine[-1]["experts"]["read"] == pytest.approx(mine[-1]["experts"]["held"])
        assert mine[-1]["experts"]["held"] == pytest.approx(
            mine[0]["experts"]["held"])
        # what is not a routed expert is read whole at any batch, but the embedding rows: one
        # per token, in bfloat16 beside the FP8 matrices (presets.shipped)
        others = [r["other_weight_bytes"] for r in mine]
        assert max(others) - min(others) == pytest.approx((256 - 1) * cfg.d_model * 2)
    per = {d["ep"]: d for d in ep["per_degree"]}
    rows8 = [r for r in ep["rows"] if r["ep"] == 8]
    assert per[8]["bytes_ratio"] == [rows8[0]["a2a_over_expert_bytes"],
                                     rows8[-1]["a2a_over_expert_bytes"]]


def test_ep_claims_follow_the_rows(small):
    bytes_claim, time_claim = plots.ep_claims(small["ep"])
    lo = min(d["bytes_ratio"][0] for d in small["ep"]["per_degree"])
    assert f"{100 * lo:.2g}" in bytes_claim
    over = small["ep"]["per_degree"][1]["a2a_time_exceeds_expert_reads_from"]
    assert over is not None and f"above the expert reads from {over} token/device" in time_claim
    assert "EP 8 (NVLink 4): below the expert reads" in time_claim


# ------------------------------------------------------------------ figures, summary, command

def test_figures_and_summary_from_saved_json(small, tmp_path):
    saved = json.loads(json.dumps(small))  # what a reader of parallel.json gets
    title = plots.tp_figure(saved).get_suptitle()
    assert "time per step falls, chip-time per token rises" in title
    assert "ms per decode step" in plots.ep_figure(saved).axes[1].get_ylabel()
    md = plots.parallel_summary(saved)
    nv = next(s for s in saved["tp"]["series"] if s["batch"] == 1 and s["link"] == "NVLink 4")
    assert "| llama3-8b | 1 | NVLink 4 |" in md
    assert f"TP {nv['stops_paying_after']} (to" in md
    data = tmp_path / "data"
    data.mkdir()
    (data / "parallel.json").write_text(json.dumps(saved))
    redrawn = saved_figures("parallel", tmp_path / "figs", data)
    assert sorted(p.name for p in redrawn) == ["parallel.md", "parallel_ep.png",
                                               "parallel_tp.png"]
    for p in redrawn:
        if p.suffix == ".png":
            assert p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert (tmp_path / "figs" / "parallel.md").read_text() == md + "\n"
    with pytest.raises(ValueError, match="not a parallel result"):
        plots.draw_parallel({"kind": "quant"}, tmp_path)


def test_command_writes_one_set(tmp_path, capsys):
    out = tmp_path / "p"
    assert cli.main(["parallel", "--models", "llama3-8b", "--batches", "1",
                     "--ep-degrees", "8", "--ep-batches", "1,4", "--no-plot",
                     "--out", str(out)]) == 0
    result = json.loads((out / "parallel.json").read_text())
    assert result["setup"]["models"] == ["llama3-8b"] and result["setup"]["ep_degrees"] == [8]
    assert sorted(p.name for p in out.iterdir()) == ["parallel.json", "parallel.md"]
    assert "TP pays" in capsys.readouterr().out


@pytest.mark.parametrize(("argv", "option"), [
    (["--device", "Z80"], "--device"),
    (["--ep-device", "Z80"], "--ep-device"),
    (["--models", "gpt-5"], "--models"),
    (["--models", "qwen3-30b-a3b"], "--models"),
    (["--ep-model", "llama3-8b"], "--ep-model"),
    (["--ep-degrees", "3"], "--ep-degrees"),
    (["--batches", "0"], "--batches"),
    (["--compare-link", "carrier pigeon"], "--compare-link"),
    (["--threshold", "0.9"], "--threshold"),
])
def test_bad_input_exits_2_naming_the_option(argv, option, tmp_path, capsys):
    with pytest.raises(SystemExit) as exc:
        cli.main(["parallel", *argv, "--out", str(tmp_path / "o")])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert option in err and argv[1] in err and err.count("\n") == 1
    assert not (tmp_path / "o").exists()
