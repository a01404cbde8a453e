"""refmodel.parallel: sharded runs equal one device's, collectives equal the cost model's.

On 8 emulated CPU devices (tests/conftest.py). Two hybrid stacks hold every option set of
every registered attention variant (as tests/test_golden.py's do), each ending in a MoE
layer (with shared experts on one): the stack whose key/value heads split over two devices
runs on 8 (data x tensor x expert = 2 x 2 x 2); MQA's single KV head does not split, so the
other stack runs on 1 device and with expert parallelism on 4; the tiny GQA model, a dense
then a MoE layer, with tensor parallelism on 2.
"""

from __future__ import annotations

import math

import jax
import numpy as np
import pytest

import refmodel
from conftest import assert_logits_close, incremental_logits, tiny, tokens
from refmodel import parallel
from refmodel.parallel import comms, hlo
from refmodel.sim.cluster import Link

OPTION_SETS = refmodel.attention.option_sets()
SPLIT = tuple(k for k in refmodel.attention.registered() if k != "mqa")
MOE = dict(ffn="moe", n_experts=4)  # one MoE layer, last: its compiles are the slowest
STACKS = {
    "every kind but mqa": tiny(layer_pattern=SPLIT, n_layers=len(SPLIT), **MOE,
                               first_dense_layers=len(SPLIT) - 1, n_shared_experts=1),
    "mqa, mla absorbed, linear mamba2": tiny(
        layer_pattern=("mqa", "mla", "linear"), n_layers=3, mla_absorb=True,
        linear_rule="mamba2", q_lora_rank=16, **MOE, first_dense_layers=2),
}
MESHES = {  # (data, tensor, expert): 1, 2, 4 and 8 devices between them
    "every kind but mqa": [(2, 2, 2)],
    "mqa, mla absorbed, linear mamba2": [(1, 1, 1), (1, 1, 4)],
    "gqa then moe": [(1, 2, 1)],
}
STACKS["gqa then moe"] = tiny(**MOE, first_dense_layers=1)  # the common case, tensor 2
B, T, PROMPT = 8, 7, 4
TOL = 1e-4

needs8 = pytest.mark.skipif(jax.device_count() < 8, reason="needs 8 (emulated) devices")


def test_the_stacks_hold_every_option_set():
    held = {refmodel.attention.label(cfg.replace(layer_pattern=None, attention=kind))
            for cfg in STACKS.values() for kind in cfg.layer_kinds}
    assert {math.prod(m) for meshes in MESHES.values() for m in meshes} == {1, 2, 4, 8}
    assert held == set(OPTION_SETS), set(OPTION_SETS) - held
    for cfg in STACKS.values():
        assert "dense" in cfg.layer_ffns and "moe" in cfg.layer_ffns


@needs8
@pytest.mark.parametrize("stack", STACKS)
def test_sharded_forward_and_decode_equal_one_device(stack):
    cfg = STACKS[stack]
    model = refmodel.init(cfg, seed=0)
    toks = tokens(cfg, B, T)
    want = refmodel.forward(model, toks)
    for mesh in MESHES[stack]:
        sharded = parallel.shard(model, parallel.make_mesh(*mesh))
        assert math.prod(mesh) == len(sharded.blocks[0].ffn_norm.scale[...].sharding.device_set)
        # partial sums added in another order: float32 rounding, a little above one device's
        assert_logits_close(refmodel.forward(sharded, toks), want, TOL)
        assert_logits_close(incremental_logits(sharded, toks, [PROMPT]), want, TOL)


@needs8
def test_parameters_and_cache_sit_where_the_rules_say():
    cfg = tiny(ffn="moe")
    sharded = parallel.shard(refmodel.init(cfg), parallel.make_mesh(2, 2, 2))
    attn, moe = sharded.blocks[0].attn, sharded.blocks[0].ffn
    D, N, H = cfg.d_model, cfg.n_heads, cfg.resolved_head_dim
    assert {s.data.shape for s in attn.wq[...].addressable_shards} == {(D, N // 2, H)}
    assert {s.data.shape for s in attn.wo[...].addressable_shards} == {(N // 2, H, D)}
    assert {s.data.shape[0] for s in moe.w_up[...].addressable_shards} == {cfg.n_experts // 2}
    assert {s.data.shape for s in sharded.embed.embedding[...].addressable_shards} == \
        {(cfg.vocab_size, D)}  # replicated
    cache = parallel.init_cache(sharded, 4, 16)
    k = cache.layers[0].k  # [B, K, S, H]: batch over data x expert, heads over tensor
    assert {s.data.shape for s in k.addressable_shards} == \
        {(1, cfg.n_kv_heads // 2, 16, cfg.resolved_head_dim)}


@needs8
def test_quantized_weights_shard_and_match():
    cfg = tiny(weight_format="int8", kv_format="int8")
    model = refmodel.init(cfg, seed=0)
    toks = tokens(cfg, 4, 6)
    sharded = parallel.shard(model, parallel.make_mesh(2, 2, 1))
    wq = sharded.blocks[0].attn.wq[...]  # q [N H, D]: output-major, so split on axis 0
    assert {s.data.shape for s in wq.q.addressable_shards} == \
        {(cfg.n_heads * cfg.resolved_head_dim // 2, cfg.d_model)}
    assert_logits_close(refmodel.forward(sharded, toks), refmodel.forward(model, toks), TOL)


@needs8
@pytest.mark.parametrize("stack,mesh", [("every kind but mqa", (2, 2, 2)),
                                        ("mqa, mla absorbed, linear mamba2", (1, 1, 4))])
def test_collectives_in_the_hlo_equal_the_cost_model(stack, mesh):
    sharded = parallel.shard(refmodel.init(STACKS[stack]), parallel.make_mesh(*mesh))
    for phase in refmodel.PHASES:
        row = hlo.check(sharded, phase, 8, 4)
        assert row["agree"], (phase, row["expected"], row["found"])
        assert {g for g in row["groups"]} <= {mesh[1], mesh[2]}, row["groups"]
        if phase in ("prefill", "decode") and mesh[1] > 1:
            assert {"all-reduce", "all-gather"} <= set(row["found"])
        if phase != "decode_attention" and mesh[2] > 1:
            assert row["found"]["all-to-all"]["count"] == 3 * STACKS[stack].layer_ffns.count(
                "moe")


def test_hlo_parsing():
    line = ("  %all-to-all = (f32[1,2,64]{2,1,0}, f32[1,2,64]{2,1,0}) all-to-all(%a, %b), "
            "channel_id=1, replica_groups={{0,1},{2,3}}, metadata={}")
    rs = "  %rs = bf16[4,8]{1,0} reduce-scatter(%x), replica_groups=[2,4]<=[8], dimensions={0}"
    done = "  %d = f32[4]{0} all-reduce-done(%s)"
    start = "  %s = f32[4]{0} all-reduce-start(%x), replica_groups=[1,8]<=[8]"
    gather = ("  %ag = f32[2,256]{0,1} all-gather(%x), replica_groups=mesh['axis_0'=2,"
              "'axis_1'=4] {'axis_1'}, dimensions={1}")
    assert hlo.found(gather) == [{"kind": "all-gather", "nbytes": 2048, "group": 4}]
    assert hlo.found("\n".join([line, rs, done, start])) == [
        {"kind": "all-to-all", "nbytes": 2 * 2 * 64 * 4, "group": 2},
        {"kind": "reduce-scatter", "nbytes": 4 * 8 * 2 * 4, "group": 4},
        {"kind": "all-reduce", "nbytes": 16, "group": 8}]
    with pytest.raises(ValueError, match="element type"):
        hlo.shape_bytes("q7[3]")


def test_collective_times_and_bytes():
    link = Link("test", bandwidth=100e9, latency=1e-6)
    ar = comms.Collective("all-reduce", "tensor", 8, 1e6, "out_proj", count=3)
    assert ar.time(link.bandwidth, link.latency) == pytest.approx(3 * link.all_reduce(1e6, 8))
    assert ar.wire_bytes == pytest.approx(3 * 2 * 7 / 8 * 1e6)
    a2a = comms.Collective("all-to-all", "expert", 4, 4e6, "dispatch")
    assert a2a.time(1e9) == pytest.approx(3 * 1e6 / 1e9)
    assert comms.Collective("all-gather", "tensor", 1, 1e6, "lm_head").time(1e9) == 0.0


def test_collectives_count_megatron_and_ep():
    cfg = tiny(ffn="moe", first_dense_layers=1, n_shared_experts=1)
    got = hlo.by_kind(comms.collectives(cfg, "decode", 8, 16, {"tensor": 2, "expert": 2}))
    n, D, A = 8 / 2, cfg.d_model, cfg.top_k  # tokens per device: batch over expert
    # per layer: attention all-reduce; dense FFN (layer 0) or shared experts (layer 1)
    assert got["all-reduce"] == {"count": 4, "bytes": 4 * n * D * 4}
    assert got["all-to-all"]["count"] == 3  # one MoE layer: rows, ids, outputs
    assert got["all-to-all"]["bytes"] == 2 * (2 * n * A * D * 4) + 2 * n * A * 4
    assert got["all-gather"] == {"count": 1, "bytes": n * cfg.vocab_size * 4}
    engine = hlo.by_kind(comms.collectives(cfg, "decode", 8, 16, {"expert": 2},
                                           count="engine"))
    assert engine == {"all-to-all": {"count": 2, "bytes": 2 * n * A * D * 4}}
    assert comms.collectives(cfg, "decode", 8, 16, {"data": 8}) == []


@pytest.mark.parametrize("preset", ["llama3-8b", "deepseek-v3", "qwen3-30b-a3b"])
def test_one_device_share_is_the_phase_cost(preset):
    cfg = refmodel.presets.get(preset)
    for phase, context in (("decode", 1024), ("prefill", 256)):
        share = comms.per_device(cfg, phase, 4, context, {})
        whole = refmodel.costs.phase_costs(cfg, phase, 4, context, count="engine")
        for field in ("flops", "weight_bytes", "kv_bytes", "act_bytes"):
            assert share[field] == pytest.approx(whole[field], rel=1e-12), field
        assert share["collectives"] == []


def test_tensor_share_of_a_dense_model():
    cfg = refmodel.presets.get("llama3-70b")  # N = 64, K = 8
    one = comms.per_device(cfg, "decode", 1, 4096, {})
    for tp in (2, 8):
        share = comms.per_device(cfg, "decode", 1, 4096, {"tensor": tp})
        # the KV cache splits by heads; the weights all but embedding and norms
        assert share["kv_bytes"] == pytest.approx(one["kv_bytes"] / tp)
        embed = cfg.vocab_size * cfg.d_model * 2  # never split: read one row, counted whole?
        assert one["weight_bytes"] / tp < share["weight_bytes"] < one["weight_bytes"] / tp * 1.01
        assert embed > 0
    sixteen = comms.per_device(cfg, "decode", 1, 4096, {"tensor": 16})  # K = 8 < 16
    assert sixteen["kv_bytes"] == pytest.approx(one["kv_bytes"] / 8)  # one head each


def test_bad_degrees_name_the_field():
    cfg = tiny(ffn="moe")  # N = 4, K = 2, E = 8
    model = refmodel.init(cfg)
    with pytest.raises(ValueError, match="n_kv_heads=2"):
        parallel.shard(model, parallel.make_mesh(tensor=4))
    with pytest.raises(ValueError, match="n_experts=8"):
        parallel.shard(model, parallel.make_mesh(expert=3))
    with pytest.raises(ValueError, match="n_heads=4"):
        comms.per_device(cfg, "decode", 1, 8, {"tensor": 8})
    with pytest.raises(ValueError, match="devices"):
        parallel.make_mesh(data=64)
    with pytest.raises(ValueError, match="tensor=0"):
        parallel.make_mesh(tensor=0)
    with pytest.raises(ValueError, match="unknown mesh axes"):
        comms.collectives(cfg, "decode", 1, 8, {"pipeline": 2})
    if jax.device_count() >= 4:
        sharded = parallel.shard(model, parallel.make_mesh(data=2, expert=2))
        with pytest.raises(ValueError, match="batch=6 .*data=2 x expert=2"):
            refmodel.forward(sharded, np.zeros((6, 3), np.int32))
