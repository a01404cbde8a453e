"""The memory hierarchy check (microbench.roofs.hierarchy.check_monotone) and the native program it
runs on (microbench.roofs.native, skipped without gcc): a larger level reading faster than a smaller
one beyond both spreads is flagged with a reason; ties within the spreads pass; the C program
returns one positive time per repetition and the documented ladder of working sets."""

import pytest

from microbench.roofs import hierarchy, native
from microbench.roofs.probe import Probe


def plateau(name, value, rel=0.05):
    return {"name": name, "bytes_per_s": value, "p10": value * (1 - rel),
            "p90": value * (1 + rel), "lo_bytes": 1, "hi_bytes": 2}


def test_monotone_hierarchy_passes():
    checks = hierarchy.check_monotone([plateau("L1", 400e9), plateau("L2", 200e9),
                                       plateau("L3", 100e9)])
    assert [(c["smaller"], c["larger"]) for c in checks] == [("L1", "L2"), ("L2", "L3")]
    assert all(c["ok"] and c["reason"] is None for c in checks)


def test_a_larger_level_faster_than_a_smaller_one_is_flagged_with_a_reason():
    checks = hierarchy.check_monotone([plateau("L1", 400e9), plateau("L2", 100e9),
                                       plateau("L3", 150e9)])
    assert [c["ok"] for c in checks] == [True, False]
    bad = checks[1]
    assert (bad["smaller"], bad["larger"]) == ("L2", "L3")
    assert "L3 (150.0 GB/s)" in bad["reason"] and "L2 (100.0 GB/s)" in bad["reason"]
    assert "pinned" in bad["reason"]


def test_ties_within_the_spreads_are_not_violations():
    # L3's median is 4% above L2's but the spreads overlap: noise, not a violation
    checks = hierarchy.check_monotone([plateau("L2", 100e9), plateau("L3", 104e9)])
    assert checks[0]["ok"]
    # disjoint spreads: L3's p10 above L2's p90
    checks = hierarchy.check_monotone([plateau("L2", 100e9, 0.01), plateau("L3", 104e9, 0.01)])
    assert not checks[0]["ok"] and checks[0]["reason"]
    # a lower median is fine whatever the spreads
    checks = hierarchy.check_monotone([plateau("L2", 100e9, 0.5), plateau("L3", 99e9, 0.0)])
    assert checks[0]["ok"]


def test_main_read_roof_replaces_the_main_memory_plateau_as_the_last_level():
    main_read = {"name": "DRAM read-only", "level": "DRAM read", "value": 120e9,
                 "p10": 118e9, "p90": 122e9}
    checks = hierarchy.check_monotone([plateau("L2", 200e9), plateau("L3", 100e9),
                                       plateau("DRAM", 20e9)], main_read)
    assert [(c["smaller"], c["larger"]) for c in checks] == [("L2", "L3"),
                                                            ("L3", "DRAM read-only")]
    assert checks[0]["ok"] and not checks[1]["ok"]
    assert "DRAM read-only (120.0 GB/s)" in checks[1]["reason"]
    ok = hierarchy.check_monotone([plateau("L3", 100e9)], {**main_read, "value": 50e9,
                                                            "p10": 49e9, "p90": 51e9})
    assert [c["ok"] for c in ok] == [True]


def test_one_level_has_nothing_to_check():
    assert hierarchy.check_monotone([plateau("L1", 1e11)]) == []
    assert hierarchy.check_monotone([]) == []


def test_curve_and_level_values_read_the_all_core_series():
    h = {"all_cores": {"points": [{"working_set_bytes": 1 << 14,
                                   "bytes_per_s": {"median": 3e11, "p10": 2e11, "p90": 4e11}},
                                  {"working_set_bytes": 1 << 30,
                                   "bytes_per_s": {"median": 2e10, "p10": 1e10, "p90": 3e10}}],
                       "plateaus": [plateau("L1", 3e11)]}}
    assert hierarchy.curve(h) == [[16384.0, 3e11], [float(1 << 30), 2e10]]
    assert hierarchy.level_values(h) == {"L1": 3e11}


needs_gcc = pytest.mark.skipif(not native.available(), reason="gcc not found")
N = 1 << 20


def _positive_times(xs, count):
    assert len(xs) == count
    assert all(isinstance(x, float) and x > 0 for x in xs)


@needs_gcc
def test_native_stream_returns_one_positive_time_per_repetition():
    out = native.stream(N, 3, 1)
    assert out["threads"] == 1 and out["n"] == N
    for kern in native.BYTES_PER_ELEMENT:
        _positive_times(out[kern], 3)


@needs_gcc
def test_native_stream_rounds_n_down_to_whole_slices():
    out = native.stream(N + 1000, 2, 2)
    assert out["threads"] == 2
    assert out["n"] == (N + 1000) // (128 * 2) * (128 * 2)
    for kern in native.BYTES_PER_ELEMENT:
        _positive_times(out[kern], 2)


@needs_gcc
def test_native_server_answers_each_call_with_fresh_samples():
    server = native.Server(N, 1)
    try:
        assert server.n == N and server.threads == 1
        a, b = server.stream(2), server.stream(4)
        assert a["n"] == b["n"] == N
        for kern in native.BYTES_PER_ELEMENT:
            _positive_times(a[kern], 2)
            _positive_times(b[kern], 4)
        read = server.read(3)  # the read alone (the drift probe's), then a full call again
        assert set(read) == {"threads", "n", "read", "sink"} and read["n"] == N
        _positive_times(read["read"], 3)
        _positive_times(server.stream(1)["triad"], 1)
        probe = Probe(reader=server)  # the phase points' probe: this read and XLA's GEMM
        m = probe.measure()
        assert probe.bytes == 4.0 * N and "C read probe" in probe.name
        assert m["read_bytes_per_s"] > 0 and m["gemm_flops_per_s"] > 0
    finally:
        server.close()
    assert server._proc.poll() == 0  # a clean exit on close, not a kill
    reader = native.Server(N, 1, read_only=True)  # the probe's: one array, the read alone
    try:
        _positive_times(reader.read(2)["read"], 2)
        with pytest.raises(ValueError, match="read_only"):
            reader.stream(1)
        _positive_times(reader.read(1)["read"], 1)
    finally:
        reader.close()
    assert reader._proc.poll() == 0


@needs_gcc
def test_native_sweep_is_the_documented_ladder():
    points = native.sweep(16 << 10, 256 << 10, 2.0, 1 << 20, 1)
    sizes = [p["bytes"] for p in points]
    assert sizes == [16 << 10, 32 << 10, 64 << 10, 128 << 10, 256 << 10]
    assert [p["repeats"] for p in points] == [(1 << 20) // s for s in sizes]
    for p in points:
        _positive_times(p["seconds"], 5)


@needs_gcc
def test_native_sweep_sizes_are_whole_slices_per_thread_and_increasing():
    points = native.sweep(16 << 10, 96 << 10, 1.41, 1 << 19, 2)
    sizes = [p["bytes"] for p in points]
    assert len(sizes) >= 4
    assert all(s % (4 * 128 * 2) == 0 for s in sizes)  # 128 floats x 2 threads
    assert all(b > a for a, b in zip(sizes, sizes[1:], strict=False))
    assert sizes[0] == 16 << 10 and sizes[-1] <= 96 << 10
    assert all(p["repeats"] == max(1, (1 << 19) // p["bytes"]) for p in points)
    for p in points:
        _positive_times(p["seconds"], 5)
