"""Classify texts with a trained classifier (from `glassformer train classify`), or image
files with a Vision Transformer (from `glassformer train vision`).

Texts (or image paths) come as arguments or one per line on standard input; each output
line is "label<TAB>probability<TAB>text" (or the image's path). An image must have the
size the model reads, unless --resize scales it.
"""

from __future__ import annotations

import argparse

from glassformer.cli._common import inputs, load_model_dir
from glassformer.inference import classify_texts, read_labels

HELP = "classify texts with a trained classifier"
EXAMPLE = (
    'glassformer classify --model runs/demo-imdb "A moving film." "A dull plot and wooden acting."'
)
# trained from scratch, or fine-tuned from a BERT-style encoder (train classify --init)
CLASSIFIER_KINDS = ("classifier", "bert_classifier", "gpt_classifier")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "text", nargs="*", help="texts, or image files for a vision run (default: stdin lines)"
    )
    p.add_argument("--model", default="runs/classify", help="run or checkpoint directory")
    p.add_argument(
        "--resize", action="store_true", help="vision: scale images to the size the model reads"
    )


def run(args: argparse.Namespace) -> int:
    model, tok, ckpt = load_model_dir(args.model, None)
    if model.kind == "vit":
        return _images(model, tok, read_labels(ckpt), inputs(args.text), args.resize)
    if args.resize:
        raise ValueError("--resize is for images; this is a text classifier")
    if model.kind not in CLASSIFIER_KINDS:
        raise ValueError(f"{ckpt} holds a {model.kind!r} model, expected 'classifier'")
    labels = read_labels(ckpt)
    if len(labels) != model.config.num_classes:
        raise ValueError(
            f"{ckpt}/labels.json has {len(labels)} labels, the model {model.config.num_classes}"
        )
    texts = inputs(args.text)
    for text, (label, p) in zip(texts, classify_texts(model, tok, labels, texts), strict=True):
        snippet = text if len(text) <= 70 else text[:67] + "..."
        print(f"{label}\t{p:.3f}\t{snippet}")
    return 0


def _images(model, processor, labels: list[str], paths: list[str], resize: bool) -> int:
    """Print the class and probability of each image file."""
    import torch

    from glassformer.inference import classify_images

    images = torch.stack([processor.open(path, resize=resize) for path in paths])
    for path, (label, p) in zip(paths, classify_images(model, labels, images), strict=True):
        print(f"{label}\t{p:.3f}\t{path}")
    return 0
