"""Mixture-of-experts FFN: a top-k router and dispatch whose work is proportional to routing.

Shazeer et al. 2017 (sparsely-gated MoE), Mixtral (Jiang et al. 2024: softmax top-2 of 8),
DeepSeekMoE / V3 (shared experts, sigmoid scores with normalised top-k weights), gpt-oss
(biases inside each expert). Each of the B T tokens picks A of E experts; the B T A (token,
expert) pairs are sorted by expert and run as one grouped matmul (`MoE.grouped_experts`), so no
expert runs on a token that did not choose it. In decode a batch of B tokens touches about
E (1 - (1 - A/E)^B) distinct experts: that, not E, is what a decode step must read.

Expert parallelism (GShard, Lepikhin et al. 2020; DeepSeek-V3's EP): under
`refmodel.parallel`, the experts are split over the mesh's "expert" axis and so are the
tokens (attention runs data-parallel over it). A layer that holds fewer than E experts routes
its tokens, sends each (token, expert) pair to the device holding that expert and gets the
outputs back (`MoE.expert_parallel`: three all-to-alls, the rows, their expert ids and the
outputs), then combines as on one device.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
from flax import nnx

from refmodel import ops
from refmodel.config import ModelConfig
from refmodel.counting import Cost, Dtypes, matmul
from refmodel.layers import (
    GATED,
    SIGMOID_FLOPS,
    SOFTMAX_FLOPS,
    DenseFFN,
    act_flops,
    activation,
    param,
    zeros,
)


def expected_distinct_experts(tokens: float, n_experts: int, top_k: int) -> float:
    """Expected number of distinct experts that `tokens` tokens, each choosing top_k of
    n_experts uniformly, touch: E (1 - (1 - A/E)^tokens)."""
    return n_experts * (1.0 - (1.0 - top_k / n_experts) ** tokens)


def expert_tile(pairs: int, n_experts: int) -> int:
    """Rows per trip of `MoE.grouped_experts`' loop: the power of two nearest above the mean
    rows per expert, in [1, 128] (static: it depends only on shapes)."""
    return min(128, max(1, 1 << math.ceil(math.log2(max(1.0, pairs / n_experts)))))


class MoE(nnx.Module):
    """Routed experts (and optional always-on shared experts) replacing the dense FFN.

    `dense_dispatch` (off by default; `refmodel.training` turns it on): every expert runs on
    every token, weighted by the router's top-k weights (zero for the others), the same
    output at E / A times the routed FLOPs. Training needs it: the grouped loop's trip count
    depends on the routing, and reverse mode cannot differentiate a loop of dynamic length.
    """

    # Stacked [E, in, out]: one leading axis of experts (refmodel.quant).
    MATRICES = {"w_gate": (1, 1), "w_up": (1, 1), "w_down": (1, 1)}

    dense_dispatch: bool = False

    def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
        D, E, F = cfg.d_model, cfg.n_experts, cfg.expert_width
        dtype = jnp.dtype(cfg.dtype)
        self.cfg = cfg  # MATRICES (class attribute below): the experts, not the router
        self.w_router = param(rngs, (D, E), D, dtype)  # [D, E]
        if cfg.router_bias:
            self.b_router = zeros((E,), dtype)
        if cfg.mlp_act in GATED:
            self.w_gate = param(rngs, (E, D, F), D, dtype)  # [E, D, F]
        self.w_up = param(rngs, (E, D, F), D, dtype)  # [E, D, F]
        self.w_down = param(rngs, (E, F, D), F, dtype)  # [E, F, D]
        if cfg.moe_bias:
            if cfg.mlp_act in GATED:
                self.b_gate = zeros((E, F), dtype)
            self.b_up, self.b_down = zeros((E, F), dtype), zeros((E, D), dtype)
        self.shared = (DenseFFN(cfg, cfg.n_shared_experts * F, rngs=rngs)
                       if cfg.n_shared_experts else None)
        if cfg.n_shared_experts and cfg.shared_expert_gate:  # Qwen3-Next: sigmoid(x w) gate
            self.w_shared_gate = param(rngs, (D, 1), D, dtype)  # [D, 1]

    def route(self, x: jax.Array) -> tuple[jax.Array, jax.Array]:
        """x [B*T, D] -> top-k weights [B*T, A] and expert indices [B*T, A]."""
        cfg = self.cfg
        with jax.named_scope("router"):
            logits = x @ self.w_router[...]  # [B*T, E]
            if cfg.router_bias:
                logits = logits + self.b_router[...]
            logits = logits.astype(jnp.float32)
            scores = jax.nn.softmax(logits) if cfg.router_score == "softmax" \
                else jax.nn.sigmoid(logits)
            weights, idx = jax.lax.top_k(scores, cfg.top_k)  # [B*T, A]
            if cfg.norm_topk:
                weights = weights / jnp.sum(weights, axis=-1, keepdims=True)
        return weights.astype(x.dtype), idx

    # refmodel.parallel: experts (and their biases) split over the "expert" mesh axis; the
    # router, and the shared experts' own rules (DenseFFN), as they are.
    SHARDING = {"w_gate": ("expert", None, None), "w_up": ("expert", None, None),
                "w_down": ("expert", None, None), "b_gate": ("expert", None),
                "b_up": ("expert", None), "b_down": ("expert", None)}

    def sharding(self, mesh_shape: dict) -> dict:
        """{parameter: mesh axis per dimension} (refmodel.parallel); the experts must split
        evenly over the expert axis."""
        ep = mesh_shape.get("expert", 1)
        if self.cfg.n_experts % ep:
            raise ValueError(f"expert={ep} does not divide n_experts={self.cfg.n_experts}: "
                             "choose an expert degree that divides the experts")
        return self.SHARDING

    @property
    def local_experts(self) -> int:
        """Experts this device holds: E, or E / ep inside `refmodel.parallel`'s shard_map."""
        return jax.tree.leaves(self.w_up[...])[0].shape[0]

    def __call__(self, x: jax.Array) -> jax.Array:  # [..., D] -> [..., D]
        cfg, shape = self.cfg, x.shape
        x = x.reshape(-1, shape[-1])  # [B*T, D]
        weights, idx = self.route(x)
        A, E = cfg.top_k, cfg.n_experts
        if self.local_experts != E:  # refmodel.parallel split the experts over devices
            if self.dense_dispatch:
                raise ValueError("dense_dispatch (training's every-expert form) does not run "
                                 "with experts split over devices: use expert=1")
            y = self.expert_parallel(x, weights, idx)
            return self._with_shared(x, y).reshape(shape)
        if self.dense_dispatch:
            combine = jnp.zeros((x.shape[0], E), x.dtype).at[
                jnp.arange(x.shape[0])[:, None], idx].set(weights)  # [B*T, E]
            y = sum(combine[:, e:e + 1] * self.expert(e, x) for e in range(E))
            return self._with_shared(x, y).reshape(shape)
        with jax.named_scope("dispatch"):
            flat = idx.reshape(-1)  # [B*T*A]
            order = jnp.argsort(flat, stable=True)  # pairs sorted by expert
            token = order // A  # token of each sorted pair
            sizes = jnp.bincount(flat, length=E).astype(jnp.int32)  # tokens per expert [E]
            xs = x[token]  # [B*T*A, D]
        ys = self.grouped_experts(xs, sizes)  # [B*T*A, D]
        with jax.named_scope("combine"):
            ys = ys * weights.reshape(-1)[order][:, None]
            y = jnp.zeros_like(x).at[token].add(ys)  # [B*T, D]
        return self._with_shared(x, y).reshape(shape)

    def _with_shared(self, x: jax.Array, y: jax.Array) -> jax.Array:
        """y [B*T, D] plus the shared experts' output on x [B*T, D], if the config has any."""
        if self.shared is None:
            return y
        with jax.named_scope("shared_experts"):
            shared = self.shared(x)  # [B*T, D]
            if self.cfg.shared_expert_gate:
                shared = shared * jax.nn.sigmoid(x @ self.w_shared_gate[...])  # [B*T, 1]
            return y + shared

    def expert(self, e: int, x: jax.Array) -> jax.Array:
        """Expert e's FFN on rows x [t, D] -> [t, D]."""
        cfg = self.cfg
        with jax.named_scope("ffn_up"):
            up = x @ self.w_up[...][e]  # [t, F]
            if cfg.moe_bias:
                up = up + self.b_up[...][e]
            if cfg.mlp_act in GATED:
                gate = x @ self.w_gate[...][e]
                if cfg.moe_bias:
                    gate = gate + self.b_gate[...][e]
                h = activation(cfg.mlp_act, gate) * up
            else:
                h = activation(cfg.mlp_act, up)
        with jax.named_scope("ffn_down"):
            y = h @ self.w_down[...][e]  # [t, D]
            return y + self.b_down[...][e] if cfg.moe_bias else y

    def expert_parallel(self, x: jax.Array, weights: jax.Array, idx: jax.Array) -> jax.Array:
        """The routed experts' output for this device's tokens x [n, D] (top-k weights and
        global expert ids [n, A]) when the experts are split over the "expert" mesh axis
        (inside `refmodel.parallel`'s shard_map, this device holding E_loc = E / ep of them).

        Each device sends every pair to the device of its expert in a fixed buffer of
        C = n A rows per destination (all-to-all needs static shapes; C holds the case of
        every pair going to one device, so no token is ever dropped), with the pair's local
        expert id (E_loc marks an empty row). The receiver runs its experts on the rows it got
        (`grouped_experts`: empty rows sorted last, never computed) and sends the outputs back
        in the same slots. Bytes per all-to-all: ep C D per device, ep times the n A D an
        exact (ragged) all-to-all moves; `refmodel.parallel.comms` counts both.
        """
        n, D = x.shape
        A, E_loc = self.cfg.top_k, self.local_experts
        ep, C = self.cfg.n_experts // E_loc, n * A
        with jax.named_scope("dispatch"):
            flat = idx.reshape(-1)  # [n*A] global expert ids
            dest = flat // E_loc  # device holding each pair's expert
            order = jnp.argsort(dest, stable=True)  # pairs sorted by destination
            to = dest[order]
            counts = jnp.bincount(dest, length=ep)
            slot = jnp.arange(n * A) - (jnp.cumsum(counts) - counts)[to]  # row in its buffer
            token = order // A
            send = jnp.zeros((ep, C, D), x.dtype).at[to, slot].set(x[token])  # [ep, C, D]
            ids = jnp.full((ep, C), E_loc, jnp.int32).at[to, slot].set(flat[order] % E_loc)
            rows = jax.lax.all_to_all(send, "expert", 0, 0).reshape(ep * C, D)  # by source
            rid = jax.lax.all_to_all(ids, "expert", 0, 0).reshape(ep * C)
            by_expert = jnp.argsort(rid, stable=True)  # empty rows (E_loc) last
            sizes = jnp.bincount(rid, length=E_loc + 1)[:E_loc].astype(jnp.int32)
        ys = self.grouped_experts(rows[by_expert], sizes, pairs=C)  # [ep*C, D]
        with jax.named_scope("combine"):
            ys = jnp.zeros_like(ys).at[by_expert].set(ys).reshape(ep, C, D)
            back = jax.lax.all_to_all(ys, "expert", 0, 0)  # [ep, C, D]: my pairs' outputs
            out = back[to, slot] * weights.reshape(-1)[order][:, None]  # [n*A, D]
            return jnp.zeros_like(x).at[token].add(out)  # [n, D]

    @ops.op("moe.grouped")
    def grouped_experts(self, xs: jax.Array, sizes: jax.Array,
                        pairs: int | None = None) -> jax.Array:
        """A grouped matmul: rows xs [B*T*A, D] sorted by expert, sizes [E] rows per expert.

        Each expert runs on its own rows only, in tiles of `tile` rows (a loop whose trip
        count is ceil(sizes[e] / tile), zero for an expert no token chose, so its weights are
        never read). Work is the routed rows plus at most tile - 1 padding rows per expert.
        `jax.lax.ragged_dot` expresses the same thing, but XLA:CPU ran it several times slower
        than this loop (tests/test_model.py checks both against the every-expert oracle).
        """
        rows, experts = xs.shape[0], self.local_experts
        tile = expert_tile(pairs or rows, experts)  # pairs: the rows expected, if padded
        starts = jnp.cumsum(sizes) - sizes  # first row of each expert [E]
        xs = jnp.pad(xs, ((0, tile), (0, 0)))  # [B*T*A + tile, D]: tiles never read past the end
        out = jnp.zeros_like(xs)
        for e in range(experts):

            def tile_step(i, out, e=e):
                r0 = starts[e] + i * tile
                y = self.expert(e, jax.lax.dynamic_slice_in_dim(xs, r0, tile))  # [t, D]
                keep = (i * tile + jnp.arange(tile)) < sizes[e]  # rows of this expert
                old = jax.lax.dynamic_slice_in_dim(out, r0, tile)
                return jax.lax.dynamic_update_slice_in_dim(
                    out, jnp.where(keep[:, None], y, old), r0, 0)

            out = jax.lax.fori_loop(0, (sizes[e] + tile - 1) // tile, tile_step, out)
        return out[:rows]

    # Costs ------------------------------------------------------------------------------------

    @staticmethod
    def param_counts(cfg: ModelConfig) -> dict[str, int]:
        """Per-layer {router, experts (all E), expert (one), shared} element counts (the
        shared experts' sigmoid gate, if any, is counted with them)."""
        D, E, F = cfg.d_model, cfg.n_experts, cfg.expert_width
        n_in = 2 if cfg.mlp_act in GATED else 1
        one = (n_in + 1) * D * F + ((n_in * F + D) if cfg.moe_bias else 0)
        shared = (DenseFFN.param_count(cfg, cfg.n_shared_experts * F)
                  if cfg.n_shared_experts else 0)
        if cfg.n_shared_experts and cfg.shared_expert_gate:
            shared += D
        return {"router": D * E + (E if cfg.router_bias else 0), "experts": E * one,
                "expert": one, "shared": shared}

    @staticmethod
    def costs(cfg: ModelConfig, tokens: float, dt: Dtypes) -> dict[str, Cost]:
        """MoE on `tokens` tokens: every token runs A experts (tokens A pairs); the weights read are
        those of the expected number of distinct experts the tokens touch (not all E, not one).

        FLOPs are the grouped matmuls' 2 (pairs) D F: the routed rows, without the padding
        of each expert's rows to whole tiles in `grouped_experts` (at most tile - 1 per
        expert). XLA's cost analysis counts that loop differently: see `refmodel.compiler_check`.
        """
        D, E, A, F = cfg.d_model, cfg.n_experts, cfg.top_k, cfg.expert_width
        n_in = 2 if cfg.mlp_act in GATED else 1
        touched = expected_distinct_experts(tokens, E, A)
        pairs = tokens * A
        # The router's [D, E] stays in the parameter dtype when the experts are quantized.
        router = matmul(tokens, D, E, dt, weight=False) + Cost(
            flops=(SCORE_FLOPS[cfg.router_score] + cfg.router_bias) * tokens * E
            + (TOPK_NORM_FLOPS * pairs if cfg.norm_topk else 0),
            weight_bytes=(D * E + (E if cfg.router_bias else 0)) * dt.param_size)
        # Sort the pairs by expert (XLA counts a compare per element per merge level) and count
        # them per expert (one add each); gather each pair's token row.
        sort = pairs * max(1.0, math.ceil(math.log2(max(pairs, 1.0)))) + pairs
        dispatch = Cost(flops=sort, act_bytes=2.0 * pairs * D * dt.act_size)
        up = matmul(pairs, D, n_in * F, dt, weight=False) + Cost(
            flops=act_flops(cfg.mlp_act) * pairs * F,
            weight_bytes=touched * n_in * dt.matrix_bytes(D, F))
        down = matmul(pairs, F, D, dt, weight=False) + Cost(
            weight_bytes=touched * dt.matrix_bytes(F, D))
        if cfg.moe_bias:
            up = up + Cost(flops=n_in * pairs * F, weight_bytes=touched * n_in * F * dt.param_size)
            down = down + Cost(flops=pairs * D, weight_bytes=touched * D * dt.param_size)
        # Weight each pair's output and scatter-add it to its token: 2 FLOPs per element.
        combine = Cost(flops=2.0 * pairs * D, act_bytes=(pairs + tokens) * D * dt.act_size)
        ops = {"router": router, "dispatch": dispatch, "ffn_up": up, "ffn_down": down,
               "combine": combine}
        if cfg.n_shared_experts:
            shared = DenseFFN.costs(cfg, cfg.n_shared_experts * F, tokens, dt)
            ops["shared_experts"] = shared["ffn_up"] + shared["ffn_down"]
            if cfg.shared_expert_gate:  # x @ [D, 1], a sigmoid per token, a product per element
                ops["shared_experts"] += matmul(tokens, D, 1, dt, weight=False) + Cost(
                    flops=SCORE_FLOPS["sigmoid"] * tokens + tokens * D,
                    weight_bytes=D * dt.param_size)
        return ops


# Router elementwise FLOPs per (token, expert) score: a softmax or a sigmoid (the conventions
# of `refmodel.layers`). The top-k selection itself is counted as 0 by XLA; renormalising the
# top-k weights is a sum and a divide per pair.
SCORE_FLOPS = {"softmax": SOFTMAX_FLOPS, "sigmoid": SIGMOID_FLOPS}
TOPK_NORM_FLOPS = 2


def grouped_ffn(layer, xs: jax.Array, sizes: jax.Array, product) -> jax.Array:
    """The expert FFN of `moe.grouped` with each expert matrix as one grouped product over
    every expert's rows sorted by expert: `product(w [E, in, out], rows [R, in], sizes)` ->
    [R, out] (a backend's kernel). Biases and the activation as the reference; rows past
    sum(sizes) stay zero."""
    cfg = layer.cfg
    if cfg.moe_bias:  # each row's expert (E past the last group: a zero bias)
        expert = jnp.searchsorted(jnp.cumsum(sizes), jnp.arange(xs.shape[0]), side="right",
                                  method="compare_all")

        def bias(b):  # b [E, n] -> [R, n]
            return jnp.take(b, expert, axis=0, mode="fill", fill_value=0)

    def run(name, h):
        y = product(getattr(layer, name)[...], h, sizes)
        return y + bias(getattr(layer, "b" + name[1:])[...]) if cfg.moe_bias else y

    with jax.named_scope("ffn_up"):
        up = run("w_up", xs)  # [R, F]
        h = (activation(cfg.mlp_act, run("w_gate", xs)) * up if cfg.mlp_act in GATED
             else activation(cfg.mlp_act, up))
    with jax.named_scope("ffn_down"):
        return run("w_down", h)  # [R, D]
