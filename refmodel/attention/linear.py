"""Linear attention / state space: Mamba-2 SSD and the gated delta rule, one layer, one cache.

Mamba-2 (Dao & Gu 2024, "Transformers are SSMs", arXiv:2405.21060) as in Nemotron-H
(arXiv:2504.03624), and Gated DeltaNet (Yang, Kautz & Hatamizadeh 2024, arXiv:2412.06464) as
in Qwen3-Next, chosen by `cfg.linear_rule`. Both keep, per value head, a state S [H, U]
that every token decays and writes (the recurrence and its chunked form: `linear_scan.py`).
Parameters match Hugging Face's `NemotronHMamba2Mixer` and `Qwen3NextGatedDeltaNet`
element for element, so counted sizes of real models are right.

The lesson: the cache is a fixed-size state, B (N H U floats + (Z-1) X conv inputs), the same
after ten tokens or a million (`capacity_bound = False`), so a decode step reads and writes
the same bytes and does the same FLOPs whatever the context: O(1) per token where softmax
attention is O(S). Prefill pays chunk-wide quadratic attention inside each chunk plus one state
hand-over per chunk; it too is linear in T.

`cfg.kv_format` (int8 / float8 token caches) does not apply here: the state is no cache of
tokens but a running sum every token rescales, and the conv window is a few inputs, so both
stay float and are counted so (`float_cache_size`) whatever kv format the costs are asked for.

Letters (beside the alphabet): N value heads (Mamba-2's SSM heads), K key heads (Mamba-2's
groups of its B and C projections, which are not batch and chunks), G = N / K, H key dim
(Mamba-2's state size), U value dim (Mamba-2's head dim), X = 2 K H + N U conv channels, Z conv
taps (`linear_conv`); chunked prefill runs C chunks of T = `linear_chunk` tokens. Positions
are implicit in the recurrence: no RoPE, `cfg.position` is ignored here.

The gated RMSNorm of Mamba-2 is grouped as Nemotron-H's (one RMS per group of G heads, over
G U channels: norm(y silu(z))); Gated DeltaNet's is per head over U with one weight [U]
shared by the heads (norm(o) silu(z)).
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
from flax import nnx, struct

from refmodel import ops
from refmodel.attention.base import AttentionLayer, float_cache_size
from refmodel.attention.linear_scan import RULES, chunked, recurrent
from refmodel.config import ModelConfig, one_of, positive
from refmodel.counting import Cost, Dtypes, matmul
from refmodel.layers import SIGMOID_FLOPS, SILU_FLOPS, SOFTPLUS_FLOPS, param, zeros
from refmodel.registry import register

STATE_BYTES = 4  # the recurrent state is kept in float32 whatever cfg.dtype
L2_EPS = 1e-6  # q and k L2 normalisation (Gated DeltaNet), as fla / Hugging Face
# Elementwise FLOPs per element, as XLA counts them: one per arithmetic op, compare or select;
# exp, log1p and rsqrt are transcendentals, not FLOPs (constants of the cost formulas below):
# Per value head and token: dt_bias add 1 + softplus + g = A dt 1 (Gated DeltaNet: + sigmoid)
FEATURE_FLOPS = {"mamba2": SOFTPLUS_FLOPS + 2, "gated_delta": SOFTPLUS_FLOPS + 2 + SIGMOID_FLOPS}
# Per channel of q and k: square 1, sum 1 (H-1 adds and the eps add per row), scale 1; q has
# one more, the H**-0.5.
L2_FLOPS = 3
# Gated RMSNorm, per element: silu(z), the gate product 1, square 1, sum 1 (R-1 adds per row
# of R, plus the mean's multiply and the eps add: GATE_NORM_ROW_FLOPS - 1 more per row),
# scale 1, weight 1.
GATE_NORM_FLOPS = SILU_FLOPS + 5
GATE_NORM_ROW_FLOPS = 1


@struct.dataclass
class LinearCache:
    state: jax.Array  # [B, N, H, U] float32
    conv: jax.Array  # [B, Z-1, X]: the last Z-1 conv inputs, cfg.dtype


def sizes(cfg: ModelConfig) -> tuple[int, int, int, int, int, int]:
    """N, K, H, U, Z and X = 2 K H + N U (conv channels: x B C for Mamba-2, q k v for GDN)."""
    N, K = cfg.linear_v_heads, cfg.linear_k_heads
    H, U, Z = cfg.linear_key_dim, cfg.linear_value_dim, cfg.linear_conv
    return N, K, H, U, Z, 2 * K * H + N * U


def causal_conv(x, state, w):
    """Depthwise causal conv: x [B, T, X] after the Z-1 inputs in state [B, Z-1, X].

    Tap Z-1 of w [X, Z] multiplies the current token (PyTorch's Conv1d with padding Z-1).
    Returns y [B, T, X] (no bias) and the new state, the last Z-1 inputs. Written as one
    product over the stacked windows [B, T, Z, X] (Z shifted views of the input): XLA:CPU ran
    the grouped convolution (`lax.conv_general_dilated`, feature_group_count = X) several
    times slower. Not a sum of Z shifted products either: XLA fuses that elementwise chain
    into every consumer of its output and recomputes it there, and its cost analysis then
    moves off ours."""
    T, Z = x.shape[1], w.shape[1]
    xp = jnp.concatenate([state.astype(x.dtype), x], axis=1)  # [B, Z-1+T, X]
    windows = jnp.stack([xp[:, z:z + T] for z in range(Z)], axis=2)  # [B, T, Z, X]
    return jnp.einsum("BTZX,XZ->BTX", windows, w), xp[:, T:]


def l2norm(x):
    return x * jax.lax.rsqrt(jnp.sum(x * x, axis=-1, keepdims=True) + L2_EPS)


def rms(x, eps):
    return x * jax.lax.rsqrt(jnp.mean(x * x, axis=-1, keepdims=True) + eps)


@register("linear")
class LinearAttention(AttentionLayer):
    """Gated linear attention with a fixed-size state: Mamba-2 or Gated DeltaNet."""

    capacity_bound = False
    MEASURE = {"linear": ("context", "quick")}
    MATRICES = {"in_proj": (0, 1), "in_proj_qkvz": (0, 1), "in_proj_ba": (0, 1),
                "out_proj": (0, 1)}

    @classmethod
    def validate(cls, cfg: ModelConfig, kind: str) -> None:
        one_of("linear_rule", cfg.linear_rule, RULES)
        for f in ("linear_k_heads", "linear_v_heads", "linear_key_dim", "linear_value_dim",
                  "linear_conv", "linear_chunk"):
            positive(f, getattr(cfg, f))
        if cfg.linear_v_heads % cfg.linear_k_heads:
            raise ValueError(f"linear_v_heads={cfg.linear_v_heads} is not divisible by "
                             f"linear_k_heads={cfg.linear_k_heads}")

    @classmethod
    def option_sets(cls, kind: str) -> dict[str, dict]:
        # The bare kind runs the config's default rule; every other rule has its own paths.
        return {kind: {}, **{f"{kind} {rule}": {"linear_rule": rule}
                             for rule in RULES if rule != ModelConfig.linear_rule}}

    @classmethod
    def label(cls, cfg: ModelConfig, kind: str) -> str:
        return kind if cfg.linear_rule == ModelConfig.linear_rule else f"{kind} {cfg.linear_rule}"

    @classmethod
    def compiler_differences(cls, cfg: ModelConfig, kind: str, phase: str, batch: int,
                             context: int, native_solve: bool = False) -> dict[str, float]:
        """The delta rule's chunked prefill solves a unit lower triangular system per chunk
        and value head (`solve_flops`: T (T-1) (U + H) FLOPs as forward substitution).
        XLA:CPU runs it as a LAPACK call (a custom call) its cost analysis counts as 0 FLOPs:
        minus ours, by name. A native `triangular-solve` instruction XLA prices at
        2 T elements(rhs) = 2 T^2 (U + H): twice ours plus 2 T (U + H), the difference added
        under the same name."""
        solves = solve_flops(cfg, batch, context) if phase == "prefill" else 0.0
        if not solves:
            return {}
        T = cfg.linear_chunk
        # native: XLA's 2 T^2 (U + H) per solve against our T (T - 1) (U + H); else 0 FLOPs
        return {LIBRARY_SOLVES: solves * ((T + 1) / (T - 1) if native_solve else -1.0)}

    def __init__(self, cfg: ModelConfig, *, kind: str, rngs: nnx.Rngs):
        D, (N, K, H, U, Z, X) = cfg.d_model, sizes(cfg)
        dtype = jnp.dtype(cfg.dtype)
        self.cfg, self.rule = cfg, cfg.linear_rule
        if self.rule == "mamba2":
            self.in_proj = param(rngs, (D, 2 * N * U + 2 * K * H + N), D, dtype)  # [D, z x B C dt]
            self.conv_b = zeros((X,), dtype)  # [X]
            self.D = nnx.Param(jnp.ones((N,), dtype))  # [N] Mamba's skip, y += D x
            self.norm = nnx.Param(jnp.ones((N * U,), dtype))  # [N U], RMS per group
            dt = jnp.exp(jax.random.uniform(rngs.params(), (N,), jnp.float32,
                                             math.log(1e-3), math.log(1e-1)))
            dt_bias = dt + jnp.log(-jnp.expm1(-dt))  # softplus(dt_bias) = dt (Mamba's init)
        else:
            self.in_proj_qkvz = param(rngs, (D, 2 * K * H + 2 * N * U), D, dtype)  # [D, qkvz]
            self.in_proj_ba = param(rngs, (D, 2 * N), D, dtype)  # [D, 2 N]
            self.norm = nnx.Param(jnp.ones((U,), dtype))  # [U], shared by the heads
            dt_bias = jnp.ones((N,), jnp.float32)
        self.conv_w = param(rngs, (X, Z), Z, dtype)  # [X, Z]
        self.dt_bias = nnx.Param(dt_bias.astype(dtype))  # [N]
        A = jax.random.uniform(rngs.params(), (N,), jnp.float32, 1.0, 16.0)
        self.A_log = nnx.Param(jnp.log(A).astype(dtype))  # [N]; decay rate exp(A_log)
        self.out_proj = param(rngs, (N * U, D), N * U, dtype)  # [N U, D]

    # The steps ----------------------------------------------------------------------------------

    def project(self, x):
        """x [B, T, D] -> z [B, T, N, U] (gate), xc [B, T, X] (conv input), ab [B, T, ...]:
        dt [B, T, N] (Mamba-2) or b and a [B, T, 2, N] (GDN). HF's layouts of the weights."""
        B, T, _ = x.shape
        N, K, H, U, _, X = sizes(self.cfg)
        G = N // K
        if self.rule == "mamba2":
            zxbcdt = x @ self.in_proj[...]
            z, xc, dt = jnp.split(zxbcdt, [N * U, N * U + X], axis=-1)
            return z.reshape(B, T, N, U), xc, dt
        qkvz = (x @ self.in_proj_qkvz[...]).reshape(B, T, K, 2 * H + 2 * G * U)  # per k-head
        q, k, v, z = jnp.split(qkvz, [H, 2 * H, 2 * H + G * U], axis=-1)
        xc = jnp.concatenate([q.reshape(B, T, K * H), k.reshape(B, T, K * H),
                              v.reshape(B, T, N * U)], axis=-1)
        ba = (x @ self.in_proj_ba[...]).reshape(B, T, K, 2, G)
        return z.reshape(B, T, N, U), xc, jnp.moveaxis(ba, 3, 2).reshape(B, T, 2, N)

    def features(self, xc, ab):
        """Conv output xc [B, T, X] (before its bias and silu) and ab -> the recurrence's
        inputs: q, k [B, T, K, H], v [B, T, K, G, U], g, beta [B, T, K, G] (all float32).

        The bias and silu are applied after the split, per part: applied to the whole of xc,
        XLA recomputes them in every consumer of each part, over all X channels."""
        B, T, _ = xc.shape
        N, K, H, U, _, _ = sizes(self.cfg)
        xc, ab = xc.astype(jnp.float32), ab.astype(jnp.float32)
        A = -jnp.exp(self.A_log[...].astype(jnp.float32))  # [N]
        dt_bias = self.dt_bias[...].astype(jnp.float32)
        if self.rule == "mamba2":
            cuts = [N * U, N * U + K * H]
            b = jnp.split(self.conv_b[...].astype(jnp.float32), cuts)
            v, k, q = (jax.nn.silu(a + c) for a, c in zip(jnp.split(xc, cuts, axis=-1), b,
                                                           strict=True))  # x, B, C
            beta = jax.nn.softplus(ab + dt_bias)  # dt [B, T, N]
            g = A * beta
        else:
            q, k, v = (jax.nn.silu(a) for a in jnp.split(xc, [K * H, 2 * K * H], axis=-1))
            q = l2norm(q.reshape(B, T, K, H)) * H**-0.5
            k = l2norm(k.reshape(B, T, K, H))
            beta = jax.nn.sigmoid(ab[:, :, 0])  # [B, T, N]
            g = A * jax.nn.softplus(ab[:, :, 1] + dt_bias)
        return (q.reshape(B, T, K, H), k.reshape(B, T, K, H), v.reshape(B, T, K, N // K, U),
                g.reshape(B, T, K, N // K), beta.reshape(B, T, K, N // K))

    def output(self, o, z, dtype):
        """o [B, T, N, U] (float32), gate z [B, T, N, U] -> [B, T, D]: gated RMSNorm, out_proj."""
        B, T, N, U = o.shape
        K, eps, w = self.cfg.linear_k_heads, self.cfg.norm_eps, self.norm[...]
        z = jax.nn.silu(z.astype(jnp.float32))
        with jax.named_scope("out_proj"):
            if self.rule == "mamba2":  # norm(o silu(z)), one RMS per group of G heads
                y = rms((o * z).reshape(B, T, K, -1), eps).reshape(B, T, N * U) * w
            else:  # norm(o) silu(z), one RMS per head
                y = (rms(o, eps) * w * z).reshape(B, T, N * U)
            return y.astype(dtype) @ self.out_proj[...]

    def verify(self, x: jax.Array, start: jax.Array, cache: LinearCache):
        """The call on a speculative chunk of T tokens, keeping the state after each of them
        (snapshots, not recomputation: T states of N H U floats cost little for the few tokens
        of a chunk, while recomputing the kept tokens would cost a second pass of the whole
        model). The chunk runs token by token (`recurrent`), as decode does, so the
        snapshots are decode's states exactly. Returns y, the cache after the whole chunk, and
        a LinearCache of the T snapshots (state [B, T, N, H, U], conv [B, T, Z-1, X])."""
        B, T, _ = x.shape
        N, K, H, U, Z, X = sizes(self.cfg)
        z, xc, ab = self.project(x)
        xp = jnp.concatenate([cache.conv.astype(xc.dtype), xc], axis=1)  # [B, Z-1+T, X]
        xc, conv = causal_conv(xc, cache.conv, self.conv_w[...])
        q, k, v, g, beta = self.features(xc, ab)
        S0 = cache.state.reshape(B, K, N // K, H, U)
        o, states = recurrent(self.rule, S0, q, k, v, g, beta, every=True)
        if self.rule == "mamba2":
            o = o + self.D[...].astype(jnp.float32).reshape(K, -1, 1) * v
        y = self.output(o.reshape(B, T, N, U), z, x.dtype)
        convs = jnp.stack([xp[:, t + 1:t + Z] for t in range(T)], axis=1)  # [B, T, Z-1, X]
        snaps = LinearCache(state=states.reshape(B, T, N, H, U),
                            conv=convs.astype(cache.conv.dtype))
        after = LinearCache(state=states[:, -1].reshape(B, N, H, U),
                            conv=conv.astype(cache.conv.dtype))
        return y, after, snaps

    @classmethod
    def rollback(cls, cfg: ModelConfig, kind: str, before: LinearCache, after: LinearCache,
                 snaps: LinearCache, keep: jax.Array, pos: jax.Array) -> LinearCache:
        """The snapshot after each row's last kept token (keep >= 1)."""
        rows = jnp.arange(keep.shape[0])
        return LinearCache(state=snaps.state[rows, keep - 1], conv=snaps.conv[rows, keep - 1])

    @ops.op("linear.decode")
    def decode(self, state, q, k, v, g, beta):
        """One token per sequence by the recurrence: state [B, N, H, U] float32 -> (o [B, 1, K,
        G, U], the state after [B, N, H, U])."""
        B, N, H, U = state.shape
        o, S = recurrent(self.rule, state.reshape(B, q.shape[2], -1, H, U), q, k, v, g, beta)
        return o, S.reshape(B, N, H, U)

    def scan(self, state, q, k, v, g, beta):
        """A chunk of T tokens by the chunked form, as `decode` (o [B, T, K, G, U])."""
        B, N, H, U = state.shape
        o, S = chunked(self.rule, state.reshape(B, q.shape[2], -1, H, U), q, k, v, g, beta,
                       self.cfg.linear_chunk)
        return o, S.reshape(B, N, H, U)

    def skip(self, o, v):
        """Mamba-2's skip connection, o + D x (Gated DeltaNet has none)."""
        if self.rule != "mamba2":
            return o
        return o + self.D[...].astype(jnp.float32).reshape(v.shape[2], -1, 1) * v

    def __call__(self, x: jax.Array, start: jax.Array, cache: LinearCache | None):
        """x [B, T, D] -> y [B, T, D]; `start` is unused: the state is the position. Every
        row's state and conv window are its own, so rows of a batch may sit at different
        positions (a scalar or a [B] start alike), but all rows take the same T tokens per
        call: a shorter row padded inside a chunk would decay and write its state with the
        padding (ragged lengths would need per-row g = beta = 0 past each row's end)."""
        B, T, _ = x.shape
        N, K, H, U, Z, X = sizes(self.cfg)
        with jax.named_scope("qkv_proj"):
            z, xc, ab = self.project(x)
        with jax.named_scope("conv"):
            conv0 = jnp.zeros((B, Z - 1, X), x.dtype) if cache is None else cache.conv
            xc, conv = causal_conv(xc, conv0, self.conv_w[...])
            q, k, v, g, beta = self.features(xc, ab)
        S0 = jnp.zeros((B, N, H, U), jnp.float32) if cache is None else cache.state
        decode = cache is not None and T == 1
        with jax.named_scope("state_update" if decode else "chunk_scan"):
            o, S = (self.decode if decode else self.scan)(S0, q, k, v, g, beta)
            o = self.skip(o, v)  # [B, T, K, G, U]
        y = self.output(o.reshape(B, T, N, U), z, x.dtype)
        if cache is None:
            return y, None
        return y, LinearCache(state=S, conv=conv.astype(cache.conv.dtype))

    @classmethod
    def init_cache(cls, cfg: ModelConfig, kind: str, batch: int, max_len: int) -> LinearCache:
        """A zero state and conv window; max_len is ignored: the size is fixed."""
        N, _, H, U, Z, X = sizes(cfg)
        return LinearCache(state=jnp.zeros((batch, N, H, U), jnp.float32),
                           conv=jnp.zeros((batch, Z - 1, X), jnp.dtype(cfg.dtype)))

    # Costs ----------------------------------------------------------------------------------

    @classmethod
    def param_counts(cls, cfg: ModelConfig, kind: str) -> dict[str, int]:
        """Elements per parameter, named as the module's attributes (HF: the same tensors)."""
        D, (N, K, H, U, Z, X) = cfg.d_model, sizes(cfg)
        if cfg.linear_rule == "mamba2":
            out = {"in_proj": D * (2 * N * U + 2 * K * H + N), "conv_w": X * Z, "conv_b": X,
                   "D": N, "norm": N * U}
        else:
            out = {"in_proj_qkvz": D * (2 * K * H + 2 * N * U), "in_proj_ba": D * 2 * N,
                   "conv_w": X * Z, "norm": U}
        return {**out, "dt_bias": N, "A_log": N, "out_proj": N * U * D}

    @classmethod
    def cache_bytes(cls, cfg: ModelConfig, kind: str, batch: int, context: int,
                    dt: Dtypes) -> float:
        """Independent of context: a float32 state and Z-1 conv inputs in the cache dtype."""
        N, _, H, U, Z, X = sizes(cfg)
        return batch * (N * H * U * STATE_BYTES + (Z - 1) * X * float_cache_size(cfg, dt))

    @classmethod
    def costs(cls, cfg: ModelConfig, kind: str, batch: int, new: int, context: int,
              dt: Dtypes) -> dict[str, Cost]:
        """One layer on `new` tokens per sequence; `context` does not enter any term.

        new == 1 is decode (the recurrence, "state_update"); new > 1 is prefill by chunks
        ("chunk_scan"), counted over the padded length as executed."""
        D, (N, K, H, U, Z, X) = cfg.d_model, sizes(cfg)
        BT, rule = batch * new, cfg.linear_rule
        width = 2 * N * U + 2 * K * H + (N if rule == "mamba2" else 2 * N)
        proj = matmul(BT, D, width, dt)
        bias = rule == "mamba2"
        conv = Cost(flops=BT * X * (2 * Z + bias + SILU_FLOPS),  # Z multiply-adds, bias, silu
                    weight_bytes=X * (Z + bias) * dt.param_size,
                    kv_bytes=2 * batch * (Z - 1) * X * float_cache_size(cfg, dt),  # read, write
                    act_bytes=2 * BT * X * dt.act_size)
        conv = conv + Cost(flops=BT * N * FEATURE_FLOPS[rule] + N + (  # + N: A = -exp(A_log)
            BT * K * H * (2 * L2_FLOPS + 1) if rule == "gated_delta" else 0),
            weight_bytes=(2 + (rule == "mamba2")) * N * dt.param_size)  # A_log, dt_bias, (D)
        rows = N if rule == "gated_delta" else K  # RMS rows per token
        out = matmul(BT, N * U, D, dt) + Cost(
            flops=BT * (GATE_NORM_FLOPS * N * U + GATE_NORM_ROW_FLOPS * rows),
            weight_bytes=cls.param_counts(cfg, kind)["norm"] * dt.param_size)
        ops = {"qkv_proj": proj, "conv": conv}
        if new == 1:
            ops["state_update"] = state_update_cost(cfg, batch, dt)
        else:
            ops["chunk_scan"] = chunk_scan_cost(cfg, batch, new, dt)
        ops["out_proj"] = out
        return ops


def state_update_cost(cfg: ModelConfig, batch: int, dt: Dtypes) -> Cost:
    """One token per sequence through `recurrent`, per value head: decay H U, rank-1 write
    2 H U, read q S 2 H U, u = beta v U (+ delta rule: k S 2 H U, its decay U and v - k S U;
    Mamba-2: skip D x 2 U). The state is read and written once: 2 N H U float32 per sequence.
    """
    N, K, H, U, _, _ = sizes(cfg)
    per_head = 5 * H * U + U + (2 * H * U + 2 * U if cfg.linear_rule == "gated_delta" else 2 * U)
    return Cost(flops=batch * N * per_head,
                kv_bytes=2 * batch * N * H * U * STATE_BYTES,
                act_bytes=batch * (2 * K * H + 2 * N * U + 2 * N) * dt.act_size)


LIBRARY_SOLVES = "triangular solves as XLA prices them"


def solve_flops(cfg: ModelConfig, batch: int, new: int) -> float:
    """The delta rule's triangular solve in `chunked` (zero for Mamba-2): per value head and
    chunk, forward substitution through T rows for U + H right-hand sides, T (T-1) / 2
    multiply-adds each. (It runs as a library call, LAPACK's trsm on CPU, whose FLOPs XLA's
    cost analysis does not see: `refmodel.compiler_check` names the difference.)"""
    if cfg.linear_rule != "gated_delta":
        return 0.0
    N, _, H, U, _, _ = sizes(cfg)
    T = cfg.linear_chunk
    return batch * -(-new // T) * N * T * (T - 1) * (U + H)


def chunk_scan_cost(cfg: ModelConfig, batch: int, new: int, dt: Dtypes) -> Cost:
    """`chunked` on `new` tokens padded to C chunks of T = `linear_chunk`, as executed. Per
    chunk:

    per key head    q k^T 2 T^2 H (the delta rule: and k k^T, 2 T^2 H more)
    per value head  decay mask: segsum's two selects 2 T^2 and cumsum T^2 (T-1) (a cumsum of
                    length T is a reduce-window: T-1 adds per element), times q k^T T^2;
                    the cumulative decay T (T-1); q and k decays 2 T H; u = beta v and the
                    sum of o's two terms 2 T U; from the state q S 2 T H U; within the chunk
                    scores u 2 T^2 U; hand-over a S + k^T u 2 T H U + 2 H U; Mamba-2's skip
                    D x 2 T U
    delta rule      A = tril(beta k k^T L) 3 T^2 and I + A T^2, W's right-hand side
                    T + T H, the triangular solve (`solve_flops`), u = U - W S 2 T H U + T U

    The state is read and written once per call (it stays on chip between chunks).
    XLA's cost analysis counts a `lax.scan` body once, not C times (`refmodel.compiler_check` sizes
    its prefill to one chunk)."""
    N, K, H, U, _, _ = sizes(cfg)
    T = cfg.linear_chunk
    C = -(-new // T)
    per_key = 2 * T * T * H
    per_value = (T * T * (T - 1) + 3 * T * T + T * (T - 1) + 2 * T * H + 2 * T * U
                 + 4 * T * H * U + 2 * T * T * U + 2 * H * U)
    if cfg.linear_rule == "gated_delta":
        per_key += 2 * T * T * H
        per_value += 4 * T * T + T + T * H + 2 * T * H * U + T * U
    else:
        per_value += 2 * T * U  # skip D x
    return Cost(flops=batch * C * (K * per_key + N * per_value) + solve_flops(cfg, batch, new),
                kv_bytes=2 * batch * N * H * U * STATE_BYTES,
                act_bytes=batch * new * (2 * K * H + 2 * N * U + 2 * N) * dt.act_size)
