"""The training corpus every machine already has: the Python standard library's own source.

Byte-level: a token is a byte (0..255) and one special, `BOS` = 256, opens every file, so the
vocabulary is `VOCAB` = 257 and bits per token are bits per byte. The files are found from the
running interpreter (`sysconfig`'s stdlib directory, `*.py`, never `site-packages` or
`dist-packages`), sorted by path, and split by file: a file is in the validation split when
the first byte of the MD5 of its path relative to the stdlib directory is below
`VAL_FRACTION` x 256. Deterministic for one interpreter; another Python version has other
files, so its losses differ a little (the stdlib directory and its size are reported with
every run).

Batches are windows of T + 1 tokens at random offsets of the concatenated split, drawn from a
generator seeded by (seed, step): batch `step` is the same whether a run got there in one go or
was resumed from a checkpoint, so a resumed run continues the same curve.
"""

from __future__ import annotations

import functools
import hashlib
import os
import sysconfig
from dataclasses import dataclass
from pathlib import Path

import numpy as np

BOS = 256  # opens every file
VOCAB = 257  # 256 bytes + BOS
VAL_FRACTION = 0.05
SKIP_DIRS = ("site-packages", "dist-packages", "__pycache__")


def stdlib_dir() -> Path:
    return Path(sysconfig.get_paths()["stdlib"])


def source_files(root: Path | None = None) -> list[Path]:
    """Every `*.py` under the stdlib directory outside site-packages, sorted by path."""
    root = stdlib_dir() if root is None else Path(root)
    out = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d not in SKIP_DIRS)
        out += [Path(dirpath) / f for f in filenames if f.endswith(".py")]
    if not out:
        raise FileNotFoundError(f"no Python source files under {root}: this interpreter ships "
                                "without its standard library's sources")
    return sorted(out)


def is_validation(relative: str) -> bool:
    """The split: by an MD5 of the file's path relative to the stdlib directory."""
    return hashlib.md5(relative.encode()).digest()[0] < VAL_FRACTION * 256


@dataclass(frozen=True)
class Corpus:
    train: np.ndarray  # uint16 [n_train]: BOS, the file's bytes, BOS, ...
    val: np.ndarray  # uint16 [n_val]
    root: str
    files: tuple[int, int]  # (train files, validation files)

    def describe(self) -> str:
        return (f"{self.root}: {self.files[0]} train files ({self.train.size / 1e6:.1f} MB), "
                f"{self.files[1]} validation files ({self.val.size / 1e6:.2f} MB)")


def encode(text: str | bytes) -> np.ndarray:
    """A document -> int32 tokens: BOS then its UTF-8 bytes."""
    raw = text.encode() if isinstance(text, str) else bytes(text)
    return np.concatenate([[BOS], np.frombuffer(raw, np.uint8)]).astype(np.int32)


def decode(tokens) -> str:
    """Tokens -> text; BOS becomes a newline-separated marker, invalid UTF-8 is replaced."""
    out = bytearray()
    for t in np.asarray(tokens).reshape(-1).tolist():
        out += b"\n<|file|>\n" if t == BOS else bytes([t])
    return out.decode("utf-8", errors="replace")


@functools.lru_cache(maxsize=2)
def load(root: str | None = None, max_bytes: int | None = None) -> Corpus:
    """Read and split the corpus (cached per process). `max_bytes` keeps only the first files
    of each split up to that many bytes (tests and the micro recipe)."""
    base = stdlib_dir() if root is None else Path(root)
    parts: dict[bool, list[np.ndarray]] = {False: [], True: []}
    sizes = {False: 0, True: 0}
    for path in source_files(base):
        val = is_validation(path.relative_to(base).as_posix())
        limit = max_bytes if max_bytes is None else (max_bytes // 10 if val else max_bytes)
        if limit is not None and sizes[val] >= limit:
            continue
        doc = encode(path.read_bytes()).astype(np.uint16)
        parts[val].append(doc)
        sizes[val] += doc.size
    if not parts[True] or not parts[False]:
        raise ValueError(f"the corpus under {base} has {len(parts[False])} train and "
                         f"{len(parts[True])} validation files; both splits need one")
    return Corpus(train=np.concatenate(parts[False]), val=np.concatenate(parts[True]),
                  root=str(base), files=(len(parts[False]), len(parts[True])))


def windows(stream: np.ndarray, batch: int, length: int, rng: np.random.Generator) -> np.ndarray:
    """int32 [batch, length + 1] windows at random offsets of `stream`."""
    if stream.size <= length + 1:
        raise ValueError(f"a split of {stream.size} tokens is too short for windows of "
                         f"seq_len={length} + 1")
    starts = rng.integers(0, stream.size - length - 1, batch)
    idx = starts[:, None] + np.arange(length + 1)
    return stream[idx].astype(np.int32)


def train_batch(corpus: Corpus, seed: int, step: int, batch: int, length: int) -> np.ndarray:
    """Batch `step` of a run seeded `seed`: the same batch however the run got to `step`."""
    return windows(corpus.train, batch, length, np.random.default_rng([seed, step]))


def val_batches(corpus: Corpus, n: int, batch: int, length: int, seed: int = 0) -> np.ndarray:
    """n fixed validation batches [n, batch, length + 1] (the same for every run)."""
    rng = np.random.default_rng([seed, 1 << 30])
    return np.stack([windows(corpus.val, batch, length, rng) for _ in range(n)])
