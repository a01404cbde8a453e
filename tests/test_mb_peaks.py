"""The measurement plan keeps "DRAM" buffers out of cache; levels come from the right place;
the CSV has one row per measurement; peer children drop the OpenBLAS pins only for them."""

import os

import pytest

from microbench import hardware, roofline
from microbench.roofs import peaks, peers, synthetic


@pytest.mark.parametrize("quick", [True, False])
@pytest.mark.parametrize("llc", [32 << 20, 256 << 20])
def test_plan_dram_sizes_exceed_four_times_the_llc(quick, llc):
    plan = peaks.make_plan(quick, llc)
    assert plan.dram_array_bytes >= 4 * llc
    assert plan.sweep_hi >= 4 * llc and plan.sweep_lo <= 8 << 10
    assert plan.intensity_points[-1] in peaks.intensity.POINTS


def test_memory_levels_cpu_from_os_and_gpu_from_spec():
    env = {"backend": "cpu", "affinity": [0, 1],
           "caches": [{"name": "L2", "level": 2, "size_bytes": 1 << 20, "shared_by_cpus": 1},
                      {"name": "L3", "level": 3, "size_bytes": 32 << 20, "shared_by_cpus": 2}]}
    assert peaks.memory_levels(env, None) == [("L2", 2 << 20), ("L3", 32 << 20)]
    gpu = {"backend": "gpu", "affinity": [0], "caches": env["caches"]}
    assert peaks.memory_levels(gpu, hardware.get("MI300X")) == [
        ("L2", 32 << 20), ("Infinity Cache", 256 << 20)]
    assert roofline.main_memory_name(gpu) == "HBM"


def test_csv_rows_one_per_measurement():
    res = synthetic.result()
    rows = peaks.csv_rows(res)
    n = (len(res["gemm"]) + len(res["vector"]) + len(res["bandwidth"])
         + len(res["sweep"]["points"]) + len(res["intensity"]["points"]))
    assert len(rows) == n
    assert rows[0]["shape"] == "1024x1024x1024" and rows[0]["flops_per_s"] > 0


def test_peer_environment_drops_openblas_pins_only_for_the_child(monkeypatch):
    monkeypatch.setenv("OPENBLAS_CORETYPE", "Haswell")
    monkeypatch.setenv("OPENBLAS_L2_SIZE", "1")
    env = peers.peer_environment()
    assert "OPENBLAS_CORETYPE" not in env and "OPENBLAS_L2_SIZE" not in env
    assert os.environ["OPENBLAS_CORETYPE"] == "Haswell"  # never changed globally
    assert env["PATH"] == os.environ["PATH"]


def test_a_main_memory_sweep_point_above_the_roof_is_flagged_not_a_roof():
    res = synthetic.result()
    main = next(r for r in res["roofs"]["memory"] if r["level"] == "DRAM")
    assert not main["suspect"]
    # levels are structured fields: main memory's STREAM roof and XLA's cache plateaus
    assert (main["memory"], main["access"], main["main"]) == ("DRAM", "read+write", True)
    assert roofline.main_roofs(res["roofs"]["memory"]) == [main]
    assert [(r["memory"], r["access"], r["main"]) for r in res["roofs"]["memory"][:3]] == [
        (name, "read+write", False) for name in ("L1", "L2", "L3")]
    big = [p for p in res["sweep"]["points"] if p["working_set_bytes"] >= 4 * (32 << 20)]
    assert big and not any(p["suspect"] for p in big)  # the synthetic sweep agrees with STREAM
    big[-1]["bytes_per_s"] = {k: 2 * v for k, v in big[-1]["bytes_per_s"].items()}
    peaks.flag_points(res)
    assert big[-1]["suspect"] and "not a main-memory figure" in big[-1]["reason"]
    assert not any(p["suspect"] for p in big[:-1])


def test_an_intensity_point_above_its_roof_is_flagged():
    res = synthetic.result()
    p = res["intensity"]["points"][0]  # memory-bound end
    assert not p["suspect"]
    p["flops_per_s"] = {k: 3 * v for k, v in p["flops_per_s"].items()}
    peaks.flag_points(res)
    assert p["suspect"] and "above its roof" in p["reason"]


def test_main_array_is_big_enough_and_bounded_by_memory():
    assert peaks.main_array_bytes(32 << 20) == 1 << 30  # max(1 GiB, 16 x LLC)
    assert peaks.main_array_bytes(256 << 20) == 4 << 30
    small = peaks.main_array_bytes(32 << 20, available=3 << 30)  # a twelfth of 3 GiB
    assert small == 256 << 20 and small >= 4 * (32 << 20)
