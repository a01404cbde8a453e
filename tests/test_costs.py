"""The analytic cost model: KV bytes against published figures, the phase conventions, the
decode rooflines' batch scaling, bad input, and the command line."""

from __future__ import annotations

import dataclasses
import json

import pytest
from conftest import tiny

import refmodel
from refmodel import cli, costs, presets
from refmodel.counting import total
from refmodel.layers import norm_costs
from refmodel.moe import expected_distinct_experts


def test_kv_bytes_per_token_match_deepseek_hardware_paper():
    """Zhao et al. 2025 (arXiv:2505.09343) Table 1, BF16: DeepSeek-V3 70.272 KB (MLA:
    61 x (512 + 64) x 2) and LLaMA-3.1-405B 516.096 KB (126 x 2 x 8 x 128 x 2)."""
    assert costs.kv_bytes_per_token(presets.get("deepseek-v3")) == 70_272
    assert costs.kv_bytes_per_token(presets.get("llama3.1-405b")) == 516_096
    # int8: half the bytes, plus one float32 scale per cached head vector (2 x 8 per layer)
    assert costs.kv_bytes_per_token(presets.get("llama3.1-405b"), "int8") == \
        516_096 / 2 + 126 * 2 * 8 * 4


def test_cache_bytes_cap_windows_and_fix_recurrent_state():
    mistral = presets.get("mistral-7b")  # every layer sliding, W = 4096
    per_token = costs.kv_bytes_per_token(mistral)
    assert costs.kv_cache_bytes(mistral, 1000) == 1000 * per_token
    assert costs.kv_cache_bytes(mistral, 100_000) == costs.kv_cache_bytes(mistral, 4096)
    gemma = presets.get("gemma2-9b")  # half the layers global: grows at half the rate past W
    grow = costs.kv_cache_bytes(gemma, 20_000) - costs.kv_cache_bytes(gemma, 10_000)
    assert grow == 10_000 * per_layer_kv(gemma) * 21
    nemotron = presets.get("nemotron-h-8b")  # 4 attention layers grow, 24 Mamba-2 do not
    assert costs.kv_bytes_per_token(nemotron) == 4 * 2 * 8 * 128 * 2
    fixed = costs.kv_cache_bytes(nemotron, 0)
    assert fixed > 0 and costs.kv_cache_bytes(nemotron, 10) == fixed + 10 * 4 * 4096
    assert costs.kv_cache_bytes(presets.get("llama3-8b"), 100, batch=3) == 3 * 100 * 131_072


def test_sliding_cache_holds_min_context_window_per_sequence():
    """What an engine holds: min(S, W) tokens per sequence, per sliding layer, times the
    batch; the window's own edge and a mixed local/global pattern included."""
    mistral = presets.get("mistral-7b")
    W, per_token = mistral.window, costs.kv_bytes_per_token(mistral)
    assert per_token == 32 * per_layer_kv(mistral)
    for S in (0, 1, W - 1, W, W + 1, 8 * W):
        for B in (1, 3):
            assert costs.kv_cache_bytes(mistral, S, B) == B * min(S, W) * per_token
    gemma = presets.get("gemma2-9b")  # 21 sliding (W = 4096) + 21 global layers
    for S in (100, 4096, 10_000):
        assert costs.kv_cache_bytes(gemma, S, 2) == 2 * per_layer_kv(gemma) * 21 * (
            min(S, gemma.window) + S)


def test_engine_count_reads_min_context_window_implementation_the_ring():
    """Mistral 7B decode attention, batch 16: an engine reads min(S + 1, W) keys per sequence
    (llama3-8b has the same attention shape and no window: the same KV bytes below W); this
    code's ring scores all W slots, the difference counted under its own op."""
    mistral, llama = presets.get("mistral-7b"), presets.get("llama3-8b")
    W, B = mistral.window, 16
    per_key = B * per_layer_kv(mistral) * 32  # K and V of one token, every layer
    for S in (256, 1024, W - 1, W, 8192):
        eng = costs.phase_costs(mistral, "decode_attention", B, S, count="engine")
        imp = costs.phase_costs(mistral, "decode_attention", B, S)
        written = per_key  # the new token's K and V
        assert eng["kv_bytes"] == min(S + 1, W) * per_key + written
        assert imp["kv_bytes"] == W * per_key + written
        assert "ring_masked_slots" not in eng["ops"]
        ring = imp["ops"].get("ring_masked_slots", {"flops": 0, "bytes": 0})
        assert imp["flops"] == eng["flops"] + ring["flops"]
        assert imp["bytes"] == eng["bytes"] + ring["bytes"]
        if S < W:
            full = costs.phase_costs(llama, "decode_attention", B, S, count="engine")
            assert eng["kv_bytes"] == full["kv_bytes"]
            assert eng["flops"] == full["flops"]
    assert costs.phase_costs(mistral, "decode_attention", B, 256, count="engine")[
        "kv_bytes"] < 0.07 * costs.phase_costs(mistral, "decode_attention", B, 256)["kv_bytes"]
    # no window, no difference
    for phase in ("prefill", "decode"):
        assert costs.phase_costs(llama, phase, 2, 64, count="engine")["bytes"] == \
            costs.phase_costs(llama, phase, 2, 64)["bytes"]


def per_layer_kv(cfg):
    return 2 * cfg.n_kv_heads * cfg.resolved_head_dim * 2


def test_decode_is_its_halves_plus_embedding_and_head():
    """decode = decode_attention + decode_ffn + embedding + final norm + LM head, field by
    field (the phases split the very same layers)."""
    for name in ("llama3-8b", "deepseek-v3", "gpt-oss-20b", "nemotron-h-8b", "gemma3-27b"):
        cfg = presets.get(name)
        dt = costs.dtypes(cfg)
        parts = [total(costs.phase_ops(cfg, p, 4, 1000, dt)) for p in ("decode_attention",
                                                                       "decode_ffn")]
        parts += [costs.embed_costs(cfg, 4, dt), norm_costs(cfg, cfg.d_model, 4, dt),
                  costs.head_costs(cfg, 4, dt)]
        want = total(dict(enumerate(parts)))
        got = total(costs.phase_ops(cfg, "decode", 4, 1000, dt))
        for field, value in got.as_dict().items():
            assert value == pytest.approx(want.as_dict()[field], rel=1e-12), (name, field)


def test_prefill_counts_the_full_square_and_decode_one_row():
    cfg = tiny()
    T, B = 16, 2
    pre = costs.phase_costs(cfg, "prefill", B, T)["ops"]
    dec = costs.phase_costs(cfg, "decode_attention", B, T - 1)["ops"]  # keys = T
    N, H, L = cfg.n_heads, cfg.resolved_head_dim, cfg.n_layers
    assert pre["attn_scores"]["flops"] == 2 * B * T * N * T * H * L
    assert dec["attn_scores"]["flops"] == 2 * B * 1 * N * T * H * L
    assert pre["ffn_up"]["flops"] == T * costs.phase_costs(cfg, "decode_ffn", B, 0)["ops"][
        "ffn_up"]["flops"]


def test_dense_decode_ffn_intensity_grows_linearly_with_batch():
    """Weights dominate the bytes: FLOPs grow with B, bytes barely, so intensity ~ B (bf16)."""
    cfg = presets.get("llama3-8b")
    inten = {b: costs.phase_costs(cfg, "decode_ffn", b, 0, "bfloat16", "bfloat16",
                                  "bfloat16")["intensity"] for b in (1, 2, 4, 8, 16, 32, 64)}
    for b in inten:
        assert inten[b] == pytest.approx(b, rel=0.05)  # 2 B FLOPs per 2-byte weight
    assert inten[64] / inten[32] == pytest.approx(2, rel=0.02)
    f32 = costs.phase_costs(cfg, "decode_ffn", 8, 0, "float32", "float32", "float32")
    assert f32["intensity"] == pytest.approx(inten[8] / 2, rel=0.02)


def test_moe_decode_reads_the_experts_a_batch_touches():
    """Per-expert intensity ~ B k / E once every expert is touched, ~1 token per expert read
    while B k << E; weight bytes follow E (1 - (1 - k/E)^B)."""
    cfg = presets.get("mixtral-8x7b")
    E, k = cfg.n_experts, cfg.top_k
    D, F = cfg.d_model, cfg.expert_width
    for B in (1, 2, 3, 16, 256, 4096):
        ops = costs.phase_costs(cfg, "decode_ffn", B, 0, "bfloat16")["ops"]
        weights = ops["ffn_up"]["weight_bytes"] + ops["ffn_down"]["weight_bytes"]
        touched = expected_distinct_experts(B, E, k)
        assert weights == pytest.approx(cfg.n_layers * touched * 3 * D * F * 2)
        flops = ops["ffn_up"]["flops"] + ops["ffn_down"]["flops"]
        tokens_per_expert = flops / (2 * 3 * D * F) / cfg.n_layers / touched
        assert tokens_per_expert == pytest.approx(B * k / touched, rel=0.01)
    assert expected_distinct_experts(1, E, k) == pytest.approx(k)
    assert expected_distinct_experts(4096, E, k) == pytest.approx(E)
    big = costs.phase_costs(cfg, "decode_ffn", 4096, 0, "bfloat16")["ops"]
    per_expert = (big["ffn_up"]["flops"] / big["ffn_up"]["weight_bytes"])  # bf16: FLOP/2 B
    assert per_expert == pytest.approx(4096 * k / E, rel=0.02)


def test_mla_absorbed_and_naive_read_the_same_cache_but_differ_in_flops():
    v3 = presets.get("deepseek-v3")
    naive = dataclasses.replace(v3, mla_absorb=False)
    a = costs.phase_costs(v3, "decode_attention", 8, 4096)
    n = costs.phase_costs(naive, "decode_attention", 8, 4096)
    assert a["kv_bytes"] == n["kv_bytes"]
    assert n["flops"] > 20 * a["flops"]
    assert "kv_expand" in n["ops"] and "kv_expand" not in a["ops"]


@pytest.mark.parametrize("kwargs, field", [
    ({"phase": "decode_both"}, "phase"),
    ({"batch": -1}, "batch"),
    ({"batch": 0}, "batch"),
    ({"context": -3}, "context"),
    ({"weight_dtype": "fp7"}, "weight_dtype"),
    ({"kv_dtype": "float64"}, "kv_dtype"),
    ({"act_dtype": "int3"}, "act_dtype"),
    ({"count": "ideal"}, "count"),
])
def test_bad_input_names_the_field_and_allowed_values(kwargs, field):
    args = {"phase": "decode", "batch": 1, "context": 8, **kwargs}
    with pytest.raises(ValueError, match=field) as err:
        costs.phase_costs(tiny(), **args)
    if "dtype" in field:
        assert "bfloat16" in str(err.value)
    if field == "phase":
        assert "decode_attention" in str(err.value)


def test_bad_input_to_cache_counts_and_presets():
    with pytest.raises(ValueError, match="kv_dtype"):
        costs.kv_cache_bytes(tiny(), 8, kv_dtype="fp7")
    with pytest.raises(ValueError, match="batch"):
        costs.kv_cache_bytes(tiny(), 8, batch=-2)
    with pytest.raises(ValueError, match="llama3-8b"):
        presets.get("llama-3-8b")


def test_cli_json_has_the_documented_fields(capsys):
    assert cli.main(["costs", "--preset", "gpt-oss-20b", "--batch", "4", "--context", "512",
                     "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    cfg = presets.get("gpt-oss-20b")
    counts = costs.param_counts(cfg)
    assert out["params_total"] == counts["total"] and out["params_active"] == counts["active"]
    assert out["kv_bytes_per_token"] == costs.kv_bytes_per_token(cfg, "bfloat16")
    assert set(out["phases"]) == set(refmodel.PHASES)
    for phase, pc in out["phases"].items():
        assert pc["flops"] == pytest.approx(sum(op["flops"] for op in pc["ops"].values()))
        # real presets are counted as an engine runs them (a window reads min(S, W) keys)
        assert pc["bytes"] == costs.phase_costs(cfg, phase, 4, 512, count="engine")["bytes"]
    assert out["count"] == "engine"
    assert cli.main(["costs", "--preset", "gpt-oss-20b", "--batch", "4", "--context", "64",
                     "--count", "implementation", "--json"]) == 0
    ring = json.loads(capsys.readouterr().out)["phases"]["decode_attention"]
    assert cli.main(["costs", "--preset", "gpt-oss-20b", "--batch", "4", "--context", "64",
                     "--json"]) == 0
    engine = json.loads(capsys.readouterr().out)["phases"]["decode_attention"]
    # gpt-oss's 128-token windows at context 64: the ring reads all W slots, an engine S + 1
    assert ring["bytes"] > engine["bytes"]


def test_cli_tables_and_errors(capsys):
    assert cli.main(["presets"]) == 0
    listing = capsys.readouterr().out
    assert all(name in listing for name in presets.names())
    assert cli.main(["costs", "--preset", "tiny", "--batch", "2", "--context", "8"]) == 0
    table = capsys.readouterr().out
    assert all(phase in table for phase in refmodel.PHASES) and "attn_scores" in table
    for argv, needle in ((["costs", "--preset", "nope"], "gpt2"),
                         (["costs", "--preset", "tiny", "--batch", "-1"], "batch"),
                         (["costs", "--preset", "tiny", "--kv-dtype", "fp7"], "kv_dtype"),
                         (["costs", "--preset", "tiny", "--phase", "decoding"], "phase")):
        with pytest.raises(SystemExit) as exit_:
            cli.main(argv)
        assert exit_.value.code == 2
        err = capsys.readouterr().err
        assert needle in err and "Traceback" not in err
