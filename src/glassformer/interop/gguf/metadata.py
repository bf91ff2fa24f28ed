"""A GGUF file's metadata values, read from the file when asked, and checked.

``read_header`` leaves strings and arrays where they lie; ``Metadata`` reads one when a
reader asks for it by key, its length already checked against the file. Numbers that size
a model (heads, widths, layers) or enter its arithmetic (a rotary base, an epsilon, a
soft-cap) are checked to be in range here (``count``, ``positive``), before a model is
built, so a corrupt value is one line naming the key and the value, never a division by
zero or a huge allocation later.
"""

from __future__ import annotations

import math
import struct
from pathlib import Path
from typing import Any

import numpy as np

from glassformer.errors import CheckpointError, shown
from glassformer.interop.gguf.header import ARRAY, SCALARS, STRING, Field, Header, read_span

_U64 = struct.Struct("<Q")
_NUMPY = {0: "<u1", 1: "<i1", 2: "<u2", 3: "<i2", 4: "<u4", 5: "<i4", 6: "<f4", 7: "?", 10: "<u8",
          11: "<i8", 12: "<f8"}  # fmt: skip
LARGEST = 1 << 30  # the largest width, count or length a metadata number may give


class Metadata:
    """``meta(key, kind, default)``: the value of ``key``, checked to be of ``kind`` (a
    missing key gives ``default``, or a ``CheckpointError`` when ``default`` is ``...``)."""

    def __init__(self, path: Path, header: Header) -> None:
        self.path, self.fields = path, header.fields

    def __call__(self, key: str, kind: type, default: Any) -> Any:
        field = self.fields.get(key)
        if field is None:
            if default is ...:
                raise CheckpointError(f"the metadata key {key!r} is missing")
            return default
        value = self._value(key, field)
        if kind is float and isinstance(value, int) and not isinstance(value, bool):
            value = float(value)
        if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
            raise CheckpointError(
                f"the metadata {key!r} is a {type(value).__name__}, expected a {kind.__name__}"
            )
        return value

    def count(self, key: str, default: Any, low: int = 1, high: int = LARGEST) -> Any:
        """An integer in ``low..high`` (or ``default`` when the key is absent)."""
        value = self(key, int, default)
        if value is not default and not low <= value <= high:
            raise CheckpointError(f"the metadata {key!r} is {shown(value)}; expected {low}..{high}")
        return value

    def positive(self, key: str, default: Any, high: float = math.inf) -> Any:
        """A finite number above 0 and at most ``high`` (or ``default`` when absent)."""
        value = self(key, float, default)
        if value is not default and not (0 < value <= high and math.isfinite(value)):
            limit = "" if math.isinf(high) else f" and at most {high}"
            raise CheckpointError(
                f"the metadata {key!r} is {shown(value)}; expected a finite number above 0{limit}"
            )
        return value

    def strings(self, key: str, default: Any) -> Any:
        """An array of strings (or ``default`` when the key is absent)."""
        field = self.fields.get(key)
        if field is not None and (field.vtype != ARRAY or field.item_type != STRING):
            raise CheckpointError(f"the metadata {key!r} is not an array of strings")
        return self(key, list, default)

    def _value(self, key: str, field: Field) -> Any:
        if field.vtype in SCALARS:
            return field.scalar
        try:
            with open(self.path, "rb") as f:
                data = read_span(f, field.start, field.end - field.start, f"the metadata {key!r}")
        except OSError as e:
            raise CheckpointError(f"cannot read the metadata {key!r}: {e.strerror or e}") from None
        if field.vtype == STRING:
            return _text(data, key)
        if field.item_type == STRING:
            return _strings(data, field.count, key)
        if field.item_type == ARRAY:
            raise CheckpointError(f"the metadata {key!r} is an array of arrays; none is read here")
        assert field.item_type is not None
        return np.frombuffer(data, dtype=_NUMPY[field.item_type], count=field.count).tolist()


def _text(data: bytearray | memoryview, key: str) -> str:
    try:
        return str(data, "utf-8")
    except UnicodeDecodeError as e:
        raise CheckpointError(f"the metadata {key!r} is not UTF-8 (byte {e.start})") from None


def _strings(data: bytearray, count: int, key: str) -> list[str]:
    """``count`` GGUF strings, one after another in ``data`` (their lengths checked again:
    the file may have changed since its header was walked)."""
    items, at, view = [], 0, memoryview(data)
    for i in range(count):
        n = _U64.unpack_from(data, at)[0] if at + 8 <= len(data) else len(data)
        if at + 8 + n > len(data):
            raise CheckpointError(f"item {i} of the metadata {key!r} runs past its end")
        items.append(_text(view[at + 8 : at + 8 + n], f"{key}[{i}]"))
        at += 8 + n
    return items
