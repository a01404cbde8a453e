"""Absorbed MLA decode in the native kernel (`latent.cc`): the query absorb, the attention over
the cached latents and the output absorb in one call, wkv_b and the cache read where they lie.

On the native backend absorbed MLA layers decode here (one query per sequence);
`MultiHeadLatentAttention.absorbed` is the reference it is tested against, and what every
other call (a prefill chunk, a quantized cache) runs.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from refmodel.kernels import build


def attend_latent(q_nope: jax.Array, q_rope: jax.Array, w: jax.Array, latent: jax.Array,
                  k_rope: jax.Array, lens: jax.Array, scale: float) -> jax.Array:
    """q_nope [B, N, P] and q_rope [B, N, Q] over each sequence's first lens[b] (int32 [B], in
    [1, S]) cached latents [B, S, R] and rope keys [B, S, Q], with wkv_b w [R, N, P + U]
    folded into the query (W_UK = w[..., :P]) and the output (W_UV = w[..., P:]) -> [B, N, U].
    float32 throughout."""
    B, N, P = q_nope.shape
    R = w.shape[0] if w.ndim == 3 else -1
    S = latent.shape[1] if latent.ndim == 3 else -1
    arrays = (q_nope, q_rope, w, latent, k_rope)
    if (any(a.dtype != jnp.float32 or a.ndim != 3 for a in arrays)
            or q_rope.shape[:2] != (B, N) or w.shape[1] != N or w.shape[2] <= P
            or latent.shape != (B, S, R) or k_rope.shape != (B, S, q_rope.shape[2])
            or lens.shape != (B,)):
        got = ", ".join(f"{n} {a.dtype}{list(a.shape)}" for n, a in zip(
            ("q_nope", "q_rope", "w", "latent", "k_rope"), arrays, strict=True))
        raise ValueError(f"attend_latent: float32 q_nope [B, N, P], q_rope [B, N, Q], w [R, N, "
                         f"P + U], latent [B, S, R], k_rope [B, S, Q] and lens [B]; got {got}, "
                         f"lens {list(lens.shape)}")
    build.require()
    out = jax.ShapeDtypeStruct((B, N, w.shape[2] - P), jnp.float32)
    return jax.ffi.ffi_call(build.TARGETS["AttendLatentF32"], out, vmap_method="sequential")(
        q_nope, q_rope, w, latent, k_rope, lens.astype(jnp.int32), scale=np.float32(scale))
