"""The shape alphabet: one capital letter, one meaning, in the whole package.

Shape comments (`# [B, T, D]`), einsum strings ("BTD,DF->BTF"), cost formulas and local
variables named for a size use these letters and no others; `refmodel/__init__.py`'s docstring
shows the same table and tests/test_alphabet.py checks both. GLOBAL letters mean the same in
every variant; VARIANT letters belong to one variant (or two, as U) but still one meaning.
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
    "M": "rows of one KV head's grouped matmul, G T",
    "U": "value head dim (MLA, linear attention)",
    "P": "MLA no-RoPE query/key dims (qk_nope_dim)",
    "Q": "MLA RoPE dims (qk_rope_dim)",
    "Y": "MLA compressed-query rank (q_lora_rank)",
    "C": "chunks of linear's chunked prefill",
    "X": "linear conv channels",
    "Z": "linear conv taps (linear_conv)",
    "I": "sparse indexer heads",
    "J": "sparse indexer dim",
}

SHAPE_LETTERS: dict[str, str] = {**GLOBAL, **VARIANT}
