"""Train a language model, a translator, a classifier, a masked language model, a ViT, or a
sparse autoencoder on another model's activations.

    glassformer train lm        --corpus austen        (char-level GPT)
    glassformer train translate --corpus bible-en-es   (English → Spanish, shared BPE)
    glassformer train classify  --corpus imdb          (sentiment, WordPiece)
    glassformer train mlm       --corpus imdb          (BERT's masked-LM pretraining)
    glassformer train classify  --init runs/mlm        (fine-tune a pretrained encoder)
    glassformer train sae --model SmolLM2-135M-Instruct --hook blocks.15.hook_resid_post

Everything goes into one run directory (--out): the checkpoint, metrics.jsonl, loss.png
and samples.txt. --resume DIR continues an interrupted run exactly where it stopped.
Training stops at --max-steps or after --minutes of training, whichever comes first.

The same command runs data-parallel under torchrun (gloo on CPU, NCCL on GPUs):

    torchrun --nproc_per_node 2 -m glassformer train lm --corpus austen --batch-size 16

--batch-size is per process: the global batch is batch-size × processes × accumulation.
Rank 0 shows progress and writes the run directory; --resume works with any number of
processes.

--framework keras trains the classifier's Keras 3 twin with model.fit (extra `keras`): the
same data, initial weights, optimiser and schedule; the run directory then also holds
model.keras, and its checkpoint/ is the trained weights moved to PyTorch, so every other
command takes the run as usual.

Each option is a field of glassformer.RunConfig (--foo-bar is foo_bar), and this command
is glassformer.fit(RunConfig(...)): the same run from Python.
"""

from __future__ import annotations

import argparse
import dataclasses
import types
import typing
from typing import Any, Literal

from glassformer.training.config import RunConfig, RunConfigError

# What each task trains, in the command's help; tests check it names every task there is.
TASKS = {
    "lm": "a GPT",
    "translate": "a translator",
    "classify": "a text classifier",
    "mlm": "a masked LM",
    "vision": "a ViT on images",
    "sae": "a sparse autoencoder",
    "transcoder": "transcoders: a model's MLPs as sparse features",
}
HELP = "train " + ", ".join(f"{what} ({task})" for task, what in TASKS.items())
EXAMPLE = "glassformer train classify --arch gpt --minutes 5 --out runs/demo-imdb"


def add_arguments(p: argparse.ArgumentParser) -> None:
    """One option per RunConfig field, in its group, with the field's type and choices."""
    hints = typing.get_type_hints(RunConfig)
    groups: dict[str, Any] = {}
    for f in dataclasses.fields(RunConfig):
        meta = dict(f.metadata)
        group_name, help_text = meta.pop("group"), meta.pop("help")
        tristate = meta.pop("tristate", False)
        kind, choices = _cli_type(hints[f.name])
        if group_name == "positional":
            p.add_argument(f.name, choices=choices, help=help_text)
            continue
        if group_name not in groups:
            groups[group_name] = p.add_argument_group(group_name)
        flag = flag_of(f)
        # Unset options are left out (SUPPRESS): the config's defaults are the only ones,
        # and --resume knows which options were given.
        options: dict[str, Any] = dict(default=argparse.SUPPRESS, help=help_text)
        if "cli" in meta:  # the field says how the command line spells it
            options.update(meta.pop("cli"))
        elif kind is bool:
            options["action"] = argparse.BooleanOptionalAction if tristate else "store_true"
        else:
            options.update(type=kind, choices=choices)
            if f.default is not None and f.default is not dataclasses.MISSING:
                options["help"] = f"{help_text} (default: {f.default})"
        groups[group_name].add_argument(flag, **options)
    groups["training"].add_argument(
        "--resume", metavar="DIR", default=argparse.SUPPRESS, help="continue the run in DIR"
    )


def flag_of(f: dataclasses.Field) -> str:
    """How the command line spells a RunConfig field: ``task``, ``--max-len``, ..."""
    return f.name if f.metadata["group"] == "positional" else "--" + f.name.replace("_", "-")


def _cli_type(hint: Any) -> tuple[type, list[Any] | None]:
    """(the argparse type, the choices) for a field's annotation."""
    args = [a for a in typing.get_args(hint) if a is not type(None)]
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        if len(args) == 1:
            return _cli_type(args[0])
        return str, None  # str | int columns: typed as text, numbers become indices
    if typing.get_origin(hint) is Literal:
        return type(args[0]), list(args)
    return hint, None


def config_from_args(args: argparse.Namespace) -> tuple[RunConfig, str | None]:
    """The RunConfig the command line describes, and the run to resume (or None)."""
    names = {f.name for f in dataclasses.fields(RunConfig)}
    given = {k: v for k, v in vars(args).items() if k in names}
    resume = getattr(args, "resume", None)
    try:
        if resume is None:
            return RunConfig(**given), None
        saved = RunConfig.from_run(resume)
        # the run's own options, with what may change on resume (the others must match)
        return saved.replace(**given), resume
    except RunConfigError as e:
        raise ValueError(e.cli_message()) from None


def run(args: argparse.Namespace) -> int:
    from glassformer.training.runner import fit

    config, resume = config_from_args(args)
    fit(config, resume=resume)
    return 0


__all__ = ["add_arguments", "config_from_args", "run"]
