"""Checkpoints written whole or not at all, restored exactly.

One file per run: the parameters and the optimiser state as their pytree's leaves in order, the
step, and a JSON metadata string (the recipe, the loss history), serialised with Flax's msgpack
(`flax.serialization`). Written to a temporary file in the same directory, flushed, then
`os.replace`d over the old one: a crash leaves the previous checkpoint or none, never half of
one. Restoring checks every leaf's shape and dtype against the run's own template (the same
recipe's freshly initialised state), so a checkpoint of another model is refused by name.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

import jax
import numpy as np
from flax import serialization


def save(path: Path, step: int, tree, meta: dict) -> None:
    """Write (step, every leaf of `tree`, meta) to `path` atomically."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    leaves = {str(i): np.asarray(x) for i, x in enumerate(jax.tree.leaves(tree))}
    blob = serialization.msgpack_serialize({"step": int(step), "leaves": leaves,
                                            "meta": json.dumps(meta)})
    fd, tmp = tempfile.mkstemp(prefix=path.name + ".", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(blob)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def load(path: Path, template) -> tuple[int, object, dict]:
    """(step, tree shaped like `template`, meta) from a checkpoint written by `save`."""
    path = Path(path)
    try:
        raw = serialization.msgpack_restore(path.read_bytes())
    except (ValueError, TypeError, KeyError) as err:
        raise ValueError(f"{path} is not a checkpoint of this project ({err})") from None
    if not isinstance(raw, dict) or not {"step", "leaves", "meta"} <= set(raw):
        raise ValueError(f"{path} is not a checkpoint of this project: it lacks step, leaves "
                         "or meta")
    want, treedef = jax.tree.flatten(template)
    got = raw["leaves"]
    if len(got) != len(want):
        raise ValueError(f"{path} holds {len(got)} arrays; this model and optimiser have "
                         f"{len(want)}: it was written for another recipe")
    leaves = []
    for i, w in enumerate(want):
        a = np.asarray(got[str(i)])
        if a.shape != tuple(w.shape) or a.dtype != np.dtype(w.dtype):
            where = jax.tree_util.keystr(jax.tree_util.tree_flatten_with_path(template)[0][i][0])
            raise ValueError(f"{path}: leaf {where} is {a.dtype} {a.shape}, this run's is "
                             f"{np.dtype(w.dtype)} {tuple(w.shape)}: another recipe's checkpoint")
        leaves.append(a)
    return int(raw["step"]), jax.tree.unflatten(treedef, leaves), json.loads(raw["meta"])
