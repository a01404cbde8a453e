"""Block sizes of the Pallas kernels, per platform, and whether a kernel runs interpreted.

A Pallas kernel names its blocks: how many keys one step of the attention loop holds, how many
keys one program owns, how many rows and columns one tile of the grouped matmul computes. The
right sizes depend on the chip's fast memory and matrix unit, so they come from this table,
keyed by `jax.default_backend()`:

- "cpu": Pallas runs on a CPU only in interpret mode (each program a step of an XLA loop), for
  correctness, not speed. Small blocks, so the tests' tiny shapes cross block, split and
  depth boundaries and the online softmax, the combine and the sums over D are exercised.
- "gpu": Triton (or Mosaic GPU) tiles. 16 query rows at least (Triton's `dot` wants every
  dimension >= 16, so the G heads of a group are padded to 16); 64 keys per step keeps the
  [16, 64] scores and a [64, H] key block in registers and shared memory; 512 keys per
  program gives a batch-1 decode over 32k keys 64 programs per KV head to spread over the
  SMs (flash-decoding's reason to split). 64 x 128 grouped-matmul tiles summed over 64 inputs
  a step, a common Triton GEMM tile. Untested here: no GPU ran these numbers.
- "tpu": Mosaic tiles, multiples of the (8, 128) vector register: 8 query rows, 128 keys per
  step (one lane width), 128 x 128 matmul tiles over 512 inputs a step. Untested on
  hardware; a TPU copies every block into VMEM before a program runs, so a kernel that finds
  its block through data (a page id, a group id) wants scalar prefetch: `paged_tpu.py` is the
  paged kernel written so, and the grouped matmul would need the same.
"""

from __future__ import annotations

import jax

BLOCKS = {
    # keys per step, keys per program, min query rows; matmul rows, columns, depth per step
    "cpu": {"block_k": 8, "split_k": 16, "min_rows": 1,
            "block_rows": 8, "block_cols": 32, "block_depth": 8},
    "gpu": {"block_k": 64, "split_k": 512, "min_rows": 16,
            "block_rows": 64, "block_cols": 128, "block_depth": 64},
    "tpu": {"block_k": 128, "split_k": 1024, "min_rows": 8,
            "block_rows": 128, "block_cols": 128, "block_depth": 512},
}


def platform() -> str:
    """The platform the kernels run on ("cpu", "gpu" or "tpu")."""
    name = jax.default_backend()
    return name if name in BLOCKS else "gpu"  # "cuda", "rocm": a GPU


def block_sizes(**overrides) -> dict[str, int]:
    """This platform's block sizes, any of them replaced by a keyword that is not None."""
    out = dict(BLOCKS[platform()])
    for key, value in overrides.items():
        if key not in out:
            raise ValueError(f"{key}={value!r}: block sizes are {sorted(out)}")
        if value is not None:
            out[key] = int(value)
    return out


def interpret_mode(interpret: bool | None) -> bool:
    """`interpret`, or when it is None, True on a CPU: Pallas compiles for GPUs (Triton,
    Mosaic GPU) and TPUs (Mosaic) and only interprets elsewhere."""
    return platform() == "cpu" if interpret is None else bool(interpret)


def round_up(n: int, m: int) -> int:
    return -(-n // m) * m
