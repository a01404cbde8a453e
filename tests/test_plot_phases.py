"""The phase figures say only what their data show: the crossover decision against the
noise, titles computed from the plotted numbers, marks for points outside the prediction band
or above their roof, ridges from microbench.roofline, and one job per piece of work."""

from __future__ import annotations

import copy

import pytest
from matplotlib.text import Text

from microbench import plots
from microbench.phases import sweeps
from microbench.plots import claims
from microbench.plots import points as phase_plots
from microbench.schema import KIND_PHASES, SCHEMA_VERSION, point_sweeps, validate_result


def _t(median, spread=0.0):
    return {"median": median, "p10": median * (1 - spread), "p90": median * (1 + spread)}


# ------------------------------------------------------------------ crossover decision

def test_attention_already_above_at_the_smallest_context_is_not_a_clamped_crossing():
    d = claims.crossover_decision([256, 1024], [_t(7.0, 0.03), _t(12, 0.03)], _t(5.5, 0.1))
    assert d["kind"] == "above" and d["context"] is None
    assert d["label"] == "already above at the smallest context (256)"


def test_crossing_is_reported_between_resolved_points_only():
    d = claims.crossover_decision([100, 400], [_t(1.0, 0.05), _t(4.0, 0.05)], _t(2.0, 0.05))
    assert d["kind"] == "crossing" and d["context"] == pytest.approx(200)
    assert "between 100 and 400" in d["label"]


def test_no_crossing_within_the_noise():
    # the smallest context overlaps the FFN's p10-p90: a crossing cannot be placed
    d = claims.crossover_decision([256, 1024], [_t(5.9, 0.1), _t(10, 0.05)], _t(5.3, 0.15))
    assert d["kind"] == "none" and d["label"].startswith("no crossing resolved within the noise")
    assert "above from 1,024" in d["label"]
    # never clearly above
    d = claims.crossover_decision([256, 1024, 4096], [_t(5.0, 0.2)] * 3, _t(5.2, 0.2))
    assert d == {"kind": "none", "context": None,
                 "label": "no crossing resolved within the noise"}


def test_modelled_series_without_spread_cross_exactly():
    d = claims.crossover_decision([256, 512, 1024], [_t(1.0), _t(2.0), _t(4.0)], _t(3.0))
    assert d["kind"] == "crossing" and 512 < d["context"] < 1024
    assert claims.crossover([256, 512], [4.0, 5.0], 3.0) is None  # no clamp to the first context


# ------------------------------------------------------------------ one job per piece of work

@pytest.mark.parametrize("plan", [sweeps.PhasePlan(), sweeps.quick_plan()])
def test_jobs_time_each_piece_of_work_once_and_share_it(plan):
    jobs = sweeps.jobs(plan)
    keys = [(j.variant, j.phase, j.batch, sweeps.effective_context(j.phase, j.context))
            for j in jobs]
    assert len(keys) == len(set(keys))
    # every point a sweep needs is in a job that names that sweep
    needed = [("roofline", v, "prefill", 1, plan.prefill_len) for v in plan.variants]
    needed += [("roofline", v, ph, 1, plan.context) for v in plan.variants
               for ph in ("decode_attention", "decode_ffn", "decode")]
    needed += [("batch", v, ph, b, plan.context) for v in ("gqa", "gqa moe")
               for b in plan.batches for ph in ("decode_ffn", "decode")]
    needed += [("context", v, "decode_ffn", plan.context_batch, 0)
               for v in plan.context_variants]
    needed += [("context", v, "decode_attention", plan.context_batch, c)
               for v in plan.context_variants for c in plan.contexts]
    by_key = dict(zip(keys, jobs, strict=True))
    for sweep, v, ph, b, c in needed:
        job = by_key[(v, ph, b, sweeps.effective_context(ph, c))]
        assert sweep in job.sweeps, (sweep, v, ph, b, c)
    assert len(jobs) < len(needed)  # decode_ffn of gqa at the context batch, batch 1, ...
    shared = next(j for j in jobs if j.variant == "gqa" and j.phase == "decode_ffn"
                  and j.batch == plan.context_batch)
    if plan.context_batch in plan.batches:
        assert set(shared.sweeps) >= {"batch", "context"}
    assert shared.tags() == {"sweep": shared.sweeps[0], "sweeps": list(shared.sweeps)}
    sweep, variant, *_ = shared  # still unpacks as the old 5-tuple
    assert (sweep, variant) == (shared.sweeps[0], "gqa")


# ------------------------------------------------------------------ a synthetic phases result

ROOFS = {"compute": [
    {"name": "GEMM float32", "kind": "compute", "dtype": "float32", "value": 2e11,
     "p10": 1.9e11, "p90": 2.1e11, "source": "t", "suspect": False},
    {"name": "vector FMA float32", "kind": "compute", "dtype": "float32", "value": 2.2e11,
     "p10": 2e11, "p90": 2.3e11, "source": "t", "suspect": False}],
    "memory": [
    {"name": "L3", "kind": "memory", "level": "L3", "value": 2e11, "p10": 1.8e11,
     "p90": 2.1e11, "source": "t", "suspect": False},
    {"name": "DRAM", "kind": "memory", "level": "DRAM", "value": 4e10, "p10": 3.9e10,
     "p90": 4.1e10, "source": "t", "suspect": False},
    {"name": "DRAM read-only", "kind": "memory", "level": "DRAM read", "value": 2.5e10,
     "p10": 2.4e10, "p90": 2.6e10, "source": "t", "suspect": False}]}


def _point(sweeps_, variant, phase, batch, context, t, ratio=1.0, **extra):
    flops, nbytes = 1e8 * batch, 1.25e8
    timing = {"samples": [t], "calls_per_sample": 1, "median": t, "min": t, "p10": t * 0.97,
              "p90": t * 1.03, "cv": 0.01}
    rate = {"median": flops / t, "p10": flops / t / 1.03, "p90": flops / t / 0.97}
    return {"sweep": sweeps_[0], "sweeps": list(sweeps_), "variant": variant, "phase": phase,
            "batch": batch, "context": context, "flops": flops, "bytes": nbytes,
            "weight_bytes": 1.2e8, "kv_bytes": 4e6, "act_bytes": 1e6,
            "intensity": flops / nbytes, "timing": timing, "flops_per_s": rate,
            "bytes_per_s": {k: nbytes / flops * v for k, v in rate.items()},
            "predicted": {"time_s": t * ratio, "bound": "memory", "memory_level": "DRAM read",
                          "flops_per_s": flops / (t * ratio)},
            "measured_over_predicted": ratio, **extra}


@pytest.fixture
def result():
    steps = {1: 3.2e-3, 2: 3.4e-3, 4: 4.0e-3, 8: 5.8e-3, 16: 9.0e-3}
    pts = [_point(("batch", "roofline") if b == 1 else ("batch",), "gqa", "decode_ffn", b, 64,
                  t, ratio=0.9) for b, t in steps.items()]
    pts += [_point(("batch",), "gqa", "decode", b, 64, 2 * t,
                   ratio=0.11 if b == 16 else 0.9) for b, t in steps.items()]
    pts[-1]["outside_reason"] = "KV cache spills the L3 at batch 16"
    pts += [_point(("roofline",), "gqa", "prefill", 1, 32, 0.05, ratio=0.8, suspect=True,
                   reason="measured above the GEMM roof by more than its spread"),
            _point(("roofline",), "gqa", "decode_attention", 1, 64, 1e-3, ratio=0.3),
            _point(("roofline",), "gqa", "decode", 1, 64, 6e-3, ratio=0.8),
            _point(("context",), "gqa", "decode_ffn", 4, 64, 4e-3),
            *[_point(("context",), "gqa", "decode_attention", 4, c, t) for c, t in
              ((16, 2e-3), (64, 5e-3), (256, 9e-3))]]
    res = {"schema_version": SCHEMA_VERSION, "kind": KIND_PHASES, "machine": "test box",
           "quick": True, "environment": {"backend": "cpu"},
           "model": {"preset": "tiny", "params": 1e6, "dtype": "float32"},
           "peaks": {"machine": "test box", "roofs": ROOFS,
                     "cache_capacities": [["L3", 32 << 20]]},
           "plan": {}, "points": pts, "report": None,
           "modelled": sweeps.modelled()}
    return validate_result(res)


def test_schema_accepts_shared_points_and_names_a_bad_sweeps_list(result):
    assert point_sweeps(result["points"][0]) == ["batch", "roofline"]
    assert point_sweeps({"sweep": "context"}) == ["context"]
    bad = copy.deepcopy(result)
    bad["points"][0]["sweeps"] = ["roofline", "batch"]  # must start with `sweep`
    with pytest.raises(ValueError, match=r"result.points\[0\].sweeps"):
        validate_result(bad)


def test_ridge_is_the_gemm_roof_over_the_points_memory_roof(result):
    r = phase_plots.ridge_of(result, "DRAM read")
    assert r["flops_per_byte"] == pytest.approx(2e11 / 2.5e10)
    assert r["compute"] == "GEMM float32" and r["memory"] == "DRAM read-only"
    assert phase_plots.ridge_of(result, "DRAM")["memory"] == "DRAM"
    assert phase_plots.ridge_of(result)["memory"] == "DRAM read-only"  # main memory's read roof


def test_batch_titles_are_computed_from_the_plotted_data(result):
    fig = plots.batch_figure([result])
    titles = " ".join(ax.get_title() for ax in fig.axes) + " " + fig.get_suptitle()
    assert "costs almost no time" not in titles
    assert "measured step time x2.8 (gqa) from batch 1 to 16" in titles.replace("\n", " ")
    assert "step time x1.8 for x8 tokens (batch 1 to 8)" in titles.replace("\n", " ")
    assert any("Time per decode-FFN step" in ax.get_ylabel() for ax in fig.axes)
    ridge_labels = fig.axes[0].get_legend_handles_labels()[1]
    assert any(lbl.startswith("ridge 8 FLOP/B = GEMM float32 / DRAM read-only")
               for lbl in ridge_labels)


def test_claim_helpers():
    assert claims.ratio_claim("step time", {"a": [(1, 2.0), (8, 3.6)]}) == \
        "step time x1.8 (a) from batch 1 to 8"
    assert claims.below_ridge_claim({"a": [(1, 1.0, 1.0), (4, 4.0, 1.5), (16, 16.0, 4.0)]},
                                8.0) == "below the ridge: a: step time x1.5 for x4 tokens " \
                                        "(batch 1 to 4)"
    assert claims.limit_runs([1, 2, 4, 8], ["w", "w", "kv", "kv"]) == "w at 1-2, kv at 4-8"
    assert claims.gap_claim([0.8, 0.5, 1.0]).startswith("2 of 3 phase points within")
    # a point just outside the band is not printed as its edge
    assert "range 0.748-1.27" in claims.gap_claim([0.7481, 1.0, 1.27])
    kv = [{"preset": "win", "context": c, "kv_bytes": min(c, 512)} for c in (256, 512, 1024)]
    kv += [{"preset": "full", "context": c, "kv_bytes": c} for c in (256, 512, 1024)]
    assert claims.kv_claim(kv) == {"win": "flat from 512", "full": "x2.00 per doubling at 1,024"}
    assert claims.fit_note({"weight_devices": 1, "device": "H100 SXM"}) == ""
    assert claims.fit_note({"weight_devices": 17, "device": "H100 SXM",
                        "weights_dtype": "bfloat16"}) == \
        "bf16 weights do not fit one H100 SXM: 17 devices' worth"


def test_outside_points_carry_their_reason_and_suspects_are_drawn(result):
    notes = phase_plots.Notes()
    fig = plots.throughput_figure([result])
    labels = fig.axes[0].get_legend_handles_labels()[1]
    assert phase_plots.OUTSIDE_LABEL in labels
    assert "KV cache spills the L3 at batch 16" in fig.get_supxlabel()
    gap = plots.gap_figure([result])
    assert "unexplained" in gap.get_supxlabel()  # decode_attention at 0.3 has no reason
    assert phase_plots.SUSPECT_LABEL in gap.axes[0].get_legend_handles_labels()[1]
    roof = plots.phases_roofline_figure([result])  # the headline: flags are in summary.md
    assert roof.axes[0].get_legend() is None and not roof.legends
    assert not any(phase_plots.SUSPECT_LABEL in t.get_text() for t in roof.findobj(Text))
    assert "summary.md" in " ".join(t.get_text() for t in roof.texts)
    assert notes.key({"variant": "v", "phase": "decode", "batch": 1, "context": 1,
                      "measured_over_predicted": 1.1}) is None


def test_headline_says_which_roof_each_phase_reaches_and_labels_points_not_a_legend(result):
    fig = plots.phases_roofline_figure([result])
    ax = fig.axes[0]
    # intensity 0.8 FLOP/B, under the ridge (8): both phases under the 25 GB/s roof, 20 GFLOP/s
    assert claims.roof_share(0.8, 2e9, 2e11, 2.5e10) == (pytest.approx(0.1), "memory")
    assert claims.roof_share(80, 1.9e11, 2e11, 2.5e10) == (pytest.approx(0.95), "compute")
    assert fig.get_suptitle() == "Prefill at 10% of the memory roof, decode at 83% of the " \
                                 "memory roof"
    texts = [t.get_text() for t in ax.texts]
    assert any(t.startswith("DRAM read-only: 25 GB/s") for t in texts)
    assert any(t.startswith("GEMM float32: 200 GFLOP/s") for t in texts)
    assert any(t.startswith("ridge 8 FLOP/B") for t in texts)
    assert sum(t.startswith(("prefill of 32 tokens", "decode step at context 64"))
               for t in texts) == 2
    assert ax.get_legend() is None
    assert "test box" in ax.get_title() and "gqa attention" in ax.get_title()


def test_variants_figure_has_a_panel_per_phase_and_a_label_per_point(result):
    fig = plots.variants_roofline_figure([result])
    pts = [p for p in result["points"] if "roofline" in point_sweeps(p)]
    drawn = fig.axes
    assert [ax.get_title().split(":")[0] for ax in drawn] == \
        ["prefill", "decode attention", "decode FFN", "decode step"]
    labels = [t.get_text() for ax in drawn for t in ax.texts if t.get_text() == "gqa"]
    assert len(labels) == len(pts)


def test_modelled_panels_say_what_bounds_each_point_and_what_does_not_fit(result):
    fig = plots.throughput_figure([result])
    labels = fig.axes[1].get_legend_handles_labels()[1]
    assert any(lbl.startswith("memory-bound: KV-cache reads dominate") for lbl in labels)
    assert any("do not fit one TPU v5e" in lbl for lbl in labels)
    kv_labels = plots.kv_figure([result]).axes[0].get_legend_handles_labels()[1]
    deepseek = next(lbl for lbl in kv_labels if lbl.startswith("deepseek-v3"))
    assert "shipped in fp8" in deepseek and "do not fit one H100 SXM" in deepseek


def test_old_files_without_the_new_fields_still_draw(result):
    old = copy.deepcopy(result)
    for p in old["points"]:
        for key in ("sweeps", "outside_reason", "suspect", "reason"):
            p.pop(key, None)
    for row in old["modelled"]["throughput"] + old["modelled"]["kv"]:
        for key in ("memory_by", "weight_devices", "shipped_dtype"):
            row.pop(key, None)
    for roof in old["peaks"]["roofs"]["memory"]:  # levels named by `level` alone
        for key in ("memory", "access", "main"):
            roof.pop(key)
    upgraded = validate_result(old)  # derives the structured fields again
    fields = lambda res: [(r["memory"], r["access"], r["main"])
                          for r in res["peaks"]["roofs"]["memory"]]
    assert fields(upgraded) == fields(result) == [("L3", "read+write", False),
                                                  ("DRAM", "read+write", True),
                                                  ("DRAM", "read", True)]
    for name in plots.PHASE_FIGURES:
        fig = plots.FIGURES[name]([upgraded])
        assert fig.axes, name



def test_a_reason_says_its_op_time_is_a_separate_profile_and_never_blames_a_faster_point():
    """The op clause of a reason comes from a separate profiled run (its share can pass 100%
    of the timed call); a point that ran faster than predicted is not explained by the op
    that 'lost the most time'."""
    reason = ("XLA's own GEMM float32 (XLA) reaches 208 GFLOP/s against the roof's 203: "
              "against it measured/predicted = 0.56; most time lost in kv_expand: 26.70 ms "
              "(121% of the call) against 11.93 ms at its roofs, at 90.6 GFLOP/s")
    short = claims.short_reason(reason, 0.75)
    assert short.startswith("most time lost in kv_expand: 26.70 ms in a separate profile "
                            "(121% of the timed call)")
    assert "(121% of the call)" not in claims.reason_text(reason)
    faster = ("XLA's own DRAM read-only reaches 32.2 GB/s: against it measured/predicted = "
              "1.35; most time lost in ffn_up: 1.67 ms (55% of the call) against 1.46 ms; "
              "measured 1.27x faster than predicted")
    assert claims.short_reason(faster, 1.27) == "measured 1.27x faster than predicted"
    assert claims.short_reason(faster).startswith("most time lost in ffn_up")  # no ratio
    assert claims.short_reason("unexplained", 1.3) == \
        "ran faster than predicted, no measured reason recorded"
    assert claims.reason_text(faster, 1.27).startswith("measured 1.27x faster than predicted; ")
    notes = phase_plots.Notes()
    point = {"variant": "sliding", "phase": "decode_ffn", "batch": 1, "context": 1024,
             "measured_over_predicted": 1.27, "outside_reason": faster}
    notes.key(point)
    assert "most time lost" not in notes.text() and "1.27x faster" in notes.text()
