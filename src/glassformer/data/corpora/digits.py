"""The digits corpus (vision): 1,797 handwritten digits, 8×8 grey pixels, from inside
scikit-learn (``sklearn.datasets.load_digits``, the UCI optical-recognition set's test
part; nothing is downloaded).

Each image is (1, 8, 8) floats 0..1 (sklearn's 0..16 ink levels / 16: 1 is full ink), its
label the digit "0".."9". Per digit, a shuffle seeded with ``SEED`` puts a fifth (rounded)
in test and a tenth of the rest in validation: 1,295 / 143 / 359 train / validation / test.
"""

from __future__ import annotations

from pathlib import Path

import torch

from glassformer.data.corpora._splits import Splits, seeded_shuffle
from glassformer.errors import MissingDependencyError

DIGITS_TEST = 0.2  # per digit, held out for the test
DIGITS_VALIDATION = 0.1  # of the rest, per digit


def load(root: Path, task: str) -> Splits:
    """The digits splits: lists of (image (1, 8, 8), label). ``root`` (the cache) is not
    used: the images ship inside scikit-learn."""
    try:
        from sklearn.datasets import load_digits
    except ImportError:
        raise MissingDependencyError(
            "the digits corpus ships inside scikit-learn: pip install 'glassformer[vision]'"
        ) from None
    digits = load_digits()
    images = torch.from_numpy(digits.images).float().div(16.0).unsqueeze(1)  # (1797, 1, 8, 8)
    labels = [str(int(t)) for t in digits.target]
    train, validation, test = [], [], []
    for digit in sorted(set(labels)):
        rows = seeded_shuffle([i for i, label in enumerate(labels) if label == digit], digit)
        n_test = round(len(rows) * DIGITS_TEST)
        n_val = round((len(rows) - n_test) * DIGITS_VALIDATION)
        test += rows[:n_test]
        validation += rows[n_test : n_test + n_val]
        train += rows[n_test + n_val :]
    train_rows, validation_rows, test_rows = (
        [(images[i], labels[i]) for i in sorted(part)] for part in (train, validation, test)
    )
    description = (
        f"digits: {len(labels):,} handwritten digits, 8×8 grey (UCI, via scikit-learn's "
        f"load_digits, BSD licence), {len(train):,} / {len(validation):,} / {len(test):,} "
        "train / validation / test"
    )
    return Splits(train_rows, validation_rows, test_rows, description)
