"""Kernels over the serving engine's pages: the gather of a contiguous view, and decode
attention that reads the pages in place.

A paged KV cache keeps each sequence's tokens in fixed-size pages anywhere in one array;
attention wants them in token order. `gather_pages` builds that view: XLA's gather
(`gather_pages_xla`, the reference, and the path on any backend or without a compiler) or
the native kernel (`pages.cc`, rows of memcpy). Both return the same bytes. `PagedKV` skips
the view: a GQA layer handed one at decode writes its new key and value into their pages and
attends with `paged_attention` (`attend.cc`), reading each page where it lies.

XLA:CPU's gather loops over output elements with the index arithmetic per element, well
below the memory's speed; the kernel copies runs of a page at the memory's speed
(`python -m microbench serve` times both). A fused paged attention (vLLM's
PagedAttention) would read the pages inside the attention and write no view at all.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from refmodel.kernels import build


def gather_pages_xla(arr: jax.Array, tables: jax.Array, axis: int) -> jax.Array:
    """arr [P, ...pre, page, ...post] (the pages of a leaf whose token axis is `axis`: pre has
    axis - 1 dims), tables int32 [B, n] -> [B, ...pre, n * page, ...post]. One XLA gather
    with the page's dims placed as the output's own (offset_dims), so the result is the
    variant's layout as written: gathering [B, n, ...page] and moving axes after it made
    XLA:CPU write the view twice (the gather, then a transposing copy)."""
    B, n = tables.shape
    pre = axis - 1
    page = arr.shape[1:]
    offset = tuple(k for k in range(len(page) + 2) if k not in (0, 1 + pre))  # [B, ..., n, ...]
    dims = jax.lax.GatherDimensionNumbers(offset_dims=offset, collapsed_slice_dims=(0,),
                                          start_index_map=(0,))
    x = jax.lax.gather(arr, tables[..., None], dims, (1, *page),
                       mode=jax.lax.GatherScatterMode.PROMISE_IN_BOUNDS)
    return x.reshape(B, *page[:pre], n * page[pre], *page[pre + 1:])


def gather_pages_native(arr: jax.Array, tables: jax.Array, axis: int) -> jax.Array:
    """`gather_pages_xla` in the native kernel (CPU only). A page id outside [0, P) fails
    the call instead of reading out of bounds."""
    B, n = tables.shape
    page = arr.shape[1:]
    if not 1 <= axis <= len(page) or tables.dtype != jnp.int32 or tables.ndim != 2:
        raise ValueError(f"gather_pages: pages [P, ...] with the token axis at 1..{len(page)}"
                         f" and tables int32 [B, n]; got axis={axis}, tables "
                         f"{tables.dtype}{list(tables.shape)}")
    build.require()
    pre = axis - 1
    out = jax.ShapeDtypeStruct((B, *page[:pre], n * page[pre], *page[pre + 1:]), arr.dtype)
    return jax.ffi.ffi_call(build.TARGETS["GatherPagesAny"], out, vmap_method="sequential")(
        arr, tables, runs=math.prod(page[:pre]))


def gather_pages(arr: jax.Array, tables: jax.Array, axis: int, native: bool) -> jax.Array:
    """The view, by the native kernel where the step runs on a CPU and `native` is set, else
    by XLA's gather (lowered per platform: one function serves CPU and accelerators)."""
    if not native:
        return gather_pages_xla(arr, tables, axis)
    return jax.lax.platform_dependent(
        arr, tables, cpu=lambda a, t: gather_pages_native(a, t, axis),
        default=lambda a, t: gather_pages_xla(a, t, axis))


def paged_attention(q: jax.Array, k: jax.Array, v: jax.Array, tables: jax.Array,
                    lens: jax.Array, scale: float) -> jax.Array:
    """Decode attention over pages, in the native kernel: q [B, K, G, H] float32, k and v
    pages [P, K, page, H], tables int32 [B, n], lens int32 [B] (keys at positions < lens[b]
    are seen) -> [B, K, G, H]. softmax(scale q.k) v per sequence and head, float32."""
    B, K, G, H = q.shape
    if (q.dtype != jnp.float32 or k.dtype != jnp.float32 or v.shape != k.shape or k.ndim != 4
            or k.shape[1] != K or k.shape[3] != H or tables.shape[0] != B
            or lens.shape != (B,)):
        raise ValueError(f"paged_attention: q float32 [B, K, G, H], k and v float32 pages "
                         f"[P, K, page, H], tables [B, n], lens [B]; got q {q.dtype}"
                         f"{list(q.shape)}, k {k.dtype}{list(k.shape)}, v {list(v.shape)}, "
                         f"tables {list(tables.shape)}, lens {list(lens.shape)}")
    build.require()
    out = jax.ShapeDtypeStruct(q.shape, jnp.float32)
    return jax.ffi.ffi_call(build.TARGETS["PagedAttentionF32"], out, vmap_method="sequential")(
        q, k, v, tables.astype(jnp.int32), lens.astype(jnp.int32), scale=np.float32(scale))


@struct.dataclass
class PagedKV:
    """One GQA layer's keys and values in the serving engine's pages, for a decode step that
    reads them in place: k, v [P, K, page, H] (every page of the pool), tables int32 [B, n]
    (each row's pages). The engine hands it to layers that `backends.reads_pages` in place of
    the contiguous cache; the layer's ops (`refmodel/backends/native.py`) write the step's key
    and value into it and attend over it."""

    k: jax.Array  # [P, K, page, H]
    v: jax.Array  # [P, K, page, H]
    tables: jax.Array  # [B, n]
    kernel: str = struct.field(pytree_node=False, default="native")  # or "pallas": who reads

    def write(self, k: jax.Array, v: jax.Array, start: jax.Array) -> PagedKV:
        """The step's one key and value per row, k and v [B, K, 1, H], at position start [B]
        (a padding row's table is the scratch page's)."""
        ps = self.k.shape[2]
        i = jnp.clip(start // ps, 0, self.tables.shape[1] - 1)[:, None]
        page = jnp.take_along_axis(self.tables, i, axis=1)[:, 0]  # [B]
        at = (page, slice(None), start % ps)  # -> [B, K, H]
        return self.replace(k=self.k.at[at].set(k[:, :, 0].astype(self.k.dtype)),
                            v=self.v.at[at].set(v[:, :, 0].astype(self.v.dtype)))

    def attend(self, q: jax.Array, scale: float, lens: jax.Array) -> jax.Array:
        """q [B, 1, K, G, H] over each row's first lens [B] tokens -> [B, 1, K, G, H], in the
        native kernel (the Pallas one is `refmodel.backends.pallas.gqa_attend_pages`)."""
        return paged_attention(q[:, 0], self.k, self.v, self.tables, lens, scale)[:, None]
