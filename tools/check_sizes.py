"""Fail, naming each offender, where a file is too long or a function has too many lines of code.

    python tools/check_sizes.py src            # the limits make lint applies
    python tools/check_sizes.py --max-file-lines 400 --max-function-lines 60 src

A file counts all its lines. A function counts the lines of its body that hold code: its
docstring, blank lines and comment-only lines are left out; the functions defined inside it
count as part of it (and are checked on their own too). Lines are counted from the body's
first statement to its last, so a signature spread over several lines does not count.
"""

from __future__ import annotations

import argparse
import ast
import io
import sys
import tokenize
from collections.abc import Iterator
from pathlib import Path

FunctionNode = ast.FunctionDef | ast.AsyncFunctionDef


def code_lines(source: str) -> set[int]:
    """The line numbers that hold a token other than a comment, a newline or indentation."""
    skip = {tokenize.COMMENT, tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT}
    lines: set[int] = set()
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type not in skip and token.type != tokenize.ENDMARKER:
            lines.update(range(token.start[0], token.end[0] + 1))
    return lines


def _docstring_lines(node: FunctionNode) -> set[int]:
    first = node.body[0]
    docstring = isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant)
    if docstring and isinstance(first.value.value, str):  # type: ignore[attr-defined]
        return set(range(first.lineno, (first.end_lineno or first.lineno) + 1))
    return set()


def function_sizes(source: str) -> Iterator[tuple[str, int, int]]:
    """(qualified name, first line, lines of code) of every function in ``source``."""
    tree = ast.parse(source)
    code = code_lines(source)

    def visit(node: ast.AST, prefix: str) -> Iterator[tuple[str, int, int]]:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                name = f"{prefix}{child.name}"
                body = set(range(child.body[0].lineno, (child.end_lineno or child.lineno) + 1))
                body -= _docstring_lines(child)
                yield name, child.lineno, len(body & code)
                yield from visit(child, name + ".")
            elif isinstance(child, ast.ClassDef):
                yield from visit(child, f"{prefix}{child.name}.")
            else:
                yield from visit(child, prefix)

    yield from visit(tree, "")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("paths", nargs="+", type=Path)
    parser.add_argument("--max-file-lines", type=int, default=400)
    parser.add_argument("--max-function-lines", type=int, default=60)
    args = parser.parse_args(argv)
    problems = []
    for root in args.paths:
        for path in sorted(root.rglob("*.py")) if root.is_dir() else [root]:
            source = path.read_text(encoding="utf-8")
            lines = source.count("\n") + (not source.endswith("\n"))
            if lines > args.max_file_lines:
                problems.append(f"{path}: {lines} lines (at most {args.max_file_lines})")
            for name, line, size in function_sizes(source):
                if size > args.max_function_lines:
                    problems.append(
                        f"{path}:{line}: {name} has {size} lines of code "
                        f"(at most {args.max_function_lines})"
                    )
    for problem in problems:
        print(problem, file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
