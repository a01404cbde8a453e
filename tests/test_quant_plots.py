"""The quant figure and summary (microbench.plots.quant) redraw from a saved quant result alone,
without JAX; titles and tables carry the numbers of the result."""

from __future__ import annotations

import copy
import json
import subprocess
import sys

import pytest

from microbench.commands.figures import saved_figures
from microbench.plots.quant import (
    bytes_ratio,
    draw_quant,
    follow_claim,
    formulation_claim,
    kl_claim,
    kv_cause,
    kv_claim,
    quality_claim,
    quant_figure,
    quant_summary,
    readme_claim,
    step_claim,
)

FORMS = [  # name, format, used, stored bytes, seconds at 1 row, at 8 rows
    ("float32 dot", "float32", True, 64e6, 40e-6, 50e-6),
    ("bfloat16 dot", "bfloat16", False, 32e6, 22e-6, 30e-6),
    ("int8 dequantize then dot", "int8", False, 16e6, 60e-6, 70e-6),
    ("int8 dot, preferred f32", "int8", False, 16e6, 25e-6, 28e-6),
    ("int8 x int8 -> int32 dot", "int8", False, 16e6, 20e-6, 22e-6),
    ("int8 multiply-reduce [N, K]", "int8", True, 16e6, 16e-6, 40e-6),
    ("int4 multiply-reduce [N, K/2]", "int4", True, 8e6, 32e-6, 90e-6),
    ("float8 multiply-reduce [N, K]", "float8", True, 16e6, 80e-6, 120e-6),
]
# (path, precision) -> (weight bytes, decode speedup at batch 1, at batch 8, prefill speedup)
PRECISIONS = {("xla", "float32"): (400e6, 1.0, 1.0, 1.0),
              ("xla", "bfloat16"): (200e6, 1.8, 1.7, 2.5),
              ("xla", "int8"): (100e6, 1.3, 1.1, 0.9),
              ("xla", "int8 w8a8"): (100e6, 1.2, 1.4, 1.6),
              ("xla", "float8"): (100e6, 0.6, 0.5, 0.7),
              ("xla", "int4"): (50e6, 0.8, 0.4, 0.5),
              ("native", "float32"): (400e6, 1.0, 1.0, 1.0),
              ("native", "int8"): (100e6, 3.2, 2.5, 1.1),
              ("native", "int8 w8a8"): (100e6, 3.0, 2.7, 2.2)}
FORMAT = {"float32": ("none", "float32"), "bfloat16": ("none", "bfloat16"),
          "int8": ("int8", "float32"), "int8 w8a8": ("int8", "float32"),
          "float8": ("float8", "float32"), "int4": ("int4", "float32"),
          "int4 w4a8": ("int4", "float32")}
SKIPPED = [{"path": "native", "precision": "int4 w4a8", "phase": None,
            "reason": "skipped: backend='native' takes float32 weights or int8"}]


def _step(path, precision, phase, batch, context, kv, weight_bytes, kv_bytes, speedup, base_s):
    wf, dtype = FORMAT[precision]
    nbytes = weight_bytes + kv_bytes
    s = base_s / speedup
    return {"path": path, "precision": precision, "phase": phase, "batch": batch,
            "context": context, "kv_format": kv, "weight_format": wf, "dtype": dtype,
            "activations": "int8" if "w8a8" in precision else dtype, "seconds": s,
            "rounds": [s, s], "speedup": speedup, "speedup_rounds": [0.9 * speedup, speedup],
            "flops": 2e8 * batch, "bytes": nbytes,
            "weight_bytes": weight_bytes, "kv_bytes": kv_bytes,
            "intensity": 2e8 * batch / nbytes, "bytes_per_s": nbytes / s,
            "flops_per_s": 2e8 * batch / s, "predicted_s": nbytes / 4e12,
            "measured_over_predicted": nbytes / 4e12 / s}


def _quality(label, kv, bpb, err, weight_bytes, kv_bytes, kl):
    wf = FORMAT[label][0]
    return {"precision": label, "weight_format": wf, "kv_format": kv,
            "activations": "int8" if " w" in label else "float32", "bits_per_byte": bpb,
            "delta_bits_per_byte": bpb - 2.0, "kl_nats": kl, "logit_error": err,
            "weight_bytes": weight_bytes, "kv_bytes_per_token": kv_bytes,
            "decode_bytes": weight_bytes + 1024 * kv_bytes}


@pytest.fixture
def result() -> dict:
    forms = [{"name": n, "format": f, "rows": m, "used": u, "stored_bytes": b,
              "seconds": s, "rounds": [s, s], "bytes_per_s": b / s, "speedup": ref / s}
             for m, col in ((1, 4), (8, 5))
             for (n, f, u, b, *_), s, ref in ((x, x[col], FORMS[0][col]) for x in FORMS)]
    steps = []
    for (path, p), (wb, s1, s8, sp) in PRECISIONS.items():
        steps.append(_step(path, p, "decode", 1, 256, "none", wb, 0, s1, 1e-4))
        steps.append(_step(path, p, "decode", 8, 256, "none", wb, 0, s8, 1.2e-4))
        steps.append(_step(path, p, "prefill", 1, 256, "none", wb, 1e6, sp, 2e-3))
    for kv, kvb, sp in (("none", 64e6, 1.0), ("int8", 17e6, 1.1), ("float8", 16e6, 0.9)):
        steps.append(_step("xla", "float32", "decode", 1, 4096, kv, 400e6, kvb, sp, 1.5e-4))
    quality = [_quality("float32", "none", 2.0, 0.0, 400e6, 4096, 0.0),
               _quality("int8", "none", 2.001, 0.01, 101e6, 4096, 2e-5),
               _quality("int8 w8a8", "none", 2.002, 0.012, 101e6, 4096, 5e-5),
               _quality("float8", "none", 2.004, 0.04, 101e6, 4096, 4e-4),
               _quality("int4", "none", 2.05, 0.15, 52e6, 4096, 0.008),
               {"precision": "int4 w4a8", "weight_format": "int4", "kv_format": "none",
                "activations": "int8", "skipped": "skipped: no int4 activations here"},
               _quality("float32", "int8", 2.0005, 0.002, 400e6, 1088, 1e-6),
               _quality("float32", "float8", 2.002, 0.008, 400e6, 1024, 2e-5)]
    return {"kind": "quant",
            "setup": {"k": 4096, "n": 4096, "rows": [1, 8], "rounds": 3, "repeats": 7,
                      "model": "medium", "layers": 0, "batches": [1, 8],
                      "context": 256, "prefill_len": 256, "kv_context": 4096,
                      "quality_model": "target"},
            "formulations": {"k": 4096, "n": 4096, "results": forms},
            "steps": {"model": "medium", "layers": 20, "memory_roof": 4e12,
                      "skipped": SKIPPED, "results": steps},
            "quality": {"recipe": "target", "preset": "byte-small",
                        "metric": "bits per byte, validation split", "results": quality},
            "roofs": {"compute": 1e15, "memory": 4e12, "source": "peaks-test.json",
                      "names": ["bf16 dot", "DRAM read"]},
            "environment": {"backend": "gpu", "device_kind": "Test GPU 9000"},
            "wall_s": 321.0}


def _titles(fig) -> str:  # and x labels: a panel's setup may be said under it
    return "\n".join(ax.get_title(loc="left") + ax.get_title() + ax.get_xlabel()
                     for ax in fig.axes)


def _png(path) -> bool:
    return path.stat().st_size > 10_000 and path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def _legacy(result) -> dict:
    """The result as an older run wrote it: XLA's path only, no path recorded."""
    r = copy.deepcopy(result)
    r["steps"]["results"] = [row for row in r["steps"]["results"] if row.pop("path") == "xla"]
    del r["steps"]["skipped"]
    return r


def test_claims_follow_the_data(result):
    assert step_claim(result, 1) == ("batch 1 on XLA: fastest bfloat16 1.80x of float32, bytes "
                                     "promise 2.00x; int8 1.30x of float32, bytes promise "
                                     "4.00x")
    assert step_claim(result, 1, "native") == ("batch 1 on the native kernel: fastest int8 "
                                               "3.20x of float32, bytes promise 4.00x")
    assert step_claim(result, 8).startswith("batch 8 on XLA: fastest bfloat16 1.70x")
    assert follow_claim(result, 1) == (
        "batch 1: int8 (4.00x fewer bytes) 3.20x on the native kernel, 1.30x on XLA; "
        "int8 w8a8 (4.00x fewer bytes) 3.00x on the native kernel, 1.20x on XLA")
    assert follow_claim(result, 8, short=True) == ("batch 8: int8 2.50x native, 1.10x XLA, "
                                                   "for 4.00x fewer bytes")
    r = copy.deepcopy(result)
    for row in r["steps"]["results"]:
        if row["precision"] != "float32":
            row["speedup"] *= 0.5
    assert step_claim(r, 1).startswith("batch 1 on XLA: none beats float32; best bfloat16 "
                                       "0.900x")
    assert kv_claim(result) == ("decode at 4,096 cached tokens, batch 1: int8 KV 1.10x (bytes "
                                "promise 1.11x), float8 KV 0.900x (bytes promise 1.12x)")
    assert formulation_claim(result, 1) == (
        "1 row: float32 dot 1,600 GB/s; fastest quantized 'int8 multiply-reduce [N, K]' "
        "1,000 GB/s (2.50x)")
    assert formulation_claim(result, 8) == (
        "8 rows: float32 dot 1,280 GB/s; fastest quantized 'int8 x int8 -> int32 dot' 727 GB/s "
        "(2.27x); refmodel uses 'int8 multiply-reduce [N, K]' 400 GB/s (1.25x)")
    assert quality_claim(result) == ("bits per byte vs float32 weights: int8 +0.001 at 0.253x "
                                     "the bytes, int8 w8a8 +0.002 at 0.253x the bytes, float8 "
                                     "+0.004 at 0.253x the bytes, int4 +0.05 at 0.130x the "
                                     "bytes")
    assert kl_claim(result) == ("KL from float32's next token (nats): int8 2e-05, int8 w8a8 "
                                "5e-05, float8 0.0004, int4 0.008, int8 KV 1e-06, float8 KV "
                                "2e-05")


def test_a_result_without_paths_reads_as_xlas(result):
    """An older result (no path on its steps) is XLA's path, and its claims name no path."""
    old = _legacy(result)
    assert step_claim(old, 1) == ("batch 1: fastest bfloat16 1.80x of float32, bytes promise "
                                  "2.00x; int8 1.30x of float32, bytes promise 4.00x")
    assert readme_claim(old) == f"{step_claim(old, 1)} (decode step of the `medium` preset)"
    assert follow_claim(old, 1).startswith("batch 1: bfloat16 (2.00x fewer bytes) 1.80x on XLA")


def test_bytes_ratio_as_recorded_else_from_float32(result):
    row = next(r for r in result["steps"]["results"] if r["precision"] == "int4")
    assert bytes_ratio(result, row) == 8.0  # 400 MB / 50 MB, from the float32 row
    assert bytes_ratio(result, {**row, "bytes_ratio": 6.3}) == 6.3


def test_readme_claim_names_both_paths_or_why_one_is_skipped(result):
    assert readme_claim(result) == (f"{follow_claim(result, 1)} (decode step of the `medium` "
                                    "preset)")
    r = copy.deepcopy(result)
    r["steps"]["results"] = [x for x in r["steps"]["results"] if x["path"] == "xla"]
    r["steps"]["skipped"] = [{"path": "native", "precision": None, "phase": None,
                              "reason": "skipped: no native kernels here: no C++ compiler"}]
    r["setup"]["layers"] = 3
    r["steps"]["layers"] = 3
    assert readme_claim(r) == (f"{step_claim(r, 1)}; native kernel skipped: no native kernels "
                               "here: no C++ compiler (decode step of the `medium` preset cut "
                               "to 3 layers)")
    assert step_claim(r, 1, "native") == ("batch 1 on the native kernel: skipped: no native "
                                          "kernels here: no C++ compiler")


def test_titles_carry_the_numbers_and_change_with_them(result):
    titles = _titles(quant_figure(result))
    assert "batch 1: int8 3.20x native, 1.30x XLA, for 4.00x fewer bytes" in titles
    assert "batch 8: int8 2.50x native, 1.10x XLA" in titles
    assert "int4 +0.05 bits/B (KL 0.008 nats)" in titles
    assert "byte-small (target recipe)" in titles
    assert "1,600 GB/s" in titles and "model medium, 256 cached tokens" in titles
    r = copy.deepcopy(result)
    for row in r["steps"]["results"]:
        if row["precision"] == "int8" and row["batch"] == 1 and row["phase"] == "decode" \
                and row["path"] == "native":
            row["speedup"] = 2.2
    for row in r["quality"]["results"]:
        if row["precision"] == "int4":
            row["delta_bits_per_byte"] = 0.125
    changed = _titles(quant_figure(r))
    assert "batch 1: int8 2.20x native, 1.30x XLA" in changed
    assert "int4 +0.125" in changed and "int4 +0.05" not in changed
    sup = quant_figure(result)._suptitle.get_text()
    assert "Test GPU 9000" in sup and "python -m microbench quant" in sup


def test_summary_has_one_row_per_result(result):
    text = quant_summary(result)
    parts = text.split("\n## ")
    assert len(parts) == 4  # preamble, formulations, steps, quality

    def rows(part):
        return [ln for ln in part.splitlines() if ln.startswith("| ")][1:]  # less the header

    assert len(rows(parts[1])) == len(result["formulations"]["results"])
    assert len(rows(parts[2])) == len(result["steps"]["results"])
    measured = [q for q in result["quality"]["results"] if "skipped" not in q]
    assert len(rows(parts[3])) == len(measured)
    assert "Test GPU 9000" in text
    assert "| int8 multiply-reduce [N, K] | int8 | 1 | yes | 16.0 | 0.0160 | 1,000 | 2.50x |" \
        in text
    assert ("| xla | int8 | decode | 1 | 256 | float32 | 0.0769 | 1.30x | 1.2-1.3x | 4.00x | "
            "100 | 1,300 | ") in text
    assert "| native | int8 | decode | 1 | 256 | float32 | 0.0312 | 3.20x | " in text
    assert ("| float32 | float32 | float8 | 2.0020 | +0.002 | 2e-05 | 0.80% | 400 | 1,024 |"
            in text)
    assert "| int8 w8a8 | int8 | float32 | 2.0020 | +0.002 | 5e-05 | 1.20% | 101 |" in text
    assert "batch 1 on XLA: fastest bfloat16 1.80x" in text and "int8 KV 1.10x" in text
    assert follow_claim(result, 1) + "." in text
    assert ("Skipped: native int4 w4a8: skipped: backend='native' takes float32 weights or "
            "int8.") in text
    assert "Skipped: int4 w4a8, KV float32: skipped: no int4 activations here." in text
    assert "measured / predicted" in text and "4 TB/s (DRAM read roof from peaks-test.json)" \
        in text


def test_draw_writes_one_png(result, tmp_path):
    paths = draw_quant(result, tmp_path)
    assert [p.name for p in paths] == ["quant.png"]
    assert _png(paths[0])


def test_draw_without_roofs_predictions_batch8_or_environment(result, tmp_path):
    r = copy.deepcopy(result)
    r["roofs"] = None
    r["steps"]["memory_roof"] = None
    r.pop("environment")
    r["steps"]["results"] = [row for row in r["steps"]["results"] if row["batch"] == 1]
    for row in r["steps"]["results"]:
        row.pop("predicted_s")
        row.pop("measured_over_predicted")
    r["quality"]["results"] = r["quality"]["results"][:4]  # no quantized KV
    r["formulations"]["results"] = [f for f in r["formulations"]["results"] if f["rows"] == 1]
    (path,) = draw_quant(r, tmp_path)
    assert _png(path)
    text = quant_summary(r)
    assert "machine not recorded" in text and "memory roof: none recorded" in text
    assert "measured / predicted" not in text and "no quantized KV format evaluated" in text


def test_draw_an_empty_result(tmp_path):
    (path,) = draw_quant({"kind": "quant"}, tmp_path)
    assert _png(path)
    assert "no quantized weight format evaluated" in quant_summary({"kind": "quant"})


def test_draw_rejects_other_results(tmp_path):
    with pytest.raises(ValueError, match="not a quant result"):
        draw_quant({"kind": "speculative"}, tmp_path)


def test_drawing_imports_no_jax(result, tmp_path):
    src = tmp_path / "quant.json"
    src.write_text(json.dumps(result))
    code = ("import sys; from microbench.plots.quant import main; "
            f"main([{str(src)!r}, {str(tmp_path / 'out')!r}]); "
            "assert 'jax' not in sys.modules, 'jax imported'")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert _png(tmp_path / "out" / "quant.png")


def test_figures_command_redraws_saved_data(result, tmp_path, monkeypatch):
    import microbench.plots.quant as plots

    def fake_draw(res, out_dir):  # the drawing itself is tested above: keep this one fast
        assert res == result
        path = out_dir / "quant.png"
        path.write_bytes(b"\x89PNG\r\n\x1a\n" + b"0" * 10_001)
        return [path]

    monkeypatch.setattr(plots, "draw_quant", fake_draw)
    data, out = tmp_path / "data", tmp_path / "out"
    assert saved_figures("quant", out, data) == []  # nothing saved: nothing drawn
    data.mkdir()
    (data / "quant.json").write_text(json.dumps(result))
    written = saved_figures("quant", out, data)
    assert sorted(p.name for p in written) == ["quant.md", "quant.png"]
    assert "bfloat16 1.80x" in (out / "quant.md").read_text()


def test_kv_cause_is_measured_from_the_steps_and_beside_the_claim(result):
    """The cache format's speedup explained from the data: the long step's time beyond the
    short step of the same weights is its cache's, and each format's cache time is compared."""
    cause = kv_cause(result)
    assert cause.startswith("the float32 cache's 64.0 MB more than at 256 tokens cost 0.0500 ms "
                            "more (1,280 GB/s, where the 256-token step read its bytes at "
                            "4,000 GB/s): the cache is 33% of the 4,096-token step's time")
    assert "int8 KV 3.76x fewer cache bytes, cache time 1.38x shorter" in cause
    assert "float8 KV 4.00x fewer cache bytes, cache time 1.33x longer" in cause
    text = quant_summary(result)
    assert text.index(kv_claim(result)) < text.index("Why, measured: " + cause)
    r = copy.deepcopy(result)  # no short step to subtract: no cause, nothing invented
    r["steps"]["results"] = [x for x in r["steps"]["results"] if x["context"] != 256]
    assert kv_cause(r) is None and "Why, measured" not in quant_summary(r)
