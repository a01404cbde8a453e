"""Atomic JSON/CSV writers (an interrupted write never leaves a half-written file) and the
result-schema validator (each bad field named)."""

import copy
import json
import os

import pytest

from microbench import harness
from microbench.roofs import synthetic
from microbench.schema import validate_result


def test_write_json_atomic_round_trip(tmp_path):
    path = harness.write_json_atomic(tmp_path / "sub" / "r.json", {"a": [1, 2.5]})
    assert json.loads(path.read_text()) == {"a": [1, 2.5]}
    assert [p.name for p in path.parent.iterdir()] == ["r.json"]


@pytest.mark.parametrize("fail_at", ["fsync", "replace"])
def test_interrupted_write_leaves_old_file_and_no_temp(tmp_path, monkeypatch, fail_at):
    path = tmp_path / "r.json"
    harness.write_json_atomic(path, {"version": "old"})

    def boom(*args, **kwargs):
        raise KeyboardInterrupt  # the run is interrupted mid-write

    monkeypatch.setattr(os, fail_at, boom)
    with pytest.raises(KeyboardInterrupt):
        harness.write_json_atomic(path, {"version": "new", "big": list(range(10_000))})
    monkeypatch.undo()
    assert json.loads(path.read_text()) == {"version": "old"}
    assert [p.name for p in tmp_path.iterdir()] == ["r.json"]


def test_interrupted_first_write_leaves_nothing(tmp_path, monkeypatch):
    monkeypatch.setattr(os, "replace", lambda *a: (_ for _ in ()).throw(KeyboardInterrupt))
    with pytest.raises(KeyboardInterrupt):
        harness.write_json_atomic(tmp_path / "r.json", {"x": 1})
    assert list(tmp_path.iterdir()) == []


def test_unserialisable_value_leaves_old_file(tmp_path):
    path = harness.write_json_atomic(tmp_path / "r.json", {"ok": 1})
    with pytest.raises(ValueError):
        harness.write_json_atomic(path, {"bad": float("nan")})  # NaN is not JSON
    assert json.loads(path.read_text()) == {"ok": 1}


def test_write_csv_atomic_union_of_columns(tmp_path):
    path = harness.write_csv_atomic(tmp_path / "r.csv", [{"a": 1, "b": 2}, {"b": 3, "c": 4}])
    assert path.read_text().splitlines() == ["a,b,c", "1,2,", ",3,4"]


def test_synthetic_result_is_valid():
    validate_result(synthetic.result())


def _set(obj, path, value):
    keys = path.split("/")
    for k in keys[:-1]:
        obj = obj[int(k)] if k.isdigit() else obj[k]
    last = keys[-1]
    if value is KeyError:
        del obj[last]
    else:
        obj[int(last) if last.isdigit() else last] = value


@pytest.mark.parametrize("path, value, named", [
    ("schema_version", 99, "result.schema_version"),
    ("kind", "other", "result.kind"),
    ("machine", KeyError, "result.machine"),
    ("quick", "yes", "result.quick"),
    ("environment/backend", 3, "result.environment.backend"),
    ("gemm/0/timing/samples", [], "result.gemm[0].timing.samples"),
    ("gemm/0/timing/samples/1", -1.0, "result.gemm[0].timing.samples[1]"),
    ("gemm/0/flops", "many", "result.gemm[0].flops"),
    ("gemm/0/flops_per_s/median", float("inf"), "result.gemm[0].flops_per_s.median"),
    ("vector/0/suspect", "no", "result.vector[0].suspect"),
    ("bandwidth/0/timing/calls_per_sample", 0, "result.bandwidth[0].timing.calls_per_sample"),
    ("sweep/points/2/bytes", None, "result.sweep.points[2].bytes"),
    ("intensity/points", {}, "result.intensity.points"),
    ("roofs/compute/0/kind", "magic", "result.roofs.compute[0].kind"),
    ("roofs/memory/0/value", 0, "result.roofs.memory[0].value"),
    ("roofs/memory/0/level", KeyError, "result.roofs.memory[0].level"),
    ("roofs/memory/0/access", "write", "result.roofs.memory[0].access"),
    ("roofs/memory/0/main", "yes", "result.roofs.memory[0].main"),
    ("roofs/memory/0/memory", 2, "result.roofs.memory[0].memory"),
])
def test_validator_names_the_bad_field(path, value, named):
    bad = copy.deepcopy(synthetic.result())
    _set(bad, path, value)
    with pytest.raises(ValueError) as err:
        validate_result(bad)
    assert str(err.value).startswith(named + ":") or str(err.value).startswith(named + " ")


def test_validator_requires_reason_when_suspect():
    bad = copy.deepcopy(synthetic.result())
    bad["gemm"][0]["suspect"], bad["gemm"][0]["reason"] = True, None
    with pytest.raises(ValueError, match=r"result\.gemm\[0\]\.reason"):
        validate_result(bad)
