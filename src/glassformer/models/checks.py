"""The checks a config's values pass: each field's rule, one function per kind of value.

A config read from a file is untrusted: a string where a number belongs, JSON's ``true``
for an integer, NaN or Infinity, or a field the config does not have is one error naming
the field and the value, raised as the config is made.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

from glassformer.errors import shown


def is_integer(value: Any) -> bool:
    """An int that is not a bool (JSON's true is 1 to ``isinstance``)."""
    return isinstance(value, int) and not isinstance(value, bool)


def fields_of(cls: type, values: dict[str, Any]) -> dict[str, Any]:
    """``values`` for the dataclass ``cls``, refused by name where it has no such field."""
    known = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(values) - known)
    if unknown:
        raise ValueError(f"{cls.__name__} has no field(s) {shown(unknown)}; known: {sorted(known)}")
    return values


def check_window(window: Any) -> None:
    """An ``attention_window``: a positive integer (the keys each query sees on each side,
    or before it), or None."""
    if window is not None and (not is_integer(window) or window <= 0):
        raise ValueError(
            f"attention_window must be a positive integer or None, got {shown(window)}"
        )


def check_finite(name: str, value: Any, *, minimum: float, above: bool = False) -> None:
    """``value`` (None passes) is a finite number >= ``minimum`` (> where ``above``): NaN
    or Infinity read from a config would poison every output without an error."""
    if value is None:
        return
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    if not ok or value < minimum or (above and value == minimum):
        relation = ">" if above else ">="
        expected = f"a finite number {relation} {minimum:g}"
        raise ValueError(f"{name} must be {expected}, got {shown(value)}")


def check_rotary_dim(rotary_dim: Any, width: int) -> None:
    """``rotary_dim`` (the features of each head rotary turns, None: all ``width``) is an
    even number in 2..width."""
    r = rotary_dim
    if r is not None and (not is_integer(r) or not 0 < r <= width or r % 2):
        raise ValueError(
            f"rotary_dim must be an even number in 2..{width} (the head width), got {r!r}"
        )
