"""The decode race (microbench.studies.decode): ratios are taken inside each round, the roof is the
slower of the counted bytes and FLOPs, the summary and figure say what the data say, and bad
options are named; each pair of formats is compared inside a round, a CPU without an int8 dot
product records no prefill number, and a whole race on the tiny preset runs our formats beside
llama.cpp's own (its quantizer's files of the same weights), which compute what ours do.
Timings here are of the tiny model: the measurement itself is `python -m microbench decode`."""

from __future__ import annotations

import copy

import pytest

from microbench import cli
from microbench.plots.decode import decode_summary, draw_decode, title
from microbench.studies.decode import TARGETS, Setup, summarize

GB = 1e9


def _point(program, batch, step_s, nbytes=1.2e9, flops=None):
    return {"program": program, "batch": batch, "step_s": step_s, "samples": [step_s],
            "bytes": nbytes, "flops": flops if flops is not None else 0.6 * batch * nbytes,
            "kernels": 100}


def _result():
    """Two rounds; round 2's memory is 20% slower and every program with it."""
    rounds = []
    for i, f in enumerate((1.0, 1.2)):
        rounds.append({
            "round": i, "t_start": 0.0, "t_end": 1.0,
            "read_bytes_per_s": [20 * GB / f, 24 * GB / f], "gemm_flops_per_s": 120 * GB,
            "points": [_point("xla", 1, 0.070 * f), _point("native", 1, 0.055 * f),
                       _point("xla", 8, 0.200 * f), _point("native", 8, 0.080 * f)],
            "peers": [{"program": "llama.cpp", "batch": 1, "step_s": 0.060 * f,
                       "samples": [0.060 * f]}],
            "products": [{"form": "xla [K, N]", "rows": 1, "seconds": 0.080 * f,
                          "bytes": 1.1e9, "products": 113},
                         {"form": "native panels", "rows": 1, "seconds": 0.055 * f,
                          "bytes": 1.1e9, "products": 113}]})
    return {"setup": {"model": "llama-309m", "context": 128, "batches": [1, 8]},
            "model": "llama-309m", "params": 309e6, "programs": ["xla", "native"],
            "rounds": rounds, "skipped": [], "targets": TARGETS, "greedy_vs_llamacpp": None,
            "read_program": "C read (2 threads)", "gemm_program": "numpy matmul 2048x2048x2048",
            "environment": {"cpu_model": "test CPU", "cpu_count": 2, "backend": "cpu"}}


def test_ratios_are_taken_inside_each_round():
    r = summarize(_result())
    row = next(x for x in r["table"] if x["program"] == "native" and x["batch"] == 1)
    # 0.060 / 0.055 in both rounds: the drift cancels inside a round
    assert row["over_llama.cpp_rounds"] == pytest.approx([0.060 / 0.055] * 2)
    # the round's roof is its faster read (24 GB/s, then 20): 1.2e9 / 0.055 / 24e9 both times
    assert row["over_read"] == pytest.approx(1.2e9 / 0.055 / 24e9)
    assert row["bound"] == "memory" and row["roof_fraction"] == pytest.approx(
        (1.2e9 / 24e9) / 0.055)


def test_the_roof_is_the_slower_limit():
    res = _result()
    for rnd in res["rounds"]:  # batch 8 with 100x the FLOPs: compute-bound
        for p in rnd["points"]:
            if p["batch"] == 8:
                p["flops"] = 100 * p["bytes"]
    row = next(x for x in summarize(res)["table"] if x["program"] == "xla" and x["batch"] == 8)
    assert row["bound"] == "compute"
    assert row["roof_s"] == pytest.approx(100 * 1.2e9 / 120e9)


def test_summary_and_title_state_the_measured_ratios(tmp_path):
    r = summarize(_result())
    text = decode_summary(r)
    assert "| native | 1 | 60.50 | memory |" in text  # median of 55 and 66 ms
    assert f"{0.060 / 0.055:.2f}x" in text and "llama.cpp: 66.00 ms per step" in text
    t = title(r)
    assert f"native kernel {1.2e9 / 0.055 / 24e9:.2f} of the C read" in t
    assert f"{0.060 / 0.055:.2f}x llama.cpp" in t
    assert f"batch 8, share of its roof: XLA [K, N] {(1.2e9 / 24e9) / 0.200:.2f}" in t
    (png,) = draw_decode(r, tmp_path)
    assert png.stat().st_size > 20_000


def test_a_round_without_llamacpp_claims_nothing_about_it():
    res = _result()
    for rnd in res["rounds"]:
        rnd["peers"] = []
    r = summarize(res)
    assert "llama.cpp" not in title(r)
    assert all("over_llama.cpp" not in row for row in r["table"])


def test_bad_setups_are_named():
    with pytest.raises(ValueError, match="batches"):
        Setup(batches=(1, 0)).check()
    with pytest.raises(ValueError, match="rounds=0"):
        Setup(rounds=0).check()
    with pytest.raises(ValueError, match="no-such"):
        Setup(model="no-such").check()
    with pytest.raises(SystemExit) as e:
        cli.main(["decode", "--batches", "1,x", "--out", "/tmp"])
    assert e.value.code == 2


def test_summarize_does_not_need_the_peers():
    res = copy.deepcopy(_result())
    res["programs"] = ["xla"]
    for rnd in res["rounds"]:
        rnd["points"] = [p for p in rnd["points"] if p["program"] == "xla"]
    r = summarize(res)
    assert [x["program"] for x in r["table"]] == ["xla", "xla"]


def test_products_alone_are_reported_per_form_and_rows():
    r = summarize(_result())
    got = {(p["form"], p["rows"]): p for p in r["products"]}
    assert got[("native panels", 1)]["over_read"] == pytest.approx(1.1e9 / 0.055 / 24e9)
    assert got[("xla [K, N]", 1)]["seconds"] == pytest.approx(0.088)  # median of 80, 96 ms
    assert "| 1 | native panels | 1.10 | 60.50 |" in decode_summary(r)


def test_a_ratio_above_the_read_is_flagged_not_passed_over():
    """Nothing above 1 in the base result: no flag. A product chain timed at 44 GB/s in rounds
    whose reads were 20-24 GB/s is listed, with the run's reads and its fastest read."""
    assert "Above the C read" not in decode_summary(summarize(_result()))
    res = _result()
    for rnd in res["rounds"]:
        rnd["products"][1]["seconds"] = 1.1e9 / 44e9  # 44 GB/s
    text = decode_summary(summarize(res))
    assert "Above the C read of their rounds (median > 1): native panels at 1 rows (44.0 GB/s)" \
        in text
    assert "Faster than every read of the run (24.0 GB/s): native panels at 1 rows" in text
    res["rounds"][0]["read_bytes_per_s"][1] = 50 * GB  # a read taken in a fast moment
    text = decode_summary(summarize(res))
    assert "None is faster than the fastest read of the run (50.0 GB/s)" in text


# The formats: our quantized programs against llama.cpp's own files ------------------------------

def _formats_result():
    """Two rounds with w8a8 and llama.cpp Q8_0 beside the float programs; round 2's memory is
    20% slower, and every program with it."""
    res = _result()
    res["programs"] = ["xla", "native", "w8a8"]
    res["formats"] = {
        "native": {"side": "ours", "format": "float32", "backend": "native", "matrix_bpw": 32.0,
                   "stored_bpw": 32.0, "matrix_weights": 2.7e8},
        "w8a8": {"side": "ours", "format": "int8 weights, int8 activations", "backend": "native",
                 "matrix_bpw": 8.03, "stored_bpw": 11.4, "matrix_weights": 2.7e8},
        "llama.cpp": {"side": "llama.cpp", "format": "F32", "matrix_bpw": 32.0, "file_bpw": 32.0,
                      "types": {"F32": 147}, "step_weight_bytes": 1.1e9},
        "llama.cpp Q8_0": {"side": "llama.cpp", "format": "Q8_0", "matrix_bpw": 8.5,
                           "file_bpw": 8.5, "types": {"F32": 33, "Q8_0": 114},
                           "step_weight_bytes": 0.29e9}}
    for rnd, f in zip(res["rounds"], (1.0, 1.2), strict=True):
        for p in rnd["points"]:
            p["weight_bytes"] = 1.08e9
        rnd["points"] += [dict(_point("w8a8", 1, 0.012 * f, nbytes=0.3e9), weight_bytes=0.28e9),
                          dict(_point("w8a8", 8, 0.030 * f, nbytes=0.3e9), weight_bytes=0.28e9)]
        rnd["peers"][0]["weight_bytes"] = 1.1e9
        rnd["peers"].append({"program": "llama.cpp Q8_0", "batch": 1, "step_s": 0.013 * f,
                             "samples": [0.013 * f], "weight_bytes": 0.29e9})
        rnd["prefill"] = [_point("native", 1, 2.0 * f), _point("w8a8", 1, 1.0 * f)]
    res["prefill_skipped"] = None
    res["setup"]["prefill_len"] = 512
    return res


def test_pairs_take_each_ratio_inside_its_round():
    r = summarize(_formats_result())
    (f32,) = [p for p in r["pairs"] if p["theirs"] == "llama.cpp"]
    (q8,) = [p for p in r["pairs"] if p["theirs"] == "llama.cpp Q8_0"]
    assert q8["pair"] == "int8 vs Q8_0" and q8["target"] == "int8_vs_q8_0"
    assert q8["rounds"] == pytest.approx([0.013 / 0.012] * 2)  # the drift cancels in a round
    # weight bytes per step over the round's faster read: 24 GB/s in round 1, 20 in round 2
    assert q8["ours_of_read_rounds"] == pytest.approx([0.28e9 / 0.012 / 24e9] * 2)
    assert q8["theirs_of_read"] == pytest.approx(0.29e9 / 0.013 / 24e9)
    assert f32["speed"] == pytest.approx(0.060 / 0.055)
    # the float programs are not set against llama.cpp's Q8_0, nor w8a8 against its F32
    assert all("over_llama.cpp Q8_0" not in row for row in r["table"])
    assert "over_llama.cpp" not in next(x for x in r["table"] if x["program"] == "w8a8")
    assert r["prefill"]["speedup"] == pytest.approx(2.0) and r["prefill"]["rounds"] == [2.0, 2.0]


def test_summary_lists_every_ratio_with_its_rounds_and_bits():
    res = summarize(_formats_result())
    res["greedy"] = [{"pair": "int8 vs Q8_0", "ours": [1, 2, 3, 4], "theirs": [1, 2, 9, 4],
                      "agreement": 0.75, "first_difference": 2, "prompt_len": 16}]
    res["quality"] = {"recipe": "target", "preset": "byte-target", "positions": 1024,
                      "windows": 4, "length": 256, "llamacpp": None, "greedy": [],
                      "greedy_prompt_len": 128,
                      "rows": [{"side": "ours", "program": "w8a8", "matrix_bpw": 8.07,
                                "kl_mean": 5e-5, "kl_max": 6e-4, "top1_agreement": 0.994}]}
    text = decode_summary(res)
    speed = f"{0.013 / 0.012:.2f}"
    assert f"| int8 vs Q8_0 | {speed}x | {speed}, {speed} | 8.03 | 8.50 |" in text
    assert "| w8a8 | int8 weights, int8 activations | native | 8.03 | 11.40 | - |" in text
    assert "| int8 vs Q8_0 | 0.75 | token 3 |" in text
    assert "| ours | w8a8 | 8.07 | 5.00e-05 | 6.00e-04 | 0.994 |" in text
    assert "W8A8 prefill of 512 tokens (batch 1): w8a8 1100.0 ms, float32 2200.0 ms: 2.00x" in text
    assert "int8 vs Q8_0 " + f"{0.013 / 0.012:.2f}x" in title(res)


def test_no_int8_dot_instruction_skips_the_prefill_and_records_no_number(monkeypatch):
    from types import SimpleNamespace

    from microbench.studies import decode
    from refmodel import kernels

    monkeypatch.setattr(kernels, "int8_dot", lambda: None, raising=False)
    ours = SimpleNamespace(backends={"native": "native", "w8a8": "native"})
    assert decode._prefill_why(ours) == decode.NO_INT8_DOT == "skipped: no VNNI/i8mm"
    res = _formats_result()
    res["prefill_skipped"] = decode._prefill_why(ours)
    r = summarize(res)
    assert r["prefill"] == {"skipped": "skipped: no VNNI/i8mm"}
    assert "W8A8 prefill: skipped: no VNNI/i8mm." in decode_summary(r)
    monkeypatch.setattr(kernels, "int8_dot", lambda: "avx512_vnni", raising=False)
    assert decode._prefill_why(ours) is None


def test_a_missing_public_step_is_named(monkeypatch):
    import sys

    from microbench.studies import decode

    monkeypatch.setitem(sys.modules, "microbench.studies.host", None)  # import fails
    skipped = []
    assert decode._public_step(Setup(), skipped, lambda what: None) is None
    assert skipped and "public_overhead is missing" in skipped[0]


def test_agreement_and_kl_count_what_they_say():
    import numpy as np

    from microbench.studies.decode_quality import agreement, kl, step_agreement

    a = agreement([1, 2, 3, 4], [1, 2, 9, 4])
    assert a["agreement"] == 0.75 and a["first_difference"] == 2
    assert agreement([5], [5])["first_difference"] is None
    x = np.array([[2.0, 0.0], [0.0, 0.0]])
    p = np.exp(2) / (1 + np.exp(2))
    np.testing.assert_allclose(kl(x, x), [0, 0], atol=1e-12)
    want = p * np.log(2 * p) + (1 - p) * np.log(2 * (1 - p))  # against the uniform pair
    np.testing.assert_allclose(kl(x[:1], x[1:]), [want])
    logits = np.eye(4)[[0, 3, 1, 2]]  # rows pick 0, 3, 1, 2
    assert step_agreement(logits, 2, [3, 1, 0]) == pytest.approx(2 / 3)


# A whole race on the tiny preset: llama.cpp quantizes the model itself ---------------------------

TINY_RACE = Setup(model="tiny", context=16, batches=(1,), rounds=1, budget_s=0.05, peer_steps=2,
                  gemm=(64, 64, 64), product_rows=(), prefill_len=16, agree_tokens=16,
                  quality_model="micro", quality_windows=1, quality_len=32, public=False)


@pytest.fixture(scope="module")
def race():
    """`measure` on the tiny preset with llama.cpp, a small C read and no transformers. The
    quality part reads the race's own random model and random tokens, not the trained model
    and the corpus: what is checked here is that each engine's formats compute what ours do."""
    import numpy as np

    pytest.importorskip("llama_cpp")
    pytest.importorskip("gguf")
    import refmodel
    from microbench.roofs import native
    from microbench.studies import decode, decode_peers, decode_quality
    from refmodel import training

    if not native.available():
        pytest.skip("the C read peer needs gcc")
    mp = pytest.MonkeyPatch()
    mp.setattr(decode, "main_array_floats", lambda: 1 << 20)
    mp.setattr(decode_peers, "report_peer_available", lambda: False)
    mp.setattr(training, "trained", lambda name, progress=False: refmodel.init(
        refmodel.presets.get("tiny"), seed=0))
    mp.setattr(decode_quality, "held_out", lambda name, n, length: np.random.default_rng(
        1).integers(0, 256, (n, length)))
    try:
        yield decode.measure(TINY_RACE)
    finally:
        mp.undo()


def test_a_tiny_race_runs_every_format_and_pair(race):
    import json

    from flax import nnx

    import refmodel
    from microbench.studies.decode_formats import OURS, PAIRS, THEIRS
    from refmodel import quant

    assert set(race["formats"]) == set(OURS) | set(THEIRS)
    assert race["formats"]["llama.cpp Q8_0"]["matrix_bpw"] == 8.5  # 34 bytes per 32 weights
    for program, fmt in (("w8a8", "int8"), ("w4a8", "int4")):  # counted = the arrays' bytes
        q = quant.quantize(refmodel.init(refmodel.presets.get("tiny")), weights=fmt)
        ws = [getattr(m, n)[...] for _, m in nnx.iter_modules(q) for n in quant.matrices(m)]
        want = 8 * sum(w.nbytes for w in ws) / sum(w.k * w.n for w in ws)
        assert race["formats"][program]["matrix_bpw"] == pytest.approx(want), program
    assert [p["pair"] for p in race["pairs"]] == [label for label, *_ in PAIRS]
    for pair in race["pairs"]:
        assert len(pair["rounds"]) == TINY_RACE.rounds and pair["speed"] > 0
        assert 0 < pair["ours_of_read"] and 0 < pair["theirs_of_read"]
    assert [g["pair"] for g in race["greedy"]] == [label for label, *_ in PAIRS]
    assert all(len(g["ours"]) == len(g["theirs"]) == 16 for g in race["greedy"])
    prefill = race["prefill"]
    assert ("speedup" in prefill and len(prefill["rounds"]) == 1) or \
        prefill["skipped"].startswith("skipped:")
    json.dumps(race)  # plain numbers all through: the result file is written whole


def test_llamacpp_formats_compute_what_ours_do(race):
    """On the same random weights and text: llama.cpp's F32 is our float32 model (KL ~ 0); its
    Q8_0 and Q4_0 move the distribution as far from float32 as our w8a8 and w4a8 do (within
    4x: the same bits per weight give or take a scale, and int8 activations per block of 32
    on both sides; a wrong scale or layout is orders of magnitude off); and fed our greedy
    tokens, llama.cpp picks the same next token at most steps: Q8_0 at >= 0.85 of 16 steps,
    Q4_0 at >= 0.4 (this random model's logits are nearly flat, its top-2 gaps a fraction of a
    logit, which int4's rounding moves; chance is 1/256)."""
    rows = {r["program"]: r for r in race["quality"]["rows"]}
    assert rows["llama.cpp"]["kl_mean"] < 1e-8
    for ours, theirs in (("w8a8", "llama.cpp Q8_0"), ("w4a8", "llama.cpp Q4_0")):
        assert 0.25 < rows[ours]["kl_mean"] / rows[theirs]["kl_mean"] < 4, (ours, theirs)
    steps = {g["theirs_program"]: g["step_agreement"] for g in race["quality"]["greedy"]}
    assert steps["llama.cpp"] == 1.0
    assert steps["llama.cpp Q8_0"] >= 0.85
    assert steps["llama.cpp Q4_0"] >= 0.4


def test_the_figure_and_summary_draw_from_the_saved_race(race, tmp_path):
    import json

    from test_figure_text import problems

    from microbench.plots import common

    saved = json.loads(json.dumps(race))
    saved["environment"] = {"cpu_model": "test CPU", "cpu_count": 2, "backend": "cpu"}
    found = []
    with common.checking(lambda fig, path: found.extend(problems(fig)[0])):
        (png,) = draw_decode(saved, tmp_path)
    assert png.stat().st_size > 20_000 and not found, found
    text = decode_summary(saved)
    for pair in saved["pairs"]:
        assert f"| {pair['pair']} | {pair['speed']:.2f}x |" in text
    assert "KL mean" in text and "step agreement" in text


def test_the_readme_row_names_each_pair_with_both_sides_bits():
    from microbench.plots.results import _decode

    res = summarize(_formats_result())
    res["quality"] = {"recipe": "target", "rows": [
        {"program": "w8a8", "kl_mean": 5e-5}, {"program": "llama.cpp Q8_0", "kl_mean": 4e-5}]}
    row = _decode(res)
    assert (f"float32 {0.060 / 0.055:.2f}x F32 (32.00 vs 32.00 bits/weight), int8 "
            f"{0.013 / 0.012:.2f}x Q8_0 (8.03 vs 8.50 bits/weight)") in row
    assert f"weights streamed at {1.08e9 / 0.055 / 24e9:.2f}, {0.28e9 / 0.012 / 24e9:.2f}" in row
    assert row.endswith("KL from float32 on held-out text (target): int8 5.0e-05 vs 4.0e-05")
