"""Guard rails: values above their ceiling are flagged with a reason and never become roofs."""

from microbench.roofs import guard, peaks, synthetic


def test_over_peak_gemm_is_flagged_and_not_a_roof():
    peak = synthetic.spec().peak_flops["float32"]
    res = synthetic.result(gemm_f32=2e11, extra_gemm=1.5 * peak)
    flagged = [e for e in res["gemm"] if e["suspect"]]
    assert len(flagged) == 1 and flagged[0]["shape"] == [512, 1024, 1024]
    ratio = flagged[0]["flops_per_s"]["median"] / peak
    reason = flagged[0]["reason"]
    assert "exceeds the ceiling" in reason and f"({ratio:.2f}x)" in reason
    roof = next(r for r in res["roofs"]["compute"] if r["name"] == "GEMM float32")
    assert roof["value"] < peak and not roof["suspect"]  # the roof is the best honest value
    assert abs(roof["value"] - 2e11) / 2e11 < 0.05


def test_value_at_or_below_the_ceiling_is_not_flagged():
    peak = synthetic.spec().peak_flops["float32"]
    res = synthetic.result(extra_gemm=0.99 * peak)
    assert not any(e["suspect"] for e in res["gemm"])


def test_over_peak_bandwidth_is_flagged_against_the_main_memory_ceiling():
    res = synthetic.result(dram_ceiling=2e10)  # the synthetic DRAM streams at 5e10
    assert all(e["suspect"] for e in res["bandwidth"])
    assert "at DRAM" in res["bandwidth"][0]["reason"]
    dram = [r for r in res["roofs"]["memory"] if r["level"] == "DRAM"]
    assert all(r["suspect"] for r in dram)  # the sweep plateau is over the ceiling too


def test_no_ceiling_means_no_flag():
    assert guard.check(1e30, None, "x", "FLOP/s", "none") == (False, None)
    entry = {"name": "gemm", "dtype": "float64", "flops_per_s": {"median": 1e30}}
    assert guard.flag_compute(entry, synthetic.spec())["suspect"] is False  # no fp64 peak


def test_float8_measurement_uses_the_float8_ceiling():
    from microbench import hardware

    h100 = hardware.get("H100 SXM")
    entry = {"name": "gemm", "dtype": "float8_e4m3fn", "flops_per_s": {"median": 2.5e15}}
    assert guard.flag_compute(entry, h100)["suspect"]
    entry["flops_per_s"]["median"] = 1.5e15
    assert not guard.flag_compute(entry, h100)["suspect"]


def test_roofs_skip_flagged_entries():
    e_ok = {"suspect": False, "flops_per_s": {"median": 1.0}}
    e_bad = {"suspect": True, "flops_per_s": {"median": 9.0}}
    assert peaks._best([e_ok, e_bad], "flops_per_s") is e_ok
    assert peaks._best([e_bad], "flops_per_s") is None
