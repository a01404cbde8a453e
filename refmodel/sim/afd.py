"""Attention-FFN disaggregation (AFD) on paper: attention chips and FFN (expert) chips that
ping-pong micro-batches, against the same chips running the whole model.

Sources: MegaScale-Infer (Zhu et al. 2025, arXiv:2504.02263) serves MoE models with separate
attention and expert nodes, M:N communication between them and a ping-pong pipeline of
micro-batches; Step-3 (StepFun 2025, "Step-3 is Large yet Affordable", arXiv:2507.19427)
applies attention-FFN disaggregation to its decoding system.

The model (every formula is what the code computes; rooflines are `Chip.time`, costs are
`refmodel.costs.phase_costs` with count="engine", layers taken as equal):

- `batch` is the number of sequences per attention chip (what its KV memory holds). n_a
  attention chips hold the attention weights (replicated) and their sequences' KV; n_f FFN
  chips hold 1/n_f of the FFN / expert weights (tensor parallel for a dense FFN, expert
  parallel for MoE, balanced). The FFN side therefore sees n_a x batch tokens per step: its
  weights are read once for all of them, which is the point of AFD. Attention cannot share
  that way: every sequence reads its own KV, so its cost grows with the context.
- Per layer, per micro-batch of r = batch / m sequences per attention chip:
  T_a = attn_chip.time(decode_attention(r) / L),
  T_f = ffn_chip.time(decode_ffn(n_a r) / (L n_f)),
  T_c = link.send(max(r, n_a r / n_f) x D x act bytes): the busier port of a one-way hop
  (an attention chip sends r rows; an FFN chip receives n_a r / n_f rows).
  Each layer sends activations there and back: 2 x n_a x batch x D x act bytes per step.
- Ping-pong (MegaScale-Infer, Section 4): with m micro-batches each resource works on one
  micro-batch while the others are elsewhere, so one layer takes
      T_layer = max(m x max(T_a, T_f, T_c), T_a + T_f + 2 T_c),
  the first term being the busiest resource once the pipeline is full, the second one
  micro-batch's round trip (its next layer cannot start before its FFN output returns).
  m = 1 gives T_a + 2 T_c + T_f exactly (everything serialises). Communication is hidden
  (T_layer = m max(T_a, T_f)) when T_c <= max(T_a, T_f) and
  m >= (T_a + T_f + 2 T_c) / max(T_a, T_f): with T_a = T_f = T that is m >= 2 + 2 T_c / T,
  so m = 2 hides nothing unless T_c = 0 and m = 3 hides T_c <= T / 2; MegaScale-Infer
  states the same constraint. Splitting into micro-batches is not free: each micro-batch
  reads the weights again.
- Step = L x T_layer + m x (embedding + LM head for r tokens) on an attention chip.
  tokens/s = n_a batch / step, per chip / (n_a + n_f), per user 1 / step.
- Colocated baseline (`colocated_step`): the same n chips as n / tp replicas of the whole
  model, tensor parallel inside a replica (the deployment MegaScale-Infer compares with).
  Each chip holds `batch` sequences too, but a replica's FFN sees only its own tp x batch
  tokens, and attention and FFN run one after the other on the same chips:
  T_layer = T_a + T_f + 2 all_reduce(tp x batch x D x act, tp).

What the comparison shows: the FFN's weights are read once per pass, so its FLOP/byte grows
with the tokens it sees (n_a x batch / m under AFD, tp x batch colocated); an MoE layer
touches up to all E experts and needs far more tokens than a dense one before its reads are
amortised. Attention's bytes are per-sequence KV, so more attention chips cannot share them.
Against a design that already shards the FFN over every chip for every token (wide expert
parallelism), identical chips do the same roofline work either way: AFD's gain there is only
hidden communication and a ratio fitted to the load (or different chips on each side), and
each extra micro-batch reads the weights again. `fits` flags weights + KV beyond a chip.
"""

from __future__ import annotations

import functools

from refmodel import costs
from refmodel.counting import BYTES
from refmodel.sim.cluster import Chip, Link

STAGES = ("attention", "ffn", "comm", "dependency")


# Validation ------------------------------------------------------------------------------------

def _int(field: str, value, minimum: int) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
        raise ValueError(f"{field}={value!r}: must be an integer >= {minimum}")
    return value


def _typed(field: str, value, kind) -> None:
    if not isinstance(value, kind):
        raise ValueError(f"{field}={value!r}: must be a {kind.__name__}")


def _dtypes(cfg, weight_dtype, kv_dtype, act_dtype) -> dict:
    out = {}
    for field, value in (("weight_dtype", weight_dtype), ("kv_dtype", kv_dtype),
                         ("act_dtype", act_dtype)):
        value = value or cfg.dtype
        if value not in BYTES:
            raise ValueError(f"{field}={value!r}: must be one of {sorted(BYTES)}")
        out[field] = value
    return out


# Costs (memoised: the searches below ask for the same phases many times) ----------------------

@functools.lru_cache(maxsize=4096)
def _phase(cfg, phase: str, rows: int, context: int, wd: str, kd: str, ad: str) -> tuple:
    c = costs.phase_costs(cfg, phase, rows, context, wd, kd, ad, count="engine")
    return c["flops"], c["bytes"]


def _ends(cfg, rows: int, dt: dict) -> tuple:
    """Embedding gather + LM head for `rows` tokens (the final norm is left out)."""
    d = costs.dtypes(cfg, dt["weight_dtype"], dt["kv_dtype"], dt["act_dtype"])
    c = costs.embed_costs(cfg, rows, d) + costs.head_costs(cfg, rows, d)
    return c.flops, c.bytes


def _weights(cfg, wd: str) -> tuple[float, float]:
    """(attention-side bytes, FFN-side bytes): the FFN side is dense FFNs, routers, experts."""
    comp = costs.param_counts(cfg)["components"]
    ffn = comp["dense_ffn"] + comp["router"] + comp["routed_experts"] + comp["shared_experts"]
    return (sum(comp.values()) - ffn) * BYTES[wd], ffn * BYTES[wd]


def _layer(cfg, attn_chip, ffn_chip, link, n_a, n_f, rows, context, dt) -> tuple:
    """(T_a, T_f, T_c) of one layer for one micro-batch of `rows` sequences per attn chip."""
    L, key = cfg.n_layers, (dt["weight_dtype"], dt["kv_dtype"], dt["act_dtype"])
    fa, ya = _phase(cfg, "decode_attention", rows, context, *key)
    ff, yf = _phase(cfg, "decode_ffn", n_a * rows, context, *key)
    t_a = attn_chip.time(fa / L, ya / L)
    t_f = ffn_chip.time(ff / (L * n_f), yf / (L * n_f))
    t_c = link.send(max(rows, n_a * rows / n_f) * cfg.d_model * BYTES[dt["act_dtype"]])
    return t_a, t_f, t_c


# Steps -----------------------------------------------------------------------------------------

def afd_step(cfg, attn_chip: Chip, ffn_chip: Chip, link: Link, n_attn: int, n_ffn: int,
             batch: int, context: int, microbatches: int = 1, weight_dtype: str | None = None,
             kv_dtype: str | None = None, act_dtype: str | None = None) -> dict:
    """One decode step with attention on `n_attn` chips (`batch` sequences each) and the
    FFNs on `n_ffn` chips, `microbatches` ping-ponged (formulas in the module docstring).

    Returns {"step" (s), "layer" {"attention", "ffn", "comm" (s per micro-batch),
    "layer_time" (s)}, "binds" (one of STAGES), "comm_hidden", "tokens_per_s",
    "tokens_per_s_per_chip", "tokens_per_s_per_user", "bytes_per_layer" (both directions,
    all chips), "ffn_tokens" (tokens an FFN pass sees), "ffn_intensity" (FLOP/byte),
    "fits" {"attention", "ffn"}, "assumptions"}.
    """
    for field, chip in (("attn_chip", attn_chip), ("ffn_chip", ffn_chip)):
        _typed(field, chip, Chip)
    _typed("link", link, Link)
    _int("n_attn", n_attn, 1)
    _int("n_ffn", n_ffn, 1)
    _int("batch", batch, 1)
    _int("context", context, 0)
    _int("microbatches", microbatches, 1)
    if batch % microbatches:
        raise ValueError(f"batch={batch} is not divisible by microbatches={microbatches}; "
                         f"choose microbatches among the divisors of batch")
    dt = _dtypes(cfg, weight_dtype, kv_dtype, act_dtype)
    m, rows = microbatches, batch // microbatches
    t_a, t_f, t_c = _layer(cfg, attn_chip, ffn_chip, link, n_attn, n_ffn, rows, context, dt)
    candidates = dict(zip(STAGES, (m * t_a, m * t_f, m * t_c, t_a + t_f + 2 * t_c),
                          strict=True))
    binds = max(candidates, key=candidates.get)
    layer = candidates[binds]
    step = cfg.n_layers * layer + m * attn_chip.time(*_ends(cfg, rows, dt))
    w_attn, w_ffn = _weights(cfg, dt["weight_dtype"])
    kv = costs.kv_cache_bytes(cfg, context + 1, batch, dt["kv_dtype"])
    ff, yf = _phase(cfg, "decode_ffn", n_attn * rows, context, dt["weight_dtype"],
                    dt["kv_dtype"], dt["act_dtype"])
    chips = n_attn + n_ffn
    return {"step": step,
            "layer": {"attention": t_a, "ffn": t_f, "comm": t_c, "layer_time": layer},
            "binds": binds, "comm_hidden": layer == m * max(t_a, t_f),
            "tokens_per_s": n_attn * batch / step,
            "tokens_per_s_per_chip": n_attn * batch / step / chips,
            "tokens_per_s_per_user": 1.0 / step,
            "bytes_per_layer": 2.0 * n_attn * batch * cfg.d_model * BYTES[dt["act_dtype"]],
            "ffn_tokens": n_attn * rows, "ffn_intensity": ff / yf,
            "fits": {"attention": w_attn + kv <= attn_chip.memory,
                     "ffn": w_ffn / n_ffn <= ffn_chip.memory},
            "assumptions": {"model": cfg.name, "attn_chip": attn_chip.name,
                            "ffn_chip": ffn_chip.name, "link": link.name, **dt,
                            "n_attn": n_attn, "n_ffn": n_ffn, "chips": chips,
                            "batch_per_attn_chip": batch, "context": context,
                            "microbatches": m}}


def colocated_step(cfg, chip: Chip, link: Link, n: int, batch: int, context: int,
                   tp: int | None = None, weight_dtype: str | None = None,
                   kv_dtype: str | None = None, act_dtype: str | None = None) -> dict:
    """The same kind of chips, n of them, as n / tp replicas of the whole model (tensor
    parallel over tp chips inside a replica, data parallel across: the vLLM / TensorRT-LLM
    deployment MegaScale-Infer compares with). A replica serves tp x `batch` sequences;
    each chip does 1/tp of its attention, then 1/tp of its FFN for those tp x batch tokens
    only, then 2 ring all-reduces of tp x batch x D x act bytes:
    T_layer = T_a + T_f + 2 all_reduce. `tp=None` takes the smallest divisor of n whose
    replica holds weights and KV (n if none does; `fits` then says False).

    Returns {"step", "layer" {"attention", "ffn", "comm", "layer_time"}, "tp",
    "tokens_per_s", "tokens_per_s_per_chip", "tokens_per_s_per_user", "ffn_tokens",
    "ffn_intensity", "fits", "assumptions"}.
    """
    _typed("chip", chip, Chip)
    _typed("link", link, Link)
    _int("n", n, 1)
    _int("batch", batch, 1)
    _int("context", context, 0)
    dt = _dtypes(cfg, weight_dtype, kv_dtype, act_dtype)
    w_attn, w_ffn = _weights(cfg, dt["weight_dtype"])
    kv = costs.kv_cache_bytes(cfg, context + 1, batch, dt["kv_dtype"])  # per chip

    def fits(t: int) -> bool:
        return (w_attn + w_ffn) / t + kv <= chip.memory

    if tp is None:
        tp = next((t for t in range(1, n + 1) if n % t == 0 and fits(t)), n)
    _int("tp", tp, 1)
    if n % tp:
        raise ValueError(f"tp={tp}: must divide n={n} (replicas of tp chips)")
    key, L, rows = (dt["weight_dtype"], dt["kv_dtype"], dt["act_dtype"]), cfg.n_layers, tp * batch
    fa, ya = _phase(cfg, "decode_attention", rows, context, *key)
    ff, yf = _phase(cfg, "decode_ffn", rows, context, *key)
    t_a = chip.time(fa / (L * tp), ya / (L * tp))
    t_f = chip.time(ff / (L * tp), yf / (L * tp))
    t_c = link.all_reduce(rows * cfg.d_model * BYTES[dt["act_dtype"]], tp)
    layer = t_a + t_f + 2 * t_c
    fe, ye = _ends(cfg, rows, dt)
    step = L * layer + chip.time(fe / tp, ye / tp)
    return {"step": step,
            "layer": {"attention": t_a, "ffn": t_f, "comm": t_c, "layer_time": layer},
            "tp": tp, "tokens_per_s": n * batch / step, "tokens_per_s_per_chip": batch / step,
            "tokens_per_s_per_user": 1.0 / step, "ffn_tokens": rows,
            "ffn_intensity": ff / yf, "fits": fits(tp),
            "assumptions": {"model": cfg.name, "chip": chip.name, "link": link.name, **dt,
                            "chips": n, "tp": tp, "batch_per_chip": batch, "context": context,
                            "parallelism": "replicas of tp chips (tensor parallel inside)"}}


# Searches --------------------------------------------------------------------------------------

def best_ratio(cfg, chip: Chip, link: Link, total: int, batch: int, context: int,
               microbatches=(1, 2, 3, 4), ffn_chip: Chip | None = None,
               require_fit: bool = True, weight_dtype: str | None = None,
               kv_dtype: str | None = None, act_dtype: str | None = None) -> dict:
    """The n_attn : n_ffn split of `total` chips (and micro-batch count among
    `microbatches` that divide `batch`) with the most tokens/s per chip; with `require_fit`
    only splits whose weights and KV fit. Compared with `colocated_step` on `total` chips
    (the smallest tensor-parallel group that holds the model).

    Returns {"best" (afd_step's dict), "n_attn", "n_ffn", "microbatches", "colocated"
    (colocated_step's dict), "gain" (best / colocated tokens/s per chip), "tried" [rows of
    n_attn, n_ffn, microbatches, tokens_per_s_per_chip, binds, fits]}.
    """
    _int("total", total, 2)
    ms = [m for m in microbatches if _int("microbatches", m, 1) and batch % m == 0]
    if not ms:
        raise ValueError(f"microbatches={tuple(microbatches)!r}: none divides batch={batch}")
    ffn_chip = ffn_chip or chip
    kw = dict(weight_dtype=weight_dtype, kv_dtype=kv_dtype, act_dtype=act_dtype)
    tried, best = [], None
    for n_a in range(1, total):
        for m in ms:
            r = afd_step(cfg, chip, ffn_chip, link, n_a, total - n_a, batch, context, m, **kw)
            fits = all(r["fits"].values())
            tried.append({"n_attn": n_a, "n_ffn": total - n_a, "microbatches": m,
                          "tokens_per_s_per_chip": r["tokens_per_s_per_chip"],
                          "binds": r["binds"], "fits": fits})
            ok = fits or not require_fit
            if ok and (best is None or r["tokens_per_s_per_chip"] > best["tokens_per_s_per_chip"]):
                best = r
    if best is None:
        raise ValueError(f"total={total}: no n_attn:n_ffn split fits {cfg.name} with batch="
                         f"{batch} at context={context}; use more chips, a smaller batch or "
                         f"require_fit=False")
    co = colocated_step(cfg, chip, link, total, batch, context, None, **kw)
    a = best["assumptions"]
    return {"best": best, "n_attn": a["n_attn"], "n_ffn": a["n_ffn"],
            "microbatches": a["microbatches"], "colocated": co,
            "gain": best["tokens_per_s_per_chip"] / co["tokens_per_s_per_chip"],
            "tried": tried}


def when_it_pays(cfgs, chip: Chip, link: Link, total: int, contexts, batches,
                 microbatches=(1, 2, 3, 4), require_fit: bool = True,
                 weight_dtype: str | None = None, kv_dtype: str | None = None,
                 act_dtype: str | None = None) -> list[dict]:
    """Best AFD split vs colocated on `total` chips for every model in `cfgs` (dense and
    MoE), context in `contexts` and batch per attention chip in `batches`; JSON-ready rows
    {"model", "moe", "context", "batch", "n_attn", "n_ffn", "microbatches", "binds",
    "ffn_tokens", "ffn_intensity", "afd_tokens_per_s_per_chip",
    "colocated_tokens_per_s_per_chip", "gain", "colocated_tp", "colocated_ffn_tokens",
    "colocated_ffn_intensity", "colocated_fits", "assumptions"}.
    Combinations where no split fits are skipped."""
    rows = []
    for cfg in cfgs:
        for context in contexts:
            for batch in batches:
                try:
                    r = best_ratio(cfg, chip, link, total, batch, context, microbatches,
                                   None, require_fit, weight_dtype, kv_dtype, act_dtype)
                except ValueError as e:
                    if "no n_attn:n_ffn split fits" in str(e):
                        continue
                    raise
                b = r["best"]
                rows.append({"model": cfg.name, "moe": "moe" in cfg.layer_ffns,
                             "context": context, "batch": batch, "n_attn": r["n_attn"],
                             "n_ffn": r["n_ffn"], "microbatches": r["microbatches"],
                             "binds": b["binds"], "ffn_tokens": b["ffn_tokens"],
                             "ffn_intensity": b["ffn_intensity"],
                             "afd_tokens_per_s_per_chip": b["tokens_per_s_per_chip"],
                             "colocated_tokens_per_s_per_chip":
                                 r["colocated"]["tokens_per_s_per_chip"],
                             "gain": r["gain"], "colocated_tp": r["colocated"]["tp"],
                             "colocated_ffn_tokens": r["colocated"]["ffn_tokens"],
                             "colocated_ffn_intensity": r["colocated"]["ffn_intensity"],
                             "colocated_fits": r["colocated"]["fits"],
                             "assumptions": {**b["assumptions"], "total": total}})
    return rows
