"""Backends: who runs the model's ops (`refmodel/ops.py` is the seam, this package fills it).

    xla.py      the reference's ops in the layouts XLA's CPU compiler runs fastest
    native.py   the C++ kernels of `refmodel/kernels` (float32 or int8 weights in panels, int8
                or int4 weights with int8 activations in the integer dot kernel,
                attention over caches and the engine's pages, MLA, sparse, linear, MoE)
    pallas.py   the Pallas kernels of `refmodel/pallas` (decode attention over caches and the
                engine's pages, the MoE grouped matmul): interpreted on a CPU, compiled on a
                GPU or TPU

A model's backend is its config field `backend` ("reference", "xla", "output-major",
"native", "pallas"); `use(model, backend)` gives a copy of a model on another one, the same
weights stored as that backend wants them.

The serving engine's pages (`PagedKV`) bring their own implementation of a decode step's
attention whatever the model's backend (`ops.implements_type`); which kernel reads them is
the engine's choice (`kernels`), which the pages carry: the Pallas paged kernel for
"pallas", else the native one.
"""

from __future__ import annotations

import dataclasses

import jax
from flax import nnx

from refmodel import kernels, ops
from refmodel.attention.gqa import GroupedQueryAttention
from refmodel.backends import native, pallas, xla  # noqa: F401  (they register their ops)
from refmodel.backends.native import KERNEL_SCOPE, LATENT_SCOPE, SPARSE_SCOPE
from refmodel.kernels.pages import PagedKV

__all__ = ["CHOICES", "KERNEL_SCOPE", "LATENT_SCOPE", "SPARSE_SCOPE", "choose", "reads_pages",
           "use"]

CHOICES = ("auto",) + ops.BACKENDS  # what a benchmark or the engine may be told


@ops.implements_type("gqa.attend_cache", PagedKV)
def attend_pages(layer, q, cache, positions):
    """A decode step over the engine's pages, by the kernel the pages name (`PagedKV.kernel`:
    the engine's `kernels`)."""
    if cache.kernel == "pallas":
        return pallas.gqa_attend_pages(layer, q, cache, positions)
    return native.gqa_attend_pages(layer, q, cache, positions)


def reads_pages(layer, kernel: str = "native") -> bool:
    """Whether the serving engine may hand `layer` its pages in place (`PagedKV`) at decode
    for `kernel` ("native": float32; "pallas": any float cache) to read: a layer running
    GQA's own call with a plain softmax."""
    gqa = type(layer).__call__ is GroupedQueryAttention.__call__
    plain = (pallas.plain_softmax if kernel == "pallas" else native.plain_softmax)(layer.cfg)
    return gqa and plain


def choose(backend: str, dtype: str = "float32", weight_format: str = "none",
           name: str = "backend") -> str:
    """The backend a run uses: "auto" is "native" on a CPU where the kernels build, for float32
    weights, else "xla"; any other choice is returned as it is, "native" only where the
    kernels can run here (else a RuntimeError naming why), "pallas" anywhere (interpreted
    on a CPU). `name`: the option the caller's errors name (the engine's "kernels")."""
    if backend not in CHOICES:
        raise ValueError(f"{name}={backend!r}: choose one of {CHOICES}")
    cpu = jax.default_backend() == "cpu"  # the kernels are XLA:CPU custom calls
    if backend == "native" and not (cpu and kernels.available()):
        why = kernels.why_not() if cpu else f"the backend is {jax.default_backend()}"
        raise RuntimeError(f"{name}='native' needs the native CPU kernels, which cannot run "
                           f"here: {why}; use 'auto' or 'xla'")
    if backend != "auto":
        return backend
    plain = dtype == "float32" and weight_format == "none"
    return "native" if plain and cpu and kernels.available() else "xla"


def use(model: nnx.Module, backend: str = "native") -> nnx.Module:
    """A copy of `model` (on "reference" or "xla", whose weights are stored as declared) on
    `backend`: for "native" its matrices in the kernel's panels (float32, or int8 from
    `quant.quantize(model, weights="int8")`; int8 or int4 with `activations=True` in the
    integer dot kernel's), for "output-major" stored [N, K]. Same weights,
    same outputs to float rounding."""
    if model.cfg.backend not in ("reference", "xla"):
        raise ValueError(f"the model's backend is already {model.cfg.backend!r}; convert the "
                         "backend='xla' (or 'reference') model")
    ops.check(backend)
    cfg = dataclasses.replace(model.cfg, backend=backend)
    new = nnx.clone(model)
    for _, module in nnx.iter_modules(new):
        if hasattr(module, "cfg"):
            module.cfg = cfg
    ops.prepare(new)  # stored as the backend multiplies them
    return new
