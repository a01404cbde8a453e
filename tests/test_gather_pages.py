"""The serving engine's page gather (refmodel/kernels/pages.py): the native kernel against
XLA's gather and against numpy indexing, for each page layout a variant's cache leaf gives
(GQA's head-major k/v, MLA's latent, a quantized cache's int8 values and scales), any page
order; its refusals; and the engine's choice between the two."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import tiny
from hypothesis import given, settings
from hypothesis import strategies as st

import refmodel
from refmodel import kernels
from refmodel.kernels import build
from refmodel.kernels.pages import gather_pages, gather_pages_native, gather_pages_xla
from refmodel.serving.engine import Engine, Layout

needs_kernels = pytest.mark.skipif(not kernels.available(),
                                   reason=f"native kernels not built: {build.why_not()}")


def numpy_gather(arr: np.ndarray, tables: np.ndarray, axis: int) -> np.ndarray:
    """The obvious oracle: pages in table order, concatenated along the token axis."""
    pages = arr[tables]  # [B, n, ...page]
    return np.concatenate([pages[:, i] for i in range(tables.shape[1])], axis=axis)


# page shapes (the leaf's axes without batch, page_size tokens) and token axis in the leaf
LAYOUTS = {
    "gqa k/v [K, page, H]": ((3, 4, 5), 2),
    "mla latent [page, R]": ((4, 6), 1),
    "int8 scale [K, page]": ((2, 4), 2),
    "two axes before [A, K, page, H]": ((2, 3, 4, 5), 3),
}
DTYPES = [np.float32, np.int8, jnp.bfloat16]


@needs_kernels
@settings(max_examples=12, deadline=None)
@given(layout=st.sampled_from(sorted(LAYOUTS)), dtype=st.sampled_from(range(len(DTYPES))),
       B=st.integers(1, 4), n=st.integers(1, 6), seed=st.integers(0, 2**16))
def test_native_gather_equals_xla_and_numpy(layout, dtype, B, n, seed):
    page, axis = LAYOUTS[layout]
    rng = np.random.default_rng(seed)
    P = 9
    arr = rng.integers(-100, 100, (P, *page)).astype(DTYPES[dtype])
    tables = rng.integers(0, P, (B, n)).astype(np.int32)  # repeats allowed (shared pages)
    want = numpy_gather(arr, tables, axis)
    got_xla = jax.jit(gather_pages_xla, static_argnums=2)(jnp.asarray(arr), tables, axis)
    got = jax.jit(gather_pages_native, static_argnums=2)(jnp.asarray(arr), tables, axis)
    assert got.dtype == got_xla.dtype == arr.dtype and got.shape == want.shape
    np.testing.assert_array_equal(np.asarray(got_xla), want)
    np.testing.assert_array_equal(np.asarray(got), want)


@needs_kernels
def test_native_gather_refuses_a_page_outside_the_array():
    arr = jnp.zeros((4, 2, 3, 5), jnp.float32)
    with pytest.raises(Exception, match="outside"):
        jax.block_until_ready(gather_pages_native(arr, np.array([[0, 4]], np.int32), 2))
    with pytest.raises(ValueError, match="tables int32"):
        gather_pages_native(arr, np.array([[0, 1]], np.int64), 2)
    with pytest.raises(ValueError, match="axis=4"):
        gather_pages_native(arr, np.array([[0, 1]], np.int32), 4)


def test_gather_pages_without_native_is_xla():
    """native=False is XLA's gather whatever the machine: the path of a machine without a
    compiler, and of accelerators (platform_dependent picks it there)."""
    arr = jnp.arange(4 * 2 * 3 * 5, dtype=jnp.float32).reshape(4, 2, 3, 5)
    tables = np.array([[3, 1], [0, 0]], np.int32)
    text = jax.jit(lambda a, t: gather_pages(a, t, 2, native=False)).lower(
        arr, tables).as_text()
    assert "custom_call" not in text
    np.testing.assert_array_equal(np.asarray(gather_pages(arr, tables, 2, native=False)),
                                  numpy_gather(np.asarray(arr), tables, 2))


def test_engine_gather_option():
    model = refmodel.init(tiny(), seed=0)
    with pytest.raises(ValueError, match="gather='fast'"):
        Engine(model, num_pages=8, gather="fast")
    assert Engine(model, num_pages=8, gather="xla").layout.native is False
    auto = Engine(model, num_pages=8)
    assert auto.gather == ("native" if kernels.available() else "xla")
    assert auto.layout == Layout.of(model.cfg, 16, native=auto.gather == "native")
