"""The simulate figures and summary (microbench.plots.simulate) redraw from a saved simulate
result alone, without JAX; titles claim only what the data shows."""

from __future__ import annotations

import copy
import json
import subprocess
import sys
from pathlib import Path

import pytest

from microbench.commands.figures import simulate_figures
from microbench.plots.simulate import (
    FILES,
    check_claim,
    draw_simulate,
    pd_claim,
    pd_winners,
    simulate_summary,
)

REPO = Path(__file__).resolve().parents[1]
MEANS = ("ttft_s", "tpot_s", "e2e_s")


def _means(scale: float) -> dict:
    base = {"ttft_s": 0.010, "tpot_s": 0.002, "e2e_s": 0.050}
    return {**{k: v * scale for k, v in base.items()},
            **{k.replace("_s", "_p90_s"): v * scale * 1.3 for k, v in base.items()}}


def _check_run(policy: str, rate: float, table: float, roof: float) -> dict:
    engine = [_means(1.0), _means(1.04)]
    reqs = {k: [engine[0][k] * (0.9 + 0.1 * i) for i in range(3)] for k in MEANS}
    return {"policy": policy, "rate": rate, "rate_fraction": 0.5, "engine_runs": engine,
            "engine": {**_means(1.02), "requests": reqs},
            "table": {**_means(table), "requests": reqs, "steps": 9},
            "roofline": {**_means(roof), "requests": reqs, "steps": 9}}


def _check() -> dict:
    by_model = {"ttft_s": 0.05, "tpot_s": 0.06, "e2e_s": 0.07}
    return {
        "check": {"models": ["tiny", "tiny+moe"], "policies": ["mixed", "static"],
                  "rate_fractions": [0.5], "requests": 6},
        "goals": {"ttft_s": 0.15, "tpot_s": 0.10, "e2e_s": 0.10},
        "models": [{"model": m, "runs": [_check_run("mixed", 40.0, 1.1, 0.8),
                                         _check_run("static", 40.0, 0.95, 1.3)]}
                   for m in ("tiny", "tiny+moe")],
        "errors": {"table": {"runs": 4, "ttft_s": 0.123, "tpot_s": 0.045, "e2e_s": 0.067,
                             "ttft_per_request": 0.2, "tpot_per_request": 0.11,
                             "e2e_per_request": 0.09, "meets_goals": True,
                             "by_model": {"tiny": by_model, "tiny+moe": by_model}},
                   "roofline": {"runs": 4, "ttft_s": 0.456, "tpot_s": 0.25, "e2e_s": 0.3,
                                "ttft_per_request": 0.5, "tpot_per_request": 0.3,
                                "e2e_per_request": 0.35, "meets_goals": False,
                                "by_model": {"tiny": by_model}},
                   "engine_vs_engine": {"runs": 4, "ttft_s": 0.031, "tpot_s": 0.02,
                                        "e2e_s": 0.025}},
        "peaks_machine": "Test CPU 9000"}


def _design(name: str, prefill: int, decode: int, goodput_per_chip: float) -> dict:
    return {"design": name, "prefill": prefill, "decode": decode, "instances": 4, "chips": 4,
            "goodput_per_chip": goodput_per_chip}


def _pd_mix(table: list[tuple[float, float, float]]) -> dict:
    """rate -> goodput per chip of '4 colocated' and '1P3D'."""
    return {"mix": ["chat", 512, 256], "slo": {"ttft_s": 0.1, "tpot_s": 0.02},
            "capacity_per_instance": 5.0,
            "rates": [{"rate": r, "rate_fraction": r / 20, "designs": [
                _design("4 colocated", 0, 0, c), _design("1P3D", 1, 3, d)]}
                for r, c, d in table]}


PD_TABLE = [(5.0, 1.2, 1.0), (10.0, 2.4, 2.41), (20.0, 2.0, 3.0)]


def _paper() -> dict:
    assume = {"device": "H100 SXM", "tp": 2, "link": "NVLink 4", "weight_dtype": "bfloat16",
              "kv_dtype": "bfloat16"}
    scale_out = [{"model": "llama3-8b", "tp": 2, "capacity": 30.0, "mix": ["chat", 512, 256],
                  "slo": {"ttft_s": 0.05, "tpot_s": 0.01}, "assumptions": assume,
                  "runs": [{"rate": r, "goodput_per_chip": r / 3} for r in (10.0, 20.0)],
                  "pareto": [{"max_running": b, "tokens_per_s_per_chip": 100.0 * b,
                              "tokens_per_s_per_user": 200.0 / b ** 0.3} for b in (1, 4)]}]
    afd_a = {"attn_chip": "H100 SXM", "link": "InfiniBand NDR", "weight_dtype": "bfloat16",
             "kv_dtype": "bfloat16", "act_dtype": "bfloat16", "total": 32}
    afd = [{"model": m, "moe": moe, "context": 1024, "batch": b, "n_attn": 4, "n_ffn": 4,
            "gain": g, "assumptions": afd_a}
           for m, moe, b, g in (("llama3-70b", False, 16, 0.9), ("qwen3-30b-a3b", True, 64,
                                                                 1.37))]
    row = {"batch": 1, "chips": 600, "microbatches": 1, "tokens_per_s_per_user": 400.0,
           "tokens_per_s_per_chip": 0.7, "fits": True}
    gpu = {**row, "chips": 8, "tokens_per_s_per_user": 40.0, "tokens_per_s_per_chip": 5.0}
    sram = {"chips_needed": [{"model": "llama3-70b", "chip": "Groq LPU", "chips": 615,
                              "weight_chips": 614}],
            "pareto": {"sram": [row], "gpu": [gpu], "assumptions": {
                "model": "llama3-70b", "sram_chip": "Groq LPU", "sram_link": "Groq C2C",
                "gpu_chip": "H100 SXM", "gpu_link": "NVLink 4", "gpus": 8, "context": 4096,
                "weight_dtype": "float16", "kv_dtype": "float16", "act_dtype": "float16"}},
            "heterogeneous": {"ttft": 0.025, "prefill": 0.02, "transfer": 0.005,
                              "tpot": 0.0024, "assumptions": {"prefill_chip": "H100 SXM",
                                                              "prefill_chips": 8,
                                                              "kv_link": "InfiniBand NDR",
                                                              "prompt": 4096}}}
    return {"paper": {"slo_scale": 5.0, "context": 4096}, "scale_out": scale_out,
            "pd": {"model": "llama3-8b", "tp": 1, "mixes": [_pd_mix(PD_TABLE)],
                   "assumptions": {"device": "H100 SXM", "tp_per_instance": 1,
                                   "kv_link": "InfiniBand NDR", "kv_dtype": "bfloat16",
                                   "weight_dtype": "bfloat16", "routing": "round-robin",
                                   "prefill_policy": "prefill-first",
                                   "colocated_policy": "mixed"}},
            "afd": afd, "sram": sram}


def _result() -> dict:
    return {"kind": "simulate", "environment": {"cpu_model": "Test CPU 9000",
                                                "backend": "cpu", "cpu_count": 2},
            "check": _check(), "paper": _paper(), "wall_s": 1.0}


def _is_png(path: Path) -> bool:
    return path.stat().st_size > 1000 and path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_draws_one_png_per_part(tmp_path):
    paths = draw_simulate(_result(), tmp_path)
    assert [p.name for p in paths] == list(FILES.values())
    assert all(_is_png(p) for p in paths)


@pytest.mark.parametrize("drop, expected", [("paper", ["simulate_check.png"]),
                                            ("check", list(FILES.values())[1:])])
def test_absent_parts_draw_no_figure(tmp_path, drop, expected):
    result = _result()
    del result[drop]
    assert [p.name for p in draw_simulate(result, tmp_path)] == expected
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(expected)


def test_summary_carries_the_mape_and_paper_numbers():
    text = simulate_summary(_result())
    # run means, per request, goals, meets; the noise floor; per model
    assert "| table sim | 4 | 12.3% | 4.5% | 6.7% | 20.0% | 11.0% | 9.0% | yes |" in text
    assert "| roofline sim | 4 | 45.6% | 25.0% | 30.0% |" in text and "| no |" in text
    assert "| goal |  | <= 15.0% | <= 10.0% | <= 10.0% |" in text
    assert "TTFT 3.1%, TPOT 2.0%, E2E 2.5%" in text
    assert "| tiny+moe | table sim | 5.0% | 6.0% | 7.0% |" in text
    assert "| 20 | 1P3D | 3 | 2 |" in text  # PD: best design per rate
    assert "| qwen3-30b-a3b | MoE | bfloat16 | 1024 | 64 | 4:4 | 1.37x |" in text
    assert "| llama3-70b | Groq LPU | 615 | 614 |" in text
    no_check = {k: v for k, v in _result().items() if k != "check"}
    assert "MAPE" not in simulate_summary(no_check)


def test_pd_claim_names_the_winner_at_each_rate():
    mix = _pd_mix(PD_TABLE)
    # 5/s: colocated; 10/s: within 1% (a tie); 20/s: 1P3D
    assert [w for _, w, _ in pd_winners(mix)] == [["4 colocated"], ["4 colocated", "1P3D"],
                                                 ["1P3D"]]
    assert pd_claim(mix) == ("4 colocated at 5 requests/s; 4 colocated = 1P3D at 10 "
                             "requests/s; 1P3D at 20 requests/s")
    same = _pd_mix([(5.0, 2.0, 1.0), (10.0, 3.0, 1.0)])
    assert pd_claim(same) == "4 colocated at every rate (5-10 requests/s)"
    nobody = _pd_mix([(5.0, 0.0, 0.0)])
    assert pd_claim(nobody).startswith("no design meets the SLOs")


def test_check_claim_follows_the_goals_and_the_noise_floor():
    check = _check()  # table meets, roofline misses; noise 2-3% under the goals
    assert check_claim(check) == "table sim meets the MAPE goals"
    check["errors"]["table"]["meets_goals"] = False
    check["errors"]["engine_vs_engine"]["tpot_s"] = 0.17  # over the 10% TPOT goal
    assert check_claim(check) == ("neither simulator meets the MAPE goals; the engine's own "
                                  "noise exceeds them (TPOT)")
    check["errors"]["roofline"]["meets_goals"] = True
    check["errors"]["table"]["meets_goals"] = True
    assert check_claim(check).startswith("table sim and roofline sim meet the MAPE goals")


def test_figures_command_draws_simulate_json_when_present(tmp_path):
    data, out = tmp_path / "data", tmp_path / "out"
    data.mkdir()
    assert simulate_figures(out, data) == []
    (data / "simulate.json").write_text(json.dumps(_result()))
    written = simulate_figures(out, data)
    assert sorted(p.name for p in written) == sorted([*FILES.values(), "simulate.md"])
    assert "12.3%" in (out / "simulate.md").read_text()


def test_not_a_simulate_result_raises(tmp_path):
    bad = copy.deepcopy(_result())
    bad["kind"] = "serve"
    with pytest.raises(ValueError, match="simulate"):
        draw_simulate(bad, tmp_path)


DRAW_WITHOUT_JAX = r"""
import json
import sys

for name in ("jax", "jaxlib", "flax"):
    sys.modules[name] = None  # importing any of them now raises ImportError
from microbench.plots.simulate import draw_simulate, simulate_summary

result = json.load(open(sys.argv[1]))
simulate_summary(result)
for path in draw_simulate(result, sys.argv[2]):
    print(path.name)
print(sorted(m for m in sys.modules
             if m.partition(".")[0] in ("jax", "jaxlib", "flax") and sys.modules[m] is not None))
"""


def test_drawing_imports_no_jax(tmp_path):
    src = tmp_path / "simulate.json"
    src.write_text(json.dumps(_result()))
    proc = subprocess.run([sys.executable, "-c", DRAW_WITHOUT_JAX, str(src), str(tmp_path)],
                          capture_output=True, text=True, cwd=REPO)
    assert proc.returncode == 0, proc.stderr
    *written, loaded = proc.stdout.split("\n")[:-1]
    assert written == list(FILES.values()) and loaded == "[]"
