"""mkdocs hooks: text the docs take from the code, so the two cannot disagree.

``{{ runconfig_fields }}`` in a page becomes the table of ``RunConfig``'s fields: each one's
command-line flag, type, default and help, grouped as ``glassformer train --help`` groups
them (the same metadata makes both). ``{{ support_matrix }}`` becomes the model families'
table that ``glassformer models`` prints (written by the last passing test run).
"""

from __future__ import annotations

import dataclasses
import html
import typing
from typing import Any

MARKER = "{{ runconfig_fields }}"
SUPPORT = "{{ support_matrix }}"


def on_page_markdown(markdown: str, **_: Any) -> str:
    if MARKER in markdown:
        markdown = markdown.replace(MARKER, runconfig_fields())
    if SUPPORT in markdown:
        from glassformer.interop.support import support_table

        markdown = markdown.replace(SUPPORT, support_table(markdown=True))
    return markdown


def runconfig_fields() -> str:
    """A Markdown table per option group of RunConfig's fields."""
    from glassformer.cli.train import flag_of
    from glassformer.training.config import RunConfig

    hints = typing.get_type_hints(RunConfig)
    groups: dict[str, list[str]] = {}
    for f in dataclasses.fields(RunConfig):
        group = f.metadata["group"]
        default = "required" if f.default is dataclasses.MISSING else repr(f.default)
        kind = _type_name(hints[f.name])
        text = html.escape(f.metadata["help"], quote=False).replace("|", "\\|")  # <task> is text
        groups.setdefault(group, []).append(
            f"| `{f.name}` | `{flag_of(f)}` | `{kind}` | `{default}` | {text} |"
        )
    tables = []
    for group, rows in groups.items():
        header = ["| field | flag | type | default | what it is |", "|---|---|---|---|---|"]
        tables.append("\n".join([f"**{group}**\n", *header, *rows]))
    return "\n\n".join(tables)


def _type_name(hint: Any) -> str:
    """``int | None``, ``"char" | "bpe" | None``: a field's annotation as a reader writes it."""
    args = typing.get_args(hint)
    if typing.get_origin(hint) is typing.Literal:
        return " | ".join(repr(a) for a in args)
    if args:  # a union: Optional[...] or str | int
        return " | ".join(_type_name(a) for a in args)
    return "None" if hint is type(None) else hint.__name__
