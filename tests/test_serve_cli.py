"""`python -m microbench serve --quick`: runs end to end, writes one set of files whose
numbers hang together, and refuses bad options before measuring anything."""

from __future__ import annotations

import json
import math

import pytest

from microbench.cli import main


def test_quick_serve_writes_results_and_figures(tmp_path):
    out = tmp_path / "serve"
    assert main(["serve", "--quick", "--no-peer", "--out", str(out)]) == 0
    names = {p.name for p in out.iterdir()}
    assert {"serve.json", "serve.md", "serve_latency_cdf.png", "serve_goodput.png",
            "serve_prefix_cache.png", "serve_pool_timeline.png"} <= names
    r = json.loads((out / "serve.json").read_text())
    assert r["kind"] == "serve" and r["environment"]["backend"]
    setup = r["setup"]
    policy = [x for x in r["runs"] if x["experiment"] == "policy"]
    assert len(policy) == len(setup["policies"]) * len(setup["rate_fractions"])
    for run in r["runs"]:
        if run["experiment"] == "peer":
            continue
        assert run["summary"]["requests"] == setup["requests"]
        assert len(run["requests"]) == setup["requests"]
        for q in run["requests"]:
            assert q["ttft_s"] > 0 and q["e2e_s"] >= q["ttft_s"]
        used = [u for _, u, _ in run["usage"]]
        assert max(used) <= run["num_pages"] and used[-1] == 0  # every page back at the end
    off = [x for x in r["runs"] if x["experiment"] == "prefix cache off"]
    on = [x for x in policy if x["policy"] == "mixed" and x["rate"] == off[0]["rate"]]
    assert off[0]["hit_rate"] == 0 and not off[0]["prefix_cache"]
    assert on[0]["hit_rate"] > 0  # a 64-token system prompt before every request
    speedup = r["claims"]["prefix_cache_ttft_speedup"]
    assert math.isclose(speedup, off[0]["mean_ttft_s"] / on[0]["mean_ttft_s"])
    d = r["decode"]
    assert d["ratio"] > 0 and len(d["ratio_by_round"]) == d["rounds"] >= 1
    assert d["view_tokens"] >= d["context"] + 1  # the engine and Phases over one length
    assert d["kernels"] in ("native", "xla") and ("xla" in d) == (d["kernels"] == "native")
    assert r["peer"]["error"].startswith("not asked")
    assert "mean TTFT without / with" in (out / "serve.md").read_text()


@pytest.mark.parametrize(("args", "message"), [
    (["--requests", "0"], "requests=0"),
    (["--policies", "fifo"], "policy 'fifo'"),
    (["--pool-fractions", "2"], "pool_fractions"),
    (["--workload", "poisson"], "workload='poisson'"),
    (["--model", "gpt-5"], "model='gpt-5'"),
    (["--attention", "flash"], "attention='flash'"),
    (["--slo-scale", "0"], "slo_scale"),
])
def test_bad_options_are_refused_before_measuring(tmp_path, capsys, args, message):
    out = tmp_path / "serve"
    with pytest.raises(SystemExit) as err:
        main(["serve", "--quick", "--out", str(out), *args])
    assert err.value.code == 2
    assert message in capsys.readouterr().err
    assert not out.exists() or not any(out.iterdir())
