"""A reader for SWORD Bible modules in the compressed zText / zText4 formats.

A SWORD library is a folder with ``mods.d/NAME.conf`` (one per module) and the module data
at the conf's ``DataPath``. The conf says how to read it::

    ModDrv=zText           zText: 16-bit verse sizes; zText4: 32-bit
    CompressType=ZIP       ZIP = zlib (BZIP2, XZ also read here; LZSS is not)
    BlockType=BOOK         how much text one compressed block holds (does not matter here)
    Versification=KJV      which verse comes at which index position
    SourceType=OSIS        the markup inside each verse (OSIS XML here)
    Encoding=UTF-8         else Latin-1

Each testament ("ot", "nt") is three files, all integers little-endian:

    ot.bzs   block index, per block: offset in .bzz, compressed size, uncompressed size (3 x u32)
    ot.bzv   verse index, per entry: block number (u32), offset in the unpacked block (u32),
             size (u16 for zText, u32 for zText4); size 0 = an empty entry
    ot.bzz   the compressed blocks, one after another

The verse index has one entry per position of the versification: two headings (module,
testament), then for each book a book heading, and for each chapter a chapter heading
followed by its verses. ``verse_keys`` lays that out from a versification table, so every
verse is labelled (book, chapter, verse) without relying on markers inside the text.
"""

from __future__ import annotations

import bz2
import html
import lzma
import re
import struct
import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from glassformer.data.corpora import kjv_versification
from glassformer.data.corpora.kjv_versification import Book

VerseKey = tuple[str, int, int]  # (OSIS book id, chapter, verse); 0 = a heading
HEADING: VerseKey = ("", 0, 0)  # the module and testament headings

_VERSIFICATIONS = {"KJV": kjv_versification}
_DECOMPRESS: dict[str, Callable[[bytes], bytes]] = {
    "ZIP": zlib.decompress,
    "BZIP2": bz2.decompress,
    "XZ": lzma.decompress,
}
_VERSE_ENTRY = {"ztext": struct.Struct("<IIH"), "ztext4": struct.Struct("<III")}
_BLOCK_ENTRY = struct.Struct("<III")


@dataclass(frozen=True)
class SwordModule:
    """What the reader needs from a module's conf."""

    name: str
    data_path: Path  # the folder holding ot.bzs, ot.bzv, ot.bzz, nt.*
    driver: str = "zText"
    compress: str = "ZIP"
    versification: str = "KJV"
    source_type: str = "OSIS"
    encoding: str = "UTF-8"


def read_conf(path: str | Path) -> dict[str, str]:
    """A module conf as a dict: "Name" from the ``[Name]`` line, then its ``key=value`` lines.

    A backslash at the end of a line continues the value on the next; a key given more than
    once keeps all its values, joined by newlines.
    """
    text = Path(path).read_text(encoding="utf-8", errors="replace")
    text = re.sub(r"[ \t]*\\[ \t]*\r?\n[ \t]*", " ", text)
    conf: dict[str, str] = {}
    for line in text.splitlines():
        line = line.strip()
        if line.startswith("[") and line.endswith("]"):
            conf["Name"] = line[1:-1]
        elif "=" in line and not line.startswith("#"):
            key, value = (part.strip() for part in line.split("=", 1))
            conf[key] = f"{conf[key]}\n{value}" if key in conf else value
    return conf


def open_module(conf_path: str | Path, library: str | Path | None = None) -> SwordModule:
    """The module a conf describes; ``library`` (default: the folder above ``mods.d``) is
    where its ``DataPath`` starts."""
    conf_path = Path(conf_path)
    conf = read_conf(conf_path)
    if "DataPath" not in conf:
        raise ValueError(f"{conf_path} is not a SWORD module conf: it has no DataPath")
    root = Path(library) if library is not None else conf_path.parent.parent
    return SwordModule(
        name=conf.get("Name", conf_path.stem),
        data_path=root / conf["DataPath"],
        driver=conf.get("ModDrv", "zText"),
        compress=conf.get("CompressType", "ZIP"),
        versification=conf.get("Versification", "KJV"),
        source_type=conf.get("SourceType", "Plain"),
        encoding=conf.get("Encoding", "Latin-1"),
    )


def verse_keys(books: Sequence[Book]) -> list[VerseKey]:
    """The key of every verse-index entry of one testament, headings included."""
    keys = [HEADING, HEADING]  # module heading, testament heading
    for book in books:
        keys.append((book.osis_id, 0, 0))  # book heading
        for chapter, verses in enumerate(book.chapter_verses, start=1):
            keys.append((book.osis_id, chapter, 0))  # chapter heading
            keys.extend((book.osis_id, chapter, verse) for verse in range(1, verses + 1))
    return keys


def read_entries(module: SwordModule, testament: str) -> list[str]:
    """The raw text (markup) of every verse-index entry of one testament, "ot" or "nt"."""
    entry = _VERSE_ENTRY.get(module.driver.lower())
    if entry is None:
        raise ValueError(f"{module.name}: ModDrv {module.driver!r} is not zText or zText4")
    decompress = _DECOMPRESS.get(module.compress.upper())
    if decompress is None:
        raise ValueError(
            f"{module.name}: CompressType {module.compress!r} is not supported "
            f"(expected one of {sorted(_DECOMPRESS)})"
        )
    bzs, bzv, bzz = (_read(module, f"{testament}.{ext}") for ext in ("bzs", "bzv", "bzz"))
    if len(bzs) % _BLOCK_ENTRY.size or len(bzv) % entry.size:
        raise ValueError(
            f"{module.data_path}: {testament}.bzs/.bzv sizes do not fit {module.driver} entries"
        )
    blocks = [_BLOCK_ENTRY.unpack_from(bzs, i) for i in range(0, len(bzs), _BLOCK_ENTRY.size)]
    encoding = "utf-8" if module.encoding.upper().replace("-", "") == "UTF8" else "latin-1"
    texts, cached_block, cached = [], -1, b""
    for i in range(0, len(bzv), entry.size):
        block, offset, size = entry.unpack_from(bzv, i)
        if size == 0:
            texts.append("")
            continue
        if block != cached_block:  # verses come block by block: unpack each block once
            if block >= len(blocks):
                raise ValueError(
                    f"{module.data_path}: entry {i // entry.size} is in a missing block"
                )
            start, length, _ = blocks[block]
            cached_block, cached = block, decompress(bzz[start : start + length])
        texts.append(cached[offset : offset + size].decode(encoding, errors="replace"))
    return texts


def _read(module: SwordModule, filename: str) -> bytes:
    try:
        return (module.data_path / filename).read_bytes()
    except FileNotFoundError:
        raise ValueError(
            f"{module.data_path} is not a zText module: {filename} is missing"
        ) from None


def read_verses(module: SwordModule) -> dict[VerseKey, str]:
    """Every verse of the module (headings left out) as {(book, chapter, verse): markup}, in
    Bible order. Empty verses are kept as ""."""
    table = _VERSIFICATIONS.get(module.versification)
    if table is None:
        raise ValueError(
            f"{module.name}: versification {module.versification!r} is not supported "
            f"(expected one of {sorted(_VERSIFICATIONS)})"
        )
    verses: dict[VerseKey, str] = {}
    for testament, books in (("ot", table.OLD_TESTAMENT), ("nt", table.NEW_TESTAMENT)):
        keys, entries = verse_keys(books), read_entries(module, testament)
        if len(entries) != len(keys):
            raise ValueError(
                f"{module.data_path}: {testament} has {len(entries)} entries; "
                f"{module.versification} versification expects {len(keys)}"
            )
        verses.update((key, text) for key, text in zip(keys, entries, strict=True) if key[2])
    return verses


# ---- markup ---------------------------------------------------------------------------

# Elements whose content is not the verse's text: notes (footnotes, cross-references) and
# headings that are not part of the canonical text (a Psalm's own title is, and stays).
_DROPPED = re.compile(
    r"<note\b[^>]*(?<!/)>.*?</note>"
    r"|<title\b(?![^>]*canonical=\"true\")[^>]*(?<!/)>.*?</title>",
    re.DOTALL,
)
_EMPTY_ELEMENT = re.compile(r"<[^>]*/>")  # milestones: <chapter .../>, <div .../>, <lb/>
_TAG = re.compile(r"<[^>]*>")
_STRONGS = re.compile(r"\b([HG])0*(\d+)")
_LEMMA = re.compile(r'\blemma="([^"]*)"')


def plain_text(markup: str) -> str:
    """OSIS (or similar) markup to plain text: notes and non-canonical headings dropped,
    tags removed, entities decoded, paragraph marks (¶) removed, spaces collapsed."""
    text = _DROPPED.sub(" ", markup)
    text = _EMPTY_ELEMENT.sub(" ", text)  # a milestone may stand between two words
    text = _TAG.sub("", text)  # <w>, <transChange>, <q> ... keep their words
    text = html.unescape(text).replace("\u00b6", " ")
    return " ".join(text.split())


def strongs_numbers(markup: str) -> frozenset[str]:
    """The Strong's numbers tagged in OSIS markup (``lemma="strong:H7225"``), e.g. {"H7225"}.

    They name the Hebrew or Greek word each word translates, so two translations of the
    same verse share most of them.
    """
    found: set[str] = set()
    for lemma in _LEMMA.findall(markup):
        if "strong:" in lemma:
            found.update(f"{letter}{number}" for letter, number in _STRONGS.findall(lemma))
    return frozenset(found)
