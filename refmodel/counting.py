"""Primitives of the analytic cost model: a `Cost` per named op and the dtypes it is counted in.

Conventions (the same in every formula of the package):
- FLOPs: a multiply-add is 2 FLOPs; a matmul [m, k] x [k, n] is 2*m*k*n. Elementwise work
  (softmax, norms, RoPE, activations) is counted as `elementwise` FLOPs per element with the
  per-op constants stated beside each formula, so the compiler cross-check can explain them.
- Bytes are what an op must move to and from memory at least once: every weight it reads
  (`weight_bytes`), every cache entry it reads or writes (`kv_bytes`), and its input and output
  activations (`act_bytes`). Caches inside one fused kernel are not re-counted.
- Attention counts the work the code executes: a query block attends to every cached key
  position (masked entries included), so prefill of T tokens into a cache of T counts T x T.
  A causal-skipping kernel would do about half of that; the difference is a lesson, not a bug.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

BYTES = {"float32": 4, "bfloat16": 2, "float16": 2, "float8": 1, "int8": 1, "int4": 0.5}
FLOATS = ("float32", "bfloat16", "float16")  # stored as they are, no scales

# Quantized formats carry scales (refmodel/quant.py makes exactly these arrays): weights one
# float32 per output channel (int8, float8) or one float16 per QUANT_GROUP inputs of each
# output channel (int4: llama.cpp's Q4_0 layout, 4.5 bits per weight); a KV cache one float32
# per cached vector (a head's key, a latent row).
SCALE_BYTES = 4
WEIGHT_SCALE_BYTES = {"int8": 4, "float8": 4, "int4": 2}
QUANT_GROUP = {"int8": None, "float8": None, "int4": 32}


@dataclass(frozen=True)
class Dtypes:
    """Storage formats the bytes are counted in.

    `weight`: the weight matrices (every product with a weight; quantized ones carry their
    scales, `matrix_bytes`); `kv`: the cache (`kv_bytes`); `act`: activations; `param`: the
    vectors (norms, biases, sinks) and the embedding table, never quantized: None means
    `weight` when that is a float format, else float32.
    """

    weight: str = "float32"
    kv: str = "float32"
    act: str = "float32"
    param: str | None = None

    def __post_init__(self):
        for field in ("weight", "kv", "act"):
            value = getattr(self, field)
            if value not in BYTES:
                raise ValueError(f"{field} dtype {value!r} is not one of {sorted(BYTES)}")
        if self.param is not None and self.param not in FLOATS:
            raise ValueError(f"param dtype {self.param!r} is not one of {list(FLOATS)}")

    @property
    def weight_size(self) -> float:
        """Bytes per weight-matrix element, scales left out (see `matrix_bytes`)."""
        return BYTES[self.weight]

    @property
    def param_size(self) -> float:
        """Bytes per element of a vector parameter or of the embedding table."""
        if self.param is not None:
            return BYTES[self.param]
        return BYTES[self.weight] if self.weight in FLOATS else BYTES["float32"]

    @property
    def kv_size(self) -> float:
        """Bytes per cached (KV or state) element, scales left out (see `kv_bytes`)."""
        return BYTES[self.kv]

    @property
    def act_size(self) -> float:
        """Bytes per activation element."""
        return BYTES[self.act]

    def matrix_bytes(self, k: float, n: float) -> float:
        """Bytes of one [k, n] weight matrix (k inputs, n outputs) with its scales; a grouped
        format stores each channel's inputs padded to whole groups."""
        group = QUANT_GROUP.get(self.weight)
        stored = -(-k // group) * group if group else k
        scales = n * scales_per_row(self.weight, k)
        return stored * n * BYTES[self.weight] + scales * WEIGHT_SCALE_BYTES.get(self.weight, 0)

    def kv_bytes(self, elements: float, vector: int) -> float:
        """Bytes of `elements` cached numbers stored in vectors of `vector` (a head's key, a
        latent row): one scale per vector when the cache is quantized."""
        scales = elements / vector if self.kv not in FLOATS else 0.0
        return elements * BYTES[self.kv] + scales * SCALE_BYTES


def scales_per_row(fmt: str, k: float) -> float:
    """Scales one output channel of k inputs carries in `fmt` (0 for a float format)."""
    if fmt in FLOATS:
        return 0
    group = QUANT_GROUP[fmt]
    return 1 if group is None else -(-k // group)


@dataclass(frozen=True)
class Cost:
    """FLOPs and bytes of one op (or a sum of ops)."""

    flops: float = 0.0
    weight_bytes: float = 0.0
    kv_bytes: float = 0.0
    act_bytes: float = 0.0

    @property
    def bytes(self) -> float:
        return self.weight_bytes + self.kv_bytes + self.act_bytes

    @property
    def intensity(self) -> float:
        """Arithmetic intensity, FLOPs per byte."""
        return self.flops / self.bytes if self.bytes else float("inf")

    def __add__(self, other: Cost) -> Cost:  # field by field: astuple deep-copies (slow)
        return Cost(self.flops + other.flops, self.weight_bytes + other.weight_bytes,
                    self.kv_bytes + other.kv_bytes, self.act_bytes + other.act_bytes)

    def __mul__(self, k: float) -> Cost:
        return Cost(self.flops * k, self.weight_bytes * k, self.kv_bytes * k,
                    self.act_bytes * k)

    __rmul__ = __mul__

    def as_dict(self) -> dict:
        return {**dataclasses.asdict(self), "bytes": self.bytes}


def matmul(m: float, k: float, n: float, dt: Dtypes, *, weight: bool = True) -> Cost:
    """[m, k] activations times a [k, n] weight: 2mkn FLOPs, reads the weight (and its
    scales, if quantized) once."""
    return Cost(
        flops=2.0 * m * k * n,
        weight_bytes=dt.matrix_bytes(k, n) if weight else 0.0,
        act_bytes=(m * k + m * n) * dt.act_size,
    )


def total(ops: dict[str, Cost]) -> Cost:
    """Sum of a dict of named ops."""
    out = Cost()
    for cost in ops.values():
        out = out + cost
    return out
