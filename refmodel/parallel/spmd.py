"""A phase of `refmodel.phases` run over a mesh: the same model code on every device.

The batch axes (data, expert) run by hand in `jax.shard_map`: each device gets its rows of
the tokens and of the cache, and the expert weights it holds (a MoE layer then sees fewer
than E experts and sends its pairs by all-to-all, `refmodel.moe.MoE.expert_parallel`). The
"tensor" axis is left to XLA's SPMD partitioner (GSPMD, Xu et al. 2021): the parameters sit
split as the modules' rules say, and XLA inserts the all-reduces Megatron's split implies.
The logits come back whole on every device of a tensor group (an all-gather when the LM
head is split by vocabulary), the cache as its rules say.
"""

from __future__ import annotations

import jax
from flax import nnx
from jax.sharding import NamedSharding, PartitionSpec

from refmodel.parallel.mesh import BATCH, MANUAL, degrees
from refmodel.parallel.rules import cache_specs, manual, param_specs

RETURNS_CACHE = ("prefill", "decode", "decode_attention")


def check_batch(batch: int, mesh) -> None:
    d = degrees(mesh)
    ways = d["data"] * d["expert"]
    if batch % ways:
        raise ValueError(f"batch={batch} does not split over data={d['data']} x expert="
                         f"{d['expert']} = {ways} devices: give a batch that is a multiple of "
                         f"{ways}, or a mesh whose data x expert divides it")


def spmd(name: str, fn, graphdef, mesh):
    """`fn(state, x, *cache)` (a phase with its graphdef bound) as one SPMD program over
    `mesh`; trace-time checks raise ValueError before anything runs."""

    def run(state, x, *cache):
        check_batch(x.shape[0], mesh)
        model = nnx.merge(graphdef, state)
        s_specs = param_specs(model, state, mesh)
        rows = PartitionSpec(BATCH)
        c_specs = cache_specs(model.cfg, cache[0], mesh) if cache else None
        in_specs = (manual(s_specs), rows) + ((manual(c_specs),) if cache else ())
        out_specs = (rows, manual(c_specs)) if name in RETURNS_CACHE else rows
        if cache:  # the cache arrives as its rules say
            cache = (jax.lax.with_sharding_constraint(
                cache[0], jax.tree.map(lambda s: NamedSharding(mesh, s), c_specs)),)
        # check_vma=False: a scan's carry made by jnp.zeros (linear attention's state) is not
        # marked as varying over the batch axes while its update is, and the check refuses it
        out = jax.shard_map(fn, mesh=mesh, in_specs=in_specs, out_specs=out_specs,
                            axis_names=set(MANUAL), check_vma=False)(state, x, *cache)
        whole = NamedSharding(mesh, rows)  # rows split, whole along every other axis
        if name not in RETURNS_CACHE:
            return jax.lax.with_sharding_constraint(out, whole)
        first, new = out
        new = jax.lax.with_sharding_constraint(
            new, jax.tree.map(lambda s: NamedSharding(mesh, s), c_specs))
        return jax.lax.with_sharding_constraint(first, whole), new

    return run
