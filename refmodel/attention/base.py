"""The one interface every attention variant implements.

A variant is a Flax NNX module registered under one or more kinds (`@register("gqa")`):

    layer = cls(cfg, kind=kind, rngs=rngs)
    y, cache = layer(x, start, cache)   # x [B, T, D] -> y [B, T, D]

- `start` is the absolute position of x's first token, traced under jit: an int32 scalar
  shared by the batch, or int32 [B], one per sequence (continuous batching: rows at their own
  positions); token t of row b sits at position start + t (start[b] + t). Every row takes the
  same T tokens per call. A scalar keeps the plain path (one slice write, masks [T, S] over a
  full cache); a [B] start writes each row's cache at its own offset and masks per row
  ([B, T, S]), as the sliding ring always does (its slots' positions are per row, [B, W]).
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

and everything else that is particular to it, so nothing outside its file names its kind:

- `validate(cfg, kind)` checks the config fields it reads (raising `ValueError` that names the
  field, the value and what is allowed); `ModelConfig` calls it for every kind in use;
- `option_sets(kind) -> {label: config changes}`: the named option sets whose code paths
  differ (MLA: naive / absorbed; linear: gated_delta / mamba2), which the golden test, the
  compiler cross-check and the sweeps all cover; `MEASURE` says which of them the quick and
  context sweeps of `microbench` measure;
- `label(cfg, kind)`: the short name of a config's option set, for legends;
- `compiler_differences(cfg, kind, phase, batch, context, native_solve)`: FLOPs XLA's cost
  analysis counts that the formulas leave out by design, by reason (default: none).

and how it splits over devices (`refmodel.parallel`; every name is a mesh axis or None):

- `layer.sharding(mesh_shape) -> {parameter: axis per dimension}`: the parameters split over
  the "tensor" axis (Megatron: heads split, column-parallel in, row-parallel out); a name not
  listed is replicated (default: all of them, which is correct, only not split). It raises a
  ValueError naming the field when the tensor degree does not divide what it splits;
- `cache_sharding(cfg, kind, mesh_shape) -> {cache field: axis per dimension}`: "batch" on
  the batch axis (the data and expert axes together), a head axis on "tensor" (default:
  every field split by batch only);
- `tensor_config(cfg, kind, tensor) -> config changes | None`: one device's share of a layer
  for the cost model (`refmodel.parallel.comms`), as an engine splits it; None: not split.

and how its cache takes back tokens (speculative decoding, `refmodel/speculative.py`):

- `y, cache, snaps = layer.verify(x, start, cache)`: the call, plus whatever the variant must
  keep per position of the chunk to roll back to any of them (default: nothing, None);
- `rollback_limit(cfg, kind)`: the longest chunk it can undo (default None: any);
- `rollback(cfg, kind, before, after, snaps, keep, pos)`: the cache as if only the first
  `keep` [B] tokens of the chunk had been seen (`pos` [B] = the rows' positions then). The
  default returns `after` as it is: a cache indexed by position (full attention, MLA's
  latent, the sparse indexer's keys) masks every key past a query's position, and the next
  chunk overwrites the rejected positions before any query can see them.
"""

from __future__ import annotations

from typing import ClassVar

import jax
from flax import nnx

from refmodel.config import ModelConfig
from refmodel.counting import BYTES, FLOATS, Cost, Dtypes


def float_cache_size(cfg: ModelConfig, dt: Dtypes) -> float:
    """Bytes per element of a cache kept in a float whatever cfg.kv_format (the linear
    layer's conv window, the sparse indexer's keys): the kv dtype counted in if it is a
    float, else (a quantized format, which such a cache does not take) cfg.dtype."""
    return dt.kv_size if dt.kv in FLOATS else BYTES[cfg.dtype]


class AttentionLayer(nnx.Module):
    """Base class documenting the interface; see the module docstring."""

    capacity_bound: ClassVar[bool] = True
    # {option-set label: sweeps of `microbench.phases.sweeps` that measure it besides the full
    # roofline sweep: "context" (full run), "quick" and "quick context" (`--quick`)}
    MEASURE: ClassVar[dict[str, tuple[str, ...]]] = {}
    # Ops of `costs` that only this implementation executes, which an engine built for the
    # variant would not (`refmodel.costs.phase_costs(..., count="engine")` leaves them out).
    IMPLEMENTATION_ONLY: ClassVar[tuple[str, ...]] = ()

    @classmethod
    def validate(cls, cfg: ModelConfig, kind: str) -> None:
        """Raise ValueError for a config field this variant cannot run with."""

    @classmethod
    def option_sets(cls, kind: str) -> dict[str, dict]:
        """{label: config changes} of the option sets with their own code paths."""
        return {kind: {"attention": kind}}

    @classmethod
    def label(cls, cfg: ModelConfig, kind: str) -> str:
        """The label of the option set `cfg` runs (a key of `option_sets(kind)`)."""
        return kind

    @classmethod
    def compiler_differences(cls, cfg: ModelConfig, kind: str, phase: str, batch: int,
                             context: int, native_solve: bool = False) -> dict[str, float]:
        """{reason: FLOPs} one layer's compiled code counts beyond `costs` (negative: fewer)."""
        return {}

    def sharding(self, mesh_shape: dict) -> dict[str, tuple]:
        """{parameter: mesh axis per dimension}; unlisted parameters are replicated."""
        return {}

    @classmethod
    def tensor_config(cls, cfg: ModelConfig, kind: str, tensor: int) -> dict | None:
        """The config changes that make one layer's share on one of `tensor` devices (its
        costs are then this variant's `costs` under them, and the layer ends in one all-reduce
        of the activations), or None: the layer is not split, every device runs all of it."""
        return None

    @classmethod
    def cache_sharding(cls, cfg: ModelConfig, kind: str, mesh_shape: dict) -> dict[str, tuple]:
        """{cache field: mesh axis per dimension}; unlisted fields: batch only."""
        return {}

    def __call__(self, x: jax.Array, start: jax.Array, cache):
        raise NotImplementedError

    def verify(self, x: jax.Array, start: jax.Array, cache):
        """The call, plus the per-position snapshots `rollback` needs (default: None)."""
        y, cache = self(x, start, cache)
        return y, cache, None

    @classmethod
    def rollback_limit(cls, cfg: ModelConfig, kind: str) -> int | None:
        """The longest chunk `rollback` can undo (None: any)."""
        return None

    @classmethod
    def rollback(cls, cfg: ModelConfig, kind: str, before, after, snaps, keep: jax.Array,
                 pos: jax.Array):
        """The cache after only the first keep [B] tokens of a chunk (see the module doc)."""
        return after

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
