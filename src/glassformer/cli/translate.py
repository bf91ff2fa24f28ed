"""Translate sentences with a trained translator (from `glassformer train translate`).

Sentences come as arguments or one per line on standard input. With ``--bleu SPLIT`` it
translates the run's own held-out split instead and prints its sacreBLEU, so decoding
options (``--beam``, ...) can be compared on the same sentences.
"""

from __future__ import annotations

import argparse
import time

from glassformer.cli._common import add_dtype_argument, for_inference, inputs, load_model_dir
from glassformer.cli._decoding import SAMPLING, add_generation_arguments, generation_config
from glassformer.generation import GenerationConfig
from glassformer.inference import translate_texts

HELP = "translate sentences with a trained translator"
EXAMPLE = (
    "glassformer translate --model runs/translate "
    '"In the beginning God created the heaven and the earth."'
)
DECODING = ("beam_size", "length_penalty", *SAMPLING)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("text", nargs="*", help="sentences (default: read lines from stdin)")
    p.add_argument("--model", default="runs/translate", help="run or checkpoint directory")
    p.add_argument("--batch-size", type=int, default=32)
    add_generation_arguments(p, DECODING)
    add_dtype_argument(p)
    p.add_argument(
        "--bleu",
        choices=["test", "validation"],
        help="translate the run's held-out split (not TEXT) and print its sacreBLEU",
    )


def run(args: argparse.Namespace) -> int:
    if args.batch_size <= 0:
        raise ValueError(f"--batch-size must be positive, got {args.batch_size}")
    config, g = generation_config(args)  # checked here, before the model is read
    model, tok, ckpt = load_model_dir(args.model, "seq2seq")
    model = for_inference(model, args.dtype, tok)
    options = dict(batch_size=args.batch_size, generation_config=config, generator=g)
    if args.bleu:
        return _report_bleu(args.bleu, model, tok, ckpt, **options)
    texts = inputs(args.text)
    for line in translate_texts(model, tok, texts, **options):
        print(line)
    return 0


def _report_bleu(
    split: str, model, tok, ckpt, *, generation_config: GenerationConfig, **options
) -> int:
    from glassformer.training.config import RUN_FILE, RunConfig
    from glassformer.training.evaluation import bleu
    from glassformer.training.tasks import load_splits

    run_file = ckpt.parent / RUN_FILE
    if not run_file.is_file():
        raise ValueError(f"--bleu needs the run directory's run.json; {run_file} does not exist")
    _, validation, test, _ = load_splits(RunConfig.from_run(ckpt.parent))
    rows = test if split == "test" else validation
    if not rows:
        raise ValueError(f"the run's data has no {split} split")
    start = time.perf_counter()
    hyps = translate_texts(
        model, tok, [s for s, _ in rows], generation_config=generation_config, **options
    )
    seconds = time.perf_counter() - start
    score = bleu(hyps, [t for _, t in rows])
    print(
        f"sacreBLEU {score:.2f} on {len(rows):,} {split} sentences "
        f"(beam {generation_config.beam_size}, {seconds:.0f} s)"
    )
    return 0
