"""What the tasks share: where the text comes from, the ``Task`` they build, and
the resumable batch stream.

A task turns a ``RunConfig`` (a corpus name or the user's file, a tokenizer kind, a
preset) into a ``Task``: the tokenizer, the model, the resumable training batches, the
evaluation and what shows a person what the model does. The training loop and the run
directory know nothing of tasks; ``fit`` joins them.
"""

from __future__ import annotations

import json
import random
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Protocol, runtime_checkable

import torch
from torch import nn

from glassformer.data.images import ImageProcessor
from glassformer.data.tokenizers import Tokenizer
from glassformer.models import PretrainedModel
from glassformer.training.config import RunConfig, filled

VALIDATION_FRACTION = 0.1  # of a user's file, held out


@runtime_checkable
class ResumableBatches(Protocol):
    """An endless iterator of batches whose position can be saved and restored, so a
    resumed run sees exactly the batches the uninterrupted one would have seen."""

    def __iter__(self) -> Iterator[Any]: ...

    def __next__(self) -> Any: ...

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: dict[str, Any]) -> None: ...


@dataclass(kw_only=True)
class Task:
    """Everything ``fit`` needs to train and show one task: the tokenizer (for vision, the
    images' size and channels), the model, the resumable training batches and the loss;
    each task's module subclasses it with what it evaluates (``evaluate``, during training),
    reports on held-out data (``test``, at the end) and shows a person (``show``).

    Every task module has one ``build(config, *, tokenizer, labels, world) -> Task``
    (``glassformer.training.tasks.BUILDERS``)."""

    name: ClassVar[str]
    unit: ClassVar[str] = "tok"  # what tokens_per_s counts
    config: RunConfig
    tokenizer: Tokenizer | ImageProcessor
    model: PretrainedModel
    batches: ResumableBatches
    loss_fn: Callable[[nn.Module, Any], tuple[torch.Tensor, int]]
    extra_files: dict[str, bytes] = field(default_factory=dict)
    description: str = ""

    def evaluate(self, model: nn.Module) -> dict[str, float]:
        """The figures logged at each evaluation (the validation loss, ...)."""
        raise NotImplementedError

    def test(self, model: nn.Module) -> dict[str, float]:
        """The held-out figures reported at the end (results.json)."""
        raise NotImplementedError

    def show(self, model: nn.Module) -> str:
        """What the model does, for a person to read (samples.txt)."""
        raise NotImplementedError


def model_overrides(config: RunConfig, layers: tuple[str, ...] = ("num_layers",)) -> dict:
    """The model fields a run sets itself (the rest come from its preset); ``num_layers``
    goes to each of ``layers`` (the translator's two stacks)."""
    names = ("d_model", "num_heads", "d_ff", "dropout", "norm_first", "bias", "positional",
             "attention_window", "global_tokens")  # fmt: skip
    overrides = {name: getattr(config, name) for name in names if getattr(config, name) is not None}
    if config.num_layers:
        overrides.update(dict.fromkeys(layers, config.num_layers))
    return overrides


def text_tokenizer(
    config: RunConfig, given: Tokenizer | ImageProcessor | None, texts: list[str]
) -> Tokenizer:
    """The run's tokenizer: ``given`` (a resumed run's), or the kind the config asks for
    trained on ``texts``."""
    from glassformer.data.tokenizers import train_tokenizer

    if isinstance(given, ImageProcessor):
        raise ValueError(f"a {config.task} run reads text, not images")
    if given is not None:
        return given
    return train_tokenizer(
        filled(config.tokenizer),
        texts,
        vocab_size=filled(config.vocab_size),
        lowercase=bool(config.lowercase),
    )


def labels_file(labels: list[str]) -> bytes:
    """A classifier's labels, in the order of its outputs (labels.json)."""
    return (json.dumps(labels, indent=1) + "\n").encode()


def load_splits(config: RunConfig):
    """(train, validation, test, description) of the run's data: its bundled corpus or
    the user's file (of which ``VALIDATION_FRACTION`` is held out)."""
    from glassformer.data import corpora, files

    task = "lm" if config.task in ("mlm", "sae", "transcoder") else config.task  # plain text
    if config.corpus:
        s = corpora.load_corpus(config.corpus, task)
        return s.train, s.validation, s.test, s.description
    path = str(config.data)  # a built config holds a corpus or a file
    if task == "vision":  # a folder with a sub-folder of images per class
        from glassformer.data.images import read_image_folder

        rows: list[Any] = read_image_folder(path)[0]
    elif task == "lm":
        text = files.read_text(path)
        cut = int(len(text) * (1 - VALIDATION_FRACTION))
        return text[:cut], text[cut:], "", f"{path}: {len(text):,} characters"
    elif config.task == "translate":
        rows = files.read_pairs(path, src_column=config.src_column, tgt_column=config.tgt_column)
    else:
        rows = files.read_labelled(
            path, text_column=config.text_column, label_column=config.label_column
        )
    rows = list(rows)
    random.Random(0).shuffle(rows)  # a fixed split of the user's rows
    n_val = max(1, int(len(rows) * VALIDATION_FRACTION))
    if len(rows) < 2:
        raise ValueError(f"{path} has {len(rows)} usable row(s); need at least 2")
    return rows[n_val:], rows[:n_val], [], f"{path}: {len(rows):,} rows"


def tokenizer_files(tokenizer: Tokenizer) -> dict[str, bytes]:
    """The files a checkpoint keeps the tokenizer in: tokenizer.json, and the
    tokenizer_config.json of one whose special tokens or chat template it does not hold."""
    with tempfile.TemporaryDirectory() as d:
        tokenizer.save(d)
        return {f.name: f.read_bytes() for f in sorted(Path(d).iterdir())}


class MappedBatches:
    """A resumable batch iterator with a collate function applied; endless (epochs repeat)."""

    def __init__(self, source, fn: Callable[[Any], Any]) -> None:
        self.source, self.fn = source, fn
        self._it: Iterator[Any] | None = None

    def __iter__(self):
        return self

    def __next__(self):
        while True:
            if self._it is None:
                self._it = iter(self.source)
            try:
                return self.fn(next(self._it))
            except StopIteration:
                self._it = None  # the source moves to its next epoch

    def state_dict(self) -> dict[str, Any]:
        return self.source.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.source.load_state_dict(state)
        self._it = None
