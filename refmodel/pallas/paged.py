"""Decode attention over the serving engine's pages as a Pallas kernel (PagedAttention).

q [B, K, G, H]; k and v pages [P, K, page, H] (every page of the pool, `refmodel.kernels.pages`'s
layout); tables int32 [B, n] (row b's pages, in token order, anywhere in the pool); lens int32
[B] -> [B, K, G, H]. The same flash-decoding kernel as `decode.py`, with one change: the keys
of a row are not one slice of an array but pages found through its table, so the kernel reads
each page id from the table and then that page, one page per step of the online softmax.
Pages past lens[b] are never read; the table's entries there may hold anything in [0, P).

Grid (B, K, splits): program (b, h, s) owns `split_k // page` consecutive entries of row b's
table. Its pages block is the whole pool of head h (a pointer on a GPU, where Triton loads only
the page it indexes; the interpreter copies it, fine at test sizes): the page it needs is
known only once the table is read, inside the kernel. On a TPU a block must be copied into
VMEM before the program runs, so the page id has to be known to the index map: Mosaic's
scalar prefetch hands the table to the index maps, as JAX's TPU paged attention does
(`paged_tpu.py`). This one runs interpreted on a CPU and is meant to lower through Triton on a
GPU (untested on one).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

from refmodel.pallas.blocks import block_sizes, interpret_mode
from refmodel.pallas.decode import (
    MASKED,
    combine,
    online_step,
    pad_heads,
    reference_decode_attention,
    split_outputs,
)


def _kernel(lens_ref, table_ref, q_ref, k_ref, v_ref, acc_ref, m_ref, l_ref, *, scale):
    """Program (b, h, s): table_ref [per] (its pages' ids), q_ref [G, H], k_ref and v_ref
    [P, page, H] (head h's pool), lens_ref [1] -> acc_ref [G, H], m_ref and l_ref [G]."""
    per, page = table_ref.shape[0], k_ref.shape[1]
    seen = lens_ref[0] - pl.program_id(2) * per * page  # keys of this split the row sees
    q = q_ref[...].astype(jnp.float32) * scale

    def step(j, carry):
        at = table_ref[j]  # the page holding this row's tokens j * page ..
        k = k_ref[at].astype(jnp.float32)  # [page, H]
        v = v_ref[at].astype(jnp.float32)
        valid = j * page + jnp.arange(page) < seen
        return online_step(q, k, v, valid, carry)

    G, H = q.shape
    carry = (jnp.full((G,), MASKED, jnp.float32), jnp.zeros((G,), jnp.float32),
             jnp.zeros((G, H), jnp.float32))
    m, l, acc = jax.lax.fori_loop(0, jnp.clip(pl.cdiv(seen, page), 0, per), step, carry)
    acc_ref[...], m_ref[...], l_ref[...] = acc, m, l


@functools.partial(jax.jit, static_argnames=("scale", "interpret", "split_k"))
def paged_attention(q, k_pages, v_pages, tables, lens, scale, *, interpret=None, split_k=None):
    """q [B, K, G, H] over row b's first lens[b] (>= 1) tokens in pages k_pages, v_pages
    [P, K, page, H] listed by tables int32 [B, n] -> [B, K, G, H] in q's dtype."""
    B, K, G, H = q.shape
    P, _, page, _ = k_pages.shape
    n = tables.shape[1]
    cfg = block_sizes(split_k=split_k)
    per = max(1, min(n, cfg["split_k"] // page))  # table entries per program
    splits = -(-n // per)
    tables = tables.astype(jnp.int32)
    if splits * per != n:  # entries past the table: page 0, never read (past lens)
        tables = jnp.pad(tables, ((0, 0), (0, splits * per - n)))
    lens = jnp.minimum(lens.astype(jnp.int32), n * page)  # never past the table
    qp = pad_heads(q, cfg["min_rows"])
    Gp = qp.shape[2]
    pool = pl.BlockSpec((P, None, page, H), lambda b, h, s: (0, h, 0, 0))
    acc, m, l = pl.pallas_call(
        functools.partial(_kernel, scale=scale),
        grid=(B, K, splits),
        in_specs=[pl.BlockSpec((1,), lambda b, h, s: (b,)),  # lens
                  pl.BlockSpec((None, per), lambda b, h, s: (b, s)),  # this split's pages
                  pl.BlockSpec((None, None, Gp, H), lambda b, h, s: (b, h, 0, 0)),  # q
                  pool, pool],
        **split_outputs(B, K, splits, Gp, H),
        interpret=interpret_mode(interpret),
        name="paged_attention",
    )(lens, tables, qp, k_pages, v_pages)
    return combine(acc, m, l, q.dtype)[:, :, :G]


def reference_paged_attention(q, k_pages, v_pages, tables, lens, scale):
    """The oracle: each row's pages gathered into a contiguous cache [B, K, n page, H] by XLA,
    then `reference_decode_attention`."""

    def view(pages):  # [P, K, page, H] -> [B, K, n * page, H]
        x = pages[tables]  # [B, n, K, page, H]
        B, n, K, page, H = x.shape
        return x.transpose(0, 2, 1, 3, 4).reshape(B, K, n * page, H)

    return reference_decode_attention(q, view(k_pages), view(v_pages), lens, scale)
