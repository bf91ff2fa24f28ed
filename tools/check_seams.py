"""Fail, naming each offender, where the seams between the rooms loosen past a limit.

    python tools/check_seams.py src/glassformer        # the limits make lint applies (LIMITS)
    python tools/check_seams.py --list src/glassformer # and every place counted

Three things are counted. ``LIMITS`` holds today's counts, so that a new one fails; they only
ever go down, to the goals issue 44 sets (GOALS):

- ``getattr(config, "field", default)`` in ``models/``: a config read by a name that a typo
  silently turns into the default. Any ``getattr`` with a default whose object is named
  ``c``, ``cfg`` or ``config`` or ends in ``.config`` counts.
- parameters annotated ``model: Any``: what a tool needs of a model, left unsaid.
- attributes written onto a model from outside ``models/``: ``model.name = ...``,
  ``setattr(model, ...)`` and ``model.__dict__[...] = ...``, where ``model`` is the name.
"""

from __future__ import annotations

import argparse
import ast
import sys
from collections.abc import Iterator
from pathlib import Path

CONFIG_NAMES = {"c", "cfg", "config"}
LIMITS = {"config-getattr": 0, "model-any": 8, "model-writes": 0}
GOALS = {"config-getattr": 0, "model-any": 9, "model-writes": 0}


def _is_config(node: ast.expr) -> bool:
    if isinstance(node, ast.Name):
        return node.id in CONFIG_NAMES
    return isinstance(node, ast.Attribute) and node.attr == "config"


def config_getattrs(tree: ast.AST) -> Iterator[int]:
    """Line numbers of ``getattr(config, "name", default)``."""
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id == "getattr"
            and len(node.args) == 3
            and _is_config(node.args[0])
        ):
            yield node.lineno


def model_any(tree: ast.AST) -> Iterator[int]:
    """Line numbers of parameters written ``model: Any``."""
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.arg)
            and node.arg == "model"
            and isinstance(node.annotation, ast.Name)
            and node.annotation.id == "Any"
        ):
            yield node.lineno


def _is_model(node: ast.expr) -> bool:
    return isinstance(node, ast.Name) and node.id == "model"


def model_writes(tree: ast.AST) -> Iterator[int]:
    """Line numbers where an attribute is written onto ``model``."""
    for node in ast.walk(tree):
        targets: list[ast.expr] = []
        if isinstance(node, ast.Assign):
            targets = node.targets
        elif isinstance(node, ast.AnnAssign | ast.AugAssign):
            targets = [node.target]
        for target in targets:
            if isinstance(target, ast.Subscript):  # model.__dict__[...] = ...
                target = target.value
                if not (isinstance(target, ast.Attribute) and target.attr == "__dict__"):
                    continue
            if isinstance(target, ast.Attribute) and _is_model(target.value):
                yield node.lineno
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id == "setattr"
            and node.args
            and _is_model(node.args[0])
        ):
            yield node.lineno


def offenders(package: Path) -> dict[str, list[str]]:
    """Each rule's offenders, as ``path:line``."""
    found: dict[str, list[str]] = {"config-getattr": [], "model-any": [], "model-writes": []}
    for path in sorted(package.rglob("*.py")):
        tree = ast.parse(path.read_text(), filename=str(path))
        relative = path.relative_to(package)
        where = relative.parts[0]
        rules = [("model-any", model_any)]
        if where == "models":
            rules.append(("config-getattr", config_getattrs))
        else:
            rules.append(("model-writes", model_writes))
        for rule, find in rules:
            found[rule] += [f"{path}:{line}" for line in find(tree)]
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("package", type=Path, help="the package's folder (src/glassformer)")
    for rule, limit in LIMITS.items():
        parser.add_argument(f"--max-{rule}", type=int, default=limit, metavar="N")
    parser.add_argument("--list", action="store_true", help="name every one, within limits too")
    args = parser.parse_args(argv)
    limits = {rule: getattr(args, "max_" + rule.replace("-", "_")) for rule in LIMITS}
    failed = False
    for rule, places in offenders(args.package).items():
        over = len(places) > limits[rule]
        failed |= over
        if over or args.list:
            stream = sys.stderr if over else sys.stdout
            verdict = "too many" if over else "within the limit"
            limit, goal = limits[rule], GOALS[rule]
            print(f"{rule}: {len(places)} (at most {limit}, goal {goal}), {verdict}:", file=stream)
            for place in places:
                print(f"  {place}", file=stream)
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
