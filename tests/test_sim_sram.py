"""SRAM-only decode on paper (refmodel/sim/sram.py): capacity, pipeline rates by hand,
monotonicity in micro-batches and stages, the TP baseline, heterogeneous TTFT, bad input."""

from __future__ import annotations

import math

import pytest

from refmodel import costs, presets
from refmodel.sim import sram
from refmodel.sim.cluster import Chip, Link

TINY = presets.get("tiny")  # float32, L = 2, D = 64
# Round numbers; flops so high that every stage is memory-bound: time = bytes / 1e9.
MEM_BOUND = Chip("mem-bound", flops=1e30, bandwidth=1e9, memory=1e9, dtype="float32")
LINK = Link("link", bandwidth=1e9, latency=1e-6)
GROQ = Chip("Groq LPU", flops=188e12, bandwidth=80e12, memory=230e6, dtype="float16")
GROQ_C2C = Link("Groq C2C", bandwidth=480e9, latency=1e-6)


def _decode(cfg, batch, context):
    return costs.phase_costs(cfg, "decode", batch, context, count="engine")


def test_llama3_70b_on_groq_needs_ceil_weight_bytes_over_230mb():
    cfg = presets.get("llama3-70b")
    weight = costs.param_counts(cfg)["total"] * 2
    r = sram.chips_needed(cfg, GROQ, "bfloat16", "bfloat16", hold_kv=False)
    assert r["chips"] == r["weight_chips"] == math.ceil(weight / 230e6) == 614
    with_kv = sram.chips_needed(cfg, GROQ, "bfloat16", "bfloat16", batch=1, context=4096)
    kv = costs.kv_cache_bytes(cfg, 4096, 1, "bfloat16")
    assert with_kv["chips"] == math.ceil((weight + kv) / 230e6) > 614
    half = sram.chips_needed(cfg, GROQ, "bfloat16", hold_kv=False, usable=0.5)
    assert half["chips"] == math.ceil(weight / 115e6)


def test_one_chip_is_the_roofline_of_the_whole_decode_step():
    chip = Chip("round", flops=1e12, bandwidth=1e9, memory=1e9, dtype="float32", floor=1e-6)
    r = sram.pipeline_decode(TINY, chip, LINK, chips=1, batch=4, context=16)
    d = _decode(TINY, 4, 16)
    expected = 1e-6 + max(d["flops"] / 1e12, d["bytes"] / 1e9)
    assert r["latency"] == pytest.approx(expected, rel=1e-12)
    assert r["cycle"] == r["latency"]  # one micro-batch: the cycle is the latency
    assert r["tokens_per_s"] == pytest.approx(4 / expected)
    assert r["tokens_per_s_per_user"] == pytest.approx(1 / expected)


def test_two_memory_bound_stages_add_one_hop_and_the_token_id_loop_back():
    batch, context = 4, 16
    r = sram.pipeline_decode(TINY, MEM_BOUND, LINK, chips=2, batch=batch, context=context)
    bytes_ = _decode(TINY, batch, context)["bytes"]
    hop = 1e-6 + batch * 64 * 4 / 1e9  # rows x D x float32
    back = 1e-6 + batch * 4 / 1e9  # int32 token ids
    assert r["hop_time"] == pytest.approx(hop)
    assert sum(r["stage_times"]) == pytest.approx(bytes_ / 1e9, rel=1e-12)
    assert r["latency"] == pytest.approx(bytes_ / 1e9 + hop + back, rel=1e-12)
    assert len(r["stage_times"]) == 2


def test_more_stages_only_add_hops():
    base = sram.pipeline_decode(TINY, MEM_BOUND, LINK, 1, 2, 16)["latency"]
    prev = base
    for chips in (2, 3, 4, 8):
        r = sram.pipeline_decode(TINY, MEM_BOUND, LINK, chips, 2, 16)
        hops = (chips - 1) * r["hop_time"] + LINK.send(2 * sram.TOKEN_ID_BYTES)
        assert r["latency"] == pytest.approx(base + hops, rel=1e-12)
        assert r["latency"] > prev
        prev = r["latency"]


def test_stage_resident_bytes_split_evenly_and_fit_flag():
    r1 = sram.pipeline_decode(TINY, MEM_BOUND, LINK, 1, 2, 16)
    r4 = sram.pipeline_decode(TINY, MEM_BOUND, LINK, 4, 2, 16)
    assert r4["stage_resident_bytes"] == pytest.approx(r1["stage_resident_bytes"] / 4)
    small = Chip("small", 1e30, 1e9, memory=r1["stage_resident_bytes"] / 3, dtype="float32")
    assert not sram.pipeline_decode(TINY, small, LINK, 2, 2, 16)["fits"]
    assert sram.pipeline_decode(TINY, small, LINK, 3, 2, 16)["fits"]


def test_more_microbatches_raise_throughput_until_the_pipeline_is_full():
    chips, rows = 8, 1  # one sequence per micro-batch: the per-stage work stays the same
    runs = [sram.pipeline_decode(TINY, MEM_BOUND, LINK, chips, rows * m, 16, microbatches=m)
            for m in range(1, 13)]
    filling = [r for m, r in enumerate(runs, 1) if m * r["beat"] <= r["latency"]]
    full = [r for m, r in enumerate(runs, 1) if m * r["beat"] > r["latency"]]
    assert len(filling) >= 4 and full  # the sweep crosses saturation
    for m, r in enumerate(filling, 1):  # not full: m tokens per unchanged latency
        assert r["cycle"] == r["latency"]
        assert r["tokens_per_s"] == pytest.approx(m / runs[0]["latency"], rel=1e-9)
    rates = [r["tokens_per_s"] for r in filling]
    assert all(b > a for a, b in zip(rates, rates[1:], strict=False))
    for r in full:  # full: the slowest stage sets the pace, and each user waits longer
        m = r["assumptions"]["microbatches"]
        assert r["tokens_per_s"] == pytest.approx(1 / r["beat"], rel=1e-9)
        assert r["cycle"] == pytest.approx(m * r["beat"]) and r["cycle"] > r["latency"]


def test_tensor_parallel_baseline_by_hand():
    gpu = Chip("gpu", flops=1e12, bandwidth=1e9, memory=1e9, dtype="float32")
    d = _decode(TINY, 4, 16)
    r1 = sram.tensor_parallel_decode(TINY, gpu, LINK, 1, 4, 16)
    assert r1["step"] == pytest.approx(max(d["flops"] / 1e12, d["bytes"] / 1e9))
    assert r1["comm"] == 0.0
    r2 = sram.tensor_parallel_decode(TINY, gpu, LINK, 2, 4, 16)
    ar = 2 * (2 - 1) * (1e-6 + 4 * 64 * 4 / 2 / 1e9)
    assert r2["comm"] == pytest.approx(2 * TINY.n_layers * ar)
    assert r2["compute"] == pytest.approx(r1["step"] / 2)
    assert r2["tokens_per_s_per_chip"] == pytest.approx(4 / r2["step"] / 2)


def test_pareto_rows_for_both_designs():
    gpu = Chip("gpu", flops=1e12, bandwidth=1e9, memory=1e9, dtype="float32")
    tiny_sram = Chip("sram", flops=1e14, bandwidth=1e11, memory=2e5, dtype="float32")
    p = sram.pareto(TINY, tiny_sram, LINK, gpu, LINK, 2, [1, 4], 16)
    assert [r["batch"] for r in p["sram"]] == [1, 4] == [r["batch"] for r in p["gpu"]]
    need = sram.chips_needed(TINY, tiny_sram, batch=4, context=17)["chips"]
    assert p["sram"][1]["chips"] == need > 1
    assert all(r["fits"] for r in p["sram"])
    assert p["sram"][0]["tokens_per_s_per_user"] > p["gpu"][0]["tokens_per_s_per_user"]
    assert p["assumptions"]["gpus"] == 2


def test_heterogeneous_ttft_is_prefill_plus_kv_transfer():
    gpu = Chip("gpu", flops=1e12, bandwidth=1e9, memory=1e9, dtype="float32")
    kv_link = Link("kv", bandwidth=1e8, latency=1e-5)
    r = sram.heterogeneous(TINY, gpu, 2, kv_link, MEM_BOUND, LINK, 2, prompt=32)
    p = costs.phase_costs(TINY, "prefill", 1, 32, count="engine")
    prefill = max(p["flops"] / 2 / 1e12, p["bytes"] / 2 / 1e9)
    transfer = 1e-5 + costs.kv_cache_bytes(TINY, 32, 1, "float32") / 1e8
    assert r["ttft"] == pytest.approx(prefill + transfer)
    assert r["tpot"] == r["decode"]["cycle"]
    assert r["assumptions"]["prompt"] == 32


@pytest.mark.parametrize("call, match", [
    (lambda: sram.pipeline_decode(TINY, MEM_BOUND, LINK, 0, 2, 16), "chips=0"),
    (lambda: sram.pipeline_decode(TINY, MEM_BOUND, LINK, 2, 2, 16, 0), "microbatches=0"),
    (lambda: sram.pipeline_decode(TINY, MEM_BOUND, LINK, 2, 6, 16, 4),
     "batch=6 is not divisible by microbatches=4"),
    (lambda: sram.pipeline_decode(TINY, MEM_BOUND, "nvlink", 2, 2, 16), "link='nvlink'"),
    (lambda: sram.chips_needed(TINY, MEM_BOUND, usable=1.5), r"usable=1.5: .*\(0, 1\]"),
    (lambda: sram.chips_needed(TINY, MEM_BOUND, weight_dtype="fp9"), "weight_dtype='fp9'"),
    (lambda: sram.tensor_parallel_decode(TINY, MEM_BOUND, LINK, 0, 1, 16), "n=0"),
    (lambda: sram.pareto(TINY, MEM_BOUND, LINK, MEM_BOUND, LINK, 1, [], 16), "batches=\\[\\]"),
])
def test_bad_input_names_field_value_and_what_is_allowed(call, match):
    with pytest.raises(ValueError, match=match):
        call()
