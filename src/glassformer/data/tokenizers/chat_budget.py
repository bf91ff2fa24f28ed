"""What one chat template rendering may spend, and how large a value, or the result of an
operation about to run, is: the accounting of ``chat_sandbox``.

A rendering has a deadline (``MAX_SECONDS``), a number of loop steps (``MAX_LOOP_STEPS``)
and a size limit (``size_limit``): the characters the output, all that ``{{ }}`` wrote, or
any value made may hold. A container counts what printing it would write (a part shared
twice, twice), an int its digits (at most ``MAX_INT_BITS`` bits). The operations that can
make far more than they are given (``'a' * n``, ``s.replace('', t)``, ``'%99999999s' % x``,
``|indent``, ``|join``, ``|tojson``, ...) have an estimate here, checked *before* they run.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

MAX_SECONDS = 5.0
MAX_LOOP_STEPS = 1_000_000
MIN_SIZE = 1 << 20  # characters, for any conversation; a longer one allows 4 × its length more
MAX_INT_BITS = 1 << 14  # ~4900 digits: Python itself refuses to print an int of more than 4300
# What printing writes item by item (the dict views by their concrete types: faster than ABCs).
_CONTAINERS: tuple[type, ...] = (list, tuple, set, frozenset)
_CONTAINERS += (type({}.keys()), type({}.values()), type({}.items()))


class TemplateLimitError(Exception):
    """A rendering passed a limit. Not a ValueError or TypeError: Jinja's lookups and
    filters catch some of those, and this one must end the rendering."""


def size_limit(given: int) -> int:
    """The most characters a value or the output may hold, for inputs of ``given``."""
    return MIN_SIZE + 4 * given


@dataclass
class Budget:
    """What one rendering has left: its deadline, its loop steps, and the size limit."""

    limit: int
    deadline: float
    steps: int
    written: int = 0  # characters of every {{ }} so far, in blocks and macros too

    @classmethod
    def start(cls, limit: int) -> Budget:
        """A rendering's budget from now: ``MAX_SECONDS``, ``MAX_LOOP_STEPS``, ``limit``."""
        return cls(limit, time.monotonic() + MAX_SECONDS, MAX_LOOP_STEPS)

    def tick(self) -> None:
        if time.monotonic() > self.deadline:
            raise TemplateLimitError(f"it ran for more than {MAX_SECONDS:g} s")

    def step(self) -> None:
        self.steps -= 1
        if self.steps < 0:
            raise TemplateLimitError(f"its loops ran more than {MAX_LOOP_STEPS:,} steps")
        self.tick()

    def allow(self, size: int, what: str) -> None:
        if size > self.limit:
            raise TemplateLimitError(f"{what} would hold more than {self.limit:,} characters")

    def checked(self, value: Any, what: str) -> Any:
        """``value``, refused if it is too large."""
        if isinstance(value, int) and value.bit_length() > MAX_INT_BITS:
            raise TemplateLimitError(
                f"{what} would be an integer of more than {MAX_INT_BITS:,} bits"
            )
        self.allow(self.size(value), what)
        return value

    def size(self, value: Any) -> int:
        """About what printing ``value`` writes: characters, digits, one per item, a part
        shared n times n times. Counting stops past the limit, so it costs at most that."""
        total, stack = 0, [value]
        while stack and total <= self.limit:
            v = stack.pop()
            kind = type(v)  # issubclass of the type: isinstance would ask a Namespace itself
            if issubclass(kind, (str, bytes)):
                total += len(v)
            elif issubclass(kind, int):
                total += v.bit_length() // 3 + 1
            elif issubclass(kind, dict):
                total += 1 + 2 * len(v)
                if total <= self.limit:
                    stack += [*v.keys(), *v.values()]
            elif issubclass(kind, _CONTAINERS):
                total += 1 + len(v)
                if total <= self.limit:
                    stack.extend(v)
            else:  # None, a float, a macro, a generator (measured when made into a list)
                total += 1
        return total

    def text_size(self, value: Any) -> int:
        """At most the length of ``str(value)`` (a repr escapes; allow 8 per unit)."""
        return len(value) if isinstance(value, (str, bytes)) else 8 * self.size(value)


def check_operator(budget: Budget, operator: str, left: Any, right: Any) -> None:
    if operator == "*":
        for seq, n in ((left, right), (right, left)):
            if isinstance(seq, (str, bytes, list, tuple)) and isinstance(n, int):
                budget.allow(budget.size(seq) * max(n, 0), "'*'")
    elif operator == "**" and isinstance(left, int) and isinstance(right, int):
        if abs(left) > 1 and right > 0 and left.bit_length() * right > MAX_INT_BITS:
            raise TemplateLimitError(
                f"'**' would make an integer of more than {MAX_INT_BITS:,} bits"
            )
    elif operator == "%" and isinstance(left, (str, bytes)):
        if isinstance(right, Mapping):
            values = list(right.values())
        else:
            values = list(right) if isinstance(right, tuple) else [right]
        budget.allow(format_size(budget, left, values), "'%'")


def check_numbers(budget: Budget, values: list[Any], what: str) -> None:
    """A number given to a str method or a filter is a width or a count: at most the limit."""
    for v in values:
        if isinstance(v, int) and abs(v) > budget.limit:
            raise TemplateLimitError(
                f"{what} was given a number past the limit of {budget.limit:,}"
            )


def _param(args: tuple, kwargs: dict, index: int, name: str, default: Any) -> Any:
    return args[index] if len(args) > index else kwargs.get(name, default)


def _text(value: Any) -> Any:
    return value if isinstance(value, (str, bytes)) else str(value)


def format_size(budget: Budget, fmt: Any, values: list[Any]) -> int:
    """At most what ``fmt % values`` or ``fmt.format(*values)`` writes: every field the
    longest value, every number in ``fmt`` a width, and the int values too where a width
    can come from them (``%*d``, ``{:{}}``)."""
    text = fmt.decode("latin-1") if isinstance(fmt, bytes) else str(fmt)
    fields = text.count("%") + text.count("{")
    widths = sum(int(digits[:12]) for digits in re.findall(r"\d+", text))
    longest = max((budget.text_size(v) for v in values), default=0)
    given = 0
    if re.search(r"\*|\{[^{}]*\{", text):
        given = sum(abs(v) for v in values if isinstance(v, int))
    return len(text) + widths + fields * longest + given


def joined_size(budget: Budget, items: Iterable[Any], separator: Any) -> int:
    total = 0
    for i, item in enumerate(items):
        total += budget.text_size(item) + (len(separator) if i else 0)
        if total > budget.limit:
            break
    return total


def _replace_size(budget: Budget, s: Any, args: tuple, kwargs: dict) -> int:
    s = _text(s)
    old, new = (_text(_param(args, kwargs, i, n, "")) for i, n in ((0, "old"), (1, "new")))
    count = _param(args, kwargs, 2, "count", None)
    matches = s.count(old) if old else len(s) + 1
    if isinstance(count, int) and count >= 0:
        matches = min(matches, count)
    return len(s) + matches * len(new)


def _expandtabs_size(budget: Budget, s: Any, args: tuple, kwargs: dict) -> int:
    return len(s) * max(_param(args, kwargs, 0, "tabsize", 8), 1)


def _translate_size(budget: Budget, s: Any, args: tuple, kwargs: dict) -> int:
    table = _param(args, kwargs, 0, "table", None)
    longest = max(map(budget.size, table.values()), default=1) if isinstance(table, dict) else 1
    return len(s) * max(longest, 1)


def _join_filter_size(budget: Budget, items: Any, args: tuple, kwargs: dict) -> int:
    return joined_size(budget, items, _text(_param(args, kwargs, 0, "d", "")))


def _indent_size(budget: Budget, s: Any, args: tuple, kwargs: dict) -> int:
    width = _param(args, kwargs, 0, "width", 4)
    per_line = width if isinstance(width, int) else len(_text(width))
    s = _text(s)
    return len(s) + (s.count("\n") + 1) * max(per_line, 0)


def _format_filter_size(budget: Budget, value: Any, args: tuple, kwargs: dict) -> int:
    return format_size(budget, _text(value), [*args, *kwargs.values()])


def _sum_size(budget: Budget, items: Any, args: tuple, kwargs: dict) -> int:
    start = _param(args, kwargs, 1, "start", 0)
    if isinstance(start, (int, float)):
        return 0  # numbers: bounded by the int check on the result
    return budget.size(start) + sum(budget.size(item) for item in items)


def _tojson_size(budget: Budget, value: Any, args: tuple, kwargs: dict) -> int:
    """The length of the JSON the filter writes (before its escapes), counted as it is
    encoded: the indentation of a deep value can make it far longer than the value."""
    indent = _param(args, kwargs, 0, "indent", None)
    total = 0
    for chunk in json.JSONEncoder(indent=indent, sort_keys=True).iterencode(value):
        total += len(chunk)
        if total > budget.limit:
            break
    return total


_Estimate = Callable[[Budget, Any, tuple, dict], int]
METHOD_SIZES: dict[str, _Estimate] = {
    "replace": _replace_size,
    "expandtabs": _expandtabs_size,
    "translate": _translate_size,
}
FILTER_SIZES: dict[str, _Estimate] = {
    "replace": _replace_size,
    "join": _join_filter_size,
    "indent": _indent_size,
    "format": _format_filter_size,
    "sum": _sum_size,
    "tojson": _tojson_size,
}
