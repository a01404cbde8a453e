"""Attention-FFN disaggregation (AFD) on paper: attention chips and FFN (expert) chips that
ping-pong micro-batches, against the same chips deployed as they are served colocated.

Sources: MegaScale-Infer (Zhu et al. 2025, arXiv:2504.02263) serves MoE models with separate
attention and expert nodes, M:N communication between them and a ping-pong pipeline of
micro-batches; Step-3 (StepFun 2025, "Step-3 is Large yet Affordable", arXiv:2507.19427)
applies attention-FFN disaggregation to its decoding system.

The model (every formula is what the code computes; rooflines are `Chip.time`, costs are
`refmodel.costs.phase_costs` with count="engine", layers taken as equal):

- AFD (`afd_step`): n_a attention chips, `batch` sequences each, hold the attention weights
  (replicated, or split over groups of attn_tp chips) and their sequences' KV; n_f FFN chips
  hold 1/n_f of the FFN / expert weights (tensor parallel for a dense FFN, expert parallel
  for MoE, balanced; MoE routers, shared experts and dense layers replicated). The FFN side
  sees n_a x batch tokens per step: its weights are read once for all of them, which is the
  point of AFD. Attention cannot share that way: every sequence reads its own KV.
- A token's activation goes to every FFN shard that holds a part of its FFN: all of them for
  a tensor-parallel dense FFN, the c = G (1 - (1 - 1/G)^A) of G shards expected to hold one
  of its A experts for MoE (`shards_touched`; the independence approximation of
  `refmodel.moe.expected_distinct_experts`); a shard is a chip, or with `domain` a scale-up
  domain of FFN chips (the token crosses once and is forwarded inside, as DeepEP does). The
  partial results come back the same way.
- Per layer, per micro-batch of r = batch / m sequences per attention chip:
  T_a = attention of r sequences on one attention chip (`colocated.attention_seconds`:
        1/attn_tp of FLOPs, weights and activations, 1/kv_split of the KV) + its
        all-reduce when attn_tp > 1,
  T_f = ffn_chip.time(decode_ffn(n_a r) / (L n_f)),
  T_c = link.send(max(r c, n_a r c / n_f) x D x act bytes): the busier port of a one-way
  hop (an attention chip sends r c rows; an FFN chip receives n_a r c / n_f rows).
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

The baselines are the colocated deployments of refmodel.sim.colocated (tensor-parallel
replicas on the scale-up link; for MoE, expert parallelism across nodes), offered the same
micro-batch overlap; `colocated.baseline` takes the best that fits.

`best_ratio` compares the two at the same load: S = batch x total sequences on the same
chips either way, AFD's attention chips holding S / n_a each; the gain in tokens/s per chip
is then also the gain in tokens/s per user.

What the comparison shows: the FFN's weights are read once per pass, so its FLOP/byte grows
with the tokens it sees (S / m under AFD; tp x batch / m under TP, which a scale-up domain
caps at 8 chips; ep x batch / m under EP, which pools every chip's tokens). AFD gains where its
pooled FFN sees more tokens than the baseline's and the weights dominate the step: a dense
model at small batches, against TP replicas that each read every FFN weight. Against wide
expert parallelism, which already pools the tokens of every chip, identical chips do the same
roofline work either way, and AFD pays for its ping-pong by reading the weights again per
micro-batch and for its hop in copies of each token: its gain there comes only from
different chips on each side (MegaScale-Infer's heterogeneous deployment), not modelled here.
`fits` flags weights + KV beyond a chip.
"""

from __future__ import annotations

import itertools

from refmodel import costs
from refmodel.counting import BYTES
from refmodel.sim.cluster import Chip, Link
from refmodel.sim.colocated import (
    attention_seconds,
    baseline,
    check_divides,
    check_int,
    check_type,
    components,
    dtypes_of,
    ends,
    is_moe,
    kv_split,
    phase_cost,
)

STAGES = ("attention", "ffn", "comm", "dependency")


# Communication --------------------------------------------------------------------------------

def shards_touched(cfg, shards: int) -> float:
    """Expected number of `shards` FFN shards (chips, or nodes when a token crosses to a
    node once) one token's activation must reach, averaged over the layers: all of them
    for a tensor-parallel dense FFN; for MoE (E / shards experts each), those holding one of
    its A experts, shards (1 - (1 - 1/shards)^A)."""
    per_layer = [shards * (1.0 - (1.0 - 1.0 / shards) ** cfg.top_k) if f == "moe" else
                 float(shards) for f in cfg.layer_ffns if f != "none"]
    return sum(per_layer) / len(per_layer) if per_layer else 0.0


def destinations(n_ffn: int, domain: int | None) -> int:
    """Where a token's activation goes: each FFN chip (domain None), or each scale-up domain
    of `domain` chips the FFN chips fill (it crosses once, then is forwarded inside)."""
    return n_ffn if domain is None else -(-n_ffn // domain)


def _layer(cfg, attn_chip, ffn_chip, link, n_a, n_f, rows, context, dt, domain, attn_tp,
           attn_link) -> tuple:
    """(T_a, T_f, T_c, copies) of one layer for one micro-batch of `rows` sequences per
    attention chip."""
    L, key = cfg.n_layers, (dt["weight_dtype"], dt["kv_dtype"], dt["act_dtype"])
    ff, yf = phase_cost(cfg, "decode_ffn", n_a * rows, context, *key)
    t_a = attention_seconds(cfg, attn_chip, attn_tp * rows, context, dt, attn_tp) + \
        attn_link.all_reduce(attn_tp * rows * cfg.d_model * BYTES[dt["act_dtype"]], attn_tp)
    t_f = ffn_chip.time(ff / (L * n_f), yf / (L * n_f))
    c = shards_touched(cfg, destinations(n_f, domain))
    t_c = link.send(max(rows * c, n_a * rows * c / n_f) * cfg.d_model * BYTES[dt["act_dtype"]])
    return t_a, t_f, t_c, c


def afd_step(cfg, attn_chip: Chip, ffn_chip: Chip, link: Link, n_attn: int, n_ffn: int,
             batch: int, context: int, microbatches: int = 1, weight_dtype: str | None = None,
             kv_dtype: str | None = None, act_dtype: str | None = None,
             domain: int | None = None, attn_tp: int = 1,
             attn_link: Link | None = None) -> dict:
    """One decode step with attention on `n_attn` chips (`batch` sequences each) and the
    FFNs on `n_ffn` chips, `microbatches` ping-ponged (formulas in the module docstring).
    With `domain`, a token's activation crosses `link` once per scale-up domain of FFN chips
    it needs (`destinations`), as the expert-parallel baseline's does. `attn_tp` > 1 runs
    attention tensor parallel over groups of that many attention chips (as the baseline may:
    `_attention`), T_a then including one all-reduce of attn_tp x r x D x act bytes over
    `attn_link` (None: `link`).

    Returns {"step" (s), "layer" {"attention", "ffn", "comm" (s per micro-batch),
    "layer_time" (s)}, "binds" (one of STAGES), "comm_hidden", "tokens_per_s",
    "tokens_per_s_per_chip", "tokens_per_s_per_user", "bytes_per_layer" (both directions,
    all chips), "copies" (FFN chips a token reaches), "ffn_tokens" (tokens an FFN pass
    sees), "ffn_intensity" (FLOP/byte), "fits" {"attention", "ffn"}, "assumptions"}.
    """
    for field, chip in (("attn_chip", attn_chip), ("ffn_chip", ffn_chip)):
        check_type(field, chip, Chip)
    check_type("link", link, Link)
    check_int("n_attn", n_attn, 1)
    check_int("n_ffn", n_ffn, 1)
    check_int("batch", batch, 1)
    check_int("context", context, 0)
    check_int("microbatches", microbatches, 1)
    check_divides(batch, microbatches)
    check_int("attn_tp", attn_tp, 1)
    if n_attn % attn_tp:
        raise ValueError(f"attn_tp={attn_tp}: must divide n_attn={n_attn}")
    attn_link = attn_link or link
    check_type("attn_link", attn_link, Link)
    dt = dtypes_of(cfg, weight_dtype, kv_dtype, act_dtype)
    m, rows = microbatches, batch // microbatches
    if domain is not None:
        check_int("domain", domain, 1)
    t_a, t_f, t_c, copies = _layer(cfg, attn_chip, ffn_chip, link, n_attn, n_ffn, rows,
                                   context, dt, domain, attn_tp, attn_link)
    candidates = dict(zip(STAGES, (m * t_a, m * t_f, m * t_c, t_a + t_f + 2 * t_c),
                          strict=True))
    binds = max(candidates, key=candidates.get)
    layer = candidates[binds]
    step = cfg.n_layers * layer + m * attn_chip.time(*ends(cfg, rows, dt))
    w = components(cfg, dt["weight_dtype"])
    kv = costs.kv_cache_bytes(cfg, context + 1, attn_tp * batch, dt["kv_dtype"]) / kv_split(
        cfg, attn_tp)
    # MoE: routers, shared experts and dense layers replicated on every FFN chip
    w_ffn = w["routed"] / n_ffn + (w["ffn_rest"] if is_moe(cfg) else w["ffn_rest"] / n_ffn)
    ff, yf = phase_cost(cfg, "decode_ffn", n_attn * rows, context, dt["weight_dtype"],
                    dt["kv_dtype"], dt["act_dtype"])
    chips = n_attn + n_ffn
    return {"step": step,
            "layer": {"attention": t_a, "ffn": t_f, "comm": t_c, "layer_time": layer},
            "binds": binds, "comm_hidden": layer == m * max(t_a, t_f),
            "tokens_per_s": n_attn * batch / step,
            "tokens_per_s_per_chip": n_attn * batch / step / chips,
            "tokens_per_s_per_user": 1.0 / step,
            "bytes_per_layer": 2.0 * n_attn * batch * copies * cfg.d_model
            * BYTES[dt["act_dtype"]], "copies": copies,
            "ffn_tokens": n_attn * rows, "ffn_intensity": ff / yf,
            "fits": {"attention": w["attention"] / attn_tp + kv <= attn_chip.memory,
                     "ffn": w_ffn <= ffn_chip.memory},
            "assumptions": {"model": cfg.name, "attn_chip": attn_chip.name,
                            "ffn_chip": ffn_chip.name, "link": link.name, **dt,
                            "attn_link": attn_link.name, "n_attn": n_attn,
                            "n_ffn": n_ffn, "attn_tp": attn_tp, "domain": domain,
                            "chips": chips, "batch_per_attn_chip": batch,
                            "context": context, "microbatches": m}}


# Searches --------------------------------------------------------------------------------------

def best_ratio(cfg, chip: Chip, link: Link, total: int, batch: int, context: int,
               microbatches=(1, 2, 3, 4), ffn_chip: Chip | None = None,
               require_fit: bool = True, weight_dtype: str | None = None,
               kv_dtype: str | None = None, act_dtype: str | None = None,
               scale_up: Link | None = None, domain: int | None = None) -> dict:
    """AFD against the best colocated deployment at the same load: `total` chips holding
    S = batch x total sequences of `context` tokens either way (`batch` is sequences per
    chip, averaged over all the chips).

    AFD: the n_attn : n_ffn split, micro-batch count m (among `microbatches`) and attention
    tensor parallelism (1, 2, 4, ... <= domain, over `scale_up`) with the most tokens/s per
    chip, S / step / total (the step set by the fullest attention chip, which holds
    m ceil(S / (n_attn m)) sequences), its hop over `link`; with `require_fit` only splits
    whose weights and KV fit; a token crosses `link` once per FFN domain it needs.
    Colocated: `baseline` with every chip holding `batch` sequences, tensor parallel over
    `scale_up` inside domains of `domain` chips (None: `link`, and one domain of all the
    chips) or, for MoE, expert parallel. At equal load the gain is also the ratio of the
    per-user speeds (1 / step).

    Returns {"best" (afd_step's dict, with "sequences" S and tokens/s of S), "n_attn",
    "n_ffn", "microbatches", "colocated" (the baseline's step dict), "baselines" (every
    baseline tried), "gain" (best / colocated tokens/s per chip), "tried" [rows of n_attn,
    n_ffn, microbatches, attn_tp, batch (per attention chip), tokens_per_s_per_chip, binds,
    fits]}.
    """
    check_int("total", total, 2)
    check_int("batch", batch, 1)
    ms = [check_int("microbatches", m, 1) for m in microbatches]
    if not ms:
        raise ValueError("microbatches=(): give at least one micro-batch count")
    ffn_chip = ffn_chip or chip
    kw = dict(weight_dtype=weight_dtype, kv_dtype=kv_dtype, act_dtype=act_dtype)
    load, tried, best = batch * total, [], None
    dom = total if domain is None else domain
    for n_a in range(1, total):
        for m, a in itertools.product(ms, (a for a in (1, 2, 4, 8, 16, 32) if a <= dom)):
            if n_a % a:
                continue
            per = m * -(-load // (n_a * m))
            r = afd_step(cfg, chip, ffn_chip, link, n_a, total - n_a, per, context, m, **kw,
                         domain=domain, attn_tp=a, attn_link=scale_up)
            # the load is S sequences (slots past S on the fullest chips stay empty)
            r = {**r, "sequences": load, "tokens_per_s": load / r["step"],
                 "tokens_per_s_per_chip": load / r["step"] / total}
            fits = all(r["fits"].values())
            tried.append({"n_attn": n_a, "n_ffn": total - n_a, "microbatches": m,
                          "attn_tp": a, "batch": per,
                          "tokens_per_s_per_chip": r["tokens_per_s_per_chip"],
                          "binds": r["binds"], "fits": fits})
            ok = fits or not require_fit
            if ok and (best is None or r["tokens_per_s_per_chip"] > best["tokens_per_s_per_chip"]):
                best = r
    if best is None:
        raise ValueError(f"total={total}: no n_attn:n_ffn split fits {cfg.name} with "
                         f"{load} sequences at context={context}; use more chips, a smaller "
                         f"batch or require_fit=False")
    base = baseline(cfg, chip, scale_up or link, link, total if domain is None else domain,
                    total, batch, context, [m for m in ms if batch % m == 0] or [1], **kw)
    co = base["best"]
    a = best["assumptions"]
    return {"best": best, "n_attn": a["n_attn"], "n_ffn": a["n_ffn"],
            "microbatches": a["microbatches"], "colocated": co, "baselines": base["tried"],
            "gain": best["tokens_per_s_per_chip"] / co["tokens_per_s_per_chip"],
            "tried": tried}


def _row(cfg, context: int, batch: int, total: int, r: dict) -> dict:
    """One JSON-ready row of `when_it_pays`."""
    b, co = r["best"], r["colocated"]
    return {"model": cfg.name, "moe": is_moe(cfg), "context": context, "batch": batch,
            "afd_batch": b["assumptions"]["batch_per_attn_chip"], "n_attn": r["n_attn"],
            "n_ffn": r["n_ffn"], "microbatches": r["microbatches"],
            "binds": b["binds"], "ffn_tokens": b["ffn_tokens"],
            "ffn_intensity": b["ffn_intensity"], "afd_layer": b["layer"],
            "afd_tokens_per_s_per_chip": b["tokens_per_s_per_chip"],
            "afd_tokens_per_s_per_user": b["tokens_per_s_per_user"],
            "colocated_tokens_per_s_per_chip": co["tokens_per_s_per_chip"],
            "colocated_tokens_per_s_per_user": co["tokens_per_s_per_user"],
            "gain": r["gain"], "baseline": co["kind"],
            "baseline_size": co.get("tp", co.get("ep")), "baseline_attn_tp": co.get(
                "attn_tp", co.get("tp")),
            "baseline_microbatches": co["microbatches"],
            "baseline_link": co["assumptions"]["link"], "baseline_layer": co["layer"],
            "baseline_comm_share": co["comm_share"],
            "colocated_tp": co.get("tp"), "colocated_ffn_tokens": co["ffn_tokens"],
            "colocated_ffn_intensity": co["ffn_intensity"], "colocated_fits": co["fits"],
            "baselines": r["baselines"], "assumptions": {**b["assumptions"], "total": total}}


def when_it_pays(cfgs, chip: Chip, link: Link, total: int, contexts, batches,
                 microbatches=(1, 2, 3, 4), require_fit: bool = True,
                 weight_dtype: str | None = None, kv_dtype: str | None = None,
                 act_dtype: str | None = None, scale_up: Link | None = None,
                 domain: int | None = None) -> list[dict]:
    """Best AFD split vs the best colocated deployment (`best_ratio`) on `total` chips for
    every model in `cfgs` (dense and MoE), context in `contexts` and batch per attention
    chip (averaged over all chips: the same load for both designs) in `batches`;
    JSON-ready rows {"model", "moe", "context", "batch", "afd_batch", "n_attn",
    "n_ffn", "microbatches", "binds", "ffn_tokens", "ffn_intensity", "afd_layer",
    "afd_tokens_per_s_per_chip", "afd_tokens_per_s_per_user",
    "colocated_tokens_per_s_per_chip", "colocated_tokens_per_s_per_user", "gain",
    "baseline" ("tp" or "ep"), "baseline_size", "baseline_attn_tp", "baseline_microbatches",
    "baseline_link", "baseline_layer", "baseline_comm_share", "colocated_tp",
    "colocated_ffn_tokens", "colocated_ffn_intensity", "colocated_fits", "baselines",
    "assumptions"}.
    Combinations where no split fits are skipped."""
    rows = []
    for cfg in cfgs:
        for context in contexts:
            for batch in batches:
                try:
                    r = best_ratio(cfg, chip, link, total, batch, context, microbatches,
                                   None, require_fit, weight_dtype, kv_dtype, act_dtype,
                                   scale_up, domain)
                except ValueError as e:
                    if "no n_attn:n_ffn split fits" in str(e):
                        continue
                    raise
                rows.append(_row(cfg, context, batch, total, r))
    return rows
