"""Compute roofs: the matrix unit (GEMM per dtype) and the vector unit (an FMA chain).

GEMM: `C = A @ B` for square and tall-skinny shapes, per dtype the device runs natively
(float32 and bfloat16 everywhere; int8 and fp8 only where the ISA or device advertises them,
detected by `gemm_dtypes`, then confirmed by compiling a tiny product). Precision is set
explicitly: float32 at `Precision.HIGHEST`, so a GPU cannot silently run it as TF32 nor a TPU
as bf16 passes; the label says what ran. FLOPs 2MKN; bytes are the algorithmic minimum (read
A and B once, write C once).

Vector unit: the ERT/mixbench FMA kernel. Each element starts k independent chains of K
multiply-adds (`acc = acc * a_i + b`), unrolled in Python so XLA fuses everything into one
loop (a `fori_loop` would not fuse), then sums the chains: 2Kk + (k - 1) FLOPs per element;
sweeping K moves the arithmetic intensity, sweeping k the instruction-level parallelism.
Every array and scalar is an argument, so nothing is constant-folded.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from microbench import hardware

# ------------------------------------------------------------------------------ GEMM

_ACC = {"int8": jnp.int32, "float8_e4m3fn": jnp.float32}
PRECISION = {"float32": jax.lax.Precision.HIGHEST}


def gemm_out_dtype(dtype: str):
    return _ACC.get(dtype, jnp.dtype(dtype))


def gemm_fn(dtype: str):
    """C = A @ B with explicit precision and accumulator; returns (fn, label)."""
    precision = PRECISION.get(dtype, jax.lax.Precision.DEFAULT)
    out = gemm_out_dtype(dtype)

    def gemm(a, b):  # a [M, K], b [K, N] -> [M, N]
        return jax.lax.dot(a, b, precision=precision, preferred_element_type=out)

    label = f"{dtype} inputs, {jnp.dtype(out).name} output, precision={precision.name}"
    return gemm, label


def gemm_flops(m: int, k: int, n: int) -> int:
    return 2 * m * k * n


def gemm_bytes(m: int, k: int, n: int, dtype: str) -> int:
    item = jnp.dtype(dtype).itemsize
    return item * (m * k + k * n) + jnp.dtype(gemm_out_dtype(dtype)).itemsize * m * n


def gemm_inputs(m: int, k: int, n: int, dtype: str, seed: int = 0):
    """Random normal A and B (never zeros or ones), cast to dtype."""
    rng = np.random.default_rng(seed)
    a = rng.standard_normal((m, k), dtype=np.float32)
    b = rng.standard_normal((k, n), dtype=np.float32)
    if dtype == "int8":
        a, b = np.clip(a * 32, -127, 127), np.clip(b * 32, -127, 127)
    return jnp.asarray(a).astype(dtype), jnp.asarray(b).astype(dtype)


def _native_low_precision(env: dict) -> dict[str, str]:
    """{dtype: why we think it is native} for int8 and fp8 from the environment block."""
    out = {}
    backend, flags = env.get("backend"), env.get("isa_flags") or {}
    if backend == "cpu":
        for flag in ("amx_int8", "avx512_vnni", "avx_vnni", "i8mm"):
            if flags.get(flag):
                out["int8"] = f"cpu flag {flag}"
                break
        if flags.get("amx_fp8"):
            out["float8_e4m3fn"] = "cpu flag amx_fp8"
        return out
    cc = env.get("compute_capability")
    if backend == "gpu" and cc:
        major, minor = (int(x) for x in str(cc).split(".")[:2])
        if (major, minor) >= (7, 5):
            out["int8"] = f"compute capability {cc} >= 7.5"
        if (major, minor) >= (8, 9):
            out["float8_e4m3fn"] = f"compute capability {cc} >= 8.9"
        return out
    spec = hardware.device_for_environment(env)
    if spec is not None:
        for key, dtype in (("int8", "int8"), ("float8", "float8_e4m3fn")):
            if key in spec.peak_flops:
                out[dtype] = f"{spec.name} spec lists a {key} peak"
    return out


def _compiles(dtype: str) -> bool:
    fn, _ = gemm_fn(dtype)
    try:
        a, b = gemm_inputs(16, 16, 16, dtype)
        jax.block_until_ready(jax.jit(fn)(a, b))
        return True
    except Exception:  # noqa: BLE001 - an unsupported dtype fails in many ways
        return False


def gemm_dtypes(env: dict) -> dict[str, str]:
    """{dtype: why it is measured}: float32 and bfloat16 always, int8/fp8 when native."""
    out = {"float32": "always", "bfloat16": "always"}
    for dtype, why in _native_low_precision(env).items():
        if _compiles(dtype):
            out[dtype] = why
    return out


# ------------------------------------------------------------------------------ FMA chain

def fma_chain(x, a, b, *, K: int, k: int):
    """k chains of K FMAs per element of x [n]; a [k] multipliers, b [] addend -> [n]."""
    accs = [x] * k
    for _ in range(K):
        accs = [acc * a[i] + b for i, acc in enumerate(accs)]
    out = accs[0]
    for acc in accs[1:]:
        out = out + acc
    return out


@functools.cache
def fma_chain_fn(K: int, k: int):
    return functools.partial(fma_chain, K=K, k=k)


def fma_flops(n: int, K: int, k: int) -> int:
    return n * (2 * K * k + k - 1)


def fma_bytes(n: int, k: int, dtype: str) -> int:
    """Read x, a and b, write the result."""
    return jnp.dtype(dtype).itemsize * (2 * n + k + 1)


def fma_inputs(n: int, k: int, dtype: str, seed: int = 0):
    """x ~ N(0,1); multipliers a_i in [0.95, 0.999] so values stay bounded for any K."""
    rng = np.random.default_rng(seed)
    x = jnp.asarray(rng.standard_normal(n, dtype=np.float32)).astype(dtype)
    a = jnp.asarray(rng.uniform(0.95, 0.999, size=k).astype(np.float32)).astype(dtype)
    b = jnp.asarray(np.float32(0.01)).astype(dtype)
    return x, a, b
