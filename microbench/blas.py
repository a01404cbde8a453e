"""One BLAS thread for the library calls of a measuring process (threadpoolctl).

jax's CPU linear algebra calls LAPACK in scipy's OpenBLAS: the delta rule's chunked prefill
solves a 64 x 64 unit lower triangular system per chunk and head with
`jax.scipy.linalg.solve_triangular` (refmodel/attention/linear_scan.py), LAPACK's `strsm`.
With OpenBLAS's default threads, its worker thread keeps the second core busy after such a
call (it waits spinning for the next one), and XLA's thread pool and the native kernels are
left one core of two: on two cores the linear prefill then runs no faster than on one, and
even its LM-head product slows down (`python -m microbench breakdown --model bench --phase
prefill --context 256 --attention linear` shows it). Solves this small need no second thread.

`python -m microbench` limits every BLAS library of its process to one thread before it runs
a command; the numpy peers run in child processes of their own and keep theirs.
"""

from __future__ import annotations


def one_thread():
    """Limit every BLAS library loaded in this process, the LAPACK that jax calls included
    (loaded here first: jaxlib loads it on its first linear-algebra call), to one thread.
    Returns threadpoolctl's limiter (`restore_original_limits()` undoes it)."""
    import scipy.linalg.cython_lapack  # noqa: F401  (the OpenBLAS jax's LAPACK calls use)
    from threadpoolctl import threadpool_limits

    return threadpool_limits(limits=1, user_api="blas")
