"""`glassformer graph` end to end on a tiny GPT and transcoders saved in glassformer's
format: the printed scores and interventions, the page, the labels kept beside the set (and
read back the second time), circuit-tracer's JSON, and bad input in one line."""

from __future__ import annotations

import json

import torch

from glassformer import GPT, GPTConfig, TranscoderConfig, Transcoders
from glassformer.cli import main
from glassformer.data.tokenizers import CharTokenizer


def tiny(tmp_path):
    torch.manual_seed(0)
    tok = CharTokenizer("abcdefghijklmnopqrstuvwxyz .,")
    model = GPT(GPTConfig(vocab_size=tok.vocab_size, max_len=64, d_model=32, num_heads=4,
                          num_layers=2, d_ff=64, dropout=0.0)).eval()  # fmt: skip
    lm = tmp_path / "lm"
    model.save_pretrained(lm, extra_files={"tokenizer.json": tok.to_json().encode()})
    tc = Transcoders(TranscoderConfig(d_model=32, d_transcoder=48, layers=(0, 1), k=6,
                                      model_name=str(lm), context_size=32,
                                      dataset_path="austen"))  # fmt: skip
    with torch.no_grad():
        tc.b_enc.fill_(0.3)
    tc.save_pretrained(tmp_path / "tc")
    return lm, tmp_path / "tc"


def test_graph_writes_the_page_the_labels_and_circuit_tracers_json(tmp_path, capsys):
    _, tc = tiny(tmp_path)
    page, exported = tmp_path / "g.html", tmp_path / "g.json"
    argv = ["graph", "--transcoders", str(tc), "the cat sat on the", "--windows", "8",
            "--interventions", "3", "--out", str(page), "--json", str(exported)]  # fmt: skip
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "labelling every feature" in out and "next token: " in out
    assert "replacement" in out and out.count("zeroing L") == 3
    assert page.read_text().startswith("<!DOCTYPE html>")
    data = json.loads(exported.read_text())
    assert {"metadata", "qParams", "nodes", "links"} <= set(data)
    assert any(n["feature_type"] == "logit" and n["is_target_logit"] for n in data["nodes"])
    assert len(list(tc.glob("contexts-austen-8-*.safetensors"))) == 1
    assert main(argv) == 0  # the labels are read back, not computed again
    assert "labelling every feature" not in capsys.readouterr().out


def test_graph_refuses_in_one_line(tmp_path, capsys):
    lm, tc = tiny(tmp_path)
    assert main(["graph", "--transcoders", str(tc), "", "--out", str(tmp_path / "x.html")]) == 2
    assert "the text has no tokens" in capsys.readouterr().err
    assert main(["graph", "--transcoders", str(tc), "the cat", "--corpus", "nope"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "nope" in err
