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
# ~50M parameters, 200 MB in float32 (6x a 32 MiB last-level cache) in only 4 layers, so it
# compiles in seconds: the model of the phase sweeps, whose decode streams from DRAM.
_add(ModelConfig(name="bench", vocab_size=16384, d_model=768, n_layers=4, n_heads=12,
                 n_kv_heads=4, d_ff=2048, n_experts=8, top_k=2, d_ff_expert=1024,
                 window=256, kv_lora_rank=192, qk_nope_dim=64, qk_rope_dim=32, v_head_dim=64,
                 sparse_top_k=256, indexer_heads=4, indexer_dim=64, linear_k_heads=6,
                 linear_v_heads=12, linear_key_dim=64, linear_value_dim=64, linear_chunk=64))
# ~317M parameters, 1.27 GB in float32: weights ~40x a 32 MiB last-level cache, so a
# batch-1 decode step streams from DRAM (the bandwidth-bound regime).
_add(ModelConfig(name="medium", vocab_size=32000, d_model=1024, n_layers=20, n_heads=16,
                 n_kv_heads=8, d_ff=3072, n_experts=8, top_k=2, d_ff_expert=1536,
                 window=256, kv_lora_rank=256, qk_nope_dim=64, qk_rope_dim=32, v_head_dim=64,
                 sparse_top_k=256, indexer_heads=4, indexer_dim=64, linear_k_heads=8,
                 linear_v_heads=16, linear_key_dim=64, linear_value_dim=64, linear_chunk=64))

# The shape of the decode race with llama.cpp (`python -m microbench decode`): a Llama of ~309M
# parameters (1.23 GB in float32), plain GQA + SwiGLU, the architecture every CPU engine runs,
# so the same weights load in both.
_add(ModelConfig(name="llama-309m", vocab_size=32000, d_model=1024, n_layers=16, n_heads=16,
                 n_kv_heads=4, d_ff=4096))

# Byte-level models trained here on the Python standard library's source (refmodel/training):
# vocabulary 257 = 256 bytes + BOS. The target is ~9.6M parameters (38 MB in float32, more than
# a 32 MiB last-level cache: its batch-1 decode streams from DRAM, as a real model's does); the
# draft, ~1M, shares its tokenizer; the MoE target routes top-2 of 8 experts (~6M active of
# ~17M); the micro model trains in seconds for CI.
_BYTE = dict(vocab_size=257, rope_theta=10_000.0)
_add(ModelConfig(name="byte-micro", d_model=64, n_layers=2, n_heads=4, n_kv_heads=2, d_ff=192,
                 window=16, **_BYTE))
_add(ModelConfig(name="byte-draft", d_model=128, n_layers=4, n_heads=4, n_kv_heads=2, d_ff=512,
                 window=64, **_BYTE))
_add(ModelConfig(name="byte-target", d_model=384, n_layers=6, n_heads=6, n_kv_heads=2,
                 d_ff=1024, window=64, **_BYTE))
_add(ModelConfig(name="byte-target-moe", d_model=384, n_layers=6, n_heads=6, n_kv_heads=2,
                 d_ff=1024, ffn="moe", n_experts=8, top_k=2, d_ff_expert=256, window=64,
                 **_BYTE))


# Real architectures: counted, never materialised -----------------------------------------------
#
# Transcribed from the models' configs and papers (the citation of each is PRESET_SOURCES[name]);
# every parameter total is derived from these hyperparameters by `refmodel.costs`, never fitted.
# Weights and caches are counted in bfloat16 (dtype), as these models are served; only fields
# that change a count or a cost are set (rope_theta and eps are set for fidelity, softmax scales
# where they differ from H**-0.5).

PRESET_SOURCES: dict[str, str] = {}

_LLAMA3 = dict(vocab_size=128256, n_kv_heads=8, head_dim=128, rope_theta=500_000.0,
               norm_eps=1e-5, dtype="bfloat16")
_LLAMA3_SRC = ("Llama 3 (Grattafiori et al. 2024, arXiv:2407.21783); meta-llama/llama-models "
               "models/sku_list.py (dim, n_layers, n_heads, n_kv_heads 8, vocab 128256, FFN "
               "14336/28672/53248) and the HF config.json (untied, rope_theta 500000)")


def _real(source: str, **fields) -> ModelConfig:
    cfg = _add(ModelConfig(**fields))
    PRESET_SOURCES[cfg.name] = source
    return cfg


_real(_LLAMA3_SRC, name="llama3-8b", d_model=4096, n_layers=32, n_heads=32, d_ff=14336,
      **_LLAMA3)
_real(_LLAMA3_SRC, name="llama3-70b", d_model=8192, n_layers=80, n_heads=64, d_ff=28672,
      **_LLAMA3)
_real(_LLAMA3_SRC + "; KV/token 516,096 B in bf16 (Zhao et al. 2025, arXiv:2505.09343, "
      "Table 1)", name="llama3.1-405b", d_model=16384, n_layers=126, n_heads=128, d_ff=53248,
      **_LLAMA3)
_real("Mistral 7B (Jiang et al. 2023, arXiv:2310.06825) Table 1: dim 4096, 32 layers, head_dim "
      "128, hidden 14336, 32 heads, 8 KV heads, window 4096 on every layer (rolling buffer), "
      "vocab 32000; v0.1 (v0.2+ drop the window)",
      name="mistral-7b", vocab_size=32000, d_model=4096, n_layers=32, n_heads=32, n_kv_heads=8,
      head_dim=128, d_ff=14336, attention="sliding", window=4096, norm_eps=1e-5,
      dtype="bfloat16")
_real("Mixtral of Experts (Jiang et al. 2024, arXiv:2401.04088); HF config "
      "Mixtral-8x7B-v0.1 (8 experts, top-2, intermediate 14336, rope_theta 1e6, no sliding "
      "window); model card: 46.7B total, 12.9B per token",
      name="mixtral-8x7b", vocab_size=32000, d_model=4096, n_layers=32, n_heads=32,
      n_kv_heads=8, head_dim=128, d_ff=14336, ffn="moe", n_experts=8, top_k=2,
      d_ff_expert=14336, rope_theta=1e6, norm_eps=1e-5, dtype="bfloat16")

# mla_absorb: decode in the latent space, as DeepSeek serves it (its prefill expands instead;
# `dataclasses.replace(cfg, mla_absorb=False)` counts the naive form).
_DEEPSEEK_MLA = dict(attention="mla", kv_lora_rank=512, qk_nope_dim=128, qk_rope_dim=64,
                     v_head_dim=128, head_dim=192, mla_absorb=True, ffn="moe",
                     dtype="bfloat16")
_DEEPSEEK_NOTE = ("MLA counted absorbed (mla_absorb, DeepSeek's decode form). Not modelled, as "
                  "they hold no parameters: YaRN scaling, group-limited routing, the routed "
                  "scaling factor")
_real("DeepSeek-V2 report (arXiv:2405.04434) Appendix B and deepseek-ai/DeepSeek-V3 "
      "inference/configs/config_16B.json (= V2-Lite: no query compression, 27 layers, d 2048, "
      "16 heads, 64 routed + 2 shared experts of 1408, top-6, first layer dense 10944, vocab "
      "102400); 15.7B total / 2.4B active. " + _DEEPSEEK_NOTE,
      name="deepseek-v2-lite", vocab_size=102400, d_model=2048, n_layers=27, n_heads=16,
      n_kv_heads=16, q_lora_rank=0, d_ff=10944, n_experts=64, top_k=6, d_ff_expert=1408,
      n_shared_experts=2, first_dense_layers=1, norm_topk=False, **_DEEPSEEK_MLA)
_real("DeepSeek-V2 report (arXiv:2405.04434) Sec. 3.1.2 and config_236B.json: 60 layers, d "
      "5120, 128 heads, d_c 512, d_c' 1536, rope 64, 160 routed + 2 shared experts of 1536, "
      "top-6, first layer dense 12288, vocab 102400; 236B total / 21B active. " + _DEEPSEEK_NOTE,
      name="deepseek-v2", vocab_size=102400, d_model=5120, n_layers=60, n_heads=128,
      n_kv_heads=128, q_lora_rank=1536, d_ff=12288, n_experts=160, top_k=6, d_ff_expert=1536,
      n_shared_experts=2, first_dense_layers=1, norm_topk=False, **_DEEPSEEK_MLA)
_real("DeepSeek-V3 report (arXiv:2412.19437) Sec. 4.2 and config_671B.json: 61 layers, d 7168, "
      "128 heads, d_c 512, d_c' 1536, rope 64, 256 routed + 1 shared expert of 2048, top-8 "
      "sigmoid, first 3 layers dense 18432, vocab 129280; 671B main model (the 14B MTP module "
      "is not included); KV/token 70,272 B in bf16 (arXiv:2505.09343 Table 1). "
      + _DEEPSEEK_NOTE + "; the selection-only e_score_correction_bias (256 per MoE layer, "
      "14,848 in all) is not modelled",
      name="deepseek-v3", vocab_size=129280, d_model=7168, n_layers=61, n_heads=128,
      n_kv_heads=128, q_lora_rank=1536, d_ff=18432, n_experts=256, top_k=8, d_ff_expert=2048,
      n_shared_experts=1, first_dense_layers=3, router_score="sigmoid", norm_topk=True,
      **_DEEPSEEK_MLA)

_QWEN3 = dict(vocab_size=151936, n_kv_heads=4, head_dim=128, qk_norm=True, ffn="moe",
              n_experts=128, top_k=8, rope_theta=1e6, dtype="bfloat16")
_QWEN3_SRC = ("Qwen3 Technical Report (arXiv:2505.09388) Table 2 and the HF config.json "
              "(hidden {D}, {L} layers, {N}/4 heads, head_dim 128, 128 experts of {F}, top-8, "
              "no shared expert, QK-RMSNorm, vocab 151936, untied); model card: {card}")
_real(_QWEN3_SRC.format(D=2048, L=48, N=32, F=768, card="30.5B total, 3.3B activated"),
      name="qwen3-30b-a3b", d_model=2048, n_layers=48, n_heads=32, d_ff=6144, d_ff_expert=768,
      **_QWEN3)
_real(_QWEN3_SRC.format(D=4096, L=94, N=64, F=1536, card="235B total, 22B activated"),
      name="qwen3-235b-a22b", d_model=4096, n_layers=94, n_heads=64, d_ff=12288,
      d_ff_expert=1536, **_QWEN3)

_GEMMA2 = dict(vocab_size=256128, mlp_act="geglu", tie_embeddings=True,
               post_norms=True, layer_pattern=("sliding", "gqa"), window=4096,
               attn_softcap=50.0, final_softcap=30.0, dtype="bfloat16")
_GEMMA2_SRC = ("Gemma 2 report (arXiv:2408.00118) Table 1 and google-deepmind/gemma _gemma.py "
               "{name}: d {D}, {L} layers, {N} heads, {K} KV heads, head {H}, GeGLU hidden {F} "
               "(the paper's 'feedforward dim' is gate + up), local (4096) / global alternating "
               "from layer 0, logit soft-caps 50 / 30, query scale {Q}**-0.5, tied 256,128-row "
               "embedding (the HF config's 256000 drops the unused rows)")
_real(_GEMMA2_SRC.format(name="Gemma2_9B", D=3584, L=42, N=16, K=8, H=256, F=14336, Q=256),
      name="gemma2-9b", d_ff=14336, d_model=3584, n_layers=42, n_heads=16,
      n_kv_heads=8, head_dim=256, query_scale=256, **_GEMMA2)
_real(_GEMMA2_SRC.format(name="Gemma2_27B", D=4608, L=46, N=32, K=16, H=128, F=36864, Q=144),
      name="gemma2-27b", d_ff=36864, d_model=4608, n_layers=46, n_heads=32,
      n_kv_heads=16, head_dim=128, query_scale=144, **_GEMMA2)
_real("Gemma 3 report (arXiv:2503.19786) and google-deepmind/gemma _gemma.py Gemma3_27B: d 5376, "
      "62 layers, 32 heads, 16 KV heads, head 128, GeGLU hidden 21504, 5 local (1024) : 1 "
      "global, QK-norm, pre and post norms, query scale 168**-0.5, tied embedding of 262,208 "
      "rows as the HF config (the gemma repo's tokenizer uses 262,144). Text model only: the "
      "417M-parameter vision encoder and projector are not included; one rope_theta for both "
      "layer kinds (1e6 global, 1e4 local in the release)",
      name="gemma3-27b", vocab_size=262208, d_model=5376, n_layers=62, n_heads=32,
      n_kv_heads=16, head_dim=128, d_ff=21504, mlp_act="geglu", tie_embeddings=True,
      post_norms=True, qk_norm=True, layer_pattern=("sliding",) * 5 + ("gqa",), window=1024,
      query_scale=168, rope_theta=1e6, dtype="bfloat16")

_GPT_OSS = dict(vocab_size=201088, d_model=2880, n_heads=64, n_kv_heads=8, head_dim=64,
                d_ff=2880, d_ff_expert=2880, ffn="moe", top_k=4, attn_bias=True,
                attn_sinks=True, moe_bias=True, router_bias=True,
                layer_pattern=("sliding", "gqa"), window=128, rope_theta=150_000.0,
                norm_eps=1e-5, dtype="bfloat16")
_GPT_OSS_SRC = ("openai/gpt-oss gpt_oss/torch/model.py ModelConfig ({L} layers, {E} experts, "
                "top-4, hidden 2880, expert width 2880, head_dim 64, 64 heads, 8 KV heads, "
                "qkv/out biases, per-head sinks, experts and router with biases, banded window "
                "128 on even layers, vocab 201088, untied) and the model card arXiv:2508.10925 "
                "Table 1 ({card}; the card counts the unembedding but not the embedding as "
                "active: param_counts()['active_without_embedding']). SwiGLU clamp and alpha "
                "hold no parameters; the release stores experts in MXFP4 (counted in bf16 here)")
_real(_GPT_OSS_SRC.format(L=24, E=32, card="20.91B total, 3.61B active"),
      name="gpt-oss-20b", n_layers=24, n_experts=32, **_GPT_OSS)
_real(_GPT_OSS_SRC.format(L=36, E=128, card="116.83B total, 5.13B active"),
      name="gpt-oss-120b", n_layers=36, n_experts=128, **_GPT_OSS)

# Nemotron-H's hybrid pattern: M = Mamba-2 layer, - = MLP layer, * = attention layer; each is a
# block here with the other half set to "none" (one pre-norm per layer, as the release).
_NEMOTRON_H_8B = "M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M-"
_NEMOTRON_MIXER = {"M": "linear", "-": "none", "*": "gqa"}
_NEMOTRON_FFN = {"M": "none", "-": "dense", "*": "none"}
_real("Nemotron-H (arXiv:2504.03624); HF transformers NemotronHConfig defaults = Nemotron-H-8B: "
      "hidden 4096, 52 layers 'M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M-' (24 "
      "Mamba-2, 4 attention, 24 MLP), 32 heads, 8 KV heads, head_dim 128, no position "
      "embedding, squared-ReLU MLP 21504, Mamba-2 with 128 heads of 64, state 128, 8 groups, "
      "conv 4, vocab 131072, untied",
      name="nemotron-h-8b", vocab_size=131072, d_model=4096, n_layers=52, n_heads=32,
      n_kv_heads=8, head_dim=128, d_ff=21504, mlp_act="relu2", position="none",
      attention="gqa", layer_pattern=tuple(_NEMOTRON_MIXER[c] for c in _NEMOTRON_H_8B),
      ffn_pattern=tuple(_NEMOTRON_FFN[c] for c in _NEMOTRON_H_8B), linear_rule="mamba2",
      linear_k_heads=8, linear_v_heads=128, linear_key_dim=128, linear_value_dim=64,
      linear_conv=4, norm_eps=1e-5, dtype="bfloat16")
_real("HF model card Qwen3-Next-80B-A3B (48 layers = 12 x (3 x (Gated DeltaNet -> MoE), "
      "1 x (Gated Attention -> MoE)); gated attention 16 Q / 2 KV heads, head 256, RoPE on 64 "
      "dims; Gated DeltaNet 32 V / 16 QK heads of 128, conv 4; 512 experts of 512, top-10, 1 "
      "shared expert of 512 with a sigmoid gate; 80B total, 3B activated) and MaxText's "
      "convert_qwen3_next (hidden 2048, vocab 151936); QK-norm on the attention layers, "
      "untied. The multi-token-prediction layer is not included",
      name="qwen3-next-80b-a3b", vocab_size=151936, d_model=2048, n_layers=48, n_heads=16,
      n_kv_heads=2, head_dim=256, d_ff=512, attention="gqa",
      layer_pattern=("linear", "linear", "linear", "gqa"), qk_norm=True, attn_out_gate=True,
      rope_fraction=0.25, rope_theta=10_000_000.0, ffn="moe", n_experts=512, top_k=10,
      d_ff_expert=512, n_shared_experts=1, shared_expert_gate=True, linear_rule="gated_delta",
      linear_k_heads=16, linear_v_heads=32, linear_key_dim=128, linear_value_dim=128,
      linear_conv=4, dtype="bfloat16")
_real("OpenAI GPT-2 release (hparams n_layer 12, n_embd 768, n_head 12, n_ctx 1024, n_vocab "
      "50257; checkpoint '124M'; Radford et al. 2019): learned positions, LayerNorm, biases "
      "everywhere, GELU 4x MLP, tied embedding",
      name="gpt2", vocab_size=50257, d_model=768, n_layers=12, n_heads=12, n_kv_heads=12,
      d_ff=3072, attention="mha", position="learned", max_position=1024, norm="layernorm",
      norm_eps=1e-5, attn_bias=True, mlp_bias=True, mlp_act="gelu", tie_embeddings=True,
      dtype="float32")


def get(name: str) -> ModelConfig:
    """The preset called `name`; an unknown name lists the valid ones."""
    try:
        return PRESETS[name]
    except KeyError:
        raise ValueError(f"preset {name!r} is unknown; choose one of {sorted(PRESETS)}") from None


def names() -> tuple[str, ...]:
    return tuple(PRESETS)


def source(name: str) -> str:
    """Where the preset `name` comes from (the citation of a real architecture)."""
    get(name)
    return PRESET_SOURCES.get(name, "a runnable size of this project (no published model)")


# Shipped precisions: the weight format a release publishes, where it is not its `dtype`, with
# the citation; `shipped(name)` is the preset counted in it. One format per model: a release
# that mixes them per tensor (gpt-oss: MXFP4 routed experts, bfloat16 elsewhere) is not
# expressible here and is left in its dtype.
SHIPPED: dict[str, tuple[str, str]] = {
    "deepseek-v3": ("float8", "DeepSeek-V3 report (arXiv:2412.19437) Sec. 3.3 and the HF "
                    "release deepseek-ai/DeepSeek-V3: weights in FP8 e4m3 with a float32 scale "
                    "per 128 x 128 block (counted here with one scale per output channel: "
                    "4 bytes per 7168-2048 weights either way, under 0.2% of the bytes)"),
}


def shipped(name: str) -> ModelConfig:
    """The preset `name` in the weight format its release ships (SHIPPED; else as it is)."""
    cfg = get(name)
    if name in SHIPPED:
        return cfg.replace(weight_format=SHIPPED[name][0])
    return cfg
