"""Small building blocks shared by the model: parameter init, norms, the dense FFN.

The dense FFN is SwiGLU (Shazeer 2020, "GLU Variants Improve Transformer") as in Llama, GeGLU
as in Gemma, GELU as in GPT-2, or squared ReLU as in Nemotron-H (So et al. 2021, "Primer").
Weights are stored input-major, `[D, F]` and `[F, D]`, and named by the einsum they enter.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from refmodel import ops
from refmodel.config import ModelConfig
from refmodel.counting import Cost, Dtypes, matmul

GATED = ("swiglu", "geglu")


def param(rngs: nnx.Rngs, shape: tuple[int, ...], fan_in: int, dtype) -> nnx.Param:
    """A weight drawn from N(0, 1/fan_in): unit-variance activations at any width."""
    return nnx.Param(jax.random.normal(rngs.params(), shape, dtype) * fan_in**-0.5)


def zeros(shape: tuple[int, ...], dtype) -> nnx.Param:
    return nnx.Param(jnp.zeros(shape, dtype))


def norm(cfg: ModelConfig, dim: int, rngs: nnx.Rngs) -> nnx.Module:
    """RMSNorm (scale only) or LayerNorm (scale and bias), as the config says."""
    dtype = jnp.dtype(cfg.dtype)
    if cfg.norm == "layernorm":
        return nnx.LayerNorm(dim, epsilon=cfg.norm_eps, dtype=dtype, param_dtype=dtype, rngs=rngs)
    return nnx.RMSNorm(dim, epsilon=cfg.norm_eps, dtype=dtype, param_dtype=dtype, rngs=rngs)


def norm_params(cfg: ModelConfig, dim: int) -> int:
    return 2 * dim if cfg.norm == "layernorm" else dim


# Elementwise FLOPs per element, as XLA's cost analysis counts them: one per arithmetic op,
# compare or select; exp, log1p, tanh and rsqrt are transcendentals, kept out of FLOPs. Every
# cost formula of the package takes these conventions from here.
SIGMOID_FLOPS = 3  # 1 / (1 + exp(-x)): negate, add, divide
SILU_FLOPS = SIGMOID_FLOPS + 1  # x * sigmoid(x)
SOFTPLUS_FLOPS = 6  # jax.nn.softplus is logaddexp(x, 0): compare, max, abs, negate, add, select
SOFTMAX_FLOPS = 4  # over a row: max, subtract, sum, divide (the exp: a transcendental)
SOFTCAP_FLOPS = 2  # `soft_cap`: a divide and a multiply (the tanh: a transcendental)
# Each FFN activation as `activation` computes it: SiLU; tanh-approximate GELU 0.5 x (1 +
# tanh(c (x + 0.044715 x^3))) = 8; squared ReLU = max, multiply = 2.
ACT_FLOPS = {"swiglu": SILU_FLOPS, "geglu": 8, "gelu": 8, "relu2": 2}


def soft_cap(x: jax.Array, cap: float) -> jax.Array:
    """Gemma 2's logit soft-capping, cap * tanh(x / cap): SOFTCAP_FLOPS per element."""
    return cap * jnp.tanh(x / cap)


def act_flops(name: str) -> int:
    """FLOPs per FFN hidden element: the activation, plus the gate product when gated."""
    return ACT_FLOPS[name] + (1 if name in GATED else 0)


def activation(name: str, x: jax.Array) -> jax.Array:
    if name in ("swiglu",):
        return jax.nn.silu(x)
    if name in ("geglu", "gelu"):
        return jax.nn.gelu(x, approximate=True)
    if name == "relu2":
        return jnp.square(jax.nn.relu(x))
    raise ValueError(f"mlp_act={name!r} is not one of swiglu, geglu, gelu, relu2")


class DenseFFN(nnx.Module):
    """x -> W_down act(x W_gate) * (x W_up), or W_down act(x W_up) when not gated."""

    # The matrices refmodel.quant may quantize: {name: (stacked axes, input axes)}.
    MATRICES = {"w_gate": (0, 1), "w_up": (0, 1), "w_down": (0, 1)}

    def __init__(self, cfg: ModelConfig, width: int, *, rngs: nnx.Rngs):
        dtype, D = jnp.dtype(cfg.dtype), cfg.d_model
        self.act, self.width = cfg.mlp_act, width
        if cfg.mlp_act in GATED:
            self.w_gate = param(rngs, (D, width), D, dtype)  # [D, F]
        self.w_up = param(rngs, (D, width), D, dtype)  # [D, F]
        self.w_down = param(rngs, (width, D), width, dtype)  # [F, D]
        if cfg.mlp_bias:
            self.b_up = zeros((width,), dtype)
            self.b_down = zeros((D,), dtype)
        self.bias = cfg.mlp_bias

    def sharding(self, mesh_shape: dict) -> dict[str, tuple]:
        """Megatron's FFN (refmodel.parallel): up and gate column-parallel, down row-parallel,
        one all-reduce of [tokens, D] after it."""
        tp, width = mesh_shape.get("tensor", 1), self.width
        if width % tp:
            raise ValueError(f"tensor={tp} does not divide the FFN width {width} (d_ff, or "
                             "expert_width x n_shared_experts): choose a tensor degree that "
                             "divides it")
        return {"w_gate": (None, "tensor"), "w_up": (None, "tensor"),
                "w_down": ("tensor", None), "b_up": ("tensor",)}

    def __call__(self, x: jax.Array) -> jax.Array:  # [..., D] -> [..., D]
        # The products run on [tokens, D]: on [B, T, D] XLA:CPU's backward pass took 1.5x as
        # long (a train step of byte-target: 2.05 s -> 1.71 s with the rows flattened).
        shape = x.shape
        x = x.reshape(-1, shape[-1])
        with jax.named_scope("ffn_up"):
            if self.act in GATED:  # gate and up, both [..., F], take the same x
                gate, up = ops.contract_each(x, (self.w_gate[...], self.w_up[...]))
            else:
                up = x @ self.w_up[...]  # [..., F]
            if self.bias:
                up = up + self.b_up[...]
            h = activation(self.act, gate) * up if self.act in GATED else activation(self.act, up)
        with jax.named_scope("ffn_down"):
            y = h @ self.w_down[...]  # [..., D]
            if self.bias:
                y = y + self.b_down[...]
        return y.reshape(shape)

    # Costs ------------------------------------------------------------------------------------

    @staticmethod
    def param_count(cfg: ModelConfig, width: int) -> int:
        n_in = 2 if cfg.mlp_act in GATED else 1
        bias = (width + cfg.d_model) if cfg.mlp_bias else 0
        return (n_in + 1) * cfg.d_model * width + bias

    @staticmethod
    def costs(cfg: ModelConfig, width: int, tokens: float, dt: Dtypes) -> dict[str, Cost]:
        """One dense FFN applied to `tokens` tokens: up (and gate) projection, then down.

        Elementwise: ACT_FLOPS per element of [tokens, F] for the activation, plus 1 for the
        gate product when gated.
        """
        D, n_in = cfg.d_model, (2 if cfg.mlp_act in GATED else 1)
        up = matmul(tokens, D, n_in * width, dt)
        up = up + Cost(flops=act_flops(cfg.mlp_act) * tokens * width)
        if cfg.mlp_bias:
            up = up + Cost(flops=tokens * width, weight_bytes=width * dt.param_size)
        down = matmul(tokens, width, D, dt)
        if cfg.mlp_bias:
            down = down + Cost(flops=tokens * D, weight_bytes=D * dt.param_size)
        return {"ffn_up": up, "ffn_down": down}


# Norm costs (the norms of `norm()` above) ------------------------------------------------------

# Elementwise FLOPs per normalised element. RMSNorm: square, sum, multiply by the reciprocal
# root, multiply by the weight = 4. The per-row mean division and rsqrt are left out (XLA
# reports the rsqrt as a transcendental). Flax's LayerNorm takes mean(x) and mean(x^2) in one
# pass and applies (x - mean) * (rsqrt * weight) + bias: XLA counts 5 per element (measured on
# flax 0.12.8), not the textbook 7.
NORM_FLOPS = {"rmsnorm": 4, "layernorm": 5}


def norm_costs(cfg: ModelConfig, dim: int, tokens: float, dt: Dtypes) -> Cost:
    """One norm over `dim` channels of `tokens` rows: reads its weights, reads and writes x."""
    return Cost(flops=NORM_FLOPS[cfg.norm] * tokens * dim,
                weight_bytes=norm_params(cfg, dim) * dt.param_size,
                act_bytes=2.0 * tokens * dim * dt.act_size)
