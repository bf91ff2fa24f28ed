"""Print a step-by-step account of one real forward pass on TEXT.

Each line is one step — token embedding, positional encoding, and in every layer the
Q/K/V projections, the split into heads, scores, scaling, mask, softmax, the weighted
sum, the merge, residual sums, LayerNorms, the feed-forward network — then the output,
with the tensor's shape and its first values (first example, first head, first
position). Forward hooks record it; attention's inner steps are recomputed from the
module's weights and checked against what the module returned.

--model takes the same directories as `glassformer attention` (or all-MiniLM-L6-v2).
"""

from __future__ import annotations

import argparse

HELP = "print every step of a forward pass with shapes and values"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("text", help="the input text (a translator's source sentence)")
    p.add_argument("--model", required=True, help="run, checkpoint or pretrained directory")
    p.add_argument("--target", help="a translator's target sentence (default: its translation)")
    p.add_argument("--layer", type=int, help="trace only this layer of each stack (from 1)")
    p.add_argument("--values", type=int, default=4, help="values shown per tensor")


def run(args: argparse.Namespace) -> int:
    from glassformer.cli.attention import load_model_and_tokenizer
    from glassformer.viz.attention import model_inputs
    from glassformer.viz.trace import format_trace, trace

    if args.values < 0:
        raise ValueError(f"--values must be 0 or more, got {args.values}")
    model, tokenizer = load_model_and_tokenizer(args.model)
    _, _, labels = model_inputs(model, tokenizer, args.text, args.target)
    for role, tokens in labels.items():
        print(f"{role} tokens ({len(tokens)}): {' '.join(tokens)}")
    steps = trace(
        model, tokenizer, args.text, layer=args.layer, target=args.target, values=args.values
    )
    print(format_trace(steps))
    return 0
