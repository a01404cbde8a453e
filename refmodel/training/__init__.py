"""Small byte-level models trained here with optax on the Python standard library's source.

    result = refmodel.training.train(refmodel.training.recipes.get("target"))
    model = refmodel.training.trained("draft")       # cached checkpoint, trained if missing

`python -m refmodel train [--recipe NAME ...]` trains from the command line with a progress
bar. Files: `data.py` (the corpus, the split, the batches), `recipes.py` (what to train),
`loop.py` (optimiser, step, validation in bits per byte), `checkpoint.py` (atomic, exact).
"""

from refmodel.training import checkpoint, data, recipes
from refmodel.training.loop import (
    Result,
    Trainer,
    bits_per_byte,
    cache_dir,
    checkpoint_path,
    train,
    trained,
)

__all__ = ["Result", "Trainer", "bits_per_byte", "cache_dir", "checkpoint", "checkpoint_path",
           "data", "recipes", "train", "trained"]
