"""Bandwidth roofs: the STREAM family (read, write, copy, scale, add, triad) and a
working-set sweep.

After McCalpin's STREAM and BabelStream, written as JAX kernels. Each kernel runs two ways:
fresh output (XLA allocates the result; on a CPU every call faults in new pages) and donated
(the destination buffer is donated, so the output lands in place and calls chain).

Byte conventions, both recorded:
  * algorithmic: each array element read once, each written once (STREAM's convention);
  * with write-allocate (CPU): a store to a line not already in cache reads it first, so a
    written array not also read by the kernel costs one more read. An in-place kernel whose
    destination it also reads (scale, add in place) has no such extra read.

The sweep kernel is an in-place scale repeated R times inside one call (`lax.fori_loop`, which
does not fuse iterations, so each pass really goes through memory), with R chosen so that one
call moves enough bytes for small buffers to be timed above the dispatch overhead.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import partial

import jax
import jax.numpy as jnp
import numpy as np


@dataclass(frozen=True)
class BwKernel:
    name: str
    fn: Callable  # fn(*arrays, s) or fn(*arrays); arrays[0] is the destination when donated
    n_arrays: int  # array arguments, each of n elements
    reads: int  # arrays read per element
    writes: int  # arrays written per element (0: a scalar result)
    dst_read: bool  # the destination (arrays[0]) is also read: in place, no write-allocate
    n_scalars: int  # scalar arguments after the arrays

    @property
    def can_donate(self) -> bool:
        return self.writes > 0


def _read(a):
    return jnp.sum(a)


def _write(dst, s):
    return jnp.full_like(dst, s)


def _copy(dst, a):
    return jnp.copy(a)


def _scale(a, s):
    return s * a


def _add(a, b):
    return a + b


def _triad(dst, b, c, s):
    return b + s * c


KERNELS: dict[str, BwKernel] = {k.name: k for k in (
    BwKernel("read", _read, 1, 1, 0, False, 0),
    BwKernel("write", _write, 1, 0, 1, False, 1),
    BwKernel("copy", _copy, 2, 1, 1, False, 0),
    BwKernel("scale", _scale, 1, 1, 1, True, 1),
    BwKernel("add", _add, 2, 2, 1, True, 0),
    BwKernel("triad", _triad, 3, 2, 1, False, 1),
)}


def kernel_bytes(kernel: BwKernel, n: int, itemsize: int, donated: bool) -> dict[str, int]:
    """Bytes per call: {'algorithmic', 'write_allocate'} (scalars counted once)."""
    scalar_out = itemsize if kernel.writes == 0 else 0
    alg = itemsize * (kernel.reads + kernel.writes) * n + itemsize * kernel.n_scalars
    alg += scalar_out
    allocate = kernel.writes * n * itemsize
    if donated and kernel.dst_read:
        allocate = 0  # the line was just read: already in cache
    return {"algorithmic": alg, "write_allocate": alg + allocate}


def kernel_flops(kernel: BwKernel, n: int) -> int:
    """Arithmetic per call: read sums (n - 1 adds), scale 1, add 1, triad 2 per element."""
    return {"read": n - 1, "write": 0, "copy": 0, "scale": n, "add": n, "triad": 2 * n}[
        kernel.name]


def kernel_args(kernel: BwKernel, n: int, dtype: str = "float32", source=None, seed: int = 0):
    """Random normal arrays (from `source`, a big float32 numpy array, when given) and s."""
    rng = np.random.default_rng(seed)
    arrays = []
    for i in range(kernel.n_arrays):
        if source is not None and source.size >= (i + 1) * n:
            host = source[i * n:(i + 1) * n]
        else:
            host = rng.standard_normal(n, dtype=np.float32)
        arrays.append(jnp.asarray(host, dtype=dtype))
    scalars = [jnp.asarray(0.999, dtype=dtype)] * kernel.n_scalars
    return [*arrays, *scalars]


# ------------------------------------------------------------------------------ the sweep

def _sweep_pass(a, s, *, R: int):
    return jax.lax.fori_loop(0, R, lambda _, x: x * s, a)


def sweep_fn(R: int):
    """In-place scale repeated R times: donate argument 0."""
    return partial(_sweep_pass, R=R)


def sweep_repeats(working_set: int, min_bytes_per_call: int = 32 << 20) -> int:
    """Passes per call so one call moves at least `min_bytes_per_call` (2 bytes per byte)."""
    return max(1, -(-min_bytes_per_call // (2 * working_set)))


def sweep_bytes(n: int, itemsize: int, R: int) -> int:
    """R passes, each reading and writing n elements, plus the scalar s."""
    return 2 * n * itemsize * R + itemsize


def sweep_sizes(lo: int, hi: int, ratio: float, align: int = 4096) -> list[int]:
    """Geometric working-set sizes in bytes from lo to hi (inclusive), multiples of align."""
    out, size = [], float(lo)
    while size <= hi * 1.0001:
        value = max(align, int(round(size / align)) * align)
        if not out or value > out[-1]:
            out.append(value)
        size *= ratio
    return out
