"""Training: the corpus and its split, the loss falls, checkpoints round-trip and resume exactly."""

import dataclasses
import math
import subprocess
import sys

import jax
import numpy as np
import pytest

from refmodel import training
from refmodel.training import checkpoint, data

MICRO = dataclasses.replace(training.recipes.get("micro"), steps=16, eval_every=8,
                            checkpoint_every=8)


def test_corpus_is_the_standard_library_split_by_file():
    files = data.source_files()
    root = data.stdlib_dir()
    assert all(p.suffix == ".py" for p in files) and files == sorted(files)
    assert not any(part in data.SKIP_DIRS for p in files for part in p.relative_to(root).parts)
    rel = [p.relative_to(root).as_posix() for p in files]
    val = [r for r in rel if data.is_validation(r)]
    assert 0.02 < len(val) / len(rel) < 0.09  # VAL_FRACTION 0.05 of the files, by hash
    assert val == [r for r in rel if data.is_validation(r)]  # deterministic
    c = data.load(max_bytes=500_000)
    assert c.train[0] == data.BOS and c.val[0] == data.BOS and c.train.max() <= data.BOS
    text = "def f(x):\n    return x  # ünïcode\n"
    assert data.decode(data.encode(text)[1:]) == text


def test_batches_depend_only_on_seed_and_step():
    c = data.load(max_bytes=500_000)
    a = data.train_batch(c, 0, 7, 4, 32)
    assert a.shape == (4, 33) and a.dtype == np.int32
    np.testing.assert_array_equal(a, data.train_batch(c, 0, 7, 4, 32))
    assert not np.array_equal(a, data.train_batch(c, 0, 8, 4, 32))


def test_loss_falls_and_a_stopped_run_resumes_onto_the_same_curve(tmp_path):
    """A micro model: validation bits per byte fall from the uniform 8.0; a run stopped at
    step 8 and resumed from its checkpoint ends with the very parameters and losses of a
    run that went straight through."""
    straight = training.train(MICRO, root=tmp_path / "a", progress=False)
    vals = [h["val_bpb"] for h in straight.history if "val_bpb" in h]
    assert len(vals) == 2 and vals[-1] < vals[0] < math.log2(data.VOCAB)
    assert straight.history[0]["loss_bpb"] > straight.history[-1]["loss_bpb"]
    first = training.train(MICRO, root=tmp_path / "b", stop_at=8, progress=False)
    assert first.step == 8 and first.path.exists()
    resumed = training.train(MICRO, root=tmp_path / "b", progress=False)
    assert resumed.step == 16
    for a, b in zip(jax.tree.leaves(straight.model), jax.tree.leaves(resumed.model),
                    strict=True):
        np.testing.assert_array_equal(a, b)
    assert resumed.val_bpb == straight.val_bpb
    assert [h["loss_bpb"] for h in resumed.history] == [h["loss_bpb"] for h in straight.history]
    assert not list((tmp_path / "b" / "checkpoints").glob("*.tmp"))  # nothing half-written


def test_checkpoint_refuses_another_model_and_a_corrupt_file(tmp_path):
    path = tmp_path / "x.ckpt"
    checkpoint.save(path, 3, {"w": np.ones((2, 3), np.float32)}, {"note": "hi"})
    step, tree, meta = checkpoint.load(path, {"w": np.zeros((2, 3), np.float32)})
    assert step == 3 and meta == {"note": "hi"}
    np.testing.assert_array_equal(tree["w"], np.ones((2, 3)))
    with pytest.raises(ValueError, match=r"\['w'\] is float32 \(2, 3\), this run's is "
                                         r"float32 \(3, 2\)"):
        checkpoint.load(path, {"w": np.zeros((3, 2), np.float32)})
    path.write_bytes(b"\x00not a checkpoint")
    with pytest.raises(ValueError, match="is not a checkpoint"):
        checkpoint.load(path, {"w": np.zeros((2, 3), np.float32)})


def test_bad_recipe_is_named():
    with pytest.raises(ValueError, match="recipe 'nope' is unknown"):
        training.recipes.get("nope")
    with pytest.raises(ValueError, match="warmup=30 must be in"):
        dataclasses.replace(MICRO, warmup=30)
    out = subprocess.run([sys.executable, "-m", "refmodel", "train", "--recipe", "nope"],
                         capture_output=True, text=True)
    assert out.returncode == 2 and "recipe 'nope' is unknown" in out.stderr
