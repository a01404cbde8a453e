"""Prefill attention in the native kernel (`attend_rows.cc`): T queries per sequence over its
contiguous keys and values, each query seeing a prefix of them.

On the native backend (`refmodel/backends/native.py`: float32, a plain softmax) GQA-family
layers attend here whenever a call holds more than one query (a prefill chunk, a speculative
verify, a forward without a cache); one query per sequence goes to the decode kernel
(`pages.paged_attention`). The reference (`refmodel.attention.common.attend`) is what it is
tested against.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from refmodel.kernels import build


def attend_rows(q: jax.Array, k: jax.Array, v: jax.Array, lens: jax.Array,
                scale: float) -> jax.Array:
    """q [B, T, K, G, H] float32 over k, v [B, K, S, H] float32, query t of sequence b seeing
    the keys at positions < lens[b, t] (int32 [B, T], clipped to [1, S]) -> [B, T, K, G, H]:
    softmax(scale q.k) v per sequence, query and head."""
    B, T, K, G, H = q.shape
    if (q.dtype != jnp.float32 or k.dtype != jnp.float32 or v.dtype != jnp.float32
            or k.ndim != 4 or v.shape != k.shape or k.shape[:2] != (B, K) or k.shape[3] != H
            or lens.shape != (B, T)):
        raise ValueError(f"attend_rows: q float32 [B, T, K, G, H], k and v float32 [B, K, S, "
                         f"H], lens [B, T]; got q {q.dtype}{list(q.shape)}, k {k.dtype}"
                         f"{list(k.shape)}, v {v.dtype}{list(v.shape)}, lens "
                         f"{list(lens.shape)}")
    build.require()
    out = jax.ShapeDtypeStruct(q.shape, jnp.float32)
    return jax.ffi.ffi_call(build.TARGETS["AttendRowsF32"], out, vmap_method="sequential")(
        q, k, v, lens.astype(jnp.int32), scale=np.float32(scale))
