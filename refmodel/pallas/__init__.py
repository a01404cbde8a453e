"""Pallas kernels: the decode and MoE fast paths written in JAX's own kernel language.

A Pallas kernel is a function over blocks: `pl.pallas_call` runs it once per point of a grid,
each program instance given the blocks of its operands that `BlockSpec`s pick (moved into
the chip's fast memory before it runs, on a GPU or TPU), and the kernel computes on those
blocks with ordinary jnp. On a GPU it lowers through Triton or Mosaic GPU, on a TPU through
Mosaic; on a CPU it runs only in interpret mode (a loop over the grid in XLA), which is how
the tests check it against the plain-jnp oracles. The JAX docs' flash-attention and paged-
attention examples and the megablox grouped matmul are the models.

    decode.py   decode attention over a contiguous KV cache, flash-decoding style
    paged.py    the same over the serving engine's pages, the page ids read from the tables
    paged_tpu.py  the paged kernel as a TPU wants it, the page ids by scalar prefetch
    grouped.py  the grouped matmul of an MoE layer: each expert's rows times its weight
    blocks.py   block sizes per platform, and when to interpret

Each kernel takes `interpret: bool | None = None` (None: interpret on a CPU). Only interpret
mode on a CPU has run them; the GPU and TPU paths are untested on hardware.
`refmodel/backends/pallas.py` puts them behind the model's ops.
"""

from refmodel.pallas.blocks import BLOCKS, block_sizes, interpret_mode, platform
from refmodel.pallas.decode import decode_attention, reference_decode_attention
from refmodel.pallas.grouped import grouped_matmul, reference_grouped_matmul
from refmodel.pallas.paged import paged_attention, reference_paged_attention
from refmodel.pallas.paged_tpu import paged_attention_tpu

__all__ = ["BLOCKS", "block_sizes", "decode_attention", "grouped_matmul", "interpret_mode",
           "paged_attention", "paged_attention_tpu", "platform", "reference_decode_attention",
           "reference_grouped_matmul", "reference_paged_attention"]
