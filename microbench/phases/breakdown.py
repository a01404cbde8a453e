"""Where the time goes: one phase's measured time per op, beside the counted FLOPs and bytes.

Regime: one compiled phase of the reference model (`refmodel.Phases(model).jitted[phase]`,
the callable `microbench.phases.points.measure_point` times and the compiler cross-check
lowers) at a given batch and context, with the cache donated and carried from call to call as
the phase benchmark does. Its counted cost per op comes from
`refmodel.costs.phase_costs(...)["ops"]`.

Method (which ran: the profiler trace; there is no fallback path in this module):

1. The whole phase is timed with the harness (`harness.time_fn`), outside any profiler; like
   a phase point (microbench.phases.points), a decode phase is timed cold by default (`cold`: the
   caches evicted before every call, the traced calls included).
2. The same compiled executable runs `calls` more times under
   `jax.profiler.trace(dir, create_perfetto_trace=True)`. XLA:CPU's thunk executor records one
   event per executed thunk (a fusion, a dot, a copy, a custom kernel) whose `args.hlo_op` is
   the HLO instruction's name; nested events (a while loop's body inside the loop) count once,
   as each event's self time. Time per instruction = its summed self time / calls.
3. Each instruction is mapped to an op name through the compiled HLO's metadata
   (`compiled.as_text()`: `op_name="jit(decode)/decode/attention/qkv_proj/dot_general"`): the
   innermost `jax.named_scope` of the code (SCOPES, and every op the cost model lists). A
   fusion without metadata takes the scope of a dot inside it, else of the instructions inside
   it; a dot whose metadata XLA dropped takes the scope that consumed its weight in the
   unoptimised HLO (`lowered.as_text(debug_info=True)`); what is still unknown inherits from its
   operands. Code outside any fine scope is named by what it does: `norm` (the RMS/LayerNorms,
   unscoped in the code, as in the cost model), `residual` (a float add at the top level),
   `layout` (transposes, reshapes and copies XLA materialised: no counted cost) or `other`.

Limits, reported rather than hidden: the per-op times are from traced calls, whose events add
about a microsecond each, while the whole phase is timed untraced; the remainder
`whole - sum(ops)` (dispatch, argument handling, the gaps between thunks and any thunks run
concurrently) is reported as `unattributed_s` and may be negative when thunks overlap on
several threads or the trace ran slower. A fused kernel holding two scopes (the embedding
gather fused into the first norm, attn_values fused into out_proj's GEMM) is charged to the
one XLA named it after, and that row lists the other scopes in `holds` (and they list it in
`held_by`); an op the cost model counts but no kernel is named after shows with time 0 and
`fused: true`. A kernel whose scope names several ops joined by "+" (the native decode
attention, refmodel.backends.KERNEL_SCOPE: scores, softmax and values in one pass) is
one row charged with their summed counted cost; they show as fused and held by it.
Sources: XLA:CPU `thunk_executor.cc` trace events; JAX "Profiling computation" docs.
"""

from __future__ import annotations

import collections
import glob
import gzip
import json
import re
import tempfile
from pathlib import Path

import jax

import refmodel
from microbench import harness
from microbench.phases.timing import DEFAULT_BUDGET, Budget, describe, evictor
from microbench.schema import KIND_BREAKDOWN
from refmodel import costs
from refmodel.phases import donation

# The fine named scopes of refmodel (grep `named_scope(` in refmodel/); the phase and block
# scopes (forward, prefill, decode, decode_attention, decode_ffn, attention, ffn) are not ops.
SCOPES = ("embed", "qkv_proj", "rope", "kv_write", "kv_expand", "absorb", "attn_scores",
          "attn_softmax", "attn_values", "out_proj", "indexer", "topk_select", "conv",
          "router", "dispatch", "combine", "shared_experts", "ffn_up", "ffn_down", "lm_head")
BLOCKS = ("attention", "ffn")
NORM_PRIMS = ("square", "rsqrt", "mul", "reduce_sum", "div", "sub", "mean", "integer_pow",
              "reduce-window", "add", "convert_element_type", "sqrt", "var")
LAYOUT_PRIMS = ("transpose", "reshape", "copy", "broadcast_in_dim", "squeeze",
                "expand_dims", "bitcast")
NOT_OPS = ("layout", "other")  # measured buckets with no counted cost


# ----------------------------------------------------------------------------- HLO parsing

_INSTR = re.compile(r"^\s*(?:ROOT )?%(\S+) = (.+?) ([a-z][\w\-.]*)\((.*)$")
_CALLS = re.compile(r"(?:calls|to_apply|body|condition)=%([\w.\-]+)")
_OPNAME = re.compile(r'op_name="([^"]*)"')
_NO_WORK = ("parameter", "constant", "bitcast", "broadcast", "reshape", "tuple",
            "get-tuple-element", "iota")


def parse_hlo(text: str) -> tuple[dict, str | None]:
    """{computation: [instr]} of an HLO module's text, and the entry computation's name.
    Each instr: {name, opcode, operands, calls, op_name}."""
    comps: dict[str, list] = {}
    entry, current = None, None
    for line in text.splitlines():
        head = re.match(r"^(ENTRY )?%([\w.\-]+) ", line)
        if head and line.rstrip().endswith("{"):
            current = head.group(2)
            comps[current] = []
            entry = current if head.group(1) else entry
            continue
        m = _INSTR.match(line)
        if not m or current is None:
            continue
        name, opcode, rest = m.group(1), m.group(3), m.group(4)
        args = rest.split("), ")[0]
        op_name = _OPNAME.search(line)
        index = re.match(r"(\d+)\)", rest) if opcode == "parameter" else None
        comps[current].append({"index": int(index.group(1)) if index else None,
            "type": m.group(2),
            "name": name, "opcode": opcode, "operands": re.findall(r"%([\w.\-]+)", args),
            "calls": _CALLS.findall(line), "op_name": op_name.group(1) if op_name else None})
    return comps, entry


def joined(scope: str, known: set) -> tuple[str, ...]:
    """The ops of a scope that names several joined by "+" (a kernel holding them all,
    refmodel.backends.KERNEL_SCOPE), if each is known; else ()."""
    ops = tuple(scope.split("+"))
    return ops if len(ops) > 1 and all(o in known for o in ops) else ()


def scope_of(op_name: str | None, known: set) -> str | None:
    """The innermost known named scope in an op_name path, else a bucket by primitive."""
    if not op_name or not op_name.startswith("jit("):
        return None
    parts = op_name.split("/")
    for part in reversed(parts[:-1]):
        if part in known or joined(part, known):
            return part
    prim = parts[-1]
    if prim in LAYOUT_PRIMS or prim == "dynamic_slice":
        return "layout"
    in_block = any(p in BLOCKS for p in parts[:-1])
    if prim in NORM_PRIMS and (in_block or prim != "add"):
        return "norm"
    if prim == "add":
        return "residual"
    return "other"


def _weight_scopes(stablehlo: str, known: set) -> dict:
    """{argument number: scope of the dot that consumes it}, from the unoptimised StableHLO
    with locations (`lowered.as_text(debug_info=True)`; the HLO text of `lowered` prints no
    metadata), following an argument through reshapes, converts and transposes."""
    locs = dict(re.findall(r'^#(loc\d+) = loc\("([^"]*)"', stablehlo, re.M))
    alias: dict[str, str] = {}
    out: dict[int, str] = {}
    for line in stablehlo.splitlines():
        m = re.match(r"\s*%(\w+) = stablehlo\.(\w+) (.*)", line)
        if not m:
            continue
        name, opcode, rest = m.groups()
        operands = re.findall(r"%(arg\d+|\w+)", rest.split(":")[0])
        if opcode in ("reshape", "convert", "transpose", "bitcast_convert") and operands:
            alias[name] = alias.get(operands[0], operands[0])
        elif opcode == "dot_general":
            loc = re.search(r"loc\(#(loc\d+)\)", line)
            scope = scope_of(locs.get(loc.group(1)) if loc else None, known)
            for o in operands:
                o = alias.get(o, o)
                if scope and o.startswith("arg"):
                    out.setdefault(int(o[3:]), scope)
    return out


def instruction_ops(compiled_hlo: str, stablehlo: str, known: set) -> tuple[dict, dict]:
    """({HLO instruction name (every computation): op name}, {instruction: the known scopes
    of the instructions fused inside it}) (see the module docstring)."""
    comps, entry = parse_hlo(compiled_hlo)
    weights = _weight_scopes(stablehlo, known)
    by_name = {i["name"]: i for instrs in comps.values() for i in instrs}
    params = {i["name"]: i["index"] for i in comps.get(entry, []) if i["opcode"] == "parameter"}
    for i in comps.get(entry, []):  # a weight viewed another way (per-head axes folded) is it
        if i["opcode"] == "bitcast" and params.get(i["operands"][0]) is not None:
            params[i["name"]] = params[i["operands"][0]]

    def inner(comp: str, depth: int = 0) -> list:
        found = []
        for i in comps.get(comp, []):
            found.append(i)
            if depth < 4:
                for c in i["calls"]:
                    found += inner(c, depth + 1)
        return found

    ops: dict[str, str] = {}
    holds: dict[str, set] = {}
    for ins in by_name.values():
        own = scope_of(ins["op_name"], known)
        body = [i for c in ins["calls"] for i in inner(c)]
        holds[ins["name"]] = {s for s in (scope_of(i["op_name"], known) for i in body
                                          if i["opcode"] not in _NO_WORK) if s in known}
        dots = [scope_of(i["op_name"], known) for i in body if i["opcode"] in ("dot",
                                                                               "convolution")]
        dots = [s for s in dots if s]
        if ins["opcode"] in ("dot", "fusion", "custom-call") and (own is None or dots):
            hit = [weights[params[o]] for o in ins["operands"] if params.get(o) in weights]
            if dots and own not in known:
                own = dots[0]
            elif hit and own is None:
                own = hit[0]
        if own is None and body:
            named = [s for s in (scope_of(i["op_name"], known) for i in body) if s]
            if named:
                own = collections.Counter(named).most_common(1)[0][0]
        if own == "residual" and not ins["type"].startswith(("f", "bf", "(")):
            own = "other"  # an integer add: the cache position, not the residual stream
        if own is not None:
            ops[ins["name"]] = own
    order = [i["name"] for i in comps.get(entry, [])] + list(by_name)
    for _ in range(3):  # unknown: inherit from an operand (a norm's reduce-window, a copy)
        for name in order:
            if name in ops:
                continue
            src = [ops[o] for o in by_name[name]["operands"] if o in ops]
            if src:
                ops[name] = src[0]
    for name in by_name:
        ops.setdefault(name, "other")
    return ops, holds


# ----------------------------------------------------------------------------- the trace

def thunk_self_times(trace_events: list, module: str) -> tuple[dict, dict]:
    """({hlo_op: summed self time in s}, {"calls", "busy_s", "threads"}) of one module's thunk
    events. Self time = duration less that of the thunk events nested in it on its thread."""
    evs = [e for e in trace_events if e.get("ph") == "X" and isinstance(e.get("args"), dict)
           and e["args"].get("hlo_module") == module and "hlo_op" in e["args"]]
    self_us: dict[str, float] = collections.defaultdict(float)
    by_tid = collections.defaultdict(list)
    for e in evs:
        by_tid[e["tid"]].append(e)
    spans = []
    for tid_evs in by_tid.values():
        tid_evs.sort(key=lambda e: (e["ts"], -e["dur"]))
        stack: list = []
        for e in tid_evs:
            while stack and stack[-1]["ts"] + stack[-1]["dur"] <= e["ts"]:
                stack.pop()
            if stack:
                self_us[stack[-1]["args"]["hlo_op"]] -= e["dur"]
            else:
                spans.append((e["ts"], e["ts"] + e["dur"]))
            self_us[e["args"]["hlo_op"]] += e["dur"]
            stack.append(e)
    busy, end = 0.0, float("-inf")
    for a, b in sorted(spans):  # union of top-level intervals over all threads
        if b > end:
            busy += b - max(a, end)
            end = b
    runs = {e["args"].get("run_id") for e in evs}
    return ({k: v * 1e-6 for k, v in self_us.items()},
            {"calls": len(runs), "busy_s": busy * 1e-6, "threads": len(by_tid)})


def _traced_calls(compiled, args: list, donate: tuple, carry, calls: int, folder: str,
                  before=None) -> list:
    """Run `calls` calls under the profiler (after one warm-up), each after `before()` if
    given (an evictor: its events belong to another module and are not counted), and return
    the trace's events."""
    args = harness._copy_donated(list(args), donate)
    run = harness._runner(compiled, args, donate, carry)
    run(1)
    with jax.profiler.trace(folder, create_perfetto_trace=True):
        for _ in range(calls):
            if before is not None:
                before()
            run(1)
    files = sorted(glob.glob(f"{folder}/**/perfetto_trace.json.gz", recursive=True))
    if not files:
        raise RuntimeError(f"jax.profiler.trace wrote no perfetto_trace.json.gz under {folder}")
    with gzip.open(files[-1], "rt") as f:
        data = json.load(f)
    return data["traceEvents"] if isinstance(data, dict) else data


# ----------------------------------------------------------------------------- the breakdown

def _summed(costs: list) -> dict:
    """The counted cost of ops one kernel holds together (none: zero)."""
    flops, nbytes = sum(c["flops"] for c in costs), sum(c["bytes"] for c in costs)
    return {"flops": flops, "bytes": nbytes, "intensity": flops / nbytes if nbytes else None}


def _rates(flops: float, nbytes: float, t: float) -> dict:
    ok = t > 0
    return {"gflops_per_s": flops / t / 1e9 if ok else None,
            "gbytes_per_s": nbytes / t / 1e9 if ok else None}


def measure_breakdown(cfg_or_phases, phase: str, batch: int, context: int, *, calls: int = 5,
                      timing: Budget = DEFAULT_BUDGET, out: str | Path | None = None,
                      seed: int = 0, cold: bool | None = None) -> dict:
    """Per-op measured time of one phase beside its counted cost (see the module docstring).

    Returns {"kind", "model", "label", "phase", "batch", "context", "dtype", "whole": {time_s,
    timing, flops, bytes, gflops_per_s, gbytes_per_s}, "rows": [{op, time_s, share, flops,
    bytes, intensity, gflops_per_s, gbytes_per_s, kernels, holds, held_by, counted, fused}],
    "attributed_s",
    "unattributed_s", "unattributed_share", "trace": {...}, "environment"}, sorted by time;
    shares are of the whole phase time, so sum(share) + unattributed_share == 1. With `out`,
    also written atomically to out/breakdown.json.
    """
    phases = cfg_or_phases if isinstance(cfg_or_phases, refmodel.Phases) \
        else refmodel.Phases(refmodel.init(cfg_or_phases, seed=seed))
    cfg = phases.cfg
    if calls < 1:
        raise ValueError(f"calls={calls!r} must be >= 1")
    counted = costs.phase_costs(cfg, phase, batch, context)  # validates phase, batch, context
    args = phases.example_args(phase, batch, context, fill=True, seed=seed)
    donate, carry = donation(phase)
    lowered = phases.jitted[phase].lower(*args)
    compiled = lowered.compile()
    cold = phase != "prefill" if cold is None else cold  # as microbench.phases.points times it
    before = evictor() if cold else None
    whole = harness.time_fn(compiled, *args, donate_argnums=donate, carry=carry,
                            budget_s=timing.budget_s, min_samples=timing.min_samples,
                            target_cv=timing.target_cv, min_sample_s=timing.min_sample_s,
                            before=before)
    text = compiled.as_text()
    module = re.search(r"HloModule (\S+?)[,\s]", text).group(1)
    known = set(SCOPES) | set(counted["ops"])
    op_of, holds = instruction_ops(text, lowered.as_text(debug_info=True), known)
    with tempfile.TemporaryDirectory(prefix="breakdown-") as folder:
        events = _traced_calls(compiled, list(args), donate, carry, calls, folder, before)
    per_instr, trace = thunk_self_times(events, module)
    if trace["calls"] == 0:
        raise RuntimeError(f"the profiler trace holds no thunk events of {module}: this "
                           "backend does not report per-op events")
    measured = _per_op(per_instr, op_of, holds, known, trace["calls"])
    rows = _rows(measured, counted["ops"], known, whole.median)
    result = _result(cfg, phase, batch, context, cold, whole, counted, rows, trace, module)
    if out is not None:
        harness.write_json_atomic(Path(out) / "breakdown.json", result)
    return result


def _per_op(per_instr: dict, op_of: dict, holds: dict, known: set, calls: int) -> dict:
    """{op: {time_s per call, kernels, holds}} from each instruction's traced time."""
    measured: dict[str, dict] = {}
    for instr, t in per_instr.items():
        op = op_of.get(instr, "other")
        row = measured.setdefault(op, {"time_s": 0.0, "kernels": [], "holds": set()})
        row["time_s"] += t / calls
        row["kernels"].append(instr)
        row["holds"] |= (holds.get(instr, set()) | set(joined(op, known))) - {op}
    return measured


def _rows(measured: dict, counted_ops: dict, known: set, t_whole: float) -> list[dict]:
    """One row per op measured or counted, beside its counted cost, longest first."""
    rows = []
    for op in list(dict.fromkeys(list(measured) + list(counted_ops))):
        c = counted_ops.get(op) or _summed([counted_ops[o] for o in joined(op, known)])
        m = measured.get(op, {"time_s": 0.0, "kernels": [], "holds": set()})
        held_by = sorted(o for o, r in measured.items() if op in r["holds"])
        rows.append({"op": op, "time_s": m["time_s"], "share": m["time_s"] / t_whole,
                     "flops": c["flops"], "bytes": c["bytes"], "intensity": c["intensity"],
                     **_rates(c["flops"], c["bytes"], m["time_s"]),
                     "kernels": sorted(m["kernels"]), "holds": sorted(m["holds"]),
                     "held_by": held_by, "counted": op in counted_ops or bool(joined(op, known)),
                     "fused": op in counted_ops and not m["kernels"]})
    rows.sort(key=lambda r: -r["time_s"])
    return rows


def _result(cfg, phase: str, batch: int, context: int, cold: bool, whole, counted: dict,
            rows: list[dict], trace: dict, module: str) -> dict:
    """The breakdown as saved (measure_breakdown's docstring lists the fields)."""
    t_whole, n = whole.median, trace["calls"]
    attributed = sum(r["time_s"] for r in rows)
    return {
        "kind": KIND_BREAKDOWN, "model": cfg.name, "label": describe(cfg),
        "attention": cfg.attention, "mla_absorb": cfg.mla_absorb, "phase": phase,
        "batch": batch, "context": context, "dtype": cfg.dtype, "cold": cold,
        "method": "jax.profiler.trace: XLA:CPU thunk events mapped to named scopes via HLO "
                  "metadata; whole phase timed untraced by harness.time_fn",
        "whole": {"time_s": t_whole, "timing": whole.to_dict(), "flops": counted["flops"],
                  "bytes": counted["bytes"], "intensity": counted["intensity"],
                  **_rates(counted["flops"], counted["bytes"], t_whole)},
        "rows": rows, "attributed_s": attributed, "unattributed_s": t_whole - attributed,
        "unattributed_share": (t_whole - attributed) / t_whole,
        "trace": {"calls": n, "threads": trace["threads"],
                  "busy_per_call_s": trace["busy_s"] / n, "hlo_module": module},
        "environment": harness.environment(),
    }


def format_table(result: dict) -> str:
    """A plain-text table of one breakdown (ms, share, counted GFLOP and MB, achieved rates)."""
    head = (f"{result['model']} {result['phase']} batch {result['batch']} context "
            f"{result['context']}: whole {result['whole']['time_s'] * 1e3:.3f} ms "
            f"({result['whole']['gflops_per_s']:.1f} GFLOP/s, "
            f"{result['whole']['gbytes_per_s']:.1f} GB/s)")
    w = max([14] + [len(r["op"]) + 2 for r in result["rows"]])  # a joined op's name is long
    lines = [head, f"{'op':<{w}}{'ms':>9}{'share':>8}{'GFLOP':>9}{'MB':>9}{'FLOP/B':>8}"
             f"{'GFLOP/s':>9}{'GB/s':>8}"]

    def f(v, fmt):
        return format(v, fmt) if v is not None else "-"

    for r in result["rows"]:
        mark = "*" if r["fused"] else "+" if r["holds"] else ""
        lines.append(f"{r['op'] + mark:<{w}}{r['time_s'] * 1e3:>9.3f}"
                     f"{r['share']:>8.1%}{r['flops'] / 1e9:>9.3f}{r['bytes'] / 1e6:>9.2f}"
                     f"{f(r['intensity'], '8.1f'):>8}{f(r['gflops_per_s'], '9.1f'):>9}"
                     f"{f(r['gbytes_per_s'], '8.1f'):>8}")
    lines.append(f"{'unattributed':<{w}}{result['unattributed_s'] * 1e3:>9.3f}"
                 f"{result['unattributed_share']:>8.1%}   (dispatch, gaps, copies; negative: "
                 "traced ops ran slower or overlapped)")
    lines.append("* counted, but fused into another op's kernel (no kernel of its own)")
    for r in result["rows"]:
        if r["holds"]:
            lines.append(f"+ {r['op']}'s kernels also hold code of {', '.join(r['holds'])} "
                         "(its time includes theirs)")
    return "\n".join(lines)
