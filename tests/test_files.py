"""Reading the user's files: what works, and one clear line for each way it can fail."""

import pytest

from glassformer.data.files import read_labelled, read_pairs, read_text


def write(tmp_path, name, content):
    path = tmp_path / name
    path.write_bytes(content if isinstance(content, bytes) else content.encode("utf-8"))
    return path


def test_text_is_utf8_without_bom_and_with_plain_newlines(tmp_path):
    assert read_text(write(tmp_path, "a.txt", "\ufeffhello\r\nwörld\n")) == "hello\nwörld\n"


def test_pairs_from_tsv_and_csv(tmp_path):
    pairs = write(tmp_path, "p.tsv", "good morning\tbuenos días\n\nthank you\tgracias\n")
    assert read_pairs(pairs) == [("good morning", "buenos días"), ("thank you", "gracias")]
    csv_pairs = write(tmp_path, "p.csv", 'one,uno\n"two, or three","dos, o tres"\n')
    assert read_pairs(csv_pairs) == [("one", "uno"), ("two, or three", "dos, o tres")]


def test_quoted_fields_hold_commas_newlines_and_quotes(tmp_path):
    content = 'label,text\npos,"great, really, great"\nneg,"bad\nand long"\nneg,"a ""quote"""\n'
    assert read_labelled(write(tmp_path, "r.csv", content)) == [
        ("great, really, great", "pos"),
        ("bad\nand long", "neg"),
        ('a "quote"', "neg"),
    ]


def test_columns_by_name_and_index(tmp_path):
    path = write(tmp_path, "p.csv", "id,en,es\n1,one,uno\n2,two,dos\n")
    assert read_pairs(path, src_column="en", tgt_column="es") == [("one", "uno"), ("two", "dos")]
    assert read_pairs(path, src_column="EN", tgt_column=2) == [("one", "uno"), ("two", "dos")]
    assert read_pairs(path, src_column=2, tgt_column=1, header=True) == [
        ("uno", "one"),
        ("dos", "two"),
    ]
    assert read_pairs(path, src_column=1, tgt_column=2)[0] == ("en", "es")  # no header asked
    headerless = write(tmp_path, "l.tsv", "fine film\tpos\ndull\tneg\n")
    assert read_labelled(headerless, text_column=0, label_column=1) == [
        ("fine film", "pos"),
        ("dull", "neg"),
    ]


def test_sniffed_and_given_delimiters(tmp_path):
    assert read_pairs(write(tmp_path, "p.txt", "a;b\nc;d\ne;f\n")) == [
        ("a", "b"),
        ("c", "d"),
        ("e", "f"),
    ]
    assert read_pairs(write(tmp_path, "q.txt", "a, b\tc\nd\te\n")) == [("a, b", "c"), ("d", "e")]
    assert read_pairs(write(tmp_path, "r.dat", "a|b\n"), delimiter="|") == [("a", "b")]


def test_rows_missing_a_value_are_skipped(tmp_path):
    path = write(tmp_path, "p.tsv", "a\tb\n\tc\nd\t \ne\tf\n")
    assert read_pairs(path) == [("a", "b"), ("e", "f")]


@pytest.mark.parametrize(
    "name, content, call, message",
    [
        ("missing.txt", None, read_text, "missing.txt: no such file"),
        ("empty.txt", "", read_text, "empty.txt is empty$"),
        ("blank.txt", "  \n", read_text, r"is empty \(only whitespace\)"),
        ("bin.txt", b"abc\x00def", read_text, r"looks binary \(a NUL byte at offset 3\)"),
        ("u16.txt", "hi".encode("utf-16"), read_text, "is UTF-16 text; save it as UTF-8"),
        (
            "latin.txt",
            "ok\ncaf\xe9".encode("latin-1"),
            read_text,
            r"not UTF-8 text: byte 0xe9 at offset 6 \(line 2\)",
        ),
        (
            "p.csv",
            "text,label\nhi,pos\n",
            lambda p: read_labelled(p, label_column="sentiment"),
            r"no label column 'sentiment'; columns found: \['text', 'label'\]",
        ),
        (
            "p.csv",
            "review,sentiment\nhi,pos\n",
            read_labelled,
            r"no text column 'text'; columns found: \['review', 'sentiment'\]",
        ),
        (
            "p.csv",
            "a,b\n",
            lambda p: read_pairs(p, src_column="a", header=False),
            "source column 'a' is a name, but header=False",
        ),
        ("p.tsv", "a\tb\n\nc\n", read_pairs, r"p.tsv, line 3: 1 field\(s\), expected 2"),
        ("p.csv", 'a,b\n"x\ny",z\nq,r,s\n', read_pairs, r"line 4: 3 field\(s\), expected 2"),
        (
            "p.tsv",
            "a\tb\n",
            lambda p: read_pairs(p, tgt_column=5),
            r"target column 5 asked for, but rows have 2 field\(s\): \['a', 'b'\]",
        ),
        ("p.tsv", "a\t\n\tb\n", read_pairs, "no rows with both a source and a target"),
        ("p.txt", "just one column\nof prose\n", read_pairs, "cannot tell the delimiter"),
    ],
)
def test_each_problem_is_named_in_one_line(tmp_path, name, content, call, message):
    path = tmp_path / name if content is None else write(tmp_path, name, content)
    with pytest.raises(ValueError, match=message) as e:
        call(path)
    assert str(path) in str(e.value) and "\n" not in str(e.value)


def test_a_directory_is_not_a_file(tmp_path):
    with pytest.raises(ValueError, match="is a directory"):
        read_text(tmp_path)
