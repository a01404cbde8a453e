"""One machine per figure: machines are named from a result's environment block, committed
results live in one folder per machine, and a set of results that mixes machines is refused."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from microbench import machines

ZEN4 = {"cpu_model": "AMD EPYC", "cpu_id": {"vendor": "AuthenticAMD", "family": 25, "model": 17},
        "cpu_count": 2, "backend": "cpu", "device_kind": "cpu"}


def test_a_machine_is_named_by_its_microarchitecture_and_cores():
    assert machines.describe(ZEN4) == "AMD EPYC, family 25 model 17 (Zen 4 (Genoa)), 2 cores"
    assert machines.slug(ZEN4) == "amd-zen-4-genoa-2cpu"
    zen3 = {**ZEN4, "cpu_id": {"vendor": "AuthenticAMD", "family": 25, "model": 1}}
    assert machines.slug(zen3) == "amd-zen-3-milan-2cpu"
    unknown = {**ZEN4, "cpu_id": {"vendor": "AuthenticAMD", "family": 99, "model": 7}}
    assert machines.slug(unknown) == "amd-family-99-model-7-2cpu"
    gpu = {**ZEN4, "backend": "gpu", "device_kind": "NVIDIA H100 80GB HBM3", "device_count": 1}
    assert machines.slug(gpu) == "nvidia-h100-80gb-hbm3-x1"
    assert machines.describe(gpu).startswith("1 x NVIDIA H100 80GB HBM3 on AMD EPYC")
    assert machines.slug({}) is None and machines.describe(None) == "machine not recorded"


def test_mixed_machines_and_foreign_roofs_are_refused():
    zen3 = {**ZEN4, "cpu_id": {"vendor": "AuthenticAMD", "family": 25, "model": 1}}
    same = {"a.json": {"environment": ZEN4}, "b.json": {"environment": dict(ZEN4)},
            "paper.json": {"kind": "parallel"}}
    assert machines.check_one_machine(same, "here") == "amd-zen-4-genoa-2cpu"
    with pytest.raises(ValueError, match=r"here: results from 2 machines .*b\.json"):
        machines.check_one_machine({"a.json": {"environment": ZEN4},
                                    "b.json": {"environment": zen3}}, "here")
    foreign = {"environment": ZEN4, "roofs": {"machine": "amd-zen-3-milan-2cpu"}}
    with pytest.raises(ValueError, match="predicted with roofs measured on amd-zen-3"):
        machines.check_one_machine({"s.json": foreign}, "here")


def test_data_folder_finds_the_machine_holding_every_file(tmp_path):
    for name, files in {"m1": ["peaks"], "m2": ["peaks", "serve"]}.items():
        (tmp_path / name).mkdir()
        for f in files:
            (tmp_path / name / f"{f}.json").write_text("{}")
    assert machines.data_folder("peaks", "serve", root=tmp_path).name == "m2"
    assert machines.data_folder("peaks", root=tmp_path, machine="m2").name == "m2"
    assert machines.figures_folder("serve", root=tmp_path) == tmp_path.parent / "m2"
    with pytest.raises(ValueError, match="no machine folder holds quant.json"):
        machines.data_folder("quant", root=tmp_path)


def test_committed_data_live_in_their_machines_folders():
    """Every committed result sits in the folder its own environment names (results computed
    on paper record no machine and may sit in any), and no folder mixes machines."""
    folders = machines.machine_folders(machines.DATA_ROOT)
    assert folders
    for folder in folders:
        results = {p.name: json.loads(p.read_text()) for p in Path(folder).glob("*.json")}
        assert machines.check_one_machine(results, str(folder)) in (folder.name, None)
