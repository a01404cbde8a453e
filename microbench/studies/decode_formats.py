"""The decode race's formats: our quantized programs beside llama.cpp's own formats of the same
weights, what each stores per weight, and the pairs the race compares.

Ours (`refmodel.quant`), all in the native kernel (`refmodel.backends.use(..., "native")`):
float32; int8 weights with one scale per output channel, the activations rounded to int8 per
block of 32 inputs ("w8a8"); int4 weights with one scale per 32 inputs of each output and the
same int8 activations ("w4a8"); and the int8 weights alone, the activations left in float32
("native-int8", weight-only). Theirs: the F32 GGUF written from our model
(`llamacpp.gguf_from_model`) and what llama.cpp's own quantizer makes of it (Q8_0, Q4_0,
Q4_K_M: `llamacpp.quantize`), so each engine reads its own native format of the same weights.
Q8_0 and Q4_0 are the like-for-like peers of w8a8 and w4a8 (8 or 4 bits per weight, int8
activations per block of 32; int4's scales are Q4_0's, a float16 per 32 weights, and int8's
a float32 per output channel where Q8_0 keeps a float16 per 32); Q4_K_M, what llama.cpp's
users deploy most, is another format (4-bit super-blocks with 6-bit sub-scales, some tensors
in Q6_K) and is set beside our int4 with that said.

Bits per weight, two ways for each side: over the matrices a decode step streams (ours counted
by `refmodel.counting`, theirs the GGUF's tensors as llama.cpp wrote them), and over everything
stored (ours: every parameter's bytes, the float32 embedding included; theirs: the file's bytes
over its tensors' elements, the quantized embedding included). A step reads the embedding's one
row, so the first is what sets the step's time.
"""

from __future__ import annotations

import math
from pathlib import Path

# program: (weight format or None, int8 activations, what it is)
OURS = {
    "native": (None, False, "float32"),
    "native-int8": ("int8", False, "int8 weights only (weight-only, float32 activations)"),
    "w8a8": ("int8", True, "int8 weights, int8 activations"),
    "w4a8": ("int4", True, "int4 weights, int8 activations"),
}
# llama.cpp peer: its format (None: the F32 file as written)
THEIRS = {"llama.cpp": None, "llama.cpp Q8_0": "Q8_0", "llama.cpp Q4_0": "Q4_0",
          "llama.cpp Q4_K_M": "Q4_K_M"}
# (label, ours, theirs, target key or None: a pair of different formats has no target)
PAIRS = (
    ("float32 vs F32", "native", "llama.cpp", "vs_llamacpp"),
    ("int8 vs Q8_0", "w8a8", "llama.cpp Q8_0", "int8_vs_q8_0"),
    ("int4 vs Q4_0", "w4a8", "llama.cpp Q4_0", "int4_vs_q4_0"),
    ("int4 vs Q4_K_M (not the same format)", "w4a8", "llama.cpp Q4_K_M", None),
)


def our_model(base, program: str):
    """(model, backend it runs on, a note or None, its bits per weight: `our_bits`) of
    `program` from the float model `base` (backend "xla"). A quantized program the native kernel
    refuses runs on "xla" (a slow reference: the same arithmetic, not a race entry), and the
    note says so; a format `refmodel.quant` cannot make raises its ValueError."""
    from refmodel import backends, quant

    weights, acts, _ = OURS[program]
    model = base if weights is None else quant.quantize(base, weights=weights, activations=acts)
    bits = our_bits(model, weights)  # counted on the model as declared, before any repacking
    try:
        return backends.use(model, "native"), "native", None, bits
    except (ValueError, RuntimeError) as e:
        if weights is None or not acts:
            raise
        return model, "xla", (f"{program}: on backend 'xla', a slow reference and not a race "
                              f"entry (the native kernel refused it: {short(e)})"), bits


def short(error: Exception, limit: int = 300) -> str:
    """An error's first line, cut to `limit` characters (a compiler's log can be pages)."""
    text = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
    return text if len(text) <= limit else text[:limit] + "..."


def matrix_shapes(model) -> list[tuple[int, int, int]]:
    """(count, k inputs, n outputs) of every declared matrix of `model` (float or quantized:
    a Quantized weight keeps its declared shape)."""
    from flax import nnx

    from refmodel.quant import matrices

    out = []
    for _, module in nnx.iter_modules(model):
        for name, (lead, contract) in matrices(module).items():
            shape = tuple(getattr(module, name)[...].shape)
            out.append((math.prod(shape[:lead]), math.prod(shape[lead:lead + contract]),
                        math.prod(shape[lead + contract:])))
    return out


def our_bits(model, fmt: str | None) -> dict:
    """Bits per weight of `model` in weight format `fmt` (None: float32): over its matrices,
    counted by refmodel.counting (matrix_bytes over k*n*8), and over every stored parameter
    (model: the quantized model itself, on backend "xla")."""
    import jax
    from flax import nnx

    from refmodel import costs
    from refmodel.counting import Dtypes

    dt = Dtypes(weight=fmt or "float32")
    shapes = matrix_shapes(model)
    weights = sum(c * k * n for c, k, n in shapes)
    stored = sum(x.nbytes for x in jax.tree.leaves(nnx.state(model, nnx.Param)))
    params = costs.param_counts(model.cfg)["total"]
    return {"matrix_bpw": 8.0 * sum(c * dt.matrix_bytes(k, n) for c, k, n in shapes) / weights,
            "stored_bpw": 8.0 * stored / params, "stored_bytes": float(stored),
            "matrix_weights": weights}


def llama_files(model, folder: Path, stem: str, skipped: list) -> dict:
    """{peer: {"path", ...gguf_info}}: the F32 GGUF of `model` and llama.cpp's quantizations
    of it in `folder`; a format llama.cpp fails to write is left out, its reason in
    `skipped`."""
    from microbench.studies import llamacpp

    f32 = llamacpp.gguf_from_model(model, Path(folder) / f"{stem}-F32.gguf")
    files = {}
    for peer, ftype in THEIRS.items():
        try:
            path = f32 if ftype is None else llamacpp.quantize(
                f32, Path(folder) / f"{stem}-{ftype}.gguf", ftype)
        except RuntimeError as e:
            skipped.append(f"{peer}: {e}")
            continue
        files[peer] = {"path": str(path), **llamacpp.gguf_info(path)}
    return files


def pair_rows(result: dict) -> list[dict]:
    """Per pair that ran: ours' speed over theirs per round and its median, each side's bits
    per weight and streamed weight bytes per second as a fraction of the round's C read."""
    rows = []
    for label, ours, theirs, target in PAIRS:
        if ours not in result.get("formats", {}) or theirs not in result.get("formats", {}):
            continue
        per_round = []
        for r in result["rounds"]:
            mine = next((p for p in r["points"] if p["program"] == ours and p["batch"] == 1),
                        None)
            peer = next((p for p in r["peers"] if p["program"] == theirs), None)
            if mine is None or peer is None:
                continue
            read = max(r["read_bytes_per_s"])
            per_round.append({"speed": peer["step_s"] / mine["step_s"],
                              "ours_of_read": mine["weight_bytes"] / mine["step_s"] / read,
                              "theirs_of_read": peer["weight_bytes"] / peer["step_s"] / read})
        if not per_round:
            continue
        rows.append({"pair": label, "ours": ours, "theirs": theirs, "target": target,
                     "rounds": [x["speed"] for x in per_round],
                     **{k: _median([x[k] for x in per_round])
                        for k in ("speed", "ours_of_read", "theirs_of_read")},
                     "ours_of_read_rounds": [x["ours_of_read"] for x in per_round],
                     "theirs_of_read_rounds": [x["theirs_of_read"] for x in per_round]})
    return rows


def _median(xs: list) -> float:
    import numpy as np

    return float(np.median(xs))
