"""The roofline figure is drawn from a saved results file: log-log axes, the expected labelled
lines, suspect values drawn as errors; the CLI redraws it and lists the spec database. Every
committed figure redraws from figures/data with JAX and Flax unimportable, and the plots
package has no import cycle."""

import ast
import json
import os
import shutil
import struct
import subprocess
import sys
import types
from pathlib import Path

import pytest

from microbench import cli, harness, plots
from microbench.roofs import synthetic


def _png_size(path):
    head = path.read_bytes()[:24]
    assert head[:8] == b"\x89PNG\r\n\x1a\n"
    return struct.unpack(">II", head[16:24])


@pytest.fixture
def saved(tmp_path):
    return harness.write_json_atomic(tmp_path / "peaks.json", synthetic.result())


def test_plot_files_writes_a_sensible_png(saved, tmp_path):
    out = plots.plot_files([saved], tmp_path / "figs")
    width, height = _png_size(out)
    assert width >= 1200 and height >= 900
    assert out.stat().st_size > 30_000


def test_roofline_content(saved):
    fig = plots.roofline_figure(plots.load_results([saved]))
    ax = fig.axes[0]
    assert ax.get_xscale() == "log" and ax.get_yscale() == "log"
    assert "FLOP / byte" in ax.get_xlabel() and "FLOP / s" in ax.get_ylabel()
    assert "synthetic machine" in fig.get_suptitle()
    labels = ax.get_legend_handles_labels()[1]
    for expected in ("measured GEMM float32", "measured GEMM bfloat16", "measured vector FMA",
                     "measured DRAM bandwidth", "measured L1 bandwidth",
                     "vendor float32 peak", "AI sweep"):
        assert any(label.startswith(expected) for label in labels), expected
    assert not any("SUSPECT" in label for label in labels)
    dashed = [line for line in ax.get_lines() if line.get_linestyle() == "--"]
    assert dashed == [] or all("vendor" in line.get_label() for line in dashed)
    assert min(t.get_fontsize() for t in (ax.xaxis.label, ax.yaxis.label)) >= 12


def test_suspect_value_is_drawn_as_an_error_not_a_roof():
    peak = synthetic.spec().peak_flops["float32"]
    fig = plots.roofline_figure([synthetic.result(extra_gemm=2 * peak)])
    labels = fig.axes[0].get_legend_handles_labels()[1]
    assert any(label.startswith("SUSPECT") for label in labels)
    gemm = next(label for label in labels if label.startswith("measured GEMM float32"))
    assert plots.fmt_si(2 * peak, "FLOP/s") not in gemm


def test_several_machines_on_one_chart(tmp_path):
    paths = [harness.write_json_atomic(tmp_path / f"{m}.json", synthetic.result(machine=m))
             for m in ("box A", "box B")]
    labels = plots.roofline_figure(plots.load_results(paths)).axes[0].get_legend_handles_labels()[1]
    assert any(lbl.startswith("[box A]") for lbl in labels)
    assert any(lbl.startswith("[box B]") for lbl in labels)


def test_invalid_results_file_is_refused(tmp_path):
    bad = synthetic.result()
    del bad["roofs"]
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(bad))
    with pytest.raises(ValueError, match="result.roofs"):
        plots.load_results([path])


def test_fmt_si():
    assert plots.fmt_si(2.01e11, "FLOP/s") == "201 GFLOP/s"
    assert plots.fmt_si(5.3e12, "B/s") == "5.3 TB/s"


def test_cli_plot_redraws_from_saved_results(saved, tmp_path, capsys):
    assert cli.main(["plot", str(saved), "--out", str(tmp_path / "o")]) == 0
    assert (tmp_path / "o" / "roofline.png").exists()


def test_cli_hardware_lists_devices_with_ridges(capsys):
    assert cli.main(["hardware"]) == 0
    out = capsys.readouterr().out
    assert "H100 SXM" in out and "ridge 295 FLOP/B" in out and "Cerebras WSE-3" in out


def test_cli_register_adds_a_subcommand(monkeypatch):
    calls = []
    mod = types.ModuleType("fake_cmd")
    mod.add_args = lambda p: p.add_argument("--n", type=int, default=1)
    mod.run = lambda args: calls.append(args.n) or 0
    monkeypatch.setitem(sys.modules, "fake_cmd", mod)
    monkeypatch.setattr(cli, "COMMANDS", list(cli.COMMANDS))
    cli.register("phases", "time the phases", "fake_cmd")
    assert cli.main(["phases", "--n", "3"]) == 0 and calls == [3]


# ------------------------------------------------------------------ no JAX, no cycle

REPO = Path(__file__).resolve().parents[1]
PLOTS = REPO / "microbench" / "plots"

FIGURES_WITHOUT_JAX = r"""
import runpy
import sys

BLOCKED = ("jax", "jaxlib", "flax")
for name in BLOCKED:  # None in sys.modules: `import jax` raises ImportError
    sys.modules[name] = None
sys.argv = ["python -m microbench", "figures", "--data", sys.argv[1], "--out", sys.argv[2]]
try:
    runpy.run_module("microbench", run_name="__main__")
finally:  # what got imported anyway (a submodule reached some other way)
    print(sorted(m for m, v in sys.modules.items() if m.partition(".")[0] in BLOCKED and v))
"""


def test_figures_command_redraws_the_committed_data_without_jax(tmp_path):
    """`python -m microbench figures` itself, in a process where JAX and Flax cannot be
    imported, redraws every file of figures/<machine>/ from a copy of figures/data, one folder
    per machine."""
    data = shutil.copytree(REPO / "figures" / "data", tmp_path / "data")
    out = tmp_path / "figures"
    proc = subprocess.run([sys.executable, "-c", FIGURES_WITHOUT_JAX, str(data), str(out)],
                          capture_output=True, text=True, cwd=REPO,
                          env={**os.environ, "MPLBACKEND": "Agg"})
    assert proc.returncode == 0, proc.stderr
    *lines, loaded = proc.stdout.strip().splitlines()
    assert loaded == "[]"
    machines = sorted(p.name for p in data.iterdir())
    assert machines and sorted(p.name for p in out.iterdir()) == machines
    assert sorted(p.name for p in (REPO / "figures").iterdir() if p.is_dir()) == \
        sorted(["data", *machines])  # no figures of a machine without data, none loose
    assert not [p for p in (REPO / "figures").iterdir() if p.is_file()]
    wrote = []
    for machine in machines:
        committed = sorted(p.name for p in (REPO / "figures" / machine).iterdir())
        assert sorted(p.name for p in (out / machine).iterdir()) == committed
        wrote += [f"wrote {out / machine / name}" for name in committed]
        for name in committed:
            if name.endswith(".md"):  # the summaries are the committed ones, word for word
                assert (out / machine / name).read_text() == \
                    (REPO / "figures" / machine / name).read_text(), name
            else:
                width, height = _png_size(out / machine / name)
                assert width >= 1000 and height >= 600, name
    assert sorted(lines) == sorted(wrote)


def test_figures_refuses_a_folder_that_mixes_machines(tmp_path, capsys):
    """Two machines' files in one folder are refused, naming both, before anything is drawn."""
    from microbench.cli import main

    src = REPO / "figures" / "data"
    folder = tmp_path / "mixed"
    folder.mkdir()
    peaks = json.loads(next(src.glob("*/peaks.json")).read_text())
    other = json.loads(json.dumps(peaks))
    other["environment"]["cpu_count"] = 64
    (folder / "peaks.json").write_text(json.dumps(peaks))
    (folder / "phases.json").write_text(json.dumps({**other, "kind": "phases"}))
    with pytest.raises(SystemExit):
        main(["figures", "--data", str(folder), "--out", str(tmp_path / "out")])
    err = capsys.readouterr().err
    assert "results from 2 machines" in err and "64cpu" in err and "peaks.json" in err
    assert not (tmp_path / "out").exists() or not list((tmp_path / "out").iterdir())


# plots/ modules in dependency order: each imports only modules before it (no cycle).
PLOTS_ORDER = ("common", "roofline", "hierarchy", "claims", "points", "sweeps", "breakdown",
               "serving", "scale", "simulate", "speculative", "quant", "collectives", "parallel",
               "decode", "summary", "results", "saved")


def test_plots_modules_import_only_earlier_ones():
    assert sorted(PLOTS_ORDER) == sorted(p.stem for p in PLOTS.glob("*.py")
                                         if p.stem != "__init__")
    for i, name in enumerate(PLOTS_ORDER):
        tree = ast.parse((PLOTS / f"{name}.py").read_text())
        used = {node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)
                and node.module and node.module.startswith("microbench.plots")}
        assert "microbench.plots" not in used, name  # the package imports its modules
        assert {m.rsplit(".", 1)[1] for m in used} <= set(PLOTS_ORDER[:i]), (name, used)


def test_integer_gemm_roofs_are_operations_not_flops():
    """An int8 GEMM does integer operations: its roof is labelled OP/s and its ridge OP/B, on
    the figure and in summary.md; float roofs keep FLOP/s."""
    from microbench.plots.roofline import rate_unit, ridge_label
    from microbench.plots.summary import roof_rows

    result = synthetic.result()
    gemm = dict(result["roofs"]["compute"][0])
    int8 = {**gemm, "name": "GEMM int8", "dtype": "int8", "value": 3.25e11,
            "p10": 3.2e11, "p90": 3.3e11}
    result["roofs"]["compute"].append(int8)
    result["roofs"]["ridges"] = [{"flops_per_byte": 9.42, "compute": "GEMM int8",
                                  "memory": "DRAM read-only", "label": "ridge 9.42 FLOP/B"}]
    assert rate_unit(int8) == "OP/s" and rate_unit(gemm) == "FLOP/s"
    assert rate_unit({"kind": "memory", "name": "DRAM"}) == "B/s"
    assert ridge_label(result["roofs"]["ridges"][0]) == \
        "ridge 9.42 OP/B = GEMM int8 / DRAM read-only"
    rows = "\n".join(roof_rows(result))
    assert "| GEMM int8 | 325 GOP/s |" in rows and "ridge 9.42 OP/B = GEMM int8" in rows
    assert "| GEMM float32 | " in rows and "GFLOP/s" in rows
    labels = plots.roofline_figure([result]).axes[0].get_legend_handles_labels()[1]
    assert any(label.startswith("measured GEMM int8: 325 GOP/s") for label in labels)
    assert any(label.startswith("measured GEMM float32") and "GFLOP/s" in label
               for label in labels)
