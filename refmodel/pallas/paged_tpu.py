"""Paged decode attention in the form a TPU wants: the page ids by scalar prefetch. Untested
on TPU hardware; run here only in interpret mode, against the same oracle as `paged.py`.

Mosaic copies each block into VMEM before a program runs (double-buffered: the next block's
copy overlaps this one's compute), so which page a block is must be known to the BlockSpec's
index map, not discovered inside the kernel as `paged.py` does. Scalar prefetch gives the index
maps (and the kernel) the tables and lens, read into SMEM before the grid starts:
`pltpu.PrefetchScalarGridSpec(num_scalar_prefetch=2, ...)` and the index map
`lambda b, h, j, tables, lens: (tables[b, j], h, 0, 0)`. The grid is (B, K, n), its last axis
the table's pages in order: the pipeline fetches page j + 1 while program j computes, and the
online softmax's running max, sum and output live in VMEM scratch across the pages of one
(b, h), written out at the last page. Past lens[b] the index map repeats the row's last
page, which the pipeline then does not copy again, and the kernel skips it. JAX's TPU paged
attention (jax/experimental/pallas/ops/tpu/paged_attention) is the full version: several
pages per step, megacore splits, quantized pages.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from refmodel.pallas.blocks import block_sizes, interpret_mode
from refmodel.pallas.decode import MASKED, online_step, pad_heads


def _kernel(tables_ref, lens_ref, q_ref, k_ref, v_ref, o_ref, m_ref, l_ref, acc_ref, *,
            scale):
    """Program (b, h, j): q_ref [G, H], k_ref and v_ref [page, H] (row b's page j, head h)
    -> o_ref [G, H] at the last j; m_ref, l_ref [G, 1] and acc_ref [G, H] carry the softmax."""
    b, j = pl.program_id(0), pl.program_id(2)
    page = k_ref.shape[0]

    @pl.when(j == 0)
    def _():
        m_ref[...] = jnp.full(m_ref.shape, MASKED, jnp.float32)
        l_ref[...] = jnp.zeros(l_ref.shape, jnp.float32)
        acc_ref[...] = jnp.zeros(acc_ref.shape, jnp.float32)

    @pl.when(j * page < lens_ref[b])  # a page the row sees
    def _():
        q = q_ref[...].astype(jnp.float32) * scale
        valid = j * page + jnp.arange(page) < lens_ref[b]
        m, l, acc = online_step(q, k_ref[...].astype(jnp.float32),
                                v_ref[...].astype(jnp.float32), valid,
                                (m_ref[:, 0], l_ref[:, 0], acc_ref[...]))
        m_ref[...], l_ref[...], acc_ref[...] = m[:, None], l[:, None], acc

    @pl.when(j == pl.num_programs(2) - 1)
    def _():
        o_ref[...] = (acc_ref[...] / l_ref[...]).astype(o_ref.dtype)


@functools.partial(jax.jit, static_argnames=("scale", "interpret"))
def paged_attention_tpu(q, k_pages, v_pages, tables, lens, scale, *, interpret=None):
    """`paged.paged_attention`'s contract (q [B, K, G, H], pages [P, K, page, H], tables int32
    [B, n], lens int32 [B] >= 1 -> [B, K, G, H]), laid out for Mosaic."""
    B, K, G, H = q.shape
    page = k_pages.shape[2]
    n = tables.shape[1]
    qp = pad_heads(q, block_sizes()["min_rows"])
    Gp = qp.shape[2]

    def page_of(b, h, j, tables, lens):  # past the row's last page: that page again
        last = jnp.maximum(pl.cdiv(lens[b], page) - 1, 0)
        return tables[b, jnp.minimum(j, last)], h, 0, 0

    kv = pl.BlockSpec((None, None, page, H), page_of)
    heads = pl.BlockSpec((None, None, Gp, H), lambda b, h, j, tables, lens: (b, h, 0, 0))
    out = pl.pallas_call(
        functools.partial(_kernel, scale=scale),
        grid_spec=pltpu.PrefetchScalarGridSpec(
            num_scalar_prefetch=2, grid=(B, K, n), in_specs=[heads, kv, kv], out_specs=heads,
            scratch_shapes=[pltpu.VMEM((Gp, 1), jnp.float32), pltpu.VMEM((Gp, 1), jnp.float32),
                            pltpu.VMEM((Gp, H), jnp.float32)]),
        out_shape=jax.ShapeDtypeStruct((B, K, Gp, H), q.dtype),
        compiler_params=pltpu.CompilerParams(
            dimension_semantics=("parallel", "parallel", "arbitrary")),
        interpret=interpret_mode(interpret),
        name="paged_attention_tpu",
    )(tables.astype(jnp.int32), lens.astype(jnp.int32), qp, k_pages, v_pages)
    return out[:, :, :G]
