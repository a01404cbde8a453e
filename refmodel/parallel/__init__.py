"""Many devices: data, tensor and expert parallelism on `jax.sharding`, communication counted.

    mesh = parallel.make_mesh(data=2, tensor=2, expert=2)   # 8 devices
    sharded = parallel.shard(model, mesh)                   # the same model, split
    logits = refmodel.forward(sharded, tokens)              # every API call runs as one
    cache = parallel.init_cache(sharded, batch, max_len)    # SPMD program over the mesh

Each module declares how its parameters split (`sharding`), each attention variant how its
cache splits (`cache_sharding`); `rules` applies them, `spmd` runs a phase over the mesh
(batch axes by hand in shard_map, the tensor axis by XLA's partitioner), `comms` counts the
collectives each phase needs and their time on a link, `hlo` reads the collectives XLA
actually inserted so the two can be checked against each other (as `refmodel.compiler_check`
does for FLOPs). On a CPU, emulate devices with `jax.config.update("jax_num_cpu_devices", 8)`
before JAX starts; on a GPU node, a TPU slice or several hosts (after
`jax.distributed.initialize()`) the same calls use the devices `jax.devices()` lists.
"""

from __future__ import annotations

from flax import nnx

from refmodel import attention
from refmodel.model import Transformer
from refmodel.model import init_cache as empty_cache
from refmodel.parallel import comms, hlo
from refmodel.parallel.mesh import AXES, BATCH, batch_ways, degrees, make_mesh
from refmodel.parallel.rules import cache_specs, param_specs, place
from refmodel.parallel.spmd import check_batch

__all__ = ["AXES", "BATCH", "batch_ways", "comms", "degrees", "hlo", "init_cache",
           "make_mesh", "shard", "shard_cache"]


def shard(model, mesh):
    """A copy of `model` whose parameters sit on `mesh` as their modules' rules say (the
    original is left as it was); refmodel's API calls on it run over the mesh. A degree that
    does not divide what it splits raises a ValueError naming the axis and the field."""
    if not isinstance(model, Transformer):
        raise TypeError(f"shard takes a refmodel Transformer, got {type(model).__name__}")
    if model.cfg.backend not in ("reference", "xla"):  # the rules name declared weight axes
        raise ValueError(f"shard takes backend='xla' or 'reference' models; this one has "
                         f"backend={model.cfg.backend!r} (weights stored for one device's "
                         "kernels); shard the backend='xla' model")
    degrees(mesh)
    graphdef, state = nnx.split(model)
    for kind in dict.fromkeys(model.cfg.layer_kinds):  # the caches' rules, checked up front
        if kind != "none":
            attention.get(kind).cache_sharding(model.cfg, kind, degrees(mesh))
    state = place(state, param_specs(model, state, mesh), mesh)
    out = nnx.merge(graphdef, state)
    out.mesh = mesh
    return out


def shard_cache(cfg, cache, mesh):
    """`cache` (from refmodel.init_cache) placed on `mesh` as the variants' rules say."""
    check_batch(cache.pos.shape[0], mesh)
    return place(cache, cache_specs(cfg, cache, mesh), mesh)


def init_cache(model, batch: int, max_len: int):
    """An empty cache for a sharded model, already split over its mesh."""
    if model.mesh is None:
        return empty_cache(model.cfg, batch, max_len)
    return shard_cache(model.cfg, empty_cache(model.cfg, batch, max_len), model.mesh)
