"""The speculative figure and summary (microbench.plots.speculative) redraw from a saved
speculative result alone, without JAX; titles and tables carry the numbers of the result."""

from __future__ import annotations

import copy
import json

import pytest

from microbench.commands.figures import speculative_figures
from microbench.plots.speculative import (
    batch_cause,
    best_claim,
    break_even,
    draw_speculative,
    num,
    speculative_summary,
)


def _run(drafter: str, k: int, a, speedup: float, rounds: list[float], predicted, standard):
    row = {"drafter": drafter, "k": k, "temperature": 0.0, "acceptance": a,
           "tokens_per_pass": 1.0 + (k * a if a is not None else 0.0),
           "rounds_per_prompt": [10], "seconds": [0.1, 0.1, 0.1], "speedup": speedup,
           "speedup_rounds": rounds}
    if k:
        row.update(verify_ratio=1.0 + 0.1 * k, predicted=predicted, standard=standard)
    return row


@pytest.fixture
def result() -> dict:
    runs = [_run("none", 0, None, 1.0, [1.0, 1.0, 1.0], None, None),
            _run("draft", 1, 0.75, 1.2, [1.1, 1.2, 1.25], 1.1, 1.3),
            _run("draft", 4, 0.625, 1.55, [1.42, 1.55, 1.61], 1.45, 1.8),
            _run("lookup", 1, 0.5, 1.05, [1.0, 1.05, 1.07], 1.02, 1.5),
            _run("lookup", 4, 0.4375, 0.875, [0.8, 0.875, 0.9], None, 1.7)]
    roofline = [{"k": k, "flops": 1.0e9 * (k + 1) * s, "bytes": 2e6, "weight_bytes": 1.9e6,
                 "intensity": 0.5 * (k + 1), "seconds": s, "flops_per_s": 1e9 * (k + 1),
                 "bytes_per_s": 2e6 / s} for k, s in ((0, 1e-3), (1, 1.1e-3), (4, 1.4e-3))]
    batch = [{"batch": b, "decode_s": 1e-3, "verify_s": 1e-3 * r, "draft_s": 2e-4,
              "verify_ratio": r, "draft_ratio": 0.2, "predicted_speedup": p,
              "verify_intensity": 1.5 * b, "decode_intensity": 0.5 * b}
             for b, r, p in ((1, 1.05, 1.9), (4, 1.3, 1.5), (16, 2.4, 0.8), (64, 4.6, 0.45))]
    return {"kind": "speculative",
            "setup": {"target": "target", "draft": "draft", "ks": [1, 4],
                      "drafters": ["draft", "lookup"], "prompts": 2, "prompt_len": 64,
                      "new_tokens": 32, "rounds": 3, "sample_temperature": 1.0,
                      "batches": [1, 4, 16, 64], "batch_k": 4, "context": 96,
                      "step_repeats": 3},
            "models": {"target": {"recipe": "target", "preset": "byte-small",
                                  "params": 1234567},
                       "draft": {"recipe": "draft", "preset": "byte-tiny", "params": 54321}},
            "steps": {"context": 96, "target_decode_s": 1e-3, "draft_decode_s": 2e-4,
                      "draft_ratio": 0.2, "verify_s": {"1": 1.1e-3, "4": 1.4e-3}},
            "runs": runs,
            "sampled": {"drafter": "draft", "k": 4, "temperature": 1.0, "acceptance": 0.3125,
                        "tokens_per_pass": 2.25, "speedup": 1.125, "predicted": 0.95},
            "roofline": roofline, "batch": batch, "batch_acceptance": 0.625,
            "roofs": {"compute": 1e11, "memory": 2e10, "source": "peaks-test.json"},
            "environment": {"backend": "cpu", "cpu_model": "Test CPU 9000", "cpu_count": 8},
            "wall_s": 12.5}


def test_num_formats_three_significant_digits():
    assert num(0.84615) == "0.846"
    assert num(1.0) == "1.00"
    assert num(1234.5) == "1,234"
    assert num(None) == "n/a"


def test_summary_holds_the_numbers(result):
    text = speculative_summary(result)
    assert "Test CPU 9000, 8 cores" in text
    assert "target byte-small (target recipe, 1,234,567 params)" in text
    assert "draft byte-tiny (draft recipe, 54,321 params)" in text
    assert "greedy, batch 1" in text
    assert "| draft model | 4 | 0.625 | 3.50 | 1.55x | 1.42x-1.61x | 1.45x | 1.80x |" in text
    assert "| prompt lookup | 4 | 0.438 | 2.75 | 0.875x | 0.800x-0.900x | n/a | 1.70x |" in text
    assert "best measured speedup 1.55x at k=4 (draft model)" in text
    assert "acceptance a = 0.312" in text and "1.12x (one timing)" in text
    assert "| 4 | 1.40 ms | 1.40 | 2.50 | 5 GFLOP/s | 10.0% |" in text  # 5e9 / (2e10 * 2.5)
    assert "| 16 | 2.40 | 0.200 | 0.800x | 8.00 | 24.0 |" in text
    assert "falls below 1 between batch 4 and 16" in text
    assert "plain decode" not in text.split("| drafter |")[1].split("\n\n")[0]  # no k=0 row


def test_claims_follow_the_data(result):
    assert best_claim(result) == "best measured speedup 1.55x at k=4 (draft model)"
    r = copy.deepcopy(result)
    for row in r["batch"]:
        row["predicted_speedup"] = 1.2
    assert break_even(r) == "predicted speedup stays above 1 up to batch 64"
    r["batch"][0]["predicted_speedup"] = 0.9
    assert break_even(r) == "predicted speedup below 1 already at batch 1"
    for row in r["batch"]:
        row.pop("predicted_speedup")
    assert break_even(r).startswith("no predicted speedup")


def _png(path) -> bool:
    return path.stat().st_size > 10_000 and path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_draw_writes_one_png(result, tmp_path):
    paths = draw_speculative(result, tmp_path)
    assert [p.name for p in paths] == ["speculative.png"]
    assert _png(paths[0])


def test_draw_without_roofs_sampled_predictions_or_environment(result, tmp_path):
    r = copy.deepcopy(result)
    r["roofs"] = None
    r["sampled"] = None
    r["batch_acceptance"] = None
    r.pop("environment")
    for row in r["runs"]:
        row["predicted"] = None
        row["speedup_rounds"] = row["speedup_rounds"][:1]
    for row in r["batch"]:
        row.pop("predicted_speedup")
    (path,) = draw_speculative(r, tmp_path)
    assert _png(path)
    text = speculative_summary(r)
    assert "No sampled run." in text and "roofs: none recorded" in text
    assert "machine not recorded" in text and "| 1.20x | one round | n/a |" in text


def test_draw_rejects_other_results(tmp_path):
    with pytest.raises(ValueError, match="not a speculative result"):
        draw_speculative({"kind": "simulate"}, tmp_path)


def test_figures_command_redraws_saved_data(result, tmp_path, monkeypatch):
    import microbench.plots.speculative as plots

    def fake_draw(res, out_dir):  # the drawing itself is tested above: keep this one fast
        assert res == result
        path = out_dir / "speculative.png"
        path.write_bytes(b"\x89PNG\r\n\x1a\n" + b"0" * 10_001)
        return [path]

    monkeypatch.setattr(plots, "draw_speculative", fake_draw)
    data, out = tmp_path / "data", tmp_path / "out"
    assert speculative_figures(out, data) == []  # nothing saved: nothing drawn
    data.mkdir()
    (data / "speculative.json").write_text(json.dumps(result))
    written = speculative_figures(out, data)
    assert sorted(p.name for p in written) == ["speculative.md", "speculative.png"]
    assert _png(out / "speculative.png")
    assert "1.55x" in (out / "speculative.md").read_text()


def test_batch_cause_is_measured_and_on_the_figure_and_summary(result, tmp_path):
    """Why v is what it is at the largest batch, from the data: the verify's place against
    the ridge, the v the roofs give, and how far below its roof each step ran."""
    r = copy.deepcopy(result)  # batch 64: decode 1 ms, verify 4.6 ms on 64x the batch-1 FLOPs
    cause = batch_cause(r)
    # ridge 5; decode 64 MFLOP at 32 FLOP/B: 0.64 ms on the roofs; verify (k=4) 448 MFLOP at
    # 96 FLOP/B: 4.48 ms
    assert cause == ("batch 64: verify (k=4) at 96.0 FLOP/B, past the ridge (5.00); on the "
                     "roofs v = 7.00, measured v = 4.60: decode ran at 64% of its roof, "
                     "verify at 97%, so the verify's extra FLOPs cost less than the roofs say")
    r["batch"][-1].update(verify_ratio=1.8, verify_s=1.44e-3, decode_s=8e-4)
    cause = batch_cause(r)
    assert "measured v = 1.80: decode ran at 80% of its roof" in cause
    assert cause.endswith("so the verify's extra FLOPs cost less than the roofs say")
    assert cause in speculative_summary(r)
    draw_speculative(r, tmp_path)
    r.pop("roofs")
    assert batch_cause(r) is None and "Why, measured" not in speculative_summary(r)
