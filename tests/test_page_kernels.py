"""The serving engine's page kernels (refmodel/kernels/pages.py). The gather: the native
kernel against XLA's gather and numpy indexing, for each page layout a variant's cache leaf
gives (GQA's head-major k/v, MLA's latent, a quantized cache's int8 values and scales), any
page order. Paged decode attention: against softmax attention over the gathered keys in
float64, and `PagedKV` in a GQA layer against the contiguous decode. Refusals, and the
engine's choice of kernels."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import refmodel
from conftest import PAGED_TABLES, decode_over_pages, tiny
from refmodel import backends, kernels
from refmodel.kernels import build
from refmodel.kernels.pages import (
    gather_pages,
    gather_pages_native,
    gather_pages_xla,
    paged_attention,
)
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


def test_engine_uses_the_cpu_kernels_only_on_a_cpu_backend(monkeypatch):
    """The kernels are XLA:CPU custom calls: on an accelerator "auto" is XLA's path and
    "native" is refused, naming the backend."""
    model = refmodel.init(tiny(), seed=0)
    monkeypatch.setattr(jax, "default_backend", lambda: "gpu")
    assert Engine(model, num_pages=8).kernels == "xla"
    with pytest.raises(RuntimeError, match="backend is gpu"):
        Engine(model, num_pages=8, kernels="native")


def test_engine_gather_option():
    model = refmodel.init(tiny(), seed=0)
    with pytest.raises(ValueError, match="kernels='fast'"):
        Engine(model, num_pages=8, kernels="fast")
    assert Engine(model, num_pages=8, kernels="xla").layout.native is False
    auto = Engine(model, num_pages=8)
    assert auto.kernels == ("native" if kernels.available() else "xla")
    native = auto.kernels == "native"
    assert auto.layout == Layout.of(model.cfg, 16, native=native,
                                    pages="native" if native else None)


def attention_case(B, K, G, H, ps, n, seed):
    """Softmax attention over pages: the kernel's output and the float64 oracle's."""
    rng = np.random.default_rng(seed)
    P = 7
    q = rng.standard_normal((B, K, G, H)).astype(np.float32)
    k = (3 * rng.standard_normal((P, K, ps, H))).astype(np.float32)
    v = rng.standard_normal((P, K, ps, H)).astype(np.float32)
    tables = rng.integers(0, P, (B, n)).astype(np.int32)
    lens = rng.integers(1, n * ps + 1, B).astype(np.int32)
    check_attention(q, k, v, tables, lens, 1 / np.sqrt(H))


def check_attention(q, k, v, tables, lens, scale):
    """The kernel's output against the float64 oracle's, sequence by sequence."""
    got = np.asarray(jax.jit(paged_attention, static_argnums=5)(q, k, v, tables, lens, scale))
    B = q.shape[0]
    for b in range(B):
        kk = numpy_gather(k, tables[b:b + 1], 2)[0, :, :lens[b]]  # [K, S, H]
        vv = numpy_gather(v, tables[b:b + 1], 2)[0, :, :lens[b]]
        s = scale * np.einsum("kgh,klh->kgl", q[b].astype(np.float64), kk)
        p = np.exp(s - s.max(-1, keepdims=True))
        want = np.einsum("kgl,klh->kgh", p / p.sum(-1, keepdims=True), vv)
        np.testing.assert_allclose(got[b], want, rtol=2e-5, atol=2e-5)


@needs_kernels
@settings(max_examples=12, deadline=None)
@given(B=st.integers(1, 3), K=st.integers(1, 3), G=st.integers(1, 4), H=st.integers(1, 40),
       ps=st.integers(1, 20), n=st.integers(1, 5), seed=st.integers(0, 2**16))
def test_paged_attention_equals_softmax_attention(B, K, G, H, ps, n, seed):
    """Any head size (vector tails: the general path), page size (a page's scores padded to
    whole vectors), length (a last page cut short, one token), repeated pages; scores spread
    wide enough that the running max moves from page to page. Float32 against float64."""
    attention_case(B, K, G, H, ps, n, seed)


@needs_kernels
@settings(max_examples=12, deadline=None)
@given(B=st.integers(1, 3), K=st.integers(1, 2), G=st.sampled_from([1, 2, 3, 5, 12]),
       H=st.sampled_from([8, 16, 32, 64, 128]), ps=st.integers(1, 300), n=st.integers(1, 4),
       seed=st.integers(0, 2**16))
def test_paged_attention_fast_path_equals_softmax_attention(B, K, G, H, ps, n, seed):
    """Head sizes of whole vectors (the chunked path with register accumulators): heads
    in groups and a remainder group, up to 1200 keys (chunks of 64-1024 split over the cores
    and combined, a chunk's last block cut short), pages that end inside a block."""
    attention_case(B, K, G, H, ps, n, seed)


@needs_kernels
@pytest.mark.parametrize("B", [1, 8])  # one chunk of 1000 keys per job, or several chunks
@pytest.mark.parametrize("G", [1, 2])  # the one-pass chunk (G = 1) and the two-pass one
def test_paged_attention_running_max_grows_in_every_block(B, G):
    """Scores rising key after key (query q), falling (-q): the one-pass softmax (one query
    head per KV head) rescales its accumulators at every block for q and never for -q; the
    two-pass one (G >= 2, both at once) takes each head's max over its chunk. All equal the
    oracle."""
    rng = np.random.default_rng(0)
    H, L = 64, 1000
    q0 = rng.standard_normal((B, 1, 1, H)).astype(np.float32)
    ramp = np.linspace(0.0, 12.0, L, dtype=np.float32)[:, None]  # scores 0 .. ~12 |q| / 8
    k = (ramp * q0[0, 0, 0] / np.linalg.norm(q0[0, 0, 0]) * 8 / np.sqrt(H)).astype(np.float32)
    k = np.broadcast_to(k, (1, 1, L, H)) + 0.01 * rng.standard_normal((1, 1, L, H))
    v = rng.standard_normal((1, 1, L, H)).astype(np.float32)
    tables = np.zeros((B, 1), np.int32)
    lens = np.full(B, L, np.int32)
    queries = [np.concatenate([q0, -q0], axis=2)] if G == 2 else [q0, -q0]
    for q in queries:
        check_attention(q, k.astype(np.float32), v, tables, lens, 1 / np.sqrt(H))


@needs_kernels
def test_paged_attention_refuses_bad_lengths_pages_and_dtypes():
    q = jnp.zeros((1, 2, 2, 8), jnp.float32)
    k = jnp.zeros((3, 2, 4, 8), jnp.float32)
    ok = np.array([[0, 1]], np.int32)
    for lens, tables, match in [([0], ok, "lens"), ([9], ok, "lens"),
                                ([5], np.array([[0, 3]], np.int32), "outside")]:
        with pytest.raises(Exception, match=match):
            jax.block_until_ready(paged_attention(q, k, k, tables, np.array(lens, np.int32), 1.0))
    with pytest.raises(ValueError, match="float32"):
        paged_attention(q.astype(jnp.bfloat16), k, k, ok, np.array([1], np.int32), 1.0)


@needs_kernels
@pytest.mark.parametrize("kind", ["gqa", "mha", "mqa"])
def test_a_layer_decoding_over_pages_equals_its_contiguous_decode(kind):
    """A GQA layer handed `PagedKV` (pages scrambled) writes the step's key and value into
    their page and returns the output of its contiguous decode over the same tokens."""
    cfg = tiny(attention=kind)
    model = refmodel.init(cfg, seed=0)
    attn = model.blocks[0].attn
    assert backends.reads_pages(attn)
    x, start, cache, pages = decode_over_pages(attn, cfg, kind)
    want, want_cache = attn(x, start, cache)
    got, paged = attn(x, start, pages)
    S, ps, tables = 9, 4, PAGED_TABLES
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-5, atol=1e-5)
    for p, c in zip((paged.k, paged.v), (want_cache.k, want_cache.v), strict=True):
        np.testing.assert_allclose(np.asarray(p)[tables[:, 2], :, S % ps],
                                   np.asarray(c)[:, :, S], rtol=1e-6)


def test_only_plain_float32_softmax_layers_read_pages():
    assert backends.reads_pages(refmodel.init(tiny(attention="gqa"), seed=0).blocks[0].attn)
    for cfg in (tiny(attention="sliding"), tiny(attention="mla"),
                tiny(attention="gqa", attn_softcap=30.0), tiny(attention="gqa", kv_format="int8")):
        attn = refmodel.init(cfg, seed=0).blocks[0].attn
        assert not backends.reads_pages(attn), cfg
