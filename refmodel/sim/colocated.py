"""Colocated deployments of a model on n identical chips, decode on paper: what
attention-FFN disaggregation (refmodel.sim.afd) is judged against. Every chip holds `batch`
sequences and runs attention then FFN for them.

    colocated_step        n / tp replicas, tensor parallel inside one (Megatron-LM): each chip
                          1/tp of its replica's attention (`kv_split`: MLA's latent is read
                          whole by every chip; GQA splits at most K ways) and FFN for
                          tp x r tokens, C = 2 ring all-reduces of tp x r x D x act bytes per
                          layer over the link given (the scale-up link when tp fits one node:
                          vLLM and TensorRT-LLM place TP 2-8 groups on one NVLink node)
    expert_parallel_step  MoE: n / ep groups of ep chips holding 1/ep of the routed experts
                          each (routers, shared experts and dense layers replicated);
                          attention data parallel across groups of attn_tp chips, tensor
                          parallel inside one (C includes its all-reduce); the group's FFN
                          work split over its ep chips (decode_ffn of ep x r tokens / ep); each
                          token dispatched to and combined from the remote holders of its
                          experts: (G - 1)(1 - (1 - 1/G)^A) copies each way, G = ep chips
                          inside a node, else ep / domain nodes over the scale-out link (a
                          token crosses to a node once and is forwarded inside, as DeepEP
                          does). DeepSeek-V3 technical report (arXiv:2412.19437) Section 3.4.2
                          decodes with attention TP4 + DP80 and EP320; SGLang serves DP
                          attention + EP.
    baseline              the best of both families that fits (tp, ep, attn_tp, m searched):
                          what an operator would deploy on those chips

Both are offered the micro-batch overlap AFD's ping-pong gets: with m micro-batches the chip
computes one while another's communication C is in flight, so a layer takes
      T_layer = max(m (T_a + T_f), m C, T_a + T_f + C)      (m = 1: the serial sum),
T_a and T_f being one micro-batch's attention and FFN rooflines (`Chip.time`, costs from
`refmodel.costs.phase_costs` with count="engine", layers taken as equal), and each
micro-batch reading the weights again. Step = L x T_layer + m x (embedding + LM head).
"""

from __future__ import annotations

import functools

from refmodel import costs
from refmodel.counting import BYTES
from refmodel.sim.cluster import Chip, Link

# Validation (shared with refmodel.sim.afd) ---------------------------------------------------

def check_int(field: str, value, minimum: int) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
        raise ValueError(f"{field}={value!r}: must be an integer >= {minimum}")
    return value


def check_type(field: str, value, kind) -> None:
    if not isinstance(value, kind):
        raise ValueError(f"{field}={value!r}: must be a {kind.__name__}")


def dtypes_of(cfg, weight_dtype, kv_dtype, act_dtype) -> dict:
    out = {}
    for field, value in (("weight_dtype", weight_dtype), ("kv_dtype", kv_dtype),
                         ("act_dtype", act_dtype)):
        value = value or cfg.dtype
        if value not in BYTES:
            raise ValueError(f"{field}={value!r}: must be one of {sorted(BYTES)}")
        out[field] = value
    return out


def check_divides(batch: int, m: int) -> None:
    if batch % m:
        raise ValueError(f"batch={batch} is not divisible by microbatches={m}; "
                         f"choose microbatches among the divisors of batch")


# Costs (memoised: the searches ask for the same phases many times) --------------------------

@functools.lru_cache(maxsize=4096)
def phase_cost(cfg, phase: str, rows: int, context: int, wd: str, kd: str, ad: str) -> tuple:
    c = costs.phase_costs(cfg, phase, rows, context, wd, kd, ad, count="engine")
    return c["flops"], c["bytes"]


def ends(cfg, rows: int, dt: dict) -> tuple:
    """Embedding gather + LM head for `rows` tokens (the final norm is left out)."""
    d = costs.dtypes(cfg, dt["weight_dtype"], dt["kv_dtype"], dt["act_dtype"])
    c = costs.embed_costs(cfg, rows, d) + costs.head_costs(cfg, rows, d)
    return c.flops, c.bytes


def components(cfg, wd: str) -> dict:
    """Weight bytes: "attention" (everything but the FFNs), "routed" (routed experts) and
    "ffn_rest" (dense FFNs, routers, shared experts)."""
    comp = costs.param_counts(cfg)["components"]
    rest = comp["dense_ffn"] + comp["router"] + comp["shared_experts"]
    ffn = rest + comp["routed_experts"]
    return {"attention": (sum(comp.values()) - ffn) * BYTES[wd],
            "routed": comp["routed_experts"] * BYTES[wd], "ffn_rest": rest * BYTES[wd]}


def _weights(cfg, wd: str) -> tuple[float, float]:
    """(attention-side bytes, FFN-side bytes): the FFN side is dense FFNs, routers, experts."""
    w = components(cfg, wd)
    return w["attention"], w["routed"] + w["ffn_rest"]


def is_moe(cfg) -> bool:
    return "moe" in cfg.layer_ffns


def overlap(m: int, t_a: float, t_f: float, comm: float) -> float:
    """A colocated layer with m micro-batches and `comm` seconds of communication per
    micro-batch: the chip computes one while another's communication is in flight."""
    return max(m * (t_a + t_f), m * comm, t_a + t_f + comm)


@functools.lru_cache(maxsize=4096)
def _parts(cfg, rows: int, context: int, wd: str, kd: str, ad: str) -> tuple:
    c = costs.phase_costs(cfg, "decode_attention", rows, context, wd, kd, ad, count="engine")
    return c["flops"], c["weight_bytes"] + c["act_bytes"], c["kv_bytes"]


def kv_split(cfg, tp: int) -> int:
    """Ways a tp-way tensor-parallel attention splits the KV cache: its heads, at most the
    K KV heads (past K, GQA's heads are replicated); MLA's latent is shared by every head,
    so each chip reads all of it (1)."""
    return 1 if "mla" in cfg.layer_kinds else min(tp, cfg.n_kv_heads)


def attention_seconds(cfg, chip, rows: int, context: int, dt: dict, tp: int) -> float:
    """Seconds per layer of one chip of a tp-way attention over `rows` sequences: 1/tp of
    the FLOPs, weights and activations, 1/kv_split of the KV."""
    f, y, kv = _parts(cfg, rows, context, dt["weight_dtype"], dt["kv_dtype"], dt["act_dtype"])
    L = cfg.n_layers
    return chip.time(f / (tp * L), (y / tp + kv / kv_split(cfg, tp)) / L)


# Deployments ---------------------------------------------------------------------------------

def _colocated(cfg, chip, n, batch, context, m, dt, t_a, t_f, comm, rows_ffn, **fields):
    """The dict both colocated families return, from one micro-batch's stage times."""
    layer = overlap(m, t_a, t_f, comm)
    step = cfg.n_layers * layer + m * chip.time(*ends(cfg, batch // m, dt))
    ff, yf = phase_cost(cfg, "decode_ffn", rows_ffn, context, dt["weight_dtype"], dt["kv_dtype"],
                    dt["act_dtype"])
    return {"step": step,
            "layer": {"attention": t_a, "ffn": t_f, "comm": comm, "layer_time": layer},
            "microbatches": m, "tokens_per_s": n * batch / step,
            "tokens_per_s_per_chip": batch / step, "tokens_per_s_per_user": 1.0 / step,
            "comm_share": cfg.n_layers * max(0.0, layer - m * (t_a + t_f)) / step,
            "ffn_tokens": rows_ffn, "ffn_intensity": ff / yf, **fields}


def _check(chip, link, n, batch, context, microbatches) -> int:
    check_type("chip", chip, Chip)
    check_type("link", link, Link)
    check_int("n", n, 1)
    check_int("batch", batch, 1)
    check_int("context", context, 0)
    m = check_int("microbatches", microbatches, 1)
    check_divides(batch, m)
    return m


def colocated_step(cfg, chip: Chip, link: Link, n: int, batch: int, context: int,
                   tp: int | None = None, weight_dtype: str | None = None,
                   kv_dtype: str | None = None, act_dtype: str | None = None,
                   microbatches: int = 1) -> dict:
    """The same kind of chips, n of them, as n / tp replicas of the whole model (tensor
    parallel over tp chips inside a replica, data parallel across), each chip holding
    `batch` sequences. Per micro-batch each chip does 1/tp of its replica's attention
    (`kv_split`: MLA's latent is read whole by every chip) and FFN for the replica's
    tp x r tokens, then 2 ring all-reduces of tp x r x D x act bytes over `link` (give the
    scale-up link: TP groups sit inside one node). The layer time is the module
    docstring's overlap formula (m = 1: T_a + T_f + 2 T_c). `tp=None` takes the smallest
    divisor of n whose replica holds weights and KV (n if none does; `fits` then says False).

    Returns {"step", "layer" {"attention", "ffn", "comm", "layer_time"}, "kind" ("tp"),
    "tp", "microbatches", "tokens_per_s", "tokens_per_s_per_chip", "tokens_per_s_per_user",
    "comm_share" (of the step: the all-reduces not hidden), "ffn_tokens", "ffn_intensity",
    "fits", "assumptions"}.
    """
    m = _check(chip, link, n, batch, context, microbatches)
    dt = dtypes_of(cfg, weight_dtype, kv_dtype, act_dtype)
    w_attn, w_ffn = _weights(cfg, dt["weight_dtype"])

    def fits(t: int) -> bool:
        kv = costs.kv_cache_bytes(cfg, context + 1, t * batch, dt["kv_dtype"]) / kv_split(cfg, t)
        return (w_attn + w_ffn) / t + kv <= chip.memory

    if tp is None:
        tp = next((t for t in range(1, n + 1) if n % t == 0 and fits(t)), n)
    check_int("tp", tp, 1)
    if n % tp:
        raise ValueError(f"tp={tp}: must divide n={n} (replicas of tp chips)")
    L, rows = cfg.n_layers, tp * batch // m
    ff, yf = phase_cost(cfg, "decode_ffn", rows, context, dt["weight_dtype"], dt["kv_dtype"],
                    dt["act_dtype"])
    t_a = attention_seconds(cfg, chip, rows, context, dt, tp)
    t_f = chip.time(ff / (L * tp), yf / (L * tp))
    comm = 2 * link.all_reduce(rows * cfg.d_model * BYTES[dt["act_dtype"]], tp)
    return _colocated(cfg, chip, n, batch, context, m, dt, t_a, t_f, comm, rows, kind="tp",
                      tp=tp, fits=fits(tp),
                      assumptions={"model": cfg.name, "chip": chip.name, "link": link.name,
                                   **dt, "chips": n, "tp": tp, "batch_per_chip": batch,
                                   "context": context, "microbatches": m,
                                   "parallelism": "replicas of tp chips (tensor parallel "
                                                  "inside)"})


def expert_parallel_step(cfg, chip: Chip, link: Link, n: int, ep: int, batch: int,
                         context: int, microbatches: int = 1, domain: int | None = None,
                         attn_tp: int = 1, attn_link: Link | None = None,
                         weight_dtype: str | None = None, kv_dtype: str | None = None,
                         act_dtype: str | None = None) -> dict:
    """MoE served with expert parallelism: n / ep groups of ep chips, each chip holding
    `batch` sequences and 1/ep of the routed experts (routers, shared experts and dense FFN
    layers replicated). Attention is data parallel over groups of `attn_tp` chips, tensor
    parallel inside one (1: every chip runs its own sequences alone; DeepSeek-V3 decodes
    with 4), with one all-reduce of attn_tp x r x D x act bytes over `attn_link` (None:
    `link`). The group's FFN work is split evenly over its chips, and every token is
    dispatched to and combined from the remote holders of its experts over `link`:
    (G - 1)(1 - (1 - 1/G)^A) copies of r x D x act bytes each way, G = ep chips, or
    ep / domain nodes when the group spans more than one scale-up domain of `domain` chips
    (give `link` = the scale-out link then). Per layer the communication is that
    all-reduce + dispatch + combine; the layer time is the module docstring's overlap
    formula.

    Returns colocated_step's keys with "kind" ("ep"), "ep", "attn_tp", "copies" (remote
    copies per token) in place of "tp".
    """
    m = _check(chip, link, n, batch, context, microbatches)
    check_int("ep", ep, 1)
    check_int("attn_tp", attn_tp, 1)
    attn_link = attn_link or link
    check_type("attn_link", attn_link, Link)
    if not is_moe(cfg):
        raise ValueError(f"{cfg.name}: expert parallelism needs an MoE model (layer_ffns "
                         f"{sorted(set(cfg.layer_ffns))})")
    for field, k in (("ep", ep), ("attn_tp", attn_tp)):
        if n % k:
            raise ValueError(f"{field}={k}: must divide n={n} (groups of {field} chips)")
    if domain is not None:
        check_int("domain", domain, 1)
    dt = dtypes_of(cfg, weight_dtype, kv_dtype, act_dtype)
    L, rows, act = cfg.n_layers, batch // m, BYTES[dt["act_dtype"]]
    groups = ep if domain is None or ep <= domain else -(-ep // domain)
    ffns = [f for f in cfg.layer_ffns if f != "none"]
    share = sum(f == "moe" for f in ffns) / len(ffns)  # layers that dispatch at all
    copies = share * (groups - 1) * (1.0 - (1.0 - 1.0 / groups) ** cfg.top_k)
    ff, yf = phase_cost(cfg, "decode_ffn", ep * rows, context, dt["weight_dtype"],
                    dt["kv_dtype"], dt["act_dtype"])
    t_a = attention_seconds(cfg, chip, attn_tp * rows, context, dt, attn_tp)
    t_f = chip.time(ff / (L * ep), yf / (L * ep))
    comm = attn_link.all_reduce(attn_tp * rows * cfg.d_model * act, attn_tp) + 2 * link.send(
        rows * copies * cfg.d_model * act)
    w = components(cfg, dt["weight_dtype"])
    kv = costs.kv_cache_bytes(cfg, context + 1, attn_tp * batch, dt["kv_dtype"]) / kv_split(
        cfg, attn_tp)
    held = w["attention"] / attn_tp + w["ffn_rest"] + w["routed"] / ep + kv
    return _colocated(cfg, chip, n, batch, context, m, dt, t_a, t_f, comm, ep * rows,
                      kind="ep", ep=ep, attn_tp=attn_tp, copies=copies,
                      fits=held <= chip.memory,
                      assumptions={"model": cfg.name, "chip": chip.name, "link": link.name,
                                   "attn_link": attn_link.name, **dt, "chips": n, "ep": ep,
                                   "attn_tp": attn_tp, "domain": domain,
                                   "batch_per_chip": batch, "context": context,
                                   "microbatches": m,
                                   "parallelism": "attention data parallel (tensor parallel "
                                                  "over attn_tp), experts over ep chips"})


def baseline(cfg, chip: Chip, scale_up: Link, scale_out: Link, domain: int, n: int,
             batch: int, context: int, microbatches=(1, 2), weight_dtype: str | None = None,
             kv_dtype: str | None = None, act_dtype: str | None = None) -> dict:
    """The best colocated deployment of n chips holding `batch` sequences each that fits:
    tensor-parallel replicas (tp among the divisors of n; the all-reduce over `scale_up` when
    tp <= `domain`, else over `scale_out`) and, for MoE, expert parallelism (ep >= 2 among
    the divisors of n; the all-to-all over `scale_up` inside a domain, else `scale_out`)
    with attention tensor parallel over attn_tp in 1, 2, 4, ... <= domain chips (over
    `scale_up`), each with every micro-batch count in `microbatches` that divides batch.

    Returns {"best" (the chosen step's dict), "tried" [{kind, size (tp or ep), attn_tp,
    microbatches, link, tokens_per_s_per_chip, fits}]}; when nothing fits, the fastest,
    with fits False.
    """
    check_int("domain", domain, 1)
    kw = dict(weight_dtype=weight_dtype, kv_dtype=kv_dtype, act_dtype=act_dtype)
    ms = [m for m in microbatches if check_int("microbatches", m, 1) and batch % m == 0]
    if not ms:
        raise ValueError(f"microbatches={tuple(microbatches)!r}: none divides batch={batch}")
    sizes = [k for k in range(1, n + 1) if n % k == 0]
    attn = [a for a in sizes if a <= domain and a & (a - 1) == 0]
    runs = []
    for m in ms:
        for tp in sizes:
            runs.append(colocated_step(cfg, chip, scale_up if tp <= domain else scale_out, n,
                                       batch, context, tp, microbatches=m, **kw))
        for ep in sizes[1:] if is_moe(cfg) else ():
            link = scale_up if ep <= domain else scale_out
            runs += [expert_parallel_step(cfg, chip, link, n, ep, batch, context, m, domain,
                                          a, scale_up, **kw) for a in attn]
    ok = [r for r in runs if r["fits"]] or runs
    best = max(ok, key=lambda r: r["tokens_per_s_per_chip"])
    tried = [{"kind": r["kind"], "size": r.get("tp", r.get("ep")),
              "attn_tp": r.get("attn_tp", r.get("tp")), "microbatches": r["microbatches"],
              "link": r["assumptions"]["link"],
              "tokens_per_s_per_chip": r["tokens_per_s_per_chip"], "fits": r["fits"]}
             for r in runs]
    return {"best": best, "tried": tried}
