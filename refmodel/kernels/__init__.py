"""Native CPU kernels behind `jax.ffi`: the "kernels" layer of the inference stack.

An inference engine is a model, a scheduler and, under both, kernels: the hand-written loops
that make the step's few big operations run at the speed of the hardware (llama.cpp's ggml,
vLLM's attention and GEMM kernels, FlashAttention). Here the one such operation that matters
for a CPU decode step is the weight product with a few rows of activations: at batch 1 the
step is a chain of matrix-vector products whose only job is to stream the weights from memory,
and XLA:CPU's GEMV/few-row GEMM streams them below the memory's speed.

`rows.cc` is that product, float32 or int8 weights (`panels.h`: its tile; `common.h`: what
kernels share); `qdot.cc` the same product as llama.cpp's Q8_0 and Q4_0 compute it, int8 or
int4 weights times activations rounded to int8 per block of 32, summed by the CPU's int8 dot
instruction (`qdot.py`: `QuantPanels`, `int8_dot`); `build.py` compiles the kernels for this
machine on first use; `rows.py` wraps the product as an XLA custom call (`jax.ffi.ffi_call`)
and as a weight type (`Panels`: the weight stored in the kernel's layout) that modules multiply
with as they do with any weight.
The model reaches every kernel through one seam (`refmodel/ops.py`, `refmodel/backends/
native.py`): `refmodel.init(cfg.replace(backend="native"))`, or `backends.use(model,
"native")` for a model you already have. The reference (the model files' own code) is what
every kernel is tested against.

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

from refmodel.kernels.build import load, why_not
from refmodel.kernels.qdot import QuantPanels, int8_dot
from refmodel.kernels.rows import PANEL, OutputMajor, Panels, panels, rows, rows_groups

__all__ = ["PANEL", "OutputMajor", "Panels", "QuantPanels", "available", "int8_dot", "load",
           "panels", "rows", "rows_groups", "why_not"]


def available() -> bool:
    """The native kernels build and load here (compiled on the first call)."""
    return load()
