"""Phase predictions (microbench.phases.points) and the roofs they use (microbench.roofs.peaks), on
synthetic peaks results: the working-set curve ends at main memory's read roof; a predicted
time is continuous in the working set (no cliff at the last-level cache), includes the per-call
floor, is "overhead"-bound when the floor dominates, scales only main memory by the drift
probe; a point faster than its roof beyond the spreads is suspect, and one outside the band
says why with a measured number. Also derive_roofs with and without rounds, and flag_points."""

import copy
import math
import re

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from microbench import hardware
from microbench.phases import points
from microbench.roofs import native, peaks, rounds, synthetic

LLC = 32 << 20
CAPS = [["L1", 96 << 10], ["L2", 2 << 20], ["L3", LLC]]
MAIN_READ = 4e10


def _bw(size: float) -> float:
    """A smooth all-core read curve: 4e11 in L1 down to 1e11 in L3, then towards DRAM."""
    x = math.log2(size)
    step = lambda centre, lo, hi: lo + (hi - lo) / (1 + math.exp(2.0 * (x - centre)))
    return step(17.5, step(22.0, step(26.0, 3.5e10, 1e11), 2e11), 4e11)


SIZES = [int(16 * 1024 * 1.41**i) for i in range(30)]  # 16 KiB .. ~250 GiB; filtered below


def rate(v, rel=0.02):
    return {"median": v, "p10": v * (1 - rel), "p90": v * (1 + rel)}


def roof(name, level, value, rel=0.05, kind="memory", **extra):
    key = "level" if kind == "memory" else "dtype"
    return {"name": name, "kind": kind, key: level, "value": value, "p10": value * (1 - rel),
            "p90": value * (1 + rel), "source": "test", "suspect": False, "reason": None,
            **extra}


def peaks_result(main_read_suspect=False, with_hierarchy=True, overhead=None):
    roofs = {
        "compute": [roof("GEMM float32", "float32", 2e11, kind="compute"),
                    roof("vector FMA float32", "float32", 1e11, kind="compute")],
        "memory": [roof("L1", "L1", 4e11), roof("L2", "L2", 2e11), roof("L3", "L3", 1e11),
                   roof("DRAM", "DRAM", 3e10),
                   roof("DRAM read-only", "DRAM read", MAIN_READ, suspect=main_read_suspect)],
        "compiler": [roof("DRAM read-only (XLA jnp.sum)", "DRAM read", 2e10)],
    }
    res = {"machine": "test machine", "roofs": roofs,
           "sweep": {"cache_capacities": [["L2", 1 << 20], ["L3", 16 << 20]]},
           "overhead": overhead or {"dispatch_s": 5e-6, "per_kernel_s": 1e-6},
           "plan": {"probe_bytes": 64 << 20},
           "main_roofs": {"probe": {"value": 3e10, "round_values": [2e10, 3e10, 4e10]},
                          "probe_gemm": {"value": 1.5e11}}}
    if with_hierarchy:
        res["hierarchy"] = {"all_cores": {
            "cache_capacities": CAPS,
            "points": [{"working_set_bytes": s, "bytes_per_s": rate(_bw(s))} for s in SIZES],
            "plateaus": []}}
    return res


def point(working_set, nbytes=1e8, flops=1e6, kernels=3, t=None, rel=0.02):
    return {"flops": flops, "bytes": nbytes, "dtype": "float32",
            "working_set_bytes": float(working_set), "kernels": kernels,
            "timing": rate(1.0 if t is None else t, rel), "flops_per_s": rate(1.0, rel)}


def predicted(peaks_res, ws, factors=None, **kw):
    return points.attach_prediction(point(ws, **kw), peaks_res, factors)["predicted"]


# ------------------------------------------------------------------ prediction_inputs


def test_prediction_inputs_curve_ends_at_main_memorys_read_roof():
    inputs = points.prediction_inputs(peaks_result())
    curve = inputs["curve"]
    kept = [s for s in SIZES if s <= 4 * LLC]
    assert [c[0] for c in curve[:-1]] == kept  # the measured points up to 4x the LLC
    assert [c[1] for c in curve[:-1]] == [_bw(s) for s in kept]
    assert curve[-1] == [max(16 * LLC, 2 * kept[-1]), MAIN_READ]
    assert inputs["cache_capacities"] == CAPS  # the hierarchy's, not the XLA sweep's
    assert inputs["overhead"] == {"dispatch_s": 5e-6, "per_kernel_s": 1e-6}
    assert inputs["probe_bytes"] == 64 << 20
    assert inputs["probe_reference"] == {  # no C read in these rounds: XLA's probe
        "read_bytes_per_s": 3e10, "gemm_flops_per_s": 1.5e11, "read_program": None,
        "xla_read": {"read_bytes_per_s": 3e10, "read_program": None,
                     "values": [2e10, 3e10, 4e10]},
        "rounds": {"read_bytes_per_s": [2e10, 3e10, 4e10], "gemm_flops_per_s": None}}
    assert points.prediction_inputs(inputs) is inputs  # a reduced block passes through


@pytest.mark.parametrize("kw", [{"main_read_suspect": True}, {"with_hierarchy": False}])
def test_no_curve_without_a_trusted_main_read_roof_or_a_hierarchy(kw):
    inputs = points.prediction_inputs(peaks_result(**kw))
    assert inputs["curve"] is None
    assert inputs["cache_capacities"] == [["L2", 1 << 20], ["L3", 16 << 20]]


# ------------------------------------------------------------------ attach_prediction


def test_predicted_time_is_the_floor_plus_the_slower_roof():
    res = peaks_result()
    pred = predicted(res, 1 << 30, nbytes=1e8, flops=1e6, kernels=3)
    floor = 5e-6 + 3 * 1e-6
    assert pred["floor_s"] == pytest.approx(floor)
    assert pred["t_memory_s"] == pytest.approx(1e8 / MAIN_READ)  # past the curve: read roof
    assert pred["t_compute_s"] == pytest.approx(1e6 / 2e11)  # the GEMM roof, not the vector
    assert pred["time_s"] == pytest.approx(floor + 1e8 / MAIN_READ)
    assert pred["bound"] == "memory" and pred["memory_level"] == "DRAM read"
    # compute-bound: many FLOPs, few bytes
    pred = predicted(res, 1 << 30, nbytes=1e3, flops=1e12)
    assert pred["bound"] == "compute" and pred["time_s"] == pytest.approx(floor + 1e12 / 2e11)


def test_at_a_measured_size_the_memory_time_uses_that_points_bandwidth():
    s = SIZES[10]
    assert s < LLC
    pred = predicted(peaks_result(), s)
    assert pred["memory_bytes_per_s"] == pytest.approx(_bw(s))
    assert pred["memory_level"] == "cache (working-set curve)"


def test_overhead_bound_when_the_floor_dominates():
    pred = predicted(peaks_result(), 1 << 20, nbytes=1e3, flops=1e3, kernels=10)
    assert pred["bound"] == "overhead"
    assert pred["time_s"] == pytest.approx(5e-6 + 10e-6 + max(1e3 / _bw(1 << 20), 1e3 / 2e11))
    no_floor = peaks_result(overhead={"dispatch_s": 0.0, "per_kernel_s": 0.0})
    assert predicted(no_floor, 1 << 20, nbytes=1e3, flops=1e3, kernels=10)["bound"] == "memory"


def _log_step(res, ws, eps=0.01):
    a = predicted(res, ws, kernels=0)["time_s"]
    b = predicted(res, ws * (1 + eps), kernels=0)["time_s"]
    return abs(math.log(b / a))


def test_no_cliff_at_the_last_level_cache():
    res = peaks_result()
    for ws in (LLC / 1.01, LLC, 4 * LLC / 1.01, 4 * LLC, 16 * LLC / 1.01):
        assert _log_step(res, ws) < 0.03
    # whereas the level that holds it (no curve) jumps from L3 to main memory
    assert _log_step(peaks_result(with_hierarchy=False), 16 << 20) > 0.5


@settings(max_examples=80, deadline=None)
@given(st.floats(10.0, 34.0))
def test_predicted_time_is_continuous_in_the_working_set(log2_ws):
    """Two working sets 1% apart are predicted within a few % of each other, everywhere."""
    assert _log_step(peaks_result(), 2.0**log2_ws) < 0.03


def test_memory_drift_scales_main_memory_only():
    res = peaks_result()
    slow = {"memory": 0.5, "compute": 1.0}
    inside, beyond = LLC / 2, 8 * LLC
    for ws, factor in ((inside, 1.0), (beyond, 2.0)):
        base = predicted(res, ws)
        drifted = predicted(res, ws, slow)
        assert drifted["t_memory_s"] == pytest.approx(factor * base["t_memory_s"])
        assert drifted["t_compute_s"] == pytest.approx(base["t_compute_s"])
        assert drifted["drift"] == {"memory": 0.5, "compute": 1.0}
    # the compute factor scales the compute time wherever the working set lives
    for ws in (inside, beyond):
        base = predicted(res, ws, flops=1e12)
        drifted = predicted(res, ws, {"memory": 1.0, "compute": 0.8}, flops=1e12)
        assert drifted["t_compute_s"] == pytest.approx(base["t_compute_s"] / 0.8)


def test_memory_drift_scales_main_memory_only_without_a_curve():
    res = peaks_result(with_hierarchy=False)  # the level that holds it; LLC is 16 MiB here
    slow = {"memory": 0.5, "compute": 1.0}
    for ws, factor in ((8 << 20, 1.0), (1 << 30, 2.0)):
        assert predicted(res, ws, slow)["t_memory_s"] == pytest.approx(
            factor * predicted(res, ws)["t_memory_s"])


def test_drift_factors_average_the_probes_over_the_reference():
    ref = {"read_bytes_per_s": 3e10, "gemm_flops_per_s": 1e11}
    before = {"read_bytes_per_s": 2.4e10, "gemm_flops_per_s": 1e11}
    after = {"read_bytes_per_s": 1.8e10, "gemm_flops_per_s": 0.9e11}
    f = points.drift_factors(before, after, ref)
    assert f["memory"] == pytest.approx(0.7) and f["compute"] == pytest.approx(0.95)
    none = points.drift_factors(None, None, ref)
    assert none["memory"] == 1.0 and none["compute"] == 1.0
    no_ref = points.drift_factors(before, after, {"read_bytes_per_s": None})
    assert no_ref["memory"] == 1.0


def _probed(read_before, read_after, gemm=1.5e11):
    """A main-memory point whose probes read `read_before` and `read_after` around it."""
    p = point(1 << 30)
    p["drift"] = {"before": {"read_bytes_per_s": read_before, "gemm_flops_per_s": gemm},
                  "after": {"read_bytes_per_s": read_after, "gemm_flops_per_s": gemm}}
    return p


def test_the_c_read_is_the_probes_reference_when_the_rounds_have_it(monkeypatch):
    res = peaks_result()
    c_read = {"program": "C read (gcc, 2 threads)", "values": [3.1e10, 4.4e10, 4.3e10],
              "median": 4.3e10}
    res["main_roofs"]["main_read"] = {"programs": [
        {"program": "XLA read (jnp.sum)", "values": [1e10], "median": 1e10}, c_read]}
    ref = points.prediction_inputs(res)["probe_reference"]
    assert ref["read_bytes_per_s"] == 4.3e10 and ref["read_program"] == c_read["program"]
    assert ref["rounds"]["read_bytes_per_s"] == c_read["values"]
    assert points.c_read_program(res["main_roofs"]) is c_read
    assert points.c_read_program({}) is None
    # points measured where gcc is missing: XLA's probe, against its own round values
    res["main_roofs"]["probe"]["program"] = "XLA read probe"
    inputs = points.prediction_inputs(res)
    monkeypatch.setattr(native, "available", lambda: False)
    assert "XLA read probe" in points.make_probe(inputs).name
    ref = inputs["probe_reference"]
    assert ref["read_bytes_per_s"] == 3e10 and ref["read_program"] == "XLA read probe"
    assert ref["rounds"]["read_bytes_per_s"] == [2e10, 3e10, 4e10]


def test_predictions_use_the_probe_programs_read_level_when_another_program_is_the_roof():
    """XLA's read reached the roof (4e10) but the probes run the C read (median 3.2e10 in the
    rounds): predictions scale the C read's own level, the roof drawn in peaks is unchanged,
    and the summary says which level the points were predicted at."""
    from microbench.plots import summary

    res = peaks_result()
    roof = next(r for r in res["roofs"]["memory"] if r["level"] == "DRAM read")
    roof["program"] = "XLA read (jnp.sum)"
    c_read = {"program": "C read (gcc, 2 threads)", "values": [3.0e10, 3.2e10, 4.2e10],
              "median": 3.2e10, "min": 3.0e10, "max": 4.2e10, "spread": 0.375}
    res["main_roofs"]["main_read"] = {"programs": [
        {"program": "XLA read (jnp.sum)", "values": [4e10], "median": 4e10}, c_read]}
    inputs = points.prediction_inputs(res)
    used = next(r for r in inputs["roofs"]["memory"] if r["level"] == "DRAM read")
    assert used["value"] == 3.2e10 and used["program"] == c_read["program"]
    assert (used["p10"], used["p90"]) == (3.0e10, 4.2e10) and roof["value"] == MAIN_READ
    assert inputs["read_level"] == {"program": c_read["program"], "value": 3.2e10,
                                    "roof_program": "XLA read (jnp.sum)", "roof_value": 4e10}
    cold = {**point(1 << 30), "cold": True}
    pred = points.attach_prediction(cold, res)["predicted"]
    assert pred["memory_bytes_per_s"] == pytest.approx(3.2e10)
    # the C read the roof itself: nothing replaced
    roof["program"] = c_read["program"]
    assert points.prediction_inputs(res)["read_level"] is None
    assert points.attach_prediction({**point(1 << 30), "cold": True}, res)["predicted"][
        "memory_bytes_per_s"] == pytest.approx(MAIN_READ)
    line = summary.probe_lines({"points": [], "peaks": {
        "probe_reference": {"probe": "C read probe", "read_bytes_per_s": 3.2e10},
        "read_level": inputs["read_level"]}})[0]
    assert "predicted at the probe's program's read level: C read (gcc, 2 threads) 32.0" in line
    assert "XLA read (jnp.sum), read 40.0 (1.25x)" in line


def test_repredict_takes_each_factor_over_the_neighbouring_points_probes():
    res = peaks_result()
    inputs = points.prediction_inputs(res)  # read probe reference 3e10
    reads = [3e10, 3e10, 1.5e10, 3e10, 3e10, 1.5e10, 1.5e10, 1.5e10, 1.5e10]
    measured = [points.attach_prediction(_probed(r, r), res) for r in reads]
    unscaled = predicted(res, 1 << 30)["t_memory_s"]
    points.repredict(measured, inputs, window=1)
    # each point: the median over itself and one neighbour each side (two at the ends)
    want = [1.0, 1.0, 1.0, 1.0, 1.0, 0.5, 0.5, 0.5, 0.5]
    for p, w, n in zip(measured, want, [2, 3, 3, 3, 3, 3, 3, 3, 2], strict=True):
        assert p["drift"]["memory"] == pytest.approx(w) and p["drift"]["window"] == n
        assert p["predicted"]["t_memory_s"] == pytest.approx(unscaled / w)
        assert p["drift"]["before"]["read_bytes_per_s"] in reads  # the point's own kept
    unprobed = points.attach_prediction(point(1 << 30), res)
    before = dict(unprobed["predicted"])
    points.repredict([unprobed], inputs)
    assert unprobed["predicted"] == before


def _timed(ratio, ws=1 << 30, rel=0.02, **kw):
    """A point whose measured median makes measured/predicted == ratio."""
    res = peaks_result()
    t_pred = predicted(res, ws, **kw)["time_s"]
    return points.attach_prediction(point(ws, t=t_pred / ratio, rel=rel, **kw), res)


def test_faster_than_the_roof_beyond_the_spreads_is_suspect():
    p = _timed(1.5)
    assert p["measured_over_predicted"] == pytest.approx(1.5)
    assert p["suspect"] is True and "faster than its roof" in p["reason"]
    # within the roof's (5% x 2 -> 0.10) and the point's (0.04) spreads: not suspect, in band
    p = _timed(1.12)
    assert p["suspect"] is False and p["reason"] is None
    assert "outside_reason" not in p
    # just beyond both spreads
    assert _timed(1.15)["suspect"] is True


def test_a_moe_point_is_predicted_again_with_the_experts_it_touched():
    """A MoE point whose tokens touched fewer experts than the count expects reads fewer
    bytes: measured/predicted is taken again over the experts it touched (the same roofs), and
    a point faster than its counted roof says so instead of guessing at caching."""
    res = peaks_result()
    nbytes, expert_bytes = 1e8, 8e7  # 80% of the counted bytes are the experts' weights
    t_pred = predicted(res, 1 << 30, nbytes=nbytes)["time_s"]
    p = point(1 << 30, nbytes=nbytes, t=t_pred / 1.4)  # 1.4x faster than counted
    p["experts"] = {"touched": [2, 3, 2, 4], "mean": 2.75, "counted": 3.5,
                    "counted_bytes": expert_bytes}
    p = points.attach_prediction(p, res)
    read = nbytes - expert_bytes * (1 - 2.75 / 3.5)
    want = predicted(res, 1 << 30, nbytes=read)["time_s"] / p["timing"]["median"]
    assert p["measured_over_predicted"] == pytest.approx(1.4)
    assert p["experts"]["measured_over_predicted"] == pytest.approx(want)
    assert want == pytest.approx(1.4 * read / nbytes, rel=0.02)  # memory-bound: bytes scale it
    assert p["suspect"] is True and "touched 2.75 experts per layer" in p["reason"]
    assert f"{want:.2f}" in p["reason"] and f"{want:.2f}" in p["outside_reason"]
    # tokens that touched what the count expects: their routing is no reason, the old one stays
    q = point(1 << 30, nbytes=nbytes, t=t_pred / 1.4)
    q["experts"] = {"touched": [2, 2], "mean": 2.0, "counted": 2.0, "counted_bytes": expert_bytes}
    q = points.attach_prediction(q, res)
    assert q["suspect"] is True and "cached" in q["reason"] and "touched" not in q["reason"]
    assert "touched" not in q["outside_reason"]
    # without the experts' bytes (a model with dense FFN layers too): the counted reason stays
    p["experts"] = {**p["experts"], "counted_bytes": None}
    p.pop("outside_reason")
    p["experts"].pop("measured_over_predicted")
    p = points.attach_prediction(p, res)
    assert "measured_over_predicted" not in p["experts"] and "cached" in p["reason"]


def test_a_point_with_its_ops_is_predicted_per_op():
    """A phase point that carries its counted ops is predicted as the sum of each op's
    roofline time at the point's roofs; its experts' re-prediction moves the experts' ops."""
    res = peaks_result()
    p = point(1 << 30, nbytes=5.3e9, flops=2e10, t=1.0)  # 0.1 s of compute, 0.13 of memory
    ops = {"ffn_up": {"flops": 1.5e10, "bytes": 2e8, "weight_bytes": 2e8},
           "ffn_down": {"flops": 0.5e10 - 1e6, "bytes": 1e8, "weight_bytes": 1e8},
           "attn": {"flops": 1e6, "bytes": 5e9, "weight_bytes": 0.0}}
    whole = points.attach_prediction(dict(p), res)["predicted"]
    p["ops"] = ops
    got = points.attach_prediction(p, res)["predicted"]
    c, m = got["compute_flops_per_s"], got["memory_bytes_per_s"]
    want = got["floor_s"] + sum(max(o["flops"] / c, o["bytes"] / m) for o in ops.values())
    assert got["per_op"] is True and got["time_s"] == pytest.approx(want)
    assert got["time_s"] > whole["time_s"] * 1.2  # compute and memory no longer overlap
    assert p["measured_over_predicted"] == pytest.approx(want / 1.0)
    # outside the band (measured 1 s), its compiler-level reason is per op too: the same sum
    # with the memory roof at XLA's own read (2e10)
    assert got["bound"] == "memory" and got["memory_level"] == "DRAM read"
    at_xla = got["floor_s"] + sum(max(o["flops"] / c, o["bytes"] / 2e10) for o in ops.values())
    assert f"against it measured/predicted = {at_xla:.2f}" in p["outside_reason"]
    # the experts it touched: 2 of the 3 counted, so a third of the ffn ops' weight bytes
    p["experts"] = {"touched": [2], "mean": 2.0, "counted": 3.0, "counted_bytes": 3e8}
    p = points.attach_prediction(p, res)
    fewer = {k: {**o, "bytes": o["bytes"] - o["weight_bytes"] / 3} for k, o in ops.items()}
    want_t = got["floor_s"] + sum(max(o["flops"] / c, o["bytes"] / m) for o in fewer.values())
    assert p["experts"]["measured_over_predicted"] == pytest.approx(want_t)


def _has_number(text):
    return re.search(r"\d+(\.\d+)?", text) is not None


def test_outside_the_band_carries_a_reason_naming_a_measured_number():
    fast = _timed(1.5)
    assert "1.50" in fast["outside_reason"]
    slow = _timed(0.5)  # memory-bound in main memory, XLA's own read reaches 20 GB/s
    assert not slow["suspect"]
    assert "XLA's own" in slow["outside_reason"] and "20.0 GB/s" in slow["outside_reason"]
    floor_heavy = _timed(0.5, ws=1 << 16, nbytes=1e3, flops=1e3, kernels=20)
    assert "per-call floor" in floor_heavy["outside_reason"]
    assert "20 kernels" in floor_heavy["outside_reason"]
    for p in (fast, slow, floor_heavy):
        assert _has_number(p["outside_reason"])
    # just inside the band: no reason
    for ratio in (0.76, 1.0, 1.24):
        assert "outside_reason" not in _timed(ratio)
    assert "outside_reason" in _timed(0.74) and "outside_reason" in _timed(1.26)


def test_reattaching_inside_the_band_drops_an_old_reason():
    p = _timed(0.5)
    assert "outside_reason" in p
    p["timing"] = rate(p["predicted"]["time_s"])
    points.attach_prediction(p, peaks_result())
    assert "outside_reason" not in p and p["measured_over_predicted"] == pytest.approx(1.0)


# ------------------------------------------------------------------ derive_roofs, flag_points


def test_synthetic_result_without_rounds_takes_stream_as_main_memory():
    res = synthetic.result()
    mem = {r["level"]: r for r in res["roofs"]["memory"]}
    assert set(mem) == {"L1", "L2", "L3", "DRAM"}
    assert mem["DRAM"]["source"].startswith("STREAM")
    assert mem["DRAM"]["value"] == pytest.approx(synthetic.LEVEL_BW["DRAM"] / 1.01)
    assert all(r["memory"] == "DRAM" for r in res["roofs"]["ridges"])
    ridge = next(r for r in res["roofs"]["ridges"] if r["compute"] == "GEMM float32")
    assert ridge["flops_per_byte"] == pytest.approx(2e11 / synthetic.LEVEL_BW["DRAM"])
    # and a phase prediction works on it: the L3 roof in cache, DRAM beyond
    pt = points.attach_prediction(point(8 << 20), res)
    assert pt["predicted"]["memory_level"] == "L3"
    pt = points.attach_prediction(point(1 << 30), res)
    assert pt["predicted"]["memory_level"] == "DRAM"


def _rounds_block(read_values, rw_values=(30e9, 31e9), gemm=(1.5e11, 1.6e11)):
    table = {("gemm_float32", "XLA GEMM", True): list(gemm),
             ("gemm_float32", "numpy matmul", False): [1.0e11, 1.1e11],
             ("main_rw", "XLA in-place scale", True): [25e9, 26e9],
             ("main_rw", "C triad", False): list(rw_values),
             ("main_read", "XLA read (jnp.sum)", True): [20e9, 21e9],
             ("main_read", "C read", False): list(read_values)}
    rs = []
    for i in range(2):
        progs = [{"metric": m, "program": p, "ours": o, "amount": 1.0, "seconds": [1.0 / v[i]],
                  "value": v[i]} for (m, p, o), v in table.items()]
        rs.append({"round": i, "t_start": float(i), "t_end": i + 0.5, "programs": progs,
                   "skipped": []})
    return rounds.derive(rs)


def _with_rounds(read_values, l3=(9e10, 0.02), dram_array_bytes=None):
    res = copy.deepcopy(synthetic.result())
    res["main_roofs"] = _rounds_block(read_values)
    if dram_array_bytes is not None:
        res.setdefault("plan", {})["dram_array_bytes"] = dram_array_bytes
    plats = [{"name": n, "bytes_per_s": v, "p10": v * (1 - r), "p90": v * (1 + r),
              "lo_bytes": lo, "hi_bytes": hi}
             for n, v, r, lo, hi in (("L1", 3e11, 0.02, 16e3, 64e3), ("L2", 1.5e11, 0.02, 1e5,
                                                                       2e6),
                                     ("L3", *l3, 4e6, 32e6))]
    res["hierarchy"] = {"all_cores": {"program": "C read (test)", "plateaus": plats,
                                      "cache_capacities": CAPS, "points": []},
                        "checks": []}
    spec = hardware.device_from_dict(res["spec"])
    res["roofs"] = peaks.derive_roofs(res, spec)
    return res


def test_derive_roofs_with_rounds_labels_each_main_roof_with_its_program():
    res = _with_rounds([40e9, 42e9])
    comp = {r["name"]: r for r in res["roofs"]["compute"]}
    assert comp["GEMM float32"]["program"] == "XLA GEMM"
    assert comp["GEMM float32"]["value"] == pytest.approx(np.median([1.5e11, 1.6e11]))
    mem = {r["level"]: r for r in res["roofs"]["memory"]}
    assert mem["DRAM read"]["program"] == "C read" and not mem["DRAM read"]["suspect"]
    assert mem["DRAM read"]["value"] == pytest.approx(41e9)
    assert mem["DRAM"]["program"] == "C triad"
    assert mem["L3"]["program"] == "C read (test)"  # caches from the native sweep
    assert "STREAM" not in mem["DRAM"]["source"]
    compiler = {r["name"]: r["value"] for r in res["roofs"]["compiler"]}
    assert compiler["DRAM read-only (XLA jnp.sum)"] == pytest.approx(20.5e9)
    assert compiler["GEMM float32 (XLA)"] == pytest.approx(1.55e11)
    assert {r["memory"] for r in res["roofs"]["ridges"]} == {"DRAM", "DRAM read-only"}
    checks = res["hierarchy"]["checks"]
    assert checks[-1]["larger"] == "DRAM read-only" and checks[-1]["ok"]


def test_main_read_faster_than_the_last_cache_is_flagged_and_not_a_ridge():
    # DRAM read at 95 GB/s, L3 at 50, the read's array only 2x the last-level cache: it may
    # have been served by the cache, so the read roof is the suspect
    llc = max(c for _, c in CAPS)
    res = _with_rounds([95e9, 96e9], l3=(5e10, 0.02), dram_array_bytes=2 * llc)
    read = next(r for r in res["roofs"]["memory"] if r["level"] == "DRAM read")
    assert read["suspect"] and "faster than the smaller L3" in read["reason"]
    l3 = next(r for r in res["roofs"]["memory"] if r["level"] == "L3")
    assert not l3["suspect"]
    assert res["hierarchy"]["checks"][-1]["flagged"] == read["name"]
    assert {r["memory"] for r in res["roofs"]["ridges"]} == {"DRAM"}
    assert points.prediction_inputs(res)["curve"] is None  # nothing trusted to end it at


def test_a_cache_plateau_slower_than_a_big_array_read_is_the_flagged_one():
    """The read roof's array is 16x the last-level cache (no cache could have served it):
    the plateau below it is flagged instead, and cold points keep the read-only roof."""
    llc = max(c for _, c in CAPS)
    res = _with_rounds([60e9, 61e9], l3=(4e10, 0.02), dram_array_bytes=16 * llc)
    mem = {r["level"]: r for r in res["roofs"]["memory"]}
    assert mem["L3"]["suspect"] and "reads slower than main memory" in mem["L3"]["reason"]
    assert not mem["DRAM read"]["suspect"]
    check = res["hierarchy"]["checks"][-1]
    assert not check["ok"] and check["flagged"] == "L3"
    assert "DRAM read-only" in {r["memory"] for r in res["roofs"]["ridges"]}
    pt = points.attach_prediction(point(1 << 30), res)
    assert pt["predicted"]["memory_level"] == "DRAM read"
    # the same plateau under a read roof whose array was small: the read is the suspect
    small = _with_rounds([60e9, 61e9], l3=(4e10, 0.02), dram_array_bytes=8 * llc)
    assert next(r for r in small["roofs"]["memory"] if r["level"] == "DRAM read")["suspect"]


def test_flag_points_flags_only_points_above_their_roof():
    res = copy.deepcopy(synthetic.result())
    rw = next(r for r in res["roofs"]["memory"] if r["level"] == "DRAM")
    ai = res["intensity"]["points"]
    low = min(ai, key=lambda p: p["flops_per_byte"])
    bound = rw["value"] * low["flops_per_byte"] * (1 + (rw["p90"] - rw["p10"]) / rw["value"])
    low["flops_per_s"]["median"] = 1.2 * bound  # memory-side point far above I x DRAM
    big = [p for p in res["sweep"]["points"] if p["working_set_bytes"] >= 4 * LLC]
    assert big
    big[0]["bytes_per_s"]["median"] = 3 * rw["value"]  # a "DRAM" sweep point above the roof
    small = next(p for p in res["sweep"]["points"] if p["working_set_bytes"] < 4 * LLC)
    small["bytes_per_s"]["median"] = 3 * rw["value"]  # in cache: allowed to be fast
    peaks.flag_points(res)
    assert low["suspect"] and "above its roof" in low["reason"]
    assert big[0]["suspect"] and "not a main-memory figure" in big[0]["reason"]
    assert not small["suspect"]
    others = [p for p in ai if p is not low] + big[1:]
    assert not any(p["suspect"] for p in others)


@pytest.mark.parametrize("with_hierarchy", [True, False])
def test_a_cold_point_is_predicted_at_main_memory_whatever_its_working_set(with_hierarchy):
    """Timed cold (caches evicted before every call), a phase's bytes come from main memory:
    an L2- or L3-sized working set gets main memory's read roof, not the curve's cache
    speed; the same point timed warm gets the cache's."""
    res = peaks_result(with_hierarchy=with_hierarchy)
    for ws in (256 << 10, 8 << 20, 1 << 30):
        cold = points.attach_prediction({**point(ws), "cold": True}, res)["predicted"]
        warm = predicted(res, ws)
        assert cold["memory_bytes_per_s"] == pytest.approx(MAIN_READ)
        assert cold["memory_level"] == "DRAM read" and "cold" in cold["memory_roof"]
        if ws < 16 << 20:
            assert warm["memory_bytes_per_s"] > 2 * MAIN_READ


def test_a_cold_point_pays_the_cold_floor():
    """A cold point's floor is the cold dispatch and per-kernel cost (microbench.roofs.overhead),
    a warm point's the warm one: the same kernels, the floor each way of timing meets."""
    oh = {"dispatch_s": 5e-6, "per_kernel_s": 1e-6, "cold_dispatch_s": 8e-5,
          "cold_per_kernel_s": 4e-6}
    res = peaks_result(overhead=oh)
    p = {**point(1 << 30), "kernels": 10}
    cold = points.attach_prediction({**p, "cold": True}, res)["predicted"]
    warm = points.attach_prediction(dict(p), res)["predicted"]
    assert cold["floor_s"] == pytest.approx(8e-5 + 10 * 4e-6)
    assert warm["floor_s"] == pytest.approx(5e-6 + 10 * 1e-6)
    assert cold["time_s"] - warm["time_s"] == pytest.approx(cold["floor_s"] - warm["floor_s"])


def test_a_reason_names_the_op_that_loses_the_most_time_not_the_slowest(monkeypatch):
    """The largest op can run at its roof while the gap sits in another: the breakdown keeps
    the op whose time exceeds its own roofline time (at the point's roofs) the most."""
    from microbench.phases import breakdown
    from microbench.plots import claims

    def row(op, t, flops, nbytes):
        return {"op": op, "time_s": t, "share": t / 3e-3, "flops": flops, "bytes": nbytes,
                "intensity": flops / nbytes if nbytes else None,
                "gflops_per_s": flops / t / 1e9, "gbytes_per_s": nbytes / t / 1e9}

    # big: 6e7 B in 2.0 ms, near its roof; small: 3e6 B in 1.0 ms, ~10x its roof
    rows = [row("big", 2e-3, 1e6, 6e7), row("small", 1e-3, 1e5, 3e6)]
    monkeypatch.setattr(breakdown, "measure_breakdown", lambda *a, **k: {
        "rows": rows, "unattributed_share": 0.0, "method": "test"})
    res = peaks_result()
    p = points.attach_prediction({**point(1 << 30, nbytes=6.3e7, flops=1.1e6, t=3e-3),
                                  "phase": "decode", "batch": 1, "context": 8}, res)
    assert "outside_reason" in p
    points.attach_breakdown(p, None, res)
    top = p["breakdown"]["top"]
    assert top["op"] == "small"
    bw = p["predicted"]["memory_bytes_per_s"]
    assert top["roof_s"] == pytest.approx(3e6 / bw) and top["lost_s"] == pytest.approx(
        1e-3 - 3e6 / bw)
    big = p["breakdown"]["rows"][0]
    assert big["op"] == "big" and big["lost_s"] < top["lost_s"]
    assert "most time lost in small: 1.00 ms" in p["outside_reason"]
    assert claims.short_reason(p["outside_reason"]).startswith("most time lost in small")
