"""Measured phase points: prefill, decode attention, decode FFN and the whole decode step.

Regime: each phase of the reference model (`refmodel.Phases`) is compiled alone and timed with
the harness at a given batch and context; its FLOPs and bytes come from the analytic cost
model (`refmodel.costs.phase_costs`) of the very same phase, so the measured point (achieved
FLOP/s at the counted intensity) and the predicted point sit on one roofline. The prediction
uses what `peaks` measured on the same machine (`prediction_inputs`):

    t_predicted = floor + sum over the phase's ops of
                  max(FLOPs_op / (GEMM roof x c), bytes_op / (curve(working set) x m))
    measured / predicted = t_predicted / t_measured   (1.0 = on the roof; 0.5 = half of it)

  * per op (`roofline.predict` with the cost model's ops): the ops of a compiled phase run one
    after another, so a compute-bound FFN does not hide a memory-bound attention's time. The
    whole phase's max(FLOPs / C, bytes / M), the bound only a program overlapping the two
    could reach, is kept as `t_overlap_s`; the two differ only for phases that mix both kinds
    of op (a GQA decode step at a large batch), and there the per-op sum is the closer one.

  * curve: for a warm point, the all-core read bandwidth at the phase's working-set size
    (weights + cache + activations), interpolated on the measured working-set curve
    (microbench.roofs.hierarchy), so the predicted time is continuous in bytes: no jump between
    cache levels. Past the curve, main memory's read-only roof. (Without a native curve: the
    level that holds it.) A cold point is predicted at main memory's read-only roof whatever
    its working set. The arithmetic, the roofs chosen and the levels are microbench.roofline's.
  * floor: the measured dispatch cost plus the measured cost per kernel times the kernels of
    this compiled phase (microbench.roofs.overhead); for a cold point both measured cold (the
    runtime's and the kernels' code and data come from main memory: an order of magnitude
    above the warm costs).
  * c, m: drift factors from the probes run just before and after the point
    (microbench.roofs.probe: the C read of the roof rounds' array and XLA's GEMM) over their
    medians in the roof rounds; a sweep predicts its points again once all are measured,
    each with the median over its neighbours' probes (`repredict`); m applies to working
    sets beyond the last-level cache (main memory is what drifts).

Decode phases are timed cold (`cold`, default): an `Evictor` reads a buffer of 4x the last-level
cache before every call, outside the clock. Inside a real decode step a layer's weights and
cache have been pushed out of the caches by every other layer's before it runs again, so a
phase timed warm, repeating with a working set that fits the last-level cache, would measure
a speed no step sees. Prefill, compute-bound, is timed warm. A point says how it was
timed; a point above its roof by more than the roof's spread is flagged suspect, and a point
outside +/-25% of its prediction carries a measured reason (`explain`).

The timed callable is `phases.jitted[phase]`, the object the compiler cross-check lowers too.
Arguments come from `Phases.example_args` (the same the cross-check lowers): decode phases run
on a cache of `context + 1` slots filled with random values at position `context`; the harness
feeds each call's cache into the next (donated, in place), so repeated calls keep writing the
last slot and every call does the work of one step at that context.
"""

from __future__ import annotations

import numpy as np

import refmodel
from microbench import harness, roofline
from microbench.phases import breakdown
from microbench.phases.timing import DEFAULT_BUDGET, Budget, describe, evictor
from microbench.roofs import overhead
from refmodel import costs, moe
from refmodel.phases import donation

BAND = roofline.BAND  # measured / predicted within this band: "on its prediction"


def working_set_bytes(cfg: refmodel.ModelConfig, phase: str, batch: int, context: int,
                      counted: dict) -> float:
    """Bytes the phase keeps touching call after call: its weights, its cache and activations
    (the counted weight and activation bytes, and the cache's whole size)."""
    cache = 0.0
    if phase != "decode_ffn":
        slots = context if phase == "prefill" else context + 1
        cache = costs.kv_cache_bytes(cfg, slots, batch, counted["dtypes"]["kv"])
    return counted["weight_bytes"] + counted["act_bytes"] + cache


def memory_bytes(cfg: refmodel.ModelConfig, phase: str, batch: int, context: int) -> float:
    """About the bytes measuring one point holds at once, from the cost model, before anything
    is allocated: the working set (weights, activations, the cache) plus a second cache, the
    filled or donated copy that exists beside it while the point is set up and timed."""
    counted = costs.phase_costs(cfg, phase, batch, context)
    ws = working_set_bytes(cfg, phase, batch, context, counted)
    return ws + (ws - counted["weight_bytes"] - counted["act_bytes"])


def prediction_inputs(peaks: dict) -> dict:
    """What a prediction needs from a peaks result (phases.json keeps exactly this): roofs,
    cache capacities, the working-set curve ending at main memory's read roof, the per-call
    overhead and the probes' reference values."""
    if "curve" in peaks:  # already reduced (a phases.json's "peaks" block)
        return peaks
    roofs = peaks["roofs"]
    caps = peaks.get("sweep", {}).get("cache_capacities") or []
    hier = peaks.get("hierarchy")
    curve = None
    mr = peaks.get("main_roofs") or {}
    probe, c_read = mr.get("probe") or {}, c_read_program(mr)
    main_read = roofline.main_roof(roofs["memory"], roofline.READ)
    read_level = None
    if main_read and c_read and main_read.get("program") not in (None, c_read["program"]):
        roofs, read_level = at_probe_level(roofs, main_read, c_read)
        main_read = roofline.main_roof(roofs["memory"], roofline.READ)
    if hier and main_read:
        curve = roofline.working_set_curve(hier["all_cores"], main_read)
        caps = hier["all_cores"]["cache_capacities"]
    read = c_read or {"program": probe.get("program"), "median": probe.get("value"),
                      "values": probe.get("round_values")}
    return {"machine": peaks["machine"], "roofs": roofs, "read_level": read_level,
            "cache_capacities": caps,
            "curve": curve, "overhead": peaks.get("overhead"),
            "probe_bytes": (peaks.get("plan") or {}).get("probe_bytes"),
            "dram_array_bytes": (peaks.get("plan") or {}).get("dram_array_bytes"),
            "probe_reference": {
                "read_bytes_per_s": read.get("median"),
                "gemm_flops_per_s": (mr.get("probe_gemm") or {}).get("value"),
                "read_program": read.get("program"),
                "xla_read": {"read_bytes_per_s": probe.get("value"),
                             "read_program": probe.get("program"),
                             "values": probe.get("round_values")},
                "rounds": {"read_bytes_per_s": read.get("values"),
                           "gemm_flops_per_s": (mr.get("probe_gemm") or {}).get("round_values")}}}


def at_probe_level(roofs: dict, roof: dict, prog: dict) -> tuple[dict, dict]:
    """The roofs a prediction uses when main memory's read roof was reached by another program
    than the drift probe's (the C read): that roof at the probe program's own level in the
    rounds (its median, min and max), so a point's drift factor (probe now / the probe's
    median in the rounds) scales the program it measures and no ratio between two programs
    enters the prediction: two programs reading the same memory in the same rounds can differ
    by tens of percent, and scaling one's roof by the other's probes would carry that ratio
    into every point. Where the C read is the roof nothing changes. Returns (roofs, {program,
    value, roof_program, roof_value})."""
    values = prog.get("values") or [prog["median"]]  # a result saved before min / max were kept
    lo, hi = prog.get("min", min(values)), prog.get("max", max(values))
    level = {**roof, "value": prog["median"], "p10": lo, "p90": hi,
             "spread": prog.get("spread", (hi - lo) / prog["median"]), "program": prog["program"],
             "source": f"{prog['program']}, median of its rounds (the drift probe's program; "
                       f"the roof, {roof.get('program')}, read {roof['value'] / 1e9:.1f} GB/s)"}
    memory = [level if r is roof else r for r in roofs["memory"]]
    return {**roofs, "memory": memory}, {
        "program": prog["program"], "value": prog["median"],
        "roof_program": roof.get("program"), "roof_value": roof["value"]}


def c_read_program(main_roofs: dict) -> dict | None:
    """The C read's entry among the rounds' main-memory read programs (None without gcc)."""
    for prog in (main_roofs.get("main_read") or {}).get("programs") or []:
        if prog.get("program", "").startswith("C read") and prog.get("median"):
            return prog
    return None


def make_probe(inputs: dict):
    """The drift probe for these roofs (None when the peaks had no rounds): the C read over
    the rounds' array when the reference is the C read's, else XLA's read probe, whose own
    round values then become the reference (peaks measured where gcc was, points where it
    is not)."""
    ref = inputs["probe_reference"]
    if not inputs.get("probe_bytes") or not ref.get("read_bytes_per_s"):
        return None
    from microbench.roofs import native, probe

    if (ref.get("read_program") or "").startswith("C read"):
        if native.available() and inputs.get("dram_array_bytes"):
            return probe.Probe(reader=native.Server(inputs["dram_array_bytes"] // 4,
                                                    read_only=True))
        xla = ref.get("xla_read") or {}
        if not xla.get("read_bytes_per_s"):
            return None
        ref.update(read_bytes_per_s=xla["read_bytes_per_s"], read_program=xla["read_program"])
        ref["rounds"] = {**ref["rounds"], "read_bytes_per_s": xla["values"]}
    import jax.numpy as jnp

    return probe.Probe(jnp.asarray(probe.host_array(inputs["probe_bytes"] // 4)))


PROBE_KEYS = ("read_bytes_per_s", "gemm_flops_per_s")
WINDOW = 5  # a sweep's point takes the median of the probes of the 2 x 5 + 1 points around it


def repredict(measured: list[dict], inputs: dict, window: int = WINDOW) -> list[dict]:
    """Predict every probed point of a sweep again, its drift factors the median over the
    points measured around it (`window` each side, in measurement order) of their probes'
    mean over the reference: a probe is a few hundred milliseconds, and where the bandwidth
    moves within a second a point's own two probes catch its moment's level no better than
    its neighbours' (summary.md reports how well a point's probe before it agrees with the one
    after it). Points without probes keep their predictions."""
    ref = inputs["probe_reference"]
    probed = [p for p in measured if "predicted" in p and (p.get("drift") or {}).get("before")]
    means = [{k: np.mean([p["drift"][s][k] for s in ("before", "after") if p["drift"].get(s)])
              for k in PROBE_KEYS} for p in probed]
    for i, p in enumerate(probed):
        near = means[max(0, i - window):i + window + 1]
        factors = {**p["drift"], "window": len(near)}
        for key, name in (("read_bytes_per_s", "memory"), ("gemm_flops_per_s", "compute")):
            if ref.get(key):
                factors[name] = float(np.median([m[key] for m in near])) / ref[key]
        p["drift"] = factors
        attach_prediction(p, inputs, factors)
    return measured


def drift_factors(before: dict | None, after: dict | None, reference: dict) -> dict:
    """Probe now / probe during the rounds, averaged over before and after the point."""
    out = {"memory": 1.0, "compute": 1.0, "before": before, "after": after}
    probes = [p for p in (before, after) if p]
    for key, ref_key, name in (("read_bytes_per_s", "read_bytes_per_s", "memory"),
                               ("gemm_flops_per_s", "gemm_flops_per_s", "compute")):
        ref = reference.get(ref_key)
        if probes and ref:
            out[name] = sum(p[key] for p in probes) / len(probes) / ref
    return out


def measure_point(phases: refmodel.Phases, phase: str, batch: int, context: int,
                  peaks: dict | None, timing: Budget = DEFAULT_BUDGET, label: str | None = None,
                  probe=None, cold: bool | None = None) -> dict:
    """Time one phase at (batch, context) and put it beside its counted and predicted cost.
    With a `probe` (microbench.roofs.probe.Probe), the roofs are scaled to this moment's drift (a
    sweep then predicts again from the neighbours' probes and adds the per-op breakdowns of
    the points outside the band: microbench.phases.sweeps.measure). `cold` (default: the decode
    phases) evicts the caches before every call (`evictor`)."""
    cfg = phases.cfg
    cold = phase != "prefill" if cold is None else cold
    counted = costs.phase_costs(cfg, phase, batch, context)
    args = phases.example_args(phase, batch, context, fill=True)
    donate, carry = donation(phase)
    compiled = phases.jitted[phase].lower(*args).compile()  # the callable the check lowers
    before = probe.measure() if probe is not None else None
    t = harness.time_fn(compiled, *args, donate_argnums=donate, carry=carry,
                        budget_s=timing.budget_s, min_samples=timing.min_samples,
                        target_cv=timing.target_cv, min_sample_s=timing.min_sample_s,
                        before=evictor() if cold else None)
    after = probe.measure() if probe is not None else None
    tokens = batch * (context if phase == "prefill" else 1)
    point = {
        "label": label or describe(cfg), "model": cfg.name, "attention": cfg.attention,
        "layer_pattern": list(cfg.layer_pattern) if cfg.layer_pattern else None,
        "ffn": cfg.ffn,
        "mla_absorb": cfg.mla_absorb if "mla_absorb" in _option_fields(cfg) else None,
        "phase": phase, "batch": batch, "context": context, "tokens": tokens,
        "dtype": cfg.dtype, "backend": cfg.backend, **{k: counted[k] for k in (
            "flops", "bytes", "weight_bytes", "kv_bytes", "act_bytes", "intensity")},
        "ops": counted["ops"], "timing": t.to_dict(),
        "flops_per_s": harness.rates(counted["flops"], t),
        "bytes_per_s": harness.rates(counted["bytes"], t),
        "tokens_per_s": harness.rates(tokens, t),
        "working_set_bytes": working_set_bytes(cfg, phase, batch, context, counted),
        "kernels": overhead.count_kernels(compiled)["kernels"], "cold": cold,
    }
    experts = experts_record(phases, phase, args, counted)
    if experts:
        point["experts"] = experts
    del args, compiled
    if peaks is not None:
        inputs = prediction_inputs(peaks)
        llc = roofline.last_level_bytes(inputs.get("cache_capacities"))
        ws = point["working_set_bytes"] / 2**20
        point["timed"] = (
            f"cold: the caches were evicted before every call ({evictor().nbytes / 2**20:.0f} "
            f"MiB read), as a real step's other layers evict this one's data: its {ws:.1f} MiB "
            "stream from main memory" if cold else
            f"warm: working set {ws:.1f} MiB fits the {llc / 2**20:.0f} MiB last-level cache, "
            "so repeated calls find it cached" if point["working_set_bytes"] <= llc else
            f"warm, but its working set {ws:.1f} MiB exceeds the {llc / 2**20:.0f} MiB "
            "last-level cache: it streams from main memory every call")
        factors = drift_factors(before, after, inputs["probe_reference"])
        point["drift"] = factors
        attach_prediction(point, inputs, factors)
    return point


def experts_record(phases: refmodel.Phases, phase: str, args: tuple, counted: dict) -> dict:
    """For decode_ffn of a model with MoE layers: the experts its B tokens touched in each
    layer (routed as it runs), the count's expectation, and the experts' counted weight bytes
    (ffn_up + ffn_down, every FFN layer MoE; else None): a point's routing can touch fewer or
    more experts than the expectation, and then reads fewer or more bytes than counted."""
    cfg = phases.cfg
    if phase != "decode_ffn" or "moe" not in cfg.layer_ffns:
        return {}
    x = args[1]
    touched = phases.experts_touched(x)
    ops = counted["ops"]
    every = len(touched) == cfg.n_layers and "ffn_up" in ops and "ffn_down" in ops
    return {"touched": touched, "mean": float(np.mean(touched)),
            "counted": moe.expected_distinct_experts(x.shape[0], cfg.n_experts, cfg.top_k),
            "counted_bytes": (ops["ffn_up"]["weight_bytes"] + ops["ffn_down"]["weight_bytes"]
                              if every else None)}


def point_ops(point: dict) -> dict | None:
    """{op: {flops, bytes}} of a point's counted ops, what `roofline.predict` sums per op
    (None for a point saved without them: its prediction is the whole phase's)."""
    ops = point.get("ops")
    if not ops:
        return None
    return {op: {"flops": c["flops"], "bytes": c["bytes"]} for op, c in ops.items()}


def attach_prediction(point: dict, peaks: dict, factors: dict | None = None) -> dict:
    """Add `predicted`, `measured_over_predicted`, the suspect flag and, outside the band,
    `outside_reason`, from a peaks result (or its prediction_inputs)."""
    inputs = prediction_inputs(peaks)
    factors = factors or {"memory": 1.0, "compute": 1.0}
    comp = roofline.compute_roof(inputs["roofs"], point["dtype"])
    comp_now = {**comp, "value": comp["value"] * roofline.drift_cap(factors["compute"], comp)}
    # a cold call finds nothing cached: main memory, whatever its working set
    ws = float("inf") if point.get("cold") else point["working_set_bytes"]
    mem = roofline.bandwidth_at(inputs, ws, factors["memory"])
    if point.get("cold"):
        mem = {**mem, "name": f"{mem['level']} (cold call: caches evicted)"}
    oh = inputs.get("overhead")
    floor = overhead.floor_s(oh, point.get("kernels", 0), cold=bool(point.get("cold"))) \
        if oh else 0.0
    ops = point_ops(point)
    pred = roofline.predict(point["flops"], point["bytes"], comp_now, mem, floor, ops)
    pred["drift"] = {k: factors[k] for k in ("memory", "compute")}
    point["predicted"] = pred
    ratio = pred["time_s"] / point["timing"]["median"]
    point["measured_over_predicted"] = ratio
    ex = point.get("experts")
    if ex and ex.get("counted_bytes"):  # the same roofs, the experts it touched
        scale = ex["mean"] / ex["counted"] - 1.0  # < 0: fewer experts' bytes read than counted
        read = ex["counted_bytes"] * scale
        if ops:
            ops = {**ops, **{op: {"flops": ops[op]["flops"], "bytes": ops[op]["bytes"]
                                  + point["ops"][op]["weight_bytes"] * scale}
                             for op in ("ffn_up", "ffn_down")}}
        touched = roofline.predict(point["flops"], point["bytes"] + read, comp_now, mem, floor,
                                   ops)
        ex["measured_over_predicted"] = touched["time_s"] / point["timing"]["median"]
    if pred.get("per_op") and pred["t_compute_bound_ops_s"] and pred["t_memory_bound_ops_s"]:
        spread = max(roofline.spread(comp), mem["spread"])  # both roofs set the time
    else:
        spread = roofline.spread(comp) if pred["bound"] == "compute" else mem["spread"]
    if ratio > 1.0 + spread + roofline.spread(point["flops_per_s"]):
        point["suspect"], point["reason"] = True, (
            f"measured {1 / ratio:.2f}x the predicted time: faster than its roof beyond the "
            f"spreads; " + (experts_reason(ex) if touched_differs(ex) else
                            "the working set may be cached more than assumed, or a count is "
                            "wrong"))
    else:
        point["suspect"], point["reason"] = False, None
    if not BAND[0] <= ratio <= BAND[1]:
        point["outside_reason"] = explain(point, inputs)
    else:
        point.pop("outside_reason", None)
    return point


def explain(point: dict, inputs: dict) -> str:
    """A measured reason for a point outside the band, from numbers in this run: the floor's
    share, the compiler-reachable roofs (roofs.compiler), the op losing the most time when a
    breakdown was measured (point["breakdown"])."""
    pred, ratio = point["predicted"], point["measured_over_predicted"]
    t = point["timing"]["median"]
    parts = []
    if pred["floor_s"] > 0.3 * t:
        parts.append(f"per-call floor {pred['floor_s'] * 1e6:.0f} us ({point.get('kernels', 0)} "
                     f"kernels) is {pred['floor_s'] / t:.0%} of the measured {t * 1e6:.0f} us")
    compiler = {r.get("level", r.get("dtype")): r for r in inputs["roofs"].get("compiler", [])}

    def at(flops_per_s: float, bytes_per_s: float) -> float:  # the prediction at other roofs
        return roofline.predict(point["flops"], point["bytes"],
                                {"name": pred["compute_roof"], "value": flops_per_s},
                                {"level": pred["memory_level"], "value": bytes_per_s},
                                pred["floor_s"], point_ops(point))["time_s"]

    if pred["bound"] == "memory" and pred["memory_level"] in compiler:
        c = compiler[pred["memory_level"]]
        t_c = at(pred["compute_flops_per_s"], c["value"])
        parts.append(f"XLA's own {c['name']} reaches {c['value'] / 1e9:.1f} GB/s against the "
                     f"roof's {pred['memory_bytes_per_s'] / 1e9:.1f}: against it measured/"
                     f"predicted = {t_c / t:.2f}")
    if pred["bound"] == "compute" and point["dtype"] in compiler:
        c = compiler[point["dtype"]]
        t_c = at(c["value"], pred["memory_bytes_per_s"])
        parts.append(f"XLA's own {c['name']} reaches {c['value'] / 1e9:.0f} GFLOP/s against "
                     f"the roof's {pred['compute_flops_per_s'] / 1e9:.0f}: against it measured/"
                     f"predicted = {t_c / t:.2f}")
    ex = point.get("experts")
    if touched_differs(ex):
        parts.append(experts_reason(ex))
    # The op breakdown is a separate profile (each op timed alone), so its share of the timed
    # call can pass 100%; and "time lost" is a reason only for a point slower than predicted.
    top = (point.get("breakdown") or {}).get("top")
    if top and ratio <= BAND[1]:
        lost = "lost_s" in top  # absent from breakdowns saved before the lost time was kept
        what = f"most time lost in {top['op']}" if lost else f"slowest op {top['op']}"
        against = f" against {top['roof_s'] * 1e3:.2f} ms at its roofs," if lost else ""
        parts.append(f"{what}: {top['time_s'] * 1e3:.2f} ms in a separate profile "
                     f"({top['share']:.0%} of the timed call){against} at {top['achieved']}")
    if ratio > BAND[1]:
        parts.append(f"measured {ratio:.2f}x faster than predicted" + (
            ": part of the working set stays cached between calls"
            if point.get("timed", "").startswith("warm") else ""))
    return "; ".join(parts) or f"unexplained: measured/predicted {ratio:.2f}"


def touched_differs(ex: dict | None) -> bool:
    """A MoE point whose tokens touched a different number of experts than the count expects
    (by more than 0.05 per layer), re-predicted over them: its routing is a reason."""
    return bool(ex and "measured_over_predicted" in ex and abs(ex["mean"] - ex["counted"]) > 0.05)


def experts_reason(ex: dict) -> str:
    """What a MoE point's own routing did against the count's expectation."""
    return (f"its tokens touched {ex['mean']:.2f} experts per layer ({ex['touched']}) where "
            f"the count expects {ex['counted']:.2f}: with the experts it touched, measured/"
            f"predicted = {ex['measured_over_predicted']:.2f}")


def attach_breakdown(point: dict, phases: refmodel.Phases, peaks: dict) -> dict:
    """For a point outside the band: measure where its time goes (microbench.phases.breakdown, a
    profiler trace of a few calls), keep the op that loses the most time against its own
    roofline time (at the point's roofs) with its achieved rate, and rewrite
    `outside_reason` with it."""
    inputs = prediction_inputs(peaks)
    bd = breakdown.measure_breakdown(phases, point["phase"], point["batch"], point["context"],
                                     calls=2, timing=Budget(budget_s=0.2, min_samples=3),
                                     cold=point.get("cold", False))
    rows = [r for r in bd["rows"] if r["time_s"] > 0]
    pred = point["predicted"]
    for r in rows:  # each op's time at the point's own roofs, and what it spends beyond it
        r["roof_s"] = max(r["flops"] / pred["compute_flops_per_s"],
                          r["bytes"] / max(pred["memory_bytes_per_s"], 1.0))
        r["lost_s"] = r["time_s"] - r["roof_s"]
    # the op that loses the most time against its own roofline time: the largest op may run
    # at its roof while the gap sits in the others
    top = max(rows, key=lambda r: r["lost_s"])
    ridge_x = pred["compute_flops_per_s"] / max(pred["memory_bytes_per_s"], 1.0)
    if top["intensity"] and top["intensity"] >= ridge_x and top["gflops_per_s"]:
        achieved = (f"{top['gflops_per_s']:.1f} GFLOP/s = "
                    f"{top['gflops_per_s'] * 1e9 / pred['compute_flops_per_s']:.2f} of the "
                    f"compute roof")
    elif top["gbytes_per_s"]:
        achieved = (f"{top['gbytes_per_s']:.1f} GB/s = "
                    f"{top['gbytes_per_s'] * 1e9 / pred['memory_bytes_per_s']:.2f} of the "
                    f"memory roof")
    else:
        achieved = "no counted cost (layout or fused code)"
    point["breakdown"] = {
        "top": {"op": top["op"], "time_s": top["time_s"], "share": top["share"],
                "roof_s": top["roof_s"], "lost_s": top["lost_s"], "achieved": achieved},
        "rows": [{k: r[k] for k in ("op", "time_s", "share", "gflops_per_s", "gbytes_per_s",
                                    "roof_s", "lost_s")} for r in rows],
        "unattributed_share": bd["unattributed_share"], "method": bd["method"]}
    point["outside_reason"] = explain(point, inputs)
    return point


def _option_fields(cfg: refmodel.ModelConfig) -> set[str]:
    """Config fields that pick an option set of a mixer `cfg` runs."""
    sets = refmodel.attention.option_sets(refmodel.attention.kinds_in(cfg))
    return {field for changes in sets.values() for field in changes} - {"attention"}
