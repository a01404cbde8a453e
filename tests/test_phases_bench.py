"""The phase benchmark: result schema, that the timed callable is the counted one, and that
every phase figure draws from a saved result (the prediction arithmetic is tested in
test_mb_roofline and test_mb_prediction). No timing assertions."""

from __future__ import annotations

import copy
import dataclasses
import json

import numpy as np
import pytest

import refmodel
from microbench import plots
from microbench.phases import points as mp
from microbench.phases import suite, sweeps
from microbench.plots import claims, summary
from microbench.schema import point_sweeps, validate_result
from refmodel import backends, costs

ROOFS = {"compute": [{"name": "GEMM float32", "kind": "compute", "dtype": "float32",
                      "value": 2e11, "p10": 1.9e11, "p90": 2.1e11, "source": "test",
                      "suspect": False}],
         "memory": [{"name": "L2", "kind": "memory", "level": "L2", "value": 4e11, "p10": 3e11,
                     "p90": 5e11, "source": "test", "suspect": False},
                    {"name": "DRAM", "kind": "memory", "level": "DRAM", "value": 5e10,
                     "p10": 4e10, "p90": 6e10, "source": "test", "suspect": False}]}
PEAKS = {"machine": "test machine", "roofs": ROOFS, "environment": {"backend": "cpu"},
         "sweep": {"cache_capacities": [["L2", 1 << 20], ["L3", 32 << 20]]}}
# context_batch = 1: the context sweep's points at context 8 are roofline points (one compile)
TINY_PLAN = sweeps.PhasePlan(model="tiny", variants=("gqa", "gqa moe"), prefill_len=8,
                             context=8, batches=(1, 4), contexts=(8, 32),
                             context_variants=("gqa",), context_batch=1,
                             timing=mp.Budget(budget_s=0.01, min_samples=2, min_sample_s=1e-4))


@pytest.fixture(scope="module")
def result(tmp_path_factory):
    out = tmp_path_factory.mktemp("phases")
    res = suite.measure_phases(TINY_PLAN, PEAKS, quick=True, out_dir=out, progress=False)
    return res, out


def test_points_carry_the_counted_costs_of_the_same_phase(result):
    res, _ = result
    assert {p["phase"] for p in res["points"]} == set(refmodel.PHASES)
    for p in res["points"]:
        cfg = sweeps.config(TINY_PLAN, p["variant"])
        counted = costs.phase_costs(cfg, p["phase"], p["batch"], p["context"])
        assert p["flops"] == counted["flops"] and p["bytes"] == counted["bytes"]
        assert p["intensity"] == pytest.approx(counted["flops"] / counted["bytes"])
        t = p["timing"]["median"]
        assert p["flops_per_s"]["median"] == pytest.approx(counted["flops"] / t)
        assert p["measured_over_predicted"] == pytest.approx(p["predicted"]["time_s"] / t)


def test_points_time_the_products_the_plan_chose(result):
    """The plan's backend "auto" (refmodel.backends.choose) is what every point says it timed;
    a plan told "xla" builds XLA's model."""
    res, _ = result
    assert res["plan"]["backend"] == "auto"
    assert {p["backend"] for p in res["points"]} == {backends.choose("auto")}
    xla = dataclasses.replace(TINY_PLAN, backend="xla")
    assert {sweeps.config(xla, v).backend for v in xla.variants} == {"xla"}


def test_decode_ffn_intensity_grows_with_batch_in_the_saved_points(result):
    res, _ = result
    ffn = {p["batch"]: p["intensity"] for p in res["points"]
           if p["sweep"] == "batch" and p["variant"] == "gqa" and p["phase"] == "decode_ffn"}
    assert ffn[4] / ffn[1] == pytest.approx(4, rel=0.25)


def test_decode_phases_are_timed_cold_and_prefill_warm(result):
    """Every decode point is timed with the caches evicted before each call and says so; a
    prefill point is timed warm."""
    res, _ = result
    for p in res["points"]:
        cold = p["phase"] != "prefill"
        assert p["cold"] is cold and p["timed"].startswith("cold" if cold else "warm")


def test_the_timed_callable_is_the_phases_jitted_function(monkeypatch):
    """measure_point lowers exactly phases.jitted[phase], the callable the check lowers."""
    phases = refmodel.Phases(refmodel.init(refmodel.presets.get("tiny")))
    lowered = []
    for name in refmodel.PHASES:
        original = phases.jitted[name]

        class Spy:
            def __init__(self, fn, name):
                self.fn, self.name = fn, name

            def lower(self, *args):
                lowered.append(self.name)
                return self.fn.lower(*args)

        monkeypatch.setitem(phases.jitted, name, Spy(original, name))
        mp.measure_point(phases, name, 1, 4, PEAKS, TINY_PLAN.timing)
    assert lowered == list(refmodel.PHASES)


def test_moe_decode_ffn_points_carry_the_experts_their_tokens_touched(result):
    """Every MoE decode_ffn point records the distinct experts its tokens chose in each layer
    (between top_k and min(E, B top_k)), the count's expectation and the prediction over
    the experts it touched; dense points and other phases carry none."""
    res, _ = result
    cfg = sweeps.config(TINY_PLAN, "gqa moe")
    E, A = cfg.n_experts, cfg.top_k
    moe_ffn = [p for p in res["points"] if p["variant"] == "gqa moe" and p["phase"] == "decode_ffn"]
    assert moe_ffn
    for p in moe_ffn:
        ex = p["experts"]
        assert len(ex["touched"]) == cfg.n_layers
        assert all(A <= n <= min(E, p["batch"] * A) for n in ex["touched"])
        assert ex["counted"] == pytest.approx(
            refmodel.moe.expected_distinct_experts(p["batch"], E, A))
        assert ex["mean"] == pytest.approx(np.mean(ex["touched"]))
        assert "measured_over_predicted" in ex
    assert all("experts" not in p for p in res["points"]
               if p["variant"] != "gqa moe" or p["phase"] != "decode_ffn")


def test_experts_touched_is_the_routing_decode_ffn_runs(monkeypatch):
    """Phases.experts_touched counts what the phase itself routes: MoE.route spied while
    decode_ffn runs (eagerly) on the same x, layer by layer; identical tokens touch top_k."""
    cfg = dataclasses.replace(refmodel.presets.get("tiny"), ffn="moe")
    phases = refmodel.Phases(refmodel.init(cfg, seed=0))
    x = phases.hidden(6, seed=3)
    want = phases.experts_touched(x)
    seen = []
    route = refmodel.moe.MoE.route

    def spy(self, h):
        weights, idx = route(self, h)
        seen.append(int(np.unique(np.asarray(idx)).size))
        return weights, idx

    monkeypatch.setattr(refmodel.moe.MoE, "route", spy)
    from refmodel.phases import decode_ffn
    decode_ffn(phases.graphdef, phases.state, x)
    monkeypatch.undo()
    assert seen == want and len(want) == cfg.n_layers
    same = phases.experts_touched(np.repeat(np.asarray(x[:1]), 6, axis=0))
    assert same == [cfg.top_k] * cfg.n_layers


def test_phases_result_validates_and_bad_fields_are_named(result):
    res, out = result
    saved = json.loads((out / "phases.json").read_text())
    assert validate_result(saved)["kind"] == "microbench.phases"
    bad = copy.deepcopy(saved)
    bad["points"][0]["phase"] = "decode_everything"
    with pytest.raises(ValueError, match=r"result.points\[0\].phase"):
        validate_result(bad)
    bad = copy.deepcopy(saved)
    bad["points"][1]["timing"]["samples"] = []
    with pytest.raises(ValueError, match=r"result.points\[1\].timing.samples"):
        validate_result(bad)
    bad = copy.deepcopy(saved)
    del bad["modelled"]
    with pytest.raises(ValueError, match="result.modelled"):
        validate_result(bad)


def test_every_phase_figure_draws_from_the_saved_result(result):
    res, out = result
    saved = json.loads((out / "phases.json").read_text())
    for name in plots.PHASE_FIGURES:
        fig = plots.FIGURES[name]([saved])
        axes = fig.get_axes()
        assert axes and all(ax.get_xlabel() for ax in axes), name
        assert any(ax.get_lines() or ax.patches or ax.collections for ax in axes), name
    roof = plots.phases_roofline_figure([saved]).get_axes()[0]
    assert roof.get_xscale() == "log" and roof.get_yscale() == "log"


def test_summary_table_lists_every_roofline_point_and_every_point_outside_the_band(result):
    res, _ = result
    peaks = {**PEAKS, "environment": {"date_utc": "2026-11-30", "jax_version": "x"}}
    res = copy.deepcopy(res)
    # a point neither in the roofline sweep nor outside the band: listed only if flagged
    off = next(p for p in res["points"] if "roofline" not in point_sweeps(p))
    off.pop("outside_reason", None)
    off["measured_over_predicted"] = 1.0
    off.update(suspect=True, reason="measured 0.5x the predicted time: a test's reason")
    table = summary.summary_markdown(peaks, res)
    rows = [p for p in res["points"]
            if "roofline" in point_sweeps(p) or "outside_reason" in p or p.get("suspect")]
    lines = [line for line in table.splitlines() if line.startswith(("| gqa |", "| gqa moe |"))]
    assert len(lines) == len(rows)
    for p in rows:
        assert any(line.startswith(f"| {p['variant']} | {p['phase']} |") for line in lines)
    band = summary.band_summary(res["points"])
    assert f"**{band['inside']} of {band['n']} phase points within" in table
    for p in band["outside"]:  # every point outside the band carries its reason in the table
        assert p["outside_reason"] and p["outside_reason"] in table
    # and a point flagged above its roof is listed with its reason, in the sweeps or not
    head = (f"| {summary.summary_row(off)['label']} | {off['phase']} | {off['batch']} | "
            f"{off['context']} |")
    row = [line for line in lines if line.startswith(head)]
    assert len(row) == 1 and "SUSPECT |" in row[0] and "a test's reason" in row[0]


def test_crossover_interpolates_in_log_log():
    assert claims.crossover([100, 400], [1.0, 4.0], 2.0) == pytest.approx(200)
    assert claims.crossover([100, 400], [1.0, 1.5], 2.0) is None


def test_modelled_series_follow_the_cost_model():
    rows = sweeps.modelled_throughput("llama3-8b", ["H100 SXM"], [1, 64], 4096)
    assert rows[1]["tokens_per_s_system"] > rows[0]["tokens_per_s_system"]
    assert rows[1]["tokens_per_s_user"] < rows[0]["tokens_per_s_user"]
    kv = sweeps.modelled_kv(["mistral-7b"], [1024, 65536])
    cfg = refmodel.presets.get("mistral-7b")
    assert kv[1]["kv_bytes"] == costs.kv_cache_bytes(cfg, 65536, 1, "bfloat16")
    assert kv[1]["kv_bytes"] == kv[0]["kv_bytes"] * min(65536, cfg.window) / 1024
    assert np.isfinite([r["step_s"] for r in rows]).all()


def _report(prefill_ratio: float, gemm_spread: float | None) -> dict:
    """A speed report (microbench.phases.report.measure_report's keys) with made-up numbers."""
    rate = {"median": 1.0e11}
    prefill = {"context": 512, "timing": {"median": 2.0}, "flops_per_s": rate,
               "predicted": {"compute_flops_per_s": 1.0e11}}
    rep = {"model": "medium", "params": 3.2e8, "backend": "native",
           "decode": {"context": 128, "timing": {"median": 0.04},
                      "bytes_per_s": {"median": 3.0e10}},
           "decode_over_dram": 0.9, "decode_over_dram_unscaled": 0.9, "decode_drift": 1.0,
           "decode_over_best_dram": 0.7, "dram_roof": "DRAM read-only",
           "dram_roof_bytes_per_s": 3.3e10, "dram_roof_program": "C read", "dram_best": "DRAM",
           "dram_best_bytes_per_s": 4.3e10, "dram_roof_spread": 0.2,
           "prefills": [prefill], "prefill_over_gemm": [prefill_ratio],
           "prefill_over_gemm_unscaled": [0.83], "gemm_roof_flops_per_s": 1.84e11,
           "gemm_roof_program": "numpy", "peer": None}
    if gemm_spread is None:
        del rep["dram_roof_spread"]  # a report saved before the spreads were
    else:
        rep["gemm_roof_spread"] = gemm_spread
    return rep


@pytest.mark.parametrize("ratio,spread,flagged", [(1.48, 0.17, True), (1.10, 0.17, False),
                                                  (0.87, 0.0, False), (1.48, None, False)])
def test_speed_report_flags_a_ratio_above_its_moments_roof(ratio, spread, flagged):
    """A phase faster than the roof of its moment by more than the roof's spread (prefill at
    1.48 of a GEMM probe that read 0.56 of the rounds) is marked
    SUSPECT on its line; within the spread, or a saved report without spreads, is not."""
    lines = summary.format_report(_report(ratio, spread)).splitlines()
    prefill = next(line for line in lines if line.startswith("prefill"))
    assert ("SUSPECT" in prefill) is flagged
    assert f"= {ratio:.2f} of the f32 GEMM roof" in prefill
    assert "SUSPECT" not in lines[1]  # the decode at 0.9 of its roof


def test_summary_names_the_probe_its_reference_and_its_agreement():
    def drift(b, a, m=1.0):
        return {"drift": {"before": {"read_bytes_per_s": b}, "after": {"read_bytes_per_s": a},
                          "memory": m, "window": 11}}

    ref = {"probe": "C read probe (2 threads)", "read_bytes_per_s": 43.9e9,
           "gemm_flops_per_s": 208e9}
    follow = [drift(v, v * 1.01, v / 43.9e9) for v in (20e9, 25e9, 30e9, 35e9)]
    phases = {"peaks": {"probe_reference": ref}, "points": follow}
    (line,) = summary.probe_lines(phases)
    assert "C read probe (2 threads), reference 43.9 GB/s (its median in the rounds)" in line
    assert "GEMM probe reference 208 GFLOP/s" in line
    assert "memory factors 0.46-0.80, each the median over 11 neighbouring points'" in line
    assert "correlation 1.00 over 4 points" in line
    crossed = [drift(b, a) for b, a in ((20e9, 35e9), (25e9, 30e9), (30e9, 25e9),
                                        (35e9, 20e9))]
    assert "correlation -0.99" in summary.probe_lines({**phases, "points": crossed})[0]
    assert summary.probe_lines({"peaks": {}, "points": follow}) == []


class _FakeProbe:
    """Reads 20 then 30 GB/s, alternately."""

    name = "fake probe"

    def __init__(self):
        self.n = 0

    def measure(self):
        self.n += 1
        return {"t": float(self.n), "read_bytes_per_s": 2e10 if self.n % 2 else 3e10,
                "gemm_flops_per_s": 2e11}


def test_a_probed_sweep_predicts_from_the_neighbours_probes_and_explains_the_outside():
    peaks = mp.prediction_inputs({**PEAKS, "plan": {"probe_bytes": 1 << 20}, "main_roofs": {
        "probe": {"value": 5e10, "round_values": [5e10]}, "probe_gemm": {"value": 2e11}}})
    plan = dataclasses.replace(TINY_PLAN, variants=("gqa",), batches=(1,), contexts=(8,))
    measured = sweeps.measure(plan, peaks, progress=False, probe=_FakeProbe(),
                              explain_outside=True)
    assert peaks["probe_reference"]["probe"] == "fake probe"  # saved with phases.json's peaks
    n, w = len(measured), mp.WINDOW
    for i, p in enumerate(measured):  # each point's probes read 20 and 30: 25 vs the rounds' 50
        assert p["drift"]["memory"] == pytest.approx(0.5)
        assert p["drift"]["window"] == min(i, w) + min(n - 1 - i, w) + 1
        assert p["predicted"]["drift"]["memory"] == pytest.approx(0.5)
        if "outside_reason" in p:  # measured after the re-prediction, at its roofs
            assert p["breakdown"]["top"]["op"] in p["outside_reason"]
    assert any("outside_reason" in p for p in measured)  # the tiny model sits on its floor
