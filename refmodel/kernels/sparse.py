"""Sparse attention in the native kernel (`sparse.cc`): the lightning indexer's scores, the
top-k selection and the attention over the picked keys in one call, the keys and values read
in place (no gathered copy of the picked ones per query).

On the native backend sparse layers attend here, at decode and in a prefill chunk;
`SparseAttention.index_scores`, `select` and `sparse_core` are the reference it is tested
against, and what every other case (a quantized cache, sinks or a soft-cap) runs.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from refmodel.kernels import build


def sparse_attend(q: jax.Array, k: jax.Array, v: jax.Array, q_idx: jax.Array, w_idx: jax.Array,
                  k_idx: jax.Array, lens: jax.Array, top_k: int, scale: float) -> jax.Array:
    """q [B, T, K, G, H], query t of sequence b over the top_k of the keys it sees (positions
    < lens[b, t], int32 [B, T] in [1, S]) of k, v [B, K, S, H], ranked by the indexer (q_idx
    [B, T, I, J], w_idx [B, T, I], k_idx [B, S, J]: sum_i w_idx[i] relu(q_idx[i] . k_idx[s]);
    equal scores to the earlier key) -> [B, T, K, G, H]: softmax(scale q.k) v over the picks.
    float32 throughout."""
    B, T, K, G, H = q.shape
    arrays = {"q": q, "k": k, "v": v, "q_idx": q_idx, "w_idx": w_idx, "k_idx": k_idx}
    S = k.shape[2] if k.ndim == 4 else -1
    I, J = q_idx.shape[2:] if q_idx.ndim == 4 else (-1, -1)
    if (any(a.dtype != jnp.float32 for a in arrays.values()) or k.shape != (B, K, S, H)
            or v.shape != k.shape or q_idx.shape != (B, T, I, J) or w_idx.shape != (B, T, I)
            or k_idx.shape != (B, S, J) or lens.shape != (B, T) or top_k < 1):
        got = ", ".join(f"{n} {a.dtype}{list(a.shape)}" for n, a in arrays.items())
        raise ValueError(f"sparse_attend: float32 q [B, T, K, G, H], k and v [B, K, S, H], "
                         f"q_idx [B, T, I, J], w_idx [B, T, I], k_idx [B, S, J], lens [B, T] "
                         f"and top_k >= 1; got {got}, lens {list(lens.shape)}, top_k={top_k}")
    build.require()
    out = jax.ShapeDtypeStruct(q.shape, jnp.float32)
    return jax.ffi.ffi_call(build.TARGETS["SparseAttendF32"], out, vmap_method="sequential")(
        q, k, v, q_idx, w_idx, k_idx, lens.astype(jnp.int32), top_k=np.int64(top_k),
        scale=np.float32(scale))
