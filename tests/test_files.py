"""Reading the user's files: what works, and one clear line for each way it can fail."""

import pytest

from glassformer.data.files import read_labelled, read_pairs, read_text


def write(tmp_path, name, content):
    path = tmp_path / name
    path.write_bytes(content if isinstance(content, bytes) else content.encode("utf-8"))
    return path


def test_text_pairs_and_labelled_rows(tmp_path):
    assert read_text(write(tmp_path, "a.txt", "\ufeffhello\nworld\n")) == "hello\nworld\n"
    pairs = write(tmp_path, "p.tsv", "good morning\tbuenos días\nthank you\tgracias\n")
    assert read_pairs(pairs) == [("good morning", "buenos días"), ("thank you", "gracias")]
    rows = write(tmp_path, "r.csv", 'label,text\npos,"great, really, great"\nneg,"bad\nand long"\n')
    assert read_labelled(rows) == [("great, really, great", "pos"), ("bad\nand long", "neg")]


def test_columns_by_name_and_index(tmp_path):
    path = write(tmp_path, "p.csv", "id,en,es\n1,one,uno\n2,two,dos\n")
    assert read_pairs(path, src_column="en", tgt_column="es") == [("one", "uno"), ("two", "dos")]
    assert read_pairs(path, src_column=2, tgt_column=1, header=True) == [
        ("uno", "one"),
        ("dos", "two"),
    ]


def test_sniffed_delimiter(tmp_path):
    path = write(tmp_path, "p.txt", "a;b\nc;d\ne;f\n")
    assert read_pairs(path) == [("a", "b"), ("c", "d"), ("e", "f")]


@pytest.mark.parametrize(
    "name, content, call, message",
    [
        ("missing.txt", None, read_text, "no such file"),
        ("empty.txt", "  \n", read_text, "is empty"),
        ("bin.txt", b"abc\x00def", read_text, "looks binary .*offset 3"),
        ("latin.txt", "caf\xe9".encode("latin-1"), read_text, "not UTF-8 .*offset 3"),
        (
            "p.csv",
            "text,label\nhi,pos\n",
            lambda p: read_labelled(p, label_column="sentiment"),
            r"no label column 'sentiment'; columns found: \['text', 'label'\]",
        ),
        ("p.tsv", "a\tb\nc\n", read_pairs, "row 2: 1 field"),
        ("p.tsv", "a\tb\n", lambda p: read_pairs(p, tgt_column=5), "column 5 asked for"),
        ("p.tsv", "a\t\n\tb\n", read_pairs, "no rows with both source and target"),
    ],
)
def test_each_problem_is_named(tmp_path, name, content, call, message):
    path = tmp_path / name if content is None else write(tmp_path, name, content)
    with pytest.raises(ValueError, match=message) as e:
        call(path)
    assert str(path.name) in str(e.value) and "\n" not in str(e.value)


def test_a_directory_is_not_a_file(tmp_path):
    with pytest.raises(ValueError, match="is a directory"):
        read_text(tmp_path)
