"""The logit lens: what a model would predict after each of its layers.

One forward pass on TEXT; each layer's residual stream is read through the final norm and
the model's head, as if it were the last layer. Prints a table (a row per layer, a column
per input token, each cell the likeliest next token there and its probability) and, with
--out, draws it. The last row is the model's own prediction.

--model takes a `glassformer train lm` run, a Hugging Face GPT-2 or Llama directory,
SmolLM2-135M-Instruct, a `glassformer train mlm` run (whose rows then guess each position's
own token), or a classifier (`train classify`, `train vision`: TEXT is then an image file),
whose rows are the class each layer's pooled states would get.
"""

from __future__ import annotations

import argparse

HELP = "the logit lens: each layer's likeliest next token at every position"
EXAMPLE = 'glassformer lens --model SmolLM2-135M-Instruct "The capital of France is" --out lens.png'


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("text", help="the input text")
    p.add_argument(
        "--model", required=True, help="an lm, mlm or classifier run, or SmolLM2-135M-Instruct"
    )
    p.add_argument("--out", help="also draw it to this image (.png, .svg, .pdf)")


class _ClassNames:
    """A classifier's labels, read where a tokenizer's tokens would be."""

    kind = "labels"

    def __init__(self, labels: list[str]) -> None:
        self.labels = labels

    def id_to_token(self, i: int) -> str:
        return self.labels[i]


def _labels(path: str, model) -> list[str]:
    """A classifier run's labels; "class 0", "class 1", ... for a model saved without them."""
    from glassformer.inference import read_labels

    try:
        return read_labels(path)
    except ValueError:
        return [f"class {i}" for i in range(model.config.num_classes)]


def run(args: argparse.Namespace) -> int:
    from glassformer.inference import load_run
    from glassformer.inspect import logit_lens
    from glassformer.inspect.lens import readout
    from glassformer.viz.attention import model_inputs, save_figure
    from glassformer.viz.lens import lens_table, plot_lens

    model, tokenizer = load_run(args.model)
    vocabulary = readout(model).vocabulary  # no head at all: one line saying so
    if model.kind == "seq2seq":
        raise ValueError(
            f"{args.model} is a translator, which reads a source and a target: its decoder's "
            "lens is glassformer.inspect.logit_lens(model, src, tgt) from Python"
        )
    inputs, _, labels = model_inputs(model, tokenizer, args.text)
    lens = logit_lens(model, *inputs)
    if vocabulary is None:  # a classifier: each stage's class, from its pooled states
        tokenizer, columns = _ClassNames(_labels(args.model, model)), ["pooled"]
    else:
        columns = labels["input"]
    print(lens_table(lens, tokenizer, columns))
    if args.out:
        figure = plot_lens(lens, tokenizer, columns, title=f"logit lens of {args.model}")
        save_figure(figure, args.out)
        unit = "tokens" if vocabulary is not None else "pooled vector"
        print(f"{args.out}: {len(lens.stages)} stages × {len(columns)} {unit}")
    return 0
