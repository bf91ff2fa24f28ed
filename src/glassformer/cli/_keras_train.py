"""`glassformer train classify --framework keras`: the classifier's Keras twin, trained by fit.

The twin starts from the PyTorch model the task built (the same seed gives the same
initial weights as a PyTorch run), trains on the same batches with the same schedule, and
is saved twice: ``model.keras`` (Keras's format) and ``checkpoint/`` (the weights moved to
PyTorch with ``to_torch``, beside the tokenizer and labels), which every other command reads.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from glassformer.checkpoint import CHECKPOINT_SUBDIR, save_checkpoint
from glassformer.training import Schedule, TrainConfig, TrainState
from glassformer.training.run import MetricsLog, ProgressBar

KERAS_FILE = "model.keras"


def train_keras(
    o: dict[str, Any], task, schedule: Schedule, config: TrainConfig, out: Path
) -> tuple[Any, TrainState]:
    """Train the task's model as a Keras twin: (the twin as the scoring code sees it, state)."""
    # isort: off
    import glassformer.keras as gk  # first: it picks the torch backend before Keras loads
    import keras
    from glassformer.keras.training import TorchView, compile_classifier, fit

    # isort: on

    keras.utils.set_random_seed(o["seed"])
    model = gk.from_torch(task.model)
    compile_classifier(model, lr=o["lr"], weight_decay=o["weight_decay"], clip_norm=o["clip_norm"])
    hooks = (
        ProgressBar(config, TrainState(), unit=task.unit),
        MetricsLog(out / "metrics.jsonl"),
    )
    state = fit(model, task.batches, schedule, config, evaluate=task.evaluate, hooks=hooks)
    partial = out / f".{KERAS_FILE}.partial.keras"  # Keras wants the suffix; rename when whole
    model.save(partial)
    os.replace(partial, out / KERAS_FILE)
    save_checkpoint(gk.to_torch(model), out / CHECKPOINT_SUBDIR, extra_files=task.extra_files)
    return TorchView(model), state
