"""The device mesh: three named axes, data x tensor x expert.

- "data": replicas; each holds the whole model and its own sequences.
- "tensor": Megatron tensor parallelism (Shoeybi et al. 2019): each layer's heads and FFN
  width split, one all-reduce of the activations after each attention and each FFN block.
- "expert": expert parallelism (GShard, Lepikhin et al. 2020): a MoE layer's experts split,
  (token, expert) pairs sent to their expert's device and back by all-to-all. Outside the
  MoE layers the expert axis is one more data axis (DeepSeek-V3's data-parallel attention),
  so the batch splits over data x expert (`BATCH`).

`make_mesh(data, tensor, expert)` takes the first data x tensor x expert devices JAX has: the
same code runs on one CPU, on CPU devices emulated by `jax.config.update(
"jax_num_cpu_devices", 8)` (set before JAX starts), on a GPU node or a TPU slice, and across
hosts after `jax.distributed.initialize()` (`jax.devices()` then lists every host's).
"""

from __future__ import annotations

import math

import jax
import numpy as np
from jax.sharding import AxisType, Mesh

AXES = ("data", "tensor", "expert")
BATCH = ("data", "expert")  # the axes a batch splits over
MANUAL = frozenset(BATCH)  # run by hand (shard_map); "tensor" is left to XLA's partitioner


def make_mesh(data: int = 1, tensor: int = 1, expert: int = 1, devices=None) -> Mesh:
    """A data x tensor x expert mesh over the first data * tensor * expert of `devices`
    (default: jax.devices())."""
    sizes = {"data": data, "tensor": tensor, "expert": expert}
    for axis, n in sizes.items():
        if not isinstance(n, int) or isinstance(n, bool) or n < 1:
            raise ValueError(f"{axis}={n!r}: a mesh axis size must be a positive integer")
    devices = list(jax.devices() if devices is None else devices)
    need = math.prod(sizes.values())
    if need > len(devices):
        raise ValueError(f"data={data} x tensor={tensor} x expert={expert} = {need} devices, "
                         f"but {len(devices)} are available; on a CPU emulate more with "
                         f"jax.config.update('jax_num_cpu_devices', {need}) before JAX starts")
    grid = np.array(devices[:need], dtype=object).reshape(data, tensor, expert)
    return Mesh(grid, AXES, axis_types=(AxisType.Auto,) * len(AXES))


def degrees(mesh: Mesh) -> dict[str, int]:
    """{axis: size} of a mesh made by `make_mesh` (checked)."""
    if not isinstance(mesh, Mesh) or tuple(mesh.axis_names) != AXES:
        got = getattr(mesh, "axis_names", type(mesh).__name__)
        raise ValueError(f"mesh with axes {got!r}: make it with refmodel.parallel.make_mesh "
                         f"(axes {AXES})")
    return dict(mesh.shape)


def batch_ways(mesh: Mesh) -> int:
    """How many ways a batch splits (data x expert)."""
    d = degrees(mesh)
    return d["data"] * d["expert"]
