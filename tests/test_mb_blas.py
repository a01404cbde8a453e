"""microbench.blas: the measuring process's BLAS libraries at one thread, the LAPACK that
jax's CPU linear algebra calls included, and the CLI sets it before any command runs."""

import jax.numpy as jnp
import threadpoolctl
from jax.scipy.linalg import solve_triangular

from microbench import blas, cli


def test_one_thread_limits_every_blas_library_jax_calls():
    limiter = blas.one_thread()
    try:
        a = jnp.eye(64) + jnp.tril(jnp.full((64, 64), 0.01), -1)
        solve_triangular(a, jnp.ones((64, 8)), lower=True).block_until_ready()  # LAPACK
        libs = threadpoolctl.threadpool_info()
        blas_libs = [i for i in libs if i["user_api"] == "blas"]
        assert blas_libs, libs  # numpy's and scipy's OpenBLAS (or another BLAS) are loaded
        assert all(i["num_threads"] == 1 for i in blas_libs), blas_libs
    finally:
        limiter.restore_original_limits()


def test_the_cli_limits_blas_before_the_command_runs(monkeypatch, capsys):
    calls = []
    monkeypatch.setattr(blas, "one_thread", lambda: calls.append("one_thread"))
    assert cli.main(["hardware"]) == 0
    assert calls == ["one_thread"]
