"""The training loop: AdamW with warmup and cosine decay, gradient clipping, bits per byte.

A jitted step of `optax` on the model's parameters (split from the Flax NNX module once, as the
phases are: the step is a pure function of (params, optimiser state, batch), its inputs donated).
Validation loss is reported in bits per byte (the tokens are bytes: nats / ln 2) on fixed
windows of the validation split. A checkpoint (`checkpoint.py`) is written every
`checkpoint_every` steps and at the end; a run finds its recipe's checkpoint and continues
from it, drawing the very batches the uninterrupted run would have (`data.train_batch`).
"""

from __future__ import annotations

import functools
import math
import os
import time
from dataclasses import dataclass
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx
from tqdm.auto import tqdm

import refmodel
from refmodel import presets
from refmodel.moe import MoE
from refmodel.training import checkpoint, data
from refmodel.training.recipes import Recipe

CACHE_ENV = "INFERENCE_LAB_CACHE"


def cache_dir() -> Path:
    """Where trained checkpoints live: $INFERENCE_LAB_CACHE, else ~/.cache/inference-lab."""
    return Path(os.environ.get(CACHE_ENV) or Path.home() / ".cache" / "inference-lab")


def checkpoint_path(recipe: Recipe, root: Path | None = None) -> Path:
    return (root or cache_dir()) / "checkpoints" / f"{recipe.name}-{recipe.fingerprint()}.ckpt"


def optimizer(recipe: Recipe) -> optax.GradientTransformation:
    schedule = optax.warmup_cosine_decay_schedule(
        0.0, recipe.lr, recipe.warmup, recipe.steps, recipe.lr * recipe.final)
    decay = lambda params: jax.tree.map(lambda p: p.ndim >= 2, params)  # matrices only
    return optax.chain(optax.clip_by_global_norm(recipe.clip),
                       optax.adamw(schedule, b1=0.9, b2=recipe.b2,
                                   weight_decay=recipe.weight_decay, mask=decay))


def loss_nats(graphdef, params, rest, windows):
    """Mean next-token cross entropy (nats) of windows int32 [B, T + 1]."""
    model = nnx.merge(graphdef, params, rest)
    logits, _ = model(windows[:, :-1])  # [B, T, V]
    return optax.softmax_cross_entropy_with_integer_labels(logits, windows[:, 1:]).mean()


@functools.lru_cache(maxsize=8)
def _jitted(graphdef, recipe: Recipe):
    """(train step, validation loss), jitted once per model graph and recipe."""
    tx = optimizer(recipe)

    def step(params, opt_state, rest, windows):
        loss, grads = jax.value_and_grad(lambda p: loss_nats(graphdef, p, rest, windows))(params)
        updates, opt_state = tx.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss

    return (jax.jit(step, donate_argnums=(0, 1)),
            jax.jit(lambda params, rest, w: loss_nats(graphdef, params, rest, w)))


@dataclass
class Trainer:
    """One recipe's model, optimiser and jitted step."""

    recipe: Recipe

    def __post_init__(self):
        cfg = presets.get(self.recipe.model)
        if cfg.vocab_size != data.VOCAB:
            raise ValueError(f"recipe {self.recipe.name!r}: model {self.recipe.model!r} has "
                             f"vocab_size={cfg.vocab_size}; byte-level training needs "
                             f"{data.VOCAB}")
        model = refmodel.init(cfg, seed=self.recipe.seed)
        for _, module in nnx.iter_modules(model):
            if isinstance(module, MoE):
                module.dense_dispatch = True  # differentiable (see MoE)
        self.graphdef, self.params, self.rest = nnx.split(model, nnx.Param, ...)
        self.opt_state = optimizer(self.recipe).init(self.params)
        self.step, self.eval = _jitted(self.graphdef, self.recipe)

    @property
    def state(self):
        return {"params": self.params, "opt_state": self.opt_state}

    def model(self) -> nnx.Module:
        """The trained model for inference (the MoE's grouped dispatch back on)."""
        model = nnx.merge(self.graphdef, self.params, self.rest)
        for _, module in nnx.iter_modules(model):
            if isinstance(module, MoE):
                module.dense_dispatch = False
        return model

    def val_bpb(self, batches: np.ndarray) -> float:
        nats = [float(self.eval(self.params, self.rest, jnp.asarray(b))) for b in batches]
        return float(np.mean(nats)) / math.log(2)


@dataclass
class Result:
    recipe: Recipe
    model: nnx.Module
    step: int
    val_bpb: float | None
    history: list  # [{"step", "loss_bpb", "val_bpb"?, "seconds", "tokens_per_s"}]
    path: Path | None
    seconds: float  # this run's time (validation included; a resumed run's earlier part not)
    corpus: str
    trained_tokens: int = 0  # tokens this run trained on

    @property
    def tokens_per_s(self) -> float:
        """This run's mean training rate, validation time included."""
        return self.trained_tokens / self.seconds if self.trained_tokens else float("nan")


def train(recipe: Recipe, *, root: Path | None = None, resume: bool = True,
          stop_at: int | None = None, save: bool = True, progress: bool = True) -> Result:
    """Train `recipe` (or continue its checkpoint) to `recipe.steps` (or `stop_at`, e.g. to
    test resuming). Returns the trained model, its validation bits per byte and the history."""
    corpus = data.load(max_bytes=recipe.max_bytes)
    trainer = Trainer(recipe)
    path = checkpoint_path(recipe, root) if save or resume else None
    step, history = 0, []
    if resume and path is not None and path.exists():
        step, state, meta = checkpoint.load(path, trainer.state)
        trainer.params, trainer.opt_state = (jax.tree.map(jnp.asarray, state["params"]),
                                             jax.tree.map(jnp.asarray, state["opt_state"]))
        history = meta["history"]
    end = recipe.steps if stop_at is None else min(stop_at, recipe.steps)
    val = data.val_batches(corpus, recipe.eval_batches, recipe.batch, recipe.seq_len)
    tokens = recipe.batch * recipe.seq_len
    t0, done, window = time.perf_counter(), 0, [time.perf_counter(), 0]
    bar = tqdm(total=end, initial=step, desc=recipe.name, unit="step", disable=not progress)

    def keep():
        if save:
            checkpoint.save(path, step, trainer.state,
                            {"recipe": recipe.name, "model": recipe.model, "history": history})

    loss = None
    while step < end:
        batch = jnp.asarray(data.train_batch(corpus, recipe.seed, step, recipe.batch,
                                             recipe.seq_len))
        trainer.params, trainer.opt_state, loss = trainer.step(
            trainer.params, trainer.opt_state, trainer.rest, batch)
        step, done = step + 1, done + 1
        evaluate = step % recipe.eval_every == 0 or step == recipe.steps
        if step % 10 == 0 or step == end or evaluate:  # reading the loss waits for the step
            now = time.perf_counter()
            rate = (done - window[1]) * tokens / (now - window[0])
            window = [now, done]
            row = {"step": step, "loss_bpb": float(loss) / math.log(2),
                   "seconds": now - t0, "tokens_per_s": rate}
            if evaluate:
                row["val_bpb"] = trainer.val_bpb(val)
                window = [time.perf_counter(), done]  # the training rate leaves it out
            history.append(row)
            bar.set_postfix(loss=f"{row['loss_bpb']:.3f} b/B", tok_s=f"{rate:,.0f}",
                            **({"val": f"{row['val_bpb']:.3f}"} if "val_bpb" in row else {}))
            bar.update(step - bar.n)
        if step % recipe.checkpoint_every == 0 and step < end:
            keep()
    bar.close()
    seconds = time.perf_counter() - t0
    if done:
        keep()
    vals = [h["val_bpb"] for h in history if "val_bpb" in h]
    return Result(recipe, trainer.model(), step, vals[-1] if vals else None, history,
                  path if save else None, seconds, corpus.describe(), done * tokens)


@functools.lru_cache(maxsize=16)
def _loss_of(graphdef, cached: bool):
    def loss(state, windows):
        if not cached:
            return loss_nats(graphdef, state, nnx.State({}), windows)
        model = nnx.merge(graphdef, state)
        B, T = windows.shape[0], windows.shape[1] - 1
        logits, _ = model(windows[:, :-1], refmodel.init_cache(model.cfg, B, T))
        return optax.softmax_cross_entropy_with_integer_labels(logits, windows[:, 1:]).mean()

    return jax.jit(loss)


def bits_per_byte(model: nnx.Module, name: str, cached: bool | None = None) -> float:
    """Validation bits per byte of any model (e.g. quantized: `refmodel.quant.quantize`) on
    recipe `name`'s validation batches, the ones its training reports. `cached`: through a
    cache (every token's keys written to it and read back from it, as prefill does), which a
    quantized cache rounds; None: when the model's cache is quantized."""
    from refmodel.training.recipes import get

    recipe = get(name)
    corpus = data.load(max_bytes=recipe.max_bytes)
    val = data.val_batches(corpus, recipe.eval_batches, recipe.batch, recipe.seq_len)
    graphdef, state = nnx.split(model)
    loss = _loss_of(graphdef, model.cfg.kv_format != "none" if cached is None else cached)
    return float(np.mean([float(loss(state, jnp.asarray(b))) for b in val])) / math.log(2)


def trained(name: str, *, root: Path | None = None, progress: bool = True) -> nnx.Module:
    """The trained model of recipe `name`: its cached checkpoint, trained first if missing."""
    from refmodel.training.recipes import get

    recipe = get(name)
    path = checkpoint_path(recipe, root)
    if path.exists():
        trainer = Trainer(recipe)
        step, state, _ = checkpoint.load(path, trainer.state)
        if step >= recipe.steps:
            trainer.params = jax.tree.map(jnp.asarray, state["params"])
            return trainer.model()
    return train(recipe, root=root, progress=progress).model
