"""The shape alphabet: one capital letter, one meaning, in the whole package.

Shape comments (`# [B, T, D]`), einsum strings ("BTD,DF->BTF"), cost formulas, local
variables named for a size and the native kernels' comments, error messages and size variables
(refmodel/kernels/*.cc, *.h) use these letters and no others; `refmodel/__init__.py`'s
docstring shows the same table and tests/test_alphabet.py checks both. GLOBAL letters mean the
same in every variant; VARIANT letters belong to one variant (or two, as U) but still one
meaning. A size with no letter is written as a word (`[max_position, D]`; a weight product's
`n_in` inputs and `n_out` outputs, which are D, F, N H, ... as the weight is).

Two tables pin what a letter means beyond its name: PARTS (a letter that is a product of
others: a shape holds it or its parts, never both, so `w [K, N]` cannot be a weight's inputs
and outputs) and FIELDS (the ModelConfig fields a letter stands for: `K = cfg.d_model` is a
wrong meaning).
"""

from __future__ import annotations

GLOBAL: dict[str, str] = {
    "B": "batch",
    "T": "query length (new tokens)",
    "S": "key/value length (cached tokens)",
    "D": "model width",
    "N": "query heads",
    "K": "key/value heads",
    "G": "groups, N / K",
    "H": "head dim",
    "F": "FFN width",
    "E": "experts",
    "A": "active (top-k) experts",
    "R": "latent rank (MLA)",
    "W": "window",
    "L": "layers",
    "V": "vocabulary",
}

VARIANT: dict[str, str] = {
    "M": "rows of a product: G T of grouped attention, a weight product's tokens",
    "U": "value head dim (MLA, linear attention)",
    "P": "MLA no-RoPE query/key dims (qk_nope_dim)",
    "Q": "MLA RoPE dims (qk_rope_dim)",
    "Y": "MLA compressed-query rank (q_lora_rank)",
    "C": "chunks of a sequence (linear's prefill, the decode kernels' keys)",
    "X": "linear conv channels",
    "Z": "linear conv taps (linear_conv)",
    "I": "sparse indexer heads",
    "J": "sparse indexer dim",
}

SHAPE_LETTERS: dict[str, str] = {**GLOBAL, **VARIANT}

# A letter that is the product of others (N = K G query heads; M = G T rows of one KV head's
# grouped attention): one shape holds the product or its parts, never both.
PARTS: dict[str, str] = {"N": "KG", "M": "GT"}

# The ModelConfig fields (and properties) each letter stands for; code binds them as
# `D = cfg.d_model`. A field has one letter.
FIELDS: dict[str, tuple[str, ...]] = {
    "T": ("linear_chunk",),
    "D": ("d_model",),
    "N": ("n_heads", "linear_v_heads"),
    "K": ("n_kv_heads", "linear_k_heads"),
    "G": ("groups",),
    "H": ("head_dim", "resolved_head_dim", "linear_key_dim"),
    "F": ("d_ff", "d_ff_expert", "expert_width"),
    "E": ("n_experts",),
    "A": ("top_k",),
    "R": ("kv_lora_rank",),
    "W": ("window",),
    "L": ("n_layers",),
    "V": ("vocab_size",),
    "U": ("v_head_dim", "linear_value_dim"),
    "P": ("qk_nope_dim",),
    "Q": ("qk_rope_dim",),
    "Y": ("q_lora_rank",),
    "Z": ("linear_conv",),
    "I": ("indexer_heads",),
    "J": ("indexer_dim",),
}
