"""The explorable forward pass (glassformer.viz.explain): every step's numbers are the hook
cache's, every source link names a line that exists and computes the step, a prompt of HTML
is text; in a browser, offline, descending by clicks shows the cache's values and the output's
temperature control gives softmax(logits / T)."""

from __future__ import annotations

import base64
import re

import numpy as np
import pytest
import torch

from glassformer import GPT, GPTConfig
from glassformer.cli import main
from glassformer.data.tokenizers import CharTokenizer
from glassformer.viz.explain import PACKAGE, explain_data, explain_html

TEXT = "the cat sat"


def floats(b64: str) -> torch.Tensor:
    return torch.from_numpy(np.frombuffer(base64.b64decode(b64), dtype="<f4").copy())


@pytest.fixture(scope="module")
def model_and_tok():
    tok = CharTokenizer("abcdefghijklmnopqrstuvwxyz .<>/\"'=()")
    torch.manual_seed(0)
    return GPT(GPTConfig.preset("llama-tiny", vocab_size=tok.vocab_size, max_len=64)).eval(), tok


def test_every_step_holds_the_caches_values_and_a_line_that_computes_it(model_and_tok):
    model, tok = model_and_tok
    data = explain_data(model, tok, TEXT)
    _, cache = model.run_with_cache(torch.tensor([tok.encode(TEXT)]))
    assert [s["name"] for s in data["steps"]] == list(cache)
    for step in data["steps"]:
        value = cache[step["name"]][0]
        if step["layout"]:
            value = value.transpose(0, 1)
        value = value.masked_fill(value == torch.finfo(value.dtype).min, -1e30)
        if value.dim() >= 2:  # thinned to 64 rows and 256 columns (the MLP's 344)
            value = value[..., :64, :]
        value = value[..., :256]
        torch.testing.assert_close(
            floats(step["values"]).view(value.shape), value, atol=1e-5, rtol=0
        )
        source = step["source"]
        lines = (PACKAGE.parent / source["file"]).read_text().splitlines()
        assert lines[source["line"] - 1].strip() == source["code"], step["name"]
        attribute = step["name"].rsplit(".", 1)[-1]
        operations = {"hook_attn_scores": "q @ k", "hook_pattern": "softmax",
                      "hook_q": "qkv", "hook_k": "qkv", "hook_v": "qkv"}  # fmt: skip
        operation = operations.get(attribute, attribute)
        assert operation in source["code"], (step["name"], source)
    logits = model(torch.tensor([tok.encode(TEXT)])).logits[0, -1]
    torch.testing.assert_close(floats(data["output"]["logits"]), logits.detach(), atol=1e-6, rtol=0)


def test_the_cli_writes_the_page_and_refuses_what_it_cannot_show(model_and_tok, tmp_path, capsys):
    model, tok = model_and_tok
    run = tmp_path / "run"
    model.save_pretrained(run, extra_files={"tokenizer.json": tok.to_json().encode()})
    page = tmp_path / "e.html"
    assert main(["explain", "--model", str(run), TEXT, "--out", str(page)]) == 0
    assert page.read_text().startswith("<!DOCTYPE html>") and "MB" in capsys.readouterr().out
    assert main(["explain", "--model", str(run), TEXT, "--out", str(tmp_path / "e.png")]) == 2
    assert "must name an .html file" in capsys.readouterr().err


browser_test = pytest.mark.browser


@browser_test
def test_descending_by_clicks_shows_the_caches_values_and_the_temperature_is_softmax(
    model_and_tok, tmp_path, browser
):
    model, tok = model_and_tok
    text = "<script>alert(1)</script>"
    path = explain_html(model, tok, text).save(tmp_path / "e.html")
    context = browser.new_context()
    refused = []
    context.route("**/*", lambda r: r.continue_() if r.request.url.startswith(("file:", "data:"))
                  else (refused.append(r.request.url), r.abort()))  # fmt: skip
    page = context.new_page()
    errors = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.on("dialog", lambda d: (errors.append(d.message), d.dismiss()))
    page.goto(path.resolve().as_uri())
    page.wait_for_selector("body[data-ready='1']")
    assert page.text_content("#subtitle") == text  # the prompt as text, nothing run
    page.click("button.box[data-go='block 2']")
    page.click("button.box[data-go='block 2 · self-attention']")
    page.click("#boxes button.box:has(small:text-is('blocks.1.attn.hook_pattern'))")
    assert page.text_content("#step-name") == "blocks.1.attn.hook_pattern"
    page.select_option("#slice", index=2)  # the third head
    cells = page.evaluate("[...document.querySelectorAll('#step-cells rect')].map(r => "
                          "[+r.dataset.row, +r.dataset.col, r.dataset.value])")  # fmt: skip
    _, cache = model.run_with_cache(torch.tensor([tok.encode(text)]), names="*hook_pattern")
    expected = cache["blocks.1.attn.hook_pattern"][0, 2]
    drawn = torch.zeros_like(expected)
    for row, col, value in cells:
        drawn[row, col] = float(value)
    torch.testing.assert_close(drawn, expected, atol=1e-6, rtol=0)
    assert re.search(r"glassformer/modules/sdpa\.py:\d+", page.text_content("#step-file"))
    total = float(page.get_attribute("#arith-sum", "data-sum"))
    scores = model.run_with_cache(torch.tensor([tok.encode(text)]), names="*hook_attn_scores")[1]
    assert total == pytest.approx(
        float(scores["blocks.1.attn.hook_attn_scores"][0, 2, 0, 0]), abs=1e-5
    )
    page.click("#crumbs button[data-depth='1']")  # back up to block 2
    assert page.locator("button.box[data-go='block 2 · feed-forward']").count() == 1
    logits = model(torch.tensor([tok.encode(text)])).logits[0, -1].detach().double()
    for temperature in ("0.5", "2"):
        page.fill("#temperature", temperature)
        page.dispatch_event("#temperature", "input")
        shown = page.evaluate("[...document.querySelectorAll('#distribution li')].map(l => "
                              "[+l.dataset.index, +l.dataset.prob])")  # fmt: skip
        expected = torch.softmax(logits / float(temperature), -1)
        for index, prob in shown:
            assert prob == pytest.approx(float(expected[index]), abs=1e-6)
    assert errors == [] and refused == []
    context.close()


def test_model_explain_is_the_page_and_a_classifier_names_its_classes(tmp_path, capsys):
    """From Python, ``model.explain(tokenizer, text)`` is the same page; a classifier run's
    page holds its labels and its class logits."""
    from glassformer import ClassifierConfig, TransformerClassifier
    from glassformer.viz.explain import explain_data

    tok = CharTokenizer("abcdefghijklmnopqrstuvwxyz .")
    torch.manual_seed(0)
    config = ClassifierConfig(vocab_size=tok.vocab_size, num_classes=2, max_len=32, d_model=32,
                              num_heads=4, num_layers=1, d_ff=64, dropout=0.0)  # fmt: skip
    model = TransformerClassifier(config).eval()
    page = model.explain(tok, TEXT)
    assert page.html == explain_html(model, tok, TEXT).html and "_repr_html_" in dir(page)
    run = tmp_path / "clf"
    files = {"tokenizer.json": tok.to_json().encode(), "labels.json": b'["neg", "pos"]'}
    model.save_pretrained(run, extra_files=files)
    out = tmp_path / "c.html"
    assert main(["explain", "--model", str(run), TEXT, "--out", str(out)]) == 0
    assert '"labels":["neg","pos"]' in out.read_text()
    logits = model(torch.tensor([tok.encode(TEXT)])).logits[0].detach()
    shown = floats(explain_data(model, tok, TEXT)["output"]["logits"])
    torch.testing.assert_close(shown, logits, atol=1e-6, rtol=0)
