"""Roofline arithmetic (microbench.roofline): the ridge names both roofs, spread is relative,
`above` allows exactly the roof's spread, and the working-set curve is a log-log interpolation
that is continuous, monotone between points, exact at the points and clamped at the ends.
Levels are structured fields (derived from an older file's `level` exactly as peaks writes
them); the roof chosen for a working set, a ridge or a prediction is the one documented."""

import math

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from microbench import roofline

GEMM = {"name": "GEMM float32", "value": 2e11, "p10": 1.9e11, "p90": 2.1e11}
DRAM = {"name": "DRAM read-only", "value": 5e10, "p10": 4.5e10, "p90": 5.5e10}


def test_ridge_value_and_label_name_both_roofs():
    r = roofline.ridge(GEMM, DRAM)
    assert r["flops_per_byte"] == pytest.approx(4.0)
    assert r["compute"] == "GEMM float32" and r["memory"] == "DRAM read-only"
    assert "GEMM float32" in r["label"] and "DRAM read-only" in r["label"]
    assert "4 FLOP/B" in r["label"]


def test_main_memory_name():
    assert roofline.main_memory_name({"backend": "cpu"}) == "DRAM"
    assert roofline.main_memory_name({"backend": "gpu"}) == "HBM"
    assert roofline.main_memory_name({"backend": "tpu"}) == "HBM"
    assert all(roofline.is_main_memory(n) for n in ("DRAM", "HBM"))
    assert not any(roofline.is_main_memory(n) for n in ("L2", "Infinity Cache", "P1"))


# ------------------------------------------------------------------ levels

@pytest.mark.parametrize("memory, access, main, level", [
    ("DRAM", "read", True, "DRAM read"), ("DRAM", "read+write", True, "DRAM"),
    ("HBM", "read", True, "HBM read"), ("HBM", "read+write", True, "HBM"),
    ("L2", "read", False, "L2"), ("Infinity Cache", "read+write", False, "Infinity Cache")])
def test_level_fields_and_the_derivation_from_an_older_level_agree(memory, access, main, level):
    fields = roofline.level_fields(memory, access, main)
    assert fields == {"level": level, "memory": memory, "access": access, "main": main}
    # an older file's roof has only `level` (and, for a cache, the program that read it)
    program = "C read (2 threads)" if access == "read" else "XLA in-place scale sweep"
    older = {"kind": "memory", "level": level, "program": program}
    assert roofline.levels(older) == {k: fields[k] for k in ("memory", "access", "main")}
    assert roofline.upgrade_roofs({"memory": [older]})["memory"][0] == {**older, **fields}
    with pytest.raises(ValueError, match="access"):
        roofline.level_fields(memory, "write", main)


def test_stored_fields_win_over_the_level_string():
    roof = {"level": "DRAM", "memory": "HBM", "access": "read", "main": True}
    assert roofline.levels(roof) == {"memory": "HBM", "access": "read", "main": True}


def _mem(name, memory, access, main, value, suspect=False):
    return {"name": name, "kind": "memory", **roofline.level_fields(memory, access, main),
            "value": value, "p10": value * 0.9, "p90": value * 1.1, "suspect": suspect}


L2 = _mem("L2", "L2", "read", False, 4e11)
MAIN_RW = _mem("DRAM", "DRAM", "read+write", True, 5e10)
MAIN_READ = _mem("DRAM read-only", "DRAM", "read", True, 3e10)
ROOFS = {"compute": [{"name": "GEMM float32", "kind": "compute", "dtype": "float32",
                      "value": 2e11, "p10": 1.9e11, "p90": 2.1e11, "suspect": False},
                     {"name": "vector FMA float32", "kind": "compute", "dtype": "float32",
                      "value": 3e11, "p10": 2.9e11, "p90": 3.1e11, "suspect": False}],
         "memory": [L2, MAIN_RW, MAIN_READ]}
CAPS = [["L2", 1 << 20], ["L3", 32 << 20]]


def test_main_roofs_are_chosen_by_field_and_suspects_only_on_request():
    assert roofline.main_roofs(ROOFS["memory"]) == [MAIN_RW, MAIN_READ]
    assert roofline.main_roof(ROOFS["memory"], "read") is MAIN_READ
    assert roofline.main_roof(ROOFS["memory"], "read+write") is MAIN_RW
    flagged = {**MAIN_READ, "suspect": True}
    assert roofline.main_roof([L2, flagged], "read") is None
    assert roofline.main_roof([L2, flagged], "read", include_suspect=True) is flagged


def test_the_holding_level_is_the_smallest_cache_that_holds_the_working_set():
    memory = [L2, MAIN_RW]
    assert roofline.holding_roof(memory, CAPS, 1000) is L2
    # L3 holds it but has no measured roof: fall through to main memory
    assert roofline.holding_roof(memory, CAPS, 4 << 20) is MAIN_RW
    assert roofline.holding_roof(memory, CAPS, 1 << 40) is MAIN_RW
    # main memory's read-only roof first: inference phases stream reads
    assert roofline.holding_roof(ROOFS["memory"], CAPS, 1 << 40) is MAIN_READ
    assert roofline.holding_roof(ROOFS["memory"], CAPS, 1000) is L2
    with pytest.raises(ValueError, match="roofs.memory"):
        roofline.holding_roof([L2], CAPS, 1 << 40)


def test_ridges_divide_every_compute_roof_by_main_memorys_roofs():
    got = roofline.ridges(ROOFS["compute"], ROOFS["memory"])
    assert [(r["compute"], r["memory"]) for r in got] == [
        ("GEMM float32", "DRAM"), ("GEMM float32", "DRAM read-only"),
        ("vector FMA float32", "DRAM"), ("vector FMA float32", "DRAM read-only")]
    assert roofline.phase_ridge(ROOFS, "float32")["memory"] == "DRAM read-only"
    assert roofline.phase_ridge(ROOFS, "float32", "DRAM")["flops_per_byte"] == 2e11 / 5e10
    assert roofline.phase_ridge(ROOFS, "bfloat16") is None  # no GEMM roof of that dtype


def test_prediction_is_the_slower_of_compute_and_memory_plus_the_floor():
    compute, memory = ROOFS["compute"][0], MAIN_RW
    mem_bound = roofline.predict(flops=1e9, nbytes=1e9, compute=compute, memory=memory)
    assert mem_bound["bound"] == "memory" and mem_bound["memory_level"] == "DRAM"
    assert mem_bound["time_s"] == pytest.approx(1e9 / 5e10)
    assert mem_bound["flops_per_s"] == pytest.approx(1e9 / (1e9 / 5e10))
    comp_bound = roofline.predict(flops=1e12, nbytes=1e9, compute=compute, memory=memory)
    assert comp_bound["bound"] == "compute"
    assert comp_bound["time_s"] == pytest.approx(1e12 / 2e11)
    floor = roofline.predict(flops=1e3, nbytes=1e3, compute=compute, memory=memory,
                             floor_s=1e-3)
    assert floor["bound"] == "overhead" and floor["time_s"] == pytest.approx(1e-3 + 1e3 / 5e10)


def test_per_op_prediction_sums_each_ops_own_roofline_time():
    """With the phase's ops, the prediction is sum max(F_op / C, B_op / M): a compute-bound op
    and a memory-bound op do not hide each other's time, as max(F / C, B / M) assumes."""
    compute, memory = ROOFS["compute"][0], MAIN_RW  # 2e11 FLOP/s, 5e10 B/s
    ops = {"ffn": {"flops": 4e11, "bytes": 1e9},  # compute-bound: 2 s (memory 0.02 s)
           "attn": {"flops": 1e9, "bytes": 5e10}}  # memory-bound: 1 s (compute 0.005 s)
    whole = roofline.predict(4.01e11, 5.1e10, compute, memory)
    per_op = roofline.predict(4.01e11, 5.1e10, compute, memory, floor_s=1e-3, ops=ops)
    assert whole["time_s"] == pytest.approx(4.01e11 / 2e11)  # the compute time alone: 2.005 s
    assert per_op["time_s"] == pytest.approx(1e-3 + 2.0 + 1.0)
    assert per_op["t_overlap_s"] == pytest.approx(1e-3 + whole["time_s"])
    assert per_op["t_compute_bound_ops_s"] == pytest.approx(2.0)
    assert per_op["t_memory_bound_ops_s"] == pytest.approx(1.0)
    assert per_op["bound"] == "compute" and per_op["per_op"] is True
    assert "per_op" not in whole
    # ops all on one side: the sum is the whole phase's max (every op's bytes over one roof)
    same = {"a": {"flops": 1e6, "bytes": 1e9}, "b": {"flops": 2e6, "bytes": 3e9}}
    assert roofline.predict(3e6, 4e9, compute, memory, ops=same)["time_s"] == pytest.approx(
        roofline.predict(3e6, 4e9, compute, memory)["time_s"])
    with pytest.raises(ValueError, match="sum to the phase"):
        roofline.predict(3e6, 5e9, compute, memory, ops=same)


def test_a_spec_devices_roofs_are_its_dtype_peak_and_its_main_memory():
    from microbench import hardware

    h100 = hardware.get("H100 SXM")
    compute, memory = roofline.spec_roofs(h100, "bfloat16")
    assert compute["value"] == h100.peak_flops["bfloat16"]
    assert memory["value"] == h100.memory_bandwidth[h100.main_memory]
    assert roofline.ridge(compute, memory)["flops_per_byte"] == hardware.ridge_point(h100)
    unknown, _ = roofline.spec_roofs(h100, "float64")  # no such peak: the highest one
    assert unknown["value"] == max(h100.peak_flops.values())


def test_spread_of_a_roof_and_of_a_rate():
    assert roofline.spread(GEMM) == pytest.approx(0.1)
    assert roofline.spread({"median": 10.0, "p10": 9.0, "p90": 12.0}) == pytest.approx(0.3)
    # a roof's "value" wins over a "median" key, and a zero centre gives 0, never a division
    assert roofline.spread({"value": 20.0, "median": 10.0, "p10": 9.0, "p90": 11.0}) == \
        pytest.approx(0.1)
    assert roofline.spread({"value": 0.0, "p10": 0.0, "p90": 1.0}) == 0.0
    # inverted percentiles never give a negative spread
    assert roofline.spread({"value": 10.0, "p10": 11.0, "p90": 9.0}) == 0.0


def test_above_allows_exactly_the_roofs_spread():
    roof = {"value": 100.0, "p10": 95.0, "p90": 105.0}  # spread 0.10
    edge = 100.0 * (1 + roofline.spread(roof))
    assert not roofline.above(edge, roof)  # exactly at roof x (1 + spread): not above
    assert roofline.above(edge * (1 + 1e-9), roof)
    assert not roofline.above(100.0, roof) and not roofline.above(50.0, roof)
    assert not roofline.above(115.0, roof, extra=0.05)
    assert roofline.above(115.1, roof, extra=0.05)
    tight = {"value": 100.0, "p10": 100.0, "p90": 100.0}
    assert roofline.above(100.0001, tight) and not roofline.above(100.0, tight)


CURVE = [[16e3, 4e11], [1e6, 2e11], [32e6, 1e11], [512e6, 2.5e10]]


def test_curve_exact_at_points_and_clamped_at_ends():
    for s, b in CURVE:
        assert roofline.curve_bandwidth(CURVE, s) == pytest.approx(b, rel=1e-12)
    assert roofline.curve_bandwidth(CURVE, 1.0) == 4e11
    assert roofline.curve_bandwidth(CURVE, 1e15) == 2.5e10
    # order of the input does not matter
    assert roofline.curve_bandwidth(CURVE[::-1], 5e6) == roofline.curve_bandwidth(CURVE, 5e6)
    with pytest.raises(ValueError):
        roofline.curve_bandwidth([], 1e6)


def test_curve_is_log_log_linear_not_linear():
    # halfway in log(size) between two points is the geometric mean of their bandwidths
    mid = math.sqrt(1e6 * 32e6)
    assert roofline.curve_bandwidth(CURVE, mid) == pytest.approx(math.sqrt(2e11 * 1e11))


def _curve_strategy():
    sizes = st.lists(st.floats(1e3, 1e11), min_size=2, max_size=8, unique=True)
    return sizes.flatmap(lambda s: st.tuples(
        st.just(sorted(s)),
        st.lists(st.floats(1e8, 1e13), min_size=len(s), max_size=len(s))))


@settings(max_examples=150, deadline=None)
@given(_curve_strategy(), st.floats(0.0, 1.0))
def test_curve_interpolates_log_log_between_neighbours(curve_parts, w):
    sizes, bws = curve_parts  # neighbours far enough apart that logs are not rounding noise
    assume(all(b / a >= 1.001 for a, b in zip(sizes, sizes[1:], strict=False)))
    curve = list(zip(sizes, bws, strict=True))
    for (s0, b0), (s1, b1) in zip(curve, curve[1:], strict=False):
        x = math.exp(math.log(s0) + w * (math.log(s1) - math.log(s0)))
        x = min(max(x, s0), s1)
        got = roofline.curve_bandwidth(curve, x)
        lo, hi = min(b0, b1), max(b0, b1)
        # monotone between the two points: never outside their range
        assert lo * (1 - 1e-9) <= got <= hi * (1 + 1e-9)
        # and exactly the log-log line through them
        wx = (math.log(x) - math.log(s0)) / (math.log(s1) - math.log(s0))
        want = math.exp(math.log(b0) + wx * (math.log(b1) - math.log(b0)))
        assert got == pytest.approx(want, rel=1e-9)


@settings(max_examples=150, deadline=None)
@given(_curve_strategy(), st.floats(1e2, 1e12), st.floats(1e-6, 1e-2))
def test_curve_is_continuous(curve_parts, x, eps):
    """A small step in size moves log(bandwidth) by at most the steepest segment's log-log
    slope times the step: no cliffs, anywhere (including the ends)."""
    sizes, bws = curve_parts
    assume(all(b / a >= 1.001 for a, b in zip(sizes, sizes[1:], strict=False)))
    curve = list(zip(sizes, bws, strict=True))
    slope = max(abs(math.log(b1 / b0) / math.log(s1 / s0))
                for (s0, b0), (s1, b1) in zip(curve, curve[1:], strict=False))
    a = roofline.curve_bandwidth(curve, x)
    b = roofline.curve_bandwidth(curve, x * (1 + eps))
    assert abs(math.log(b / a)) <= slope * math.log1p(eps) * (1 + 1e-6) + 1e-9


@settings(max_examples=100, deadline=None)
@given(st.lists(st.floats(1e3, 1e11), min_size=2, max_size=8, unique=True),
       st.lists(st.floats(1e3, 1e11), min_size=2, max_size=20))
def test_a_decreasing_curve_gives_a_non_increasing_bandwidth(sizes, xs):
    sizes = sorted(sizes)
    curve = [[s, 1e12 / (i + 1)] for i, s in enumerate(sizes)]
    vals = [roofline.curve_bandwidth(curve, x) for x in sorted(xs)]
    assert all(b <= a * (1 + 1e-12) for a, b in zip(vals, vals[1:], strict=False))
