"""Collective bandwidth (`python -m microbench collectives`): busbw factors as nccl-tests defines
them, numpy's expected results against the collectives' definitions, wrong bytes refused, the
measurement's fields, and the command end to end on emulated devices in a fresh process."""

import json
import subprocess
import sys
from pathlib import Path

import jax
import numpy as np
import pytest

from microbench import cli
from microbench.commands.figures import saved_figures
from microbench.plots.collectives import collectives_figure, collectives_summary
from microbench.studies import collectives as coll

REPO = Path(__file__).resolve().parents[1]


# ------------------------------------------------------------------ conventions and oracle

@pytest.mark.parametrize("n", [2, 3, 4, 8])
def test_busbw_factors_are_nccl_tests(n):
    # NVIDIA/nccl-tests doc/PERFORMANCE.md, "Summary"
    assert coll.busbw_factor("all_reduce", n) == pytest.approx(2 * (n - 1) / n)
    for name in ("all_gather", "reduce_scatter", "all_to_all"):
        assert coll.busbw_factor(name, n) == pytest.approx((n - 1) / n)
    with pytest.raises(KeyError, match="all_reduce"):
        coll.busbw_factor("broadcast", n)


def _by_definition(name, per):
    """The collective written out device by device: per[d] is device d's input."""
    n = len(per)
    if name == "all_reduce":
        outs = [sum(per) for _ in range(n)]
    elif name == "all_gather":
        outs = [np.concatenate(per) for _ in range(n)]
    elif name == "reduce_scatter":
        outs = [np.split(sum(per), n)[d] for d in range(n)]
    else:  # all_to_all: device d receives chunk d of every device j, in order of j
        outs = [np.concatenate([np.split(per[j], n)[d] for j in range(n)]) for d in range(n)]
    return np.concatenate(outs)


@pytest.mark.parametrize("name", list(coll.COLLECTIVES))
def test_expected_is_the_definition(name):
    n, count = 3, 6
    x = np.arange(n * coll.input_length(name, count, n), dtype=np.float32)
    np.testing.assert_array_equal(coll.expected(name, x, n),
                                  _by_definition(name, np.split(x, n)))


def test_check_refuses_wrong_bytes():
    n = 4
    x = np.random.default_rng(0).standard_normal(n * 8, dtype=np.float32)
    right = coll.expected("all_to_all", x, n)
    assert coll.check("all_to_all", x, right, n) == 0.0
    with pytest.raises(RuntimeError, match="all_to_all.*wrong result"):
        coll.check("all_to_all", x, np.tile(x[:8], n), n)  # the input moved nowhere
    total = coll.expected("all_reduce", x, n)
    with pytest.raises(RuntimeError, match="all_reduce.*wrong result"):
        coll.check("all_reduce", x, total * (1 + 1e-3), n)
    with pytest.raises(RuntimeError, match="shape"):
        coll.check("reduce_scatter", x, total, n)


def test_sizes_round_to_whole_shards():
    assert coll.elements(1024, 8) == 256
    assert coll.elements(1024, 3) == 255  # a multiple of n, so every shard is whole
    with pytest.raises(ValueError, match="below one float32"):
        coll.elements(8, 4)


# ------------------------------------------------------------------ devices and measurement

def test_use_devices_refuses_bad_counts():
    for bad in (0, 1, -2):
        with pytest.raises(ValueError, match="--devices"):
            coll.use_devices(bad)
    jax.devices()  # the backend has started: more devices than it has cannot be made now
    if jax.default_backend() != "cpu":
        pytest.skip("emulated devices are a CPU feature")
    with pytest.raises(ValueError, match="--devices .*fresh process"):
        coll.use_devices(jax.device_count() + 1)


def _assert_sane(result, n):
    assert result["devices"]["count"] == n
    for r in result["results"]:
        factor = coll.busbw_factor(r["collective"], n)
        assert r["checked"] and r["busbw_factor"] == pytest.approx(factor)
        assert r["bytes"] == r["elements"] * 4 and r["elements"] % n == 0
        gathers = r["collective"] == "all_gather"
        assert r["input_elements"] == (r["elements"] // n if gathers else r["elements"])
        assert r["seconds"] > 0 and all(t > 0 for t in r["timing"]["samples"])
        assert r["algbw"]["median"] == pytest.approx(r["bytes"] / r["seconds"])
        for k in ("median", "p10", "p90"):
            assert r["busbw"][k] == pytest.approx(r["algbw"][k] * factor)
        assert r["busbw"]["p10"] <= r["busbw"]["median"] <= r["busbw"]["p90"]


def test_quick_measurement_in_this_process():
    if jax.device_count() < 2:
        pytest.skip("one device here; the command test below measures on 4 emulated ones")
    devices = jax.devices()[:4]
    result = coll.measure(coll.QUICK_SIZES[:2], devices, jax.default_backend() == "cpu",
                          repeats=2, budget_s=0.01)
    assert len(result["results"]) == 2 * len(coll.COLLECTIVES)
    _assert_sane(result, len(devices))


@pytest.fixture(scope="module")
def quick_run(tmp_path_factory):
    """`collectives --quick --devices 4` in a fresh process (so the emulated devices apply)."""
    out = tmp_path_factory.mktemp("collectives")
    proc = subprocess.run([sys.executable, "-m", "microbench", "collectives", "--quick",
                           "--devices", "4", "--repeats", "2", "--out", str(out)],
                          capture_output=True, text=True, cwd=REPO, timeout=120)
    assert proc.returncode == 0, proc.stderr
    return out, proc.stdout


def test_command_measures_on_emulated_devices(quick_run):
    out, stdout = quick_run
    result = json.loads((out / "collectives.json").read_text())
    assert result["emulated"] is True and result["devices"]["emulated"] is True
    assert result["devices"]["backend"] == "cpu" and result["environment"]["backend"] == "cpu"
    assert len(result["results"]) == len(coll.QUICK_SIZES) * len(coll.COLLECTIVES)
    assert {r["bytes"] for r in result["results"]} == set(coll.QUICK_SIZES)
    _assert_sane(result, 4)
    assert result["convention"]["busbw"]["all_reduce"] == "algbw x 2(n-1)/n"
    assert "nccl-tests" in result["convention"]["source"]
    assert {link["name"] for link in result["links"]} >= {"NVLink 4", "PCIe 5.0 x16"}
    assert (out / "collectives.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    md = (out / "collectives.md").read_text()
    assert "4 emulated CPU devices" in md and "not an interconnect" in md
    assert "| all_to_all | 4 MiB |" in md and "peak busbw" in stdout


def test_figure_says_what_was_measured(quick_run):
    result = json.loads((quick_run[0] / "collectives.json").read_text())
    fig = collectives_figure(result)
    assert "4 emulated CPU devices (threads of one process)" in fig.get_suptitle()
    ax = fig.axes[0]
    assert ax.get_xscale() == "log" and ax.get_yscale() == "log"
    assert "GB/s" in ax.get_ylabel() and "bytes per device" in ax.get_xlabel()
    dashed = [line for line in ax.get_lines() if line.get_linestyle() == "--"]
    assert len(dashed) == len(result["links"])
    texts = [t.get_text() for t in ax.texts]
    assert any("vendor spec: NVLink 4 450 GB/s" in t for t in texts)
    # the same numbers measured on real devices are not called emulated
    real = {**result, "emulated": False,
            "devices": {"count": 8, "backend": "gpu", "device_kind": "NVIDIA H200",
                        "emulated": False}}
    title = collectives_figure(real).get_suptitle()
    assert "8 x NVIDIA H200" in title and "emulated" not in title
    assert "Emulated" not in collectives_summary(real)


def test_figures_command_redraws_from_saved_data(quick_run, tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    (data / "collectives.json").write_text((quick_run[0] / "collectives.json").read_text())
    written = saved_figures("collectives", tmp_path / "figs", data)
    assert sorted(p.name for p in written) == ["collectives.md", "collectives.png"]


@pytest.mark.parametrize("argv", [["--devices", "0"], ["--devices", "-3"],
                                  ["--repeats", "0"]])
def test_bad_input_exits_2_naming_the_option(argv, tmp_path, capsys):
    with pytest.raises(SystemExit) as exc:
        cli.main(["collectives", "--quick", *argv, "--out", str(tmp_path / "o")])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert argv[0] in err and err.count("\n") == 1
    assert not (tmp_path / "o").exists()
