"""`glassformer circuit` end to end on a tiny GPT and pairs from a CSV: the task's line, the
faithfulness table of EAP-IG, EAP and random circuits, CPR and CMD, the page and the JSON;
and, in a real browser with the network refused, the page: it loads with no request, draws
the slider's number of top edges at the widths their scores give, and shows a hostile name
as text. Bad input in one line."""

from __future__ import annotations

import json

import pytest
import torch

from glassformer import GPT, GPTConfig
from glassformer.cli import main
from glassformer.data.tokenizers import CharTokenizer
from tests.test_viz_html import Opened

HOSTILE = '<img src=x onerror="alert(1)">'
DRAWN = ("[...document.querySelectorAll('#circuit-svg path.edge')]"
         ".map(e => [+e.dataset.score, +e.getAttribute('stroke-width')])")  # fmt: skip
PAIRS = [("the cat sat on the", "the dog sat on the", "m", "r"),
         ("a cat ran to a", "a dog ran to a", "t", "h"),
         ("my cat is so", "my dog is so", "c", "b")]  # fmt: skip


def tiny(tmp_path, name: str = "pairs"):
    torch.manual_seed(0)
    tok = CharTokenizer("abcdefghijklmnopqrstuvwxyz .,")
    model = GPT(GPTConfig(vocab_size=tok.vocab_size, max_len=64, d_model=32, num_heads=4,
                          num_layers=2, d_ff=64, dropout=0.0)).eval()  # fmt: skip
    lm = tmp_path / "lm"
    model.save_pretrained(lm, extra_files={"tokenizer.json": tok.to_json().encode()})
    pairs = tmp_path / f"{name}.csv"
    pairs.write_text("clean,corrupt,answer,wrong\n" + "".join(",".join(p) + "\n" for p in PAIRS))
    return lm, pairs


def test_circuit_prints_the_curves_and_writes_the_page_and_json(tmp_path, capsys):
    lm, pairs = tiny(tmp_path)
    page, exported = tmp_path / "c.html", tmp_path / "c.json"
    argv = ["circuit", "--model", str(lm), "--pairs", str(pairs), "--ig-steps", "3",
            "--out", str(page), "--json", str(exported)]  # fmt: skip
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "pairs: 3 pairs" in out and "the model does the task" in out
    assert "EAP-IG (3 steps, over the inputs) scored" in out and "EAP: its circuits" in out
    for name in ("EAP-IG (3 steps)", "EAP", "random"):
        assert f"{name}: CPR " in out
    assert out.count("\n") > 20 and page.read_text().startswith("<!DOCTYPE html>")
    data = json.loads(exported.read_text())
    assert [m["name"] for m in data["methods"]] == ["EAP-IG (3 steps)", "EAP", "random"]
    assert all(len(m["absolute"]) == 10 and m["absolute"][-1] == 1.0 for m in data["methods"])
    assert data["edges"][0]["writer"] and data["real"] == 110  # 2 layers of 4 heads


def test_circuit_refuses_in_one_line(tmp_path, capsys):
    lm, pairs = tiny(tmp_path)
    uneven = tmp_path / "uneven.csv"
    uneven.write_text("clean,corrupt,answer,wrong\nthe cat,the big dog,a,b\n")
    cases = [
        (["--pairs", str(uneven)], "uneven.csv line 2: the clean text is 7 tokens"),
        (["--pairs", str(pairs), "--out", "x.png"], "--out must name an .html file"),
        (["--task", "ioi"], "IOI needs names of one token each"),
        (["--pairs", str(pairs), "--ig-steps", "0"], "must be positive integers"),
    ]
    for extra, message in cases:
        assert main(["circuit", "--model", str(lm), *extra]) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and message in err, err


@pytest.mark.browser
def test_the_page_draws_the_top_edges_by_size_offline(browser, tmp_path, capsys):
    lm, pairs = tiny(tmp_path, name=HOSTILE.replace("/", "").replace(" ", "_"))
    page = tmp_path / "c.html"
    assert main(["circuit", "--model", str(lm), "--pairs", str(pairs), "--ig-steps", "2",
                 "--out", str(page), "--json", str(tmp_path / "c.json")]) == 0  # fmt: skip
    capsys.readouterr()
    data = json.loads((tmp_path / "c.json").read_text())
    view = Opened(browser, page)
    try:
        view.offline_and_clean()
        p = view.page
        for index in (0, 5, 9):
            p.locator("#size").fill(str(index))
            drawn = p.evaluate(DRAWN)
            assert len(drawn) == data["sizes"][index]
            largest = max(abs(e["score"]) for e in data["edges"])
            for score, width in drawn:
                assert width == pytest.approx(0.4 + 4 * abs(score) / largest, abs=1e-3)
            assert f"{data['sizes'][index]} of {data['real']} edges" in p.inner_text("#size-label")
        assert "CPR" in p.inner_text("#figures") and "random" in p.inner_text("#figures")
        assert HOSTILE.replace("/", "").replace(" ", "_") in p.inner_text("#footer")
        p.locator("#circuit-svg .node").nth(3).click()
        assert "score" in p.inner_text("#panel-title")
        assert p.locator("img").count() == 0 and p.evaluate("window.__ran") == []
        view.offline_and_clean()
        p.screenshot(path=str(tmp_path / "circuit.png"))
    finally:
        view.close()
