"""Shared helpers: the tiny config with changes, random tokens, and the golden comparison."""

from __future__ import annotations

import atexit
import dataclasses
import json
import os
import shutil
import subprocess
import sys
import tempfile

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import refmodel

# The suite is bound by XLA's compiles, not by running what they compile: skip LLVM's
# expensive passes (the compiler cross-check's FAST_COMPILE: the same HLO and results, about
# half the compile time), and emit XLA:CPU's fusions with its older elemental emitters, where
# this jaxlib has the flag (the same results; a scatter becomes a loop of its own; about half
# the backend compile again). XLA aborts on a flag it does not know, so that one is asked of a
# throwaway process first. Read when the backend starts, so before any test computes;
# processes the tests spawn (the CLI tests, the notebooks run beside them) inherit it. The
# notebooks that time this machine run in the README's second command, without them.
FAST_COMPILE = ["--xla_backend_optimization_level=0", "--xla_llvm_disable_expensive_passes=true"]
OLD_EMITTERS = "--xla_cpu_use_fusion_emitters=false"


def _xla_knows(flag: str) -> bool:
    env = {**os.environ, "XLA_FLAGS": flag, "JAX_PLATFORMS": "cpu"}
    probe = [sys.executable, "-c", "import jax.numpy as jnp; jnp.zeros(1).block_until_ready()"]
    return subprocess.run(probe, env=env, capture_output=True).returncode == 0


if OLD_EMITTERS not in os.environ.get("XLA_FLAGS", "") and _xla_knows(OLD_EMITTERS):
    FAST_COMPILE.append(OLD_EMITTERS)
_flags = os.environ.get("XLA_FLAGS", "")  # an xdist worker inherits the controller's: once each
os.environ["XLA_FLAGS"] = " ".join([_flags, *(f for f in FAST_COMPILE if f not in _flags)]).strip()
# One on-disk compilation cache for the whole run (the xdist workers, the notebooks and the CLI
# children they start, which read it from the environment): a program one process compiled is
# loaded by the next. Keyed by JAX on the program, the flags and the versions, so it changes
# no result; removed by the process that made it, at exit. A cache the caller set is used as
# it is.
if "JAX_COMPILATION_CACHE_DIR" not in os.environ:
    CACHE = tempfile.mkdtemp(prefix="lab-tests-xla-")
    atexit.register(shutil.rmtree, CACHE, True)
    for name, value in (("jax_compilation_cache_dir", CACHE),
                        ("jax_persistent_cache_min_compile_time_secs", 0),  # the tiny models' too
                        ("jax_persistent_cache_min_entry_size_bytes", 0)):
        os.environ[name.upper()] = str(value)  # the children, whose JAX reads its environment
        jax.config.update(name, value)  # this process, whose JAX read it at import
jax.config.update("jax_default_matmul_precision", "highest")
# Eight emulated CPU devices for refmodel.parallel's tests (tests/test_parallel.py); set before
# any backend starts. Single-device code runs on device 0 as before.
jax.config.update("jax_num_cpu_devices", 8)


def tiny(**changes) -> refmodel.ModelConfig:
    return dataclasses.replace(refmodel.presets.get("tiny"), **changes)


def tokens(cfg, batch: int, length: int, seed: int = 1) -> jax.Array:
    return jax.random.randint(jax.random.key(seed), (batch, length), 0, cfg.vocab_size,
                              dtype=jnp.int32)


def incremental_logits(model, toks, chunks: list[int], max_len: int | None = None):
    """Prefill the prompt in the given chunk lengths, then decode the rest token by token;
    returns logits for every position [B, T, V]."""
    B, T = toks.shape
    cache = refmodel.init_cache(model.cfg, B, max_len or T)
    out, start = [], 0
    for n in chunks:
        logits, cache = refmodel.prefill(model, toks[:, start:start + n], cache)
        out.append(logits)
        start += n
    for t in range(start, T):
        logits, cache = refmodel.decode_step(model, toks[:, t], cache)
        out.append(logits[:, None])
    return jnp.concatenate(out, axis=1)


PAGED_TABLES = np.array([[4, 0, 6], [2, 5, 1]], np.int32)  # 2 rows x 3 pages, out of order


def decode_over_pages(attn, cfg, kind: str, kernel: str = "native", seed: int = 0):
    """A decode step's inputs for a GQA-family layer, and its cache both ways: x [2, 1, D],
    start (position 9: 9 cached tokens), the contiguous cache (random, 12 slots) and the same
    keys and values scattered into 7 pages of 4 tokens by PAGED_TABLES, as a `PagedKV` read by
    `kernel`. Returns (x, start, cache, paged)."""
    from refmodel.kernels.pages import PagedKV

    B, S, ps = 2, 9, 4
    rng = np.random.default_rng(seed)
    cache = attn.init_cache(cfg, kind, B, 3 * ps)
    cache = jax.tree.map(lambda c: jnp.asarray(rng.standard_normal(c.shape), c.dtype), cache)
    x = jnp.asarray(rng.standard_normal((B, 1, cfg.d_model)), jnp.float32)
    K, H = cache.k.shape[1], cache.k.shape[3]
    pages = [np.zeros((7, K, ps, H), np.float32) for _ in range(2)]
    for p, c in zip(pages, (cache.k, cache.v), strict=True):  # [B, K, 12, H] -> pages
        p[PAGED_TABLES] = np.asarray(c).reshape(B, K, 3, ps, H).transpose(0, 2, 1, 3, 4)
    paged = PagedKV(jnp.asarray(pages[0]), jnp.asarray(pages[1]), jnp.asarray(PAGED_TABLES),
                    kernel=kernel)
    return x, jnp.full((B,), S, jnp.int32), cache, paged


def assert_close(a, b, tol: float = 1e-5):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=tol, atol=tol)


def assert_logits_close(a, b, tol: float = 1e-5):
    """Golden-test tolerance: rtol = tol, atol = tol x the logits' RMS (float32 rounding
    grows with magnitude; tied embeddings give logits of RMS ~ sqrt(D))."""
    b = np.asarray(b)
    scale = max(1.0, float(np.sqrt(np.mean(b.astype(np.float64) ** 2))))
    np.testing.assert_allclose(np.asarray(a), b, rtol=tol, atol=tol * scale)


def assert_golden(cfg, batch: int, length: int, chunks: list[int], seed: int = 0,
                  max_len: int | None = None) -> None:
    """The golden check of one config: a full causal forward over random tokens equals
    prefill of `chunks` then token-by-token decode of the rest (into a cache made for
    `max_len` tokens, default `length`)."""
    model = refmodel.init(cfg, seed=seed)
    toks = tokens(cfg, batch, length, seed=seed + 1)
    full = refmodel.forward(model, toks)
    assert full.shape == (batch, length, cfg.vocab_size)
    assert_logits_close(incremental_logits(model, toks, chunks, max_len), full)


@pytest.fixture
def rng():
    return np.random.default_rng(0)


@pytest.fixture
def peaks_here(tmp_path):
    """The committed peaks.json as if measured on the machine running the test (its CPU
    fields replaced): what a command that predicts with this machine's roofs accepts."""
    from microbench import machines, sysinfo

    saved = machines.data_folder("peaks") / "peaks.json"
    result = json.loads(saved.read_text())
    info = sysinfo.read_cpuinfo()
    result["environment"].update(
        backend=jax.default_backend(), device_kind=jax.devices()[0].device_kind,
        device_count=jax.device_count(), cpu_model=sysinfo.cpu_model(info),
        cpu_id=sysinfo.cpu_family(info), isa_flags=sysinfo.isa_flags(info),
        cpu_count=os.cpu_count())
    assert machines.result_machine(result) == machines.this_machine()
    path = tmp_path / "peaks_here" / "peaks.json"
    path.parent.mkdir()
    path.write_text(json.dumps(result))
    return path
