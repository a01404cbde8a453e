"""Attention variants: a registry keyed by `ModelConfig.attention` (or a `layer_pattern` entry).

Every variant lives in its own file in this package and shares one interface, documented in
`base.py`: a Flax NNX module built as `cls(cfg, kind=kind, rngs=rngs)` whose call is
`y, cache = layer(x, start, cache)`, an explicit immutable cache pytree from
`cls.init_cache(cfg, kind, batch, max_len)`, and the cost formulas of what it computes.

Variants register themselves with `@register("name")`; every module of this package is imported
below, so a new file is all it takes to add one.
"""

from __future__ import annotations

import importlib
import pkgutil

_REGISTRY: dict[str, type] = {}


def register(*kinds: str):
    """Class decorator: make the variant available under each of `kinds`."""

    def wrap(cls):
        for kind in kinds:
            if kind in _REGISTRY:
                raise ValueError(f"attention kind {kind!r} is registered twice")
            _REGISTRY[kind] = cls
        return cls

    return wrap


def registered() -> tuple[str, ...]:
    """Names of every registered attention kind."""
    return tuple(_REGISTRY)


def get(kind: str) -> type:
    """The variant class registered under `kind`; an unknown kind lists the valid ones."""
    try:
        return _REGISTRY[kind]
    except KeyError:
        raise ValueError(
            f"attention={kind!r} is not a registered kind; choose one of {sorted(_REGISTRY)}"
        ) from None


for _m in pkgutil.iter_modules(__path__):
    if _m.name not in ("base", "common"):
        importlib.import_module(f"{__name__}.{_m.name}")
