"""SRAM-only decode chips on paper: how many chips a model needs, and the per-user and
per-chip token rates of a layer pipeline over them, beside an HBM GPU baseline.

The chips. A Groq LPU (tensor streaming processor) has no DRAM: 220 MiB (230 MB) of on-die
SRAM at 80 TB/s, 188 TFLOP/s FP16, and chip-to-chip links (~480 GB/s off-chip in all) that
the compiler schedules statically; Abts et al., "A software-defined tensor streaming
multiprocessor for large-scale machine learning", ISCA 2022 (doi:10.1145/3470496.3527405):
up to 10,440 TSPs, "less than 3 microseconds of end-to-end system latency". A Cerebras WSE-3
holds 44 GB of SRAM at 21 PB/s on one wafer (Cerebras WSE-3 launch, March 2024). The
numbers of either chip are the caller's `Chip` and `Link` (microbench's hardware database
holds them with their sources); nothing here is specific to a vendor.

The model (every formula below is what the code computes):

- Capacity. chips = ceil((weight bytes + KV bytes if held) / (memory x usable)). Llama 3
  70B in bfloat16 is 70.6e9 x 2 B = 141 GB, i.e. ceil(141e9 / 230e6) = 614 LPUs for the
  weights alone. Groq's public Llama 2 70B system is quoted at 576 chips (8 racks x 9 nodes
  x 8 LPUs; Hacker News discussion of Groq's launch, item 39435411, and SemiAnalysis,
  "Groq Inference Tokenomics", Feb 2024): 576 x 230 MB = 132 GB is less than Llama 2 70B's
  138 GB in FP16, so that system cannot hold every weight in 16 bits; Groq's numerics
  (lower-precision storage of part of the weights) is the likely difference.
- Pipeline. The model is a chain: embedding table, L layers (weights + this batch's KV of
  context + 1 tokens; layers are taken as equal, the average of mixed patterns), final norm
  and LM head. The chips cut the chain into equal slices of resident bytes (so every chip
  holds R / chips bytes), where the bytes fall, not at layer boundaries: with chips <= L a
  stage holds about L / chips layers (the rough "ceil(L / chips)" within one layer), with
  chips > L each layer is cut across several chips (what 600 chips for 80 layers requires).
  A stage holding a fraction f of an item does f of its FLOPs and bytes (from
  `refmodel.costs.phase_costs`, count="engine", for one micro-batch of rows = batch / m
  sequences). Its time is the roofline `chip.time(F_s, Y_s)`.
  The cut balances memory, not time: a stage mostly holding the embedding table (read one
  row per token) idles, the LM head's stage is busy, and the slowest stage sets the beat.
- Hops. Between stages: link.send(rows x D x act bytes) (a cut inside a layer moves a
  vector of about that size too); the sampled token ids go back from the last stage to the
  first: link.send(rows x 4 B).
- Rates. latency = sum of stage times + hops: one token of one sequence. With m
  micro-batches in flight the beat is the slowest stage (or hop); a sequence's next token
  needs its previous one, so the cycle is max(latency, m x beat), and
  tokens/s/user = 1 / cycle, tokens/s = batch / cycle, tokens/s/chip = that / chips.
  Extra micro-batches help until m x beat reaches the latency (the pipeline is full).
- GPU baseline: n HBM chips with tensor parallelism: per step chip.time(F / n, Y / n)
  plus 2 ring all-reduces per layer of rows x D x act bytes (Megatron-LM's two per layer).
- Heterogeneous: prefill on GPUs, the prompt's KV shipped over a link, decode on SRAM:
  TTFT = prefill + transfer, TPOT = the pipeline's cycle.

What is left out: on-chip scheduling losses, pipeline fill/drain, the KV of a batch that
outgrows SRAM (`fits` says when the slice exceeds a chip), prefill on the SRAM chips.
"""

from __future__ import annotations

import math

from refmodel import costs
from refmodel.counting import BYTES
from refmodel.sim.cluster import Chip, Link

TOKEN_ID_BYTES = 4  # int32 token id sent back from the last stage to the first


# Validation ------------------------------------------------------------------------------------

def _int(field: str, value, minimum: int) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
        raise ValueError(f"{field}={value!r}: must be an integer >= {minimum}")
    return value


def _dtype(cfg, field: str, value) -> str:
    value = value or cfg.dtype
    if value not in BYTES:
        raise ValueError(f"{field}={value!r}: must be one of {sorted(BYTES)}")
    return value


def _typed(field: str, value, kind) -> None:
    if not isinstance(value, kind):
        raise ValueError(f"{field}={value!r}: must be a {kind.__name__}")


def _divides(batch: int, microbatches: int) -> None:
    if batch % microbatches:
        raise ValueError(f"batch={batch} is not divisible by microbatches={microbatches}; "
                         f"choose microbatches among the divisors of batch")


def _assumptions(cfg, chip: Chip, link: Link | None, dt: dict, **more) -> dict:
    return {"model": cfg.name, "chip": chip.name, "chip_dtype": chip.dtype,
            "link": link.name if link else None, **dt, **more}


# Capacity --------------------------------------------------------------------------------------

def chips_needed(cfg, chip: Chip, weight_dtype: str | None = None, kv_dtype: str | None = None,
                 batch: int = 1, context: int = 0, hold_kv: bool = True,
                 usable: float = 1.0) -> dict:
    """Chips whose memory holds the weights (and, if `hold_kv`, the KV of `batch` sequences
    of `context` tokens): ceil(bytes / (chip.memory x usable)).

    Returns {"chips", "weight_chips" (weights alone), "weight_bytes", "kv_bytes",
    "total_bytes", "bytes_per_chip", "assumptions"}.
    """
    _typed("chip", chip, Chip)
    _int("batch", batch, 1)
    _int("context", context, 0)
    ok = isinstance(usable, (int, float)) and not isinstance(usable, bool) and 0 < usable <= 1
    if not ok:
        raise ValueError(f"usable={usable!r}: must be a fraction in (0, 1]")
    wd, kd = _dtype(cfg, "weight_dtype", weight_dtype), _dtype(cfg, "kv_dtype", kv_dtype)
    weight = costs.param_counts(cfg)["total"] * BYTES[wd]
    kv = costs.kv_cache_bytes(cfg, context, batch, kd) if hold_kv else 0.0
    per_chip = chip.memory * usable
    return {"chips": max(1, math.ceil((weight + kv) / per_chip)),
            "weight_chips": max(1, math.ceil(weight / per_chip)),
            "weight_bytes": weight, "kv_bytes": kv, "total_bytes": weight + kv,
            "bytes_per_chip": per_chip,
            "assumptions": _assumptions(cfg, chip, None, {"weight_dtype": wd, "kv_dtype": kd},
                                        batch=batch, context=context, hold_kv=hold_kv,
                                        usable=usable)}


# Pipeline --------------------------------------------------------------------------------------

def _chain(cfg, batch: int, rows: int, context: int, dt: dict) -> list[tuple]:
    """The model as (name, resident bytes, FLOPs, bytes) items for one micro-batch of `rows`."""
    kw = dict(weight_dtype=dt["weight_dtype"], kv_dtype=dt["kv_dtype"],
              act_dtype=dt["act_dtype"], count="engine")
    attn = costs.phase_costs(cfg, "decode_attention", rows, context, **kw)
    ffn = costs.phase_costs(cfg, "decode_ffn", rows, context, **kw)
    whole = costs.phase_costs(cfg, "decode", rows, context, **kw)
    embed = whole["ops"].get("embed", {"flops": 0.0, "bytes": 0.0})
    head_f = whole["flops"] - attn["flops"] - ffn["flops"] - embed["flops"]
    head_y = whole["bytes"] - attn["bytes"] - ffn["bytes"] - embed["bytes"]
    comp, ws = costs.param_counts(cfg)["components"], BYTES[dt["weight_dtype"]]
    embed_res = (comp["embedding"] + comp["positions"]) * ws
    layers_res = (sum(comp.values()) - comp["embedding"] - comp["positions"]
                  - comp["lm_head"]) * ws
    kv = costs.kv_cache_bytes(cfg, context + 1, batch, dt["kv_dtype"])
    L = cfg.n_layers
    layer = ((layers_res + kv) / L, (attn["flops"] + ffn["flops"]) / L,
             (attn["bytes"] + ffn["bytes"]) / L)
    return ([("embed", embed_res, embed["flops"], embed["bytes"])]
            + [(f"layer{i}", *layer) for i in range(L)]
            + [("head", comp["lm_head"] * ws, head_f, head_y)])


def _cut(chain: list[tuple], chips: int) -> tuple[list[float], list[float], float]:
    """FLOPs and bytes per stage when `chips` cut the chain into equal resident slices."""
    total = sum(item[1] for item in chain)
    q = total / chips
    flops, nbytes = [0.0] * chips, [0.0] * chips
    a = 0.0
    for _, res, f, y in chain:
        b = a + res
        if res <= 0:  # no resident bytes (a tied head): its work goes where it sits
            s = min(chips - 1, int(a // q))
            flops[s] += f
            nbytes[s] += y
        else:
            for s in range(min(chips - 1, int(a // q)), min(chips, math.ceil(b / q))):
                frac = max(0.0, min(b, (s + 1) * q) - max(a, s * q)) / res
                flops[s] += frac * f
                nbytes[s] += frac * y
        a = b
    return flops, nbytes, q


def pipeline_decode(cfg, chip: Chip, link: Link, chips: int, batch: int, context: int,
                    microbatches: int = 1, weight_dtype: str | None = None,
                    kv_dtype: str | None = None, act_dtype: str | None = None) -> dict:
    """One decode step of `batch` sequences at `context` cached tokens, pipelined over
    `chips` chips with `microbatches` micro-batches of batch / microbatches sequences in
    flight (the module docstring gives every formula).

    Returns {"latency" (s, one token of one sequence), "beat" (s, slowest stage or hop),
    "cycle" (s between two tokens of one sequence), "tokens_per_s_per_user",
    "tokens_per_s", "tokens_per_s_per_chip", "stage_times" (s, per stage),
    "hop_time" (s, one activation hop), "stage_resident_bytes", "fits", "assumptions"}.
    """
    _typed("chip", chip, Chip)
    _typed("link", link, Link)
    _int("chips", chips, 1)
    _int("batch", batch, 1)
    _int("context", context, 0)
    _int("microbatches", microbatches, 1)
    _divides(batch, microbatches)
    dt = {"weight_dtype": _dtype(cfg, "weight_dtype", weight_dtype),
          "kv_dtype": _dtype(cfg, "kv_dtype", kv_dtype),
          "act_dtype": _dtype(cfg, "act_dtype", act_dtype)}
    rows = batch // microbatches
    flops, nbytes, resident = _cut(_chain(cfg, batch, rows, context, dt), chips)
    stage = [chip.time(f, y) for f, y in zip(flops, nbytes, strict=True)]
    hop = link.send(rows * cfg.d_model * BYTES[dt["act_dtype"]])
    back = link.send(rows * TOKEN_ID_BYTES) if chips > 1 else 0.0
    latency = sum(stage) + (chips - 1) * hop + back
    beat = max(max(stage), hop if chips > 1 else 0.0)
    cycle = max(latency, microbatches * beat)
    return {"latency": latency, "beat": beat, "cycle": cycle,
            "tokens_per_s_per_user": 1.0 / cycle, "tokens_per_s": batch / cycle,
            "tokens_per_s_per_chip": batch / cycle / chips, "stage_times": stage,
            "hop_time": hop, "stage_resident_bytes": resident,
            "fits": resident <= chip.memory,
            "assumptions": _assumptions(cfg, chip, link, dt, batch=batch, context=context,
                                        chips=chips, microbatches=microbatches)}


# HBM baseline, Pareto sweep, heterogeneous serving -------------------------------------------

def tensor_parallel_decode(cfg, chip: Chip, link: Link, n: int, batch: int, context: int,
                           weight_dtype: str | None = None, kv_dtype: str | None = None,
                           act_dtype: str | None = None) -> dict:
    """One decode step of `batch` sequences on n chips with tensor parallelism: every chip
    does 1/n of the FLOPs and bytes (weights, KV, activations) in one roofline call, and
    each layer pays 2 ring all-reduces of batch x D x act bytes over `link`.

    Returns {"step", "compute" (s), "comm" (s), "tokens_per_s_per_user", "tokens_per_s",
    "tokens_per_s_per_chip", "fits" ((weights + KV) / n <= memory), "assumptions"}.
    """
    _typed("chip", chip, Chip)
    _typed("link", link, Link)
    _int("n", n, 1)
    _int("batch", batch, 1)
    _int("context", context, 0)
    dt = {"weight_dtype": _dtype(cfg, "weight_dtype", weight_dtype),
          "kv_dtype": _dtype(cfg, "kv_dtype", kv_dtype),
          "act_dtype": _dtype(cfg, "act_dtype", act_dtype)}
    d = costs.phase_costs(cfg, "decode", batch, context, dt["weight_dtype"], dt["kv_dtype"],
                          dt["act_dtype"], count="engine")
    compute = chip.time(d["flops"] / n, d["bytes"] / n)
    comm = 2 * cfg.n_layers * link.all_reduce(batch * cfg.d_model * BYTES[dt["act_dtype"]], n)
    step = compute + comm
    held = chips_needed(cfg, chip, dt["weight_dtype"], dt["kv_dtype"], batch, context + 1)
    return {"step": step, "compute": compute, "comm": comm,
            "tokens_per_s_per_user": 1.0 / step, "tokens_per_s": batch / step,
            "tokens_per_s_per_chip": batch / step / n,
            "fits": held["total_bytes"] / n <= chip.memory,
            "assumptions": _assumptions(cfg, chip, link, dt, batch=batch, context=context,
                                        chips=n, parallelism="tensor")}


def _best_pipeline(cfg, chip, link, chips, batch, context, dt) -> dict:
    """The micro-batch count (a divisor of batch) with the most tokens/s, then lowest cycle."""
    runs = [pipeline_decode(cfg, chip, link, chips, batch, context, m, **dt)
            for m in range(1, batch + 1) if batch % m == 0]
    return max(runs, key=lambda r: (r["tokens_per_s"], -r["cycle"]))


def pareto(cfg, sram_chip: Chip, sram_link: Link, gpu_chip: Chip, gpu_link: Link, gpus: int,
           batches, context: int, weight_dtype: str | None = None,
           kv_dtype: str | None = None, act_dtype: str | None = None) -> dict:
    """Tokens/s/user against tokens/s/chip over `batches`, for an SRAM pipeline (as many
    chips as hold weights + KV, `chips_needed`; the best micro-batch count) and for `gpus`
    HBM chips with tensor parallelism. JSON-ready rows for one plot with two curves:

        {"sram": [{"batch", "chips", "microbatches", "tokens_per_s_per_user",
                   "tokens_per_s_per_chip", "fits"}], "gpu": [...same, microbatches 1],
         "assumptions"}
    """
    batches = list(batches)
    if not batches:
        raise ValueError("batches=[]: must list at least one batch size")
    dt = {"weight_dtype": weight_dtype, "kv_dtype": kv_dtype, "act_dtype": act_dtype}
    sram, gpu = [], []
    for b in batches:
        chips = chips_needed(cfg, sram_chip, weight_dtype, kv_dtype, b, context + 1)["chips"]
        p = _best_pipeline(cfg, sram_chip, sram_link, chips, b, context, dt)
        sram.append({"batch": b, "chips": chips,
                     "microbatches": p["assumptions"]["microbatches"],
                     "tokens_per_s_per_user": p["tokens_per_s_per_user"],
                     "tokens_per_s_per_chip": p["tokens_per_s_per_chip"], "fits": p["fits"]})
        t = tensor_parallel_decode(cfg, gpu_chip, gpu_link, gpus, b, context, **dt)
        gpu.append({"batch": b, "chips": gpus, "microbatches": 1,
                    "tokens_per_s_per_user": t["tokens_per_s_per_user"],
                    "tokens_per_s_per_chip": t["tokens_per_s_per_chip"], "fits": t["fits"]})
    return {"sram": sram, "gpu": gpu,
            "assumptions": {"model": cfg.name, "sram_chip": sram_chip.name,
                            "sram_link": sram_link.name, "gpu_chip": gpu_chip.name,
                            "gpu_link": gpu_link.name, "gpus": gpus, "context": context,
                            "batches": batches,
                            "weight_dtype": _dtype(cfg, "weight_dtype", weight_dtype),
                            "kv_dtype": _dtype(cfg, "kv_dtype", kv_dtype),
                            "act_dtype": _dtype(cfg, "act_dtype", act_dtype)}}


def heterogeneous(cfg, prefill_chip: Chip, prefill_chips: int, kv_link: Link, sram_chip: Chip,
                  sram_link: Link, sram_chips: int, prompt: int, batch: int = 1,
                  microbatches: int = 1, weight_dtype: str | None = None,
                  kv_dtype: str | None = None, act_dtype: str | None = None) -> dict:
    """Prefill one `prompt`-token request on `prefill_chips` HBM chips (1/n of its FLOPs and
    bytes each; their own communication is not counted), ship its KV over `kv_link`, decode
    on `sram_chips` SRAM chips in a pipeline of `batch` sequences at context `prompt`.

    Returns {"ttft" (= prefill + transfer), "prefill", "transfer", "kv_bytes", "tpot" (the
    pipeline's cycle), "decode" (pipeline_decode's dict), "assumptions"}.
    """
    _typed("prefill_chip", prefill_chip, Chip)
    _typed("kv_link", kv_link, Link)
    _int("prefill_chips", prefill_chips, 1)
    _int("prompt", prompt, 1)
    wd, kd = _dtype(cfg, "weight_dtype", weight_dtype), _dtype(cfg, "kv_dtype", kv_dtype)
    ad = _dtype(cfg, "act_dtype", act_dtype)
    p = costs.phase_costs(cfg, "prefill", 1, prompt, wd, kd, ad, count="engine")
    prefill = prefill_chip.time(p["flops"] / prefill_chips, p["bytes"] / prefill_chips)
    kv = costs.kv_cache_bytes(cfg, prompt, 1, kd)
    transfer = kv_link.send(kv)
    dec = pipeline_decode(cfg, sram_chip, sram_link, sram_chips, batch, prompt, microbatches,
                          wd, kd, ad)
    return {"ttft": prefill + transfer, "prefill": prefill, "transfer": transfer,
            "kv_bytes": kv, "tpot": dec["cycle"], "decode": dec,
            "assumptions": {**dec["assumptions"], "prefill_chip": prefill_chip.name,
                            "prefill_chips": prefill_chips, "kv_link": kv_link.name,
                            "prompt": prompt}}
