"""refmodel: a small transformer whose every inference phase is both counted and run.

Shape alphabet (the scaling book's letters; einsum strings and shape comments use them, one
letter one meaning in the whole package; the table is `refmodel.shapes.SHAPE_LETTERS`):

    B batch            T query length (new tokens)    S key/value length (cached tokens)
    D model width      N query heads                  K key/value heads
    G groups, N / K    H head dim                     F FFN width
    E experts          A active (top-k) experts       R latent rank (MLA)
    W window           L layers                       V vocabulary

Letters of single variants and of the native kernels (attention/, kernels/); a size with no
letter is written as a word (a weight product's n_in inputs and n_out outputs):

    M rows of a product: G T of grouped attention, a weight product's tokens
    U value head dim (MLA, linear attention)      P MLA no-RoPE query/key dims (qk_nope_dim)
    Q MLA RoPE dims (qk_rope_dim)                 Y MLA compressed-query rank (q_lora_rank)
    C chunks of a sequence (linear's prefill, the decode kernels' keys)
    X linear conv channels                        Z linear conv taps (linear_conv)
    I sparse indexer heads                        J sparse indexer dim

Public API (tests, notebooks and microbench use only this):

    cfg = refmodel.presets.get("tiny")                # frozen ModelConfig; presets.PRESETS
    cfg = dataclasses.replace(cfg, attention="gqa", ffn="moe")
    model = refmodel.init(cfg, seed=0)                # Flax NNX module
    logits = refmodel.forward(model, tokens)          # int32 [B, T] -> float32 [B, T, V]
    cache = refmodel.init_cache(cfg, batch=B, max_len=S)
    logits, cache = refmodel.prefill(model, tokens, cache)          # [B, T, V]
    logits, cache = refmodel.decode_step(model, tokens[:, t], cache)  # [B] -> [B, V]
    out = refmodel.generate(model, prompt, max_new_tokens=n, temperature=0.0)  # [B, T + n]
    phases = refmodel.Phases(model)                   # jitted pure phase functions

Beside it: `refmodel.training` (byte-level models trained with optax on the Python standard
library's source), `refmodel.speculative` (draft, verify, accept, roll back),
`refmodel.serving` (the engine) and `refmodel.sim` (the simulator).
"""

from refmodel import attention, costs, counting, ops, presets
from refmodel.api import (
    decode_step,
    forward,
    generate,
    init,
    init_cache,
    prefill,
    router_stats,
)
from refmodel.config import ModelConfig
from refmodel.model import Cache, Transformer
from refmodel.phases import PHASES, Phases

try:  # the fast paths register themselves behind refmodel.ops; without them, the reference
    from refmodel import backends
except ModuleNotFoundError as e:
    if e.name != "refmodel.backends":
        raise
    backends = None

__all__ = [
    "PHASES", "Cache", "ModelConfig", "Phases", "Transformer", "attention", "costs", "counting",
    "backends", "decode_step", "forward", "generate", "init", "init_cache", "ops", "prefill",
    "presets",
    "router_stats",
]
