"""The per-op breakdown: ops found equal the counted ops, the parts add up to the whole, the
result round-trips through JSON, the figure draws from it alone, the CLI rejects bad input.
On the tiny preset; no timing assertions."""

from __future__ import annotations

import json

import pytest

import refmodel
from microbench import cli
from microbench.phases import breakdown as bd
from microbench.phases.points import Budget
from microbench.plots import breakdown as breakdown_plot
from refmodel import costs, kernels
from refmodel.backends import KERNEL_SCOPE

FAST = Budget(budget_s=0.05, min_samples=2, min_sample_s=1e-4)
# Counted ops XLA may fuse into a neighbour's kernel on the tiny model: the embedding gather
# goes into the first norm's square at batch 1 (the kernel is named after the norm); at
# batch 2 it keeps its own kernel. The decode scores product (backends.xla.attend_one)
# can be fused with the masking select into a kernel named after a neighbour, and the prefill
# cache write (a dynamic-update-slice) into the kernel that produces K and V. Every other
# counted op must be found.
MAY_FUSE = {"embed", "attn_scores", "kv_write"}


@pytest.fixture(scope="module")
def phases():
    return refmodel.Phases(refmodel.init(refmodel.presets.get("tiny"), seed=0))


@pytest.fixture(scope="module", params=[("decode", 1, 8), ("decode", 2, 8), ("prefill", 2, 8)],
                ids=lambda p: f"{p[0]}-b{p[1]}")
def result(request, phases, tmp_path_factory):
    phase, batch, context = request.param
    out = tmp_path_factory.mktemp(phase)
    res = bd.measure_breakdown(phases, phase, batch, context, calls=2, timing=FAST, out=out)
    res["_out"] = str(out)
    return res


def test_decode_is_broken_down_cold_and_prefill_warm_as_the_points_time_them(result, phases,
                                                                            monkeypatch):
    """A decode breakdown evicts the caches before every call, its traced calls included (the
    phase point's regime); a prefill's does not; cold=False turns the eviction off."""
    assert result["cold"] is (result["phase"] != "prefill")
    if result["phase"] == "decode" and result["batch"] == 1:
        evictions = []
        monkeypatch.setattr(bd, "evictor", lambda: lambda: evictions.append(1))
        res = bd.measure_breakdown(phases, "decode", 1, 8, calls=3, timing=FAST)
        samples = len(res["whole"]["timing"]["samples"])
        assert res["cold"] and len(evictions) == samples + 3  # the timed and the traced calls
        evictions.clear()
        assert bd.measure_breakdown(phases, "decode", 1, 8, calls=3, timing=FAST,
                                    cold=False)["cold"] is False and not evictions


def test_ops_found_are_the_counted_ops(result):
    counted = costs.phase_costs(refmodel.presets.get("tiny"), result["phase"],
                                result["batch"], result["context"])["ops"]
    rows = {r["op"]: r for r in result["rows"]}
    assert {op for op, r in rows.items() if r["counted"]} == set(counted)
    found = {op for op, r in rows.items() if r["kernels"]}
    assert found - set(counted) <= set(bd.NOT_OPS) | {"other"}  # only the uncounted buckets
    missing = set(counted) - found
    assert missing <= MAY_FUSE
    assert all(rows[op]["fused"] and rows[op]["time_s"] == 0 for op in missing)
    for op, c in counted.items():  # counted numbers copied through unchanged
        assert rows[op]["flops"] == c["flops"] and rows[op]["bytes"] == c["bytes"]


def test_times_positive_and_parts_sum_to_the_whole(result):
    whole = result["whole"]["time_s"]
    assert whole > 0
    for row in result["rows"]:
        assert (row["time_s"] > 0) == bool(row["kernels"])
        if row["time_s"] > 0 and row["bytes"]:
            assert row["gbytes_per_s"] == pytest.approx(row["bytes"] / row["time_s"] / 1e9)
    total = sum(r["share"] for r in result["rows"]) + result["unattributed_share"]
    assert total == pytest.approx(1.0)
    assert result["attributed_s"] + result["unattributed_s"] == pytest.approx(whole)
    assert result["trace"]["calls"] == 2


@pytest.mark.skipif(not kernels.available(), reason="native kernels not built")
def test_native_products_are_found_under_their_ops(tmp_path):
    """`breakdown --backend native`: at batch 2 every weight product is the kernel's custom
    call, and each is attributed to the op that counts it (not left unattributed)."""
    cfg = refmodel.presets.get("tiny").replace(backend="native")
    res = bd.measure_breakdown(refmodel.Phases(refmodel.init(cfg, seed=0)), "decode", 2, 8,
                               calls=2, timing=FAST, out=tmp_path)
    rows = {r["op"]: r for r in res["rows"]}
    per_layer = {"qkv_proj": 3, "out_proj": 1, "ffn_up": 2, "ffn_down": 1}
    for op, n in {**{k: v * cfg.n_layers for k, v in per_layer.items()}, "lm_head": 1}.items():
        calls = [k for k in rows[op]["kernels"] if k.startswith("ffi_call")]
        assert len(calls) == n, (op, rows[op]["kernels"])
    # the attention kernel holds scores, softmax and values: one row with their summed cost
    held = KERNEL_SCOPE.split("+")
    core = rows[KERNEL_SCOPE]
    assert len([k for k in core["kernels"] if k.startswith("ffi_call")]) == cfg.n_layers
    assert core["holds"] == sorted(held)
    assert core["counted"] and core["bytes"] == sum(rows[o]["bytes"] for o in held) > 0
    assert core["flops"] == sum(rows[o]["flops"] for o in held) > 0
    for o in held:
        assert rows[o]["fused"] and rows[o]["held_by"] == [KERNEL_SCOPE]


def test_json_round_trips_and_the_figure_draws_from_it(result, tmp_path):
    with open(f"{result['_out']}/breakdown.json") as f:
        saved = json.load(f)
    expected = {k: v for k, v in result.items() if k != "_out"}
    assert saved == json.loads(json.dumps(expected))
    fig = breakdown_plot.breakdown_figure(saved)
    labels = [t.get_text() for t in fig.axes[0].get_yticklabels()]
    shown = [r["op"] for r in saved["rows"] if r["time_s"] > 0 or r["fused"]]
    assert labels == shown + ["unattributed"]
    assert result["model"] in fig.axes[0].get_title()
    assert breakdown_plot.save_breakdown_figure(saved, tmp_path / "b.png").stat().st_size > 0


def test_scope_of_names_the_innermost_scope():
    known = set(bd.SCOPES) | {"norm", "residual"}
    assert bd.scope_of("jit(decode)/decode/attention/qkv_proj/dot_general", known) == \
        "qkv_proj"
    assert bd.scope_of("jit(prefill)/prefill/ffn/shared_experts/ffn_up/mul", known) == "ffn_up"
    assert bd.scope_of("jit(decode)/decode/attention/rsqrt", known) == "norm"
    assert bd.scope_of("jit(decode)/decode/add", known) == "residual"
    assert bd.scope_of("jit(decode)/decode/attention/transpose", known) == "layout"
    assert bd.scope_of("state['lm_head'].value", known) is None
    # a scope naming several known ops joined by "+" is one op (a kernel holding them)
    assert bd.scope_of(f"jit(decode)/decode/attention/{KERNEL_SCOPE}/ffi_call", known) == \
        KERNEL_SCOPE
    assert bd.joined(KERNEL_SCOPE, known) == ("attn_scores", "attn_softmax", "attn_values")
    assert bd.joined("attn_scores+mystery", known) == () and bd.joined("rope", known) == ()
    assert bd.scope_of("jit(decode)/decode/attention/attn_scores+mystery/exp", known) == \
        "other"


def test_self_times_subtract_nested_events_and_busy_is_the_union():
    def ev(tid, ts, dur, op, run="1"):
        return {"ph": "X", "tid": tid, "ts": ts, "dur": dur,
                "args": {"hlo_module": "m", "hlo_op": op, "run_id": run}}

    events = [ev(1, 0, 100, "while"), ev(1, 10, 30, "body_dot"), ev(1, 50, 20, "body_add"),
              ev(2, 90, 40, "other_thread"), ev(1, 200, 10, "next", run="2"),
              {"ph": "X", "tid": 1, "ts": 0, "dur": 5, "name": "python"},
              ev(1, 300, 10, "elsewhere") | {"args": {"hlo_module": "n", "hlo_op": "x"}}]
    self_s, info = bd.thunk_self_times(events, "m")
    assert self_s == pytest.approx({"while": 50e-6, "body_dot": 30e-6, "body_add": 20e-6,
                                    "other_thread": 40e-6, "next": 10e-6})
    assert info == {"calls": 2, "busy_s": pytest.approx(140e-6), "threads": 2}


@pytest.mark.parametrize("argv, needle", [
    (["--model", "nope"], "--model 'nope': choose one of"),
    (["--model", "tiny", "--phase", "decoding"], "--phase 'decoding': choose one of"),
    (["--model", "tiny", "--batch", "0"], "--batch 0: must be an integer >= 1"),
    (["--model", "tiny", "--attention", "xyz"], "--attention 'xyz': choose one of"),
    (["--model", "deepseek-v3"], "does not fit"),
])
def test_cli_rejects_bad_input_in_one_line(argv, needle, capsys, tmp_path):
    with pytest.raises(SystemExit) as exc:
        cli.main(["breakdown", *argv, "--out", str(tmp_path)])
    assert exc.value.code == 2
    err = capsys.readouterr().err.strip()
    assert needle in err and len(err.splitlines()) == 1
    assert not (tmp_path / "breakdown.json").exists()
