"""A small reader for R's serialization format: enough to read the data an R package ships.

R writes an object as a stream of records ("SEXPs") in XDR, i.e. big-endian:

    "X\\n"                       format: XDR (R's ASCII and native-binary formats are not read)
    int version                 2 or 3; version 3 adds the writer's native encoding name
    int writer R version, int oldest R version that can read it
    [int n, n bytes]            version 3 only: the encoding name, e.g. "UTF-8"
    item                        the object, one record after another (below)

Every record starts with a 32-bit flags word: bits 0-7 the record type, bit 9 "attributes
follow", bit 10 "a tag follows" (pairlists), bits 12-27 the "levels" (for strings, their
encoding). What follows depends on the type:

    NULL (254)                  nothing
    symbol (1)                  a string record (its name); it joins the reference table
    reference (255)             index into the reference table: flags >> 8, or an int if 0
    pairlist (2)                [attributes] [tag] value, then the next cell or NULL
    string (9)                  int length (-1 = NA), bytes
    logical/int (10/13)         int length, 4-byte ints (NA = -2**31)
    double (14)                 int length, 8-byte IEEE doubles
    character/list (16/19)      int length, that many records
    raw (24)                    int length, bytes
    ALTREP (238)                class info, state, attributes (compact sequences, wrappers)

and then, if bit 9 is set, the attributes as a pairlist (names, class, row.names, ...).

Files that hold such streams:

    .rds            one object, usually gzip'd (bzip2 and xz are possible too)
    .rda / .RData   "RDX2\\n" or "RDX3\\n", then a pairlist: object name -> object
    X.rdx + X.rdb   a lazy-load database (what ``data/Rdata.*`` and ``R/pkg.*`` are):
                    X.rdx is an .rds naming each object's (offset, length) in X.rdb;
                    each X.rdb record is a 4-byte big-endian uncompressed length, then
                    the serialized object compressed with zlib (or, when the index says
                    compression 2 or 3, a type byte and bzip2 / xz / no compression)

Values come back as plain Python: vectors are lists (NA is None; NA in doubles stays NaN),
pairlists are dicts by tag, and a vector with attributes is an ``RObject``. Record types
beyond these (environments, closures, S4 objects, ...) raise ``ValueError``.
"""

from __future__ import annotations

import bz2
import gzip
import lzma
import struct
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# Record types: R's SEXPTYPE codes and the serializer's special codes.
NILSXP, SYMSXP, LISTSXP, CHARSXP = 0, 1, 2, 9
LGLSXP, INTSXP, REALSXP, STRSXP, VECSXP, EXPRSXP, RAWSXP = 10, 13, 14, 16, 19, 20, 24
ALTREP_SXP, BASEENV_SXP, EMPTYENV_SXP = 238, 241, 242
GLOBALENV_SXP, NILVALUE_SXP, REFSXP = 253, 254, 255
_VECTORS = {LGLSXP, INTSXP, REALSXP, STRSXP, VECSXP, EXPRSXP, RAWSXP}
_NULL_LIKE = {NILSXP, NILVALUE_SXP, EMPTYENV_SXP, BASEENV_SXP, GLOBALENV_SXP}
_HAS_ATTRIBUTES, _HAS_TAG = 1 << 9, 1 << 10
_LATIN1, _BYTES = 1 << 2, 1 << 1  # string encodings, in the "levels" bits
NA_INTEGER = -(2**31)


@dataclass
class RObject:
    """An R vector with attributes (names, class, levels, row.names, dim, ...)."""

    value: Any
    attributes: dict[str, Any] = field(default_factory=dict)


class _Stream:
    """Reads records from one serialized object."""

    def __init__(self, data: bytes) -> None:
        self.data, self.pos = data, 0
        self.references: list[Any] = []

    def take(self, n: int) -> bytes:
        if n < 0 or self.pos + n > len(self.data):
            raise ValueError("R data ends early: the file is truncated or is not R data")
        chunk = self.data[self.pos : self.pos + n]
        self.pos += n
        return chunk

    def read_int(self) -> int:
        return struct.unpack(">i", self.take(4))[0]

    def read_length(self) -> int:
        n = self.read_int()
        if n == -1:  # a "long vector": the length follows as two ints
            upper, lower = self.read_int(), self.read_int()
            n = (upper << 32) + lower
        return n

    def read_header(self) -> None:
        if self.take(2) != b"X\n":
            raise ValueError("not R's XDR serialization (it starts without 'X\\n')")
        version = self.read_int()
        self.read_int(), self.read_int()  # writer's R version, oldest R version to read it
        if version == 3:
            self.take(self.read_int())  # the writer's native encoding, e.g. "UTF-8"
        elif version != 2:
            raise ValueError(f"R serialization version {version} is not supported (2 or 3)")

    def read_item(self) -> Any:
        flags = self.read_int()
        kind = flags & 0xFF
        if kind in _NULL_LIKE:
            return None
        if kind == REFSXP:
            index = (flags >> 8) or self.read_int()
            if not 1 <= index <= len(self.references):
                raise ValueError(f"R data refers to object {index}, which it never defined")
            return self.references[index - 1]
        if kind == SYMSXP:
            name = self.read_item()  # the symbol's name, a string record
            self.references.append(name)
            return name
        if kind == LISTSXP:
            return self.read_pairlist(flags)
        if kind == CHARSXP:
            return self.read_string(flags)
        if kind == ALTREP_SXP:
            return self.read_altrep()
        if kind not in _VECTORS:
            raise ValueError(f"R record type {kind} is not supported by this reader")
        value = self.read_vector(kind)
        if flags & _HAS_ATTRIBUTES:
            return RObject(value, self.read_attributes())
        return value

    def read_string(self, flags: int) -> str | None:
        n = self.read_int()
        if n == -1:
            return None  # NA_character_
        raw = self.take(n)
        levels = flags >> 12
        if levels & _BYTES:
            return raw.decode("latin-1")  # "bytes" strings: kept byte for byte
        return raw.decode("latin-1" if levels & _LATIN1 else "utf-8", errors="replace")

    def read_vector(self, kind: int) -> Any:
        n = self.read_length()
        if kind in (LGLSXP, INTSXP):
            values = struct.unpack(f">{n}i", self.take(4 * n))
            if kind == LGLSXP:
                return [None if v == NA_INTEGER else bool(v) for v in values]
            return [None if v == NA_INTEGER else v for v in values]
        if kind == REALSXP:
            return list(struct.unpack(f">{n}d", self.take(8 * n)))
        if kind in (STRSXP, VECSXP, EXPRSXP):
            return [self.read_item() for _ in range(n)]
        return self.take(n)  # RAWSXP

    def read_pairlist(self, flags: int) -> dict[Any, Any]:
        """A pairlist (a linked list of optionally tagged cells) as a dict by tag.

        Untagged cells are keyed by their position.
        """
        out: dict[Any, Any] = {}
        while True:
            if flags & _HAS_ATTRIBUTES:
                self.read_attributes()  # a pairlist cell's own attributes: not needed
            tag = self.read_item() if flags & _HAS_TAG else len(out)
            out[tag] = self.read_item()
            flags = self.read_int()  # the next cell, or the end
            if flags & 0xFF in _NULL_LIKE:
                return out
            if flags & 0xFF != LISTSXP:
                raise ValueError(f"malformed pairlist: it ends in record type {flags & 0xFF}")

    def read_attributes(self) -> dict[Any, Any]:
        flags = self.read_int()
        if flags & 0xFF != LISTSXP:
            raise ValueError(f"malformed attributes: record type {flags & 0xFF}, not a pairlist")
        return self.read_pairlist(flags)

    def read_altrep(self) -> Any:
        """An ALTREP object: R >= 3.5 writes compact sequences and wrappers this way."""
        info = self.read_item()  # pairlist: class symbol, package symbol, base type
        state = self.read_item()
        attributes = self.read_item()
        cls = info[0] if isinstance(info, dict) else None
        if cls in ("compact_intseq", "compact_realseq"):
            n, start, step = (state.value if isinstance(state, RObject) else state)[:3]
            value: Any = [start + i * step for i in range(int(n))]
            if cls == "compact_intseq":
                value = [int(v) for v in value]
        elif isinstance(cls, str) and cls.startswith("wrap_"):
            value = state[0]  # state: list(the wrapped vector, metadata)
        else:
            raise ValueError(f"R ALTREP class {cls!r} is not supported by this reader")
        if attributes:
            if isinstance(value, RObject):
                value = value.value
            return RObject(value, dict(attributes))
        return value


def unserialize(data: bytes) -> Any:
    """One R object from its XDR serialization (what ``serialize()`` and ``saveRDS`` write)."""
    stream = _Stream(data)
    stream.read_header()
    return stream.read_item()


def decompress(raw: bytes) -> bytes:
    """``raw`` unpacked if it is gzip, bzip2 or xz (recognised by its magic bytes)."""
    if raw.startswith(b"\x1f\x8b"):
        return gzip.decompress(raw)
    if raw.startswith(b"BZh"):
        return bz2.decompress(raw)
    if raw.startswith(b"\xfd7zXZ\x00"):
        return lzma.decompress(raw)
    return raw


def read_rds(path: str | Path) -> Any:
    """The object in an ``.rds`` file."""
    return unserialize(decompress(Path(path).read_bytes()))


def read_rdata(path: str | Path) -> dict[str, Any]:
    """Every object in an ``.rda`` / ``.RData`` file (what ``save()`` writes), by name."""
    data = decompress(Path(path).read_bytes())
    if data[:5] not in (b"RDX2\n", b"RDX3\n"):
        raise ValueError(f"{path} is not an R data file in XDR format (no RDX2/RDX3 header)")
    objects = unserialize(data[5:])
    return objects if isinstance(objects, dict) else {}


def read_lazyload_db(rdx: str | Path, rdb: str | Path) -> dict[str, Any]:
    """Every object of a lazy-load database (``X.rdx`` + ``X.rdb``), by name."""
    index = as_dict(read_rds(rdx))
    compression = index.get("compressed", [True])
    compression = compression[0] if isinstance(compression, list) else compression
    blob = Path(rdb).read_bytes()
    objects = {}
    for name, position in as_dict(index["variables"]).items():
        offset, length = (int(v) for v in position)
        record = blob[offset : offset + length]
        objects[name] = unserialize(_unpack_record(record, compression, f"{rdb}: {name!r}"))
    return objects


_RECORD_COMPRESSION: dict[bytes, Callable[[bytes], bytes]] = {
    b"Z": lzma.decompress,
    b"2": bz2.decompress,
    b"1": zlib.decompress,
}


def _unpack_record(record: bytes, compression: Any, where: str) -> bytes:
    """One lazy-load record: a 4-byte length, then the serialized object, compressed."""
    if len(record) < 4:
        raise ValueError(f"{where}: the record is truncated")
    (size,) = struct.unpack(">I", record[:4])
    body = record[4:]
    if compression in (2, 3):  # a type byte says how this record is compressed
        kind, body = body[:1], body[1:]
        if kind == b"0":
            data = body
        elif kind in _RECORD_COMPRESSION:
            data = _RECORD_COMPRESSION[kind](body)
        else:
            raise ValueError(f"{where}: compression type {kind!r} is unknown (Z, 2, 1 or 0)")
    else:
        data = zlib.decompress(body)
    if len(data) != size:
        raise ValueError(f"{where}: unpacks to {len(data)} bytes, the record says {size}")
    return data


def as_dict(obj: Any) -> dict[str, Any]:
    """An R named list (or named vector) as a dict from name to element."""
    if not isinstance(obj, RObject) or "names" not in obj.attributes:
        raise ValueError(f"expected a named R list, got {type(obj).__name__}")
    return dict(zip(obj.attributes["names"], obj.value, strict=True))


def data_frame(obj: Any) -> dict[str, list[Any]]:
    """An R data.frame as {column: values}; factor columns become their labels."""
    columns = {}
    for name, column in as_dict(obj).items():
        if isinstance(column, RObject) and "levels" in column.attributes:
            levels = column.attributes["levels"]
            levels = levels.value if isinstance(levels, RObject) else levels
            columns[name] = [None if code is None else levels[code - 1] for code in column.value]
        else:
            columns[name] = column.value if isinstance(column, RObject) else column
    return columns
