"""Reading the user's own data files, with one clear error for each way they go wrong.

    read_text(path)                        plain text, for language modelling
    read_pairs(path, src_column=0, ...)    TSV/CSV sentence pairs, for translation
    read_labelled(path, text_column=...)   CSV/TSV text + label, for classification

Files are UTF-8 (a byte-order mark is allowed). Tables are read with the ``csv`` module, so
quoted fields may hold the delimiter, quotes and newlines. Columns are given by index
(0, 1, ...) or by header name; the delimiter follows the extension (``.tsv`` tab, ``.csv``
comma) or is sniffed from the first lines. Every problem raises a ``ValueError`` of one line
that names the file and, where there is one, the line.
"""

from __future__ import annotations

import csv
import io
from pathlib import Path

csv.field_size_limit(2**31 - 1)  # reviews and documents can be long

_DELIMITERS = {".tsv": "\t", ".tab": "\t", ".csv": ","}
_SNIFF_BYTES = 64_000


def _read_utf8(path: str | Path) -> str:
    """The file's text, or a ValueError saying why it is not usable text."""
    path = Path(path)
    if not path.exists():
        raise ValueError(f"{path}: no such file")
    if path.is_dir():
        raise ValueError(f"{path} is a directory; expected a file")
    data = path.read_bytes()
    if not data.strip():
        raise ValueError(f"{path} is empty" + (" (only whitespace)" if data else ""))
    if data.startswith((b"\xff\xfe", b"\xfe\xff")):
        raise ValueError(f"{path} is UTF-16 text; save it as UTF-8")
    nul = data.find(b"\x00")
    if nul >= 0:
        raise ValueError(f"{path} looks binary (a NUL byte at offset {nul}); expected text")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        line = data.count(b"\n", 0, e.start) + 1
        raise ValueError(
            f"{path} is not UTF-8 text: byte 0x{data[e.start]:02x} at offset {e.start} "
            f"(line {line}); save it as UTF-8"
        ) from None
    return text.removeprefix("\ufeff")


def read_text(path: str | Path) -> str:
    """The whole file as text (UTF-8), with line endings made ``\\n``.

    Raises:
        ValueError: a missing, empty, binary or non-UTF-8 file.
    """
    return _read_utf8(path).replace("\r\n", "\n").replace("\r", "\n")


def _delimiter(path: Path, text: str, delimiter: str | None) -> str:
    if delimiter is not None:
        if len(delimiter) != 1:
            raise ValueError(f"delimiter must be one character, got {delimiter!r}")
        return delimiter
    if path.suffix.lower() in _DELIMITERS:
        return _DELIMITERS[path.suffix.lower()]
    lines = [line for line in text[:_SNIFF_BYTES].splitlines()[:50] if line.strip()]
    if lines and all("\t" in line for line in lines):
        return "\t"
    try:
        return csv.Sniffer().sniff("\n".join(lines), delimiters="\t,;|").delimiter
    except csv.Error:
        raise ValueError(
            f"{path}: cannot tell the delimiter; name the file .tsv or .csv, or give the delimiter"
        ) from None


def _rows(path: Path, delimiter: str | None) -> list[tuple[int, list[str]]]:
    """(line number where the row starts, fields) for each non-blank row."""
    text = _read_utf8(path)
    reader = csv.reader(io.StringIO(text, newline=""), delimiter=_delimiter(path, text, delimiter))
    rows = []
    line = 1
    try:
        for row in reader:
            if any(cell.strip() for cell in row):
                rows.append((line, row))
            line = reader.line_num + 1
    except csv.Error as e:
        raise ValueError(f"{path}, line {reader.line_num}: cannot parse the row ({e})") from None
    return rows


def _column_index(path: Path, column: str | int, header: list[str] | None, role: str) -> int:
    """The index of ``column`` (an index, or a name in ``header``)."""
    if isinstance(column, bool) or not isinstance(column, (int, str)):
        raise ValueError(f"{role} column must be an index or a name, got {column!r}")
    if isinstance(column, int):
        if column < 0:
            raise ValueError(f"{path}: {role} column must be 0 or more, got {column}")
        return column
    if header is None:
        raise ValueError(
            f"{path}: {role} column {column!r} is a name, but header=False; give an index"
        )
    if column in header:
        return header.index(column)
    folded = [name.casefold() for name in header]
    if folded.count(column.casefold()) == 1:
        return folded.index(column.casefold())
    raise ValueError(f"{path}: no {role} column {column!r}; columns found: {header}")


def _columns(
    path: str | Path,
    columns: tuple[str | int, str | int],
    roles: tuple[str, str],
    delimiter: str | None,
    header: bool | None,
) -> list[tuple[str, str]]:
    """Two columns of a table, as stripped string pairs; rows missing either are skipped."""
    path = Path(path)
    rows = _rows(path, delimiter)
    if not rows:
        raise ValueError(f"{path} has no rows with any text")
    has_header = any(isinstance(c, str) for c in columns) if header is None else header
    first_line, first = rows[0]
    head = [cell.strip() for cell in first] if has_header else None
    body = rows[1:] if has_header else rows
    idx = [_column_index(path, c, head, r) for c, r in zip(columns, roles, strict=True)]
    width = len(first)
    for role, i in zip(roles, idx, strict=True):
        if i >= width:
            found = head if head is not None else first
            raise ValueError(
                f"{path}: {role} column {i} asked for, but rows have {width} field(s): {found}"
            )
    out = []
    for line, row in body:
        if len(row) != width:
            raise ValueError(
                f"{path}, line {line}: {len(row)} field(s), expected {width} "
                f"as on line {first_line} (quote fields that hold the delimiter)"
            )
        a, b = row[idx[0]].strip(), row[idx[1]].strip()
        if a and b:
            out.append((a, b))
    if not out:
        raise ValueError(f"{path} has no rows with both a {roles[0]} and a {roles[1]}")
    return out


def read_pairs(
    path: str | Path,
    *,
    src_column: str | int = 0,
    tgt_column: str | int = 1,
    delimiter: str | None = None,
    header: bool | None = None,
) -> list[tuple[str, str]]:
    """(source, target) sentence pairs from a TSV/CSV file.

    Args:
        path: the file.
        src_column: the source column: an index, or a name from the header row.
        tgt_column: the target column, likewise.
        delimiter: the field delimiter (default: by extension, else sniffed).
        header: whether the first row is a header (default: yes when a column is named).

    Returns:
        The pairs, fields stripped of surrounding whitespace, in file order; rows with an
        empty source or target are skipped.

    Raises:
        ValueError: a missing, empty, binary or non-UTF-8 file; a column that is not there
            (the message lists those found); a row with a different number of fields from
            the first (the message gives its line).
    """
    return _columns(path, (src_column, tgt_column), ("source", "target"), delimiter, header)


def read_labelled(
    path: str | Path,
    *,
    text_column: str | int = "text",
    label_column: str | int = "label",
    delimiter: str | None = None,
    header: bool | None = None,
) -> list[tuple[str, str]]:
    """(text, label) examples from a CSV/TSV file.

    The default columns are the header's ``text`` and ``label``; for a file without a header
    give indexes (``text_column=0, label_column=1``). Arguments, return value and errors are
    as for ``read_pairs``.
    """
    return _columns(path, (text_column, label_column), ("text", "label"), delimiter, header)
