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
    # one set of SLOs from one reference, scaled as the setup says
    ref = r["slo"]["reference"]
    assert ref["model"] == setup["slo_model"] and not ref["prefix_cache"]
    for key in ("ttft_s", "tpot_s"):
        assert math.isclose(r["slo"][key], setup["slo_scale"] * ref[key])
    # the swept rates are the fractions of the measured saturation
    sat = r["saturation"]["requests_per_s"]
    policy = [x for x in r["runs"] if x["experiment"] == "policy"]
    assert len(policy) == len(setup["policies"]) * len(setup["rate_fractions"])
    assert sorted({x["rate"] for x in policy}) == pytest.approx(
        [f * sat for f in sorted(setup["rate_fractions"])])
    for run in r["runs"]:
        n = setup["prefix_requests"] if run["experiment"].startswith("prefix") \
            else setup["requests"]
        assert run["summary"]["requests"] == n == len(run["requests"])
        assert run["summary"]["slo"] == {"ttft_s": r["slo"]["ttft_s"],
                                         "tpot_s": r["slo"]["tpot_s"]}  # the same SLOs
        window = run["steady"]
        assert window["requests"] < n and window["window_s"] > 0
        for q in run["requests"]:
            assert q["ttft_s"] > 0 and q["e2e_s"] >= q["ttft_s"]
        used = [u for _, u, _ in run["usage"]]
        assert max(used) <= run["num_pages"] and used[-1] == 0  # every page back at the end
    on, off = (next(x for x in r["runs"] if x["experiment"] == f"prefix cache {k}")
               for k in ("on", "off"))
    assert on["rate"] == off["rate"] and off["hit_rate"] == 0 and not off["prefix_cache"]
    assert on["hit_rate"] > 0 and on["prefill_tokens"] < off["prefill_tokens"]
    claim = r["claims"]["prefix_cache"]
    assert claim["prefill_tokens_saved"] == off["prefill_tokens"] - on["prefill_tokens"]
    assert math.isclose(claim["ttft_off_over_on"], off["mean_ttft_s"] / on["mean_ttft_s"])
    assert r["workload"]["lengths"]["output"]["cv"] > 0.3  # long-tailed, not one length
    d = r["decode"]
    assert d["ratio"] > 0 and len(d["ratio_by_round"]) == d["rounds"] >= 1
    assert d["view_tokens"] >= d["context"] + 1  # the engine and Phases over one length
    assert d["kernels"] in ("native", "xla") and ("xla" in d) == (d["kernels"] == "native")
    assert r["peer"]["error"].startswith("not asked")
    text = (out / "serve.md").read_text()
    # the verdict follows the data: on a loaded machine no swept rate may meet the target
    target = r["setup"].get("attainment_target", 0.9)
    met = any(_window_attainment(x) >= target for x in policy)
    verdict = ("Highest swept rate with >= 90% SLO attainment" if met
               else "No policy kept 90% of requests within the SLOs at any swept rate")
    assert verdict in text and "Same trace at" in text


def _window_attainment(run):
    return run["steady"].get("slo_attainment", 0)


@pytest.mark.parametrize(("args", "message"), [
    (["--requests", "0"], "requests=0"),
    (["--policies", "fifo"], "policy 'fifo'"),
    (["--pool-fractions", "2"], "pool_fractions"),
    (["--workload", "poisson"], "workload='poisson'"),
    (["--model", "gpt-5"], "model='gpt-5'"),
    (["--attention", "flash"], "attention='flash'"),
    (["--slo-scale", "0"], "slo_scale"),
    (["--slo-model", "gpt-5"], "slo_model='gpt-5'"),
    (["--trim", "0.5"], "trim=0.5"),
    (["--prompt-len", "20"], "prompt_len=20.0: the sharegpt workload"),
    (["--attainment-target", "1.5"], "attainment_target=1.5"),
])
def test_bad_options_are_refused_before_measuring(tmp_path, capsys, args, message):
    out = tmp_path / "serve"
    with pytest.raises(SystemExit) as err:
        main(["serve", "--quick", "--out", str(out), *args])
    assert err.value.code == 2
    assert message in capsys.readouterr().err
    assert not out.exists() or not any(out.iterdir())
