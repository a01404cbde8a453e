"""Training recipes: which model, how long, and the optimiser's settings, frozen and named.

`get(name)` returns a `Recipe`; `RECIPES` lists them. The step counts are sized so that each
recipe trains on a 2-core CPU in minutes, `micro` in seconds (`python -m refmodel train
--recipe NAME` prints the time and the validation loss).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from dataclasses import dataclass

# Config fields a checkpoint does not depend on (`fingerprint`).
INFERENCE_ONLY = ("weight_format", "kv_format", "quant_activations", "backend")


@dataclass(frozen=True)
class Recipe:
    name: str
    model: str  # a preset of refmodel.presets (a byte-level one: vocab_size 257)
    steps: int
    batch: int = 16  # sequences per step
    seq_len: int = 256  # tokens per sequence
    lr: float = 2e-3  # peak learning rate, after `warmup` linear steps, cosine to lr x final
    warmup: int = 50
    final: float = 0.1
    weight_decay: float = 0.1  # AdamW, on matrices only (not norms, biases or gains)
    b2: float = 0.95
    clip: float = 1.0  # global gradient norm
    seed: int = 0  # the model's initialisation and the batches
    eval_every: int = 100
    eval_batches: int = 8  # validation batches of `batch` x `seq_len` tokens, the same each time
    checkpoint_every: int = 100
    max_bytes: int | None = None  # use only the first files of the corpus (the micro recipe)

    def __post_init__(self):
        for f in ("steps", "batch", "seq_len", "eval_every", "eval_batches", "checkpoint_every"):
            v = getattr(self, f)
            if not isinstance(v, int) or isinstance(v, bool) or v <= 0:
                raise ValueError(f"recipe field {f}={v!r} must be a positive integer")
        if not 0 <= self.warmup < self.steps:
            raise ValueError(f"warmup={self.warmup} must be in [0, steps={self.steps})")
        for f in ("lr", "final", "b2", "clip"):
            v = getattr(self, f)
            if not isinstance(v, (int, float)) or not v > 0:
                raise ValueError(f"recipe field {f}={v!r} must be a number > 0")

    @property
    def tokens(self) -> int:
        return self.steps * self.batch * self.seq_len

    def fingerprint(self) -> str:
        """8 hex digits of the recipe, its model config and its parameters' shapes: a
        checkpoint's file name, so a changed recipe, model or parameter layout never resumes
        from another's checkpoint."""
        from flax import nnx

        from refmodel import presets
        from refmodel.model import Transformer

        cfg = presets.get(self.model)
        # the config's repr without the fields that do not change training (quantization is
        # applied to a trained model), so adding such a field keeps every checkpoint's name
        shown = ", ".join(f"{f.name}={getattr(cfg, f.name)!r}" for f in dataclasses.fields(cfg)
                          if f.name not in INFERENCE_ONLY)
        model = nnx.eval_shape(lambda: Transformer(cfg, rngs=nnx.Rngs(0)))
        shapes = [f"{path}: {tuple(v.shape)}" for path, v in nnx.to_flat_state(
            nnx.state(model, nnx.Param))]
        blob = json.dumps([dataclasses.asdict(self), f"{type(cfg).__qualname__}({shown})",
                           shapes])
        return hashlib.sha256(blob.encode()).hexdigest()[:8]


RECIPES: dict[str, Recipe] = {r.name: r for r in (
    # seconds: CI checks that the loss falls
    Recipe("micro", "byte-micro", steps=40, batch=8, seq_len=64, lr=3e-3, warmup=5,
           eval_every=20, eval_batches=2, checkpoint_every=20, max_bytes=2_000_000),
    # its drafter in the quick speculative benchmark: the same small model, fewer steps
    Recipe("micro-draft", "byte-micro", steps=20, batch=8, seq_len=64, lr=3e-3, warmup=5,
           seed=1, eval_every=20, eval_batches=2, checkpoint_every=20, max_bytes=2_000_000),
    # the speculative-decoding drafter: ~1M parameters
    Recipe("draft", "byte-draft", steps=250, batch=16, seq_len=256, lr=3e-3, warmup=30),
    # the target: ~9.6M parameters
    Recipe("target", "byte-target", steps=500, batch=8, seq_len=256, lr=2e-3, warmup=30),
    # the MoE target: top-2 of 8 experts, ~6M active of ~17M
    Recipe("target-moe", "byte-target-moe", steps=250, batch=8, seq_len=256, lr=2e-3,
           warmup=30),
)}


def get(name: str) -> Recipe:
    try:
        return RECIPES[name]
    except KeyError:
        raise ValueError(f"recipe {name!r} is unknown; choose one of {sorted(RECIPES)}") from None
