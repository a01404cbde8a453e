"""Each kernel's analytic FLOPs and bytes against an independent count from its jaxpr, and
its values against a numpy re-implementation."""

import math

import jax
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from microbench import harness
from microbench.roofs import bandwidth, compute, intensity

ELEMENTWISE = {"mul", "add", "sub"}


def _size(var) -> int:
    return math.prod(var.aval.shape)


def _eqns(jaxpr):
    for eqn in jaxpr.eqns:
        sub = eqn.params.get("jaxpr")
        if sub is not None:  # pjit / closed_call: count inside
            yield from _eqns(getattr(sub, "jaxpr", sub))
        else:
            yield eqn


def jaxpr_counts(fn, *args):
    """(FLOPs, bytes) from the jaxpr: arithmetic per output element; bytes of the inputs that
    are used plus the outputs."""
    closed = jax.make_jaxpr(fn)(*args)
    flops = 0
    for eqn in _eqns(closed.jaxpr):
        name, out = eqn.primitive.name, eqn.outvars[0]
        if name in ELEMENTWISE:
            flops += _size(out)
        elif name == "dot_general":
            (contract, _), _ = eqn.params["dimension_numbers"]
            k = math.prod(eqn.invars[0].aval.shape[d] for d in contract)
            flops += 2 * _size(out) * k
        elif name == "reduce_sum":
            flops += _size(eqn.invars[0]) - _size(out)
    used = {v for eqn in _eqns(closed.jaxpr) for v in eqn.invars}
    used |= set(closed.jaxpr.outvars)
    nbytes = sum(_size(v) * v.aval.dtype.itemsize for v in closed.jaxpr.invars if v in used)
    nbytes += sum(_size(v) * v.aval.dtype.itemsize for v in closed.jaxpr.outvars)
    return flops, nbytes


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "int8", "float8_e4m3fn"])
@pytest.mark.parametrize("m, k, n", [(8, 8, 8), (64, 16, 4), (3, 5, 7)])
def test_gemm_counts_match_jaxpr(dtype, m, k, n):
    fn, label = compute.gemm_fn(dtype)
    a, b = compute.gemm_inputs(m, k, n, dtype)
    assert jaxpr_counts(fn, a, b) == (compute.gemm_flops(m, k, n),
                                      compute.gemm_bytes(m, k, n, dtype))
    assert dtype in label


def test_gemm_float32_runs_at_highest_precision_and_matches_numpy():
    fn, label = compute.gemm_fn("float32")
    assert "HIGHEST" in label
    a, b = compute.gemm_inputs(32, 48, 16, "float32")
    np.testing.assert_allclose(np.asarray(jax.jit(fn)(a, b)),
                               np.asarray(a, np.float64) @ np.asarray(b, np.float64),
                               rtol=1e-5, atol=1e-4)


def test_int8_gemm_accumulates_in_int32_exactly():
    fn, _ = compute.gemm_fn("int8")
    a, b = compute.gemm_inputs(16, 64, 8, "int8")
    got = np.asarray(jax.jit(fn)(a, b))
    assert got.dtype == np.int32
    np.testing.assert_array_equal(got, np.asarray(a, np.int64) @ np.asarray(b, np.int64))


def _fma_numpy(x, a, b, K, k):
    accs = [x.astype(np.float64)] * k
    for _ in range(K):
        accs = [acc * a[i] + b for i, acc in enumerate(accs)]
    return sum(accs)


@settings(max_examples=15, deadline=None)
@given(K=st.integers(1, 6), k=st.integers(1, 4), n=st.integers(1, 40))
def test_fma_chain_counts_and_values(K, k, n):
    x, a, b = compute.fma_inputs(n, k, "float32")
    fn = compute.fma_chain_fn(K, k)
    assert jaxpr_counts(fn, x, a, b) == (compute.fma_flops(n, K, k),
                                        compute.fma_bytes(n, k, "float32"))
    want = _fma_numpy(np.asarray(x), np.asarray(a, np.float64), float(b), K, k)
    np.testing.assert_allclose(np.asarray(jax.jit(fn)(x, a, b)), want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("K, k", intensity.POINTS)
def test_intensity_is_flops_over_bytes(K, k):
    n = 1 << 20
    per_element = intensity.flops(n, K, k) / (intensity.bytes_moved(n, k) - 4 * (k + 1))
    assert intensity.intensity(K, k) == pytest.approx(per_element)


def test_intensity_points_span_a_wide_range():
    ai = [intensity.intensity(K, k) for K, k in intensity.POINTS]
    assert ai == sorted(ai) and ai[0] <= 0.25 and ai[-1] >= 500


@pytest.mark.parametrize("name", list(bandwidth.KERNELS))
def test_stream_counts_match_jaxpr_and_numpy(name):
    kern, n = bandwidth.KERNELS[name], 1000
    args = bandwidth.kernel_args(kern, n)
    flops, nbytes = jaxpr_counts(kern.fn, *args)
    assert flops == bandwidth.kernel_flops(kern, n)
    assert nbytes == bandwidth.kernel_bytes(kern, n, 4, donated=False)["algorithmic"]
    host = [np.asarray(x, np.float64) for x in args]
    want = {"read": lambda: host[0].sum(), "write": lambda: np.full(n, host[1]),
            "copy": lambda: host[1], "scale": lambda: host[1] * host[0],
            "add": lambda: host[0] + host[1], "triad": lambda: host[1] + host[3] * host[2]}
    np.testing.assert_allclose(np.asarray(jax.jit(kern.fn)(*args)), want[name](), rtol=2e-5,
                               atol=1e-3)


@pytest.mark.parametrize("name, donated, extra", [
    ("scale", False, 1), ("scale", True, 0),   # in place: the line was just read
    ("add", True, 0), ("triad", True, 1),      # triad's destination is not read
    ("write", True, 1), ("copy", False, 1), ("read", False, 0),
])
def test_write_allocate_convention(name, donated, extra):
    kern, n = bandwidth.KERNELS[name], 100
    b = bandwidth.kernel_bytes(kern, n, 4, donated)
    assert b["write_allocate"] - b["algorithmic"] == extra * 4 * n


@pytest.mark.parametrize("name", [k for k, v in bandwidth.KERNELS.items() if v.can_donate])
def test_donated_kernels_write_in_place(name):
    kern = bandwidth.KERNELS[name]
    args = bandwidth.kernel_args(kern, 256)
    compiled = harness.compile_fn(kern.fn, *args, donate_argnums=(0,))
    assert "input_output_alias" in compiled.as_text()


def test_sweep_kernel_makes_r_passes():
    x, s = bandwidth.kernel_args(bandwidth.KERNELS["scale"], 64)
    out = jax.jit(bandwidth.sweep_fn(5))(x, s)
    np.testing.assert_allclose(np.asarray(out), np.asarray(x) * float(s) ** 5, rtol=1e-6)
    assert bandwidth.sweep_bytes(64, 4, 5) == 2 * 64 * 4 * 5 + 4
    assert bandwidth.sweep_repeats(1 << 30) == 1
    assert bandwidth.sweep_repeats(4096) * 2 * 4096 >= 32 << 20


def test_native_low_precision_detection():
    native = compute._native_low_precision
    assert native({"backend": "cpu", "isa_flags": {"avx512_vnni": True}}) == {
        "int8": "cpu flag avx512_vnni"}
    assert native({"backend": "cpu", "isa_flags": {"avx2": True}}) == {}
    gpu = native({"backend": "gpu", "compute_capability": "9.0"})
    assert set(gpu) == {"int8", "float8_e4m3fn"}
    assert set(native({"backend": "gpu", "compute_capability": "8.0"})) == {"int8"}
    assert set(native({"backend": "tpu", "device_kind": "TPU v5 lite"})) == {"int8"}
