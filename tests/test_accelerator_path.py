"""The accelerator path of the main job, run on a CPU with the platform forced: which path a
--platform picks, the forced quick run's result set (valid, its skips named, labelled as the
CPU's), the fp8 check on HLO text, the spec lookup by device_kind, the Pallas copy, and the
accelerator script's pack / unpack round trip. Nothing here assumes an x86 CPU."""

from __future__ import annotations

import os
import subprocess
import tarfile
from pathlib import Path

import pytest

from microbench import hardware, machines
from microbench.commands import pack, unpack
from microbench.files import read_json
from microbench.plots.summary import skipped_lines
from microbench.roofs import hlo
from microbench.roofs.platform import choose
from microbench.schema import validate_result

REPO = Path(__file__).resolve().parents[1]


# --------------------------------------------------------------------------- platform choice

@pytest.mark.parametrize("requested, backend, target, forced", [
    ("auto", "cpu", "cpu", False), ("auto", "gpu", "gpu", False), ("cpu", "cpu", "cpu", False),
    ("gpu", "cpu", "gpu", True), ("tpu", "cpu", "tpu", True), ("gpu", "gpu", "gpu", False),
    ("tpu", "tpu", "tpu", False)])
def test_platform_choice(requested, backend, target, forced):
    p = choose(requested, backend)
    assert (p.target, p.forced, p.accelerator) == (target, forced, target != "cpu")
    assert p.interpret == (backend == "cpu")


@pytest.mark.parametrize("requested, backend, word", [
    ("npu", "cpu", "choose one of"), ("tpu", "gpu", "only an accelerator"),
    ("cpu", "gpu", "only an accelerator")])
def test_platform_refusals_name_the_option(requested, backend, word):
    with pytest.raises(ValueError, match=word) as e:
        choose(requested, backend)
    assert f"--platform {requested!r}" in str(e.value)


# --------------------------------------------------------------------------- fp8 from HLO

CPU_FP8 = """HloModule jit_gemm
%fused_computation (param_0: f32[64,64], param_1: f32[64,64]) -> f32[64,64] {
  %param_0 = f32[64,64]{1,0} parameter(0)
  %param_1 = f32[64,64]{1,0} parameter(1)
  ROOT %dot_general.0 = f32[64,64]{1,0} dot(%param_0, %param_1), lhs_contracting_dims={1}
}
%wrapped_convert_computation (param_0.1: f8e4m3fn[64,64]) -> f32[64,64] {
  %param_0.1 = f8e4m3fn[64,64]{1,0} parameter(0)
  ROOT %convert.2 = f32[64,64]{1,0} convert(%param_0.1)
}
ENTRY %main.1 (a.1: f8e4m3fn[64,64], b.1: f8e4m3fn[64,64]) -> f32[64,64] {
  %a.1 = f8e4m3fn[64,64]{1,0} parameter(0)
  %b.1 = f8e4m3fn[64,64]{1,0} parameter(1)
  %c.1 = f32[64,64]{1,0} fusion(%a.1), kind=kLoop, calls=%wrapped_convert_computation
  %c.2 = f32[64,64]{1,0} fusion(%b.1), kind=kLoop, calls=%wrapped_convert_computation
  ROOT %f = f32[64,64]{1,0} fusion(%c.1, %c.2), kind=kCustom, calls=%fused_computation
}"""
GPU_FP8 = """HloModule jit_gemm
ENTRY %main (a: f8e4m3fn[64,64], b: f8e4m3fn[64,64]) -> f32[64,64] {
  %a = f8e4m3fn[64,64]{1,0} parameter(0)
  %b = f8e4m3fn[64,64]{1,0} parameter(1)
  %t = f8e4m3fn[64,64]{1,0} transpose(%b), dimensions={1,0}
  %one = f32[] constant(1)
  %g = (f32[64,64]{1,0}, s8[33554432]{0}) custom-call(%a, %t, %one, %one), """ \
    """custom_call_target="__cublas$lt$matmul$f8"
  ROOT %r = f32[64,64]{1,0} get-tuple-element(%g), index=0
}"""
INLINE_FP8 = ("ENTRY %m (a: f8e5m2[8,8], b: f8e5m2[8,8]) -> f32[8,8] {\n  ROOT %d = f32[8,8]{1,0} "
              "dot(f8e5m2[8,8]{1,0} %a, f8e5m2[8,8]{1,0} %b), lhs_contracting_dims={1}\n}")


def test_fp8_read_from_the_compiled_products():
    ok, why = hlo.runs_fp8(CPU_FP8)  # converted to f32 first: not fp8 arithmetic
    assert not ok and "dot on f32 x f32" in why
    ok, why = hlo.runs_fp8(GPU_FP8)
    assert ok and "__cublas$lt$matmul$f8 on f8e4m3fn x f8e4m3fn" in why
    assert hlo.library(GPU_FP8) == "__cublas$lt$matmul$f8" and hlo.library(CPU_FP8) is None
    assert hlo.runs_fp8(INLINE_FP8)[0]  # operand types printed inline (older HLO text)
    assert not hlo.runs_fp8("ENTRY %m () -> f32[] {\n  ROOT %c = f32[] constant(1)\n}")[0]


# --------------------------------------------------------------------------- spec lookup

@pytest.mark.parametrize("kind, name", [("NVIDIA H100 80GB HBM3", "H100 SXM"),
                                        ("NVIDIA H200", "H200 SXM"), ("TPU v5 lite", "TPU v5e")])
def test_spec_by_device_kind(kind, name):
    from microbench.roofs.device import spec_peak

    env = {"backend": "gpu", "device_kind": kind}
    spec = hardware.device_for_environment(env)
    assert spec.name == name
    peak, source = spec_peak(spec, env, "bfloat16")
    assert peak == spec.peak_flops["bfloat16"] and name in source


def test_unknown_device_has_no_spec_and_says_so():
    from microbench.roofs.device import fp8_unsupported, spec_peak

    env = {"backend": "gpu", "device_kind": "Imaginary X1", "compute_capability": "8.0"}
    assert hardware.device_for_environment(env) is None
    assert spec_peak(None, env, "int8") == (None, "unknown device kind 'Imaginary X1': no spec "
                                                  "in the database")
    h100 = hardware.get("H100 SXM")
    assert spec_peak(h100, env, "int8")[0] is None  # the database lists no int8 peak for it
    assert "8.0 < 8.9" in fp8_unsupported(env, None, choose("gpu", "gpu"))


def test_pallas_copy_copies():
    import jax.numpy as jnp
    import numpy as np

    from microbench.roofs.pallas_copy import pallas_copy, shape_for

    block = (8, 128)
    shape = shape_for(3 * 8 * 128 * 4 + 100, block)
    assert shape == (24, 128)
    x = jnp.asarray(np.random.default_rng(0).standard_normal(shape, dtype=np.float32))
    np.testing.assert_array_equal(pallas_copy(x, block, True), x)


# --------------------------------------------------------------------------- the forced run

@pytest.fixture(scope="module")
def forced_run(tmp_path_factory):
    """The main job with the GPU path forced on this CPU (quick), once for the module."""
    from microbench.phases import suite

    out = tmp_path_factory.mktemp("forced") / "microbench"
    result = suite.run(True, out, progress=False, platform="gpu")
    return out, result


def test_forced_run_writes_a_valid_labelled_set(forced_run):
    out, result = forced_run
    peaks, phases = (validate_result(read_json(out / f)) for f in ("peaks.json", "phases.json"))
    env = peaks["environment"]
    assert env["backend"] == "cpu" and env["forced_platform"] == "gpu"
    assert peaks["platform"]["forced"] and peaks["platform"]["interpret"]
    slug = machines.result_machine(peaks)
    assert slug.endswith("-forced-gpu-path") and "nvidia" not in slug
    assert machines.result_machine(phases) == slug
    assert "no gpu measured" in machines.describe(env)
    assert phases["model"]["dtype"] == "bfloat16"
    assert {p["dtype"] for p in phases["points"]} == {"bfloat16"}
    decode = [p for p in phases["points"] if p["phase"] == "decode"]
    assert decode and all(p["predicted"]["memory_level"] == "DRAM read" for p in decode)
    programs = {e["program"] for e in peaks["bandwidth"]}
    assert "Pallas copy kernel (interpret mode)" in programs and "XLA copy" in programs
    assert {e["dtype"] for e in peaks["gemm"]} >= {"bfloat16", "int8"}
    names = {p.name for p in out.iterdir()}
    assert {"roofline.png", "phases_roofline.png", "summary.md"} <= names


def test_forced_run_names_its_skips(forced_run):
    out, _ = forced_run
    peaks = read_json(out / "peaks.json")
    skipped = {s["what"]: s["why"] for s in peaks["skipped"]}
    for what in ("C read peer", "numpy GEMM peer", "cache-level working-set sweep",
                 "bandwidth peer program", "the gpu itself"):
        assert skipped[what]
    # XLA:CPU converts float8 operands before its dot: the check refuses the fp8 roof
    assert "does not multiply in float8" in skipped["GEMM float8_e4m3fn"]
    assert all(e["dtype"] != "float8_e4m3fn" for e in peaks["gemm"])
    summary = (out / "summary.md").read_text()
    assert "skipped: numpy GEMM peer" in summary and "forced on this CPU" in summary
    assert skipped_lines(peaks)[-1] in summary


def test_pack_unpack_round_trip(forced_run, tmp_path):
    out, _ = forced_run
    run_dir = out.parent
    (run_dir / "versions.txt").write_text("jax test\n")
    archive = pack.pack(run_dir, tmp_path / "packed")
    slug = machines.result_machine(read_json(out / "peaks.json"))
    assert archive.name == f"accelerator-{slug}.tar.gz"
    with tarfile.open(archive) as tar:
        assert set(tar.getnames()) == {"microbench/peaks.json", "microbench/phases.json",
                                       "versions.txt"}
    dest, files = unpack.unpack(archive, tmp_path / "data", tmp_path / "figures")
    assert dest == tmp_path / "data" / slug
    assert read_json(dest / "peaks.json") == read_json(out / "peaks.json")
    drawn = tmp_path / "figures" / slug
    assert (drawn / "roofline.png").stat().st_size > 0 and drawn / "summary.md" in files
    assert "skipped:" in (drawn / "summary.md").read_text()


def test_unpack_refuses_what_it_cannot_use(tmp_path):
    bad = tmp_path / "bad.tar.gz"
    with tarfile.open(bad, "w:gz") as tar:
        (tmp_path / "x.txt").write_text("x")
        tar.add(tmp_path / "x.txt", arcname="../versions.txt")
    with pytest.raises(ValueError, match="no microbench/peaks.json"):
        unpack.read_members(bad)
    (tmp_path / "not.tar.gz").write_text("plain text")
    with pytest.raises(ValueError, match="not a readable"):
        unpack.read_members(tmp_path / "not.tar.gz")


# --------------------------------------------------------------------------- the script

SCRIPT = REPO / "scripts" / "accelerator_run.sh"


def test_script_parses_and_its_dry_run_packs_the_versions(tmp_path):
    import sys

    subprocess.run(["bash", "-n", str(SCRIPT)], check=True)
    env = {**os.environ, "DRY_RUN": "1", "PLATFORM": "gpu", "OUT": str(tmp_path),
           "PYTHON": sys.executable}
    done = subprocess.run(["bash", str(SCRIPT)], env=env, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    assert "--platform gpu" in done.stdout and "jax " in done.stdout
    (archive,) = tmp_path.glob("accelerator-*.tar.gz")
    with tarfile.open(archive) as tar:
        assert "versions.txt" in tar.getnames()
        assert b"jaxlib" in tar.extractfile("versions.txt").read()
