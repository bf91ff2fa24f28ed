"""The logit lens: what a decoder-only model would predict after each of its layers.

One forward pass on TEXT; each layer's residual stream is read through the final norm and
the unembedding, as if it were the last layer. Prints a table (a row per layer, a column
per input token, each cell the likeliest next token there and its probability) and, with
--out, draws it. The last row is the model's own prediction.

--model takes a `glassformer train lm` run, a Hugging Face GPT-2 or Llama directory,
SmolLM2-135M-Instruct, or a `glassformer train mlm` run (whose rows then guess each
position's own token).
"""

from __future__ import annotations

import argparse

HELP = "the logit lens: each layer's likeliest next token at every position"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("text", help="the input text")
    p.add_argument("--model", required=True, help="an lm or mlm run, or SmolLM2-135M-Instruct")
    p.add_argument("--out", help="also draw it to this image (.png, .svg, .pdf)")


def run(args: argparse.Namespace) -> int:
    import torch

    from glassformer.inference import load_run
    from glassformer.inspect import logit_lens
    from glassformer.viz.attention import save_figure, token_labels
    from glassformer.viz.lens import lens_table, plot_lens

    model, tokenizer = load_run(args.model)
    if model.kind not in ("gpt", "encoder_lm"):
        raise ValueError(
            f"{args.model} holds a {model.kind!r} model; the lens reads a GPT or an encoder LM "
            "(a translator's decoder: glassformer.inspect.logit_lens from Python)"
        )
    ids = tokenizer.encode(args.text)
    if not ids:
        raise ValueError(f"the text {args.text!r} encodes to no tokens")
    lens = logit_lens(model, torch.tensor([ids]))
    inputs = token_labels(tokenizer, ids)
    print(lens_table(lens, tokenizer, inputs))
    if args.out:
        save_figure(
            plot_lens(lens, tokenizer, inputs, title=f"logit lens of {args.model}"), args.out
        )
        print(f"{args.out}: {len(lens.stages)} stages × {len(ids)} tokens")
    return 0
