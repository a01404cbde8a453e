"""Probes of the command line: every bad input is one line naming the path or the
option, given before anything is measured, and never a traceback.

Measuring is replaced by a function that fails the test, so "refused before measuring" is
what each test shows, in well under a second.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from microbench import cli, files, hardware, machines

REPO = Path(__file__).resolve().parents[1]
SAVED_PEAKS = machines.data_folder("peaks") / "peaks.json"



def one_line_error(argv, capsys) -> str:
    """Run the CLI; assert it exits 2 with one line on stderr, no traceback; return it."""
    with pytest.raises(SystemExit) as exc:
        cli.main(argv)
    err = capsys.readouterr().err
    assert exc.value.code == 2, err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    return err


@pytest.fixture
def no_measuring(monkeypatch):
    """Any measurement fails the test: errors must come before it."""
    from microbench.phases import breakdown, suite
    from microbench.roofs import peaks

    def measured(*args, **kwargs):
        raise AssertionError("measured before the bad input was refused")

    monkeypatch.setattr(peaks, "measure", measured)
    monkeypatch.setattr(suite, "measure_phases", measured)
    monkeypatch.setattr(breakdown, "measure_breakdown", measured)


@pytest.fixture
def a_file(tmp_path) -> Path:
    path = tmp_path / "afile"
    path.write_text("not a folder")
    return path


# Outputs are checked before any measuring ------------------------------------------------------

@pytest.mark.parametrize("argv", [
    ["peaks", "--quick", "--no-progress"],
    ["run", "--quick", "--no-progress"],
    ["phases", "--quick", "--no-progress", "--peaks", "PEAKS"],
    ["breakdown", "--model", "tiny"],
])
@pytest.mark.parametrize("below", [False, True])  # --out is a file / inside a file
def test_bad_out_is_refused_before_measuring(argv, below, a_file, no_measuring, peaks_here,
                                             capsys):
    out = a_file / "sub" if below else a_file
    argv = [str(peaks_here) if a == "PEAKS" else a for a in argv]
    err = one_line_error([*argv, "--out", str(out)], capsys)
    assert repr(str(out)) in err and ("not a folder" in err or "not writable" in err)
    assert a_file.read_text() == "not a folder"


def test_plot_of_a_folder_names_it(tmp_path, capsys):
    err = one_line_error(["plot", str(tmp_path), "--out", str(tmp_path / "o")], capsys)
    assert f"{tmp_path}: cannot read" in err


def test_plot_into_a_file_names_it(a_file, capsys):
    err = one_line_error(["plot", str(SAVED_PEAKS), "--out", str(a_file)], capsys)
    assert repr(str(a_file)) in err and "not a folder" in err


def test_truncated_json_names_the_file(tmp_path, capsys):
    cut = tmp_path / "cut.json"
    cut.write_text(SAVED_PEAKS.read_text()[:100])
    err = one_line_error(["plot", str(cut), "--out", str(tmp_path / "o")], capsys)
    assert f"{cut}: not valid JSON" in err


def test_figures_without_saved_results_names_the_folder(tmp_path, capsys):
    err = one_line_error(["figures", "--data", str(tmp_path), "--out", str(tmp_path)], capsys)
    assert f"--data {tmp_path}: no saved results" in err


@pytest.mark.parametrize("command", ["phases", "simulate", "speculative", "quant"])
def test_another_machines_peaks_are_refused(command, tmp_path, peaks_here, no_measuring,
                                            capsys):
    other = json.loads(peaks_here.read_text())
    other["environment"]["cpu_count"] = 1000  # the same CPU with other cores: another machine
    path = tmp_path / "other.json"
    path.write_text(json.dumps(other))
    err = one_line_error([command, "--quick", "--peaks", str(path), "--out",
                          str(tmp_path / "o")], capsys)
    assert f"--peaks {path}: measured on" in err and "1000cpu" in err


# Ridiculous sizes are refused with a memory estimate ----------------------------------------

def test_phases_refuses_a_batch_too_big_for_memory(tmp_path, no_measuring, peaks_here, capsys):
    out = tmp_path / "out"
    err = one_line_error(["phases", "--quick", "--batches", "1e12", "--peaks", str(peaks_here),
                          "--out", str(out)], capsys)
    assert "batch 1000000000000" in err and "needs about" in err and "available" in err
    assert not out.exists() or not list(out.iterdir())


def test_breakdown_refuses_a_batch_too_big_for_memory(tmp_path, no_measuring, capsys):
    err = one_line_error(["breakdown", "--model", "tiny", "--batch", str(10**12),
                          "--out", str(tmp_path)], capsys)
    assert "--batch 1000000000000" in err and "needs about" in err


def test_breakdown_refuses_an_unknown_backend(tmp_path, no_measuring, capsys):
    err = one_line_error(["breakdown", "--model", "tiny", "--backend", "gpu",
                          "--out", str(tmp_path)], capsys)
    assert "--backend 'gpu'" in err and "'native'" in err and "'output-major'" in err


# Device files: size, depth, fields, shadowing, names on the terminal ------------------------

@pytest.fixture
def device(monkeypatch) -> dict:
    monkeypatch.setattr(hardware, "_EXTRA", {})  # devices added by a test stay in the test
    return {"name": "My GPU", "vendor": "me", "kind": "gpu", "dense": True,
            "peak_flops": {"bfloat16": 1e15}, "memory_bandwidth": {"HBM": 2e12},
            "main_memory": "HBM", "memory_bytes": 8e10, "sources": ["my datasheet"]}


def device_file(tmp_path, obj) -> str:
    path = tmp_path / "device.json"
    path.write_text(json.dumps(obj))
    return str(path)


def test_device_file_from_dev_zero_is_refused_by_size(device, capsys):
    err = one_line_error(["hardware", "--device-file", "/dev/zero"], capsys)
    assert "/dev/zero: larger than the 1 MiB allowed" in err


def test_deeply_nested_device_file_is_refused_before_parsing(tmp_path, device, capsys):
    path = tmp_path / "deep.json"
    path.write_text("[" * 100_000 + "]" * 100_000)  # was a RecursionError
    err = one_line_error(["hardware", "--device-file", str(path)], capsys)
    assert f"{path}: JSON nested 100000 levels deep" in err


def test_derivation_as_a_list_names_the_field(tmp_path, device, capsys):
    path = device_file(tmp_path, {**device, "derivation": [1, 2]})  # was a TypeError
    err = one_line_error(["hardware", "--device-file", path], capsys)
    assert "'derivation': got [1, 2]" in err and path in err


def test_a_device_may_not_shadow_a_builtin_silently(tmp_path, device, capsys):
    path = device_file(tmp_path, {**device, "name": "H100 SXM", "peak_flops": {"float32": 1.0}})
    err = one_line_error(["hardware", "--device-file", path], capsys)
    assert "'H100 SXM' is already taken by a built-in device" in err and "--replace" in err
    assert hardware.get("H100 SXM").peak_flops["float32"] > 1.0
    assert cli.main(["hardware", "--device-file", path, "--replace", "H100 SXM"]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"note: {path} replaces the device named 'H100 SXM'")
    assert hardware.get("H100 SXM").peak_flops == {"float32": 1.0}


def test_control_characters_in_a_name_are_escaped(tmp_path, device, capsys):
    path = device_file(tmp_path, {**device, "name": "evil\x1b[2J\rname",
                                  "memory_bandwidth": {"HBM\x07": 2e12}, "main_memory": "HBM\x07"})
    assert cli.main(["hardware", "--device-file", path]) == 0
    out = capsys.readouterr().out
    assert "\x1b" not in out and "\x07" not in out and "\r" not in out
    assert "evil\\x1b[2J\\rname" in out and "HBM\\x07" in out


def test_error_messages_are_escaped_too(tmp_path, device, capsys):
    path = tmp_path / "bad\x1b[31m.json"
    path.write_text("{")
    err = one_line_error(["hardware", "--device-file", str(path)], capsys)
    assert "\x1b" not in err and "bad\\x1b[31m.json: not valid JSON" in err


# Interrupts ------------------------------------------------------------------------------------

def test_ctrl_c_is_one_line_and_exit_130(monkeypatch, capsys):
    import sys
    import types

    mod = types.ModuleType("interrupted_cmd")
    mod.add_args = lambda p: None

    def run(args):
        raise KeyboardInterrupt

    mod.run = run
    monkeypatch.setitem(sys.modules, "interrupted_cmd", mod)
    monkeypatch.setattr(cli, "COMMANDS", [])
    cli.register("slow", "a command interrupted by Ctrl-C", "interrupted_cmd")
    with pytest.raises(SystemExit) as exc:
        cli.main(["slow"])
    err = capsys.readouterr().err
    assert exc.value.code == 130 and err.count("\n") == 1
    assert err.startswith("python -m microbench slow: interrupted (SIGINT)")


def test_read_json_limits_are_checked_before_parsing(tmp_path):
    path = tmp_path / "x.json"
    path.write_text(json.dumps({"a": "[[[[[[[[", "b": [[1]]}))
    assert files.json_depth(path.read_text()) == 3  # brackets inside strings do not count
    assert files.read_json(path, max_depth=3)["b"] == [[1]]
    with pytest.raises(ValueError, match="nested 3 levels deep; at most 2"):
        files.read_json(path, max_depth=2)
    with pytest.raises(ValueError, match="larger than"):
        files.read_json(path, max_bytes=10)


def test_breakdown_native_without_the_kernels_says_why(tmp_path, no_measuring, capsys,
                                                       monkeypatch):
    from refmodel import kernels

    monkeypatch.setattr(kernels, "load", lambda: False)  # what kernels.available() asks
    monkeypatch.setattr(kernels, "why_not", lambda: "no C++ compiler on PATH")
    err = one_line_error(["breakdown", "--model", "tiny", "--backend", "native",
                          "--out", str(tmp_path)], capsys)
    assert "--backend native" in err and "no C++ compiler on PATH" in err


@pytest.mark.parametrize("command", ["run", "phases"])
def test_the_main_job_refuses_a_backend_it_cannot_run(command, tmp_path, no_measuring, capsys,
                                                     monkeypatch):
    from refmodel import kernels

    err = one_line_error([command, "--backend", "gpu", "--out", str(tmp_path)], capsys)
    assert "--backend 'gpu'" in err and "'auto'" in err and "'native'" in err
    monkeypatch.setattr(kernels, "load", lambda: False)  # what kernels.available() asks
    monkeypatch.setattr(kernels, "why_not", lambda: "no C++ compiler on PATH")
    err = one_line_error([command, "--backend", "native", "--out", str(tmp_path)], capsys)
    assert "--backend 'native'" in err and "no C++ compiler on PATH" in err
