"""Using a trained model: load a run, and (for the CLI and evaluation alike) translate or
classify texts with it.

    >>> model, tokenizer = glassformer.load_run("runs/lm")              # doctest: +SKIP
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from glassformer.checkpoint import load_checkpoint, resolve_checkpoint_dir
from glassformer.data.tokenizers import Tokenizer, load_tokenizer

LABELS_FILE = "labels.json"


def load_run(path: str | Path, *, kind: str | None = None) -> tuple[Any, Tokenizer]:
    """(model, tokenizer) of a run directory (or the checkpoint directory in one).

    Args:
        path: what ``glassformer train`` / ``glassformer.fit`` wrote (``--out``), or its
            ``checkpoint/``.
        kind: the model kind expected ("gpt", "seq2seq", "classifier", ...); another is
            an error.
    """
    model = load_checkpoint(path, kind=kind)
    ckpt = resolve_checkpoint_dir(path)
    if not (ckpt / "tokenizer.json").is_file():
        raise ValueError(f"{ckpt} has no tokenizer.json; was it written by `glassformer train`?")
    tokenizer = load_tokenizer(ckpt)
    vocab = getattr(model.config, "vocab_size", None) or model.config.tgt_vocab_size
    if tokenizer.vocab_size != vocab:
        raise ValueError(
            f"tokenizer in {ckpt} has {tokenizer.vocab_size} tokens but the model expects {vocab}"
        )
    return model, tokenizer


def read_labels(path: str | Path) -> list[str]:
    """A classifier run's labels, in the order of the model's outputs."""
    ckpt = resolve_checkpoint_dir(path)
    file = ckpt / LABELS_FILE
    if not file.is_file():
        raise ValueError(f"{ckpt} has no {LABELS_FILE}; it is not a classifier run")
    try:
        labels = json.loads(file.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError):
        labels = None
    if not isinstance(labels, list) or not all(isinstance(label, str) for label in labels):
        raise ValueError(f"{file} is not a JSON list of labels (strings)")
    return labels
