"""The decoding options of `generate`, `chat` and `translate`, made from
``GenerationConfig``'s fields in one place.

Each command names the fields it offers and the defaults it changes; the flag, its type
and its help come from the field (its annotation and the line the class's docstring gives
it), and :func:`generation_config` turns the parsed flags back into the config, so a field
cannot be offered on the command line and then forgotten. A switch (a ``bool`` field) is
spelled by the value it turns to: ``--sample`` where the command's default is greedy,
``--greedy`` where it samples.
"""

from __future__ import annotations

import argparse
import dataclasses
import inspect
import re
import types
from typing import Any, get_type_hints

import torch

from glassformer.generation import GenerationConfig

# The options of sampling from a distribution (generate and chat offer them, and translate).
SAMPLING = ("do_sample", "temperature", "top_k", "top_p", "repetition_penalty", "use_cache")
# A switch's flag for each value it can be turned to (None: not offered that way).
SWITCHES: dict[str, dict[bool, str | None]] = {
    "do_sample": {True: "--sample", False: "--greedy"},
    "use_cache": {True: None, False: "--no-cache"},
    "static_cache": {True: None, False: "--no-static-cache"},
    "compile": {True: "--compile", False: None},
    "early_stopping": {True: None, False: "--no-early-stopping"},
}
# Flags shorter than the field's own name.
SHORT = {"beam_size": "--beam"}
# What the command line calls a switch that differs from the field's line in the docstring.
SWITCH_HELP = {
    "--greedy": "the arg-max instead of sampling",
    "--sample": "sample instead of greedy decoding (or a beam)",
    "--no-cache": "rerun the whole context every step (the slow reference path)",
    "--compile": "torch.compile the decoding step (tens of seconds first; see the README)",
}


def add_generation_arguments(
    p: argparse.ArgumentParser, fields: tuple[str, ...], **defaults: Any
) -> None:
    """Add a flag for each of ``GenerationConfig``'s ``fields``, and ``--seed``.

    ``defaults`` change a field's default for this command (generate samples at
    temperature 0.8; translate decodes greedily at 1.0).
    """
    unknown = set(defaults) - set(fields)
    if unknown:
        raise ValueError(f"defaults for fields not offered: {sorted(unknown)}")
    hints = get_type_hints(GenerationConfig)
    docs = field_docs()
    for field in dataclasses.fields(GenerationConfig):
        if field.name not in fields:
            continue
        default = defaults.get(field.name, field.default)
        if hints[field.name] is bool:
            flag = SWITCHES[field.name][not default]
            if flag is None:
                raise ValueError(f"{field.name} has no flag to turn it to {not default}")
            p.add_argument(flag, action="store_true", help=SWITCH_HELP.get(flag, docs[field.name]))
        else:
            kind = _scalar(hints[field.name])
            p.add_argument(_flag(field.name), type=kind, default=default, help=docs[field.name])
    p.add_argument("--seed", type=int, default=None, help="makes sampling reproducible")


def generation_config(args: argparse.Namespace) -> tuple[GenerationConfig, torch.Generator | None]:
    """The checked config and the random generator the flags of
    :func:`add_generation_arguments` ask for."""
    values = {}
    for field in dataclasses.fields(GenerationConfig):
        for value, flag in SWITCHES.get(field.name, {}).items():
            if flag is not None and hasattr(args, _dest(flag)):  # a switch: given or not
                values[field.name] = value if getattr(args, _dest(flag)) else not value
        if field.name not in SWITCHES and hasattr(args, _dest(_flag(field.name))):
            values[field.name] = getattr(args, _dest(_flag(field.name)))
    config = GenerationConfig(**values)
    g = torch.Generator().manual_seed(args.seed) if args.seed is not None else None
    return config, g


def field_docs() -> dict[str, str]:
    """Each field's line in ``GenerationConfig``'s docstring (its first sentence)."""
    doc = inspect.getdoc(GenerationConfig) or ""
    attributes = doc.split("Attributes:", 1)[1]
    docs = {}
    for name, text in re.findall(r"^    (\w+): (.+?)(?=^    \w+:|^\S|\Z)", attributes, re.M | re.S):
        docs[name] = " ".join(text.split()).split(". ")[0].rstrip(".").replace("``", "")
    return docs


def _flag(field: str) -> str:
    return SHORT.get(field, "--" + field.replace("_", "-"))


def _dest(flag: str) -> str:
    return flag.removeprefix("--").replace("-", "_")


def _scalar(hint: Any) -> type:
    """``int`` for ``int | None``, the type itself otherwise."""
    if isinstance(hint, types.UnionType):
        (kind,) = (t for t in hint.__args__ if t is not type(None))
        return kind
    return hint
