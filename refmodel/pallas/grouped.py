"""A grouped matmul as a Pallas kernel: each expert's rows times that expert's weight.

x [M, D] holds rows sorted by group (an MoE layer's token-expert pairs sorted by expert),
sizes int32 [E] how many rows each group has, w [E, D, F] one matrix per group -> [M, F]: row r
of group e is x[r] @ w[e]; rows past sum(sizes) are zero. What `moe.grouped` computes, and what
`jax.lax.ragged_dot` names (`reference_grouped_matmul` below).

The grid is (row tiles, column tiles). Groups are ragged, so a tile of `block_rows` rows may
hold the end of one group and the start of the next: program (i, j) loops over the groups that
overlap row tile i (from `first[i]` to `last[i]`, found before the call from the groups' row
offsets) and keeps, for each, the product on that group's rows only. An empty group overlaps
no tile, so its weight is never read; a group's weight is read once per tile it touches. This
is the layout of JAX's megablox `gmm` (after MegaBlocks, Gale et al. 2022) with a tile's visits
made a loop inside one program rather than steps of the grid: work is the row tiles plus at
most one more tile product per group. Each product is summed over D in slices of
`block_depth`, so a program holds a [tm, block_depth] and a [block_depth, tf] slice at a time
(on a GPU, registers and shared memory) whatever the model's width.

On a TPU the group id would go to the weight's index map by scalar prefetch (JAX's megablox
`gmm`); here the weight's block holds every group's columns j and the kernel indexes it, which
a GPU does through pointers (untested on one) and the interpreter by copying (test sizes).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

from refmodel.pallas.blocks import block_sizes, interpret_mode, round_up


def _kernel(first_ref, last_ref, groups_ref, starts_ref, ends_ref, x_ref, w_ref, o_ref, *,
            block_depth):
    """Program (i, j): x_ref [tm, D] (row tile i), w_ref [E, D, tf] (columns j of every group);
    groups_ref [E] (the groups with rows, in row order, then the empty ones), starts_ref and
    ends_ref [E] (their rows), first_ref and last_ref [1] (which of them overlap tile i)
    -> o_ref [tm, tf]."""
    tm, D = x_ref.shape
    rows = pl.program_id(0) * tm + jnp.arange(tm)  # [tm] row ids of this tile

    def group(n, out):
        g = groups_ref[n]

        def depth(d, y):  # D in slices of block_depth: a tile's operands stay small
            at = pl.ds(d * block_depth, block_depth)
            return y + jnp.dot(x_ref[:, at], w_ref[g, at, :], preferred_element_type=jnp.float32)

        y = jax.lax.fori_loop(0, D // block_depth, depth, jnp.zeros(out.shape, jnp.float32))
        mine = (rows >= starts_ref[n]) & (rows < ends_ref[n])
        return jnp.where(mine[:, None], y, out)

    out = jnp.zeros(o_ref.shape, jnp.float32)  # rows of no group stay zero
    o_ref[...] = jax.lax.fori_loop(first_ref[0], last_ref[0] + 1, group, out).astype(o_ref.dtype)


def tile_groups(sizes, tiles, tm):
    """Which groups each row tile runs: (groups [E], the groups with rows in row order, then
    the empty ones; starts, ends [E], their first and past-last rows (the empty ones' both
    sum(sizes)); first, last [tiles], the range of `groups` overlapping each tile (last <
    first: none)). An empty group is in no tile's range: its weight is never read."""
    ends = jnp.cumsum(sizes).astype(jnp.int32)
    total = ends[-1]
    groups = jnp.argsort(sizes == 0, stable=True).astype(jnp.int32)  # non-empty first
    live = sizes[groups] > 0
    ends = jnp.where(live, ends[groups], total)
    starts = jnp.where(live, ends - sizes[groups], total)  # both sorted, as searchsorted wants
    lo = jnp.arange(tiles, dtype=jnp.int32) * tm
    first = jnp.searchsorted(ends, lo, side="right").astype(jnp.int32)  # first ending past lo
    last = jnp.searchsorted(starts, jnp.minimum(lo + tm, total), side="left") - 1
    return groups, starts, ends, first, last.astype(jnp.int32)


@functools.partial(jax.jit, static_argnames=("interpret", "block_rows", "block_cols",
                                             "block_depth"))
def grouped_matmul(x, w, sizes, *, interpret=None, block_rows=None, block_cols=None,
                   block_depth=None):
    """x [M, D] rows sorted by group, w [E, D, F], sizes int32 [E] (sum <= M) -> [M, F] in x's
    dtype, accumulated in float32; rows past sum(sizes) are zero."""
    M, D = x.shape
    E, _, F = w.shape
    cfg = block_sizes(block_rows=block_rows, block_cols=block_cols, block_depth=block_depth)
    tm = min(cfg["block_rows"], round_up(M, 8))
    tf = cfg["block_cols"] if F % cfg["block_cols"] == 0 else F
    td = cfg["block_depth"] if D % cfg["block_depth"] == 0 else D
    tiles = -(-M // tm)
    xp = jnp.pad(x, ((0, tiles * tm - M), (0, 0))) if tiles * tm != M else x
    groups, starts, ends, first, last = tile_groups(sizes.astype(jnp.int32), tiles, tm)
    one = pl.BlockSpec((1,), lambda i, j: (i,))
    every = pl.BlockSpec((E,), lambda i, j: (0,))
    out = pl.pallas_call(
        functools.partial(_kernel, block_depth=td),
        grid=(tiles, F // tf),
        in_specs=[one, one, every, every, every,
                  pl.BlockSpec((tm, D), lambda i, j: (i, 0)),
                  pl.BlockSpec((E, D, tf), lambda i, j: (0, 0, j))],
        out_specs=pl.BlockSpec((tm, tf), lambda i, j: (i, j)),
        out_shape=jax.ShapeDtypeStruct((tiles * tm, F), x.dtype),
        interpret=interpret_mode(interpret),
        name="grouped_matmul",
    )(first, last, groups, starts, ends, xp, w)
    return out[:M]


def reference_grouped_matmul(x, w, sizes):
    """The oracle: every row times every group's weight, each row keeping its own group's
    (rows past sum(sizes) zero), in float32."""
    ends = jnp.cumsum(sizes)
    group = jnp.searchsorted(ends, jnp.arange(x.shape[0]), side="right")  # [M]; E: no group
    every = jnp.einsum("MD,EDF->MEF", x.astype(jnp.float32), w.astype(jnp.float32))
    mine = jax.nn.one_hot(group, w.shape[0], dtype=jnp.float32)  # [M, E], zero past the end
    return jnp.einsum("MEF,ME->MF", every, mine).astype(x.dtype)
