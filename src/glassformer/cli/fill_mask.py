"""Fill in the [MASK] of a text with a masked-language model (a `glassformer train mlm` run).

For each [MASK], the model's likeliest tokens with their probabilities, then the text with
each [MASK] replaced by the first guess.

    glassformer fill-mask --model runs/mlm "The film was [MASK]."
"""

from __future__ import annotations

import argparse

HELP = "guess the words hidden by [MASK] with a masked-language model"
EXAMPLE = 'glassformer fill-mask --model runs/mlm "the film was [MASK] ."'


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("text", help="a text with one or more [MASK]")
    p.add_argument("--model", default="runs/mlm", help="an mlm run or checkpoint directory")
    p.add_argument("--top-k", type=int, default=5, help="guesses shown for each [MASK]")


def run(args: argparse.Namespace) -> int:
    from glassformer.inference import fill_mask, load_run

    if args.top_k <= 0:
        raise ValueError(f"--top-k must be positive, got {args.top_k}")
    model, tokenizer = load_run(args.model, kind="encoder_lm")
    guesses = fill_mask(model, tokenizer, args.text, top_k=args.top_k)
    filled = args.text
    for i, options in enumerate(guesses, start=1):
        print(f"[MASK] {i}:")
        for rank, (token, p) in enumerate(options, start=1):
            print(f"  {rank}. {token:<16} {p:.3f}")
        filled = filled.replace("[MASK]", options[0][0].removeprefix("##"), 1)
    print(filled)
    return 0
