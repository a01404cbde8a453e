"""The one interface every attention variant implements.

A variant is a Flax NNX module registered under one or more kinds (`@register("gqa")`):

    layer = cls(cfg, kind=kind, rngs=rngs)
    y, cache = layer(x, start, cache)   # x [B, T, D] -> y [B, T, D]

- `start` is the absolute position of x's first token (an int32 scalar, traced under jit);
  token t of x sits at position start + t.
- `cache` is the variant's own immutable pytree from `cls.init_cache(cfg, kind, batch,
  max_len)`, returned updated; `cache=None` means no cache at all: the layer attends causally
  within x alone (start must then be 0). This is the `forward` path the golden test compares
  prefill + decode against.
- `capacity_bound` says whether the cache holds at most `max_len` tokens (full attention) or
  is fixed-size whatever the context (sliding window ring, recurrent state).

Each variant also owns the cost formulas of what it computes (used by `refmodel.costs`):

- `param_counts(cfg, kind) -> {name: elements}` of one layer;
- `cache_bytes(cfg, kind, batch, context, dt) -> bytes` held by one layer's cache after
  `context` tokens;
- `costs(cfg, kind, batch, new, context, dt) -> {op: Cost}` of one layer processing `new`
  tokens per sequence on top of `context` cached ones (prefill: context=0, new=T; decode:
  new=1, context=S). Op names are those of the `jax.named_scope`s in the code.
"""

from __future__ import annotations

from typing import ClassVar

import jax
from flax import nnx

from refmodel.config import ModelConfig
from refmodel.costing import Cost, Dtypes


class AttentionLayer(nnx.Module):
    """Base class documenting the interface; see the module docstring."""

    capacity_bound: ClassVar[bool] = True

    def __call__(self, x: jax.Array, start: jax.Array, cache):
        raise NotImplementedError

    @classmethod
    def init_cache(cls, cfg: ModelConfig, kind: str, batch: int, max_len: int):
        raise NotImplementedError

    @classmethod
    def param_counts(cls, cfg: ModelConfig, kind: str) -> dict[str, int]:
        raise NotImplementedError

    @classmethod
    def cache_bytes(cls, cfg: ModelConfig, kind: str, batch: int, context: int,
                    dt: Dtypes) -> float:
        raise NotImplementedError

    @classmethod
    def costs(cls, cfg: ModelConfig, kind: str, batch: int, new: int, context: int,
              dt: Dtypes) -> dict[str, Cost]:
        raise NotImplementedError
