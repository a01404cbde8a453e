"""The serving figures (microbench.plots.serving) redraw from a serve result alone, without JAX."""

from __future__ import annotations

import copy
import json
import subprocess
import sys
from pathlib import Path

import pytest

from microbench.plots.serving import FILES, draw_serving, serving_summary

REPO = Path(__file__).resolve().parents[1]
SLO = {"ttft_s": 0.012, "tpot_s": 0.002}


def _run(experiment: str, policy: str, rate: float, frac: float, *, ttft: float,
         num_pages: int = 40, prefix_cache: bool = True, hit_rate: float = 0.5,
         preemptions: int = 0, pool_fraction: float | None = None) -> dict:
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
           "mean_ttft_s": ttft, "hit_rate": hit_rate if prefix_cache else 0.0,
           "hit_tokens": 80 if prefix_cache else 0, "miss_tokens": 90, "preemptions": preemptions,
           "evicted_pages": 0, "compiles": 0, "prefix_cache": prefix_cache,
           "num_pages": num_pages, "utilization": {"used": 0.3, "held": 0.45}, "steps": 5,
           "requests": requests,
           "usage": [[0.001, 6, 0], [0.002, 12, 0], [0.004, 10, 5], [0.006, 4, 12],
                     [0.007, 0, 16]]}
    if pool_fraction is not None:
        run["pool_fraction"] = pool_fraction
    return run


def _result() -> dict:
    low, high = 100.0, 400.0
    runs = [_run("policy", "mixed", low, 0.5, ttft=0.004),
            _run("policy", "mixed", high, 2.0, ttft=0.006),
            _run("policy", "static", low, 0.5, ttft=0.005),
            _run("policy", "static", high, 2.0, ttft=0.015),
            _run("prefix cache off", "mixed", high, 2.0, ttft=0.009, prefix_cache=False),
            _run("pool", "mixed", high, 2.0, ttft=0.008, num_pages=20, hit_rate=0.3,
                 preemptions=3, pool_fraction=0.5),
            _run("pool", "mixed", high, 2.0, ttft=0.007, num_pages=30, hit_rate=0.4,
                 preemptions=1, pool_fraction=0.75)]
    goodput = {}
    for r in runs:
        if r["experiment"] == "policy":
            goodput.setdefault(r["rate"], {})[r["policy"]] = r["summary"]["goodput_requests_per_s"]
    return {
        "kind": "serve",
        "setup": {"model": "tiny", "requests": 4, "policies": ["mixed", "static"],
                  "rate_fractions": [0.5, 2.0], "pool_fractions": [0.5, 0.75],
                  "slo_scale": 5.0, "page_size": 8, "decode_batch": 4, "decode_context": 127},
        "model": {"preset": "tiny", "label": "gqa", "dtype": "float32", "params": 106816},
        "environment": {"cpu_model": "Test CPU 9000", "backend": "cpu", "cpu_count": 8},
        "unloaded": {"ttft_s": 0.0024, "tpot_s": 0.0004, "e2e_s": 0.02},
        "slo": SLO, "capacity_requests_per_s": 200.0, "full_pool_pages": 40, "max_len": 120,
        "runs": runs,
        "claims": {"decode_engine_over_phases": 0.8,
                   "prefix_cache_ttft_speedup": 0.009 / 0.006,
                   "goodput_by_rate": [{"rate": k, **v} for k, v in sorted(goodput.items())]},
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
    # one policy only, no prefix-off run, no pool runs, no environment
    result["runs"] = [r for r in result["runs"]
                      if r["experiment"] == "policy" and r["policy"] == "mixed"]
    del result["environment"], result["claims"]
    paths = draw_serving(result, tmp_path)
    assert all(_is_png(p) for p in paths)
    assert "n/a" in serving_summary(result)  # no prefix-off run: no speedup to report


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


def test_summary_reports_the_claims_from_the_json():
    result = _result()
    text = serving_summary(result)
    assert "| 1.50x |" in text  # 9 ms / 6 ms mean TTFT, without / with the radix cache
    assert "0.80x" in text and "batch 4, context 127, kernels native" in text
    assert "| the same on XLA's path (a view gathered per layer) | 0.70x |" in text
    assert "| offered rate (requests/s) | mixed | static |" in text
    # goodput at 400 requests/s: mixed 4/4 within the SLOs, static 1/4 (TTFT 13.5, 18, 22.5 ms > 12)
    assert "| 400 | 360 | 90 |" in text
    # without the claims block the same numbers come from the runs
    bare = copy.deepcopy(result)
    del bare["claims"], bare["decode"]
    assert "| 1.50x |" in serving_summary(bare) and "| 400 | 360 | 90 |" in serving_summary(bare)


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
