"""The Pallas kernels (refmodel/pallas) in interpret mode, each against its plain-jnp oracle,
and the "pallas" backend (refmodel/backends/pallas.py) in the model.

Kernels: decode attention over a contiguous cache (MHA, GQA and MQA groups, ragged lengths
from 1 key to the whole cache, blocks and splits smaller than the cache so the online softmax
and the combine of splits run), over pages out of order (shared pages, ragged lengths; also
in the TPU layout, which only interpret mode has run), and
the grouped matmul (empty groups, one group holding every row, a tile spanning several groups,
rows past the groups zero). Tolerances: float32 to 1e-5 (the kernel sums in another order
than the oracle); bfloat16 caches and weights against the float32 oracle on the unrounded
inputs to BF16_TOL, stated below.

Backend: a model on "pallas" runs the kernels at decode (a `pallas_call` in its step) and falls
through to XLA where they do not apply; a layer handed the engine's pages runs the Pallas paged
kernel when its backend is "pallas" and the native one otherwise. The golden and oracle tests
over the whole model are tests/test_golden.py and tests/test_backends.py.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import refmodel
from conftest import decode_over_pages, tiny
from refmodel import backends, kernels, pallas, phases
from refmodel.pallas import blocks as pblocks
from refmodel.pallas.grouped import tile_groups
from refmodel.serving.engine import Engine
from refmodel.serving.request import Request

# bfloat16 keeps 8 significant bits: each input is off by up to 2^-9 of itself, the output
# is rounded once more, and the scores' errors pass through exp. Over these shapes (unit
# normal q, k, v, H = 16, scale 1/4; unit normal x and w, D = 16, products up to ~14) the
# error against the float32 oracle on the unrounded inputs stays under a third of the bound.
BF16_TOL = {"attention": 3e-2, "matmul": 1.5e-1}
F32_TOL = 1e-5


def normal(key, shape, dtype=jnp.float32):
    return jax.random.normal(jax.random.key(key), shape, jnp.float32).astype(dtype)


def close(got, want, tol):
    np.testing.assert_allclose(np.asarray(got, np.float32), np.asarray(want, np.float32),
                               rtol=tol, atol=tol)


# Decode attention over a contiguous cache ------------------------------------------------------

# (K, G): MQA, GQA, MHA-like (G = 1); S = 37 keys, not a multiple of any block
SHAPES = {"mqa": (1, 4), "gqa": (2, 3), "mha": (3, 1)}


@pytest.mark.parametrize("shape", SHAPES)
def test_decode_attention_equals_the_oracle(shape):
    """Blocks of 4 keys, splits of 8: the online softmax and the combine of splits run."""
    K, G = SHAPES[shape]
    B, S, H = 4, 37, 16
    q, k, v = normal(0, (B, K, G, H)), normal(1, (B, K, S, H)), normal(2, (B, K, S, H))
    lens = jnp.array([1, 8, 17, S], jnp.int32)  # one key; a block; past a split; all
    want = pallas.reference_decode_attention(q, k, v, lens, 0.25)
    got = pallas.decode_attention(q, k, v, lens, 0.25, block_k=4, split_k=8)
    assert got.shape == (B, K, G, H) and got.dtype == jnp.float32
    close(got, want, F32_TOL)
    if shape == "gqa":  # the table's own blocks give the same
        close(pallas.decode_attention(q, k, v, lens, 0.25), want, F32_TOL)


def test_decode_attention_bfloat16_cache_within_the_stated_bound():
    B, K, G, S, H = 3, 2, 2, 21, 16
    q, k, v = normal(3, (B, K, G, H)), normal(4, (B, K, S, H)), normal(5, (B, K, S, H))
    lens = jnp.array([2, 13, S], jnp.int32)
    want = pallas.reference_decode_attention(q, k, v, lens, 0.25)  # float32, unrounded
    bf = jnp.bfloat16
    got = pallas.decode_attention(q.astype(bf), k.astype(bf), v.astype(bf), lens, 0.25,
                                  block_k=4, split_k=8)
    assert got.dtype == bf
    close(got, want, BF16_TOL["attention"])
    err = float(jnp.abs(got.astype(jnp.float32) - want).max())
    assert err > 1e-4  # rounded to bfloat16, not computed in float32 behind its back


def test_decode_attention_pads_the_heads_as_a_gpu_wants(monkeypatch):
    """A GPU's table pads G query heads to 16 rows (Triton's dot); the padded rows are
    dropped and the real ones unchanged (the logic, run interpreted)."""
    monkeypatch.setitem(pblocks.BLOCKS["cpu"], "min_rows", 16)
    B, K, G, S, H = 2, 2, 3, 11, 16
    q, k, v = normal(6, (B, K, G, H)), normal(7, (B, K, S, H)), normal(8, (B, K, S, H))
    lens = jnp.array([5, S], jnp.int32)
    got = pallas.decode_attention(q, k, v, lens, 0.5, block_k=4, split_k=8)
    close(got, pallas.reference_decode_attention(q, k, v, lens, 0.5), F32_TOL)


# Paged decode attention ------------------------------------------------------------------------

def _pages(P=11, K=2, page=4, H=16, dtype=jnp.float32):
    return normal(10, (P, K, page, H), dtype), normal(11, (P, K, page, H), dtype)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_paged_attention_equals_the_oracle_pages_out_of_order(dtype):
    """Rows' pages anywhere in the pool and in any order, one page shared by two rows, the
    table's last entries past a row's length never read (an entry there may hold any page)."""
    kp, vp = _pages()
    B, K, G, H = 3, 2, 3, 16
    q = normal(12, (B, K, G, H))
    tables = jnp.array([[7, 2, 9, 0, 5], [3, 10, 1, 6, 4], [8, 2, 0, 0, 0]], jnp.int32)
    lens = jnp.array([18, 1, 6], jnp.int32)  # 5 pages; 1 key; one and a half pages
    want = pallas.reference_paged_attention(q, kp, vp, tables, lens, 0.25)
    if dtype == "float32":
        got = pallas.paged_attention(q, kp, vp, tables, lens, 0.25, split_k=8)
        close(got, want, F32_TOL)
        # the TPU layout (page ids by scalar prefetch), interpreted
        close(pallas.paged_attention_tpu(q, kp, vp, tables, lens, 0.25), want, F32_TOL)
    else:
        bf = jnp.bfloat16
        got = pallas.paged_attention(q.astype(bf), kp.astype(bf), vp.astype(bf), tables, lens,
                                     0.25, split_k=8)
        assert got.dtype == bf
        close(got, want, BF16_TOL["attention"])


def test_paged_attention_equals_decode_attention_on_the_same_tokens():
    """Scattering a contiguous cache into scrambled pages changes nothing."""
    B, K, G, H, page, n = 2, 2, 2, 16, 4, 3
    k, v = normal(13, (B, K, n * page, H)), normal(14, (B, K, n * page, H))
    q, lens = normal(15, (B, K, G, H)), jnp.array([12, 7], jnp.int32)
    tables = np.array([[4, 0, 6], [2, 5, 1]], np.int32)
    pages = []
    for c in (k, v):
        p = np.zeros((7, K, page, H), np.float32)
        p[tables] = np.asarray(c).reshape(B, K, n, page, H).transpose(0, 2, 1, 3, 4)
        pages.append(jnp.asarray(p))
    got = pallas.paged_attention(q, *pages, jnp.asarray(tables), lens, 0.25)
    close(got, pallas.decode_attention(q, k, v, lens, 0.25), F32_TOL)


# Grouped matmul --------------------------------------------------------------------------------

SIZES = {
    "ragged with empty groups": [0, 10, 0, 13, 3, 0],
    "every row in the last group": [0, 0, 0, 0, 0, 29],
    "one row each, rows past the groups": [1, 1, 1, 1, 1, 1],
    "no rows": [0, 0, 0, 0, 0, 0],
}


@pytest.mark.parametrize("sizes", SIZES)
def test_grouped_matmul_equals_the_oracle(sizes):
    R, D, F = 29, 16, 64
    x, w = normal(20, (R, D)), normal(21, (len(SIZES[sizes]), D, F))
    s = jnp.array(SIZES[sizes], jnp.int32)
    got = pallas.grouped_matmul(x, w, s)
    want = pallas.reference_grouped_matmul(x, w, s)
    close(got, want, F32_TOL)
    total = int(s.sum())
    assert not np.asarray(got)[total:].any()  # rows past the groups are zero
    # and each row is its own group's product (the oracle, spelled out)
    group = np.repeat(np.arange(len(s)), np.asarray(s))
    for r in range(total):
        close(got[r], x[r] @ w[group[r]], F32_TOL)


def test_grouped_matmul_bfloat16_within_the_stated_bound():
    R, D, F = 21, 16, 32
    x, w = normal(22, (R, D)), normal(23, (4, D, F))
    s = jnp.array([5, 0, 9, 7], jnp.int32)
    want = pallas.reference_grouped_matmul(x, w, s)
    got = pallas.grouped_matmul(x.astype(jnp.bfloat16), w.astype(jnp.bfloat16), s)
    assert got.dtype == jnp.bfloat16
    close(got, want, BF16_TOL["matmul"])


def test_an_empty_group_is_in_no_tiles_range():
    """The kernel reads the weights of groups[first[i] .. last[i]] for tile i: exactly the
    groups with rows in that tile."""
    sizes = np.array([3, 0, 4, 0, 0, 9, 0, 2], np.int32)
    tm, tiles = 4, 6  # 18 rows in 5 tiles, one tile past them
    groups, starts, ends, first, last = (np.asarray(a) for a in
                                         tile_groups(jnp.asarray(sizes), tiles, tm))
    row_group = np.repeat(np.arange(len(sizes)), sizes)
    for i in range(tiles):
        want = sorted(set(row_group[i * tm:(i + 1) * tm]))
        assert sorted(groups[first[i]:last[i] + 1]) == want, i
        for n in range(first[i], last[i] + 1):
            g = groups[n]
            assert (starts[n], ends[n]) == (sizes[:g].sum(), sizes[:g + 1].sum())


# Block table -----------------------------------------------------------------------------------

def test_the_block_table_and_interpret_mode():
    keys = set(pblocks.BLOCKS["cpu"])
    for name, table in pblocks.BLOCKS.items():
        assert set(table) == keys, name
        assert table["split_k"] % table["block_k"] == 0, name
    assert pblocks.interpret_mode(None) is (jax.default_backend() == "cpu")
    assert pblocks.interpret_mode(False) is False
    with pytest.raises(ValueError, match="block_q=4: block sizes are"):
        pblocks.block_sizes(block_q=4)


# The backend -----------------------------------------------------------------------------------

def test_pallas_is_a_backend_that_falls_through_to_xla():
    assert refmodel.ops.CHAIN["pallas"] == ("pallas", "xla")
    assert backends.choose("pallas") == "pallas"
    assert tiny(backend="pallas", dtype="bfloat16").backend == "pallas"  # weights as declared
    assert refmodel.ops.registered()["moe.grouped"][-1] == "pallas"


def _decode_jaxpr(cfg):
    """The decode step's program (traced, not compiled) as text."""
    graphdef, state = nnx.split(refmodel.init(cfg, seed=0))
    cache = refmodel.init_cache(cfg, 2, 12)
    toks = jnp.zeros((2,), jnp.int32)
    return str(jax.make_jaxpr(functools.partial(phases.decode, graphdef))(state, toks, cache))


@pytest.mark.parametrize("changes", [{"attention": "sliding"},
                                     {"attention": "mqa", "ffn": "moe"}])
def test_a_pallas_model_runs_the_kernels_at_decode(changes):
    """Each op the backend implements is a `pallas_call` in the decode step; a soft-capped
    softmax is not (it falls through to XLA)."""
    text = _decode_jaxpr(tiny(backend="pallas", n_layers=1, **changes))
    names = ["decode_attention"] + (["grouped_matmul"] if changes.get("ffn") == "moe" else [])
    for name in names:
        assert f"name={name}" in text, name
    assert "pallas_call" not in _decode_jaxpr(tiny(backend="xla", n_layers=1, **changes))
    capped = _decode_jaxpr(tiny(backend="pallas", n_layers=1, attn_softcap=20.0, **changes))
    assert "name=decode_attention" not in capped


@pytest.mark.parametrize("backend", ["pallas", "native"])
def test_a_layer_over_pages_runs_its_backends_paged_kernel(backend):
    """A GQA layer handed `PagedKV` (pages scrambled) returns its contiguous decode's output,
    through the kernel the pages name: the Pallas paged kernel or the native one."""
    if backend == "native" and not kernels.available():
        pytest.skip("native kernels not built")
    cfg = tiny(attention="gqa", backend=backend, n_layers=1)
    attn = refmodel.init(cfg, seed=0).blocks[0].attn
    x, start, cache, paged = decode_over_pages(attn, cfg, "gqa", kernel=backend)
    want, _ = attn(x, start, cache)
    got, _ = attn(x, start, paged)
    close(got, want, F32_TOL)
    text = str(jax.make_jaxpr(lambda p: attn(x, start, p)[0])(paged))
    assert ("name=paged_attention" in text) == (backend == "pallas")
    assert backends.reads_pages(attn, backend)


def test_the_engine_on_pallas_kernels_decodes_as_on_xla(monkeypatch):
    """Engine(kernels="pallas"): each decode step's GQA layers read their pages in place with
    the Pallas paged kernel (counted as the step is traced), and the tokens equal the engine's
    on XLA's gathered views. A bfloat16 layer reads its pages with the Pallas kernel too; the
    native kernel takes float32 only."""
    from refmodel.backends import pallas as pallas_backend

    calls = []
    real = pallas_backend.gqa_attend_pages
    monkeypatch.setattr(pallas_backend, "gqa_attend_pages",
                        lambda *a: calls.append(1) or real(*a))
    model = refmodel.init(tiny(attention="gqa", n_layers=2), seed=0)
    reqs = [Request(0, (1, 2, 3, 4, 5), 4, arrival=0.0), Request(1, (7, 8, 9), 4, arrival=0.0)]
    outs = {}
    for name in ("pallas", "xla"):
        engine = Engine(model, num_pages=16, page_size=4, kernels=name)
        assert engine.layout.pages == (None if name == "xla" else "pallas")
        outs[name] = engine.run(reqs).outputs
        assert bool(calls) == (name == "pallas")
        calls.clear()
    assert outs["pallas"] == outs["xla"]
    half = refmodel.init(tiny(attention="gqa", n_layers=1, dtype="bfloat16"), seed=0)
    assert backends.reads_pages(half.blocks[0].attn, "pallas")
    assert not backends.reads_pages(half.blocks[0].attn, "native")
