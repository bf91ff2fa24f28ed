"""The `glassformer` command: one module per subcommand, each with `HELP` (its line in the
command's help), `EXAMPLE` (the last line of its own help), `add_arguments` and `run`.

User errors (bad values, files, checkpoints) print one line and exit non-zero, without
a traceback.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from glassformer._version import __version__
from glassformer.cli import (
    attention,
    attribute,
    bench,
    chat,
    circuit,
    classify,
    demo,
    embed,
    explain,
    features,
    fill_mask,
    generate,
    graph,
    lens,
    models,
    patch,
    probe,
    similarity,
    trace,
    train,
    translate,
)
from glassformer.hub import resolve as resolve_hub_id

SUBCOMMANDS = {
    "train": train,
    "generate": generate,
    "chat": chat,
    "translate": translate,
    "classify": classify,
    "fill-mask": fill_mask,
    "embed": embed,
    "similarity": similarity,
    "bench": bench,
    "attention": attention,
    "trace": trace,
    "lens": lens,
    "patch": patch,
    "attribute": attribute,
    "features": features,
    "graph": graph,
    "circuit": circuit,
    "probe": probe,
    "explain": explain,
    "models": models,
    "demo": demo,
}


class _Formatter(argparse.ArgumentDefaultsHelpFormatter, argparse.RawDescriptionHelpFormatter):
    """Show defaults, and keep the line breaks of each subcommand's description."""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="glassformer",
        description="A Transformer written from scratch in PyTorch: train, inspect and use models.",
        epilog=f"example:\n  {train.EXAMPLE}\n"
        "  glassformer COMMAND --help   (each command's options, and an example)",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"glassformer {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, module in SUBCOMMANDS.items():
        p = sub.add_parser(
            name,
            help=module.HELP,
            description=module.__doc__,
            epilog=f"example:\n  {module.EXAMPLE}",
            formatter_class=_Formatter,
        )
        module.add_arguments(p)
        p.set_defaults(run=module.run)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    args = build_parser().parse_args(argv)
    try:
        if isinstance(getattr(args, "model", None), str):
            given = any(a == "--model" or a.startswith("--model=") for a in argv)
            # org/name given: the Hub's cached folder; a default (runs/lm) is always a path
            args.model = str(resolve_hub_id(args.model)) if given else Path(args.model)
        return args.run(args) or 0
    except (ValueError, TypeError, OSError, FloatingPointError) as e:
        print(f"glassformer {args.command}: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"glassformer {args.command}: interrupted", file=sys.stderr)
        return 130
