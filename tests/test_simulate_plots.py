"""The simulate figures and summary (microbench.plots.simulate) redraw from a saved simulate
result alone, without JAX; titles claim only what the data shows."""

from __future__ import annotations

import copy
import json
import subprocess
import sys
from pathlib import Path

import pytest
from test_scale_plots import AFD, MODELS, PD

from microbench.commands.figures import simulate_figures
from microbench.plots.simulate import (
    FILES,
    check_claim,
    draw_simulate,
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
    spread = {"ttft_s": 0.08, "tpot_s": 0.05, "e2e_s": 0.06}
    shapes = [{"shape": "4x1", "steps": 30, "engine_s": 0.003, "engine_p10_s": 0.0028,
               "engine_p90_s": 0.0035, "table_s": 0.0031, "roofline_s": 0.0025},
              {"shape": "1x64+4x1", "steps": 6, "engine_s": 0.012, "engine_p10_s": 0.011,
               "engine_p90_s": 0.014, "table_s": 0.0125, "roofline_s": 0.009}]

    def sim(scale: float) -> dict:
        return {**_means(scale), "requests": reqs, "steps": 9, "host_s": 1e-4,
                "mape": {k: abs(scale - 1) + 0.02 for k in MEANS}, "n": dict.fromkeys(MEANS, 3)}

    return {"policy": policy, "rate": rate, "rate_fraction": 0.5, "engine_runs": engine,
            "engine": {**_means(1.02), "requests": reqs, "spread": spread,
                       "pairs": {k: [v] for k, v in spread.items()}},
            "table": sim(table), "roofline": sim(roof),
            "step": {"shapes": shapes, "steps": 36, "noise": 0.04, "table_error": 0.06,
                     "roofline_error": 0.2}}


def _check() -> dict:
    by_model = {"ttft_s": 0.05, "tpot_s": 0.06, "e2e_s": 0.07}
    machine = {"per_kernel_s": 1.3e-5, "chain_per_kernel_s": 6e-7}
    return {
        "check": {"models": ["tiny", "tiny+moe"], "policies": ["mixed", "static"],
                  "rate_fractions": [0.5], "requests": 6, "engine_repeats": 5},
        "targets": {"spread_factor": 1.2, "spread_max": 0.15,
                    "step_error": {"table": 0.10, "roofline": 0.25}},
        "models": [{"model": m, "machine": machine,
                    "runs": [_check_run("mixed", 40.0, 1.1, 0.8),
                             _check_run("static", 40.0, 0.95, 1.3)]}
                   for m in ("tiny", "tiny+moe")],
        "errors": {"traces": 4, "pairs": 40, "spread_ok": True,
                   "spread": {"ttft_s": 0.1, "tpot_s": 0.05, "e2e_s": 0.08},
                   "table": {"traces": 4, "ttft_s": 0.123, "ttft_ratio": 1.23,
                             "tpot_s": 0.045, "tpot_ratio": 0.9, "e2e_s": 0.067,
                             "e2e_ratio": 0.8375, "within_spread": False,
                             "step_error": 0.061, "step_p90": 0.2, "steps": 144,
                             "step_ok": True, "by_model": {"tiny": by_model,
                                                           "tiny+moe": by_model}},
                   "roofline": {"traces": 4, "ttft_s": 0.456, "ttft_ratio": 4.56,
                                "tpot_s": 0.25, "tpot_ratio": 5.0, "e2e_s": 0.3,
                                "e2e_ratio": 3.75, "within_spread": False,
                                "step_error": 0.31, "step_p90": 0.5, "steps": 144,
                                "step_ok": False, "by_model": {"tiny": by_model}},
                   "step_noise": 0.04},
        "peaks_machine": "Test CPU 9000"}


def _paper() -> dict:
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
    # scale-out, PD and AFD: the synthetic results of test_scale_plots
    return {"paper": {"context": 4096}, "scale_out": MODELS, "pd": PD, "afd": AFD,
            "sram": sram}


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
    # per metric: the engine's spread beside each simulator's MAPE and their ratio
    assert "| TTFT | 10.0% | 12.3% | 1.23x | 45.6% | 4.56x |" in text
    assert "| TPOT | 5.0% | 4.5% | 0.90x | 25.0% | 5.00x |" in text
    assert "median of 40 pairs" in text and "Each trace run 5 times" in text
    # per step, against each predictor's target; the engine's own step noise
    assert "| table sim | 6.1% | 20.0% | 144 | <= 10.0% | yes |" in text
    assert "| roofline sim | 31.0% | 50.0% | 144 | <= 25.0% | no |" in text
    assert "step noise (each step against the median of its shape): 4.0%" in text
    assert "13.0 us (tiny)" in text and "0.6 us per kernel" in text
    # per trace
    assert "| tiny+moe | static | 0.5 | 8.0% | 5.0% | 6.0% | 7.0% | 7.0% | 7.0% | 6.0% | " \
        "20.0% | 4.0% |" in text
    assert "| 1P3D | 10 | 2.5 |" in text  # PD: requests/s per chip sustained per SLO
    assert ("| moe-30b | MoE | bfloat16 | 1024 | 16 | 16:16 | EP 32 (attention TP 2) | "
            "15.0 / 29.0 | 0.78x |") in text
    assert "| llama3-70b | Groq LPU | 615 | 614 |" in text
    no_check = {k: v for k, v in _result().items() if k != "check"}
    assert "MAPE" not in simulate_summary(no_check)


def test_check_claim_follows_the_spread_and_the_step_targets():
    check = _check()  # TTFT 1.23x over 1.2x; table per step met, roofline missed
    assert check_claim(check) == (
        "table sim outside 1.2x the engine's own spread (TTFT 1.23x); table sim per step "
        "6.1% (target <= 10.0%: met); roofline sim per step 31.0% (target <= 25.0%: missed)")
    check["errors"]["table"].update(within_spread=True, ttft_ratio=1.1)
    check["errors"]["spread"]["tpot_s"] = 0.17  # over the 15% target on this machine
    check["errors"]["table"]["step_ok"] = False
    claim = check_claim(check)
    assert claim.startswith("table sim within 1.2x the engine's own spread (TTFT 1.10x, "
                            "TPOT 0.90x, E2E 0.84x)")
    assert "(target <= 10.0%: missed)" in claim
    assert claim.endswith("the engine's own spread is over 15.0% on this machine (TPOT 17.0%)")
    del check["errors"]["table"]
    assert check_claim(check).startswith("no table simulator ran")


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
