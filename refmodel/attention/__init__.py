"""Attention variants, one file each, sharing the interface documented in `base.py`: a Flax NNX
module built as `cls(cfg, kind=kind, rngs=rngs)` whose call is `y, cache = layer(x, start,
cache)`, an explicit immutable cache pytree from `cls.init_cache(cfg, kind, batch, max_len)`,
and the cost formulas of what it computes.

Each variant registers itself under its kinds (`@register("gqa")`, `refmodel/registry.py`);
importing this package imports every variant below, so adding one is a new file and a line
here. The registry's functions are re-exported: `attention.get("mla")`, `attention.registered()`.
"""

from refmodel.attention import gqa, linear, mla, sliding, sparse  # noqa: F401  (register)
from refmodel.registry import (
    compiler_differences,
    get,
    implementation_only,
    kinds_in,
    label,
    measured_in,
    option_sets,
    register,
    registered,
    validate,
)

__all__ = ["compiler_differences", "get", "implementation_only", "kinds_in", "label",
           "measured_in", "option_sets", "register", "registered", "validate"]
