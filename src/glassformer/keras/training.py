"""Where the Keras twin's training driver used to live; it is now
``glassformer.training.keras_fit`` (training sits above the twin in the layering). The
names stay importable from here."""

from glassformer.training.keras_fit import (
    TorchView,
    compile_classifier,
    fit,
    numpy_batches,
)

__all__ = ["TorchView", "compile_classifier", "fit", "numpy_batches"]
