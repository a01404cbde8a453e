"""Native CPU kernels behind `jax.ffi`: the "kernels" layer of the inference stack.

An inference engine is a model, a scheduler and, under both, kernels: the hand-written loops
that make the step's few big operations run at the speed of the hardware (llama.cpp's ggml,
vLLM's attention and GEMM kernels, FlashAttention). Here the one such operation that matters
for a CPU decode step is the weight product with a few rows of activations: at batch 1 the
step is a chain of matrix-vector products whose only job is to stream the weights from memory,
and XLA:CPU's GEMV/few-row GEMM streams them below the memory's speed (issue 18's breakdown).

`rows.cc` is that product, float32 or int8 weights, in ~150 lines of C++ (`common.h`: what
kernels share); `build.py` compiles it for this machine on first use; `rows.py` wraps it as an
XLA custom call (`jax.ffi.ffi_call`) and as a weight type (`Panels`: the weight stored in the
kernel's layout) that modules multiply with as they do with any weight. Choosing it is one
config field: `refmodel.init(cfg.replace(matmul="native"))`, or `use_native(model)` for a
model you already have. The pure-JAX path (`matmul="xla"`) stays the default, the fallback
where no compiler is found, and the reference every kernel is tested against.

The serving engine's paged KV cache has two more (`pages.py`): `attend.cc`, decode attention
that reads each sequence's pages where they lie (vLLM's PagedAttention), and `pages.cc`, the
gather of pages into a contiguous view for the layers that cannot. The engine uses them where
they build (`Engine(kernels="auto")`); XLA's gather is their fallback and reference. A native
model's prefill chunks attend in `attend_rows.cc` (`prefill.py`): per sequence and KV head,
the scores of a block of query rows kept in L2 between two products in `rows.cc`'s tile
(`panels.h`), where XLA's attention wrote them to memory and read them back. Two variants
have kernels of their own: absorbed MLA's decode (`latent.cc`, `latent.py`: both absorbs and
the attention over the cached latents, wkv_b read as stored, where XLA copied and transposed
its slices every call) and sparse attention, at decode and in a prefill chunk (`sparse.cc`,
`sparse.py`: the indexer's scores, the top-k picks and the attention over them, where XLA's
top_k, sort and gathers took half the step's attention and copied every query's picks).
A linear-attention layer's decode step updates its state in `recurrence.cc`
(`recurrence.py`: read once, written in place, where XLA's one-row batched products streamed
it at a quarter of the read roof), and a MoE layer runs its experts as grouped products
(`rows_groups` in `rows.cc`: each expert with rows read once per step).
"""

from __future__ import annotations

from flax import nnx

from refmodel.kernels.build import load, why_not
from refmodel.kernels.rows import PANEL, OutputMajor, Panels, panels, rows, rows_groups

__all__ = ["CHOICES", "PANEL", "OutputMajor", "Panels", "available", "choose", "convert", "load",
           "panels", "rows", "rows_groups", "use_native", "why_not"]

CHOICES = ("auto", "xla", "output-major", "native")  # what a benchmark or engine may be told


def available() -> bool:
    """The native kernels build and load here (compiled on the first call)."""
    return load()


def choose(matmul: str, dtype: str = "float32", weight_format: str = "none",
           name: str = "matmul") -> str:
    """The weight products a run uses (a `ModelConfig.matmul`): "auto" is "native" on a CPU
    backend where the kernels build, for float32 weights, else "xla"; any other choice is
    returned as it is, "native" only where the kernels can run here (else a RuntimeError
    naming why). `name`: the option the caller's errors name (the engine's "kernels")."""
    import jax

    if matmul not in CHOICES:
        raise ValueError(f"{name}={matmul!r}: choose one of {CHOICES}")
    cpu = jax.default_backend() == "cpu"  # the kernels are XLA:CPU custom calls
    if matmul == "native" and not (cpu and load()):
        why = why_not() if cpu else f"the backend is {jax.default_backend()}"
        raise RuntimeError(f"{name}='native' needs the native CPU kernels, which cannot run "
                           f"here: {why}; use 'auto' or 'xla'")
    if matmul != "auto":
        return matmul
    plain = dtype == "float32" and weight_format == "none"
    return "native" if plain and cpu and load() else "xla"


def convert(model: nnx.Module, native: bool = True) -> nnx.Module:
    """Replace, in place, every float32 matrix [*lead, K, N] the modules declare (`MATRICES`)
    by its `Panels` form (the native kernel's layout), or with native=False its `OutputMajor`
    form (multiplied by XLA only); with native=True an int8 `quant.Quantized` matrix becomes
    int8 `Panels` too; a float32 weight declared over several axes ([D, N, H], [N, U, D])
    becomes the `Panels` of its matrix (native only). Other weights (float8, int4, int8 with
    int8 activations or several axes, what a module's `IN_PLACE` names: a kernel reads it as
    declared) stay as they are."""
    from refmodel.quant import Quantized, matrices

    if native and not load():
        raise RuntimeError(f"matmul='native' needs the native kernels, which are not available "
                           f"here: {why_not()}; use matmul='xla'")
    for _, module in nnx.iter_modules(model):
        for name, (lead, contract) in matrices(module).items():
            if name in getattr(type(module), "IN_PLACE", ()):
                continue
            value = getattr(module, name)[...]
            plain = not isinstance(value, (OutputMajor, Panels)) and hasattr(value, "ndim")
            if plain and contract == 1 and value.ndim == lead + 2:
                form = Panels if native else OutputMajor
                setattr(module, name, nnx.Param(form.of(value, lead, contract)))
            elif plain and native and lead == 0 and value.ndim > 2:
                setattr(module, name, nnx.Param(Panels.of(value, lead, contract)))
            elif (native and isinstance(value, Quantized) and value.fmt == "int8"
                  and not value.acts and value.contract == 1
                  and len(value.shape) == value.lead + 2):
                setattr(module, name, nnx.Param(Panels.of_quantized(value)))
    return model


def use_native(model: nnx.Module, matmul: str = "native") -> nnx.Module:
    """A copy of `model` (matmul='xla') whose weights are stored as `matmul` says: 'native' (in
    the kernel's panels, every product the kernel's; float32, or int8 from
    `quant.quantize(model, weights="int8")`) or 'output-major' ([N, K], XLA's products; float32
    only). Same weights, same outputs to float rounding."""
    import dataclasses

    if model.cfg.matmul != "xla":
        raise ValueError(f"the model's matmul is already {model.cfg.matmul!r}; convert the "
                         "matmul='xla' model")
    cfg = dataclasses.replace(model.cfg, matmul=matmul)
    new = nnx.clone(model)
    for _, module in nnx.iter_modules(new):
        if hasattr(module, "cfg"):
            module.cfg = cfg
    return convert(new, native=matmul == "native")
