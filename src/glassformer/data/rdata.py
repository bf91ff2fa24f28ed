"""A small reader for R's serialization format, enough for packaged text data.

R saves objects as a stream of "SEXP" records (XDR, big-endian). Each record starts with
a 32-bit flags word: the low 8 bits give the type, bit 9 says attributes follow, bit 10
that a tag follows (for pairlists), bits 12+ hold the "levels" (string encoding).
A package's data directory keeps its objects in a lazy-load database: ``Rdata.rdx``
(a gzip'd RDS file mapping each name to an offset and length) and ``Rdata.rdb`` (the
records, each a 4-byte big-endian length followed by zlib-compressed serialized data).

Only what data needs is read: NULL, symbols, pairlists, character/logical/integer/real
vectors, lists, attributes and back-references. Anything else raises ``ValueError``.
"""

from __future__ import annotations

import gzip
import struct
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# Record types (R's SEXPTYPE codes and the serializer's pseudo-types).
NILSXP, SYMSXP, LISTSXP, CHARSXP = 0, 1, 2, 9
LGLSXP, INTSXP, REALSXP, STRSXP, VECSXP = 10, 13, 14, 16, 19
REFSXP, NILVALUE_SXP, GLOBALENV_SXP, EMPTYENV_SXP, BASEENV_SXP = 255, 254, 253, 242, 241
NA_INTEGER = -(2**31)


@dataclass
class RObject:
    """An R value with attributes (names, class, levels, row.names, ...)."""

    value: Any
    attributes: dict[str, Any] = field(default_factory=dict)


class _Reader:
    def __init__(self, data: bytes) -> None:
        self.data, self.pos = data, 0
        self.refs: list[Any] = []

    def take(self, n: int) -> bytes:
        if self.pos + n > len(self.data):
            raise ValueError("R data ends early: the file is truncated or not R data")
        chunk = self.data[self.pos : self.pos + n]
        self.pos += n
        return chunk

    def int(self) -> int:
        return struct.unpack(">i", self.take(4))[0]

    def header(self) -> None:
        if self.take(2) != b"X\n":
            raise ValueError("not R XDR serialization (expected the 'X\\n' header)")
        version = self.int()
        self.int(), self.int()  # writer's R version, oldest reader version
        if version == 3:
            self.take(self.int())  # the native encoding's name
        elif version != 2:
            raise ValueError(f"R serialization version {version} is not supported (2 or 3)")

    def item(self) -> Any:
        flags = self.int()
        kind, has_attr, has_tag = flags & 0xFF, bool(flags & (1 << 9)), bool(flags & (1 << 10))
        if kind in (NILVALUE_SXP, NILSXP, GLOBALENV_SXP, EMPTYENV_SXP, BASEENV_SXP):
            return None
        if kind == REFSXP:
            index = flags >> 8 or self.int()
            return self.refs[index - 1]
        if kind == SYMSXP:
            name = self.item()  # a CHARSXP
            self.refs.append(name)
            return name
        if kind == LISTSXP:
            return self.pairlist(has_attr, has_tag)
        if kind == CHARSXP:
            n = self.int()
            return None if n == -1 else self.take(n).decode("utf-8", errors="replace")
        if kind in (LGLSXP, INTSXP):
            n = self.int()
            values = struct.unpack(f">{n}i", self.take(4 * n))
            if kind == LGLSXP:
                value = [None if v == NA_INTEGER else bool(v) for v in values]
            else:
                value = [None if v == NA_INTEGER else v for v in values]
        elif kind == REALSXP:
            n = self.int()
            value = list(struct.unpack(f">{n}d", self.take(8 * n)))
        elif kind in (STRSXP, VECSXP):
            n = self.int()
            value = [self.item() for _ in range(n)]
        else:
            raise ValueError(f"R record type {kind} is not supported by this reader")
        if has_attr:
            return RObject(value, self.attributes())
        return value

    def pairlist(self, has_attr: bool, has_tag: bool) -> dict[str, Any]:
        """A pairlist (linked list of tagged values) as a dict."""
        out: dict[str, Any] = {}
        while True:
            if has_attr:
                self.attributes()
            tag = self.item() if has_tag else str(len(out))
            out[tag] = self.item()
            flags = self.int()
            kind = flags & 0xFF
            if kind != LISTSXP:
                if kind not in (NILVALUE_SXP, NILSXP):
                    raise ValueError(f"malformed pairlist: it ends in record type {kind}")
                return out
            has_attr, has_tag = bool(flags & (1 << 9)), bool(flags & (1 << 10))

    def attributes(self) -> dict[str, Any]:
        flags = self.int()
        if flags & 0xFF != LISTSXP:
            raise ValueError("malformed attributes: expected a pairlist")
        return self.pairlist(bool(flags & (1 << 9)), bool(flags & (1 << 10)))


def unserialize(data: bytes) -> Any:
    """One R object from its XDR serialization (as ``serialize()``/``saveRDS`` write it)."""
    reader = _Reader(data)
    reader.header()
    return reader.item()


def read_rds(path: str | Path) -> Any:
    """An ``.rds`` file (gzip'd or plain)."""
    raw = Path(path).read_bytes()
    return unserialize(gzip.decompress(raw) if raw[:2] == b"\x1f\x8b" else raw)


def read_lazyload_db(rdx: str | Path, rdb: str | Path) -> dict[str, Any]:
    """Every object of a lazy-load database (``X.rdx`` + ``X.rdb``), by name."""
    index = read_rds(rdx)
    variables = _named(index)["variables"]
    blob = Path(rdb).read_bytes()
    out = {}
    for name, (offset, length) in _named(variables).items():
        record = blob[int(offset) : int(offset) + int(length)]
        (size,) = struct.unpack(">I", record[:4])
        data = zlib.decompress(record[4:])
        if len(data) != size:
            raise ValueError(f"{rdb}: object {name!r} has {len(data)} bytes, expected {size}")
        out[name] = unserialize(data)
    return out


def _named(obj: Any) -> dict[str, Any]:
    """An R named list as a dict."""
    if not isinstance(obj, RObject) or "names" not in obj.attributes:
        raise ValueError("expected a named R list")
    return dict(zip(obj.attributes["names"], obj.value, strict=True))


def data_frame(obj: Any) -> dict[str, list[Any]]:
    """An R data.frame as {column: values}; factor columns become their labels."""
    columns = _named(obj)
    out = {}
    for name, col in columns.items():
        if isinstance(col, RObject) and "levels" in col.attributes:
            levels = col.attributes["levels"]
            levels = levels.value if isinstance(levels, RObject) else levels
            out[name] = [None if code is None else levels[code - 1] for code in col.value]
        else:
            out[name] = col.value if isinstance(col, RObject) else col
    return out
