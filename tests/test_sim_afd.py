"""Attention-FFN disaggregation on paper (refmodel/sim/afd.py): stage times by hand, the
serial m = 1 case, ping-pong, bytes per layer and the copies a token needs, the colocated
identity, the search at equal load, bad input."""

from __future__ import annotations

import dataclasses

import pytest

from refmodel import costs, presets
from refmodel.sim import afd, colocated
from refmodel.sim.cluster import Chip, Link

TINY = presets.get("tiny")  # float32, L = 2, D = 64, dense FFN
TINY_MOE = dataclasses.replace(TINY, name="tiny-moe", ffn="moe")  # E = 8, top-2
MEM_BOUND = Chip("mem-bound", flops=1e30, bandwidth=1e9, memory=1e9, dtype="float32")
LINK = Link("link", bandwidth=1e9, latency=1e-6)


def _bytes(cfg, phase, rows, context):
    return costs.phase_costs(cfg, phase, rows, context, count="engine")["bytes"]


def test_stage_times_by_hand():
    n_a, n_f, batch, ctx, L = 3, 2, 4, 16, TINY.n_layers
    r = afd.afd_step(TINY, MEM_BOUND, MEM_BOUND, LINK, n_a, n_f, batch, ctx, microbatches=2)
    rows = batch // 2
    assert r["layer"]["attention"] == pytest.approx(
        _bytes(TINY, "decode_attention", rows, ctx) / L / 1e9, rel=1e-12)
    assert r["layer"]["ffn"] == pytest.approx(
        _bytes(TINY, "decode_ffn", n_a * rows, ctx) / (L * n_f) / 1e9, rel=1e-12)
    # A dense FFN is tensor parallel: every row goes to both FFN chips. The busier port: an
    # FFN chip receives 3 x 2 rows (an attention chip sends 2 x 2) of 64 float32.
    assert r["layer"]["comm"] == pytest.approx(1e-6 + 6 * 64 * 4 / 1e9)
    assert r["copies"] == 2
    assert r["ffn_tokens"] == n_a * rows
    assert r["tokens_per_s_per_chip"] == pytest.approx(n_a * batch / r["step"] / (n_a + n_f))


def test_one_microbatch_is_the_serial_sum_exactly():
    r = afd.afd_step(TINY, MEM_BOUND, MEM_BOUND, LINK, 2, 1, 4, 16, microbatches=1)
    t = r["layer"]
    assert t["layer_time"] == t["attention"] + t["ffn"] + 2 * t["comm"]
    assert r["binds"] == "dependency" and not r["comm_hidden"]


def test_bytes_per_layer_are_activations_there_and_back():
    r = afd.afd_step(TINY, MEM_BOUND, MEM_BOUND, LINK, 3, 2, 4, 16, microbatches=4)
    # there and back, 3 x 4 rows, each to both FFN chips, D float32
    assert r["bytes_per_layer"] == 2 * (3 * 4) * 2 * TINY.d_model * 4
    half = afd.afd_step(TINY, MEM_BOUND, MEM_BOUND, LINK, 3, 2, 4, 16, act_dtype="bfloat16")
    assert half["bytes_per_layer"] == r["bytes_per_layer"] / 2


def test_ping_pong_hides_a_free_link_once_enough_microbatches_are_in_flight():
    free = Link("free", bandwidth=1e30, latency=0.0)
    for m in (1, 2, 4, 8):
        r = afd.afd_step(TINY, MEM_BOUND, MEM_BOUND, free, 2, 2, 8, 64, microbatches=m)
        t = r["layer"]
        assert t["comm"] == pytest.approx(0.0, abs=1e-20)
        expected = max(m * max(t["attention"], t["ffn"]), t["attention"] + t["ffn"])
        assert t["layer_time"] == pytest.approx(expected)
        assert r["comm_hidden"] == (m >= 2)
    slow = Link("slow", bandwidth=1e6, latency=1e-3)  # comm dominates: it binds
    assert afd.afd_step(TINY, MEM_BOUND, MEM_BOUND, slow, 2, 2, 8, 64, 4)["binds"] == "comm"


def test_colocated_is_afd_on_one_pair_of_chips_without_the_hops():
    a = afd.afd_step(TINY, MEM_BOUND, MEM_BOUND, LINK, 1, 1, 4, 16, microbatches=1)
    c = colocated.colocated_step(TINY, MEM_BOUND, LINK, 1, 4, 16, tp=1)
    assert c["step"] == pytest.approx(a["step"] - 2 * TINY.n_layers * a["layer"]["comm"])
    assert c["layer"]["comm"] == 0.0  # an all-reduce over one chip moves nothing


def test_afd_is_compared_at_equal_load():
    chip = Chip("gpu", flops=1e12, bandwidth=1e9, memory=1e9, dtype="float32")
    r = afd.best_ratio(TINY_MOE, chip, LINK, total=6, batch=4, context=32, scale_up=LINK,
                       domain=2)
    b = r["best"]
    assert b["sequences"] == 6 * 4
    assert b["assumptions"]["batch_per_attn_chip"] * b["assumptions"]["n_attn"] >= 24
    # the same sequences either way: the throughput gain is the per-user speed gain
    assert r["gain"] == pytest.approx(b["tokens_per_s_per_chip"]
                                      / r["colocated"]["tokens_per_s_per_chip"])
    assert r["gain"] == pytest.approx(b["tokens_per_s_per_user"]
                                      / r["colocated"]["tokens_per_s_per_user"])


def test_shards_a_token_reaches():
    assert afd.shards_touched(TINY, 3) == 3.0  # a dense FFN: every tensor-parallel shard
    assert afd.shards_touched(TINY_MOE, 4) == pytest.approx(4 * (1 - 0.75 ** 2))
    assert afd.destinations(12, None) == 12 and afd.destinations(12, 8) == 2


def test_moe_ffn_intensity_grows_with_the_tokens_it_sees():
    dense = [afd.afd_step(TINY, MEM_BOUND, MEM_BOUND, LINK, n, 1, 2, 16)["ffn_intensity"]
             for n in (1, 2, 4, 8)]
    moe = [afd.afd_step(TINY_MOE, MEM_BOUND, MEM_BOUND, LINK, n, 1, 2, 16)["ffn_intensity"]
           for n in (1, 2, 4, 8)]
    assert all(b > a for a, b in zip(dense, dense[1:], strict=False))
    assert all(b > a for a, b in zip(moe, moe[1:], strict=False))
    assert moe[0] < dense[0]  # 2 tokens touch few experts but read each one whole


def test_best_ratio_is_the_best_fitting_split_and_gain_is_against_colocated():
    chip = Chip("gpu", flops=1e12, bandwidth=1e9, memory=1e9, dtype="float32")
    r = afd.best_ratio(TINY_MOE, chip, LINK, total=6, batch=4, context=32)
    best = max(t["tokens_per_s_per_chip"] for t in r["tried"] if t["fits"])
    assert r["best"]["tokens_per_s_per_chip"] == best
    assert r["n_attn"] + r["n_ffn"] == 6
    assert {t["microbatches"] for t in r["tried"]} == {1, 2, 3, 4}
    assert all(t["batch"] % t["microbatches"] == 0 for t in r["tried"])
    assert r["gain"] == pytest.approx(best / r["colocated"]["tokens_per_s_per_chip"])
    rows = afd.when_it_pays([TINY, TINY_MOE], chip, LINK, 4, [16], [2], microbatches=(1, 2))
    assert [(row["model"], row["moe"]) for row in rows] == [("tiny", False), ("tiny-moe", True)]
    assert all(row["assumptions"]["total"] == 4 for row in rows)


@pytest.mark.parametrize("call, match", [
    (lambda: afd.afd_step(TINY, MEM_BOUND, MEM_BOUND, LINK, 0, 1, 2, 16), "n_attn=0"),
    (lambda: afd.afd_step(TINY, MEM_BOUND, MEM_BOUND, LINK, 1, 1, 2, 16, 0), "microbatches=0"),
    (lambda: afd.afd_step(TINY, MEM_BOUND, MEM_BOUND, LINK, 1, 1, 6, 16, 4),
     "batch=6 is not divisible by microbatches=4"),
    (lambda: afd.afd_step(TINY, MEM_BOUND, MEM_BOUND, LINK, 1, 1, 2, 16, kv_dtype="fp3"),
     "kv_dtype='fp3'"),
    (lambda: afd.best_ratio(TINY, MEM_BOUND, LINK, 1, 2, 16), "total=1"),
    (lambda: afd.best_ratio(TINY, MEM_BOUND, LINK, 4, 5, 16, microbatches=()),
     "microbatches=()"),
    (lambda: afd.afd_step(TINY, MEM_BOUND, MEM_BOUND, LINK, 3, 1, 2, 16, attn_tp=2),
     "attn_tp=2: must divide n_attn=3"),
    (lambda: afd.best_ratio(TINY, Chip("no", 1e12, 1e9, memory=1.0), LINK, 4, 2, 16),
     "no n_attn:n_ffn split fits"),
])
def test_bad_input_names_field_value_and_what_is_allowed(call, match):
    with pytest.raises(ValueError, match=match):
        call()
