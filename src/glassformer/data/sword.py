"""A reader for SWORD Bible modules in the compressed "zText" format.

A zText module keeps each testament in three files:

    ot.bzs   block index: per block, (offset, compressed size, uncompressed size), 3 × uint32
    ot.bzv   verse index: per entry, (block number uint32, offset uint32, size uint16)
    ot.bzz   the blocks, each zlib-compressed (CompressType=ZIP)

Entries follow the module's versification: a testament heading, then per book a book
heading, per chapter a chapter heading followed by its verses. The headings carry OSIS
markers (``<div type="book" osisID="Gen"/>``, ``<chapter osisID="Gen.1"/>``), which is
how ``read_ztext`` labels every verse "Gen.1.1" without a versification table.
"""

from __future__ import annotations

import html
import re
import struct
import zlib
from pathlib import Path

_DIV = re.compile(r"<div\b[^>]*>")
_OSIS_ID = re.compile(r'\bosisID="([^"]+)"')
_CHAPTER = re.compile(r'<chapter\b[^>]*\bsID="([^".]+)\.(\d+)"')  # opening milestones only
_DROP = re.compile(r"<(note|title)\b[^>]*?(?<!/)>.*?</\1>", re.DOTALL)  # footnotes, headings
_TAG = re.compile(r"<[^>]+>")
_SPACE = re.compile(r"\s+")


def read_entries(directory: str | Path, testament: str) -> list[str]:
    """The raw (markup) text of every index entry of one testament ("ot" or "nt")."""
    d = Path(directory)
    try:
        bzs = (d / f"{testament}.bzs").read_bytes()
        bzv = (d / f"{testament}.bzv").read_bytes()
        bzz = (d / f"{testament}.bzz").read_bytes()
    except FileNotFoundError as e:
        raise ValueError(f"{d} is not a zText module: {Path(e.filename).name} is missing") from None
    if len(bzs) % 12 or len(bzv) % 10:
        raise ValueError(f"{d}: index files have odd sizes; is it zText4 rather than zText?")
    blocks = [struct.unpack_from("<III", bzs, i) for i in range(0, len(bzs), 12)]
    cache: dict[int, bytes] = {}
    out = []
    for i in range(0, len(bzv), 10):
        block, offset, size = struct.unpack_from("<IIH", bzv, i)
        if size == 0:
            out.append("")
            continue
        if block not in cache:
            start, length, _ = blocks[block]
            cache = {
                block: zlib.decompress(bzz[start : start + length])
            }  # blocks are read in order
        out.append(cache[block][offset : offset + size].decode("utf-8", errors="replace"))
    return out


def plain_text(markup: str) -> str:
    """OSIS markup → plain text: notes and headings dropped, tags removed, spaces collapsed."""
    text = _TAG.sub("", _DROP.sub(" ", markup))
    return _SPACE.sub(" ", html.unescape(text).replace("\u00b6", " ")).strip()  # ¶: paragraph mark


def _book_start(entry: str) -> str | None:
    """The book an entry opens (its ``<div type="book" sID=...>``), if it opens one."""
    for tag in _DIV.findall(entry):
        if 'type="book"' in tag and " sID=" in tag and (m := _OSIS_ID.search(tag)):
            return m.group(1)
    return None


def read_ztext(directory: str | Path) -> dict[str, str]:
    """Every verse of a module as {"Gen.1.1": "In the beginning ...", ...}, in order.

    Verses whose text is empty are left out.
    """
    verses: dict[str, str] = {}
    for testament in ("ot", "nt"):
        book, chapter, verse = None, 0, 0
        for entry in read_entries(directory, testament):
            if name := _book_start(entry):
                book, chapter = name, 0
                continue
            if m := _CHAPTER.search(entry):
                book, chapter, verse = m.group(1), int(m.group(2)), 0
                continue
            if chapter == 0:  # module and testament headings, book introductions
                continue
            verse += 1
            text = plain_text(entry)
            if text:
                verses[f"{book}.{chapter}.{verse}"] = text
    return verses
