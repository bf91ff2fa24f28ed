"""Training a Keras twin with ``model.fit`` on glassformer's data, the PyTorch run's way.

``fit(RunConfig(task="classify", framework="keras"))`` lands here (``train_keras``): the
twin starts from the PyTorch model the task built (the same seed gives the same initial
weights as a PyTorch run), trains on the same batches with the same schedule, and is saved
twice: ``model.keras`` (Keras's format) and ``checkpoint/`` (the weights moved to PyTorch
with ``to_torch``, beside the tokenizer and labels), which every other command reads.

``fit`` drives ``keras.Model.fit`` with what ``glassformer.training.train`` uses, so a Keras
run and a PyTorch run of the same options differ only in the framework:

- the same batches (glassformer's resumable stream, as numpy arrays);
- the same optimiser: AdamW, β = (0.9, 0.95), decay on matrices only, global norm clipping;
- the same learning-rate function (``Schedule.lr_at``, set before every step; under a time
  budget the cosine follows the time);
- the same ``TrainState`` and hooks (progress bar, metrics.jsonl), and the same evaluation
  code, which sees the Keras model through ``TorchView``.

Only ``TorchView`` touches torch: the models themselves stay in ``keras.ops``.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

# isort: off
import glassformer.keras as gk  # first: it picks the torch backend before Keras loads
import keras

# isort: on
import numpy as np

from glassformer.checkpoint import CHECKPOINT_SUBDIR, save_checkpoint
from glassformer.models.base import ModelOutput
from glassformer.training.loop import Hook, TrainConfig, TrainState
from glassformer.training.run import MetricsLog, ProgressBar
from glassformer.training.schedules import Schedule
from glassformer.training.tasks import Task

KERAS_FILE = "model.keras"


def numpy_batches(batches: Iterable[Any]) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """glassformer's (ids (B, T), labels (B,)) batches as int32 numpy pairs, for ``fit``."""
    for ids, labels in batches:
        yield np.asarray(ids, dtype="int32"), np.asarray(labels, dtype="int32")


def compile_classifier(
    model: keras.Model, *, lr: float = 1e-3, weight_decay: float = 0.1, clip_norm: float = 1.0
) -> None:
    """Compile for ``fit``: AdamW as ``glassformer.training.make_optimizer`` builds it
    (no decay on biases and LayerNorm gains), sparse cross-entropy on the logits, accuracy."""
    if not model.built:
        model.build((None, None))
    optimizer = keras.optimizers.AdamW(
        learning_rate=lr,
        weight_decay=weight_decay,
        beta_1=0.9,
        beta_2=0.95,
        epsilon=1e-8,
        global_clipnorm=clip_norm,
    )
    optimizer.exclude_from_weight_decay(
        var_list=[v for v in model.trainable_variables if len(v.shape) < 2]
    )
    model.compile(
        optimizer=optimizer,
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=["accuracy"],
    )


def fit(
    model: keras.Model,
    batches: Iterable[Any],
    schedule: Schedule,
    config: TrainConfig,
    *,
    evaluate: Callable[[Any], dict[str, float]] | None = None,
    hooks: tuple[Hook, ...] = (),
) -> TrainState:
    """``model.fit`` (compiled) over an endless batch stream until ``config`` says stop.

    Args:
        model: a compiled Keras model (see ``compile_classifier``).
        batches: an endless iterator of (ids, labels) batches.
        schedule: the learning rate as a function of the step.
        config: ``max_steps`` and/or ``minutes``, ``eval_every``.
        evaluate: ``TorchView(model) -> metrics``, every ``eval_every`` steps and at the end.
        hooks: called as ``hook(event, state, metrics)``, as by the PyTorch loop.

    Returns:
        The final ``TrainState`` (steps, examples, seconds of training, evaluations).
    """
    steps = _Steps(schedule, config, evaluate, hooks)
    per_epoch = config.eval_every or 1000
    epochs = math.ceil(config.max_steps / per_epoch) if config.max_steps else 10**9

    def counted():
        for ids, labels in numpy_batches(batches):
            steps.examples += len(labels)
            yield ids, labels

    model.fit(
        counted(),
        steps_per_epoch=per_epoch,
        epochs=epochs,
        shuffle=False,  # the stream is shuffled already
        verbose=0,
        callbacks=[steps],
    )
    return steps.state


class _Steps(keras.callbacks.Callback):
    """Sets each step's learning rate, counts steps and time, stops, evaluates, calls hooks.

    ``loss`` in the step metrics is Keras's running mean since the last evaluation.
    """

    def __init__(self, schedule, config, evaluate, hooks) -> None:
        super().__init__()
        self.schedule, self.config, self.evaluate, self.hooks = schedule, config, evaluate, hooks
        self.state = TrainState()
        self.lr = schedule.lr
        self.examples = 0  # examples handed to fit so far, counted as they are drawn

    def emit(self, event: str, metrics: dict[str, float]) -> None:
        for hook in self.hooks:
            hook(event, self.state, metrics)

    def on_train_begin(self, logs=None) -> None:
        self.mark = time.perf_counter()

    def on_train_batch_begin(self, batch, logs=None) -> None:
        c = self.config
        progress = None
        if c.max_steps is None and c.minutes is not None:
            progress = self.state.elapsed / (c.minutes * 60)
        self.lr = self.schedule.lr_at(self.state.step, progress)
        self.model.optimizer.learning_rate = self.lr

    def on_train_batch_end(self, batch, logs=None) -> None:
        now = time.perf_counter()
        seconds, self.mark = now - self.mark, now
        s = self.state
        size, s.tokens = self.examples - s.tokens, self.examples
        s.step, s.elapsed, s.last_loss = s.step + 1, s.elapsed + seconds, float(logs["loss"])
        self.emit("step", {"loss": s.last_loss, "lr": self.lr, "tokens_per_s": size / seconds})
        if s.done(self.config):
            self.model.stop_training = True
        elif self.config.eval_every and s.step % self.config.eval_every == 0:
            self.run_eval()

    def run_eval(self) -> None:
        if self.evaluate is not None:
            metrics = {"step": self.state.step, **self.evaluate(TorchView(self.model))}
            self.state.history.append(metrics)
            self.emit("eval", metrics)
        self.mark = time.perf_counter()  # evaluation time is not training time

    def on_train_end(self, logs=None) -> None:
        try:
            self.run_eval()
        finally:
            self.emit("end", {})


class TorchView:
    """A Keras classifier as glassformer's scoring code sees a model.

    ``view(ids).logits`` is a torch tensor (from ``predict_on_batch``, no gradients);
    ``eval()`` and ``config`` are there, so ``score``, ``classify_texts`` and a task's
    ``evaluate``, ``test`` and ``show`` run unchanged on the Keras model.
    """

    def __init__(self, model: keras.Model) -> None:
        self.model, self.config = model, model.config

    def __call__(self, ids, **_: Any):
        import torch

        logits = self.model.predict_on_batch(np.asarray(ids, dtype="int32"))
        return ModelOutput(torch.as_tensor(np.asarray(logits)))

    def eval(self) -> TorchView:
        return self


def train_keras(
    task: Task,
    schedule: Schedule,
    config: TrainConfig,
    out: Path,
    *,
    seed: int,
    lr: float,
    weight_decay: float,
    clip_norm: float,
    hooks: tuple[Hook, ...] = (),
) -> tuple[TorchView, TrainState]:
    """Train the task's model as a Keras twin into the run directory ``out``: (the twin as
    the scoring code sees it, the final state)."""
    keras.utils.set_random_seed(seed)
    model = gk.from_torch(task.model)
    compile_classifier(model, lr=lr, weight_decay=weight_decay, clip_norm=clip_norm)
    hooks = (
        ProgressBar(config, TrainState(), unit=task.unit),
        MetricsLog(out / "metrics.jsonl"),
        *hooks,
    )
    state = fit(model, task.batches, schedule, config, evaluate=task.evaluate, hooks=hooks)
    partial = out / f".{KERAS_FILE}.partial.keras"  # Keras wants the suffix; rename when whole
    model.save(partial)
    os.replace(partial, out / KERAS_FILE)
    save_checkpoint(gk.to_torch(model), out / CHECKPOINT_SUBDIR, extra_files=task.extra_files)
    return TorchView(model), state
