"""The model families glassformer opens from Hugging Face directories, and what the test
suite has shown to work on each: loading, logits and every activation equal to
transformers' (within 1e-4), greedy generation with the cache, int8/int4, GGUF files, and
the glass-box tools. The table is written by the last passing test run, not by hand.

Open any of them with `Model.from_pretrained(DIR)` or `--model DIR` on any command.
"""

from __future__ import annotations

import argparse

from glassformer.interop.support import support_table

HELP = "the model families glassformer opens, and what is shown to work on each"
EXAMPLE = "glassformer models"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--markdown", action="store_true", help="print a Markdown table")


def run(args: argparse.Namespace) -> int:
    print(support_table(markdown=args.markdown))
    return 0
