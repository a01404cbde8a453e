"""Colocated deployments on paper (refmodel/sim/colocated.py), what AFD is judged against:
tensor parallelism by hand (MLA's latent read whole, GQA split at most K ways), expert
parallelism with its all-to-all by hand, the best deployment on the scale-up link, bad input."""

from __future__ import annotations

import dataclasses

import pytest

from refmodel import costs, presets
from refmodel.sim import colocated
from refmodel.sim.cluster import Chip, Link

TINY = presets.get("tiny")  # float32, L = 2, D = 64, K = 2, dense FFN
TINY_MOE = dataclasses.replace(TINY, name="tiny-moe", ffn="moe")  # E = 8, top-2
TINY_MLA = dataclasses.replace(TINY, name="tiny-mla", attention="mla")
MEM_BOUND = Chip("mem-bound", flops=1e30, bandwidth=1e9, memory=1e9, dtype="float32")
LINK = Link("link", bandwidth=1e9, latency=1e-6)


def _bytes(cfg, phase, rows, context):
    return costs.phase_costs(cfg, phase, rows, context, count="engine")["bytes"]


def test_colocated_tensor_parallel_by_hand():
    c = colocated.colocated_step(TINY, MEM_BOUND, LINK, 4, 2, 16, tp=2)
    L, rows = TINY.n_layers, 2 * 2
    assert c["layer"]["attention"] == pytest.approx(
        _bytes(TINY, "decode_attention", rows, 16) / (L * 2) / 1e9, rel=1e-12)
    assert c["layer"]["comm"] == pytest.approx(2 * LINK.all_reduce(rows * 64 * 4, 2))
    assert c["tokens_per_s_per_chip"] == pytest.approx(2 / c["step"])
    small = Chip("small", 1e30, 1e9, memory=2e5, dtype="float32")
    assert colocated.colocated_step(TINY, small, LINK, 4, 1, 16)["tp"] > 1  # smallest that fits


def test_tensor_parallel_attention_reads_mlas_latent_whole_and_splits_gqa_at_most_k_ways():
    parts = costs.phase_costs(TINY_MLA, "decode_attention", 4, 16, count="engine")
    c = colocated.colocated_step(TINY_MLA, MEM_BOUND, LINK, 2, 2, 16, tp=2)
    per_chip = (parts["weight_bytes"] + parts["act_bytes"]) / 2 + parts["kv_bytes"]
    assert c["layer"]["attention"] == pytest.approx(per_chip / TINY.n_layers / 1e9)
    assert colocated.kv_split(TINY_MLA, 8) == 1
    assert [colocated.kv_split(TINY, t) for t in (1, 2, 4)] == [1, 2, 2]  # tiny has K = 2


def test_expert_parallel_by_hand():
    wide = Link("wide", bandwidth=1e10, latency=2e-6)
    c = colocated.expert_parallel_step(TINY_MOE, MEM_BOUND, wide, 8, 4, 4, 16, microbatches=2,
                                 domain=2)
    L, rows = TINY_MOE.n_layers, 2
    # 4 experts' chips in 2 nodes of 2: a token crosses to the other node if one of its 2
    # experts is there: 1 x (1 - (1/2)^2) = 0.75 copies, there (dispatch) and back (combine)
    assert c["copies"] == pytest.approx(0.75)
    assert c["layer"]["comm"] == pytest.approx(2 * wide.send(rows * 0.75 * 64 * 4))
    assert c["layer"]["ffn"] == pytest.approx(
        _bytes(TINY_MOE, "decode_ffn", 4 * rows, 16) / (L * 4) / 1e9, rel=1e-12)
    assert c["layer"]["attention"] == pytest.approx(
        _bytes(TINY_MOE, "decode_attention", rows, 16) / L / 1e9, rel=1e-12)
    t = c["layer"]
    assert t["layer_time"] == pytest.approx(max(2 * (t["attention"] + t["ffn"]), 2 * t["comm"],
                                                t["attention"] + t["ffn"] + t["comm"]))
    assert c["tokens_per_s_per_chip"] == pytest.approx(4 / c["step"])
    one_node = colocated.expert_parallel_step(TINY_MOE, MEM_BOUND, wide, 8, 4, 4, 16, domain=4)
    assert one_node["copies"] == pytest.approx(3 * (1 - 0.75 ** 2))  # to chips, not nodes


def test_baseline_prices_tensor_parallelism_on_the_scale_up_link():
    slow = Link("slow", bandwidth=1e6, latency=1e-3)
    fast = Link("fast", bandwidth=1e12, latency=0.0)
    chip = Chip("gpu", flops=1e12, bandwidth=1e9, memory=1e9, dtype="float32")
    inside = colocated.baseline(TINY, chip, fast, slow, 4, 8, 2, 16)
    assert inside["best"]["kind"] == "tp" and inside["best"]["assumptions"]["link"] == "fast"
    assert {(t["size"], t["link"]) for t in inside["tried"]} >= {(4, "fast"), (8, "slow")}
    # the largest group inside a domain wins here: weights dominate and TP splits them
    assert inside["best"]["tp"] == 4
    moe = colocated.baseline(TINY_MOE, chip, fast, slow, 4, 8, 2, 16)
    assert {t["kind"] for t in moe["tried"]} == {"tp", "ep"}
    best = max(t["tokens_per_s_per_chip"] for t in moe["tried"] if t["fits"])
    assert moe["best"]["tokens_per_s_per_chip"] == best


@pytest.mark.parametrize("call, match", [
    (lambda: colocated.colocated_step(TINY, MEM_BOUND, LINK, 4, 2, 16, tp=3),
     "tp=3: must divide n=4"),
    (lambda: colocated.colocated_step(TINY, MEM_BOUND, LINK, 4, 6, 16, microbatches=4),
     "batch=6 is not divisible by microbatches=4"),
    (lambda: colocated.baseline(TINY, MEM_BOUND, LINK, LINK, 4, 4, 5, 16, microbatches=(2, 4)),
     "none divides batch=5"),
    (lambda: colocated.expert_parallel_step(TINY, MEM_BOUND, LINK, 4, 2, 2, 16),
     "expert parallelism needs an MoE model"),
    (lambda: colocated.expert_parallel_step(TINY_MOE, MEM_BOUND, LINK, 4, 3, 2, 16),
     "ep=3: must divide n=4"),
    (lambda: colocated.expert_parallel_step(TINY_MOE, MEM_BOUND, LINK, 4, 2, 2, 16, attn_tp=0),
     "attn_tp=0"),
])
def test_bad_input_names_field_value_and_what_is_allowed(call, match):
    with pytest.raises(ValueError, match=match):
        call()
