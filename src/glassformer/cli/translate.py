"""Translate sentences with a trained translator (from `glassformer train translate`).

Sentences come as arguments or one per line on standard input.
"""

from __future__ import annotations

import argparse

from glassformer.cli._common import inputs, load_model_dir
from glassformer.training.tasks import translate_texts

HELP = "translate sentences with a trained translator"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("text", nargs="*", help="sentences (default: read lines from stdin)")
    p.add_argument("--model", default="runs/translate", help="run or checkpoint directory")
    p.add_argument("--batch-size", type=int, default=32)


def run(args: argparse.Namespace) -> int:
    model, tok, _ = load_model_dir(args.model, "seq2seq")
    texts = inputs(args.text)
    for line in translate_texts(model, tok, texts, batch_size=args.batch_size):
        print(line)
    return 0
