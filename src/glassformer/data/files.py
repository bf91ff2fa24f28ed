"""Reading the user's own data files, with one clear error for each way they go wrong.

    read_text(path)                        plain text, for language modelling
    read_pairs(path, src_column=0, ...)    TSV/CSV sentence pairs, for translation
    read_labelled(path, text_column=...)   CSV/TSV text + label, for classification

Columns are given by index (0, 1, ...) or by header name; the delimiter follows the
extension (.tsv tab, .csv comma) or is sniffed.
"""

from __future__ import annotations

import csv
import io
from pathlib import Path

csv.field_size_limit(10**8)  # reviews and documents can be long


def _read_utf8(path: str | Path) -> str:
    path = Path(path)
    if not path.exists():
        raise ValueError(f"{path}: no such file")
    if path.is_dir():
        raise ValueError(f"{path} is a directory; expected a file")
    data = path.read_bytes()
    if not data.strip():
        raise ValueError(f"{path} is empty")
    if b"\x00" in data[:8192]:
        raise ValueError(
            f"{path} looks binary (a NUL byte at offset {data.index(0)}); expected text"
        )
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ValueError(f"{path} is not UTF-8 text (bad byte at offset {e.start})") from None
    return text.removeprefix("\ufeff")


def read_text(path: str | Path) -> str:
    """The whole file as text (UTF-8)."""
    return _read_utf8(path)


def _rows(path: str | Path, delimiter: str | None) -> list[list[str]]:
    text = _read_utf8(path)
    suffix = Path(path).suffix.lower()
    if delimiter is None:
        delimiter = {".tsv": "\t", ".csv": ","}.get(suffix)
    if delimiter is None:
        try:
            delimiter = csv.Sniffer().sniff(text[:20000], delimiters="\t,;|").delimiter
        except csv.Error:
            raise ValueError(
                f"{path}: cannot tell the delimiter; name the file .tsv or .csv"
            ) from None
    reader = csv.reader(io.StringIO(text, newline=""), delimiter=delimiter)
    return [row for row in reader if any(cell.strip() for cell in row)]


def _column_index(path: str | Path, column: str | int, header: list[str] | None, role: str) -> int:
    if isinstance(column, int):
        return column
    if header is None or column not in header:
        found = header if header is not None else "no header row"
        raise ValueError(f"{path}: no {role} column {column!r}; columns found: {found}")
    return header.index(column)


def _columns(
    path: str | Path,
    columns: tuple[str | int, str | int],
    roles: tuple[str, str],
    delimiter: str | None,
    header: bool | None,
) -> list[tuple[str, str]]:
    rows = _rows(path, delimiter)
    by_name = any(isinstance(c, str) for c in columns)
    has_header = by_name if header is None else header
    head = [cell.strip() for cell in rows[0]] if has_header else None
    body = rows[1:] if has_header else rows
    idx = [_column_index(path, c, head, r) for c, r in zip(columns, roles, strict=True)]
    width = len(rows[0])
    if max(idx) >= width:
        raise ValueError(
            f"{path}: column {max(idx)} asked for, but rows have {width} field(s)"
            + (f": {head}" if head else "")
        )
    out = []
    first_line = 2 if has_header else 1
    for n, row in enumerate(body, start=first_line):
        if len(row) <= max(idx):
            raise ValueError(
                f"{path}, row {n}: {len(row)} field(s), expected at least {max(idx) + 1}"
            )
        a, b = row[idx[0]].strip(), row[idx[1]].strip()
        if a and b:
            out.append((a, b))
    if not out:
        raise ValueError(f"{path} has no rows with both {roles[0]} and {roles[1]}")
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
        src_column, tgt_column: column indexes, or names from the header row.
        delimiter: override the delimiter (default: by extension, else sniffed).
        header: whether the first row is a header (default: yes when a column is named).
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
    """(text, label) examples from a CSV/TSV file; arguments as for ``read_pairs``."""
    return _columns(path, (text_column, label_column), ("text", "label"), delimiter, header)
