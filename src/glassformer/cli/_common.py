"""Helpers the subcommands share: loading a run's model and tokenizer, reading inputs."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from glassformer.checkpoint import load_checkpoint, resolve_checkpoint_dir


def load_model_dir(path: str, kind: str) -> tuple[Any, Any, Path]:
    """(model, tokenizer, checkpoint dir) from a run directory or a checkpoint directory."""
    from glassformer.data.tokenizers import load_tokenizer

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
    return model, tokenizer, ckpt


def read_labels(ckpt: Path) -> list[str]:
    file = ckpt / "labels.json"
    if not file.is_file():
        raise ValueError(f"{ckpt} has no labels.json; it is not a classifier run")
    try:
        labels = json.loads(file.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError):
        labels = None
    if not isinstance(labels, list) or not all(isinstance(label, str) for label in labels):
        raise ValueError(f"{file} is not a JSON list of labels (strings)")
    return labels


def inputs(texts: list[str]) -> list[str]:
    """The texts given as arguments, or else one per line from standard input."""
    if texts:
        return texts
    if sys.stdin.isatty():
        raise ValueError("give the text as arguments or pipe it in, one per line")
    lines = [line.rstrip("\n") for line in sys.stdin]
    return [line for line in lines if line.strip()]


def read_lines(path: str) -> list[str]:
    """The non-blank lines of a UTF-8 text file (a clear ValueError if it is not one)."""
    from glassformer.data.files import read_text

    return [line for line in read_text(path).split("\n") if line.strip()]
