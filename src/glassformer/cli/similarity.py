"""Rank sentences by their similarity to a query (cosine of sentence embeddings).

The candidates come as arguments after the query, from --file (one per line) or from
standard input. Each output line is "rank<TAB>cosine<TAB>sentence", the most similar
first.
"""

from __future__ import annotations

import argparse

from glassformer.cli._common import inputs, read_lines
from glassformer.cli.embed import add_model_arguments, load_encoder

HELP = "rank sentences against a query by embedding similarity"
EXAMPLE = (
    'glassformer similarity "A cat is sleeping on the sofa." '
    '"A kitten naps on the couch." "The stock market fell."'
)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("query", help="the sentence to compare against")
    p.add_argument("sentence", nargs="*", help="candidates (default: --file, else stdin)")
    p.add_argument("--file", help="read the candidates from this file, one per line")
    p.add_argument("--top-k", type=int, default=None, help="show only the k most similar")
    add_model_arguments(p)


def run(args: argparse.Namespace) -> int:
    if args.top_k is not None and args.top_k <= 0:
        raise ValueError(f"--top-k must be a positive integer, got {args.top_k}")
    if args.sentence and args.file:
        raise ValueError("give the candidates as arguments or with --file, not both")
    candidates = read_lines(args.file) if args.file else inputs(args.sentence)
    if not candidates:
        raise ValueError(f"{args.file} holds no sentences")
    model = load_encoder(args)
    vectors = model.encode([args.query, *candidates], batch_size=args.batch_size)
    if not model.config.normalize:
        vectors = vectors / vectors.norm(dim=1, keepdim=True).clamp(min=1e-12)
    scores = vectors[1:] @ vectors[0]  # (N,) cosines
    ranked = scores.argsort(descending=True, stable=True).tolist()[: args.top_k]
    for rank, i in enumerate(ranked, 1):
        print(f"{rank}\t{scores[i]:.4f}\t{candidates[i]}")
    return 0
