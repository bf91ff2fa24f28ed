"""Steering SmolLM2 towards positive reviews, judged by a classifier it was not made with.

The vector: a probes file's class difference ("positive" − "negative" IMDb reviews, the mean
of each review's last tokens at the best probe's hook; ``glassformer probe --out``). The
prompts: the twenty neutral openings below, each continued five times (seeds 0–4), 40 new
tokens sampled at temperature 0.8, top-k 50; unsteered first, then once per alpha. The
judge: the IMDb classifier ``make demo`` trains (``runs/demo-imdb``), reading each
continuation alone; the share it calls positive is the figure. Beside it, the perplexity of
those continuations under the unsteered model (after their prompts): what steering costs.

    glassformer probe --model SmolLM2-135M-Instruct --corpus imdb --out imdb-probes.safetensors
    make demo
    python benchmarks/steering.py --probes imdb-probes.safetensors --judge runs/demo-imdb
"""

from __future__ import annotations

import argparse
import math
import time

import torch

PROMPTS = (
    "I watched the film last night, and", "The movie begins in a small town where",
    "After the credits rolled, I", "The director's new picture is", "My friend and I went to",
    "The story follows a man who", "The second half of the film", "In the opening scene,",
    "The soundtrack of this movie", "When the lights went down, the film",
    "The cast includes several actors who", "This is a film about", "The plot, in short,",
    "By the end of the movie, I", "The camera work in this picture", "Halfway through, the story",
    "The lead actress plays a woman who", "I rented this movie because", "The dialogue is",
    "Compared with the book, the film",
)  # fmt: skip
SAMPLES = 5


def continuations(model, tok, hook, vector, alpha, new_tokens):
    from glassformer.generation import GenerationConfig
    from glassformer.inspect import add

    config = GenerationConfig(do_sample=True, temperature=0.8, top_k=50)
    out = []
    with model.hooks([(hook, add(vector, alpha))]):
        for seed, prompt in enumerate(PROMPTS):
            ids = tok.encode(prompt)
            g = torch.Generator().manual_seed(seed)
            rows = model.generate(torch.tensor([ids] * SAMPLES), new_tokens,
                                  generation_config=config, generator=g).tolist()  # fmt: skip
            out += [(ids, row[len(ids) :]) for row in rows]
    return out


@torch.no_grad()
def perplexity(model, pieces) -> float:
    total, count = 0.0, 0
    for prompt, new in pieces:
        ids = torch.tensor([prompt + new])
        logp = model(ids).logits[0, :-1].log_softmax(-1)
        picked = logp[torch.arange(len(prompt) - 1, ids.size(1) - 1), ids[0, len(prompt) :]]
        total -= float(picked.sum())
        count += len(new)
    return math.exp(total / count)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--probes", required=True, help="a `glassformer probe` file")
    p.add_argument("--judge", default="runs/demo-imdb", help="an IMDb classifier run")
    p.add_argument("--alphas", default="0,4,8,16", help="comma-separated")
    p.add_argument("--hook", help="the vector's hook (default: the best probe's)")
    p.add_argument("--new-tokens", type=int, default=40)
    args = p.parse_args()
    from glassformer import load_run
    from glassformer.inspect import read_vector

    torch.set_grad_enabled(False)
    model, tok = load_run("SmolLM2-135M-Instruct")
    from glassformer.inference import read_labels

    judge, judge_tok = load_run(args.judge)
    labels = read_labels(args.judge)
    hook, vector, meta = read_vector(args.probes, args.hook)
    print(f"CPU: {_cpu()}; vector: {meta['labels'][1]!r} − {meta['labels'][0]!r} at {hook} "
          f"(norm {float(vector.norm()):.2f}); judge: {args.judge} {labels}")  # fmt: skip
    alphas = [float(a) for a in args.alphas.split(",")]
    base = None  # the unsteered run's figures, which every alpha is measured against
    for alpha in [0.0, *(a for a in alphas if a != 0.0)]:
        started = time.perf_counter()
        pieces = continuations(model, tok, hook, vector, alpha, args.new_tokens)
        texts = [tok.decode(new) for _, new in pieces]
        positive = _positive_share(judge, judge_tok, labels, texts)
        ppl = perplexity(model, pieces)
        base = (positive, ppl) if base is None else base
        gain, cost = 100 * (positive - base[0]), ppl / base[1] - 1
        print(f"alpha {alpha:>4}: judged positive {positive:.0%} ({gain:+.0f} points), "
              f"perplexity {ppl:.2f} ({cost:+.0%}), {time.perf_counter() - started:.0f} s; "
              f"e.g. {texts[0][:70]!r}")  # fmt: skip


def _positive_share(judge, tok, labels, texts) -> float:
    from glassformer.inference import classify_texts

    found = classify_texts(judge, tok, labels, texts)
    return sum(label == "positive" for label, _ in found) / len(found)


def _cpu() -> str:
    with open("/proc/cpuinfo") as f:
        return next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))


if __name__ == "__main__":
    main()
