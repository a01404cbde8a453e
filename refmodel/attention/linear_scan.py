"""The recurrence of the "linear" mixer in its two forms: token by token, and chunk by chunk.

Both update rules of `linear.py` are one recurrence on a state S [H, U] per value head:

    S_t = a_t S_{t-1} + k_t^T u_t        o_t = q_t S_t        a_t = exp(g_t) in (0, 1]

with the written value u_t (row vectors: q_t, k_t [H], v_t, u_t [U])

    Mamba-2 SSD (Dao & Gu 2024, arXiv:2405.21060):      u_t = beta_t v_t           (beta = dt)
    gated delta rule (Yang et al. 2024, 2412.06464):    u_t = beta_t (v_t - k_t a_t S_{t-1})

`recurrent` runs it as written: O(H U) work per token, the decode step (the native backend
runs the same step in `refmodel/kernels/recurrence.cc`, tested against this one).
`chunked` is the
parallel form of prefill (Mamba-2's block decomposition; the WY / UT-transform form of
Yang et al. 2024, "Parallelizing Linear Transformers with the Delta Rule over Sequence
Length", arXiv:2406.06484, for the delta rule). Split the sequence into C chunks of `chunk`
tokens, G_t = g_1 + ... + g_t within a chunk, S0 the state entering it. Unrolling the recurrence,

    S_t = exp(G_t) S0 + sum_{s<=t} exp(G_t - G_s) k_s^T u_s
    o_t = exp(G_t) q_t S0 + sum_{s<=t} exp(G_t - G_s) (q_t . k_s) u_s

The second term is quadratic attention inside the chunk under a decay mask exp(segsum(g));
the first carries the state between chunks (a `lax.scan` over chunks). For the delta rule u
depends on S0 too; substituting the unrolled state into its definition gives the unit lower
triangular system (I + A) u = beta v - beta exp(G) k S0 with A[t, s] = beta_t exp(G_t - G_s)
(k_t . k_s) for s < t. Its solutions for the two right-hand sides, U (for beta v) and
W (for beta exp(G) k), do not depend on S0 and are solved for all chunks at once; in the
scan u = U - W S0.

Shapes: q, k [B, T, K, H] (K key heads, Mamba-2's groups), v [B, T, K, G, U] and the
per-token scalars g, beta [B, T, K, G] (N = K G value heads), state [B, K, G, H, U]. Inside a
chunk T and S index the query and key positions (`chunk` of each) and C counts the chunks.
Everything runs in float32.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax.scipy.linalg import solve_triangular

RULES = ("mamba2", "gated_delta")


def recurrent(rule: str, state, q, k, v, g, beta, every: bool = False):
    """Token by token. Returns o [B, T, K, G, U] and the state after the last token, or with
    every=True the state after each token [B, T, K, G, H, U] (speculative decoding's
    snapshots)."""

    # q and k are broadcast over the G value heads so that both reads of S contract it in
    # place (batch B K G, contract H): with K alone as batch XLA transposed S for the read
    # and recomputed the whole update for the copy. The delta rule reads k S from the state
    # before its decay and decays the U results (a (k S) = k (a S)): reading the decayed
    # state made XLA compute the decay twice, once per consumer.

    def step(S, xs):  # S [B, K, G, H, U]
        q, k, v, g, beta = xs  # [B, K, H], [B, K, H], [B, K, G, U], [B, K, G], [B, K, G]
        q, k = (jnp.broadcast_to(a[:, :, None], S.shape[:-1]) for a in (q, k))  # [B,K,G,H]
        a = jnp.exp(g)[..., None]  # [B, K, G, 1] the decay
        if rule == "gated_delta":  # what the decayed state predicts for k: 2 H U + U
            v = v - a * jnp.einsum("BKGH,BKGHU->BKGU", k, S)
        S = a[..., None] * S  # decay: H U per head
        u = beta[..., None] * v  # [B, K, G, U]
        S = S + k[..., None] * u[..., None, :]  # rank-1 write: 2 H U
        o = jnp.einsum("BKGH,BKGHU->BKGU", q, S)  # read: 2 H U
        return S, ((o, S) if every else o)

    xs = tuple(jnp.moveaxis(a.astype(jnp.float32), 1, 0) for a in (q, k, v, g, beta))
    state, o = jax.lax.scan(step, state, xs)
    if every:
        o, states = o
        return jnp.moveaxis(o, 0, 1), jnp.moveaxis(states, 0, 1)  # [B, T, K, G, U], [B, T, ...]
    return jnp.moveaxis(o, 0, 1), state  # [B, T, K, G, U], [B, K, G, H, U]


def segsum(g: jax.Array) -> jax.Array:
    """g [..., T] -> [..., T, S] (T = S, the chunk length): entry [t, s] = g_{s+1} + ... + g_t
    for s <= t, -inf above.

    Summed directly (not as G_t - G_s) so that exp of it is exact to rounding even when
    the cumulative decay G underflows (Mamba-2's stable segsum)."""
    T = g.shape[-1]
    x = jnp.broadcast_to(g[..., :, None], g.shape + (T,))  # x[t, s] = g_t
    x = jnp.where(jnp.tril(jnp.ones((T, T), bool), -1), x, 0.0)
    out = jnp.cumsum(x, axis=-2)  # out[t, s] = sum_{s < r <= t} g_r
    return jnp.where(jnp.tril(jnp.ones((T, T), bool)), out, -jnp.inf)


def _to_chunks(a: jax.Array, chunk: int) -> jax.Array:
    """[B, T, ...] -> [B, C, chunk, ...], zero-padded: a padded token has g = 0 and beta = 0,
    so it neither decays nor writes the state."""
    B, T = a.shape[:2]
    C = -(-T // chunk)
    a = jnp.pad(a.astype(jnp.float32), [(0, 0), (0, C * chunk - T)] + [(0, 0)] * (a.ndim - 2))
    return a.reshape(B, C, chunk, *a.shape[2:])


def _delta_solve(k, u, g_cum, L, beta):
    """The UT transform: solve (I + A) [U | W] = [beta v | beta exp(G) k] for every chunk.

    k [B, C, S, K, H]; u = beta v, [B, C, K, G, S, U]; g_cum, beta [B, C, K, G, S];
    L [B, C, K, G, T, S] -> U [B, C, K, G, S, U], W [B, C, K, G, S, H]."""
    U = u.shape[-1]
    kk = jnp.einsum("BCTKH,BCSKH->BCKTS", k, k)[:, :, :, None]  # [B, C, K, 1, T, S]
    A = jnp.tril(beta[..., :, None] * kk * L, -1)  # strictly lower: s < t
    kb = (beta * jnp.exp(g_cum))[..., None] * jnp.moveaxis(k, 2, -2)[:, :, :, None]
    rhs = jnp.concatenate([u, kb], axis=-1)  # [B, C, K, G, S, U + H]
    I = jnp.eye(A.shape[-1], dtype=A.dtype)
    sol = solve_triangular(I + A, rhs, lower=True, unit_diagonal=True)
    return sol[..., :U], sol[..., U:]


def chunked(rule: str, state, q, k, v, g, beta, chunk: int):
    """The chunked parallel form; T need not divide by `chunk` (the last chunk is padded).

    Returns o [B, T, K, G, U] and the state after the last token, equal to `recurrent`'s."""
    B, T = q.shape[:2]
    q, k, v, g, beta = (_to_chunks(a, chunk) for a in (q, k, v, g, beta))
    # q, k [B, C, T, K, H]; v [B, C, T, K, G, U]; g, beta [B, C, T, K, G]
    g, beta = jnp.moveaxis(g, 2, -1), jnp.moveaxis(beta, 2, -1)  # [B, C, K, G, T]
    v = jnp.moveaxis(v, 2, -2)  # [B, C, K, G, T, U]
    L = jnp.exp(segsum(g))  # [B, C, K, G, T, S] decay from key s to query t
    g_cum = jnp.cumsum(g, axis=-1)  # [B, C, K, G, T] decay from the chunk's start
    qk = jnp.einsum("BCTKH,BCSKH->BCKTS", q, k)[:, :, :, None]  # [B, C, K, 1, T, S]
    scores = qk * L  # [B, C, K, G, T, S]
    u, w = beta[..., None] * v, None  # [B, C, K, G, S, U]
    if rule == "gated_delta":
        u, w = _delta_solve(k, u, g_cum, L, beta)
    q_in = jnp.exp(g_cum)[..., None] * jnp.moveaxis(q, 2, -2)[:, :, :, None]  # [B,C,K,G,T,H]
    k_out = L[..., -1, :, None] * jnp.moveaxis(k, 2, -2)[:, :, :, None]  # [B, C, K, G, S, H]
    a_chunk = jnp.exp(g_cum[..., -1])  # [B, C, K, G] decay across the whole chunk

    def step(S, xs):  # S [B, K, G, H, U]: the state entering the chunk
        scores, u, w, q_in, k_out, a_chunk = xs
        if w is not None:
            u = u - jnp.einsum("BKGSH,BKGHU->BKGSU", w, S)
        o = jnp.einsum("BKGTH,BKGHU->BKGTU", q_in, S)  # from the chunks before
        o = o + jnp.einsum("BKGTS,BKGSU->BKGTU", scores, u)  # within the chunk
        S = a_chunk[..., None, None] * S + jnp.einsum("BKGSH,BKGSU->BKGHU", k_out, u)
        return S, o

    xs = tuple(None if a is None else jnp.moveaxis(a, 1, 0)
               for a in (scores, u, w, q_in, k_out, a_chunk))
    state, o = jax.lax.scan(step, state, xs)  # o [C, B, K, G, T, U]
    o = jnp.moveaxis(o, 4, 1)  # [C, T, B, K, G, U]
    o = jnp.moveaxis(o.reshape(-1, *o.shape[2:]), 0, 1)  # [B, C T, K, G, U]
    return o[:, :T], state
