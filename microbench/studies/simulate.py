"""The simulator checked against the engine on this machine: same traces, same scheduler,
the model replaced by a predicted step time.

For each model (a preset, optionally "+<attention kind>" or "+moe"), the serve benchmark's
trace shape and SLOs (microbench.studies.serve: a shared system prompt, Poisson arrivals, SLOs and
rates scaled from the unloaded latency), every policy x rate runs three ways:

    engine     the real engine (refmodel.serving.engine), wall clock
    table      the simulator with each model call's time looked up in a table measured on
               a fresh engine before any run (Engine.time_shapes: every call shape, rows
               reading its own pages except the shared system prompt's whole pages, which
               all rows read, as in the trace; median of `table_repeats`, on the run's own
               engine just before the run), plus the scheduler's time measured as the
               simulator runs the same scheduler code (Simulator(host_time=True))
    roofline   the simulator with each call's counted FLOPs and bytes (the padded rows over
               the fixed view, plus the gathered view) on this machine's measured roofs: the
               GEMM roof, the working-set bandwidth curve, plus the per-call floor
               (dispatch + per-kernel launch x the call's kernels), from a peaks.json,
               plus the scheduler's measured time likewise

The engine runs each trace `engine_repeats` times (its target is the mean of the repeats);
the difference between two runs of one trace is the engine's own noise on this shared
machine, reported as "engine_vs_engine": no predictor can be trusted below it. The error of
each simulator is the mean absolute percentage error (MAPE) over the runs of each run's mean
TTFT, TPOT and end-to-end latency (as simulator comparisons report it), and per request
(against the first engine run) over all runs. The table is measured again after all runs:
the change is the machine's drift over the check.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

import refmodel
from microbench import roofline
from microbench.phases import points
from microbench.roofs import overhead
from microbench.studies import serve
from refmodel.serving.pool import pages_for
from refmodel.sim.cluster import Chip
from refmodel.sim.predict import EngineCalls, RooflineTime, TableTime
from refmodel.sim.simulator import Simulator

KIND = "simulate"
METRICS = ("ttft_s", "tpot_s", "e2e_s")
GOALS = {"ttft_s": 0.15, "tpot_s": 0.10, "e2e_s": 0.10}  # MAPE a predictor must stay within


@dataclasses.dataclass(frozen=True)
class Check:
    """Everything the engine-vs-simulator check depends on (recorded in the results)."""

    models: tuple[str, ...] = ("small", "small+mla", "small+moe")
    policies: tuple[str, ...] = ("mixed", "static")
    rate_fractions: tuple[float, ...] = (0.25, 0.5, 1.0)
    requests: int = 64
    system_len: int = 512
    prompt_len: int = 48
    output_len: int = 32
    page_size: int = 16
    token_budget: int = 256
    max_running: int = 8
    slo_scale: float = 5.0
    table_repeats: int = 5
    engine_repeats: int = 2
    seed: int = 0

    def serve_setup(self, preset: str) -> serve.Setup:
        return serve.Setup(model=preset, requests=self.requests, system_len=self.system_len,
                           prompt_len=self.prompt_len, output_len=self.output_len,
                           page_size=self.page_size, token_budget=self.token_budget,
                           max_running=self.max_running, policies=self.policies,
                           rate_fractions=self.rate_fractions, slo_scale=self.slo_scale,
                           peer=False, seed=self.seed)

    def check(self) -> None:
        if not self.models:
            raise ValueError("models is empty: give at least one preset[+kind]")
        for m in self.models:
            model_config(m)
        for name in ("table_repeats", "engine_repeats"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"{name}={value!r} must be a positive integer")
        self.serve_setup("tiny").check()


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


def machine_chip(peaks: dict, engine, dtype: str = "float32") -> tuple:
    """This machine as a Chip from a peaks result: the GEMM roof, the main-memory read roof,
    the floor of the engine's (1, 1) call; plus the working-set bandwidth curve."""
    inputs = points.prediction_inputs(peaks)
    comp = roofline.compute_roof(inputs["roofs"], dtype)
    main = roofline.main_roof(inputs["roofs"]["memory"], roofline.READ, include_suspect=True)
    kernels = overhead.count_kernels(engine.compiled(1, 1))["kernels"]
    oh = inputs.get("overhead")
    floor = overhead.floor_s(oh, kernels) if oh else 0.0
    chip = Chip(peaks.get("machine", "this machine"), comp["value"], main["value"],
                memory=2**40, dtype=dtype, floor=floor)
    return chip, (lambda ws: roofline.bandwidth_at(inputs, ws)["value"]), {
        "compute_roof": comp["name"], "flops_per_s": comp["value"],
        "read_roof": main["name"], "read_bytes_per_s": main["value"], "kernels": kernels,
        "floor_s": floor}


def _means(timelines) -> dict:
    out = {}
    for m in METRICS:
        xs = [getattr(t, m[:-2]) for t in timelines]
        xs = [x for x in xs if not math.isnan(x)]
        out[m] = float(np.mean(xs)) if xs else None
        out[m.replace("_s", "_p90_s")] = float(np.percentile(xs, 90)) if xs else None
    return out


def _per_request(run, reqs) -> dict:
    return {m: [getattr(run.timelines[r.id], m[:-2]) for r in reqs] for m in METRICS}


def mape(pred, true) -> float | None:
    """Mean |pred - true| / true over the pairs whose true value is a positive number."""
    pairs = [(p, t) for p, t in zip(pred, true, strict=True)
             if p is not None and t is not None and not math.isnan(t) and t > 0]
    return float(np.mean([abs(p - t) / t for p, t in pairs])) if pairs else None


@dataclasses.dataclass(frozen=True)
class _Rig:
    """One model's engines in the check: the serve setup, the longest request and the pool
    that every run's engine and every call table use."""

    model: object
    setup: serve.Setup
    c: Check
    max_len: int
    pool: int

    def engine(self, policy: str = "mixed"):
        return serve._engine(self.model, self.setup, self.pool, self.max_len, policy,
                             array_pages=self.pool)

    def table(self, engine=None) -> dict:
        """Every call shape's median time, on `engine` (default: a fresh one); the system
        prompt's whole pages are read by every row, as in the trace."""
        shared = self.c.system_len // self.c.page_size
        engine = engine or self.engine()
        return {k: float(np.median(v))
                for k, v in engine.time_shapes(self.c.table_repeats, shared_pages=shared).items()}

    def run(self, policy: str, reqs: list, calls, predictors: dict) -> dict:
        """One trace run by the engine `engine_repeats` times (its own run-to-run noise), each
        run after its call table is measured (just before it: the machine's drift follows),
        then by the simulator with each predictor; the table predictor uses the first table."""
        c = self.c
        reals, tables = [], []
        for _ in range(c.engine_repeats):
            engine = self.engine(policy)
            tables.append(self.table(engine))
            reals.append(engine.run(reqs))
        predictors = {**predictors, "table": TableTime(tables[0], calls)}
        means = [_means([real.timelines[r.id] for r in reqs]) for real in reals]
        row = {"table_s": _keyed(tables[0]),
               "steps": [len(real.steps) for real in reals],
               "compiles": [real.compiles for real in reals],
               "engine_runs": means,
               "engine": {k: float(np.mean([m[k] for m in means])) for k in means[0]}
               | {"requests": _per_request(reals[0], reqs)}}
        for name, predictor in predictors.items():
            sim = Simulator(predictor, num_pages=self.pool, page_size=c.page_size,
                            policy=policy, token_budget=c.token_budget,
                            max_running=c.max_running, prefix_cache=engine.cache is not None,
                            host_time=True)
            run = sim.run(reqs)
            row[name] = {**_means([run.timelines[r.id] for r in reqs]),
                         "requests": _per_request(run, reqs), "steps": len(run.steps)}
        return row


def check_model(spec: str, c: Check, peaks: dict | None, say) -> dict:
    """One model of the check: every policy x rate run by the engine and by each predictor."""
    cfg = model_config(spec)
    model = refmodel.init(cfg, seed=c.seed)
    setup = c.serve_setup(cfg.name)
    probe = serve.trace(setup, cfg, 1.0) + serve.unloaded_trace(setup, cfg)
    max_len = serve._max_len(setup, probe)
    pool = c.max_running * pages_for(max_len, c.page_size) + pages_for(c.system_len,
                                                                       c.page_size)
    rig = _Rig(model, setup, c, max_len, pool)
    say(f"{spec}: unloaded latency, call table")
    base = serve.unloaded(model, setup, cfg, max_len, pool)
    slo = {"ttft_s": c.slo_scale * base["ttft_s"], "tpot_s": c.slo_scale * base["tpot_s"]}
    capacity = c.max_running / base["e2e_s"]
    before = rig.table()
    probe_engine = rig.engine()
    calls = EngineCalls.of(probe_engine)
    predictors = {}  # "table" is measured on each run's own engine (_Rig.run)
    machine = None
    if peaks is not None:
        chip, curve, machine = machine_chip(peaks, probe_engine)
        predictors["roofline"] = RooflineTime(cfg, chip, calls, bandwidth_at=curve)
        machine["call_s"] = {f"{b}x{t}": predictors["roofline"].engine_call((b, t))
                             for b, t in before}
    runs = []
    for policy in c.policies:
        for frac in c.rate_fractions:
            rate = frac * capacity
            reqs = serve.trace(setup, cfg, rate)
            say(f"{spec}: {policy} at {rate:.1f} requests/s")
            runs.append({"policy": policy, "rate": rate, "rate_fraction": frac,
                         **rig.run(policy, reqs, calls, predictors)})
    after = rig.table()
    return {"model": spec, "config": {"attention": cfg.attention, "ffn": cfg.ffn,
                                      "n_layers": cfg.n_layers, "d_model": cfg.d_model},
            "max_len": max_len, "num_pages": pool, "unloaded": base, "slo": slo,
            "capacity": capacity, "table_before_s": _keyed(before),
            "table_after_s": _keyed(after),
            "table_drift": float(np.median([after[k] / before[k] for k in before])),
            "machine": machine, "runs": runs}


def _keyed(table: dict) -> dict:
    return {f"{b}x{t}": v for (b, t), v in table.items()}


def errors(models: list[dict], predictors=("table", "roofline")) -> dict:
    """MAPE per predictor and metric: of run means (over every run of every model) and per
    request; plus per model."""
    out = {}
    for name in predictors:
        rows = [(m["model"], r) for m in models for r in m["runs"] if name in r]
        if not rows:
            continue
        entry = {"runs": len(rows)}
        for metric in METRICS:
            entry[metric] = mape([r[name][metric] for _, r in rows],
                                 [r["engine"][metric] for _, r in rows])
            entry[metric.replace("_s", "_per_request")] = mape(
                [x for _, r in rows for x in r[name]["requests"][metric]],
                [x for _, r in rows for x in r["engine"]["requests"][metric]])
        entry["by_model"] = {
            m["model"]: {metric: mape([r[name][metric] for r in m["runs"]],
                                      [r["engine"][metric] for r in m["runs"]])
                         for metric in METRICS} for m in models if m["runs"]}
        entry["meets_goals"] = all(entry[k] is not None and entry[k] <= g
                                   for k, g in GOALS.items())
        out[name] = entry
    pairs = [r["engine_runs"] for m in models for r in m["runs"] if len(r["engine_runs"]) > 1]
    if pairs:  # the engine against itself: |a - b| / mean(a, b) of two runs of one trace
        out["engine_vs_engine"] = {"runs": len(pairs), **{
            metric: float(np.mean([abs(p[0][metric] - p[1][metric])
                                   / ((p[0][metric] + p[1][metric]) / 2) for p in pairs]))
            for metric in METRICS}}
    return out


def validate(c: Check, peaks: dict | None, progress=None) -> dict:
    """The whole check: every model, then the errors."""
    c.check()
    say = progress or (lambda _: None)
    models = [check_model(spec, c, peaks, say) for spec in c.models]
    return {"check": dataclasses.asdict(c), "goals": GOALS, "models": models,
            "errors": errors(models),
            "peaks_machine": peaks.get("machine") if peaks else None}
