"""Probe: where in the model is a label readable? A linear probe per hook point.

Runs --model over labelled texts (the bundled --corpus imdb, or --csv FILE with the columns
text and label), takes each text's vector at every hook point --hook picks (the mean over
its tokens, or its last token's: --features; a long text keeps its last --max-tokens
tokens), trains an L2 logistic regression per hook on --train texts (scikit-learn's
objective, C = --c) and prints each one's accuracy on the held-out texts (--test of the
test split; all of it by default) and the best. --out saves every probe with the
difference of its two classes' mean vectors (a steering vector: `glassformer generate
--steer FILE --alpha A` adds it while generating), the hooks, the model and the data they
came from.

    glassformer probe --model SmolLM2-135M-Instruct --corpus imdb --out imdb-probes.safetensors
"""

from __future__ import annotations

import argparse
import random
import time
from pathlib import Path

HELP = "linear probes at every hook point: where a label is readable"
EXAMPLE = "glassformer probe --model SmolLM2-135M-Instruct --corpus imdb --out probes.safetensors"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", required=True, help="a language model: SmolLM2-135M-Instruct")
    which = p.add_mutually_exclusive_group()
    which.add_argument("--corpus", default="imdb", help="a bundled labelled corpus: imdb")
    which.add_argument("--csv", help="labelled texts of your own: columns text and label")
    p.add_argument("--hook", default="blocks.*.hook_resid_post",
                   help="the hook points probed: a name or a pattern")  # fmt: skip
    p.add_argument("--features", choices=("mean", "last"), default="mean",
                   help="a text's vector: its tokens' mean, or its last token's")  # fmt: skip
    p.add_argument("--max-tokens", type=int, default=48,
                   help="tokens of each text read (its last ones)")  # fmt: skip
    p.add_argument("--train", type=int, default=1000, help="training texts (balanced draw)")
    p.add_argument("--test", type=int, default=0, help="held-out texts (0: the whole split)")
    p.add_argument("--c", type=float, default=0.01,
                   help="inverse L2 penalty: scikit-learn's C")  # fmt: skip
    p.add_argument("--seed", type=int, default=0, help="which training texts are drawn")
    p.add_argument("--batch-size", type=int, default=16, help="texts per pass")
    p.add_argument("--out", default="probes.safetensors", help="the probes (.safetensors)")


def run(args: argparse.Namespace) -> int:
    from glassformer.inference import load_run
    from glassformer.inspect.probes import check_features, train_probe

    check_features(args.features, args.max_tokens, "end")
    if args.train < 2 or args.test < 0 or args.batch_size < 1:
        raise ValueError("--train must be at least 2, --test at least 0, --batch-size positive")
    if Path(args.out).suffix != ".safetensors":
        raise ValueError(f"--out must name a .safetensors file, got {args.out}")
    started = time.perf_counter()
    train, test, source = _data(args)
    model, tokenizer = load_run(args.model)
    if model.kind != "gpt":
        raise ValueError(f"{args.model} holds a {model.kind!r} model; probes read a GPT's")
    options = {"features": args.features, "max_tokens": args.max_tokens, "c": args.c}
    probes = train_probe(model, tokenizer, train, test, hook=args.hook,
                         batch_size=args.batch_size, **options)  # fmt: skip
    probes.about.update(model=args.model, data=source, seed=args.seed)
    what = f"the {args.features} of each text's last {args.max_tokens} tokens"
    print(f"{len(train)} training and {len(test)} held-out texts from {source}; features: "
          f"{what}; C = {args.c}")  # fmt: skip
    print(f"{'hook':<32} {'held-out accuracy':>18}")
    for name, probe in probes.probes.items():
        print(f"{name:<32} {probe.accuracy:>18.4f}")
    best = probes.best
    print(f"best: {best.hook}, {best.accuracy:.4f} (P({best.labels[1]!r}) is the probe's)")
    print(f"wrote {probes.save(args.out)}")
    print(f"wall time {time.perf_counter() - started:.0f} s")
    return 0


def _data(args: argparse.Namespace) -> tuple[list, list, str]:
    """(train, test, where from): a balanced draw of --train, the first --test held out."""
    if args.csv:
        from glassformer.data.files import read_labelled

        rows = read_labelled(args.csv)
        random.Random(args.seed).shuffle(rows)
        held = args.test or len(rows) // 5
        train_rows, test = rows[held:], rows[:held]
        source = f"{Path(args.csv).name} ({len(rows)} rows; {held} held out)"
    else:
        from glassformer.data.corpora import load_corpus

        splits = load_corpus(args.corpus, "classify")
        train_rows, test = list(splits.train), list(splits.test)
        test = test[: args.test] if args.test else test
        source = f"{args.corpus} (train split; test split)"
    by_label: dict[str, list] = {}
    for row in train_rows:
        by_label.setdefault(row[1], []).append(row)
    rng = random.Random(args.seed)
    train = []
    for label in sorted(by_label):
        rows = by_label[label]
        train += rng.sample(rows, min(len(rows), args.train // max(1, len(by_label))))
    rng.shuffle(train)
    return train, test, source
