"""The integer dot kernel (refmodel/kernels/qdot.cc): int8 and int4 weights with activations
rounded to int8 per block of 32, against a numpy oracle of the same arithmetic (every row
count 1-16, odd K, outputs ending inside a panel), the layout round trip, the model built on
it (golden, and equal to the XLA reference of the same format), and the portable build without
an int8 dot instruction."""

from __future__ import annotations

import ctypes
import platform
import subprocess

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import refmodel
from conftest import incremental_logits, tiny, tokens
from refmodel import backends, kernels, ops, quant
from refmodel.kernels import build, qdot

pytestmark = pytest.mark.skipif(not kernels.available(),
                                reason=f"native kernels not built: {build.why_not()}")


def oracle(x: np.ndarray, q: quant.Quantized) -> np.ndarray:
    """x rounded per block of 32 as the kernel documents (float32 s = max|x| / 127, x / s
    rounded half to even), then each block's exact integer dot with the stored values, scaled
    by both scales, summed in float64."""
    M, K = x.shape
    n_pad = -(-K // 32) * 32
    xb = np.pad(x, ((0, 0), (0, n_pad - K))).reshape(M, -1, 32)
    amax = np.abs(xb).max(-1)
    s = np.where(amax > 0, amax / np.float32(127), np.float32(1)).astype(np.float32)
    xq = np.clip(np.rint(xb / s[..., None]), -127, 127).astype(np.int64)  # [M, G, 32]
    v = np.asarray(quant.unpack(q)).astype(np.int64)  # [n, n_pad or K]
    v = np.pad(v, ((0, 0), (0, n_pad - v.shape[1]))).reshape(v.shape[0], -1, 32)  # [n, G, 32]
    blocks = np.einsum("mgj,ngj->mng", xq, v).astype(np.float64)  # exact integer sums
    ws = np.asarray(q.scale, np.float64)  # [n] or [n, G]
    ws = ws[None, :, None] if ws.ndim == 1 else ws[None]
    return (blocks * s[:, None, :] * ws).sum(-1)


def kernel(x: np.ndarray, w: np.ndarray, fmt: str) -> tuple[np.ndarray, quant.Quantized]:
    q = quant.quantize_matrix(jnp.asarray(w), fmt, acts=True)
    return np.asarray(jnp.asarray(x) @ qdot.QuantPanels.of_quantized(q)), q


@pytest.mark.parametrize("fmt", ["int8", "int4"])
@pytest.mark.parametrize("m", range(1, 17))
def test_every_row_count_equals_the_integer_oracle(m, fmt):
    """1-16 rows: 4 panels side by side (1 row), 2 (2-3), one panel in passes of up to 6 rows
    and the passes after; K = 101 (the last block zero-padded), N = 333 (the last panel ends
    inside a vector) and 288 (whole panels)."""
    rng = np.random.default_rng(m)
    for n in (333, 288):
        x = rng.standard_normal((m, 101)).astype(np.float32)
        w = rng.standard_normal((101, n)).astype(np.float32)
        got, q = kernel(x, w, fmt)
        want = oracle(x, q)
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * np.abs(want).max())


@settings(max_examples=20, deadline=None)
@given(m=st.integers(1, 40), k=st.integers(1, 200), n=st.integers(1, 200),
       fmt=st.sampled_from(["int8", "int4"]), seed=st.integers(0, 2**16),
       zero_row=st.booleans())
def test_any_shape_equals_the_integer_oracle(m, k, n, fmt, seed, zero_row):
    """Any K (blocks padded), N, rows, and an all-zero row (scale 1, every product 0)."""
    rng = np.random.default_rng(seed)
    # float32 after the scaling: a float64 x, rounded by the oracle at float64, can fall on the
    # other side of a tie than the float32 the kernel receives
    x = (rng.standard_normal((m, k)) * 10.0 ** rng.integers(-3, 3)).astype(np.float32)
    if zero_row:
        x[0] = 0
    w = rng.standard_normal((k, n)).astype(np.float32)
    got, q = kernel(x, w, fmt)
    want = oracle(x, q)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * max(np.abs(want).max(), 1e-30))


@pytest.mark.parametrize("fmt", ["int8", "int4"])
def test_kernel_equals_the_xla_reference_and_the_dequantized_product(fmt):
    """The kernel computes quant.matmul's activations=True arithmetic (the XLA path), which is
    the dequantized weight times quant.round_activations(x)."""
    rng = np.random.default_rng(0)
    x = jnp.asarray(rng.standard_normal((5, 70)), jnp.float32)
    q = quant.quantize_matrix(jnp.asarray(rng.standard_normal((70, 45)), jnp.float32), fmt,
                              acts=True)
    got = x @ qdot.QuantPanels.of_quantized(q)
    np.testing.assert_allclose(got, x @ q, rtol=1e-5, atol=1e-5)
    rounded = quant.round_activations(x) @ q.dequantize()
    np.testing.assert_allclose(got, rounded, rtol=1e-5, atol=1e-5)


@settings(max_examples=10, deadline=None)
@given(k=st.integers(1, 100), n=st.integers(1, 100), fmt=st.sampled_from(["int8", "int4"]),
       seed=st.integers(0, 2**16))
def test_layout_round_trips(k, n, fmt, seed):
    """`pack` then `values`/`dequantize` give the stored numbers and the float weight back."""
    w = jnp.asarray(np.random.default_rng(seed).standard_normal((k, n)), jnp.float32)
    q = quant.quantize_matrix(w, fmt, acts=True)
    panels = qdot.QuantPanels.of_quantized(q)
    np.testing.assert_array_equal(np.asarray(panels.dequantize()), np.asarray(q.dequantize()))
    assert panels.w.dtype == jnp.uint8 and panels.w.shape[0] == -(-n // 32)


def test_weights_are_int8_and_int4_sized():
    """Bytes as the formats promise: int8 one byte per weight plus a float32 per output, int4
    half a byte plus a float16 per 32 inputs (whole panels of 32 outputs)."""
    w = jnp.ones((1024, 256), jnp.float32)
    b8 = qdot.QuantPanels.of_quantized(quant.quantize_matrix(w, "int8", acts=True)).nbytes
    b4 = qdot.QuantPanels.of_quantized(quant.quantize_matrix(w, "int4", acts=True)).nbytes
    assert b8 == 1024 * 256 + 4 * 256
    assert b4 == 1024 * 256 // 2 + 2 * 256 * 1024 // 32


@pytest.mark.parametrize("fmt", ["int8", "int4"])
@pytest.mark.parametrize("m", [1, 2, 5, 9])
def test_weights_taken_together_equal_each_taken_alone(m, fmt):
    """`ops.contract_each` over QuantPanels is one kernel call (x rounded once, one parallel
    region over every weight's panels): the numbers of one call per weight, bit for bit, for
    weights of 3 different widths (declared over two axes, as q, k and v are) and the
    oracle's."""
    rng = np.random.default_rng(m)
    x = rng.standard_normal((2, m, 101)).astype(np.float32)
    shapes = [(101, 4, 40), (101, 2, 40), (101, 2, 16)]
    qs = [quant.quantize_matrix(jnp.asarray(rng.standard_normal(s).astype(np.float32)), fmt,
                                acts=True) for s in shapes]
    ws = [qdot.QuantPanels.of_quantized(q) for q in qs]
    together = jax.jit(lambda x, ws: ops.contract_each(x, ws))(jnp.asarray(x), ws)
    assert "qrows_many" in jax.jit(lambda x, ws: ops.contract_each(x, ws)).lower(
        jnp.asarray(x), ws).as_text()
    for y, w, q, s in zip(together, ws, qs, shapes, strict=True):
        assert y.shape == (2, m) + s[1:]
        np.testing.assert_array_equal(np.asarray(y), np.asarray(ops.contract(jnp.asarray(x), w)))
        want = oracle(x.reshape(-1, 101), q).reshape(y.shape)
        np.testing.assert_allclose(np.asarray(y), want, rtol=1e-5,
                                   atol=1e-5 * np.abs(want).max())


def test_weights_of_two_formats_or_inputs_are_taken_one_by_one():
    """A mix the kernel cannot take in one call (int8 beside int4, or two input sizes) falls
    back to one product per weight, with the same numbers."""
    rng = np.random.default_rng(0)
    x = jnp.asarray(rng.standard_normal((3, 64)).astype(np.float32))

    def panels(k, n, fmt):
        w = jnp.asarray(rng.standard_normal((k, n)).astype(np.float32))
        return qdot.QuantPanels.of_quantized(quant.quantize_matrix(w, fmt, acts=True))

    mixed = [panels(64, 32, "int8"), panels(64, 48, "int4")]
    assert qdot.QuantPanels.contract_each(x, mixed, 1) is NotImplemented
    for y, w in zip(ops.contract_each(x, mixed), mixed, strict=True):
        np.testing.assert_array_equal(np.asarray(y), np.asarray(x @ w))
    wide = panels(96, 32, "int8")
    assert qdot.QuantPanels.contract_each(x, [mixed[0], wide], 1) is NotImplemented
    with pytest.raises(ValueError, match="qrows: .*n_in=64"):
        qdot.qrows_each(x, [(wide.w, wide.scale, 32)], "int8")


def test_refuses_what_it_cannot_compute():
    w = jnp.ones((64, 32), jnp.float32)
    with pytest.raises(ValueError, match="int8 activations"):
        qdot.QuantPanels.of_quantized(quant.quantize_matrix(w, "int8"))
    with pytest.raises(ValueError, match="int8 activations"):
        qdot.QuantPanels.of_quantized(quant.quantize_matrix(w, "float8"))
    with pytest.raises(ValueError, match="no stacked axes"):
        qdot.QuantPanels.of_quantized(quant.quantize_matrix(jnp.ones((2, 64, 32)), "int8",
                                                            lead=1, acts=True))
    panels = qdot.QuantPanels.of_quantized(quant.quantize_matrix(w, "int4", acts=True))
    with pytest.raises(ValueError, match="qrows: .*n_in=65"):
        qdot.qrows(jnp.ones((1, 65)), panels.w, None, 32, "int4")
    with pytest.raises(ValueError, match="fmt='int2'"):
        qdot.qrows(jnp.ones((1, 64)), panels.w, None, 32, "int2")
    with pytest.raises(ValueError, match="int4' \\(none\\)"):
        qdot.qrows(jnp.ones((1, 64)), panels.w, jnp.ones(32), 32, "int4")


def assert_close_but_for_rounding_flips(got, want, tol=1e-4, flip=0.1, most=0.9):
    """Positions whose activations round alike in both programs agree to float rounding (tol,
    of logits of rms ~1). A last-bit difference upstream (the prefill and decode attention
    kernels sum in different orders) can move one activation across a rounding boundary: that
    position's logits then move by about one rounding step of that activation times the weights
    reading it (~2e-2 here). At most 1 - `most` of the positions may, and by at most `flip`;
    the others must also pick the same greedy token."""
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    worst = np.abs(got - want).max(-1)  # [B, T]
    same = worst <= tol * max(1.0, float(np.sqrt(np.mean(want ** 2))))
    assert same.mean() >= most, f"only {same.mean():.0%} of positions agree: {worst}"
    assert worst.max() <= flip, f"a position moved by {worst.max():.3g} > {flip}"
    np.testing.assert_array_equal(got.argmax(-1)[same], want.argmax(-1)[same])


@pytest.mark.parametrize("fmt", ["int8", "int4"])
def test_model_is_golden_and_equals_the_xla_model_of_its_format(fmt):
    """quantize(model, fmt, activations=True) then backends.use(.., "native"): every x @ w in
    the kernel. A prefill of 3 tokens then batch-2 decode equals the native model's own full
    forward (golden) and the XLA model of the same format, but for rare rounding flips."""
    cfg = tiny(attention="gqa", n_layers=2)
    xla = quant.quantize(refmodel.init(cfg, seed=0), weights=fmt, activations=True)
    native = backends.use(xla, "native")
    assert isinstance(native.blocks[0].attn.wq[...], qdot.QuantPanels)
    assert isinstance(native.blocks[0].ffn.w_up[...], qdot.QuantPanels)
    toks = tokens(cfg, 2, cfg.window + 3, seed=1)
    got = incremental_logits(native, toks, [3])
    assert_close_but_for_rounding_flips(got, refmodel.forward(native, toks))
    assert_close_but_for_rounding_flips(got, refmodel.forward(xla, toks))


def test_config_takes_native_int4_only_with_int8_activations():
    assert tiny(backend="native", weight_format="int4",
                quant_activations=True).weight_format == "int4"
    with pytest.raises(ValueError, match="'int4' with quant_activations=True"):
        tiny(backend="native", weight_format="int4")


def test_int8_dot_names_the_cpus_instruction():
    flags = open("/proc/cpuinfo").read().split() if platform.system() == "Linux" else []
    want = ("avx512_vnni" if "avx512_vnni" in flags and "avx512f" in flags
            else "avx_vnni" if "avx_vnni" in flags and "avx512f" not in flags else None)
    if platform.machine() in ("x86_64", "AMD64"):
        assert qdot.int8_dot() == want
    else:
        assert qdot.int8_dot() is None


# Builds of qdot.cc for CPUs this one is not: AVX-512 without VNNI, and AVX2 without VNNI or
# F16C (16 registers, one row per pass, the scales converted in plain C++).
PORTABLE = {"avx512-no-vnni": ["-mno-avx512vnni", "-mno-avxvnni"],
            "avx2-no-vnni-no-f16c": ["-mno-avx512f", "-mno-avxvnni", "-mno-f16c"]}


@pytest.mark.skipif(platform.machine() not in ("x86_64", "AMD64"),
                    reason="the portable path is the only one built off x86")
@pytest.mark.parametrize("cpu", PORTABLE)
def test_portable_build_without_vnni_computes_the_same(tmp_path, cpu):
    """qdot.cc built without VNNI (its `dpbusd` in plain integer vector arithmetic, as on a CPU
    without the instruction) gives the oracle's numbers too."""
    cxx = build.compiler()
    lib = tmp_path / "qdot_portable.so"
    cmd = [cxx, *build.FLAGS, *PORTABLE[cpu], "-isystem",
           jax.ffi.include_dir(), str(build.HERE / "qdot.cc"), "-o", str(lib)]
    subprocess.run(cmd, check=True, capture_output=True, timeout=300)
    so = ctypes.cdll.LoadLibrary(str(lib))
    assert so.refmodel_int8_dot() == 0
    for fmt, symbol in (("int8", "QRowsI8"), ("int4", "QRowsI4")):
        target = f"test_portable_{cpu}_{symbol}"
        jax.ffi.register_ffi_target(target, jax.ffi.pycapsule(getattr(so, symbol)),
                                    platform="cpu")
        rng = np.random.default_rng(1)
        x = rng.standard_normal((7, 70)).astype(np.float32)
        q = quant.quantize_matrix(jnp.asarray(rng.standard_normal((70, 45)), jnp.float32),
                                  fmt, acts=True)
        p = qdot.QuantPanels.of_quantized(q)
        args = (jnp.asarray(x), p.w) + ((p.scale,) if fmt == "int8" else ())
        got = jax.ffi.ffi_call(target, jax.ShapeDtypeStruct((7, 45), jnp.float32))(*args)
        want = oracle(x, q)
        np.testing.assert_allclose(np.asarray(got), want, rtol=1e-5,
                                   atol=1e-5 * np.abs(want).max())
