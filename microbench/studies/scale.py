"""Serving at scale on paper: real models on the hardware database's chips, predicted by
the simulator (refmodel.sim) on roofline step times. Nothing here is measured: every number
is the roofline bound of the stated design (chip spec peaks, dense; no launch, scheduling or
kernel inefficiency; links at their spec bandwidth and latency), which a real engine
approaches from below. Each result carries its assumptions.

SLOs are published ones, the same for every model, policy and design: MLPerf Inference's
llama2-70b server scenario (p99 TTFT <= 2 s, p99 TPOT <= 200 ms) and its interactive scenario
(p99 TTFT <= 450 ms, p99 TPOT <= 40 ms), from mlcommons/inference `loadgen/mlperf.conf`
(`llama2-70b.Server.ttft_latency = 2000`, `tpot_latency = 200`;
`llama2-70b-interactive.Server.ttft_latency = 450`, `tpot_latency = 40`;
`*.Server.target_latency_percentile = 99`). A run meets an SLO when the 99th percentile of
its requests' TTFT and that of their TPOT (the mean inter-token gap of each request, as
MLPerf's loadgen computes it) are both within it; the figure of merit is MLPerf's server
one, the highest offered rate whose run meets it, here per chip.

    scale_out   each model on its smallest tensor-parallel group of one device (TP over
                the device's scale-up link), at most `max_running` sequences per chip:
                p99 TTFT and TPOT vs request rate (fractions of the instance's steady
                capacity), and the Pareto of tokens/s per chip vs tokens/s per user as the
                batch cap grows
    pd          prefill/decode disaggregation (refmodel.sim.disagg) against colocated
                serving on the same number of chips, per prompt/output mix and rate, judged
                by each SLO (the same runs); the KV of every prompt crosses the device's
                scale-out link
    afd         attention-FFN disaggregation vs the best colocated deployment of the same
                chips at the same load (refmodel.sim.afd: tensor parallel on the scale-up
                link, or expert parallel for MoE)
    sram        SRAM-only chips: chips to hold each model, decode Pareto against HBM GPUs,
                and prefill on GPUs with decode on SRAM chips (refmodel.sim.sram)
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

import refmodel
from microbench import hardware
from refmodel import costs
from refmodel.serving import metrics, workloads
from refmodel.sim import afd, disagg, sram
from refmodel.sim.cluster import Chip
from refmodel.sim.predict import RooflineTime
from refmodel.sim.simulator import Simulator

WEIGHT_DTYPES = {"deepseek-v3": "float8"}  # trained and released in FP8; others bf16
AFD_CONTEXTS, AFD_BATCHES = (1024, 8192), (4, 16, 64)  # sequences per chip, either design
MEMORY_USE = 0.9  # of a chip's memory for weights + KV (the rest: activations, runtime)
# (name, p99 TTFT s, p99 TPOT s): MLPerf Inference, llama2-70b server and interactive
# scenarios (mlcommons/inference loadgen/mlperf.conf; see the module docstring)
SLOS = (("MLPerf server", 2.0, 0.2), ("MLPerf interactive", 0.45, 0.04))


@dataclasses.dataclass(frozen=True)
class Paper:
    """What the on-paper studies depend on (recorded in the results)."""

    device: str = "H100 SXM"
    models: tuple[str, ...] = ("llama3-8b", "llama3-70b", "qwen3-30b-a3b", "gpt-oss-120b",
                               "deepseek-v3@H200 SXM")  # preset[@device]
    mixes: tuple[tuple[str, int, int], ...] = (("chat", 512, 256), ("summarize", 2048, 64))
    rate_fractions: tuple[float, ...] = (0.25, 0.5, 0.75, 1.0, 1.25, 1.5)  # of capacity
    requests: int = 160  # per chip of an instance (the PD runs: per chip of a design)
    max_running: int = 64  # sequences per chip (an instance of tp chips runs tp x this)
    token_budget: int = 2048
    page_size: int = 16
    slos: tuple[tuple[str, float, float], ...] = SLOS
    batch_caps: tuple[int, ...] = (1, 4, 16, 64, 256)
    pd_model: str = "llama3-8b"
    pd_designs: tuple[tuple[int, int], ...] = ((1, 3), (2, 2), (3, 1))  # equal chips
    afd_models: tuple[str, ...] = ("llama3-70b", "qwen3-30b-a3b", "deepseek-v3")
    afd_chips: int = 32
    sram_chip: str = "Groq LPU"
    sram_model: str = "llama3-70b"
    sram_batches: tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64)
    context: int = 4096
    seed: int = 0

    def check(self) -> None:
        names = sorted(refmodel.presets.PRESETS)
        for spec in self.models + self.afd_models + (self.pd_model, self.sram_model):
            m, device = model_device(spec, self.device)
            if m not in names:
                raise ValueError(f"model {spec!r}: choose presets from {names}")
            hardware.get(device)
        hardware.get(self.sram_chip)
        for name in ("requests", "max_running", "token_budget", "page_size", "afd_chips",
                     "context"):
            v = getattr(self, name)
            if not isinstance(v, int) or v < 1:
                raise ValueError(f"{name}={v!r} must be a positive integer")
        if not self.rate_fractions or min(self.rate_fractions) <= 0:
            raise ValueError(f"rate_fractions={self.rate_fractions!r}: give positive numbers")
        for x, y in self.pd_designs:
            if x < 1 or y < 1:
                raise ValueError(f"pd_designs: ({x}, {y}) needs >= 1 prefill and decode "
                                 "instance")
        if not self.slos or any(len(x) != 3 or not isinstance(x[0], str) or min(x[1:]) <= 0
                                for x in self.slos):
            raise ValueError(f"slos={self.slos!r}: give (name, p99 TTFT s, p99 TPOT s) "
                             "triples of positive seconds")
        if len({x + y for x, y in self.pd_designs}) != 1:
            raise ValueError(f"pd_designs={self.pd_designs!r}: give designs of one size "
                             "(x + y instances each), compared with that many colocated")


def model_device(spec: str, default: str) -> tuple[str, str]:
    """"llama3-70b" -> (llama3-70b, default); "deepseek-v3@H200 SXM" -> (deepseek-v3, H200)."""
    name, _, device = spec.partition("@")
    return name, device or default


def chip_of(device: str, dtype: str = "bfloat16") -> Chip:
    """A device of the database as a Chip at `dtype` (its spec peak; float16 where a chip
    lists no bfloat16), main-memory bandwidth and capacity."""
    d = hardware.get(device)
    for dt in (dtype, "bfloat16", "float16"):
        if dt in d.peak_flops:
            return Chip(d.name, d.peak_flops[dt], d.memory_bandwidth[d.main_memory],
                        d.memory_bytes or 0.0, dt)
    raise ValueError(f"device {device!r} lists no {dtype}/bfloat16/float16 peak: "
                     f"{sorted(d.peak_flops)}")


def links_of(device: str):
    d = hardware.get(device)
    up = hardware.link(hardware.get_link(d.scale_up["link"])) if d.scale_up else None
    out = hardware.link(hardware.get_link(d.scale_out)) if d.scale_out else None
    return up, out, (d.scale_up or {}).get("chips", 1)


def placement(cfg, device: str, page_size: int, weight_dtype: str) -> dict:
    """The smallest power-of-two TP group (within the scale-up domain) whose memory holds
    the weights with room for KV, and the KV pages that room gives."""
    chip = chip_of(device)
    up, _, domain = links_of(device)
    weights = costs.param_counts(cfg)["total"] * costs.BYTES[weight_dtype]
    tp = 1
    while weights > 0.7 * MEMORY_USE * chip.memory * tp:
        tp *= 2
        if tp > domain:
            raise ValueError(f"{cfg.name} ({weights / 1e9:.0f} GB of weights) does not fit "
                             f"one scale-up domain of {domain} x {device}")
    kv_room = MEMORY_USE * chip.memory * tp - weights
    per_page = costs.kv_bytes_per_token(cfg, "bfloat16") * page_size
    return {"tp": tp, "weight_bytes": weights, "kv_room_bytes": kv_room,
            "pages": int(kv_room // per_page) if per_page else 1 << 20, "link": up}


def _predictor(cfg, device, tp, link, weight_dtype) -> RooflineTime:
    return RooflineTime(cfg, chip_of(device), tp=tp, link=link if tp > 1 else None,
                        weight_dtype=weight_dtype, kv_dtype="bfloat16", act_dtype="bfloat16")


def _sim(predictor, pages: int, p: Paper, max_running: int | None = None,
         token_budget: int | None = None) -> Simulator:
    return Simulator(predictor, num_pages=min(pages, 1 << 20), page_size=p.page_size,
                     policy="mixed", token_budget=token_budget or p.token_budget,
                     max_running=max_running or p.max_running, prefix_cache=False)


def summary_of(timelines: dict, slos, chips: int) -> dict:
    """metrics.summarize (its goodput and attainment against the first SLO) plus, per SLO,
    whether the run meets it at p99 ("meets_p99"), the fraction of requests meeting both
    parts ("attainment") and their rate per chip ("goodput_per_chip")."""
    tl = list(timelines.values())
    _, ttft, tpot = slos[0]
    s = metrics.summarize(tl, ttft, tpot)
    s["goodput_per_chip"] = s["goodput_requests_per_s"] / chips
    s["p99_ttft_s"], s["p99_tpot_s"] = s["ttft_s"]["p99"], s["tpot_s"]["p99"]
    s["slos"] = {name: {"ttft_s": a, "tpot_s": b,
                        "meets_p99": bool(s["p99_ttft_s"] <= a and not s["p99_tpot_s"] > b),
                        "attainment": metrics.slo_attainment(tl, a, b),
                        "goodput_per_chip": metrics.goodput(tl, a, b) / chips}
                 for name, a, b in slos}
    s["mean_ttft_s"] = float(np.mean([t.ttft for t in tl]))
    tpots = [t.tpot for t in tl if not math.isnan(t.tpot)]
    s["mean_tpot_s"] = float(np.mean(tpots)) if tpots else None
    return s


def sustained(runs: list[dict], slo: str, capacity: float) -> float | None:
    """MLPerf's server figure of merit over a sweep: the highest offered rate whose run meets
    `slo` at p99, every lower rate meeting it too, and at most the steady `capacity` (a rate
    past it is unstable: its queue grows without bound in a long run, however short the
    simulated one); None when the lowest rate does not meet it."""
    best = None
    for r in sorted(runs, key=lambda r: r["rate"]):
        if not r["slos"][slo]["meets_p99"] or r["rate"] > capacity * (1 + 1e-9):
            break
        best = r["rate"]
    return best


def trace_of(p: Paper, mix, rate: float, vocab: int, n: int, seed: int = 0):
    _, prompt, output = mix
    return workloads.random_requests(n, rate, prompt_len=prompt, output_len=output,
                                     vocab=vocab, seed=p.seed + seed)


def steady_rate(timelines: dict) -> float:
    """Requests/s completed in steady state: the middle half of the completions over the
    time they took (the ramp up and the drain of the last partial batch left out)."""
    done = sorted(t.token_times[-1] for t in timelines.values())
    n = len(done)
    lo, hi = done[n // 4], done[(3 * n) // 4]
    return ((3 * n) // 4 - n // 4) / (hi - lo) if hi > lo else n / done[-1]


def capacity_of(make, mix, p: Paper, vocab: int, n: int) -> float:
    """Requests/s one instance completes in steady state when n requests arrive at once
    (give n of several times the instance's running cap, or there is no steady state)."""
    return steady_rate(make().run(trace_of(p, mix, math.inf, vocab, n)).timelines)


def _slos(p: Paper) -> list[dict]:
    return [{"name": n, "ttft_s": a, "tpot_s": b} for n, a, b in p.slos]


def scale_out(p: Paper, progress) -> list[dict]:
    out = []
    for spec in p.models:
        name, device = model_device(spec, p.device)
        cfg = refmodel.presets.get(name)
        wd = WEIGHT_DTYPES.get(name, "bfloat16")
        place = placement(cfg, device, p.page_size, wd)
        tp, running = place["tp"], place["tp"] * p.max_running
        pred = _predictor(cfg, device, tp, place["link"], wd)
        mix, n = p.mixes[0], p.requests * tp
        progress(f"scale-out {name} (tp {tp})")

        def make(cap=None, pred=pred, place=place, running=running):
            return _sim(pred, place["pages"], p, cap or running)
        capacity = capacity_of(make, mix, p, cfg.vocab_size, max(n, 4 * running))
        runs = []
        for f in p.rate_fractions:
            reqs = trace_of(p, mix, f * capacity, cfg.vocab_size, n)
            runs.append({"rate": f * capacity, "rate_per_chip": f * capacity / tp,
                         "rate_fraction": f,
                         **summary_of(make().run(reqs).timelines, p.slos, tp)})
        pareto = []
        for cap in p.batch_caps:
            reqs = trace_of(p, mix, math.inf, cfg.vocab_size, max(cap * 2, 8))
            s = summary_of(make(cap).run(reqs).timelines, p.slos, tp)
            pareto.append({"max_running": cap,
                           "tokens_per_s_per_chip": s["output_tokens_per_s"] / tp,
                           "tokens_per_s_per_user": 1.0 / s["mean_tpot_s"]})
        best = {slo: sustained(runs, slo, capacity) for slo, _, _ in p.slos}
        out.append({"model": name, "moe": "moe" in cfg.layer_ffns, "weight_dtype": wd,
                    "tp": tp, "chips": tp, "pages": place["pages"],
                    "weight_bytes": place["weight_bytes"], "capacity": capacity,
                    "slos": _slos(p), "sustained": best,
                    "sustained_per_chip": {k: v / tp if v else None for k, v in best.items()},
                    "mix": list(mix), "requests": n, "runs": runs, "pareto": pareto,
                    "assumptions": {"device": device, "tp": tp,
                                    "link": place["link"].name if tp > 1 else None,
                                    "weight_dtype": wd, "kv_dtype": "bfloat16",
                                    "policy": "mixed", "max_running": running,
                                    "token_budget": p.token_budget}})
    return out


def _pd_designs(p: Paper, got: dict, colocated: str, instances: int, tp: int) -> list[dict]:
    """One rate's row per design: the colocated instances, then each xPyD with the KV bytes
    and seconds it moved per request."""
    chips = instances * tp
    designs = [{"design": colocated, "prefill": 0, "decode": 0, "instances": instances,
                "chips": chips, **summary_of(got[colocated], p.slos, chips)}]
    for x, y in p.pd_designs:
        res = got[f"{x}P{y}D"]
        moved = res["transfers"].values()
        designs.append({
            "design": f"{x}P{y}D", "prefill": x, "decode": y, "instances": x + y,
            "chips": (x + y) * tp,
            "kv_bytes_mean": float(np.mean([t["bytes"] for t in moved])),
            "kv_seconds_mean": float(np.mean([t["seconds"] for t in moved])),
            **summary_of(res["timelines"], p.slos, (x + y) * tp)})
    return designs


def pd(p: Paper, progress) -> dict:
    cfg = refmodel.presets.get(p.pd_model)
    wd = WEIGHT_DTYPES.get(p.pd_model, "bfloat16")
    place = placement(cfg, p.device, p.page_size, wd)
    tp = place["tp"]
    running = tp * p.max_running
    pred = _predictor(cfg, p.device, tp, place["link"], wd)
    _, kv_link, _ = links_of(p.device)

    def make():
        return _sim(pred, place["pages"], p, running)

    def make_prefill():
        return Simulator(pred, num_pages=place["pages"], page_size=p.page_size,
                         policy="prefill-first", token_budget=p.token_budget,
                         max_running=running, prefix_cache=False)

    def make_decode():
        return Simulator(disagg.installed(pred), num_pages=place["pages"],
                         page_size=p.page_size, policy="mixed",
                         token_budget=running * 4096, max_running=running,
                         prefix_cache=False)

    def kv(r):
        return costs.kv_cache_bytes(cfg, len(r.prompt), 1, "bfloat16")
    instances = p.pd_designs[0][0] + p.pd_designs[0][1]  # of every design
    colocated = f"{instances} colocated"

    def runs(reqs) -> dict:
        """{design: timelines} of the colocated instances and every PD design."""
        out = {colocated: disagg.colocated(reqs, make, instances)}
        for x, y in p.pd_designs:
            out[f"{x}P{y}D"] = disagg.disaggregated(reqs, make_prefill, make_decode, x, y, kv,
                                                    kv_link)
        return out
    mixes = []
    for mix in p.mixes:
        capacity = capacity_of(make, mix, p, cfg.vocab_size, max(p.requests * tp, 4 * running))
        full = trace_of(p, mix, math.inf, cfg.vocab_size,
                        max(p.requests * tp, 4 * running) * instances)
        caps = {k: steady_rate(v if k == colocated else v["timelines"])
                for k, v in runs(full).items()}
        rows = []
        for f in p.rate_fractions:
            rate = f * capacity * instances
            reqs = trace_of(p, mix, rate, cfg.vocab_size, p.requests * tp * instances)
            progress(f"pd {mix[0]} at {rate:.1f} requests/s")
            designs = _pd_designs(p, runs(reqs), colocated, instances, tp)
            rows.append({"rate": rate, "rate_fraction": f, "designs": designs})
        mixes.append({"mix": list(mix), "slos": _slos(p), "capacity_per_instance": capacity,
                      "design_capacity": caps, "rates": rows})
    return {"model": p.pd_model, "tp": tp, "mixes": mixes,
            "assumptions": {"device": p.device, "tp_per_instance": tp,
                            "kv_link": kv_link.name, "kv_dtype": "bfloat16",
                            "weight_dtype": wd, "routing": "round-robin",
                            "prefill_policy": "prefill-first", "colocated_policy": "mixed",
                            "token_budget": p.token_budget, "max_running": running}}


def afd_rows(p: Paper) -> list[dict]:
    chip = chip_of(p.device)
    up, link, domain = links_of(p.device)
    cfgs = [refmodel.presets.get(m) for m in p.afd_models]
    rows = []
    for cfg in cfgs:
        wd = WEIGHT_DTYPES.get(cfg.name, "bfloat16")
        for context in AFD_CONTEXTS:
            for batch in AFD_BATCHES:
                got = afd.when_it_pays([cfg], chip, link, p.afd_chips, (context,), (batch,),
                                       weight_dtype=wd, kv_dtype="bfloat16",
                                       act_dtype="bfloat16", scale_up=up, domain=domain)
                rows += got or [{  # said, not dropped: no split of the chips holds it
                    "model": cfg.name, "moe": "moe" in cfg.layer_ffns, "context": context,
                    "batch": batch, "fits": False,
                    "reason": f"no attention:FFN split of {p.afd_chips} x {chip.name} holds "
                              f"the weights and {batch * p.afd_chips} sequences of {context} "
                              "tokens"}]
    return rows


def sram_study(p: Paper) -> dict:
    s_chip = chip_of(p.sram_chip, "float16")
    s_link, _, _ = links_of(p.sram_chip)
    g_chip = chip_of(p.device)
    g_link, kv_link, domain = links_of(p.device)
    need = []
    for spec in dict.fromkeys(p.models + (p.sram_model,)):
        name = model_device(spec, p.device)[0]
        cfg = refmodel.presets.get(name)
        for chip in (s_chip, chip_of("Cerebras WSE-3", "float16")):
            n = sram.chips_needed(cfg, chip, "float16", "float16", 1, p.context + 1)
            need.append({"model": name, "chip": chip.name, **n})
    cfg = refmodel.presets.get(p.sram_model)
    curve = sram.pareto(cfg, s_chip, s_link, g_chip, g_link, domain, p.sram_batches,
                        p.context, "float16", "float16", "float16")
    chips = sram.chips_needed(cfg, s_chip, "float16", "float16", 1, p.context + 1)["chips"]
    hetero = sram.heterogeneous(cfg, g_chip, domain, kv_link, s_chip, s_link, chips,
                                p.context, 1, 1, "float16", "float16", "float16")
    return {"chips_needed": need, "pareto": curve,
            "heterogeneous": {k: v for k, v in hetero.items() if k != "decode"}}


def study(p: Paper, progress=None) -> dict:
    p.check()
    say = progress or (lambda _: None)
    out = {"paper": dataclasses.asdict(p), "scale_out": scale_out(p, say)}
    out["pd"] = pd(p, say)
    say("attention-FFN disaggregation")
    out["afd"] = afd_rows(p)
    say("SRAM chips")
    out["sram"] = sram_study(p)
    return out
