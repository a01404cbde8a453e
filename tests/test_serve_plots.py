"""The serving figures (microbench.plots.serving) redraw from a serve result alone, without JAX."""

from __future__ import annotations

import copy
import json
import subprocess
import sys
from pathlib import Path

import pytest

from microbench.plots.serving import (
    FILES,
    draw_serving,
    goodput_verdict,
    prefix_title,
    readmission_note,
    serving_summary,
)
from microbench.studies import serve

REPO = Path(__file__).resolve().parents[1]
SLO = {"ttft_s": 0.012, "tpot_s": 0.002}


def _run(experiment: str, policy: str, rate: float, frac: float, *, ttft: float,
         num_pages: int = 40, prefix_cache: bool = True, hit_rate: float = 0.5,
         preemptions: int = 0, pool_fraction: float | None = None, attainment: float = 1.0,
         readmissions: int = 0, prefill_tokens: int = 100) -> dict:
    """One run in the shape `microbench.studies.serve.record` writes, with four requests."""
    requests = [{"id": i, "arrival_s": i / rate, "prompt": 40 + i, "output": 6,
                 "ttft_s": ttft * (0.6 + 0.3 * i), "tpot_s": None if i == 3 else 0.0005 * (1 + i),
                 "e2e_s": ttft * 2 + 0.003 * i} for i in range(4)]
    met = sum(q["ttft_s"] <= SLO["ttft_s"] and (q["tpot_s"] or 0) <= SLO["tpot_s"]
              for q in requests)
    pct = {"mean": ttft, "p50": ttft, "p90": ttft * 1.4, "p99": ttft * 1.5}
    run = {"experiment": experiment, "policy": policy, "rate": rate, "rate_fraction": frac,
           "summary": {"requests": 4, "duration_s": 4 / rate, "ttft_s": pct, "tpot_s": pct,
                       "itl_s": pct, "e2e_s": pct, "output_tokens_per_s": 24 * rate / 4,
                       "requests_per_s": rate * 0.9, "slo": SLO, "slo_attainment": met / 4,
                       "goodput_requests_per_s": rate * 0.9 * met / 4},
           "steady": {"trim": 0.1, "window_s": 1.0, "requests": 4, "arrival_rate": rate,
                      "slo_attainment": attainment, "goodput_requests_per_s": rate * attainment,
                      "completed_requests_per_s": rate, "output_tokens_per_s": 6 * rate,
                      "ttft_s": pct, "tpot_s": pct},
           "mean_ttft_s": ttft, "prefill_tokens": prefill_tokens, "prompt_tokens": 166,
           "hit_rate": hit_rate if prefix_cache else 0.0,
           "hit_tokens": 80 if prefix_cache else 0, "miss_tokens": 90,
           "first_admission_hit_rate": 0.4 if prefix_cache else 0.0,
           "readmissions": readmissions, "readmit_tokens": 60 * readmissions,
           "readmit_hit_tokens": 40 * readmissions, "preemptions": preemptions,
           "evicted_pages": 0, "compiles": 0, "prefix_cache": prefix_cache,
           "num_pages": num_pages, "utilization": {"used": 0.3, "held": 0.45}, "steps": 5,
           "requests": requests,
           "usage": [[0.001, 6, 0], [0.002, 12, 0], [0.004, 10, 5], [0.006, 4, 12],
                     [0.007, 0, 16]]}
    if pool_fraction is not None:
        run["pool_fraction"] = pool_fraction
    return run


def _result() -> dict:
    """Saturation 200 requests/s; mixed holds the 90% target at 100 and 300 (1.5x), static
    only at 100; the prefix pair at 50 requests/s below saturation, 9 vs 6 ms mean TTFT."""
    low, high = 100.0, 300.0
    runs = [_run("policy", "mixed", low, 0.5, ttft=0.004),
            _run("policy", "mixed", high, 1.5, ttft=0.006, attainment=0.95),
            _run("policy", "static", low, 0.5, ttft=0.005, attainment=0.92),
            _run("policy", "static", high, 1.5, ttft=0.015, attainment=0.25),
            _run("prefix cache on", "mixed", 50.0, 0.25, ttft=0.006, prefill_tokens=300),
            _run("prefix cache off", "mixed", 50.0, 0.25, ttft=0.009, prefix_cache=False,
                 attainment=0.96, prefill_tokens=1200),
            _run("pool", "mixed", low, 0.5, ttft=0.008, num_pages=20, hit_rate=0.6,
                 preemptions=3, pool_fraction=0.5, readmissions=3),
            _run("pool", "mixed", low, 0.5, ttft=0.007, num_pages=30, hit_rate=0.4,
                 preemptions=0, pool_fraction=0.75)]
    return {
        "kind": "serve",
        "setup": {"model": "tiny", "requests": 4, "policies": ["mixed", "static"],
                  "rate_fractions": [0.5, 1.5], "pool_fractions": [0.5, 0.75], "trim": 0.1,
                  "slo_scale": 5.0, "attainment_target": 0.9, "page_size": 8,
                  "system_len": 16, "decode_batch": 4, "decode_context": 127},
        "model": {"preset": "tiny", "label": "gqa", "dtype": "float32", "params": 106816},
        "environment": {"cpu_model": "Test CPU 9000", "backend": "cpu", "cpu_count": 8},
        "slo": {**SLO, "scale": 5.0,
                "reference": {"model": "tiny", "prompt": 42, "output": 20, "ttft_s": 0.0024,
                              "tpot_s": 0.0004}},
        "saturation": {"requests_per_s": 200.0, "policy": "mixed", "requests": 4,
                       "runs_requests_per_s": [190.0, 200.0, 230.0]},
        "saturation_no_cache": {"requests_per_s": 100.0, "policy": "mixed", "requests": 4},
        "full_pool_pages": 40, "max_len": 120, "runs": runs,
        "decode": {"batch": 4, "context": 127, "kernels": "native",
                   "engine_tokens_per_s": 8000.0, "phases_tokens_per_s": 10000.0, "ratio": 0.8,
                   "xla": {"ratio": 0.7}},
    }


def _is_png(path: Path) -> bool:
    return path.stat().st_size > 1000 and path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_draw_serving_writes_four_pngs(tmp_path):
    paths = draw_serving(_result(), tmp_path)
    assert [p.name for p in paths] == list(FILES)
    assert all(p.parent == tmp_path and _is_png(p) for p in paths)


def test_missing_pieces_draw_with_notes_instead_of_crashing(tmp_path):
    result = _result()
    # one policy only, no prefix-cache pair, no pool runs, no environment, no saturation
    result["runs"] = [r for r in result["runs"]
                      if r["experiment"] == "policy" and r["policy"] == "mixed"]
    del result["environment"], result["saturation"]
    paths = draw_serving(result, tmp_path)
    assert all(_is_png(p) for p in paths)
    assert "n/a" in serving_summary(result) or "Mean TTFT with and without" in \
        serving_summary(result)  # no prefix pair: no TTFT ratio to report


@pytest.mark.parametrize("runs", ["absent", None, [], [{"policy": "mixed"}]])
def test_missing_or_malformed_runs_raise_naming_the_key(tmp_path, runs):
    result = _result()
    if runs == "absent":
        del result["runs"]
    else:
        result["runs"] = runs
    with pytest.raises(ValueError, match="runs"):
        draw_serving(result, tmp_path)
    with pytest.raises(ValueError, match="runs"):
        serving_summary(result)
    assert not list(tmp_path.iterdir())


def test_goodput_title_says_which_policy_holds_the_target_from_the_data():
    result = _result()
    # mixed keeps >= 90% at 300 requests/s (1.5x the saturation of 200), static only at 100
    assert goodput_verdict(result).endswith("mixed 300 (1.5x); static 100 (0.5x)")
    worse = copy.deepcopy(result)
    for r in worse["runs"]:
        if r["experiment"] == "policy" and r["policy"] == "mixed" and r["rate"] == 300.0:
            r["steady"]["slo_attainment"] = 0.5
    assert goodput_verdict(worse).endswith("mixed, static 100 (0.5x)")  # a tie: both named
    for r in worse["runs"]:
        r.get("steady", {})["slo_attainment"] = 0.1
    assert goodput_verdict(worse).startswith("No policy kept 90% of requests")
    drifted = copy.deepcopy(result)
    drifted["saturation_after"] = {"requests_per_s": 300.0}
    assert goodput_verdict(drifted).endswith("\n(saturation 200 requests/s before the sweep, "
                                             "300 after it: the machine's speed drifted during "
                                             "the sweep)")
    drifted["saturation_after"] = {"requests_per_s": 210.0}  # within 15%: nothing to say
    assert goodput_verdict(drifted) == goodput_verdict(result)
    with_claims = copy.deepcopy(result)
    with_claims["claims"] = serve.claims(with_claims)  # the study's claims give the same
    assert goodput_verdict(with_claims) == goodput_verdict(result)


def test_prefix_title_reports_the_matched_pair_and_whether_both_were_unsaturated():
    result = _result()
    title = prefix_title(result)
    assert "Same trace at 50 requests/s (0.5x the cache-off saturation): mean TTFT 6 ms with " \
        "the cache, 9 ms without (1.5x)" in title
    assert "prefill tokens computed: 300 with, 1,200 without (75% saved)" in title
    assert title.endswith("SLO attainment 100% with, 96% without (target 90%): both below "
                          "saturation")
    overloaded = copy.deepcopy(result)
    next(r for r in overloaded["runs"] if r["experiment"] == "prefix cache off"
         )["steady"]["slo_attainment"] = 0.4
    assert prefix_title(overloaded).endswith("NOT both below saturation: queueing is in the "
                                             "ratio")
    overloaded["claims"] = serve.claims(overloaded)
    assert overloaded["claims"]["prefix_cache"]["both_unsaturated"] is False


def test_readmission_note_explains_the_smallest_pool_from_its_counts():
    note = readmission_note(_result())
    # 3 readmissions of 60 tokens, 40 hits each; the 16-token system prompt is 2 pages of 8
    assert note.startswith("At 20 pages, 3 readmissions after preemption brought back 180 "
                           "tokens (prompt and output so far); 120 (67%) were cache hits, 72 "
                           "of them past the shared system prompt")
    assert note.endswith("First admissions alone hit 40.0% of their tokens; readmissions "
                         "raise the hit rate to 60.0%.")
    lower = _result()
    for r in lower["runs"]:
        r["first_admission_hit_rate"] = 0.7
    assert "readmissions lower the hit rate to 60.0%" in readmission_note(lower)
    quiet = _result()
    for r in quiet["runs"]:
        r["readmissions"] = 0
    assert readmission_note(quiet) == "20 pages: no request was readmitted after a preemption"


def test_summary_reports_the_claims_from_the_json():
    result = _result()
    text = serving_summary(result)
    assert "0.80x" in text and "batch 4, context 127, kernels native" in text
    assert "| the same on XLA's path (a view gathered per layer) | 0.70x |" in text
    assert "| saturation: mixed, 4 requests queued at once, median of 3 runs | 200 requests/s " \
        "(runs: 190, 200, 230) |" in text
    assert "TTFT <= 12 ms, TPOT <= 2 ms (5 x one request alone on tiny" in text
    assert "mean TTFT 6 ms with the cache, 9 ms without (1.5x)" in text
    assert "| offered rate (requests/s) | mixed | static |" in text
    assert "| 300 | 285 (95%) | 75 (25%) |" in text  # steady goodput = rate x attainment
    # the study's claims block gives the same table
    result["claims"] = serve.claims(result)
    assert "| 300 | 285 (95%) | 75 (25%) |" in serving_summary(result)


DRAW_WITHOUT_JAX = r"""
import json
import sys

for name in ("jax", "jaxlib", "flax"):
    sys.modules[name] = None  # importing any of them now raises ImportError
from microbench.plots.serving import draw_serving

for path in draw_serving(json.load(open(sys.argv[1])), sys.argv[2]):
    print(path.name)
print(sorted(m for m in sys.modules
             if m.partition(".")[0] in ("jax", "jaxlib", "flax") and sys.modules[m] is not None))
"""


def test_drawing_imports_no_jax(tmp_path):
    src = tmp_path / "serve.json"
    src.write_text(json.dumps(_result()))
    out = tmp_path / "figures"
    proc = subprocess.run([sys.executable, "-c", DRAW_WITHOUT_JAX, str(src), str(out)],
                          capture_output=True, text=True, cwd=REPO)
    assert proc.returncode == 0, proc.stderr
    *written, loaded = proc.stdout.split("\n")[:-1]
    assert written == list(FILES) and loaded == "[]"
    assert all(_is_png(out / name) for name in written)
