"""The measurement plan keeps "DRAM" buffers out of cache; levels come from the right place;
the CSV has one row per measurement; peer children drop the OpenBLAS pins only for them."""

import os

import pytest

from microbench import hardware, peaks, peers, synthetic


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
    assert peaks.main_memory_name(gpu) == "HBM"


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


def test_ratio_block_picks_the_best_peer():
    ours = {"value": 90.0}
    mk = lambda name, v: {"name": name, "rate": {"median": v}}
    block = peers._ratio_block(ours, [mk("slow", 50.0), mk("fast", 100.0)], "B/s")
    assert block["best_peer"] == "fast" and block["ratio_ours_over_best_peer"] == 0.9


def test_a_sweep_plateau_above_stream_is_flagged_not_a_roof():
    res = synthetic.result()
    spec = hardware.device_from_dict(res["spec"])
    main = next(r for r in res["roofs"]["memory"] if r["level"] == "DRAM")
    assert not main["suspect"]  # the synthetic sweep agrees with its STREAM kernel
    plateau = next(q for q in res["sweep"]["plateaus"] if q["name"] == "DRAM")
    plateau["bytes_per_s"] = 2 * main["value"]
    roofs = peaks.derive_roofs(res, spec)["memory"]
    dram = [r for r in roofs if r["level"] == "DRAM"]
    assert len(dram) == 1 and dram[0]["value"] == main["value"] and not dram[0]["suspect"]
    flagged = [r for r in roofs if r["level"] == "DRAM sweep"]
    assert len(flagged) == 1 and flagged[0]["suspect"] and "not a roof" in flagged[0]["reason"]
