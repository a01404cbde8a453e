"""The analytic cost model: parameters, cache bytes, and FLOPs and bytes of every phase.

This module only sums. The formulas live beside the code that incurs the cost: each attention
variant's `param_counts` / `cache_bytes` / `costs` (refmodel/attention/*.py), the dense FFN's
and the norms' in `refmodel/layers.py`, the MoE's in `refmodel/moe.py`. The three model-level
pieces of `refmodel/model.py` (embedding gather, residual adds, LM head) are counted here.

Each phase is counted as the jitted phase function of `refmodel/phases.py` executes it:

- `prefill`: `context` prompt tokens per sequence into an empty cache of max_len == context
  (embedding, every layer, final norm and LM head on all B x T tokens);
- `decode_attention`: every layer's mixer (norm + attention + residual) for one token per
  sequence at `context` cached tokens, cache of max_len == context + 1;
- `decode_ffn`: every layer's FFN (norm + FFN + residual) for `batch` tokens;
- `decode`: the whole step (embedding, every layer, final norm, LM head) for one token per
  sequence at `context` cached tokens.

Counts: `count="implementation"` (the default) is what this code executes; `count="engine"`
is what an engine that skips the work below would do. They differ only where this code
does work a windowed engine would not: the sliding-window ring scores every one of its W
slots, masked or not (op `ring_masked_slots`, see refmodel/attention/sliding.py). Measured
phases (microbench) and the compiler cross-check (refmodel/compiler_check.py) compare against the
implementation's count; real architectures modelled on spec chips should use the engine's.

Op names are the `jax.named_scope`s of the code (qkv_proj, attn_scores, ffn_up, router, ...)
summed over layers; `norm`, `residual` are the unscoped norms and residual adds. Conventions
(2 FLOPs per multiply-add, bytes = what an op must move at least once) are in
`refmodel/counting.py`; the compiler cross-check of these numbers is `refmodel/compiler_check.py`.
"""

from __future__ import annotations

from refmodel import attention
from refmodel.config import ModelConfig
from refmodel.counting import BYTES, Cost, Dtypes, matmul, total
from refmodel.layers import SOFTCAP_FLOPS, DenseFFN, norm_costs, norm_params
from refmodel.moe import MoE
from refmodel.phases import PHASES

COMPONENTS = ("embedding", "positions", "attention", "norms", "dense_ffn", "router",
              "routed_experts", "shared_experts", "lm_head")
TOKEN_ID_BYTES = 4  # int32 token ids read by the embedding gather
COUNTS = ("implementation", "engine")


# Parameters ------------------------------------------------------------------------------------

def param_counts(cfg: ModelConfig) -> dict:
    """Parameter counts of the model `cfg` describes (exactly the elements it would create).

    - `total`: every parameter.
    - `active`: what one token touches: attention, dense FFNs, routers, shared experts, its
      top-k routed experts, the norms, the embedding (and learned positions) and the LM head.
    - `active_without_embedding`: the gpt-oss model card's convention ("unembedding parameters
      are counted towards active, but not embeddings"): `active` less the input embedding and
      learned positions; a tied matrix is the unembedding and stays counted.
    - `non_embedding`: `total` less embedding, positions and LM head (the Qwen cards' figure).
    - `components`: the per-component breakdown (COMPONENTS) summing to `total`.
    """
    _check_cfg(cfg)
    D, V = cfg.d_model, cfg.vocab_size
    comp = dict.fromkeys(COMPONENTS, 0)
    comp["embedding"] = V * D
    comp["positions"] = cfg.max_position * D if cfg.position == "learned" else 0
    comp["lm_head"] = 0 if cfg.tie_embeddings else D * V
    post = 2 if cfg.post_norms else 1
    active_routed = 0
    for kind, ffn in zip(cfg.layer_kinds, cfg.layer_ffns, strict=True):
        if kind != "none":
            comp["attention"] += sum(attention.get(kind).param_counts(cfg, kind).values())
            comp["norms"] += post * norm_params(cfg, D)
        if ffn == "dense":
            comp["dense_ffn"] += DenseFFN.param_count(cfg, cfg.d_ff)
        elif ffn == "moe":
            moe = MoE.param_counts(cfg)
            comp["router"] += moe["router"]
            comp["routed_experts"] += moe["experts"]
            comp["shared_experts"] += moe["shared"]
            active_routed += cfg.top_k * moe["expert"]
        if ffn != "none":
            comp["norms"] += post * norm_params(cfg, D)
    comp["norms"] += norm_params(cfg, D)  # final norm
    n_total = sum(comp.values())
    active = n_total - comp["routed_experts"] + active_routed
    embedding_in = comp["positions"] + (0 if cfg.tie_embeddings else comp["embedding"])
    return {"total": n_total, "active": active,
            "active_without_embedding": active - embedding_in,
            "non_embedding": n_total - comp["embedding"] - comp["positions"] - comp["lm_head"],
            "components": comp}


# Caches ----------------------------------------------------------------------------------------

def kv_cache_bytes(cfg: ModelConfig, context: int, batch: int = 1,
                   kv_dtype: str = "bfloat16") -> float:
    """Bytes of every layer's cache after `context` tokens: full attention grows with the
    context, a sliding layer holds min(context, W) tokens (what a sequence needs; this code's
    ring allocates all W slots up front), MLA holds its latent + RoPE key, linear layers a
    fixed recurrent and convolution state."""
    _check_cfg(cfg)
    _check_int("context", context, 0)
    _check_int("batch", batch, 1)
    dt = Dtypes(kv=_check_dtype("kv_dtype", kv_dtype))
    return sum(attention.get(kind).cache_bytes(cfg, kind, batch, context, dt)
               for kind in cfg.layer_kinds if kind != "none")


def kv_bytes_per_token(cfg: ModelConfig, kv_dtype: str = "bfloat16") -> float:
    """Bytes one more token adds to the caches of one sequence while the context is shorter
    than every window (fixed-size states add nothing)."""
    return kv_cache_bytes(cfg, 2, 1, kv_dtype) - kv_cache_bytes(cfg, 1, 1, kv_dtype)


# Phases ----------------------------------------------------------------------------------------

def embed_costs(cfg: ModelConfig, tokens: float, dt: Dtypes) -> Cost:
    """The embedding gather of `model.embed_tokens`: reads one row of V x D per token (and
    one learned-position row, added: 1 FLOP per element), writes x [tokens, D]."""
    D = cfg.d_model
    rows = 2 if cfg.position == "learned" else 1
    return Cost(flops=(rows - 1) * tokens * D, weight_bytes=rows * tokens * D * dt.param_size,
                act_bytes=tokens * (D * dt.act_size + TOKEN_ID_BYTES))


def head_costs(cfg: ModelConfig, tokens: float, dt: Dtypes) -> Cost:
    """`model.head` after the final norm: x [tokens, D] @ [D, V] (the tied embedding or the
    LM head) and, for Gemma 2, the soft-capping of the logits."""
    if cfg.tie_embeddings:  # the embedding table: never quantized
        cost = matmul(tokens, cfg.d_model, cfg.vocab_size, dt, weight=False) + Cost(
            weight_bytes=cfg.d_model * cfg.vocab_size * dt.param_size)
    else:
        cost = matmul(tokens, cfg.d_model, cfg.vocab_size, dt)
    if cfg.final_softcap is not None:
        cost = cost + Cost(flops=SOFTCAP_FLOPS * tokens * cfg.vocab_size)
    return cost


def residual_costs(cfg: ModelConfig, tokens: float, dt: Dtypes) -> Cost:
    """x + h over [tokens, D]: 1 FLOP per element, reads two and writes one."""
    return Cost(flops=tokens * cfg.d_model, act_bytes=3.0 * tokens * cfg.d_model * dt.act_size)


def phase_ops(cfg: ModelConfig, phase: str, batch: int, context: int,
              dt: Dtypes, count: str = "implementation") -> dict[str, Cost]:
    """{op: Cost} of one phase (see the module docstring), summed over layers by op name;
    `count="engine"` drops the ops only this implementation executes
    (`refmodel.attention.implementation_only()`)."""
    _check_cfg(cfg)
    _check_phase(phase)
    _check_count(count)
    _check_int("batch", batch, 1)
    _check_int("context", context, 1 if phase == "prefill" else 0)
    new, cached = (context, 0) if phase == "prefill" else (1, context)
    tokens, D = batch * new, cfg.d_model
    post = 2 if cfg.post_norms else 1
    ops: dict[str, Cost] = {}

    def add(items: dict[str, Cost]) -> None:
        for op, cost in items.items():
            ops[op] = ops.get(op, Cost()) + cost

    whole = phase in ("prefill", "decode")
    if whole:
        add({"embed": embed_costs(cfg, tokens, dt)})
    for kind, ffn in zip(cfg.layer_kinds, cfg.layer_ffns, strict=True):
        if kind != "none" and phase != "decode_ffn":
            add({"norm": post * norm_costs(cfg, D, tokens, dt)})
            add(attention.get(kind).costs(cfg, kind, batch, new, cached, dt))
            add({"residual": residual_costs(cfg, tokens, dt)})
        if ffn != "none" and phase != "decode_attention":
            add({"norm": post * norm_costs(cfg, D, tokens, dt)})
            add(MoE.costs(cfg, tokens, dt) if ffn == "moe"
                else DenseFFN.costs(cfg, cfg.d_ff, tokens, dt))
            add({"residual": residual_costs(cfg, tokens, dt)})
    if whole:
        add({"norm": norm_costs(cfg, D, tokens, dt), "lm_head": head_costs(cfg, tokens, dt)})
    drop = attention.implementation_only() if count == "engine" else ()
    return {op: cost for op, cost in ops.items() if cost != Cost() and op not in drop}


def dtypes(cfg: ModelConfig, weight_dtype: str | None = None, kv_dtype: str | None = None,
           act_dtype: str | None = None) -> Dtypes:
    """The storage formats to count bytes in; None means the config's: its `weight_format`
    and `kv_format` where quantized, else its `dtype`. Vectors and the embedding: the config's
    `dtype`, or a float `weight_dtype` if one is given (float32 beside a quantized one)."""
    own_weight = cfg.dtype if cfg.weight_format == "none" else cfg.weight_format
    own_kv = cfg.dtype if cfg.kv_format == "none" else cfg.kv_format
    return Dtypes(weight=_check_dtype("weight_dtype", weight_dtype or own_weight),
                  kv=_check_dtype("kv_dtype", kv_dtype or own_kv),
                  param=cfg.dtype if weight_dtype is None else None,
                  act=_check_dtype("act_dtype", act_dtype or cfg.dtype))


def phase_costs(cfg: ModelConfig, phase: str, batch: int, context: int,
                weight_dtype: str | None = None, kv_dtype: str | None = None,
                act_dtype: str | None = None, count: str = "implementation") -> dict:
    """FLOPs and bytes of one phase, in total and per op, as plain numbers (JSON-ready):

        {"phase", "batch", "context", "count", "dtypes": {weight, kv, act},
         "flops", "bytes", "weight_bytes", "kv_bytes", "act_bytes", "intensity",
         "ops": {op: {"flops", "bytes", "weight_bytes", "kv_bytes", "act_bytes", "intensity"}}}

    Dtypes default to `cfg.dtype`; intensity is FLOPs per byte. `count` (COUNTS): what this
    code executes, or what a windowed engine does (see the module docstring): e.g. Mistral
    7B's decode attention at context 256 reads 256 + 1 keys per sequence in an engine, all
    W = 4096 ring slots here.
    """
    dt = dtypes(cfg, weight_dtype, kv_dtype, act_dtype)
    ops = phase_ops(cfg, phase, batch, context, dt, count)
    return {"phase": phase, "batch": batch, "context": context, "count": count,
            "dtypes": {"weight": dt.weight, "kv": dt.kv, "act": dt.act},
            **_numbers(total(ops)), "ops": {op: _numbers(c) for op, c in ops.items()}}


def step_ops(cfg: ModelConfig, chunks, dt: Dtypes, count: str = "implementation",
             logits: str = "all") -> dict[str, Cost]:
    """{op: Cost} of one serving step: sequences fed `new` tokens each after `cached` cached
    ones, `chunks` = [(new, cached), ...] (a decode is (1, context), a prefill chunk (n, start)),
    all in one batched call. Weights are read once for the step, not once per sequence: every
    per-sequence op's weight bytes are one sequence's (sequences of one shape are counted as
    one batch, so a per-call term, e.g. linear attention's -exp(A_log), is counted once per
    distinct shape, not once per step: a few FLOPs); the FFN (or MoE, whose experts touched
    follow the step's token count) and the norms run on all the step's tokens together.
    `logits`: "all" tokens get the LM head (what refmodel computes), or "last", one row per
    sequence (an engine that only samples). With every chunk equal this is `phase_ops` of
    decode (B x (1, S)) or prefill ((T, 0)) exactly (tests/test_sim_costs.py)."""
    _check_cfg(cfg)
    _check_count(count)
    if logits not in ("all", "last"):
        raise ValueError(f"logits={logits!r}: choose 'all' or 'last'")
    chunks = [(int(n), int(c)) for n, c in chunks]
    if not chunks or any(n < 1 or c < 0 for n, c in chunks):
        raise ValueError(f"chunks={chunks!r}: give at least one (new >= 1, cached >= 0)")
    tokens, D = sum(n for n, _ in chunks), cfg.d_model
    shapes: dict[tuple[int, int], int] = {}  # (new, cached) -> sequences of that shape
    for chunk in chunks:
        shapes[chunk] = shapes.get(chunk, 0) + 1
    post = 2 if cfg.post_norms else 1
    ops: dict[str, Cost] = {}

    def add(items: dict[str, Cost]) -> None:
        for op, cost in items.items():
            ops[op] = ops.get(op, Cost()) + cost

    add({"embed": embed_costs(cfg, tokens, dt)})
    layer_types: dict[tuple[str, str], int] = {}  # identical layers are counted once, times n
    for layer in zip(cfg.layer_kinds, cfg.layer_ffns, strict=True):
        layer_types[layer] = layer_types.get(layer, 0) + 1
    for (kind, ffn), count_ in layer_types.items():
        layer: dict[str, Cost] = {}

        def put(items: dict[str, Cost], into=layer) -> None:
            for op, cost in items.items():
                into[op] = into.get(op, Cost()) + cost

        if kind != "none":
            put({"norm": post * norm_costs(cfg, D, tokens, dt)})
            per_seq: dict[str, Cost] = {}
            weights: dict[str, float] = {}  # an op's weights are read once per step
            for (n, c), rows in shapes.items():
                put(attention.get(kind).costs(cfg, kind, rows, n, c, dt), per_seq)
                for op, cost in attention.get(kind).costs(cfg, kind, 1, n, c, dt).items():
                    weights[op] = max(weights.get(op, 0.0), cost.weight_bytes)
            put({op: Cost(cost.flops, weights[op], cost.kv_bytes, cost.act_bytes)
                 for op, cost in per_seq.items()})
            put({"residual": residual_costs(cfg, tokens, dt)})
        if ffn != "none":
            put({"norm": post * norm_costs(cfg, D, tokens, dt)})
            put(MoE.costs(cfg, tokens, dt) if ffn == "moe"
                else DenseFFN.costs(cfg, cfg.d_ff, tokens, dt))
            put({"residual": residual_costs(cfg, tokens, dt)})
        add({op: count_ * cost for op, cost in layer.items()})
    head_rows = tokens if logits == "all" else len(chunks)
    add({"norm": norm_costs(cfg, D, tokens, dt), "lm_head": head_costs(cfg, head_rows, dt)})
    drop = attention.implementation_only() if count == "engine" else ()
    return {op: cost for op, cost in ops.items() if cost != Cost() and op not in drop}


def step_costs(cfg: ModelConfig, chunks, weight_dtype: str | None = None,
               kv_dtype: str | None = None, act_dtype: str | None = None,
               count: str = "implementation", logits: str = "all") -> dict:
    """`step_ops` as plain numbers, like `phase_costs`: {"tokens", "sequences", "flops",
    "bytes", "weight_bytes", "kv_bytes", "act_bytes", "intensity", "ops"}."""
    dt = dtypes(cfg, weight_dtype, kv_dtype, act_dtype)
    ops = step_ops(cfg, chunks, dt, count, logits)
    chunks = list(chunks)
    return {"tokens": sum(int(n) for n, _ in chunks), "sequences": len(chunks),
            "count": count, **_numbers(total(ops)),
            "ops": {op: _numbers(c) for op, c in ops.items()}}


def verify_costs(cfg: ModelConfig, batch: int, context: int, k: int,
                 weight_dtype: str | None = None, kv_dtype: str | None = None,
                 act_dtype: str | None = None, count: str = "implementation") -> dict:
    """The verify pass of speculative decoding (refmodel/speculative.py): `batch` sequences at
    `context` cached tokens each take k + 1 new ones (the pending token and k proposals) in
    one step, logits on all of them: `step_costs` of [(k + 1, context)] x batch. Weights are
    read once for the k + 1 tokens, so its intensity is about k + 1 times decode's while
    weights dominate the bytes. (Linear attention's verify runs its k + 1 tokens through the
    recurrence, keeping each state, where this counts its chunked form: a few FLOPs apart.)"""
    _check_int("k", k, 0)
    _check_int("batch", batch, 1)
    _check_int("context", context, 0)
    return step_costs(cfg, [(k + 1, context)] * batch, weight_dtype, kv_dtype, act_dtype, count)


def _numbers(cost: Cost) -> dict:
    return {**cost.as_dict(), "intensity": cost.intensity if cost.bytes else None}


# Validation ------------------------------------------------------------------------------------

def _check_cfg(cfg) -> None:
    if not isinstance(cfg, ModelConfig):
        raise TypeError(f"cfg must be a ModelConfig, got {type(cfg).__name__}")


def _check_phase(phase) -> None:
    if phase not in PHASES:
        raise ValueError(f"phase={phase!r} is not allowed; choose one of {list(PHASES)}")


def _check_count(count) -> None:
    if count not in COUNTS:
        raise ValueError(f"count={count!r} is not allowed; choose one of {list(COUNTS)}")


def _check_int(field: str, value, minimum: int) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
        raise ValueError(f"{field}={value!r} must be an integer >= {minimum}")


def _check_dtype(field: str, value) -> str:
    if value not in BYTES:
        raise ValueError(f"{field}={value!r} is not allowed; choose one of {sorted(BYTES)}")
    return value
