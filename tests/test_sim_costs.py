"""The step cost model and the roofline step-time predictor.

`costs.step_costs` of a serving step (sequences fed `new` tokens after `cached` ones) must
equal `phase_costs` where a phase is such a step (every sequence the same), for every
variant, dense and MoE; the predictor's fast sum must equal the chip's time of step_costs.
"""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import refmodel
from refmodel import costs
from refmodel.serving.request import Chunk, Plan
from refmodel.serving.steps import Step
from refmodel.sim.cluster import Chip, Link
from refmodel.sim.predict import EngineCalls, RooflineTime, TableTime, step_plan

VARIANTS = [(kind, ffn) for kind in ("gqa", "mla", "sliding", "sparse", "linear")
            for ffn in ("dense", "moe")]
CHIP = Chip("round", flops=1e12, bandwidth=1e10, memory=1e9, floor=1e-5)


def config(kind: str, ffn: str):
    return dataclasses.replace(refmodel.presets.get("tiny"), attention=kind, ffn=ffn,
                               layer_pattern=None)


@pytest.mark.parametrize("kind,ffn", VARIANTS)
def test_step_equals_phase_when_every_sequence_is_alike(kind, ffn):
    cfg = config(kind, ffn)
    for B, S in ((1, 7), (4, 100)):
        phase, step = costs.phase_costs(cfg, "decode", B, S), costs.step_costs(cfg, [(1, S)] * B)
        for key in ("flops", "weight_bytes", "kv_bytes", "act_bytes"):
            assert step[key] == pytest.approx(phase[key], rel=1e-12), (key, B, S)
    phase, step = costs.phase_costs(cfg, "prefill", 1, 48), costs.step_costs(cfg, [(48, 0)])
    assert step["ops"].keys() == phase["ops"].keys()
    for key in ("flops", "bytes"):
        assert step[key] == pytest.approx(phase[key], rel=1e-12)


def test_weights_are_read_once_per_step():
    cfg = config("gqa", "dense")
    one, two = costs.step_costs(cfg, [(1, 50)]), costs.step_costs(cfg, [(1, 50), (1, 80)])
    row = one["ops"]["embed"]["weight_bytes"]  # the embedding gather reads a row per token
    assert two["weight_bytes"] == one["weight_bytes"] + row
    assert two["kv_bytes"] > one["kv_bytes"]
    last = costs.step_costs(cfg, [(16, 0), (1, 5)], logits="last")
    every = costs.step_costs(cfg, [(16, 0), (1, 5)], logits="all")
    head = costs.head_costs(cfg, 15, costs.dtypes(cfg))  # 17 rows of logits vs 2
    assert every["flops"] - last["flops"] == pytest.approx(head.flops)


@settings(max_examples=30, deadline=None)
@given(chunks=st.lists(st.tuples(st.sampled_from([1, 1, 1, 3, 64]), st.integers(0, 600)),
                       min_size=1, max_size=12),
       preset=st.sampled_from(["llama3-8b", "deepseek-v3", "gemma3-27b", "qwen3-next-80b-a3b"]))
def test_fused_prediction_is_the_chip_time_of_step_costs(chunks, preset):
    cfg = refmodel.presets.get(preset)
    got = RooflineTime(cfg, CHIP).fused(tuple(chunks))
    c = costs.step_costs(cfg, chunks, count="engine", logits="last")
    assert got == pytest.approx(CHIP.time(c["flops"], c["bytes"]), rel=1e-9)


def test_tensor_parallel_adds_all_reduces_by_hand():
    cfg = refmodel.presets.get("llama3-8b")
    link = Link("l", bandwidth=1e9, latency=1e-6)
    chunks = ((1, 100), (1, 200))
    c = costs.step_costs(cfg, chunks, count="engine", logits="last")
    act = 2 * cfg.d_model * 2  # two tokens of bfloat16 activations
    ring = 2 * (4 - 1) * (1e-6 + act / 4 / 1e9)
    expect = CHIP.time(c["flops"] / 4, c["bytes"] / 4) + 2 * cfg.n_layers * ring
    got = RooflineTime(cfg, CHIP, tp=4, link=link).fused(chunks)
    assert got == pytest.approx(expect, rel=1e-12)
    with pytest.raises(ValueError, match="link"):
        RooflineTime(cfg, CHIP, tp=2)
    with pytest.raises(ValueError, match="tp"):
        RooflineTime(cfg, CHIP, tp=0)


def test_engine_calls_and_table():
    calls = EngineCalls(has_state=False, shapes="pow2", token_budget=32, max_running=8,
                        max_len=64, page_size=8)
    plan = Plan(0, prefill=[Chunk(1, 0, tuple(range(13)), True)],
                decode=[Chunk(2, 9, (5,), True), Chunk(3, 4, (6,), True),
                        Chunk(4, 4, (6,), True)])
    assert [c.shape for c in calls(plan)] == [(1, 16), (4, 1)]
    table = TableTime({(1, 16): 0.5, (4, 1): 0.25}, calls, host_s=0.125)
    assert table(plan) == 0.875
    with pytest.raises(KeyError, match=r"\(1, 16\)"):
        TableTime({(4, 1): 0.25}, calls)(plan)
    state = EngineCalls(has_state=True, token_budget=32, max_running=8)
    assert [c.shape for c in state(plan)] == [(1, 8), (1, 4), (1, 1), (4, 1)]
    # the engine's view: max_len's pages plus room for T - 1 padding tokens
    assert calls.view(1) == 64 and calls.view(16) == 64 + 16
    # roofline on the engine's calls: each call's padded rows over the view, plus the floor
    rt = RooflineTime(config("gqa", "dense"), CHIP, calls)
    assert rt(plan) == pytest.approx(rt.engine_call((1, 16)) + rt.engine_call((4, 1)))
    assert rt.engine_call((4, 1)) > rt.engine_call((1, 1)) > CHIP.floor


def test_kernels_add_their_cost_to_each_call():
    """Given kernel counts and a cost per kernel, each engine call costs its roofline time plus
    that cost times its own count (a table or a function of the shape)."""
    calls = EngineCalls(has_state=False, shapes="pow2", token_budget=32, max_running=8,
                        max_len=64, page_size=8)
    cfg = config("gqa", "dense")
    bare = RooflineTime(cfg, CHIP, calls)
    counted = RooflineTime(cfg, CHIP, calls, kernels={(1, 16): 40, (4, 1): 25},
                           per_kernel_s=1e-5)
    assert counted.engine_call((1, 16)) == pytest.approx(bare.engine_call((1, 16)) + 4e-4)
    assert counted.engine_call((4, 1)) == pytest.approx(bare.engine_call((4, 1)) + 2.5e-4)
    by_rows = RooflineTime(cfg, CHIP, calls, kernels=lambda shape: 10 * shape[0],
                           per_kernel_s=1e-5)
    assert by_rows.engine_call((4, 1)) == pytest.approx(bare.engine_call((4, 1)) + 4e-4)
    for bad in (-1e-6, float("nan"), True, "1e-5"):
        with pytest.raises(ValueError, match="per_kernel_s"):
            RooflineTime(cfg, CHIP, calls, kernels={}, per_kernel_s=bad)
    with pytest.raises(ValueError, match="kernels"):
        RooflineTime(cfg, CHIP, calls, per_kernel_s=1e-5)
    with pytest.raises(ValueError, match="calls"):
        RooflineTime(cfg, CHIP, kernels={}, per_kernel_s=1e-5)


def test_a_recorded_step_is_priced_as_its_plan():
    """step_plan(step) gives the calls of the plan the step ran: a table prices a step the
    engine recorded exactly as it priced the plan."""
    calls = EngineCalls(has_state=False, shapes="pow2", token_budget=32, max_running=8,
                        max_len=64, page_size=8)
    plan = Plan(3, prefill=[Chunk(1, 0, tuple(range(13)), True),
                            Chunk(5, 8, tuple(range(3)), False)],
                decode=[Chunk(2, 9, (5,), True), Chunk(3, 4, (6,), True),
                        Chunk(4, 4, (6,), True)])
    step = Step(time=0.0, seconds=0.01, busy=0.01, prefill=((1, 13), (5, 3)), decode_rows=3,
                preempted=0)
    assert [c.shape for c in calls(step_plan(step))] == [c.shape for c in calls(plan)] \
        == [(1, 16), (1, 4), (4, 1)]
    table = TableTime({(1, 16): 0.5, (1, 4): 0.125, (4, 1): 0.25}, calls)
    assert table(step_plan(step)) == table(plan) == 0.875
    state = EngineCalls(has_state=True, token_budget=32, max_running=8)
    assert [c.shape for c in state(step_plan(step))] == [c.shape for c in state(plan)]


def test_bad_input():
    cfg = config("gqa", "dense")
    with pytest.raises(ValueError, match="chunks"):
        costs.step_costs(cfg, [])
    with pytest.raises(ValueError, match="chunks"):
        costs.step_costs(cfg, [(0, 5)])
    with pytest.raises(ValueError, match="logits"):
        costs.step_costs(cfg, [(1, 5)], logits="some")
    with pytest.raises(ValueError, match=r"Chip\('x'\)\.bandwidth"):
        Chip("x", flops=1.0, bandwidth=0.0, memory=1.0)
    with pytest.raises(ValueError, match=r"Link\('y'\)\.latency"):
        Link("y", bandwidth=1.0, latency=-1.0)
