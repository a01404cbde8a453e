"""Named model configs: tiny ones that run anywhere, and real architectures that are counted.

`get(name)` returns a frozen `ModelConfig`; `PRESETS` lists every name. The tiny preset runs
every attention and FFN kind by changing only `attention` / `ffn` / `layer_pattern`.
"""

from __future__ import annotations

from refmodel.config import ModelConfig

PRESETS: dict[str, ModelConfig] = {}


def _add(cfg: ModelConfig) -> ModelConfig:
    PRESETS[cfg.name] = cfg
    return cfg


# Runnable sizes ------------------------------------------------------------------------------

# Runs in milliseconds; the test suite's model. Every variant-specific field is set small.
_add(ModelConfig(name="tiny", vocab_size=256, d_model=64, n_layers=2, n_heads=4, n_kv_heads=2,
                 d_ff=128, n_experts=8, top_k=2, d_ff_expert=64, window=8, sparse_top_k=6))
# A few million parameters: a notebook-sized model whose phases are still visible.
_add(ModelConfig(name="small", vocab_size=4096, d_model=256, n_layers=4, n_heads=8,
                 n_kv_heads=2, d_ff=768, n_experts=8, top_k=2, d_ff_expert=384, window=64,
                 kv_lora_rank=64, qk_nope_dim=32, qk_rope_dim=16, v_head_dim=32,
                 sparse_top_k=32, indexer_heads=4, indexer_dim=32, linear_k_heads=4,
                 linear_v_heads=8, linear_key_dim=32, linear_value_dim=32, linear_chunk=16))
# ~317M parameters, 1.27 GB in float32: weights ~40x this machine's last-level cache, so a
# batch-1 decode step streams from DRAM (the bandwidth-bound regime of issue 6).
_add(ModelConfig(name="medium", vocab_size=32000, d_model=1024, n_layers=20, n_heads=16,
                 n_kv_heads=8, d_ff=3072, n_experts=8, top_k=2, d_ff_expert=1536,
                 window=256, kv_lora_rank=256, qk_nope_dim=64, qk_rope_dim=32, v_head_dim=64,
                 sparse_top_k=256, indexer_heads=4, indexer_dim=64, linear_k_heads=8,
                 linear_v_heads=16, linear_key_dim=64, linear_value_dim=64, linear_chunk=64))


def get(name: str) -> ModelConfig:
    """The preset called `name`; an unknown name lists the valid ones."""
    try:
        return PRESETS[name]
    except KeyError:
        raise ValueError(f"preset {name!r} is unknown; choose one of {sorted(PRESETS)}") from None


def names() -> tuple[str, ...]:
    return tuple(PRESETS)
