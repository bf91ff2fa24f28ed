"""What the tasks share: where the text comes from, the ``Task`` they build, and
the resumable batch stream.

A task turns a ``RunConfig``'s data and model options (a corpus name or the user's file,
a tokenizer kind, a preset) into a ``Task``: the tokenizer, the model, the resumable
training batches, the evaluation and a function that shows a person what the model does.
The training loop and the run directory know nothing of tasks; ``fit`` joins them.
"""

from __future__ import annotations

import random
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import torch
from torch import nn

from glassformer.data.images import ImageProcessor
from glassformer.data.tokenizers import Tokenizer
from glassformer.models import PretrainedModel
from glassformer.training.config import TASK_DEFAULTS, TASKS

# the task defaults RunConfig fills in, for DataOptions built without one
DEFAULT_CORPUS: dict[str, str] = {task: TASK_DEFAULTS[task]["corpus"] for task in TASKS}
DEFAULT_TOKENIZER: dict[str, str] = {
    task: TASK_DEFAULTS[task]["tokenizer"] for task in TASKS if "tokenizer" in TASK_DEFAULTS[task]
}  # vision reads images: no tokenizer


@runtime_checkable
class ResumableBatches(Protocol):
    """An endless iterator of batches whose position can be saved and restored, so a
    resumed run sees exactly the batches the uninterrupted one would have seen."""

    def __iter__(self) -> Iterator[Any]: ...

    def __next__(self) -> Any: ...

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: dict[str, Any]) -> None: ...


@dataclass(kw_only=True)
class DataOptions:
    """Where the text comes from and how it becomes token ids."""

    task: str
    corpus: str | None = None  # a bundled corpus name
    data: str | None = None  # or the user's file
    tokenizer: str | None = None  # "char" | "bpe" | "wordpiece"; per-task default
    vocab_size: int = 8000  # for bpe / wordpiece
    lowercase: bool = False  # lower-case text before tokenizing (WordPiece also strips accents)
    src_column: str | int = 0
    tgt_column: str | int = 1
    text_column: str | int = "text"
    label_column: str | int = "label"
    validation_fraction: float = 0.1  # of a user's file, held out
    max_examples: int | None = None  # cap the training examples (quick runs)

    @property
    def tokenizer_kind(self) -> str:
        """The tokenizer asked for, or the task's default."""
        return self.tokenizer or DEFAULT_TOKENIZER[self.task]

    def __post_init__(self) -> None:
        if self.task not in TASKS:
            raise ValueError(f"task must be one of {list(TASKS)}, got {self.task!r}")
        if self.corpus and self.data:
            raise ValueError("give --corpus or --data, not both")
        if not self.data and not self.corpus:
            self.corpus = DEFAULT_CORPUS[self.task]
        self.tokenizer = self.tokenizer or DEFAULT_TOKENIZER.get(self.task)
        if not 0.0 < self.validation_fraction < 0.5:
            raise ValueError(
                f"validation fraction must be in (0, 0.5), got {self.validation_fraction}"
            )


@dataclass(kw_only=True)
class Task:
    """Everything the CLI needs to train and show one task."""

    name: str
    tokenizer: Tokenizer | ImageProcessor  # vision: the images' size and channels
    model: PretrainedModel
    batches: ResumableBatches
    loss_fn: Callable[[nn.Module, Any], tuple[torch.Tensor, int]]
    evaluate: Callable[[nn.Module], dict[str, float]]
    show: Callable[[nn.Module], str]
    unit: str = "tok"  # what tokens_per_s counts
    extra_files: dict[str, bytes] = field(default_factory=dict)
    description: str = ""
    test: Callable[[nn.Module], dict[str, float]] | None = None  # held-out figures, at the end


def load_splits(opts: DataOptions):
    """(train, validation, test) for the task, from the bundled corpus or the user's file."""
    from glassformer.data import corpora, files

    task = "lm" if opts.task == "mlm" else opts.task  # both read plain text
    if opts.corpus:
        s = corpora.load_corpus(opts.corpus, task)
        return s.train, s.validation, s.test, s.description
    path = str(opts.data)  # DataOptions holds a corpus or a file
    if task == "vision":  # a folder with a sub-folder of images per class
        from glassformer.data.images import read_image_folder

        rows: list[Any] = read_image_folder(path)[0]
    elif task == "lm":
        text = files.read_text(path)
        cut = int(len(text) * (1 - opts.validation_fraction))
        return text[:cut], text[cut:], "", f"{path}: {len(text):,} characters"
    elif opts.task == "translate":
        rows = files.read_pairs(path, src_column=opts.src_column, tgt_column=opts.tgt_column)
    else:
        rows = files.read_labelled(
            path, text_column=opts.text_column, label_column=opts.label_column
        )
    rows = list(rows)
    random.Random(0).shuffle(rows)  # a fixed split of the user's rows
    n_val = max(1, int(len(rows) * opts.validation_fraction))
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
