"""Sharding rules: each module declares its own, this module only applies them.

A module's `sharding(mesh_shape) -> {parameter: axis per dimension}` names, for each
parameter it wants split, a mesh axis (or None) per dimension (`refmodel.layers.DenseFFN`,
the attention variants, `refmodel.moe.MoE`, the LM head in `refmodel.model`); an attention
variant's `cache_sharding(cfg, kind, mesh_shape)` does the same for its cache, with "batch"
standing for the batch axes (data x expert). Anything not named is replicated: correct, only
not split. Nothing here names a variant.

A quantized weight (`refmodel.quant.Quantized`: q [*lead, N, K] output-major, its scales
[*lead, N(, groups)]) takes its float weight's rule, the input and output axes swapped. A
dimension a mesh axis does not divide evenly is kept whole.
"""

from __future__ import annotations

import dataclasses
import math

import jax
from flax import nnx
from jax.sharding import NamedSharding, PartitionSpec

from refmodel import attention
from refmodel.parallel.mesh import BATCH, MANUAL, degrees
from refmodel.quant import QuantCache, Quantized


def _name(key) -> str:
    for attr in ("key", "idx", "name"):
        if hasattr(key, attr):
            return str(getattr(key, attr))
    return str(key)


def _axis(ax):
    return BATCH if ax == "batch" else ax


def _fit(spec: tuple, shape: tuple, mesh_shape: dict) -> PartitionSpec:
    """spec padded to the array's rank, each axis kept only where it divides the dimension."""
    spec = tuple(_axis(a) for a in spec)[:len(shape)]
    spec = spec + (None,) * (len(shape) - len(spec))
    out = []
    for ax, n in zip(spec, shape, strict=True):
        size = 1 if ax is None else math.prod(mesh_shape[a] for a in _tuple(ax))
        out.append(ax if ax is not None and n % size == 0 else None)
    return PartitionSpec(*out)


def _tuple(ax) -> tuple:
    return ax if isinstance(ax, tuple) else (ax,)


def _group(axes: tuple):
    """One mesh axis for dimensions flattened together: the outermost's, if only it is split."""
    if not axes or all(a is None for a in axes):
        return None
    return axes[0] if all(a is None for a in axes[1:]) else None


def _quantized_spec(spec: tuple, w: Quantized, field: str) -> tuple:
    spec = tuple(spec) + (None,) * (len(w.shape) - len(spec))
    lead, cut = spec[:w.lead], w.lead + w.contract
    k_ax, n_ax = _group(spec[w.lead:cut]), _group(spec[cut:])
    return lead + ((n_ax, k_ax) if field == "q" else (n_ax, None))


def module_rules(model: nnx.Module, mesh_shape: dict) -> dict[tuple[str, ...], tuple]:
    """{parameter path: the rule its module declares} over the whole model."""
    rules = {}
    for path, node in nnx.iter_graph(model):
        if isinstance(node, nnx.Module) and hasattr(node, "sharding"):
            for attr, spec in node.sharding(mesh_shape).items():
                rules[tuple(map(str, path)) + (attr,)] = spec
    return rules


def param_specs(model: nnx.Module, state, mesh) -> object:
    """A PartitionSpec per leaf of `state` (the model's nnx.State), from the modules' rules."""
    mesh_shape = degrees(mesh)
    rules = module_rules(model, mesh_shape)

    def spec(path, leaf):
        keys = [_name(k) for k in path]
        cut = keys.index("value") if "value" in keys else len(keys)
        rule = rules.get(tuple(keys[:cut]))
        if rule is None:
            return PartitionSpec()
        owner = _get(model, keys[:cut])
        if isinstance(owner, Quantized):
            rule = _quantized_spec(rule, owner, keys[cut + 1])
        return _fit(rule, leaf.shape, mesh_shape)

    return jax.tree_util.tree_map_with_path(spec, state)


def _get(model, keys):
    node = model
    for k in keys:
        node = node[int(k)] if isinstance(node, (list, nnx.List)) else getattr(node, k)
    return node[...] if isinstance(node, nnx.Variable) else node


def cache_specs(cfg, cache, mesh) -> object:
    """A PartitionSpec per leaf of a `refmodel.model.Cache`, from the variants' rules."""
    mesh_shape = degrees(mesh)
    layers = []
    for kind, layer in zip(cfg.layer_kinds, cache.layers, strict=True):
        if layer is None:
            layers.append(None)
            continue
        rules = attention.get(kind).cache_sharding(cfg, kind, mesh_shape)
        specs = {}
        for f in dataclasses.fields(layer):
            value, rule = getattr(layer, f.name), rules.get(f.name, ("batch",))
            if isinstance(value, QuantCache):  # the scale lacks the vector's last axis
                specs[f.name] = QuantCache(q=_fit(rule, value.q.shape, mesh_shape),
                                           scale=_fit(rule, value.scale.shape, mesh_shape))
            else:
                specs[f.name] = _fit(rule, value.shape, mesh_shape)
        layers.append(layer.replace(**specs))
    return cache.replace(layers=tuple(layers), pos=_fit(("batch",), cache.pos.shape, mesh_shape))


def manual(specs):
    """Only the axes shard_map runs by hand (data, expert); "tensor" is left to XLA."""
    def keep(spec: PartitionSpec) -> PartitionSpec:
        out = []
        for ax in spec:
            axes = tuple(a for a in _tuple(ax) if a in MANUAL) if ax is not None else ()
            out.append(None if not axes else axes if len(axes) > 1 else axes[0])
        return PartitionSpec(*out)
    return jax.tree.map(keep, specs, is_leaf=lambda x: isinstance(x, PartitionSpec))


def place(tree, specs, mesh):
    """Put every array of `tree` on the mesh as its spec says."""
    return jax.tree.map(lambda a, s: jax.device_put(a, NamedSharding(mesh, s)), tree, specs)
