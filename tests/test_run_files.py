"""A run's files are written as one set: an interrupted or failed run leaves the
previous complete set, or nothing of its own, and never a temporary file.

`files.output_set` is tested directly, through `peaks.measure_peaks` (the probe: a failure
while writing left a new peaks.json beside the old csv and png), and in subprocesses killed
with SIGINT and SIGTERM at many moments of writing and publishing sets of files (a fake,
fast writer run through the real command line).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from microbench import files

REPO = Path(__file__).resolve().parents[1]
NAMES = ("peaks.json", "peaks.csv", "roofline.png")


def leftovers(out: Path) -> list[str]:
    """Temporary files or folders anywhere under out."""
    return [str(p) for p in out.rglob("*") if p.name.startswith(files.PARTIAL)
            or p.name.endswith(".tmp") or p.name.startswith(".write-check.")]


def write_set(out: Path, text: str, fail_after: int | None = None) -> None:
    with files.output_set(out) as tmp:
        for i, name in enumerate(NAMES):
            if i == fail_after:
                raise RuntimeError("failed while writing")
            files.write_text_atomic(tmp / name, text)


def test_a_set_replaces_the_previous_one_whole(tmp_path):
    write_set(tmp_path, "old")
    (tmp_path / "other.txt").write_text("not ours")
    write_set(tmp_path, "new")
    assert {p: (tmp_path / p).read_text() for p in NAMES} == dict.fromkeys(NAMES, "new")
    assert (tmp_path / "other.txt").read_text() == "not ours" and not leftovers(tmp_path)


@pytest.mark.parametrize("fail_after", range(len(NAMES) + 1))
def test_a_failed_set_leaves_the_previous_one(tmp_path, fail_after):
    write_set(tmp_path, "old")
    with pytest.raises(RuntimeError):
        with files.output_set(tmp_path) as tmp:
            for name in NAMES[:fail_after]:
                files.write_text_atomic(tmp / name, "new")
            raise RuntimeError("interrupted")
    assert {p: (tmp_path / p).read_text() for p in NAMES} == dict.fromkeys(NAMES, "old")
    assert not leftovers(tmp_path)


def test_a_failed_first_set_leaves_nothing(tmp_path):
    with pytest.raises(RuntimeError):
        write_set(tmp_path / "out", "new", fail_after=2)
    assert not list((tmp_path / "out").iterdir())


def test_the_folder_of_a_killed_run_is_removed_by_the_next(tmp_path):
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True).stdout.strip()
    stale = tmp_path / f"{files.PARTIAL}{dead}-abc"
    stale.mkdir()
    (stale / "peaks.json").write_text("half")
    write_set(tmp_path, "new")
    assert not stale.exists() and (tmp_path / "peaks.json").read_text() == "new"


def test_measure_peaks_writes_its_files_as_one_set(tmp_path, monkeypatch):
    """The probe: a failure on the last figure left a new peaks.json beside the old ones."""
    from matplotlib.figure import Figure

    from microbench import plots
    from microbench.roofs import peaks, synthetic

    monkeypatch.setattr(plots, "roofline_figure", lambda results: Figure())
    monkeypatch.setattr(plots, "hierarchy_figure", lambda results: Figure())
    monkeypatch.setattr(peaks, "measure", lambda *a, **k: synthetic.result(machine="old box"))
    peaks.measure_peaks(True, tmp_path)
    before = {p.name: p.read_bytes() for p in tmp_path.iterdir()}
    assert set(before) == {"peaks.json", "peaks.csv", "roofline.png", "hierarchy.png"}

    def broken(results):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(peaks, "measure", lambda *a, **k: synthetic.result(machine="new box"))
    monkeypatch.setattr(plots, "hierarchy_figure", broken)
    with pytest.raises(OSError):
        peaks.measure_peaks(True, tmp_path)
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir()} == before
    assert b"old box" in before["peaks.json"]


# Killed mid-write: a subprocess writing sets of files through the real command line -------------

WRITER = r"""
import signal, sys, time, types
# Ctrl-C reaches a terminal's foreground process with SIGINT handled; a test run from a
# background job (a shell's `cmd &`) would pass SIGINT down ignored, and this child would
# never see the signal the test sends.
signal.signal(signal.SIGINT, signal.default_int_handler)
from microbench import cli
from microbench.files import output_set, write_text_atomic

def add_args(p):
    p.add_argument("--out")
    p.add_argument("--hold", action="store_true", help="stop inside the first set")

def run(args):
    for i in range(10**6):
        with output_set(args.out) as tmp:
            for name in ("peaks.json", "peaks.csv", "roofline.png"):
                write_text_atomic(tmp / name, f"{i}\n" * 2000)
                if args.hold:
                    print("holding", flush=True)
                    time.sleep(60)
        print(f"published {i}", flush=True)

mod = types.ModuleType("writer_cmd")
mod.add_args, mod.run = add_args, run
sys.modules["writer_cmd"] = mod
cli.COMMANDS[:] = []
cli.register("write", "write sets of files until killed", "writer_cmd")
cli.main(sys.argv[1:])
"""


def start_writer(out: Path, *extra: str) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.Popen([sys.executable, "-c", WRITER, "write", "--out", str(out), *extra],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)


def stop(proc: subprocess.Popen, sig: int) -> tuple[int, str]:
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=30)
    return proc.returncode, err


def assert_interrupted_in_one_line(code: int, err: str, sig: int) -> None:
    name = signal.Signals(sig).name
    assert code == 128 + sig, err
    assert err.count("\n") == 1 and err.startswith(
        f"python -m microbench write: interrupted ({name})"), err


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_killed_inside_the_first_set_leaves_nothing(tmp_path, sig):
    proc = start_writer(tmp_path, "--hold")
    assert proc.stdout.readline().strip() == "holding"
    code, err = stop(proc, sig)
    assert_interrupted_in_one_line(code, err, sig)
    assert not list(tmp_path.iterdir())


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_killed_at_any_moment_leaves_one_complete_set(tmp_path, sig):
    """Killed at five moments while sets are written and published back to back: each time
    the folder holds one complete set (every file from the same set) and no temporary file."""
    for k in range(5):
        proc = start_writer(tmp_path)
        assert proc.stdout.readline().startswith("published")  # a first set is in place
        time.sleep(0.003 * k)
        code, err = stop(proc, sig)
        assert_interrupted_in_one_line(code, err, sig)
        texts = {(tmp_path / name).read_text() for name in NAMES}
        assert len(texts) == 1 and len(texts.pop()) > 0
        assert sorted(p.name for p in tmp_path.iterdir()) == sorted(NAMES)
        assert not leftovers(tmp_path)
