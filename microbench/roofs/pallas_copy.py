"""A copy written in Pallas: the device-memory peer that is not XLA's own code generation.

The kernel is the smallest Pallas program there is: a 1-D grid over row blocks of a
[rows, cols] array; each program instance gets one block of the input and of the output in
fast memory (BlockSpec) and copies it. Pallas (Triton or Mosaic GPU on a GPU, Mosaic on a TPU)
moves the blocks between HBM and on-chip memory; what it reaches beside XLA's own copy says
whether the compiler's copy is the memory's roof. On a CPU it runs in interpret mode (the
kernel's logic, not its speed: the forced path's check that it still runs).

Block shapes by platform (chosen, not tuned; a block is `rows x cols` float32 elements):
GPU 8 x 1024 (32 KiB: one Triton program's registers stay small, many programs in flight);
TPU 512 x 1024 (2 MiB: in and out double-buffered, 8 MiB of the 16 MiB default VMEM, the
(8, 128) tile respected); CPU 64 x 1024 (interpret mode pays for every grid step: few,
large blocks).
"""

from __future__ import annotations

import functools

import jax
from jax.experimental import pallas as pl

BLOCKS = {"gpu": (8, 1024), "tpu": (512, 1024), "cpu": (64, 1024)}


def block_for(target: str, backend: str) -> tuple[int, int]:
    """The block of the path's platform; on the CPU backend (forced or not) the CPU's."""
    return BLOCKS["cpu" if backend == "cpu" else target]


def _copy_kernel(x_ref, o_ref):
    o_ref[...] = x_ref[...]


@functools.partial(jax.jit, static_argnames=("block", "interpret"))
def pallas_copy(x, block: tuple[int, int], interpret: bool = False):
    """x [rows, cols] -> a copy; rows and cols must be multiples of the block's."""
    rows, cols = x.shape
    if rows % block[0] or cols != block[1]:
        raise ValueError(f"pallas_copy: shape {x.shape} must be [k x {block[0]}, {block[1]}] "
                         f"for block {block}")
    spec = pl.BlockSpec(block, lambda i: (i, 0))
    return pl.pallas_call(_copy_kernel, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
                          grid=(rows // block[0],), in_specs=[spec], out_specs=spec,
                          interpret=interpret)(x)


def shape_for(n_bytes: int, block: tuple[int, int], itemsize: int = 4) -> tuple[int, int]:
    """The [rows, cols] array of about n_bytes (at least one block) that the block tiles."""
    rows = max(1, n_bytes // (itemsize * block[1] * block[0])) * block[0]
    return rows, block[1]
