"""What each inference precision costs in quality: held-out perplexity at fp32, bf16, int8 and
int4 (``model.for_inference``), and the tokens/s of the same evaluation.

- SmolLM2-135M-Instruct (the packaged GGUF) on the first ``--reviews`` IMDb test reviews
  (the bundled corpus; each review its own sequence, at most ``--max-tokens`` tokens).
- With ``--run DIR``: a ``glassformer train lm`` run on its own held-out (validation) text,
  cut into windows of its context.

The translator's cost is its BLEU, which the command line measures directly:
``glassformer translate --model RUN --bleu test --dtype int8``.

    python benchmarks/precision_quality.py [--reviews 100] [--run runs/lm]
    glassformer bench precision-quality
"""

from __future__ import annotations

import argparse
import copy
import math
import time

import torch

DTYPES = ("fp32", "bf16", "int8", "int4")


def mean_loss(model, sequences: list[torch.Tensor]) -> tuple[float, int, float]:
    """(mean next-token loss over all predicted tokens, how many, seconds)."""
    total, count = 0.0, 0
    start = time.perf_counter()
    with torch.inference_mode():
        for ids in sequences:
            ids = ids[None]
            logits = model(ids[:, :-1]).logits.float()
            loss = torch.nn.functional.cross_entropy(
                logits.reshape(-1, logits.size(-1)), ids[:, 1:].reshape(-1), reduction="sum"
            )
            total += loss.item()
            count += ids.size(1) - 1
    return total / count, count, time.perf_counter() - start


def report(name: str, model, sequences: list[torch.Tensor]) -> dict:
    print(f"\n{name}")
    rows = {}
    for dtype in DTYPES:
        loss, tokens, seconds = mean_loss(copy.deepcopy(model).for_inference(dtype), sequences)
        rows[dtype] = math.exp(loss)
        change = rows[dtype] / rows["fp32"] - 1
        print(
            f"  {dtype:<5} perplexity {rows[dtype]:9.4f}  ({change:+.2%} against fp32)  "
            f"{tokens:,} tokens, {tokens / seconds:,.0f} tokens/s"
        )
    return rows


def smollm2_on_imdb(reviews: int, max_tokens: int) -> None:
    from glassformer import load_run
    from glassformer.data.corpora import load_corpus

    model, tok = load_run("SmolLM2-135M-Instruct")
    texts = [text for text, _ in load_corpus("imdb", "classify").test[:reviews]]
    sequences = [torch.tensor(tok.encode(t)[:max_tokens]) for t in texts]
    report(f"SmolLM2-135M-Instruct, {reviews} IMDb test reviews", model, sequences)


def run_on_validation(path: str, windows: int) -> None:
    from glassformer import load_run
    from glassformer.training.config import RunConfig
    from glassformer.training.tasks import load_splits

    model, tok = load_run(path, kind="gpt")
    _, validation, _, _ = load_splits(RunConfig.from_run(path))
    text = validation if isinstance(validation, str) else "\n".join(validation)
    ids = torch.tensor(tok.encode(text))
    size = model.config.max_len + 1
    sequences = [ids[i : i + size] for i in range(0, len(ids) - size, size)][:windows]
    report(f"{path}, {len(sequences)} validation windows of {size} tokens", model, sequences)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reviews", type=int, default=100)
    parser.add_argument("--max-tokens", type=int, default=512)
    parser.add_argument("--run", help="also a `train lm` run on its validation text")
    parser.add_argument("--windows", type=int, default=200)
    parser.add_argument("--skip-smollm2", action="store_true")
    args = parser.parse_args()
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads")
    if not args.skip_smollm2:
        smollm2_on_imdb(args.reviews, args.max_tokens)
    if args.run:
        run_on_validation(args.run, args.windows)


if __name__ == "__main__":
    main()
