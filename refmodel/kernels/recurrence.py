"""A linear-attention layer's decode step in the native kernel (`recurrence.cc`): the state
read once and written once, in place.

On the native backend linear layers decode here (`LinearAttention.decode`);
`linear_scan.recurrent` is the reference it is tested against, and what every other call (a
prefill chunk, a speculative chunk's snapshots) runs.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from refmodel.kernels import build


def state_step(state: jax.Array, q: jax.Array, k: jax.Array, v: jax.Array, g: jax.Array,
               beta: jax.Array, delta: bool) -> tuple[jax.Array, jax.Array]:
    """One token per sequence: state [B, N, H, U] (N = K G value heads, the layer's cache as
    it is), q and k [B, K, H], v [B, K, G, U], g and beta [B, K, G] (the decay's log and the
    write's strength), float32 -> (o [B, K, G, U], the state after, written over the state's
    buffer). `delta`: the gated delta rule's v - exp(g) k S; else (Mamba-2) v as it is.

    The state is passed as the cache holds it: reshaped to [B, K, G, H, U] first, XLA copied
    it before the call and again after (a reshape of an operand the call writes in place)."""
    B, N, H, U = state.shape if state.ndim == 4 else (-1,) * 4
    K, G = (v.shape[1], v.shape[2]) if v.ndim == 4 else (-1, -1)
    arrays = {"state": state, "q": q, "k": k, "v": v, "g": g, "beta": beta}
    if (any(a.dtype != jnp.float32 for a in arrays.values()) or N != K * G
            or q.shape != (B, K, H) or k.shape != q.shape or v.shape != (B, K, G, U)
            or g.shape != (B, K, G) or beta.shape != g.shape):
        got = ", ".join(f"{n} {a.dtype}{list(a.shape)}" for n, a in arrays.items())
        raise ValueError(f"state_step: float32 state [B, K G, H, U], q and k [B, K, H], v [B, "
                         f"K, G, U], g and beta [B, K, G]; got {got}")
    build.require()
    out = (jax.ShapeDtypeStruct(v.shape, jnp.float32),
           jax.ShapeDtypeStruct(state.shape, jnp.float32))
    return jax.ffi.ffi_call(build.TARGETS["StateStepF32"], out, vmap_method="sequential",
                            input_output_aliases={0: 1})(
        state, q, k, v, g, beta, delta=np.int64(delta))
