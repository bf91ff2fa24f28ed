"""Print a step-by-step account of one real forward pass on TEXT.

Each line is one step — token embedding, positions, and in every block the norms, Q, K
and V per head, the scaled and masked scores, the softmax, the weighted sum, the output
projection, the residual sums, the MLP — then the final norm and the output, with the
tensor's shape and its first values (first example, first head, first position). Every
value is the model's own, read at its hook points (``run_with_cache``), in the order the
forward pass reached them. A ViT's TEXT is an image file.

--model takes the same directories as `glassformer attention` (or all-MiniLM-L6-v2).
"""

from __future__ import annotations

import argparse

HELP = "print every step of a forward pass with shapes and values"
EXAMPLE = 'glassformer trace --model runs/austen "It is a truth" --layer 1'


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("text", help="the input text (a translator's source sentence)")
    p.add_argument("--model", required=True, help="run, checkpoint or pretrained directory")
    p.add_argument("--target", help="a translator's target sentence (default: its translation)")
    p.add_argument("--layer", type=int, help="trace only this layer of each stack (from 1)")
    p.add_argument("--values", type=int, default=4, help="values shown per tensor")


def run(args: argparse.Namespace) -> int:
    from glassformer.inference import load_run
    from glassformer.viz.attention import model_inputs
    from glassformer.viz.trace import format_trace, trace

    if args.values < 0:
        raise ValueError(f"--values must be 0 or more, got {args.values}")
    model, tokenizer = load_run(args.model)
    _, _, labels = model_inputs(model, tokenizer, args.text, args.target)
    for role, tokens in labels.items():
        print(f"{role} tokens ({len(tokens)}): {' '.join(tokens)}")
    steps = trace(
        model, tokenizer, args.text, layer=args.layer, target=args.target, values=args.values
    )
    print(format_trace(steps))
    return 0
