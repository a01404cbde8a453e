"""The native few-rows kernel (refmodel/kernels): against numpy, as a weight type on both of
its paths, as a model (golden test on a stack of every attention kind and a MoE, equal to the
XLA model's logits and greedy tokens), and its refusals and fallback."""

from __future__ import annotations

import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import refmodel
from conftest import assert_logits_close, incremental_logits, tiny, tokens
from refmodel import backends, kernels, quant
from refmodel.kernels import build

pytestmark = pytest.mark.skipif(not kernels.available(),
                                reason=f"native kernels not built: {build.why_not()}")


def native_rows(x: np.ndarray, w: np.ndarray) -> np.ndarray:
    """x [M, n_in] @ w [n_in, n_out] in the kernel, w stored in its panels."""
    return np.asarray(kernels.rows(jnp.asarray(x), kernels.panels(jnp.asarray(w)), w.shape[1]))


@settings(max_examples=16, deadline=None)
@given(m=st.integers(1, 40), k=st.integers(1, 150), n=st.integers(1, 300),
       seed=st.integers(0, 2**16))
def test_rows_equals_numpy(m, k, n, seed):
    """Every tail: rows of x past a pass (6 with AVX2, 12 with AVX-512) and several passes, K
    past the unrolled inputs, an N that ends inside a panel or inside a vector, a thread's
    share of several panels. Float32 sums in another order: within 1e-5 of the scale."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((m, k)).astype(np.float32)
    w = rng.standard_normal((k, n)).astype(np.float32)
    oracle = x.astype(np.float64) @ w.astype(np.float64)
    np.testing.assert_allclose(native_rows(x, w), oracle, rtol=1e-5, atol=1e-5 * np.sqrt(k))


@pytest.mark.parametrize("k", [101, 3])
@pytest.mark.parametrize("n", [333, 288])
@pytest.mark.parametrize("m", [*range(1, 14), 16, 17, 24, 25, 33, 61])
def test_rows_every_pass_and_tile(m, n, k):
    """Each tile the kernel has (1-12 rows of x per pass, 2 or 4 panels side by side for 1-6
    rows, each of the 2 panels' inputs in 2 parts for 3-6, a panel's inputs in 4 parts on the
    first pass of 7 or more) and the passes after the first, on a K that is not a multiple of the
    unrolling or the parts (101) or below the parts (3), and an N of 333 (the last panel ends
    inside a vector, after whole groups of panels) or 288 (nine whole panels: the last group
    ends at N): tails of tiles, parts, groups, panels and of
    the threads' shares, deterministically (the property test above samples them)."""
    rng = np.random.default_rng(m)
    x = rng.standard_normal((m, k)).astype(np.float32)
    w = rng.standard_normal((k, n)).astype(np.float32)
    oracle = x.astype(np.float64) @ w.astype(np.float64)
    np.testing.assert_allclose(native_rows(x, w), oracle, rtol=1e-5, atol=1e-4)


def test_panels_layout():
    """panels(w)[p, k, j] = w[k, 32 p + j], zero past N."""
    w = np.arange(3 * 70, dtype=np.float32).reshape(3, 70)
    wp = np.asarray(kernels.panels(jnp.asarray(w)))
    assert wp.shape == (3, 3, kernels.PANEL)
    for p in range(3):
        for j in range(kernels.PANEL):
            col = w[:, p * kernels.PANEL + j] if p * kernels.PANEL + j < 70 else 0.0
            np.testing.assert_array_equal(wp[p, :, j], col)


def test_rows_refuses_other_dtypes_and_shapes():
    x, wp = jnp.ones((2, 8)), kernels.panels(jnp.ones((8, 40)))
    with pytest.raises(ValueError, match="float32"):
        kernels.rows(x.astype(jnp.bfloat16), wp, 40)
    with pytest.raises(ValueError, match="one n_in.*n=40"):
        kernels.rows(jnp.ones((2, 9)), wp, 40)
    with pytest.raises(ValueError, match="n=70"):
        kernels.rows(x, wp, 70)  # 40 outputs are 2 panels, 70 would be 3


@pytest.mark.parametrize("form", ["Panels", "OutputMajor"])
@pytest.mark.parametrize("rows", [1, 3, 16, 41])
def test_stored_weights_are_a_drop_in(rows, form):
    """x @ Panels(w) (the kernel, whatever the rows) and x @ OutputMajor(w) (XLA) == x @ w, for
    each matrix of a stack of three; dequantize() gives w back."""
    rng = np.random.default_rng(rows)
    w = jnp.asarray(rng.standard_normal((3, 70, 37)), jnp.float32)  # [E, n_in, n_out]
    x = jnp.asarray(rng.standard_normal((1, rows, 70)), jnp.float32)  # [B, T, n_in]
    stored = getattr(kernels, form).of(w, lead=1)
    np.testing.assert_array_equal(np.asarray(stored.dequantize()), np.asarray(w))
    for e in range(3):
        got = x @ stored[...][e]
        assert got.shape == (1, rows, 37)
        np.testing.assert_allclose(np.asarray(got), np.asarray(x @ w[e]), rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match="float32"):
        getattr(kernels, form).of(w.astype(jnp.bfloat16), lead=1)
    with pytest.raises(IndexError, match="leading"):
        stored[0][0]


@pytest.mark.parametrize("int8", [False, True])
def test_one_matrix_of_a_stack_is_read_in_place(int8):
    """stack[e] of Panels [E, n_in, n_out] is a view (the whole stack and e): x @ it runs the
    stacked kernel on matrix e where it lies, for a static, a negative or a traced e (a MoE
    layer's loop), equal to x @ w[e]; the compiled product holds no slice or copy of the weight;
    an index past the stack is refused; dequantize() gives w[e]."""
    rng = np.random.default_rng(7)
    if int8:
        stored, w = quantized_panels(70, 37, rng, lead=(3,))
    else:
        w = rng.standard_normal((3, 70, 37)).astype(np.float32)
        stored = kernels.Panels.of(jnp.asarray(w), lead=1)
    x = jnp.asarray(rng.standard_normal((5, 70)), jnp.float32)
    for e in (0, 2, -1):
        view = stored[e]
        assert view.w is stored.w and int(view.at) == e % 3 and view.shape == (70, 37)
        np.testing.assert_allclose(np.asarray(view.dequantize()), w[e], rtol=1e-6)
        np.testing.assert_allclose(np.asarray(x @ view), np.asarray(x, np.float64) @ w[e],
                                   rtol=1e-5, atol=1e-4)

    def product(stored, x, e):
        return x @ stored[e]

    f = jax.jit(product)
    for e in range(3):
        np.testing.assert_allclose(np.asarray(f(stored, x, jnp.int32(e))),
                                   np.asarray(x, np.float64) @ w[e], rtol=1e-5, atol=1e-4)
    text = f.lower(stored, x, jnp.int32(1)).compile().as_text()
    assert text.count(build.TARGETS["RowsAtI8" if int8 else "RowsAtF32"]) == 1
    assert not [line for line in text.splitlines()
                if (" slice(" in line or "dynamic-slice(" in line or " copy(" in line)
                and "70,32]" in line]  # the weight's panels [.., 70, 32] are never copied
    with pytest.raises(IndexError, match="index 3 is out of bounds for a stack of 3"):
        stored[3]


@pytest.mark.parametrize("int8", [False, True])
@pytest.mark.parametrize("sizes", [(2, 0, 5, 1), (0, 0, 0, 0), (0, 13, 0, 0), (3, 1, 1, 2)])
def test_grouped_product_equals_each_group_alone(sizes, int8):
    """Panels.grouped (rows_groups: a MoE layer's experts in one call): x [M, n_in] in groups
    of sizes rows, group e times matrix e, equal to numpy group by group, with empty groups
    (never read), a group of one, one group of all rows past a pass, and rows past the sum
    (M = 13) zero; wrong sizes or a view of one matrix are refused."""
    rng = np.random.default_rng(sum(sizes) + int8)
    E, K, N, R = 4, 70, 101, 13
    if int8:
        stored, w = quantized_panels(K, N, rng, lead=(E,))
    else:
        w = rng.standard_normal((E, K, N)).astype(np.float32)
        stored = kernels.Panels.of(jnp.asarray(w), lead=1)
    x = rng.standard_normal((R, K)).astype(np.float32)
    got = np.asarray(jax.jit(lambda s, x, n: s.grouped(x, n))(
        stored, jnp.asarray(x), jnp.asarray(sizes, jnp.int32)))
    want, m0 = np.zeros((R, N)), 0
    for e, m in enumerate(sizes):
        want[m0:m0 + m] = x[m0:m0 + m].astype(np.float64) @ w[e]
        m0 += m
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-4 * np.abs(w).max())
    assert not got[m0:].any()
    with pytest.raises(ValueError, match=r"sizes \[E\]; got .*sizes int32\[3\]"):
        stored.grouped(jnp.asarray(x), jnp.zeros(3, jnp.int32))
    with pytest.raises(ValueError, match="one matrix of a stack"):
        stored[1].grouped(jnp.asarray(x), jnp.zeros(4, jnp.int32))
    scale = None if int8 else jnp.ones((E, N), jnp.float32)  # int8 without, float32 with one
    with pytest.raises(ValueError, match=r"rows_groups: an int8 w takes scale float32 \[E, n="
                                         r"101\], a float32 w none"):
        kernels.rows_groups(jnp.asarray(x), stored.w, N, jnp.zeros(4, jnp.int32), scale)


@pytest.mark.parametrize("bias", [False, True])
def test_native_moe_reads_each_expert_in_one_grouped_call(bias):
    """A native model's MoE layer runs its experts as three grouped calls (gate, up, down) and
    no per-expert loop: each touched expert's weights are read once per step, where the loop
    read an expert once per tile of rows (1.4x the touched bytes at decode's few rows). Its
    output equals the XLA model's loop, with biases inside the experts (gpt-oss) or none."""
    cfg = tiny(attention="gqa", n_layers=1, ffn_pattern=("moe",), moe_bias=bias)
    xla = refmodel.init(cfg, seed=0)
    if bias:  # biases are initialised to zero: give each expert its own
        ffn, rng = xla.blocks[0].ffn, np.random.default_rng(4)
        for name in ("b_gate", "b_up", "b_down"):
            getattr(ffn, name)[...] = jnp.asarray(
                rng.standard_normal(getattr(ffn, name)[...].shape), jnp.float32)
    native = backends.use(xla, "native")
    moe = native.blocks[0].ffn
    x = jnp.asarray(np.random.default_rng(3).standard_normal((6, cfg.d_model)), jnp.float32)
    text = jax.jit(lambda m, x: m(x)).lower(moe, x).compile().as_text()
    assert text.count(build.TARGETS["RowsGroupsF32"]) == 3
    assert build.TARGETS["RowsAtF32"] not in text
    # No per-expert loop; XLA:CPU's older emitters (the suite's conftest) lower a scatter-add
    # (the dispatch's counts, the combine) to a while loop of their own.
    loops = [line for line in text.splitlines() if " while(" in line]
    assert all("scatter" in line for line in loops), loops
    np.testing.assert_allclose(np.asarray(moe(x)), np.asarray(xla.blocks[0].ffn(x)),
                               rtol=1e-5, atol=1e-5)


def quantized_panels(k: int, n: int, rng, lead: tuple = ()):
    """An int8 matrix as quant stores it and as int8 Panels, and its dequantized float."""
    w = jnp.asarray(rng.standard_normal((*lead, k, n)), jnp.float32)
    q = quant.quantize_matrix(w, "int8", lead=len(lead))
    return kernels.Panels.of_quantized(q), np.asarray(q.dequantize(), np.float64)


@settings(max_examples=8, deadline=None)
@given(m=st.integers(1, 40), k=st.integers(1, 150), n=st.integers(1, 300),
       seed=st.integers(0, 2**16))
def test_rows_int8_equals_numpy(m, k, n, seed):
    """The int8 kernel (values converted as loaded, one scale per output) against numpy over
    the dequantized weight: the same tails as the float kernel's test."""
    rng = np.random.default_rng(seed)
    p, w = quantized_panels(k, n, rng)
    assert p.w.dtype == jnp.int8 and p.scale.shape == (n,)
    x = rng.standard_normal((m, k)).astype(np.float32)
    got = np.asarray(kernels.rows(jnp.asarray(x), p.w, n, p.scale))
    np.testing.assert_allclose(got, x.astype(np.float64) @ w, rtol=1e-5,
                               atol=1e-5 * np.sqrt(k) * np.abs(w).max())


def test_rows_int8_refuses_a_missing_or_wrong_scale():
    p, _ = quantized_panels(8, 40, np.random.default_rng(0))
    x = jnp.ones((2, 8))
    with pytest.raises(ValueError, match="int8 w takes scale float32 \\[n=40\\].*scale None"):
        kernels.rows(x, p.w, 40)
    with pytest.raises(ValueError, match="scale float32\\[39\\]"):
        kernels.rows(x, p.w, 40, p.scale[:39])
    with pytest.raises(ValueError, match="a float32 w none"):
        kernels.rows(x, kernels.panels(jnp.ones((8, 40))), 40, p.scale)
    with pytest.raises(ValueError, match="int8 weights.*int4"):
        kernels.Panels.of_quantized(quant.quantize_matrix(jnp.ones((8, 40)), "int4"))


@pytest.mark.parametrize("rows", [1, 5, 41])
def test_int8_panels_are_a_drop_in(rows):
    """x @ int8 Panels == x @ the dequantized weight, each matrix of a stack of three."""
    rng = np.random.default_rng(rows)
    p, w = quantized_panels(70, 37, rng, lead=(3,))
    np.testing.assert_allclose(np.asarray(p.dequantize()), w, rtol=1e-6)
    x = jnp.asarray(rng.standard_normal((1, rows, 70)), jnp.float32)
    for e in range(3):
        got = x @ p[...][e]
        np.testing.assert_allclose(np.asarray(got), np.asarray(x, np.float64) @ w[e],
                                   rtol=1e-5, atol=1e-4)


def test_int8_model_is_golden_and_equals_the_xla_int8_model():
    """quantize(model, "int8") then backends.use: the int8 kernel in every x @ w (prefill of 3
    tokens, then batch-2 decode) equals the XLA int8 model (quant.backend) to float32 rounding,
    with the same greedy tokens; init(weight_format="int8", backend="native") stores the same."""
    cfg = tiny(attention="gqa", n_layers=2, ffn_pattern=("dense", "moe"))
    xla = quant.quantize(refmodel.init(cfg, seed=0), weights="int8")
    native = backends.use(xla, "native")
    assert native.cfg.backend == "native" and native.cfg.weight_format == "int8"
    assert isinstance(native.blocks[0].attn.wq[...], kernels.Panels)
    assert native.blocks[0].attn.wq[...].w.dtype == jnp.int8
    toks = tokens(cfg, 2, cfg.window + 3, seed=1)
    got, want = incremental_logits(native, toks, [3]), refmodel.forward(xla, toks)
    assert_logits_close(got, want, tol=3e-5)
    np.testing.assert_array_equal(np.asarray(got.argmax(-1)), np.asarray(want.argmax(-1)))
    direct = refmodel.init(cfg.replace(weight_format="int8", backend="native"), seed=0)
    np.testing.assert_array_equal(np.asarray(direct.blocks[0].attn.wq[...].w),
                                  np.asarray(native.blocks[0].attn.wq[...].w))
    with pytest.raises(ValueError, match="quantize the backend='xla' model"):
        quant.quantize(backends.use(refmodel.init(cfg, seed=0), "native"), weights="int8")


# One layer of every registered attention kind, a dense FFN and a MoE: every product a model
# makes with `x @ w` (projections, FFNs, experts, LM head) goes through the kernel, the
# einsum products of 3-D weights stay XLA's.
EVERY_KIND = tiny(layer_pattern=refmodel.attention.registered(),
                  n_layers=len(refmodel.attention.registered()), ffn_pattern=("dense", "moe"))


# The output-major model differs from the XLA one only in how x @ w is written (every kind's
# own code is the same), so a dense GQA layer and a MoE layer (stacked experts) cover it.
GOLDEN = {"native": EVERY_KIND,
          "output-major": tiny(attention="gqa", n_layers=2, ffn_pattern=("dense", "moe"))}


@pytest.mark.parametrize("backend", GOLDEN)
def test_model_is_golden_and_equals_the_xla_model(backend):
    """A prefill of 3 tokens (6 rows: the kernel) then token-by-token decode at batch 2 (the
    kernel) past the sliding window equal the XLA model's full forward over the same tokens
    to float32 rounding, and pick the same greedy token at every position; so does the
    output-major model, all XLA. (The XLA GEMM path above 16 rows is the drop-in test's; the
    XLA model's own golden test is test_golden's.)"""
    cfg = GOLDEN[backend]
    xla = refmodel.init(cfg, seed=0)
    other = backends.use(xla, backend)
    assert other.cfg.backend == backend and xla.cfg.backend == "xla"
    toks = tokens(cfg, 2, 2 * cfg.window + 3, seed=1)
    got, want = incremental_logits(other, toks, [3]), refmodel.forward(xla, toks)
    # The kernel sums each dot product in its own order (vector partial sums over all of K),
    # XLA in another: through this many layers the logits differ by up to ~1e-5, so the bound
    # is 3e-5; the greedy tokens must be identical.
    assert_logits_close(got, want, tol=3e-5)
    np.testing.assert_array_equal(np.asarray(got.argmax(-1)), np.asarray(want.argmax(-1)))


@pytest.mark.parametrize("backend, phase, batch, calls", [
    ("native", "decode", 2, 7 * 2 + 1), ("native", "decode", 1, 7 * 2 + 1),
    ("native", "prefill", 1, 7 * 2 + 1), ("output-major", "decode", 2, 0),
    ("native-int8", "decode", 1, 7 * 2 + 1)])
def test_the_kernel_runs_where_it_should(backend, phase, batch, calls):
    """No silent fallback: a native step (decode at batch 1 or 2, a prefill of 8 tokens; int8
    weights: the int8 kernel) holds one custom call per `x @ w` product (dense GQA layer: q, k,
    v, o, gate, up, down; plus the LM head) and one attention kernel per layer; with
    backend='output-major', none (XLA's products over the output-major weight)."""
    cfg = tiny(attention="gqa", n_layers=2)
    int8 = backend == "native-int8"
    cfg = cfg.replace(backend="native", weight_format="int8") if int8 else cfg.replace(
        backend=backend)
    phases = refmodel.Phases(refmodel.init(cfg, seed=0))
    text = phases.jitted[phase].lower(*phases.example_args(phase, batch, 8)).as_text()
    assert text.count(build.TARGETS["RowsI8" if int8 else "RowsF32"]) == calls
    assert text.count(build.TARGETS["RowsF32" if int8 else "RowsI8"]) == 0
    # and a native step attends in a kernel, one call per layer: the paged kernel at decode,
    # the prefill kernel for a chunk of tokens
    native = backend != "output-major"
    assert text.count(build.TARGETS["PagedAttentionF32"]) == (
        2 if native and phase == "decode" else 0)
    assert text.count(build.TARGETS["AttendRowsF32"]) == (
        2 if native and phase == "prefill" else 0)


def test_a_native_sliding_decode_attends_in_the_kernel_over_written_slots_only():
    """The ring's decode in the kernel: one call per sliding layer (none in XLA's model). The
    cost model has one count whatever the backend: the ring scores all W slots at any context
    (the padding is RING_OP); the kernel reads only the min(S + 1, W) written ones, a gap
    the breakdown measures, not another count."""
    from refmodel.attention.sliding import RING_OP

    cfg = tiny(attention="sliding", n_layers=2)
    S = cfg.window // 2  # the ring is half written
    for backend, calls in (("native", 2), ("xla", 0)):
        phases = refmodel.Phases(refmodel.init(cfg.replace(backend=backend), seed=0))
        text = phases.jitted["decode"].lower(*phases.example_args("decode", 2, S)).as_text()
        assert text.count(build.TARGETS["PagedAttentionF32"]) == calls
        ops = refmodel.costs.phase_costs(phases.cfg, "decode_attention", 2, S)["ops"]
        assert ops[RING_OP]["flops"] > 0


@settings(max_examples=15, deadline=None)
@given(B=st.integers(1, 2), T=st.integers(1, 30), K=st.integers(1, 3), G=st.integers(1, 4),
       H=st.sampled_from([1, 8, 16, 33, 64, 80]), extra=st.integers(0, 70),
       seed=st.integers(0, 2**16))
def test_prefill_attention_equals_softmax_attention(B, T, K, G, H, extra, seed):
    """The prefill kernel (attend_rows.cc) against float64 softmax attention: any head size
    (panels padded past H), key counts off the 32-key panels, query rows in several tiles of
    12 and several row blocks, each query over its own prefix of the keys (any length 1..S,
    not only causal: a row block mixes lengths). Scores spread wide enough for large exps."""
    from refmodel.kernels.prefill import attend_rows

    rng = np.random.default_rng(seed)
    S = T + extra
    q = rng.standard_normal((B, T, K, G, H)).astype(np.float32)
    k = (3 * rng.standard_normal((B, K, S, H))).astype(np.float32)
    v = rng.standard_normal((B, K, S, H)).astype(np.float32)
    lens = rng.integers(1, S + 1, (B, T)).astype(np.int32)
    scale = 1 / np.sqrt(H)
    got = np.asarray(jax.jit(attend_rows, static_argnums=4)(q, k, v, lens, scale))
    for b in range(B):
        for t in range(T):
            n = lens[b, t]
            s = scale * np.einsum("kgh,klh->kgl", q[b, t].astype(np.float64), k[b, :, :n])
            p = np.exp(s - s.max(-1, keepdims=True))
            want = np.einsum("kgl,klh->kgh", p / p.sum(-1, keepdims=True), v[b, :, :n])
            np.testing.assert_allclose(got[b, t], want, rtol=2e-5, atol=2e-5)


def test_prefill_attention_refuses_wrong_shapes_and_dtypes():
    from refmodel.kernels.prefill import attend_rows

    q, kv = jnp.zeros((1, 4, 2, 2, 8), jnp.float32), jnp.zeros((1, 2, 6, 8), jnp.float32)
    lens = jnp.ones((1, 4), jnp.int32)
    for args in [(q.astype(jnp.bfloat16), kv, kv, lens), (q, kv[:, :1], kv[:, :1], lens),
                 (q, kv, kv, lens[:, :3]), (q, kv, kv[..., :4], lens)]:
        with pytest.raises(ValueError, match="attend_rows: q float32"):
            attend_rows(*args, 1.0)


def test_native_decode_past_the_cache_end_attends_as_xla_does():
    """A benchmark carries its cache on past max_len: XLA clamps the write to the last slot
    and every key is seen; the native attention sees every key too, so the steps agree."""
    cfg = tiny(attention="gqa", n_layers=2)
    out = {}
    for backend in ("output-major", "native"):
        phases = refmodel.Phases(backends.use(refmodel.init(cfg, seed=0), backend))
        state, token, cache = phases.example_args("decode", 2, 8, fill=True)
        logits = []
        for _ in range(cache.layers[0].k.shape[2] - 8 + 3):  # to the end, then 3 past it
            step, cache = phases.jitted["decode"](state, token, cache)
            logits.append(np.asarray(step))
        out[backend] = np.stack(logits)
    np.testing.assert_allclose(out["native"], out["output-major"], rtol=3e-5, atol=3e-5)


def test_config_refuses_native_where_it_cannot_run():
    with pytest.raises(ValueError, match="backend='gpu'.*xla"):
        tiny(backend="gpu")
    with pytest.raises(ValueError, match="backend='native' takes float32.*bfloat16"):
        tiny(backend="native", dtype="bfloat16")
    with pytest.raises(ValueError, match="backend='output-major' takes float32"):
        tiny(backend="output-major", dtype="float16")
    with pytest.raises(ValueError, match="backend='native' takes float32 weights, "
                       "weight_format='int8', or 'int4' with quant_activations=True.*'int4'"):
        tiny(backend="native", weight_format="int4")
    with pytest.raises(ValueError, match="backend='native' takes .*'float8'"):
        tiny(backend="native", weight_format="float8")
    with pytest.raises(ValueError, match="backend='output-major' takes float32 weights;"):
        tiny(backend="output-major", weight_format="int8")
    assert tiny(backend="native", weight_format="int8").weight_format == "int8"


def test_without_a_compiler_the_model_stays_xla_and_native_says_why(tmp_path):
    """A machine with no C++ compiler: load() is False with the reason, backend='native' raises
    it, the default model runs (in a child: the build is cached per process)."""
    code = ("import refmodel; from refmodel import backends, kernels, presets\n"
            "print(kernels.available(), kernels.why_not())\n"
            "refmodel.forward(refmodel.init(presets.get('tiny')), [[1, 2, 3]])\n"
            "try:\n    refmodel.init(presets.get('tiny').replace(backend='native'))\n"
            "except RuntimeError as e:\n    print('refused:', e)\n"
            "from refmodel import cli\ntext, status = cli.kernels_report()\n"
            "print(status, text.splitlines()[0])\nprint(backends.choose('auto'))\n")
    env = {**os.environ, "PATH": str(tmp_path), "CXX": "",
           "REFMODEL_KERNEL_CACHE": str(tmp_path / "cache")}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                         text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    first, refused, command, auto = out.stdout.strip().splitlines()
    assert first == "False no C++ compiler on PATH (set CXX, or install g++ or clang++)"
    assert refused.startswith("refused: backend='native' needs the native kernels")
    assert command == "1 native kernels: not available here: no C++ compiler on PATH (set " \
                      "CXX, or install g++ or clang++)"
    assert auto == "xla"  # what a benchmark's or the engine's "auto" runs there
    assert not (tmp_path / "cache").exists()


def test_auto_is_the_native_kernels_on_a_cpu_for_float32_weights_only():
    """backends.choose: what `microbench run`, `phases` and the engine time by default."""
    assert backends.choose("auto") == ("native" if jax.default_backend() == "cpu" else "xla")
    assert backends.choose("auto", dtype="bfloat16") == "xla"
    assert backends.choose("auto", weight_format="int8") == "xla"
    assert [backends.choose(m) for m in ("xla", "output-major")] == ["xla", "output-major"]
    with pytest.raises(ValueError,
                       match=r"backend='gpu': choose one of \('auto', 'reference', 'xla'"):
        backends.choose("gpu")


def test_refmodel_kernels_command_builds_and_checks(capsys):
    """`python -m refmodel kernels`: the library's path and a check against numpy, status 0."""
    from refmodel import cli

    assert cli.main(["kernels"]) == 0
    out = capsys.readouterr().out
    assert str(build.library_path(build.compiler())) in out
    assert "against numpy" in out and out.strip().endswith(": ok")


def test_a_broken_build_is_reported_not_loaded(tmp_path, monkeypatch):
    """A compiler that fails: no library is left in the cache (nothing half-written)."""
    fake = tmp_path / "fakecxx"
    fake.write_text("#!/bin/sh\n[ \"$1\" = --version ] && echo fake 1.0 && exit 0\n"
                    "echo 'error: no' >&2; exit 1\n")
    fake.chmod(0o755)
    monkeypatch.setenv("REFMODEL_KERNEL_CACHE", str(tmp_path / "cache"))
    with pytest.raises(RuntimeError, match="failed"):
        build.build(str(fake))
    assert list((tmp_path / "cache").iterdir()) == []


def test_jit_and_eager_agree():
    x = jnp.asarray(np.random.default_rng(0).standard_normal((2, 33)), jnp.float32)
    wp = kernels.panels(jnp.asarray(np.random.default_rng(1).standard_normal((33, 5)),
                                    jnp.float32))
    np.testing.assert_array_equal(np.asarray(jax.jit(kernels.rows, static_argnums=2)(x, wp, 5)),
                                  np.asarray(kernels.rows(x, wp, 5)))


def test_sharding_refuses_output_major_weights():
    from refmodel import parallel

    model = refmodel.init(tiny(backend="output-major"), seed=0)
    with pytest.raises(ValueError,
                       match="shard takes backend='xla' or 'reference' models.*'output-major'"):
        parallel.shard(model, parallel.make_mesh(1, 1, 1))


def latent_oracle(qn, qr, w, lat, kr, lens, scale):
    """Absorbed MLA decode in float64 numpy, written as the einsums of its definition."""
    qn, qr, w, lat, kr = (np.asarray(a, np.float64) for a in (qn, qr, w, lat, kr))
    P = qn.shape[-1]
    s = scale * (np.einsum("bnp,rnp,bsr->bns", qn, w[..., :P], lat)
                 + np.einsum("bnq,bsq->bns", qr, kr))
    s = np.where(np.arange(lat.shape[1]) < np.asarray(lens)[:, None, None], s, -np.inf)
    p = np.exp(s - s.max(-1, keepdims=True))
    return np.einsum("bns,bsr,rnu->bnu", p / p.sum(-1, keepdims=True), lat, w[..., P:])


@settings(max_examples=15, deadline=None)
@given(B=st.integers(1, 3), N=st.integers(1, 13), P=st.sampled_from([1, 8, 16, 20]),
       Q=st.sampled_from([2, 6, 16, 32]), U=st.sampled_from([1, 7, 16, 33]),
       R=st.sampled_from([1, 16, 24, 64, 72]), S=st.integers(1, 600), seed=st.integers(0, 2**16))
def test_latent_attention_equals_the_absorbed_einsums(B, N, P, Q, U, R, S, seed):
    """The absorbed MLA decode kernel (latent.cc) against float64 numpy: head counts past the
    groups of 6 the values pass holds (2 without AVX-512) and the scores' blocks of 4, latent
    ranks past its blocks of 4 vectors and inside a vector, keys in one to three chunks of 256
    and inside a block of 16, each row its own length (any 1..S). Scores spread wide enough
    for large exps."""
    from refmodel.kernels.latent import attend_latent

    rng = np.random.default_rng(seed)
    qn = rng.standard_normal((B, N, P)).astype(np.float32)
    qr = (2 * rng.standard_normal((B, N, Q))).astype(np.float32)
    w = (rng.standard_normal((R, N, P + U)) / np.sqrt(R)).astype(np.float32)
    lat = (3 * rng.standard_normal((B, S, R))).astype(np.float32)
    kr = rng.standard_normal((B, S, Q)).astype(np.float32)
    lens = rng.integers(1, S + 1, B).astype(np.int32)
    scale = float((P + Q) ** -0.5)
    got = jax.jit(attend_latent, static_argnums=6)(qn, qr, w, lat, kr, lens, scale)
    np.testing.assert_allclose(np.asarray(got), latent_oracle(qn, qr, w, lat, kr, lens, scale),
                               rtol=2e-5, atol=2e-5)


@pytest.mark.parametrize("lens", [[1100, 1, 700, 257], [1, 1, 1, 1100], [256, 512, 768, 1024]])
def test_latent_attention_in_runs_of_chunks_over_uneven_sequences(lens):
    """Many chunks per thread (4 sequences of up to 5 chunks of 256 keys), cut into runs of
    about equal keys, each chunk prefetching its run's next one (empty chunks of short rows
    among them): the same numbers as the einsums, at `bench`'s MLA shape (N 12, R 192, Q 32),
    whose value passes share out the next chunk's latent and RoPE lines."""
    from refmodel.kernels.latent import attend_latent

    B, N, P, Q, U, R, S = 4, 12, 16, 32, 16, 192, 1100
    rng = np.random.default_rng(len(lens) + lens[0])
    qn = rng.standard_normal((B, N, P)).astype(np.float32)
    qr = (2 * rng.standard_normal((B, N, Q))).astype(np.float32)
    w = (rng.standard_normal((R, N, P + U)) / np.sqrt(R)).astype(np.float32)
    lat = (3 * rng.standard_normal((B, S, R))).astype(np.float32)
    kr = rng.standard_normal((B, S, Q)).astype(np.float32)
    lens = np.asarray(lens, np.int32)
    scale = float((P + Q) ** -0.5)
    got = jax.jit(attend_latent, static_argnums=6)(qn, qr, w, lat, kr, lens, scale)
    np.testing.assert_allclose(np.asarray(got), latent_oracle(qn, qr, w, lat, kr, lens, scale),
                               rtol=2e-5, atol=2e-5)


def test_latent_attention_refuses_wrong_shapes_and_dtypes():
    from refmodel.kernels.latent import attend_latent

    qn, qr = jnp.zeros((2, 3, 4), jnp.float32), jnp.zeros((2, 3, 2), jnp.float32)
    w, lat, kr = (jnp.zeros(s, jnp.float32) for s in ((8, 3, 6), (2, 5, 8), (2, 5, 2)))
    lens = jnp.ones((2,), jnp.int32)
    for args in [(qn.astype(jnp.bfloat16), qr, w, lat, kr, lens), (qn, qr, w[:, :2], lat, kr,
                 lens), (qn, qr, w, lat[..., :7], kr, lens), (qn, qr, w, lat, kr[..., :1],
                 lens), (qn, qr, w, lat, kr, lens[:1]), (qn, qr, w[..., :4], lat, kr, lens)]:
        with pytest.raises(ValueError, match=r"attend_latent: float32 q_nope \[B, N, P\]"):
            attend_latent(*args, 1.0)


def test_native_absorbed_mla_is_golden_and_decodes_in_the_latent_kernel():
    """Absorbed MLA with backend='native': a prefill of 3 tokens (XLA's absorbed einsums) then
    token-by-token decode at batch 2 (the latent kernel, one call per layer) equal the XLA
    model's full forward; the XLA model's decode has no such call."""
    cfg = tiny(attention="mla", mla_absorb=True, n_layers=2)
    xla = refmodel.init(cfg, seed=0)
    native = backends.use(xla, "native")
    toks = tokens(cfg, 2, 12, seed=1)
    got, want = incremental_logits(native, toks, [3]), refmodel.forward(xla, toks)
    assert_logits_close(got, want, tol=3e-5)
    np.testing.assert_array_equal(np.asarray(got.argmax(-1)), np.asarray(want.argmax(-1)))
    attn = native.blocks[0].attn  # the 3-D projections in panels, wkv_b as declared
    assert isinstance(attn.wo[...], kernels.Panels) and attn.wo[...].declared == (
        cfg.n_heads, cfg.v_head_dim, cfg.d_model)
    assert not isinstance(attn.wkv_b[...], kernels.Panels)
    for model, calls in ((native, 2), (xla, 0)):
        phases = refmodel.Phases(model)
        text = phases.jitted["decode"].lower(*phases.example_args("decode", 2, 5)).as_text()
        assert text.count(build.TARGETS["AttendLatentF32"]) == calls


@pytest.mark.parametrize("shape, contract", [((24, 3, 8), 1), ((3, 8, 24), 2), ((5, 2, 3, 7), 2)])
def test_a_weight_over_several_axes_is_the_panels_of_its_matrix(shape, contract):
    """MLA's wq [D, N, H] (one input axis) and wo [N, U, D] (two): stored as the matrix
    [prod(inputs), prod(outputs)] in panels, multiplied by the kernel as x [..., n_in] @ w, and
    dequantized to the declared shape."""
    w = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
    stored = kernels.Panels.of(jnp.asarray(w), 0, contract)
    k = int(np.prod(shape[:contract]))
    assert stored.shape == (k, w.size // k) and stored.declared == shape
    np.testing.assert_array_equal(np.asarray(stored.dequantize()), w)
    x = np.random.default_rng(1).standard_normal((3, k)).astype(np.float32)
    np.testing.assert_allclose(np.asarray(jnp.asarray(x) @ stored), x @ w.reshape(k, -1),
                               rtol=1e-5, atol=1e-5)


def sparse_oracle(q, k, v, qi, wi, ki, lens, top_k, scale):
    """Sparse attention in float64 numpy, query by query: the indexer's scores over the keys
    it sees, the top_k of them (equal scores to the earlier key), softmax attention over them."""
    q, k, v, qi, wi, ki = (np.asarray(a, np.float64) for a in (q, k, v, qi, wi, ki))
    out = np.zeros_like(q)
    for b, t in np.ndindex(*q.shape[:2]):
        n = int(lens[b, t])
        score = (wi[b, t][:, None] * np.maximum(qi[b, t] @ ki[b, :n].T, 0)).sum(0)  # [n]
        picks = np.sort(sorted(range(n), key=lambda s: (-score[s], s))[:top_k])
        s = scale * np.einsum("kgh,kjh->kgj", q[b, t], k[b][:, picks])
        p = np.exp(s - s.max(-1, keepdims=True))
        out[b, t] = np.einsum("kgj,kjh->kgh", p / p.sum(-1, keepdims=True), v[b][:, picks])
    return out


@settings(max_examples=15, deadline=None)
@given(B=st.integers(1, 3), T=st.integers(1, 5), K=st.integers(1, 3), G=st.integers(1, 5),
       H=st.sampled_from([1, 8, 16, 32, 33, 64, 128]), S=st.integers(1, 600), I=st.integers(1, 4),
       J=st.sampled_from([1, 5, 16, 64]), top_k=st.integers(1, 300),
       ties=st.sampled_from(["none", "all", "some"]),
       seed=st.integers(0, 2**16))
def test_sparse_attention_equals_top_k_attention(B, T, K, G, H, S, I, J, top_k, ties, seed):
    """The sparse attention kernel (sparse.cc) against float64 numpy: several queries per
    sequence, each its own number of visible keys (more or fewer than top_k), indexer keys in
    several blocks of 256, and ties: indexer keys of zeros ("all": every score ties and the
    earliest keys must be the picks, as jax.lax.top_k picks them) or drawn from three rows
    ("some": at most three scores, integers, the k-th inside a run of equal ones). Head sizes
    of whole vectors sum the values in registers, query heads in groups of 4 (2 at 8 vectors)
    and a remainder."""
    from refmodel.kernels.sparse import sparse_attend

    rng = np.random.default_rng(seed)
    q = rng.standard_normal((B, T, K, G, H)).astype(np.float32)
    k = (2 * rng.standard_normal((B, K, S, H))).astype(np.float32)
    v = rng.standard_normal((B, K, S, H)).astype(np.float32)
    qi = rng.standard_normal((B, T, I, J)).astype(np.float32)
    wi = rng.standard_normal((B, T, I)).astype(np.float32)
    ki = rng.standard_normal((B, S, J)).astype(np.float32)
    if ties == "all":
        ki = np.zeros_like(ki)
    elif ties == "some":  # small integers: every score exact, so equal rows tie exactly
        qi, wi = (rng.integers(-2, 3, x.shape).astype(np.float32) for x in (qi, wi))
        rows = rng.integers(-2, 3, (B, 3, J)).astype(np.float32)
        ki = rows[np.arange(B)[:, None], rng.integers(0, 3, (B, S))]
    lens = rng.integers(1, S + 1, (B, T)).astype(np.int32)
    scale = float(H ** -0.5)
    got = jax.jit(sparse_attend, static_argnums=(7, 8))(q, k, v, qi, wi, ki, lens, top_k, scale)
    np.testing.assert_allclose(np.asarray(got),
                               sparse_oracle(q, k, v, qi, wi, ki, lens, top_k, scale),
                               rtol=2e-5, atol=2e-5)


@pytest.mark.parametrize("H", [16, 32, 64, 128])
@pytest.mark.parametrize("G", [1, 3, 5])
def test_sparse_attention_register_sums_every_head_size_and_group(H, G):
    """Every whole-vector head size (1, 2, 4, 8 vectors with AVX-512) with one query head,
    a group short of 4, and groups plus a remainder (5 = 4 + 1, or 2 + 2 + 1 at 8 vectors)."""
    test_sparse_attention_equals_top_k_attention.hypothesis.inner_test(
        B=2, T=2, K=2, G=G, H=H, S=300, I=2, J=16, top_k=40, ties="none", seed=H + G)


@pytest.mark.parametrize("top_k", [1, 50, 150, 299])
def test_sparse_attention_ties_at_the_kth_score_go_to_the_earlier_keys(top_k):
    """Indexer keys drawn from three rows: the k-th score falls inside a run of equal scores,
    and the picks among them must be the earliest (the selection's threshold pass)."""
    test_sparse_attention_equals_top_k_attention.hypothesis.inner_test(
        B=2, T=3, K=2, G=3, H=64, S=300, I=2, J=16, top_k=top_k, ties="some", seed=top_k)


def test_sparse_attention_refuses_wrong_shapes_and_dtypes():
    from refmodel.kernels.sparse import sparse_attend

    q, kv = jnp.zeros((2, 1, 1, 2, 8), jnp.float32), jnp.zeros((2, 1, 6, 8), jnp.float32)
    qi, wi, ki = jnp.zeros((2, 1, 3, 4)), jnp.zeros((2, 1, 3)), jnp.zeros((2, 6, 4))
    lens = jnp.ones((2, 1), jnp.int32)
    for args in [(q.astype(jnp.bfloat16), kv, kv, qi, wi, ki, lens, 4),
                 (q, kv, kv[..., :4], qi, wi, ki, lens, 4),
                 (q, kv, kv, qi, wi[..., :2], ki, lens, 4),
                 (q, kv, kv, qi, wi, ki[:, :5], lens, 4), (q, kv, kv, qi, wi, ki, lens[:1], 4),
                 (q, kv, kv, qi, wi, ki, lens, 0)]:
        with pytest.raises(ValueError, match=r"sparse_attend: float32 q \[B, T, K, G, H\]"):
            sparse_attend(*args, 1.0)


def test_native_sparse_attention_is_golden_and_runs_in_the_sparse_kernel():
    """Sparse attention with backend='native' and top_k below the context: a prefill of 3
    tokens then token-by-token decode at batch 2, and the cache-free forward, all in the
    kernel (one call per layer), equal the XLA model's full forward; the XLA model has no such
    call."""
    cfg = tiny(attention="sparse", n_layers=2, sparse_top_k=4)
    xla = refmodel.init(cfg, seed=0)
    native = backends.use(xla, "native")
    toks = tokens(cfg, 2, 14, seed=1)
    want = refmodel.forward(xla, toks)
    for got in (incremental_logits(native, toks, [3]), refmodel.forward(native, toks)):
        assert_logits_close(got, want, tol=3e-5)
        np.testing.assert_array_equal(np.asarray(got.argmax(-1)), np.asarray(want.argmax(-1)))
    for model, calls in ((native, 2), (xla, 0)):
        phases = refmodel.Phases(model)
        for phase in ("decode", "prefill"):
            text = phases.jitted[phase].lower(*phases.example_args(phase, 2, 9)).as_text()
            assert text.count(build.TARGETS["SparseAttendF32"]) == calls
