"""The simulator checked against the engine on this machine, judged against the engine's own
noise: same traces, same scheduler, the model replaced by a predicted step time.

For each model (a preset, optionally "+<attention kind>" or "+moe") a shared-system-prompt
trace (refmodel.serving.workloads.shared_prefix: Poisson arrivals, lognormal prompt and
output lengths) runs at each policy x rate (fractions of the policy's saturation
throughput: the trace's requests all at once, over the time to serve them, simulated with
the call table measured before any run), three ways:

    engine     the real engine (refmodel.serving.engine), wall clock, `engine_repeats` times
               on fresh engines (empty pool and cache; the compiled step is shared, so a
               repeat costs no compile); each run's call table is measured just before it
    table      the simulator with each model call's time looked up in the call table
               (`call_table`, as Engine.time_shapes measures it but each shape timed on
               its second call in a row, as a run repeats it: every call shape, rows reading
               their own pages except the system prompt's, which all rows read, as in the
               trace; per shape the median over `table_repeats` calls and then over the
               runs' tables), plus the scheduler's time measured as the simulator runs the
               same scheduler code (Simulator(host_time=True))
    roofline   the simulator with each call's counted FLOPs and bytes (the padded rows over
               the fixed view, plus the gathered view) on this machine's measured roofs (the
               GEMM roof, the working-set bandwidth curve, the dispatch cost per call, from a
               peaks.json) plus a cost per kernel times the kernels each call's compiled
               program launches (`kernel_cost`), plus the scheduler's measured time

What a predictor is judged against:

    spread       the engine against itself: for each pair of its runs of one trace, the
                 mean over requests of |a - b| / ((a + b) / 2) (a pair's MAPE, symmetric);
                 the median over pairs. No predictor can be trusted below it.
    MAPE         a simulator's mean |sim - engine| / engine over requests, the engine's
                 value being the mean of its runs for that request (per metric: TTFT,
                 TPOT, end-to-end)
    step error   the simulator's predicted time of each step the engine ran (the step's
                 calls priced by the predictor, plus the simulator's median scheduler time
                 per step), against the engine's measured time of that step: the median
                 absolute relative error over every step of every run. It is what the
                 simulator models; the MAPEs add what the queue does with it.
    step noise   the engine's steps against themselves: the median over steps of |t -
                 m| / m, m the median time of the engine's steps of the same shape (the same
                 calls): a per-shape predictor measured apart from the steps it prices is
                 off by about that much and by the machine's drift in between

TARGETS: the table simulator's MAPE within 1.2x the spread on each metric, the spread under
15% (a machine that gives more is said to, and the targets stay), the table's step error
under 10% and the roofline's under 25%. The call table is measured again after all runs:
its drift over the check is reported.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import time

import numpy as np

import refmodel
from microbench import roofline
from microbench.phases import points
from microbench.roofs import overhead
from refmodel.serving import workloads
from refmodel.serving.engine import Engine
from refmodel.serving.pool import pages_for
from refmodel.serving.steps import call_shapes
from refmodel.sim.cluster import Chip
from refmodel.sim.predict import EngineCalls, RooflineTime, TableTime, step_plan
from refmodel.sim.simulator import Simulator

KIND = "simulate"
METRICS = ("ttft_s", "tpot_s", "e2e_s")
PREDICTORS = ("table", "roofline")
# what each is judged by (see the module docstring)
TARGETS = {"spread_factor": 1.2, "spread_max": 0.15,
           "step_error": {"table": 0.10, "roofline": 0.25}}


@dataclasses.dataclass(frozen=True)
class Check:
    """Everything the engine-vs-simulator check depends on (recorded in the results)."""

    models: tuple[str, ...] = ("small", "small+moe", "small+mla")
    policies: tuple[str, ...] = ("mixed",)
    rate_fractions: tuple[float, ...] = (0.25, 0.5, 0.75)  # of the saturation throughput
    requests: int = 64
    system_len: int = 512
    prompt_len: int = 48
    output_len: int = 32
    page_size: int = 16
    token_budget: int = 256
    max_running: int = 8
    shapes: str = "pow2"  # the engine's call shapes (refmodel.serving.steps.SHAPES)
    table_repeats: int = 5
    engine_repeats: int = 5
    seed: int = 0

    def check(self) -> None:
        if not self.models:
            raise ValueError("models is empty: give at least one preset[+kind]")
        for m in self.models:
            model_config(m)
        for name in ("requests", "system_len", "prompt_len", "output_len", "page_size",
                     "token_budget", "max_running", "table_repeats", "engine_repeats"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name}={value!r} must be a positive integer")
        if self.engine_repeats < 2:
            raise ValueError(f"engine_repeats={self.engine_repeats}: the engine's spread needs "
                             "at least 2 runs of each trace (5 or more to trust it)")
        if not self.rate_fractions or not all(
                isinstance(f, (int, float)) and math.isfinite(f) and f > 0
                for f in self.rate_fractions):
            raise ValueError(f"rate_fractions={self.rate_fractions!r}: give one or more "
                             "positive numbers")
        from refmodel.serving.scheduler import POLICIES
        from refmodel.serving.steps import SHAPES
        if self.shapes not in SHAPES:
            raise ValueError(f"shapes={self.shapes!r}: choose one of {SHAPES}")
        if not self.policies or any(p not in POLICIES for p in self.policies):
            raise ValueError(f"policies={self.policies!r}: choose one or more of {POLICIES}")


def model_config(spec: str) -> refmodel.ModelConfig:
    """"small", "small+mla", "small+moe", "tiny+sliding+moe": a preset and overrides."""
    base, *mods = spec.split("+")
    names = sorted(refmodel.presets.PRESETS)
    if base not in names:
        raise ValueError(f"model {spec!r}: preset {base!r} is not one of {names}")
    cfg = refmodel.presets.get(base)
    kinds = refmodel.attention.registered()
    for m in mods:
        if m == "moe":
            cfg = dataclasses.replace(cfg, ffn="moe")
        elif m in kinds:
            cfg = dataclasses.replace(cfg, attention=m, layer_pattern=None)
        else:
            raise ValueError(f"model {spec!r}: {m!r} is neither 'moe' nor an attention kind "
                             f"{list(kinds)}")
    return cfg


def trace(c: Check, cfg, rate: float, n: int | None = None, seed: int | None = None):
    """The check's requests at `rate` requests/s: a shared system prompt, then each own."""
    return workloads.shared_prefix(n or c.requests, rate, system_len=c.system_len,
                                   prompt_len=c.prompt_len, output_len=c.output_len,
                                   vocab=cfg.vocab_size, seed=c.seed if seed is None else seed)


# ------------------------------------------------------------------ the predictors

def machine_chip(peaks: dict, dtype: str = "float32") -> tuple:
    """This machine as a Chip from a peaks result: the GEMM roof, the main-memory read roof,
    the dispatch cost of a call as its floor; plus the working-set bandwidth curve."""
    inputs = points.prediction_inputs(peaks)
    comp = roofline.compute_roof(inputs["roofs"], dtype)
    main = roofline.main_roof(inputs["roofs"]["memory"], roofline.READ, include_suspect=True)
    oh = inputs.get("overhead") or {}
    floor = float(oh.get("dispatch_s", 0.0))
    chip = Chip(peaks.get("machine", "this machine"), comp["value"], main["value"],
                memory=2**40, dtype=dtype, floor=floor)
    return chip, (lambda ws: roofline.bandwidth_at(inputs, ws)["value"]), {
        "compute_roof": comp["name"], "flops_per_s": comp["value"],
        "read_roof": main["name"], "read_bytes_per_s": main["value"], "dispatch_s": floor,
        "chain_per_kernel_s": oh.get("per_kernel_s")}


def kernel_counts(engine, shapes) -> dict[tuple[int, int], int]:
    """Kernels each call shape's compiled program launches (microbench.roofs.overhead.
    count_kernels: the ENTRY computation's fusions, dots, copies, custom calls ...)."""
    return {s: overhead.count_kernels(engine.compiled(*s))["kernels"] for s in shapes}


def kernel_cost(cfg, chip: Chip, calls: EngineCalls, curve, table: dict, kernels: dict
                ) -> tuple[float, tuple[int, int]]:
    """(seconds per kernel, the call it was measured on): the smallest decode call's measured
    time (its call-table entry, timed before any run; batch 1 with shapes="pow2") less its
    roofline time, over its kernels. A small model's decode call needs a tenth of its time
    for its bytes at the roofs, so what is left is what its kernels cost beyond their bytes
    (small products on one core, the page kernels, the runtime's work per kernel). Every
    other call shape is then a prediction."""
    shape = min((s for s in table if s[1] == 1), default=min(table))
    bare = RooflineTime(cfg, chip, calls, bandwidth_at=curve).engine_call(shape)
    return max(0.0, (table[shape] - bare) / kernels[shape]), shape


# ------------------------------------------------------------------ the measures

def mape(pred, true) -> float | None:
    """Mean |pred - true| / true over the pairs whose true value is a positive number."""
    pairs = [(p, t) for p, t in zip(pred, true, strict=True)
             if _num(p) and _num(t) and t > 0]
    return float(np.mean([abs(p - t) / t for p, t in pairs])) if pairs else None


def pair_mape(a, b) -> float | None:
    """Two runs of one trace against each other: mean |a - b| / ((a + b) / 2)."""
    pairs = [(x, y) for x, y in zip(a, b, strict=True) if _num(x) and _num(y) and x + y > 0]
    return float(np.mean([abs(x - y) / ((x + y) / 2) for x, y in pairs])) if pairs else None


def pair_mapes(runs: list[list]) -> list[float]:
    """pair_mape of every pair of runs (each a list of per-request values)."""
    out = [pair_mape(a, b) for a, b in itertools.combinations(runs, 2)]
    return [x for x in out if x is not None]


def _num(x) -> bool:
    return x is not None and not (isinstance(x, float) and math.isnan(x))


def per_request(run, reqs) -> dict:
    return {m: [_clean(getattr(run.timelines[r.id], m[:-2])) for r in reqs] for m in METRICS}


def _clean(x: float) -> float | None:
    return None if math.isnan(x) else float(x)


def mean_runs(runs: list[dict]) -> dict:
    """Per request and metric, the mean over the engine's runs (None where undefined)."""
    out = {}
    for m in METRICS:
        cols = zip(*[r[m] for r in runs], strict=True)
        out[m] = [float(np.mean(v)) if all(_num(x) for x in v) else None for v in cols]
    return out


def _means(req: dict) -> dict:
    return {m: float(np.mean([x for x in req[m] if _num(x)])) if any(_num(x) for x in req[m])
            else None for m in METRICS}


def shape_key(plan, calls: EngineCalls) -> str:
    """A step's shape: its calls' (rows x tokens), in the engine's order ("1x256+4x1")."""
    return "+".join(f"{c.rows}x{c.tokens}" for c in calls(plan))


def step_errors(reals, calls: EngineCalls, predictors: dict, host: dict) -> dict:
    """Each step the engine ran, priced by each predictor (its calls plus the simulator's
    median scheduler time per step, host[name]), against its measured time; plus the
    engine's own step noise. A predictor is one callable, or a list of one per run (the call
    table measured just before that run: the machine's state then, which can drift between
    runs on a shared machine). -> {"errors": {name: [...]}, "noise": [...], "shapes": [...]}:
    errors and noise one per step, shapes one row per step shape (most steps first)."""
    rows = []  # (shape, measured seconds, {name: predicted seconds})
    for k, real in enumerate(reals):
        for step in real.steps:
            plan = step_plan(step)
            rows.append((shape_key(plan, calls), step.seconds,
                         {n: (p[k] if isinstance(p, list) else p)(plan) + host[n]
                          for n, p in predictors.items()}))
    by_shape: dict[str, list] = {}
    for key, t, pred in rows:
        by_shape.setdefault(key, []).append((t, pred))
    median = {k: float(np.median([t for t, _ in v])) for k, v in by_shape.items()}
    errors = {n: [abs(pred[n] - t) / t for _, t, pred in rows] for n in predictors}
    noise = [abs(t - median[k]) / median[k] for k, t, _ in rows]
    shapes = [{"shape": k, "steps": len(v), "engine_s": median[k],
               "engine_p10_s": float(np.percentile([t for t, _ in v], 10)),
               "engine_p90_s": float(np.percentile([t for t, _ in v], 90)),
               **{f"{n}_s": float(np.median([pred[n] for _, pred in v])) for n in predictors}}
              for k, v in sorted(by_shape.items(), key=lambda kv: -len(kv[1]))]
    return {"errors": errors, "noise": noise, "shapes": shapes}


# ------------------------------------------------------------------ one model

@dataclasses.dataclass
class Rig:
    """One model's engines in the check: one compiled step shared by every engine (a fresh
    engine per run: an empty pool and prefix cache, no compile), the pool that holds
    `max_running` of the trace's longest requests plus the system prompt."""

    model: object
    c: Check
    max_len: int
    pool: int
    compiled: Engine | None = None

    @classmethod
    def build(cls, model, c: Check) -> Rig:
        probe = trace(c, model.cfg, 1.0) + trace(c, model.cfg, math.inf, 3, c.seed + 1)
        longest = max(len(r.prompt) + r.max_new_tokens for r in probe)
        max_len = pages_for(longest, c.page_size) * c.page_size
        pool = c.max_running * pages_for(max_len, c.page_size) + pages_for(c.system_len,
                                                                           c.page_size)
        return cls(model, c, max_len, pool)

    def engine(self, policy: str = "mixed", prefix_cache: bool | None = None) -> Engine:
        c = self.c
        e = Engine(self.model, num_pages=self.pool, page_size=c.page_size, policy=policy,
                   token_budget=c.token_budget, max_running=c.max_running,
                   prefix_cache=prefix_cache, max_len=self.max_len, shapes=c.shapes,
                   array_pages=self.pool)
        if self.compiled is None:
            e.warmup()
            self.compiled = e
        else:  # same model, layout and shapes: the first engine's compiled step
            e.step = self.compiled.step
        return e

    def calls(self) -> EngineCalls:
        return EngineCalls.of(self.compiled or self.engine())

    def table(self, engine=None) -> dict:
        """Every call shape's median time (call_table), on `engine` (default: a fresh one);
        the system prompt's whole pages are read by every row, as in the trace."""
        shared = self.c.system_len // self.c.page_size
        return {k: float(np.median(v)) for k, v in
                call_table(engine or self.engine(), self.c.table_repeats, shared).items()}

    def unloaded(self, repeats: int = 3) -> dict:
        """TTFT, TPOT and end-to-end time of one request alone (medians of `repeats`
        requests, prefix cache off), on a fresh engine warmed by a round of its calls."""
        engine = self.engine(prefix_cache=False)
        engine.time_shapes(1)
        out: dict = {m: [] for m in METRICS}
        for r in trace(self.c, self.model.cfg, math.inf, repeats, self.c.seed + 1):
            t = engine.run([r]).timelines[r.id]
            for m in METRICS:
                out[m].append(getattr(t, m[:-2]))
        return {m: float(np.median(v)) for m, v in out.items()}

    def engine_runs(self, policy: str, reqs: list) -> tuple[list, dict, list]:
        """The trace run `engine_repeats` times, each on a fresh engine just after its own
        call table -> (the runs, the table: per shape the median of the runs' tables, the
        tables)."""
        reals, tables = [], []
        for _ in range(self.c.engine_repeats):
            engine = self.engine(policy)
            tables.append(self.table(engine))
            reals.append(engine.run(reqs))
        table = {s: float(np.median([t[s] for t in tables])) for s in tables[0]}
        return reals, table, tables

    def simulator(self, predictor, policy: str) -> Simulator:
        """A simulator of this rig's engine (its pool, policy, budget, cache) whose steps take
        `predictor(plan)` seconds plus its scheduler's measured time."""
        c, layout = self.c, (self.compiled or self.engine()).layout
        return Simulator(predictor, num_pages=self.pool, page_size=c.page_size,
                         policy=policy, token_budget=c.token_budget,
                         max_running=c.max_running, prefix_cache=not layout.has_state,
                         state_slot_pages=layout.slot_pages() if layout.has_state else 0,
                         host_time=True)

    def run(self, policy: str, reqs: list, roof: RooflineTime | None, transient: list
            ) -> dict:
        """One trace run by the engine `engine_repeats` times, then by the simulator with
        each predictor, each judged against the engine's runs."""
        calls = self.calls()
        reals, table, _ = self.engine_runs(policy, reqs)
        predictors = {"table": TableTime(table, calls)}
        if roof is not None:
            predictors["roofline"] = roof
        runs = [per_request(real, reqs) for real in reals]
        mean = mean_runs(runs)
        row = {"table_s": _keyed(table), "steps": [len(r.steps) for r in reals],
               "compiles": [r.compiles for r in reals],
               "engine_runs": [_means(r) for r in runs],
               "engine": {**_means(mean), "requests": mean,
                          "pairs": {m: pair_mapes([r[m] for r in runs]) for m in METRICS}}}
        row["engine"]["spread"] = {m: _median(row["engine"]["pairs"][m]) for m in METRICS}
        host = {}
        for name, predictor in predictors.items():
            sim = self.simulator(predictor, policy)
            run = sim.run(reqs)
            host[name] = host_per_step(sim, run)
            req = per_request(run, reqs)
            row[name] = {**_means(req), "requests": req, "steps": len(run.steps),
                         "host_s": host[name],
                         "mape": {m: mape(req[m], mean[m]) for m in METRICS},
                         "n": {m: sum(_num(x) for x in mean[m]) for m in METRICS}}
        steps = step_errors(reals, calls, predictors, host)
        transient.append(steps)  # every step's error, pooled over the check by `errors`
        row["step"] = {"shapes": steps["shapes"], "steps": len(steps["noise"]),
                       "noise": _median(steps["noise"]),
                       **{f"{n}_error": _median(e) for n, e in steps["errors"].items()}}
        return row


def call_table(engine: Engine, repeats: int, shared_pages: int, seed: int = 0
               ) -> dict[tuple[int, int], list[float]]:
    """Seconds of each call shape the engine can make, `repeats` times each, measured as
    Engine.time_shapes does (rows reading their own pages spread over the whole array except
    the first `shared_pages`, the same for every row; random tokens; each row writing T tokens
    ending at max_len), with two differences. Each timed call is the second of two calls of
    its shape over the same rows' pages: in a run a shape repeats step after step over the
    same sequences, whose pages the step before left in cache, and a call right after one of
    another shape ran up to several times slower here (its program's code and the state it
    leaves are not the previous call's), the more after a long prefill call. Each round
    takes the shapes in a new random order, so neither drift nor what the call before left
    behind favours one shape. And a first round is not kept: a fresh engine's first calls
    touch its new arrays for the first time, and that round warms them for the run that
    follows."""
    if engine.pool.used_pages or engine.pool.cached_pages:
        raise RuntimeError("call_table writes into pages: call it before serving")
    shapes = call_shapes(engine.layout.has_state, engine.shapes, engine.scheduler.token_budget,
                         engine.scheduler.max_running)
    rng = np.random.default_rng(seed)
    out: dict[tuple[int, int], list[float]] = {shape: [] for shape in shapes}
    for r in range(repeats + 1):
        for i in rng.permutation(len(shapes)):
            B, T = shapes[i]
            n = engine._view(T)
            k = min(shared_pages, n)
            order = rng.permutation(engine.scratch)
            own = np.resize(order[k:], B * (n - k)).reshape(B, n - k)
            pages = np.concatenate([np.tile(order[:k], (B, 1)), own], axis=1).astype(np.int32)
            for timed in (False, True):  # the same rows twice: as the next step reads them
                tokens = rng.integers(0, engine.cfg.vocab_size, (B, T), dtype=np.int32)
                t = time.perf_counter()
                engine._scratch_call(B, T, pages, tokens)
                if timed and r:
                    out[(B, T)].append(time.perf_counter() - t)
    return out


def saturation(rig: Rig, predictor, policy: str, cfg) -> float:
    """Requests/s the policy serves at saturation, simulated: the check's trace all at once
    (its lengths, no gaps), its requests over the time until the last finishes."""
    burst = trace(rig.c, cfg, math.inf)
    run = rig.simulator(predictor, policy).run(burst)
    return len(burst) / max(t.token_times[-1] for t in run.timelines.values())


def host_per_step(sim: Simulator, run) -> float:
    """The simulator's median scheduler time per step (its steps' lengths less their
    predicted times): what it adds to each step's predicted calls."""
    return float(np.median([s.seconds - t for s, t in zip(run.steps, sim.times, strict=True)]))


def _median(xs) -> float | None:
    return float(np.median(xs)) if len(xs) else None


def _keyed(table: dict) -> dict:
    return {f"{b}x{t}": v for (b, t), v in table.items()}


def check_model(spec: str, c: Check, peaks: dict | None, say, transient: list) -> dict:
    """One model of the check: every policy x rate run by the engine and by each predictor."""
    t0 = time.perf_counter()
    cfg = model_config(spec)
    rig = Rig.build(refmodel.init(cfg, seed=c.seed), c)
    say(f"{spec}: compile, unloaded latency, call table")
    base = rig.unloaded()
    before = rig.table()
    capacity = {p: saturation(rig, TableTime(before, rig.calls()), p, cfg)
                for p in c.policies}
    roof, machine = None, None
    if peaks is not None:
        chip, curve, machine = machine_chip(peaks)
        calls = rig.calls()
        kernels = kernel_counts(rig.compiled, before)
        per_kernel, on = kernel_cost(cfg, chip, calls, curve, before, kernels)
        roof = RooflineTime(cfg, chip, calls, bandwidth_at=curve, kernels=kernels,
                            per_kernel_s=per_kernel)
        machine |= {"per_kernel_s": per_kernel, "per_kernel_call": f"{on[0]}x{on[1]}",
                    "kernels": _keyed(kernels),
                    "call_s": {k: roof.engine_call(s) for k, s in
                               zip(_keyed(before), before, strict=True)}}
    runs = []
    for policy in c.policies:
        for frac in c.rate_fractions:
            rate = frac * capacity[policy]
            say(f"{spec}: {policy} at {rate:.1f} requests/s x {c.engine_repeats}")
            runs.append({"policy": policy, "rate": rate, "rate_fraction": frac,
                         **rig.run(policy, trace(c, cfg, rate), roof, transient)})
    after = rig.table()
    return {"model": spec, "config": {"attention": cfg.attention, "ffn": cfg.ffn,
                                      "n_layers": cfg.n_layers, "d_model": cfg.d_model},
            "max_len": rig.max_len, "num_pages": rig.pool, "unloaded": base,
            "capacity": capacity,
            "table_before_s": _keyed(before), "table_after_s": _keyed(after),
            "table_drift": float(np.median([after[k] / before[k] for k in before])),
            "machine": machine, "runs": runs, "wall_s": time.perf_counter() - t0}


# ------------------------------------------------------------------ the verdict

def errors(models: list[dict], transient: list | None = None) -> dict:
    """The check's numbers over every run of every model: the engine's spread (the median
    over all pairs of runs), each simulator's MAPE (over all requests) beside it and their
    ratio, each predictor's step error (over all steps, from `transient`: step_errors of
    each trace), each against TARGETS."""
    rows = [r for m in models for r in m["runs"]]
    pairs = {m: [x for r in rows for x in r["engine"]["pairs"][m]] for m in METRICS}
    spread = {m: _median(pairs[m]) for m in METRICS}
    out: dict = {"traces": len(rows), "spread": spread,
                 "pairs": len(pairs[METRICS[0]]),
                 "spread_ok": all(v is not None and v <= TARGETS["spread_max"]
                                  for v in spread.values())}
    for name in PREDICTORS:
        have = [r for r in rows if name in r]
        if not have:
            continue
        entry: dict = {"traces": len(have)}
        for m in METRICS:
            n = sum(r[name]["n"][m] for r in have if r[name]["mape"][m] is not None)
            entry[m] = (sum(r[name]["mape"][m] * r[name]["n"][m] for r in have
                            if r[name]["mape"][m] is not None) / n) if n else None
            entry[f"{m[:-2]}_ratio"] = (entry[m] / spread[m] if entry[m] is not None
                                        and spread[m] else None)
        entry["within_spread"] = all(
            entry[f"{m[:-2]}_ratio"] is not None
            and entry[f"{m[:-2]}_ratio"] <= TARGETS["spread_factor"] for m in METRICS)
        entry["by_model"] = {
            mod["model"]: {m: mape([x for r in mod["runs"] for x in r[name]["requests"][m]],
                                   [x for r in mod["runs"] for x in r["engine"]["requests"][m]])
                           for m in METRICS} for mod in models if mod["runs"]}
        if transient:
            errs = [x for t in transient for x in t["errors"].get(name, [])]
            entry["step_error"] = _median(errs)
            entry["step_p90"] = float(np.percentile(errs, 90)) if errs else None
            entry["steps"] = len(errs)
            bound = TARGETS["step_error"][name]
            entry["step_ok"] = entry["step_error"] is not None and entry["step_error"] <= bound
        out[name] = entry
    if transient:
        out["step_noise"] = _median([x for t in transient for x in t["noise"]])
    return out


def validate(c: Check, peaks: dict | None, progress=None) -> dict:
    """The whole check: every model, then the errors."""
    c.check()
    say = progress or (lambda _: None)
    transient: list = []
    models = [check_model(spec, c, peaks, say, transient) for spec in c.models]
    return {"check": dataclasses.asdict(c), "targets": TARGETS, "models": models,
            "errors": errors(models, transient),
            "peaks_machine": peaks.get("machine") if peaks else None}
