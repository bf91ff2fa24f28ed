"""Explain: one real forward pass of any model as an offline page to explore.

Writes one self-contained HTML file (no network): the model as a flow (the residual stream
with each block on it; a translator's encoder beside its decoder, the encoder's output
flowing into each cross-attention; a ViT's image as its patches); click a place for its
sub-layers, a sub-layer for its steps, a step for its real tensor (exact values on hover), its
shape, its formula and the line of glassformer's source that computed it; inside attention,
one query and one key's products that make the score. The output (a language model's next
token, a classifier's classes, a translator's next token after each target position) is
recomputed in the page under temperature, top-k and top-p.

A model of up to 5 M parameters whose every step the page can compute (GPT-shaped language
models and classifiers, encoders, the paper's translator, the ViT: the demo's classifier, the
tutorial's char GPTs) gets a live page: its weights and tokenizer travel in it, and the page
runs the model on whatever the reader types into its box (a translator decoding it step by
step), redrawing every level (--fixed: the page of TEXT alone). Other models get the
page of TEXT: at most 5 MB, steps that follow from earlier ones travel as their rule, then
float16 values and fewer features a step; SmolLM2-135M's page holds up to 50 tokens.

    glassformer explain --model SmolLM2-135M-Instruct "The capital of France is" --out page.html
"""

from __future__ import annotations

import argparse

from glassformer.models.base import PretrainedModel

HELP = "one forward pass as an offline page: every step, its numbers and its source line"
EXAMPLE = 'glassformer explain --model SmolLM2-135M-Instruct "The capital of France is"'


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", required=True, help="a run directory or a packaged model")
    p.add_argument("text", help="the input (a ViT: an image file)")
    p.add_argument("--target", help="a translator's target sentence; None: its own translation")
    p.add_argument("--out", default="explain.html", help="the page (.html)")
    p.add_argument(
        "--fixed", action="store_true", help="the page of TEXT alone, even for a live model"
    )


def run(args: argparse.Namespace) -> int:
    from glassformer.inference import load_run
    from glassformer.viz.explain import explain_html
    from glassformer.viz.live import try_live

    if not args.out.endswith(".html"):
        raise ValueError(f"--out must name an .html file, got {args.out!r}")
    model, tokenizer = load_run(args.model)
    labels = _labels(args.model, model)
    page, why = None, "--fixed" if args.fixed else None if args.target is None else "--target"
    if why is None:
        page, why = try_live(model, tokenizer, args.text, labels, _calibration_texts(args.model))
    if page is None:
        page = explain_html(model, tokenizer, args.text, target=args.target, labels=labels)
    path = page.save(args.out)
    what = "a live page: type any text" if why is None else f"the page of this text ({why})"
    print(f"{path}: {len(page.html.encode()) / 1e6:.2f} MB, {what}; open it in a browser "
          "(offline)")  # fmt: skip
    return 0


def _labels(path: str, model: PretrainedModel) -> list[str] | None:
    """A classifier's class names, from its run's labels.json, refused where their number is
    not the model's, as ``classify`` refuses them (None for a model without classes)."""
    from glassformer.checkpoint import resolve_checkpoint_dir
    from glassformer.cli.classify import CLASSIFIER_KINDS
    from glassformer.inference import read_labels

    if model.kind not in CLASSIFIER_KINDS:
        return None
    ckpt = resolve_checkpoint_dir(path)
    labels, classes = read_labels(ckpt), model.config.num_classes
    if len(labels) != classes:
        raise ValueError(f"{ckpt}/labels.json has {len(labels)} labels, the model {classes}")
    return labels


def _calibration_texts(path: str, n: int = 20) -> list[str]:
    """Up to ``n`` texts of the run's own test split (a bundled corpus), on which a live page
    that rounds its weights measures each step's bound; none for other models."""
    from glassformer.data import load_corpus
    from glassformer.training.config import RunConfig

    try:
        config = RunConfig.from_run(path)
    except (OSError, ValueError):  # a packaged model, a GGUF file, a Hub id: no run
        return []
    if config.corpus is None or config.data is not None:
        return []
    try:
        test = load_corpus(config.corpus, config.task).test
    except ValueError:  # a task its corpus serves as "lm" (the masked LM's text)
        test = load_corpus(config.corpus, "lm").test
    if isinstance(test, str):  # a language model's text: its paragraphs
        return [p for p in test.split("\n\n") if len(p.split()) >= 8][:n]
    return [item[0] if isinstance(item, tuple) else str(item) for item in test[:n]]
