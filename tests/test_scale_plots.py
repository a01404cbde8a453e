"""The at-scale figures' claims (microbench.plots.scale: scale-out, PD, AFD) and the
verdicts they read (microbench.studies.scale): every title is computed from the data, SLOs
are judged at p99 and a rate past capacity never counts as sustained."""

from __future__ import annotations

import pytest
from matplotlib.text import Text

from microbench.plots.scale import (
    afd_claim,
    afd_figure,
    pd_claim,
    pd_figure,
    pd_headline,
    pd_sustained,
    pd_tpot_note,
    pd_winners,
    scale_claim,
    scale_figure,
)
from microbench.studies import scale
from refmodel.serving import metrics

SLOS = [{"name": "server", "ttft_s": 2.0, "tpot_s": 0.2},
        {"name": "interactive", "ttft_s": 0.45, "tpot_s": 0.04}]


def _run(rate: float, ttft: float, tpot: float, chips: int = 1) -> dict:
    return {"rate": rate, "rate_per_chip": rate / chips, "p99_ttft_s": ttft, "p99_tpot_s": tpot,
            "slos": {s["name"]: {"ttft_s": s["ttft_s"], "tpot_s": s["tpot_s"],
                                 "meets_p99": ttft <= s["ttft_s"] and tpot <= s["tpot_s"]}
                     for s in SLOS}}


def _model(name: str, tp: int, capacity: float, ttfts, moe=False, speed=1.0) -> dict:
    runs = [_run(f * capacity, t, 0.01, tp) for f, t in zip((0.5, 1.0, 1.5), ttfts,
                                                               strict=True)]
    best = {s["name"]: scale.sustained(runs, s["name"], capacity) for s in SLOS}
    return {"model": name, "moe": moe, "tp": tp, "capacity": capacity, "slos": SLOS,
            "mix": ["chat", 512, 256], "requests": 160 * tp, "runs": runs,
            "sustained_per_chip": {k: v / tp if v else None for k, v in best.items()},
            "pareto": [{"max_running": b, "tokens_per_s_per_chip": 100.0 * b / speed,
                        "tokens_per_s_per_user": 200.0 * speed / b ** 0.3} for b in (1, 16)],
            "assumptions": {"device": "H100 SXM", "tp": tp, "link": "NVLink 4" if tp > 1
                            else None, "weight_dtype": "bfloat16", "kv_dtype": "bfloat16",
                            "max_running": 64 * tp}}


MODELS = [_model("dense-8b", 1, 40.0, (0.03, 0.3, 3.0)),
          _model("moe-30b", 2, 40.0, (0.02, 0.6, 1.5), moe=True, speed=3.0)]


def _design(name, prefill, chips, ttft, tpot) -> dict:
    run = _run(0.0, ttft, tpot, chips)
    return {"design": name, "prefill": prefill, "decode": 0, "chips": chips,
            "p99_ttft_s": ttft, "p99_tpot_s": tpot, "slos": run["slos"]}


def _pd_mix(name: str, table, caps) -> dict:
    """table: (rate, (colocated p99 TTFT, TPOT), (1P3D p99 TTFT, TPOT))."""
    return {"mix": [name, 2048, 64], "slos": SLOS, "capacity_per_instance": 10.0,
            "design_capacity": caps,
            "rates": [{"rate": r, "designs": [_design("4 colocated", 0, 4, *c),
                                              _design("1P3D", 1, 4, *d)]}
                      for r, c, d in table]}


# colocated meets both SLOs up to 20/s; 1P3D keeps TPOT low but its one prefill instance
# queues: it meets server to 40/s (its capacity 45), interactive only at 10/s
LONG = _pd_mix("long", [(10.0, (0.2, 0.03), (0.3, 0.01)), (20.0, (0.4, 0.035), (0.9, 0.01)),
                        (40.0, (2.5, 0.06), (1.5, 0.01))],
               {"4 colocated": 30.0, "1P3D": 45.0})
SHORT = _pd_mix("short", [(10.0, (0.1, 0.01), (0.1, 0.01)), (20.0, (0.1, 0.01), (0.1, 0.01))],
                {"4 colocated": 40.0, "1P3D": 15.0})
PD = {"model": "dense-8b", "mixes": [LONG, SHORT],
      "assumptions": {"device": "H100 SXM", "tp_per_instance": 1, "kv_link": "InfiniBand NDR",
                      "weight_dtype": "bfloat16", "kv_dtype": "bfloat16",
                      "routing": "round-robin", "prefill_policy": "prefill-first",
                      "colocated_policy": "mixed"}}


def _afd(model, moe, ctx, batch, gain, afd_i, base_i, base="tp", size=8, attn=None) -> dict:
    return {"model": model, "moe": moe, "context": ctx, "batch": batch, "n_attn": 16,
            "n_ffn": 16, "gain": gain, "ffn_intensity": afd_i, "colocated_ffn_intensity": base_i,
            "baseline": base, "baseline_size": size, "baseline_attn_tp": attn or size,
            "assumptions": {"attn_chip": "H100 SXM", "link": "InfiniBand NDR",
                            "attn_link": "NVLink 4", "weight_dtype": "bfloat16",
                            "kv_dtype": "bfloat16", "act_dtype": "bfloat16", "total": 32}}


AFD = [_afd("dense-70b", False, 1024, 4, 1.23, 63.0, 32.0),
       _afd("dense-70b", False, 1024, 64, 0.85, 600.0, 240.0),
       _afd("dense-70b", False, 8192, 4, 1.10, 70.0, 32.0),
       _afd("moe-30b", True, 1024, 16, 0.78, 15.0, 29.0, "ep", 32, 2),
       _afd("moe-30b", True, 8192, 16, 0.92, 16.0, 29.0, "ep", 32, 4),
       {"model": "dense-70b", "moe": False, "context": 8192, "batch": 64, "fits": False}]


def test_sustained_is_the_last_rate_meeting_the_slo_at_or_below_capacity():
    runs = [_run(10.0, 0.1, 0.01), _run(20.0, 0.3, 0.01), _run(30.0, 0.5, 0.01),
            _run(40.0, 1.0, 0.01)]
    assert scale.sustained(runs, "interactive", 100.0) == 20.0  # 0.5 s misses 450 ms
    assert scale.sustained(runs, "server", 100.0) == 40.0
    assert scale.sustained(runs, "server", 30.0) == 30.0  # 40/s is past capacity
    assert scale.sustained([_run(10.0, 0.5, 0.01)], "interactive", 100.0) is None


def test_verdicts_are_p99_and_steady_rate_leaves_the_ramps_out():
    tls = {i: metrics.Timeline(0.0, (0.1 * (i + 1), 0.1 * (i + 1) + 0.05)) for i in range(100)}
    s = scale.summary_of(tls, (("a", 9.0, 0.06), ("b", 9.99, 0.04)), 2)
    assert s["p99_ttft_s"] == pytest.approx(9.901) and s["slos"]["a"]["meets_p99"] is False
    assert s["slos"]["b"]["attainment"] == 0.0 and s["slos"]["b"]["meets_p99"] is False
    assert s["slos"]["a"]["attainment"] == pytest.approx(0.9)  # TTFT 9.1 s and up miss
    # completions every 0.1 s from 0.15: the middle half at 10 per second
    assert scale.steady_rate(tls) == pytest.approx(10.0)


def test_scale_claim_ranks_models_by_requests_per_chip_sustained():
    # dense: 40/s on 1 chip (60/s is past capacity); moe: 40/s on 2 chips = 20/chip
    assert scale_claim(MODELS) == ("requests/s per chip sustained within server SLOs (p99): "
                                   "dense-8b 40, moe-30b 20")


def test_pd_verdicts_name_the_design_that_sustains_more():
    assert pd_sustained(LONG, "server") == {"4 colocated": 5.0, "1P3D": 10.0}
    assert pd_sustained(LONG, "interactive") == {"4 colocated": 5.0, "1P3D": 2.5}
    assert pd_sustained(SHORT, "server") == {"4 colocated": 5.0, "1P3D": 2.5}  # capacity 15
    assert pd_winners(LONG) == [("server", 10.0, ["1P3D"]),
                                ("interactive", 5.0, ["4 colocated"])]
    assert pd_claim(LONG) == "server: 1P3D 10/chip; interactive: 4 colocated 5/chip"
    assert pd_tpot_note(PD).endswith("'long' 60 ms vs 10 ms (1P3D); 'short' 10 ms vs 10 ms "
                                     "(1P3D); the TPOT bound of interactive falls between "
                                     "them")
    assert pd_headline(PD) == ("a PD design sustains more requests/s per chip in 1 of 4 cases "
                               "('long' at server); colocated in 3; tied in 0")


def test_afd_claim_says_where_each_design_wins():
    head, behind = afd_claim(AFD)
    assert head == ("AFD ahead in 2 of 5 cases: dense-70b (dense, vs TP 8) at ctx 1k B 4; "
                    "ctx 8k B 4")
    assert behind == "behind: dense-70b 0.85x vs TP 8 (1 case); moe-30b 0.78-0.92x vs EP 32 " \
                     "(2 cases)"


@pytest.mark.parametrize("draw, result, words", [
    (scale_figure, {"scale_out": MODELS}, ["dense-8b 40,", "on paper"]),
    (pd_figure, {"pd": PD}, ["1 of 4 cases", "on paper"]),
    (afd_figure, {"afd": AFD}, ["AFD ahead in 2 of 5 cases", "on paper"]),
])
def test_figures_are_titled_from_the_data(draw, result, words):
    """(Their readability is tests/test_figure_text.py's, on the committed results.)"""
    fig = draw({"paper": result})
    text = " ".join(" ".join(t.get_text().split()) for t in fig.findobj(Text))
    assert all(w.lower() in text.lower() for w in words), text
