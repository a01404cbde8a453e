"""One frozen, flat model config, validated on construction.

Every architecture the project counts or runs is a `ModelConfig`: the tiny ones that run in the
tests, and real ones (Llama 3, DeepSeek V3, gpt-oss, ...) that are only counted. Variants are made
with `dataclasses.replace(cfg, attention="mla")`; a wrong value raises `ValueError` naming the
field, the value and what is allowed.

Layers are blocks of (mixer, ffn). `attention` is the mixer kind of every layer unless
`layer_pattern` gives one kind per layer (tiled over the layers, e.g. ("sliding",) * 5 +
("gqa",) for Gemma 3's 5 local : 1 global). `ffn` is the FFN kind unless `ffn_pattern` tiles one,
and the first `first_dense_layers` layers use a dense FFN (DeepSeek's first_k_dense_replace).
The kind "none" skips a mixer or an FFN (Nemotron-H's separate Mamba, attention and MLP layers).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

from refmodel import registry
from refmodel.ops import BACKENDS

FFN_KINDS = ("dense", "moe", "none")
MLP_ACTS = ("swiglu", "geglu", "gelu", "relu2")
NORMS = ("rmsnorm", "layernorm")
POSITIONS = ("rope", "learned", "none")
ROUTER_SCORES = ("softmax", "sigmoid")
DTYPES = ("float32", "bfloat16", "float16")
WEIGHT_FORMATS = ("none", "int8", "float8", "int4")  # refmodel/quant.py
KV_FORMATS = ("none", "int8", "float8")


@dataclass(frozen=True)
class ModelConfig:
    """Hyperparameters in the shape alphabet of `refmodel` (B T S D N K G H F E A R W L V).

    Fields are what you set. A few may be None, meaning "the usual default": `head_dim`
    (D // N), `d_ff_expert` (d_ff) and `query_scale` (the head dim). The values in use are
    the properties `resolved_head_dim`, `expert_width` and `softmax_scale`; code reads those
    (only validation looks at the raw fields).
    """

    name: str = "custom"
    vocab_size: int = 256  # V
    d_model: int = 64  # D
    n_layers: int = 2  # L
    n_heads: int = 4  # N
    n_kv_heads: int = 2  # K
    head_dim: int | None = None  # as set (HF name); None: D // N. Code reads resolved_head_dim (H)
    d_ff: int = 128  # F, dense FFN width

    # Which mixer and FFN each layer runs.
    attention: str = "gqa"
    layer_pattern: tuple[str, ...] | None = None
    ffn: str = "dense"
    ffn_pattern: tuple[str, ...] | None = None
    first_dense_layers: int = 0

    # Embedding, norms, positions.
    tie_embeddings: bool = False
    norm: str = "rmsnorm"
    norm_eps: float = 1e-6
    post_norms: bool = False  # Gemma 2/3: extra norm after the mixer and after the FFN
    position: str = "rope"
    max_position: int = 2048  # learned positions only (GPT-2)
    rope_theta: float = 10_000.0
    rope_fraction: float = 1.0  # partial rotary (Qwen3-Next: 0.25)

    # Attention details shared by the softmax variants.
    attn_bias: bool = False  # biases on q, k, v, o (GPT-2, gpt-oss)
    qk_norm: bool = False  # RMSNorm on q and k per head (Qwen3, Gemma 3)
    attn_out_gate: bool = False  # sigmoid gate on the attention output (Qwen3-Next)
    attn_sinks: bool = False  # learned per-head sink logit (gpt-oss)
    attn_softcap: float | None = None  # Gemma 2: tanh soft-capping of attention logits
    final_softcap: float | None = None  # Gemma 2: tanh soft-capping of the output logits
    query_scale: float | None = None  # None: H. Code reads softmax_scale (query_scale**-0.5)

    # FFN.
    mlp_act: str = "swiglu"
    mlp_bias: bool = False

    # Mixture of experts.
    n_experts: int = 8  # E
    top_k: int = 2  # A
    d_ff_expert: int | None = None  # one routed expert's width; None: d_ff. Code reads expert_width
    n_shared_experts: int = 0
    shared_expert_gate: bool = False  # Qwen3-Next: shared experts' output times sigmoid(x w)
    router_score: str = "softmax"
    norm_topk: bool = True  # renormalise the top-k weights to sum to 1
    router_bias: bool = False
    moe_bias: bool = False  # biases inside each expert (gpt-oss)

    # MLA (DeepSeek V2/V3).
    q_lora_rank: int = 0  # 0: no query compression
    kv_lora_rank: int = 32  # R
    qk_nope_dim: int = 16
    qk_rope_dim: int = 8
    v_head_dim: int = 16
    mla_absorb: bool = False  # decode in the latent space (W_UK into q, W_UV into the output)

    # Sliding window.
    window: int = 16  # W

    # Sparse (DeepSeek Sparse Attention style top-k selection).
    sparse_top_k: int = 8
    indexer_heads: int = 2
    indexer_dim: int = 16

    # Linear attention / state space (Mamba-2 SSD, gated DeltaNet).
    linear_rule: str = "gated_delta"
    linear_k_heads: int = 2  # heads of the key/query (Mamba-2: groups of B and C)
    linear_v_heads: int = 4  # heads of the value (Mamba-2: SSM heads)
    linear_key_dim: int = 16  # per-head key dim (Mamba-2: state size)
    linear_value_dim: int = 16  # per-head value dim (Mamba-2: head dim)
    linear_conv: int = 4  # short causal convolution width
    linear_chunk: int = 8  # chunk length of the parallel (prefill) form

    dtype: str = "float32"  # parameters and caches
    # Quantization (refmodel/quant.py): the weight matrices' format ("none": `dtype`), the
    # token caches' format, and int8 activations in the products (int8 or int4 weights).
    weight_format: str = "none"
    kv_format: str = "none"
    quant_activations: bool = False
    # Who runs the model's ops (refmodel/ops.py): the reference code alone, its XLA layouts,
    # those with output-major weights, or the native CPU kernels where they apply.
    backend: str = "xla"

    def __post_init__(self):
        for f in ("vocab_size", "d_model", "n_layers", "n_heads", "n_kv_heads", "d_ff",
                  "max_position"):
            positive(f, getattr(self, f))
        for f in (f.name for f in dataclasses.fields(self) if isinstance(f.default, bool)):
            if not isinstance(getattr(self, f), bool):
                raise ValueError(f"{f}={getattr(self, f)!r} must be True or False")
        if not isinstance(self.name, str):
            raise ValueError(f"name={self.name!r} must be a string")
        self._check_numbers()
        if self.head_dim is not None:
            positive("head_dim", self.head_dim)
        elif self.d_model % self.n_heads:
            raise ValueError(
                f"d_model={self.d_model} is not divisible by n_heads={self.n_heads}: "
                "set head_dim explicitly or choose n_heads dividing d_model"
            )
        if self.n_heads % self.n_kv_heads:
            raise ValueError(
                f"n_heads={self.n_heads} is not divisible by n_kv_heads={self.n_kv_heads}: "
                f"allowed n_kv_heads are the divisors of {self.n_heads}"
            )
        one_of("ffn", self.ffn, FFN_KINDS[:2])
        one_of("mlp_act", self.mlp_act, MLP_ACTS)
        one_of("norm", self.norm, NORMS)
        one_of("position", self.position, POSITIONS)
        one_of("router_score", self.router_score, ROUTER_SCORES)
        one_of("dtype", self.dtype, DTYPES)
        one_of("weight_format", self.weight_format, WEIGHT_FORMATS)
        one_of("kv_format", self.kv_format, KV_FORMATS)
        one_of("backend", self.backend, BACKENDS)
        stored = self.backend in ("output-major", "native")  # weights stored their own way
        native_quant = self.backend == "native" and (
            self.weight_format == "int8" or (self.weight_format == "int4"
                                             and self.quant_activations))
        if stored and (self.dtype != "float32" or (
                self.weight_format != "none" and not native_quant)):
            allowed = ("float32 weights, weight_format='int8', or 'int4' with "
                       "quant_activations=True" if self.backend == "native"
                       else "float32 weights")
            raise ValueError(f"backend={self.backend!r} takes {allowed}; this config has "
                             f"dtype={self.dtype!r}, weight_format={self.weight_format!r}, "
                             f"quant_activations={self.quant_activations}: use backend='xla', "
                             "or dtype='float32' with weight_format='none'")
        if self.quant_activations and self.weight_format not in ("int8", "int4"):
            raise ValueError(f"quant_activations=True needs weight_format 'int8' or 'int4', not "
                             f"{self.weight_format!r}: the integer dot product")
        self._check_patterns()
        non_negative("first_dense_layers", self.first_dense_layers)
        if not 0 <= self.first_dense_layers <= self.n_layers:
            raise ValueError(
                f"first_dense_layers={self.first_dense_layers} must be in [0, n_layers="
                f"{self.n_layers}]"
            )
        if "moe" in self.layer_ffns:
            positive("n_experts", self.n_experts)
            positive("top_k", self.top_k)
            if not 1 <= self.top_k <= self.n_experts:
                raise ValueError(
                    f"top_k={self.top_k} must be in [1, n_experts={self.n_experts}]"
                )
            non_negative("n_shared_experts", self.n_shared_experts)
        if self.d_ff_expert is not None:
            positive("d_ff_expert", self.d_ff_expert)
        if self.position == "rope" and (self.rotary_dim % 2 or self.rotary_dim == 0):
            raise ValueError(
                f"rope_fraction={self.rope_fraction} x head_dim={self.resolved_head_dim} gives a "
                f"rotary dim of {self.rotary_dim}; it must be even and at least 2"
            )
        registry.validate(self)  # each variant in use checks the fields it reads

    def _check_numbers(self):
        """The float fields: a sign, a zero, a NaN or an infinity here gives NaN logits,
        logits that are all zero, or attention that is silently uniform."""
        finite_above("norm_eps", self.norm_eps, 0, "a finite number > 0 (1e-6 in Llama)")
        finite_above("rope_theta", self.rope_theta, 1,
                     "a finite number > 1, the RoPE base (10000 in Llama 2)")
        if not (number(self.rope_fraction) and 0 < self.rope_fraction <= 1):
            raise ValueError(f"rope_fraction={self.rope_fraction!r} must be in (0, 1]")
        for f, allowed in (("attn_softcap", "None or a finite cap > 0 (50 in Gemma 2)"),
                           ("final_softcap", "None or a finite cap > 0 (30 in Gemma 2)"),
                           ("query_scale", "None or a finite number > 0 (softmax scale "
                                           "query_scale**-0.5; None: head_dim)")):
            if getattr(self, f) is not None:
                finite_above(f, getattr(self, f), 0, allowed)

    def _check_patterns(self):
        allowed = tuple(registry.registered()) + ("none",)
        one_of("attention", self.attention, allowed[:-1])
        if self.layer_pattern is not None:
            if not isinstance(self.layer_pattern, tuple) or not self.layer_pattern:
                raise ValueError(
                    f"layer_pattern={self.layer_pattern!r} must be a non-empty tuple of kinds"
                )
            for kind in self.layer_pattern:
                one_of("layer_pattern", kind, allowed)
            longer_than_layers("layer_pattern", self.layer_pattern, self.n_layers)
        if self.ffn_pattern is not None:
            if not isinstance(self.ffn_pattern, tuple) or not self.ffn_pattern:
                raise ValueError(
                    f"ffn_pattern={self.ffn_pattern!r} must be a non-empty tuple of kinds"
                )
            for kind in self.ffn_pattern:
                one_of("ffn_pattern", kind, FFN_KINDS)
            longer_than_layers("ffn_pattern", self.ffn_pattern, self.n_layers)

    # Derived values --------------------------------------------------------------------------

    @property
    def resolved_head_dim(self) -> int:  # H: head_dim, or D // N when head_dim is None
        return self.head_dim if self.head_dim is not None else self.d_model // self.n_heads

    @property
    def groups(self) -> int:  # G = N / K
        return self.n_heads // self.n_kv_heads

    @property
    def expert_width(self) -> int:  # d_ff_expert, or d_ff when d_ff_expert is None
        return self.d_ff_expert if self.d_ff_expert is not None else self.d_ff

    @property
    def rotary_dim(self) -> int:
        return int(round(self.resolved_head_dim * self.rope_fraction))

    @property
    def softmax_scale(self) -> float:  # query_scale**-0.5, or H**-0.5 when query_scale is None
        scale = self.query_scale if self.query_scale is not None else self.resolved_head_dim
        return scale**-0.5

    @property
    def layer_kinds(self) -> tuple[str, ...]:
        """Mixer kind of each of the L layers ("none" = no mixer)."""
        pattern = self.layer_pattern or (self.attention,)
        return tuple(pattern[i % len(pattern)] for i in range(self.n_layers))

    @property
    def layer_ffns(self) -> tuple[str, ...]:
        """FFN kind of each of the L layers: "dense", "moe" or "none"."""
        pattern = self.ffn_pattern or (self.ffn,)
        return tuple(
            "dense" if i < self.first_dense_layers and pattern[i % len(pattern)] != "none"
            else pattern[i % len(pattern)]
            for i in range(self.n_layers)
        )

    def replace(self, **changes) -> ModelConfig:
        return dataclasses.replace(self, **changes)


def positive(field: str, value) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
        raise ValueError(f"{field}={value!r} must be a positive integer")


def non_negative(field: str, value) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise ValueError(f"{field}={value!r} must be an integer >= 0")


def number(value) -> bool:
    """A real number (int or float, not bool), possibly NaN or infinite."""
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def finite_above(field: str, value, low: float, allowed: str) -> None:
    if not (number(value) and math.isfinite(value) and value > low):
        raise ValueError(f"{field}={value!r} is not allowed; it must be {allowed}")


def longer_than_layers(field: str, pattern: tuple, n_layers: int) -> None:
    if len(pattern) > n_layers:
        raise ValueError(
            f"{field}={pattern!r} has {len(pattern)} kinds but n_layers={n_layers}: the "
            f"last {len(pattern) - n_layers} would never run; give at most n_layers kinds"
        )


def one_of(field: str, value, allowed) -> None:
    if value not in allowed:
        raise ValueError(f"{field}={value!r} is not allowed; choose one of {sorted(allowed)}")
