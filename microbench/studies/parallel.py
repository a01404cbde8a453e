"""Tensor and expert parallelism on paper: when splitting a model over more chips stops paying,
from the analytic cost model (refmodel.parallel.comms) on the hardware database's spec chips.
Nothing is compiled or measured: every number is arithmetic on counted FLOPs and bytes, so the
whole study runs in seconds.

    tp   dense models' decode step on one device of a tensor-parallel group (Megatron,
         Shoeybi et al. 2019), TP 1, 2, 4, 8 (the degrees that divide the heads and FFN, within
         the device's scale-up domain), at batch 1 and a large batch: time per step split into
         weight reads, KV reads, activations, compute beyond memory, and the all-reduces; on
         the device's own scale-up link and on a slower one (PCIe) to show the link matters.
         Per doubling of TP: the speedup, the time saved and the communication added. "TP stops
         paying" after the first degree whose doubling speeds the step up by less than
         `threshold` (default 1.5x: 2x the chips for under 1.5x the speed raises chip-seconds
         per token by over a third).
    ep   an MoE (DeepSeek-V3 in FP8) decode with data-parallel attention and experts split
         over EP devices: per device, the all-to-all bytes (dispatch + combine, the exact
         ragged count an engine like DeepEP moves) against the expert weight bytes read, and
         their times (HBM for weights; the scale-up link inside one domain, the scale-out link
         beyond it), as the tokens per device grow.

Both are roofline bounds: spec peaks, a step takes max(compute, memory) + communication (no
overlap: an all-reduce waits for the layer it sums), ring all-reduces and pairwise all-to-alls
of (p - 1) latency-bearing steps each (`comms.Collective.time`). Each result row carries these
assumptions. `python -m microbench parallel` writes the JSON, the figures and a summary.
"""

from __future__ import annotations

import dataclasses

import refmodel
from microbench import hardware
from microbench.studies.scale import MEMORY_USE, chip_of, links_of
from refmodel import costs
from refmodel.moe import MoE, expected_distinct_experts
from refmodel.parallel import comms

BOUND = ("roofline bound: spec peaks, no overlap of comm with compute, ring/pairwise "
         "collectives")
COUNT = "engine"
THRESHOLD = 1.5  # a doubling of TP "pays" when the step gets at least this much faster
ACT_DTYPE = KV_DTYPE = COMPUTE_DTYPE = "bfloat16"
PARTS = ("weights", "kv", "act", "compute_excess", "comm")  # stacked, they sum to the step


@dataclasses.dataclass(frozen=True)
class Setup:
    """What the study depends on (recorded in the result)."""

    device: str = "H100 SXM"
    models: tuple[str, ...] = ("llama3-8b", "gemma2-27b", "llama3-70b")
    batches: tuple[int, ...] = (1, 64)
    context: int = 4096
    compare_link: str = "PCIe 5.0 x16"  # beside the device's own scale-up link
    max_tp: int = 8
    ep_device: str = "H200 SXM"
    ep_model: str = "deepseek-v3"
    ep_degrees: tuple[int, ...] = (8, 16, 32, 64)
    ep_batches: tuple[int, ...] = (1, 4, 16, 64, 128, 256)  # tokens per device
    threshold: float = THRESHOLD

    def check(self, names: dict[str, str] | None = None) -> None:
        """Raise ValueError naming the field (or `names[field]`, e.g. a command's option)."""
        names = names or {}

        def bad(field, value, why):
            return ValueError(f"{names.get(field, field)} {value!r}: {why}")

        for field in ("device", "ep_device"):
            name = getattr(self, field)
            try:
                device = hardware.get(name)
                chip_of(name, COMPUTE_DTYPE)
            except (KeyError, ValueError) as e:
                raise bad(field, name, e.args[0]) from None
            if not device.scale_up:
                raise bad(field, name, "lists no scale-up link (scale_up) to split a model over")
        if self.compare_link not in hardware.list_links():
            raise bad("compare_link", self.compare_link,
                      f"unknown link; valid: {', '.join(hardware.list_links())}")
        for field in ("models", "ep_model"):
            for name in (getattr(self, field),) if field == "ep_model" else getattr(self,
                                                                                     field):
                try:
                    cfg = refmodel.presets.get(name)
                except ValueError as e:
                    raise bad(field, name, e.args[0]) from None
                moe = cfg.ffn == "moe" or "moe" in cfg.layer_ffns
                if field == "models" and (moe or len(comms.tensor_degrees(cfg, 2)) < 2):
                    raise bad(field, name, "a dense model that TP 2 splits is needed here")
                if field == "ep_model" and not moe:
                    raise bad(field, name, "an MoE model is needed for expert parallelism")
        if not self.models:
            raise bad("models", "", "give at least one model")
        for field in ("batches", "ep_degrees", "ep_batches"):
            values = getattr(self, field)
            if not values or any(not isinstance(v, int) or isinstance(v, bool) or v < 1
                                 for v in values):
                raise bad(field, ",".join(map(str, values)), "give positive integers")
        if not isinstance(self.context, int) or self.context < 1:
            raise bad("context", self.context, "a positive integer")
        if not isinstance(self.max_tp, int) or self.max_tp < 2:
            raise bad("max_tp", self.max_tp, "an integer of at least 2")
        if not self.threshold > 1.0:
            raise bad("threshold", self.threshold, "a speedup above 1")
        experts = refmodel.presets.get(self.ep_model).n_experts
        _, out, domain = links_of(self.ep_device)
        for e in self.ep_degrees:
            if experts % e:
                raise bad("ep_degrees", e, f"must divide {self.ep_model}'s {experts} experts")
            if e > domain and out is None:
                raise bad("ep_degrees", e, f"beyond {self.ep_device}'s scale-up domain of "
                          f"{domain} and it lists no scale-out link")


def model(name: str):
    """The preset in the weight format its release ships (refmodel.presets.shipped:
    DeepSeek-V3's FP8 matrices beside bfloat16 vectors, embedding and router)."""
    return refmodel.presets.shipped(name)


def weight_dtype(cfg) -> str:
    return costs.dtypes(cfg).weight


def assumptions(device: str, link, wd: str, context: int, batch: int, **more) -> dict:
    chip = chip_of(device, COMPUTE_DTYPE)
    return {"device": device, "peak_flops": chip.flops, "compute_dtype": chip.dtype,
            "memory_bandwidth": chip.bandwidth, "memory_bytes": chip.memory,
            "link": None if link is None else link.name,
            "link_bandwidth": None if link is None else link.bandwidth,
            "link_latency": None if link is None else link.latency,
            "dtypes": {"weight": wd, "kv": KV_DTYPE, "act": ACT_DTYPE},
            "context": context, "batch": batch, "phase": "decode", "count": COUNT,
            "bound": BOUND, **more}


def parts(t: dict) -> dict:
    """A step_time split into PARTS that sum to its total: the memory time (weights, KV,
    activations), the compute time beyond it (zero when memory-bound), the communication."""
    return {"weights": t["weights"], "kv": t["kv"], "act": t["act"],
            "compute_excess": max(0.0, t["compute"] - t["memory"]), "comm": t["comm"]}


def fits(resident_bytes: float, memory_bytes: float) -> bool:
    return resident_bytes <= MEMORY_USE * memory_bytes


# ---------------------------------------------------------------------------- tensor parallel

def tp_row(cfg, device: str, link, tp: int, batch: int, context: int) -> dict:
    """One device of a TP group of `tp` in decode: its share, step time and parts."""
    chip = chip_of(device, COMPUTE_DTYPE)
    wd = weight_dtype(cfg)
    share = comms.per_device(cfg, "decode", batch, context, {"tensor": tp}, weight_dtype=None,
                             kv_dtype=KV_DTYPE, act_dtype=ACT_DTYPE, count=COUNT)
    t = comms.step_time(share, chip.flops, chip.bandwidth,
                        link.bandwidth if tp > 1 else None, link.latency if tp > 1 else 0.0)
    return {"tp": tp, "time": t, "parts": parts(t),
            "chip_s_per_token": t["total"] * tp / batch,
            "tokens_per_s_per_chip": batch / (t["total"] * tp),
            "weight_bytes": share["weight_bytes"], "kv_bytes": share["kv_bytes"],
            "comm_bytes": share["comm_bytes"], "collectives": share["collectives"],
            "fits": fits(share["weight_bytes"] + share["kv_bytes"], chip.memory),
            "assumptions": assumptions(device, link if tp > 1 else None, wd, context, batch,
                                       degrees={"tensor": tp})}


def doublings(rows: list[dict]) -> list[dict]:
    """Each step up in TP: speedup, roofline time saved, weight-read time saved, comm added."""
    out = []
    for a, b in zip(rows, rows[1:], strict=False):
        ta, tb = a["time"], b["time"]
        out.append({"from": a["tp"], "to": b["tp"], "speedup": ta["total"] / tb["total"],
                    "saved_s": max(ta["compute"], ta["memory"]) - max(tb["compute"],
                                                                      tb["memory"]),
                    "weights_saved_s": ta["weights"] - tb["weights"],
                    "comm_added_s": tb["comm"] - ta["comm"],
                    "comm_exceeds_weights_saved": tb["comm"] - ta["comm"]
                    > ta["weights"] - tb["weights"]})
    return out


def stops_paying(steps: list[dict], threshold: float) -> int | None:
    """The TP degree after which a step up speeds the step by less than `threshold`
    (None: every step up pays)."""
    return next((s["from"] for s in steps if s["speedup"] < threshold), None)


def tp_series(cfg, device: str, link, batch: int, context: int, degrees: list[int],
              threshold: float) -> dict:
    rows = [tp_row(cfg, device, link, tp, batch, context) for tp in degrees]
    steps = doublings(rows)
    exceeds = next((s["to"] for s in steps if s["comm_exceeds_weights_saved"]), None)
    return {"model": cfg.name, "batch": batch, "link": link.name, "rows": rows,
            "doublings": steps, "stops_paying_after": stops_paying(steps, threshold),
            "comm_exceeds_weights_saved_at": exceeds,
            "smallest_fitting_tp": next((r["tp"] for r in rows if r["fits"]), None),
            "threshold": threshold}


def tp_study(s: Setup) -> dict:
    up, _, domain = links_of(s.device)
    compare = hardware.link(hardware.get_link(s.compare_link))
    links = [up] + ([compare] if compare.name != up.name else [])
    series = []
    for name in s.models:
        cfg = model(name)
        degrees = comms.tensor_degrees(cfg, min(s.max_tp, domain))
        for batch in s.batches:
            for link in links:
                series.append(tp_series(cfg, s.device, link, batch, s.context, degrees,
                                        s.threshold))
    return {"device": s.device, "links": [link.name for link in links],
            "scale_up_chips": domain, "series": series,
            "note": f"The same {s.device} chip on each link: only the link differs"}


# ---------------------------------------------------------------------------- expert parallel

def ep_link(device: str, ep: int):
    """The device's scale-up link while the EP group fits its domain, else its scale-out link
    for the whole group (an upper bound on time: a group spanning a few domains would still
    reach its in-domain peers over the faster link)."""
    up, out, domain = links_of(device)
    return up if ep <= domain else out


def expert_bytes(cfg, tokens: float, ep: int, dt) -> dict:
    """Routed-expert weight bytes per device when `tokens` (the EP group's) are routed: read
    (the experts they touch, as comms.per_device counts them) and held (E / ep experts)."""
    moe = MoE.costs(cfg, tokens, dt)
    layers = sum(f == "moe" for f in cfg.layer_ffns)
    read = layers * (moe["ffn_up"].weight_bytes + moe["ffn_down"].weight_bytes) / ep
    touched = expected_distinct_experts(tokens, cfg.n_experts, cfg.top_k)
    return {"read": read, "held": read * cfg.n_experts / touched,
            "touched_per_device": touched / ep, "held_per_device": cfg.n_experts / ep,
            "moe_layers": layers}


def ep_row(cfg, device: str, ep: int, n: int, context: int) -> dict:
    """One device of EP `ep` with `n` decode tokens (data-parallel attention)."""
    chip = chip_of(device, COMPUTE_DTYPE)
    link = ep_link(device, ep)
    wd = weight_dtype(cfg)
    share = comms.per_device(cfg, "decode", n * ep, context, {"expert": ep}, weight_dtype=None,
                             kv_dtype=KV_DTYPE, act_dtype=ACT_DTYPE, count=COUNT)
    t = comms.step_time(share, chip.flops, chip.bandwidth, link.bandwidth, link.latency)
    wire = comms.step_time(share, chip.flops, chip.bandwidth, link.bandwidth, 0.0)["comm"]
    experts = expert_bytes(cfg, n * ep, ep, costs.dtypes(cfg, None, KV_DTYPE, ACT_DTYPE))
    a2a = {"wire_bytes": share["comm_bytes"], "s": t["comm"], "bandwidth_s": wire,
           "latency_s": t["comm"] - wire, "collectives": share["collectives"]}
    other = share["weight_bytes"] - experts["read"]  # attention, dense layers, shared, head
    return {"ep": ep, "tokens_per_device": n, "batch": n * ep, "link": link.name,
            "a2a": a2a, "experts": {**experts, "s": experts["read"] / chip.bandwidth},
            "other_weight_bytes": other, "kv_bytes": share["kv_bytes"], "time": t,
            "parts": parts(t), "a2a_over_expert_bytes": a2a["wire_bytes"] / experts["read"],
            "a2a_over_expert_time": a2a["s"] / (experts["read"] / chip.bandwidth),
            "fits": fits(other + experts["held"] + share["kv_bytes"], chip.memory),
            "assumptions": assumptions(device, link, wd, context, n * ep,
                                       degrees={"expert": ep}, attention="data parallel",
                                       tokens_per_device=n)}


def ep_study(s: Setup) -> dict:
    cfg = model(s.ep_model)
    _, _, domain = links_of(s.ep_device)
    rows = [ep_row(cfg, s.ep_device, e, n, s.context) for e in s.ep_degrees
            for n in s.ep_batches]
    per_degree = []
    for e in s.ep_degrees:
        mine = [r for r in rows if r["ep"] == e]
        cross = next((r["tokens_per_device"] for r in mine if r["a2a_over_expert_time"] >= 1),
                     None)
        per_degree.append({"ep": e, "link": mine[0]["link"],
                           "bytes_ratio": [mine[0]["a2a_over_expert_bytes"],
                                           mine[-1]["a2a_over_expert_bytes"]],
                           "time_ratio": [mine[0]["a2a_over_expert_time"],
                                          mine[-1]["a2a_over_expert_time"]],
                           "a2a_time_exceeds_expert_reads_from": cross})
    return {"device": s.ep_device, "model": s.ep_model, "weight_dtype": weight_dtype(cfg),
            "scale_up_chips": domain, "rows": rows, "per_degree": per_degree,
            "link_rule": f"EP <= {domain} (one scale-up domain): its scale-up link; beyond: "
                         "the scale-out link for the whole group"}


def study(s: Setup | None = None) -> dict:
    s = s or Setup()
    s.check()
    return {"kind": "parallel", "setup": dataclasses.asdict(s),
            "assumptions": {"bound": BOUND, "count": COUNT, "phase": "decode",
                            "compute_dtype": COMPUTE_DTYPE, "kv_dtype": KV_DTYPE,
                            "act_dtype": ACT_DTYPE, "fits": f"weights + KV held per device "
                            f"<= {MEMORY_USE} x its memory",
                            "weight_dtypes": {m: weight_dtype(model(m))
                                              for m in (*s.models, s.ep_model)}},
            "tp": tp_study(s), "ep": ep_study(s)}
