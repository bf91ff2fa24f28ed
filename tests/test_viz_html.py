"""The attention viewer page (``glassformer.viz.attention_html``, ``attention --out x.html``).

Two halves. The first runs everywhere: the data the page embeds is the model's own (weights
exactly, queries and keys that give its scores), escaped so no token can end the script
element, with no network address in the page; the size limit refuses in one line; the CLI
writes the file. The second drives the page in a real browser (Debian's chromium through
Playwright) and is skipped, saying why, where either is missing: the page loads from
file:// with the network cut and no console error, the head view's lines are the weights,
the neuron view's products sum to the model's score, HTML and script in tokens show as text
and run nothing, and a 40-token page of a 6-layer, 8-head model is small and quick.

Install for the browser half: ``apt-get install chromium`` and ``pip install playwright``
(no browser download: the tests launch /usr/bin/chromium, or $GLASSFORMER_CHROMIUM).
"""

from __future__ import annotations

import base64
import json
import math
import os
import re
import time
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from glassformer import GPT, GPTConfig, Seq2SeqConfig, Seq2SeqTransformer
from glassformer.cli import main
from glassformer.data.tokenizers import CharTokenizer
from glassformer.models.families import GemmaConfig, T5Config
from glassformer.modules.attention import MultiHeadAttention
from glassformer.viz import attention_html, attention_maps, viewer
from glassformer.viz.page import embed_json, render

TEXT = "the cat sat on the mat"
SCRIPTS = len(viewer.SCRIPTS) + 1  # script elements in a page: the viewer's and the data
FRAGMENTS = [
    "<script>alert(1)</script>",
    "</div>",
    '"onload=alert(2)',
    "&amp;",
    "<img/src=x/onerror=alert(3)>",
    "</script><script>alert(4)</script>",
    "<!--",
    "{{script}}",
]


class WordTokenizer:
    """Whole words as tokens (split on spaces), so a token may be any string at all."""

    def __init__(self, words: list[str]) -> None:
        self.words = ["<pad>", *dict.fromkeys(words)]
        self.vocab_size = len(self.words)

    def encode(self, text: str) -> list[int]:
        return [self.words.index(w) for w in text.split(" ")]

    def id_to_token(self, i: int) -> str:
        return self.words[i]


@pytest.fixture(scope="module")
def chars():
    return CharTokenizer("abcdefghijklmnopqrstuvwxyz .,")


def modern_gpt(vocab_size: int, **sizes) -> GPT:
    """A random modern decoder: rotary positions, RMSNorm, SwiGLU, grouped-query attention
    (4 query heads share 2 key/value heads), with sharpened q/k projections so that maps
    differ between layers and heads."""
    torch.manual_seed(0)
    fields = dict(d_model=64, num_heads=4, num_layers=2, num_kv_heads=2, max_len=64)
    fields |= sizes
    config = GPTConfig(
        vocab_size=vocab_size,
        positional="rope",
        norm="rms",
        activation="swiglu",
        bias=False,
        dropout=0.0,
        **fields,
    )
    return sharpen(GPT(config))


def translator(vocab_size: int) -> Seq2SeqTransformer:
    torch.manual_seed(0)
    config = Seq2SeqConfig.preset("tiny", src_vocab_size=vocab_size, tgt_vocab_size=vocab_size)
    return sharpen(Seq2SeqTransformer(config))


def sharpen(model, seed=1):
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, MultiHeadAttention):
                m.qkv_proj.weight.copy_(torch.randn(m.qkv_proj.weight.shape, generator=g) * 0.1)
    return model.eval()


def page_data(page: str) -> dict:
    found = re.search(r'<script type="application/json" id="attention-data">(.*?)</script>', page)
    assert found, "no data block"
    return json.loads(found.group(1))


def floats(b64: str, *shape: int) -> torch.Tensor:
    values = np.frombuffer(base64.b64decode(b64), dtype="<f4")
    return torch.from_numpy(values.copy()).view(*shape)


def scores_of(model, args, kind: str) -> torch.Tensor:
    """q kᵀ / √Dh of every attention module of ``kind``, recomputed here from what each
    module was called with and its own q and k rows: (L, H, Tq, Tk)."""
    found = []

    def record(module, call_args, call_kwargs, _out, name):
        query = call_args[0]
        key = call_kwargs.get("key", call_args[1] if len(call_args) > 1 else None)
        memory = query if key is None else key
        H, Hkv, Dh = module.num_heads, module.num_kv_heads, module.head_dim
        w = module.qkv_proj.weight
        b = module.qkv_proj.bias
        w_q, w_k = w[: H * Dh], w[H * Dh : (H + Hkv) * Dh]
        b_q = None if b is None else b[: H * Dh]
        b_k = None if b is None else b[H * Dh : (H + Hkv) * Dh]
        q = F.linear(query, w_q, b_q)[0].view(-1, H, Dh).transpose(0, 1)  # (H, Tq, Dh)
        k = F.linear(memory, w_k, b_k)[0].view(-1, Hkv, Dh).transpose(0, 1)  # (Hkv, Tk, Dh)
        rotary = getattr(model, "rotary", None) or module.rotary  # the model's, for every layer
        if rotary is not None and key is None:
            positions = torch.arange(q.size(1))
            q, k = rotary(q[None], positions)[0], rotary(k[None], positions)[0]
        k = k.repeat_interleave(H // Hkv, 0)  # (H, Tk, Dh): head h reads k head h // group
        this = "cross" if name.endswith("cross_attn") else "decoder" if module.causal else "encoder"
        if this == kind:
            found.append(q.double() @ k.double().transpose(-2, -1) / math.sqrt(Dh))

    handles = [
        m.register_forward_hook(lambda *a, name=n: record(*a, name), with_kwargs=True)
        for n, m in model.named_modules()
        if isinstance(m, MultiHeadAttention)
    ]
    try:
        with torch.no_grad():
            model(*args)
    finally:
        for h in handles:
            h.remove()
    return torch.stack(found)


# ---- everywhere ---------------------------------------------------------------------------


def test_embedded_json_cannot_end_the_script_element():
    data = {"tokens": ["</script>", "<!--", "&amp;", "a\u2028b", "x>y"]}
    text = embed_json(data)
    assert not set("<>&") & set(text)
    assert "\u2028" not in text
    assert json.loads(text) == data


def test_inert_text_that_could_be_markup_is_refused():
    """A page's inert blocks (``<template>``, read as text) take text without markup only."""
    page = render("viewer.html", ("viewer.css",), viewer.SCRIPTS, {}, title="t", data_id="d",
                  inert={"w": "0Az!#$%:()*+-;.=,?@^_`{|}~"})  # fmt: skip
    assert '<template id="w">0Az!#$%:()*+-;.=,?@^_`{|}~</template>' in page
    for text in ("a</template><script>alert(1)</script>", "&lt;"):
        with pytest.raises(ValueError, match="no '<' or '&'"):
            render("viewer.html", ("viewer.css",), viewer.SCRIPTS, {}, title="t", data_id="d",
                   inert={"w": text})  # fmt: skip


@pytest.mark.parametrize("which", ["gpt", "translator"])
def test_the_page_holds_the_models_own_weights_queries_and_keys(which, chars):
    """The weights in the page equal ``attention_maps`` exactly; softmax of q·k/√Dh from the
    page's queries and keys (rotated, grouped) gives them back, and equals the scores
    recomputed here from each module's inputs."""
    if which == "gpt":
        model, target, args = modern_gpt(chars.vocab_size), None, None
        args = (torch.tensor([chars.encode(TEXT)]),)
    else:
        model, target = translator(chars.vocab_size), "el gato"
        tgt = [model.config.bos_id, *chars.encode(target)]
        args = (torch.tensor([chars.encode(TEXT)]), torch.tensor([tgt]))
    data = page_data(attention_html(model, chars, TEXT, target=target).html)
    maps = attention_maps(model, chars, TEXT, target=target)
    assert [k["kind"] for k in data["kinds"]] == [m.kind for m in maps]
    for kind, m in zip(data["kinds"], maps, strict=True):
        L, H, Tq, Tk = m.weights.shape
        Hkv, Dh = kind["kvHeads"], kind["headDim"]
        assert (kind["queries"], kind["keys"]) == (m.queries, m.keys)
        assert kind["causal"] == (m.kind == "decoder")
        weights = floats(kind["weights"], L, H, Tq, Tk)
        assert torch.equal(weights, m.weights)
        q = floats(kind["q"], L, H, Tq, Dh).double()
        k = floats(kind["k"], L, Hkv, Tk, Dh).double().repeat_interleave(H // Hkv, 1)
        scores = q @ k.transpose(-2, -1) / math.sqrt(Dh)  # (L, H, Tq, Tk)
        torch.testing.assert_close(scores, scores_of(model, args, m.kind), atol=1e-5, rtol=0)
        if kind["causal"]:
            scores = scores.masked_fill(torch.ones(Tq, Tk).triu(1).bool(), float("-inf"))
        torch.testing.assert_close(scores.softmax(-1).float(), m.weights, atol=1e-6, rtol=0)
    if which == "gpt":
        assert data["kinds"][0]["rotary"] and data["kinds"][0]["kvHeads"] == 2


def test_the_page_scales_the_scores_as_the_model_does(chars):
    """A Gemma-shaped GPT (scores × 0.3, QK-norm) and a T5-shaped translator (scores × 1 and
    a position bias): the page carries each scale, and says what its softmax leaves out."""
    torch.manual_seed(0)
    config = GemmaConfig(vocab_size=chars.vocab_size, max_len=32, d_model=128, num_heads=4,
                         num_kv_heads=2, head_dim=None, num_layers=4, d_ff=344,
                         attention_scale=0.3)  # fmt: skip
    model = GPT(config).eval()
    (kind,) = page_data(attention_html(model, chars, TEXT).html)["kinds"]
    assert kind["scale"] == pytest.approx(0.3) and kind["notes"] == []
    L, H, T, Dh = kind["layers"], kind["heads"], len(kind["queries"]), kind["headDim"]
    q = floats(kind["q"], L, H, T, Dh).double()
    k = floats(kind["k"], L, kind["kvHeads"], T, Dh).double().repeat_interleave(2, 1)
    scores = (q @ k.transpose(-2, -1) * 0.3).masked_fill(torch.ones(T, T).triu(1).bool(), -1e9)
    weights = floats(kind["weights"], L, H, T, T)
    torch.testing.assert_close(scores.softmax(-1).float(), weights, atol=1e-6, rtol=0)
    v = chars.vocab_size
    t5 = T5Config(src_vocab_size=v, tgt_vocab_size=v, d_model=64, num_heads=4,
                  num_encoder_layers=2, num_decoder_layers=2, d_ff=256, relative_buckets=8,
                  relative_max_distance=16)  # fmt: skip
    kinds = page_data(attention_html(Seq2SeqTransformer(t5).eval(), chars, TEXT,
                                     target="el gato").html)["kinds"]  # fmt: skip
    notes = {k["kind"]: k["notes"] for k in kinds}
    assert all(k["scale"] == 1.0 for k in kinds)
    assert "T5's relative positions" in notes["encoder"][0] and notes["cross"] == []
    encoder, cross = kinds[0], kinds[2]
    assert encoder["kind"] == "encoder" and cross["bias"] is None
    L, H, T, Dh = encoder["layers"], encoder["heads"], len(encoder["queries"]), encoder["headDim"]
    q = floats(encoder["q"], L, H, T, Dh).double()
    k = floats(encoder["k"], L, H, T, Dh).double()
    bias = floats(encoder["bias"], H, T, T).double()  # the same for every layer
    weights = floats(encoder["weights"], L, H, T, T)
    torch.testing.assert_close((q @ k.transpose(-2, -1) + bias).softmax(-1).float(), weights,
                               atol=1e-6, rtol=0)  # fmt: skip


def test_the_page_is_one_file_that_asks_for_nothing(chars):
    page = attention_html(modern_gpt(chars.vocab_size), chars, TEXT).html
    assert page.startswith("<!DOCTYPE html>")
    # the only address is the SVG namespace, a name that is never fetched
    assert set(re.findall(r"https?://[^\s\"'<>)]+", page)) == {"http://www.w3.org/2000/svg"}
    assert not re.search(r"<(link|img|iframe)\b|\bsrc=|@import|url\(", page)
    policy = re.search(r'http-equiv="Content-Security-Policy" content="([^"]+)"', page).group(1)
    assert "default-src 'none'" in policy and "unsafe-inline" not in policy
    for name in viewer.SCRIPTS:  # the package's files, verbatim
        script = (Path(viewer.__file__).parent / "html" / name).read_text()
        assert f"<script>{script}</script>" in page
    assert page.count("<script") == SCRIPTS  # those and the data


def test_tokens_are_data_in_the_page():
    tok = WordTokenizer(FRAGMENTS)
    torch.manual_seed(0)
    model = GPT(GPTConfig.preset("tiny", vocab_size=tok.vocab_size, num_layers=1))
    text = " ".join(FRAGMENTS)
    page = attention_html(model, tok, text).html
    data = page_data(page)
    assert data["kinds"][0]["queries"] == FRAGMENTS and data["text"] == text
    assert page.count("<script") == page.count("</script>") == SCRIPTS
    assert "alert" not in page.split('id="attention-data">')[0]


def test_a_page_too_large_is_refused_in_one_line(chars, monkeypatch, tmp_path, capsys):
    model = modern_gpt(chars.vocab_size)
    # 2 layers: 4 heads × 22 queries × (22 keys + 16 dims) + 2 kv heads × 22 keys × 16 dims
    numbers = 2 * (4 * 22 * (22 + 16) + 2 * 22 * 16)
    monkeypatch.setattr(viewer, "MAX_NUMBERS", numbers - 1)
    with pytest.raises(ValueError, match=f"would hold {numbers:,} numbers"):
        attention_html(model, chars, TEXT)
    monkeypatch.setattr(viewer, "MAX_NUMBERS", numbers)
    attention_html(model, chars, TEXT)
    monkeypatch.setattr(viewer, "MAX_NUMBERS", numbers - 1)
    run = save_run(model, chars, tmp_path / "gpt")
    assert main(["attention", "--model", str(run), TEXT, "--out", str(tmp_path / "a.html")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "over the limit of" in err


def save_run(model, tok, path):
    model.save_pretrained(path, extra_files={"tokenizer.json": tok.to_json().encode()})
    return path


def test_cli_writes_the_page(chars, tmp_path, capsys):
    run = save_run(translator(chars.vocab_size), chars, tmp_path / "translator")
    out = tmp_path / "pages" / "view.html"
    argv = ["attention", "--model", str(run), "the cat", "--target", "el gato", "--out", str(out)]
    assert main(argv) == 0
    data = page_data(out.read_text())
    assert [k["kind"] for k in data["kinds"]] == ["encoder", "decoder", "cross"]
    assert data["kinds"][2]["keys"] == list("the␣cat")
    assert "an attention viewer page" in capsys.readouterr().out
    assert main([*argv, "--layer", "1"]) == 2
    assert "the page has them all" in capsys.readouterr().err


def test_the_page_files_are_package_data():
    pyproject = (Path(__file__).parents[1] / "pyproject.toml").read_text()
    assert '"glassformer.viz" = ["html/*.html", "html/*.js", "html/*.css"]' in pyproject
    assert set(viewer._ASSETS) == {
        p.name for p in (Path(viewer.__file__).parent / "html").iterdir()
    }
    for name in viewer._ASSETS:
        assert (Path(viewer.__file__).parent / "html" / name).is_file()


def test_notebooks_get_the_page_in_an_iframe(chars):
    view = attention_html(modern_gpt(chars.vocab_size), chars, TEXT)
    shown = view._repr_html_()
    assert shown.startswith("<iframe srcdoc=") and "<script" not in shown


# ---- in a browser ---------------------------------------------------------------------------


browser_test = pytest.mark.browser


class Opened:
    """A page opened from disk with every network request refused and recorded."""

    def __init__(
        self, browser, path: Path, ready: bool = True, viewport: dict[str, int] | None = None
    ) -> None:
        self.context = browser.new_context(viewport=viewport or {"width": 1200, "height": 900})
        self.refused: list[str] = []
        self.requests: list[str] = []
        self.errors: list[str] = []
        self.dialogs: list[str] = []
        self.context.route("**/*", self._route)
        page = self.context.new_page()
        page.on("request", lambda r: self.requests.append(r.url))
        page.on("console", lambda m: m.type in ("error", "warning") and self.errors.append(m.text))
        page.on("pageerror", lambda e: self.errors.append(str(e)))
        page.on("dialog", lambda d: (self.dialogs.append(d.message), d.dismiss()))
        # a script that ran from a token would call one of these: record it
        page.add_init_script(
            "window.__ran = []; for (const f of ['alert', 'confirm', 'prompt'])"
            " window[f] = (m) => window.__ran.push(String(m));"
        )
        self.url = path.resolve().as_uri()
        start = time.perf_counter()
        page.goto(self.url)
        if ready:
            page.wait_for_selector("body[data-ready='1']", timeout=10_000)
        self.seconds = time.perf_counter() - start
        self.page = page

    def _route(self, route):
        url = route.request.url
        if url.startswith(("file:", "data:", "blob:")):
            route.continue_()
        else:
            self.refused.append(url)
            route.abort()

    def offline_and_clean(self):
        assert self.refused == []
        assert all(u.startswith(("file:", "data:", "blob:")) for u in self.requests), self.requests
        assert self.errors == [] and self.dialogs == []
        assert self.page.evaluate("window.__ran") == []

    def lines(self) -> list[tuple[int, int, float]]:
        return self.page.evaluate(
            "[...document.querySelectorAll('#head-lines line')].map(l => [+l.dataset.q, "
            "+l.dataset.k, parseFloat(l.getAttribute('stroke-opacity'))])"
        )

    def close(self):
        self.context.close()


@pytest.fixture
def opened(browser):
    pages: list[Opened] = []

    def open_(path: Path, ready: bool = True) -> Opened:
        pages.append(Opened(browser, path, ready))
        return pages[-1]

    yield open_
    for p in pages:
        p.close()


def head_view_lines_equal(opened_page, weights: torch.Tensor) -> None:
    Tq, Tk = weights.shape
    lines = opened_page.lines()
    assert len(lines) == Tq * Tk  # one per (query, key) pair
    drawn = torch.zeros(Tq, Tk, dtype=torch.float64)
    for q, k, opacity in lines:
        drawn[q, k] = opacity
    torch.testing.assert_close(drawn, weights.double(), atol=1e-7, rtol=0)


@browser_test
def test_the_page_loads_offline_and_every_view_draws(opened, chars, tmp_path):
    path = attention_html(modern_gpt(chars.vocab_size), chars, TEXT).save(tmp_path / "v.html")
    view = opened(path)
    page = view.page
    assert page.title() == "gpt model, 2 layers × 4 heads of 16"
    page.click("button[data-view=model]")
    assert page.locator("#model-grid canvas").count() == 2 * 4
    page.locator("#model-grid canvas").nth(2 * 4 - 1).click()  # layer 2, head 4
    assert page.is_visible("#view-head") and page.input_value("#layer") == "2"
    assert page.input_value("#head") == "4"
    page.click("button[data-view=neuron]")
    assert page.locator("#neuron-svg rect.product").count() == 16  # one bar per dimension
    for name in ("svg", "png"):
        with page.expect_download() as download:
            page.click(f"#download-{name}")
        saved = Path(download.value.path()).read_bytes()
        assert saved.startswith(b"<svg" if name == "svg" else b"\x89PNG")
    view.offline_and_clean()


@browser_test
def test_head_view_lines_are_the_weights_and_follow_layer_and_head(opened, chars, tmp_path):
    model = modern_gpt(chars.vocab_size)
    (maps,) = attention_maps(model, chars, TEXT)
    view = opened(attention_html(model, chars, TEXT).save(tmp_path / "v.html"))
    head_view_lines_equal(view, maps.weights[0, 0])
    view.page.select_option("#layer", value="2")  # layers and heads count from 1
    view.page.select_option("#head", value="3")
    head_view_lines_equal(view, maps.weights[1, 2])
    before = view.lines()
    view.page.select_option("#layer", value="1")
    head_view_lines_equal(view, maps.weights[0, 2])
    assert view.lines() != before
    # hovering a query shows only its lines
    view.page.hover("#head-svg .tokens-q rect[data-index='5']")
    visible = view.page.evaluate(
        "[...document.querySelectorAll('#head-lines line')]"
        ".filter(l => l.getAttribute('visibility') !== 'hidden').map(l => +l.dataset.q)"
    )
    assert visible == [5] * len(TEXT)
    view.offline_and_clean()


@browser_test
@pytest.mark.parametrize("which", ["gpt", "translator"])
def test_the_neuron_views_products_sum_to_the_models_score(which, opened, chars, tmp_path):
    """For a chosen layer, head, query and key (the translator's cross-attention; the GPT's
    rotary, grouped self-attention), the bars' values add up to the score recomputed here
    from the module's inputs (1e-5), and the page's softmax is the model's weight."""
    # (layer, head, query, key) from 0; in the GPT, query head 1 of 4 reads key/value head 0
    # of 2 (grouped; interleaved would be head 1)
    if which == "gpt":
        model, target, kind = modern_gpt(chars.vocab_size), None, 0
        layer, head, query, key = 1, 1, 17, 9
        args = (torch.tensor([chars.encode(TEXT)]),)
    else:
        model, target, kind = translator(chars.vocab_size), "el gato", 2  # cross-attention
        layer, head, query, key = 1, 2, 5, 4
        tgt = [model.config.bos_id, *chars.encode(target)]
        args = (torch.tensor([chars.encode(TEXT)]), torch.tensor([tgt]))
    maps = attention_maps(model, chars, TEXT, target=target)[kind]
    score = scores_of(model, args, maps.kind)[layer, head, query, key].item()
    view = opened(attention_html(model, chars, TEXT, target=target).save(tmp_path / "v.html"))
    page = view.page
    page.select_option("#kind", value=str(kind))
    page.click("button[data-view=neuron]")
    for name, value in (("layer", layer + 1), ("head", head + 1), ("query", query), ("key", key)):
        page.select_option(f"#{name}", value=str(value))
    products = page.evaluate(
        "[...document.querySelectorAll('#neuron-svg rect.product')].map(r => +r.dataset.value)"
    )
    head_dim = model.config.d_model // model.config.num_heads
    assert len(products) == head_dim
    assert abs(sum(products) - score) <= 1e-5
    assert abs(float(page.get_attribute("#neuron-score", "data-value")) - score) <= 1e-5
    weight = maps.weights[layer, head, query, key].item()
    assert abs(float(page.get_attribute("#neuron-softmax", "data-value")) - weight) <= 1e-6
    assert float(page.get_attribute("#neuron-weight", "data-value")) == pytest.approx(
        weight, abs=1e-7
    )
    view.offline_and_clean()


@browser_test
def test_html_and_script_in_tokens_show_as_text_and_run_nothing(opened, tmp_path):
    tok = WordTokenizer(FRAGMENTS)
    torch.manual_seed(0)
    model = GPT(GPTConfig.preset("tiny", vocab_size=tok.vocab_size, num_layers=1))
    text = " ".join(FRAGMENTS)
    view = opened(attention_html(model, tok, text).save(tmp_path / "v.html"))
    page = view.page
    shown = page.evaluate(
        "[...document.querySelectorAll('#head-svg .tokens-q text')].map(t => t.textContent)"
    )
    assert shown == FRAGMENTS
    assert page.text_content("#subtitle") == text
    page.click("button[data-view=neuron]")
    options = page.evaluate("[...document.querySelectorAll('#query option')].map(o => o.text)")
    assert options == [f"{i}: {t}" for i, t in enumerate(FRAGMENTS)]
    assert page.evaluate("document.querySelectorAll('script').length") == SCRIPTS
    assert page.evaluate("document.querySelectorAll('img, [onload], [onerror]').length") == 0
    page.click("button[data-view=model]")
    view.offline_and_clean()  # no alert, no dialog, no console error


def forty_token_page(folder: Path) -> Path:
    """The page for a 40-token text on a 6-layer, 8-head GPT of width 512 (head dim 64)."""
    tok = CharTokenizer("abcdefghijklmnopqrstuvwxyz .,")
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=tok.vocab_size, d_model=512, num_heads=8, num_layers=6))
    text = "the quick brown fox jumps over the lazy dog"[:40]
    return attention_html(model, tok, text).save(folder / "forty.html")


def test_a_40_token_page_of_a_6_layer_8_head_model_is_under_2_mb(tmp_path):
    # 6·8·40·40 weights + 6·8·40·64 queries + as many keys, 4 bytes each, in base64
    assert 1_700_000 < forty_token_page(tmp_path).stat().st_size < 2_000_000


@browser_test
def test_a_40_token_page_of_a_6_layer_8_head_model_opens_in_under_a_second(
    opened, tmp_path, capsys
):
    """From goto to the page's ready mark (data decoded, head view drawn), best of three."""
    path = forty_token_page(tmp_path)
    pages = [opened(path) for _ in range(3)]
    seconds = [p.seconds for p in pages]
    in_page = [p.page.evaluate("window.viewerReadyMs") / 1000 for p in pages]
    with capsys.disabled():
        print(
            f"\n40 tokens, 6 layers × 8 heads, d_model 512: {path.stat().st_size / 1e6:.2f} MB, "
            f"opened in {', '.join(f'{s:.2f}' for s in seconds)} s "
            f"(ready {', '.join(f'{s:.2f}' for s in in_page)} s after navigation began)"
        )
    assert min(seconds) < 1.0
    pages[0].offline_and_clean()


@browser_test
def test_the_notebook_iframe_shows_the_page(opened, chars, tmp_path):
    view = attention_html(modern_gpt(chars.vocab_size), chars, TEXT)
    host = tmp_path / "notebook.html"
    host.write_text(f"<!DOCTYPE html><html><body>{view._repr_html_()}</body></html>")
    opened_host = opened(host, ready=False)
    frame = opened_host.page.frame_locator("iframe")
    frame.locator("body[data-ready='1']").wait_for(timeout=10_000)
    assert frame.locator("#head-lines line").count() == len(TEXT) ** 2
    opened_host.offline_and_clean()


def test_a_gpts_page_holds_its_logit_lens_and_other_models_none(chars):
    """The lens tab's data: per stage and position, the three likeliest next tokens and
    their probabilities, as glassformer.inspect.logit_lens gives them."""
    from glassformer.inspect import logit_lens

    model = modern_gpt(chars.vocab_size)
    data = viewer.attention_data(model, chars, TEXT)
    ids, probs = logit_lens(model, torch.tensor([chars.encode(TEXT)])).top(3)
    lens = data["lens"]
    assert lens["stages"] == ["embeddings", "layer 1", "layer 2"]
    assert lens["inputs"] == list(TEXT.replace(" ", "␣"))
    assert lens["tokens"][-1][3] == [
        chars.id_to_token(i).replace(" ", "␣") for i in ids[-1, 3].tolist()
    ]
    torch.testing.assert_close(torch.tensor(lens["probs"]), probs, atol=1e-5, rtol=0)
    assert (
        viewer.attention_data(translator(chars.vocab_size), chars, "abc", target="cba")["lens"]
        is None
    )


@browser_test
def test_the_lens_tab_shows_each_layers_guess_and_the_models_own_on_top(opened, chars, tmp_path):
    model = modern_gpt(chars.vocab_size)
    view = opened(attention_html(model, chars, TEXT).save(tmp_path / "v.html"))
    page = view.page
    page.click("#lens-tab")
    assert page.is_visible("#view-lens")
    top = page.evaluate(
        "[...document.querySelectorAll('#lens-svg g[data-stage=\"2\"]')]"
        ".map(g => [+g.dataset.pos, g.dataset.token, +g.dataset.p])"
    )
    with torch.no_grad():
        probs = model(torch.tensor([chars.encode(TEXT)])).logits[0].softmax(-1)  # (T, V)
    p, guess = probs.max(-1)
    assert [t for t, _, _ in top] == list(range(len(TEXT)))
    assert [token for _, token, _ in top] == [
        chars.id_to_token(int(i)).replace(" ", "␣") for i in guess
    ]
    torch.testing.assert_close(torch.tensor([q for _, _, q in top]), p, atol=1e-5, rtol=0)
    with page.expect_download() as download:
        page.click("#download-svg")
    assert Path(download.value.path()).read_bytes().startswith(b"<svg")
    view.offline_and_clean()
    translated = opened(attention_html(translator(chars.vocab_size), chars, "abc", target="cba")
                        .save(tmp_path / "t.html"))  # fmt: skip
    assert not translated.page.is_visible("#lens-tab")


# ---- the README's screenshots -------------------------------------------------------------
# The browser run photographs the viewer as the README shows it: all-MiniLM-L6-v2's model view
# and SmolLM2's neuron view in the default run, a translator's cross-attention (trained for
# 10 minutes first) among the slow tests. Each lands in $GLASSFORMER_SCREENSHOTS when it is set
# (`make screenshots` sets it to docs/images), in a temporary folder otherwise; either way the
# test checks that the picture shows the view it is of.

SCREENSHOT_SIZE = {"width": 1280, "height": 860}


def screenshot_folder(tmp_path: Path) -> Path:
    folder = Path(os.environ.get("GLASSFORMER_SCREENSHOTS") or tmp_path)
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def shoot(view: Opened, shot: Path) -> Path:
    """Save the page as it is now; the picture must be the viewport's size and not blank."""
    view.offline_and_clean()
    return photograph(view.page, shot)


def photograph(page, shot: Path) -> Path:
    """Save what a Playwright page shows; the picture must be the viewport's size and not
    blank."""
    from PIL import Image

    page.wait_for_timeout(300)  # an explorable page's level slides in over 220 ms
    page.screenshot(path=str(shot))
    with Image.open(shot) as image:
        viewport = page.viewport_size
        assert image.size == (viewport["width"], viewport["height"])
        colours = image.convert("RGB").getcolors(maxcolors=1 << 20)
    assert colours is not None and len(colours) > 200, f"{shot.name} is nearly blank"
    return shot


def named_model(name: str):
    from glassformer.checkpoint import NAMED_MODELS
    from glassformer.inference import load_run

    if name not in NAMED_MODELS:
        pytest.skip(f"{name} is not installed")
    try:
        return load_run(name)
    except FileNotFoundError as e:
        pytest.skip(f"{name} is not installed: {e}")


@browser_test
def test_readme_screenshot_of_minilm_in_the_model_view(browser, tmp_path):
    model, tokenizer = named_model("all-MiniLM-L6-v2")
    text = "The cat sat on the mat because it was warm."
    page_file = attention_html(model, tokenizer, text, title="all-MiniLM-L6-v2 (bert)")
    view = Opened(browser, page_file.save(tmp_path / "minilm.html"), viewport=SCREENSHOT_SIZE)
    view.page.click("button[data-view=model]")
    assert view.page.locator("#model-grid canvas").count() == 6 * 12
    shoot(view, screenshot_folder(tmp_path) / "attention-viewer-minilm.png")
    view.close()


@browser_test
def test_readme_screenshot_of_smollm2_in_the_neuron_view(browser, tmp_path):
    model, tokenizer = named_model("SmolLM2-135M-Instruct")
    text = "The capital of France is Paris, and the capital of Spain is"
    page_file = attention_html(model, tokenizer, text, title="SmolLM2-135M-Instruct (gpt)")
    view = Opened(browser, page_file.save(tmp_path / "gpt.html"), viewport=SCREENSHOT_SIZE)
    page = view.page
    page.click("button[data-view=neuron]")
    page.select_option("#layer", value="12")
    page.select_option("#head", value="4")
    assert page.locator("#neuron-svg rect.product").count() == 64  # SmolLM2's head width
    shoot(view, screenshot_folder(tmp_path) / "attention-viewer-gpt.png")
    view.close()


@pytest.mark.slow
@browser_test
def test_readme_screenshot_of_a_translators_sharpest_cross_attention_head(browser, tmp_path):
    """A tiny translator trained for 10 minutes on bible-en-es (or the run directory in
    $GLASSFORMER_TRANSLATOR), in the head view at its cross-attention head whose queries look
    at one key the most."""
    from glassformer import RunConfig, fit
    from glassformer.inference import load_run

    run = os.environ.get("GLASSFORMER_TRANSLATOR")
    title = f"a translator (seq2seq, the run in {run})"
    if run is None:
        run = str(tmp_path / "translator")
        title = "a translator (seq2seq, tiny preset, 10 minutes on bible-en-es)"
        config = RunConfig(task="translate", preset="tiny", minutes=10, no_test=True, out=run)
        fit(config)
    model, tokenizer = load_run(run)
    text = "In the beginning God created the heaven and the earth."
    target = "En el principio creó Dios los cielos y la tierra."
    maps = attention_maps(model, tokenizer, text, target=target)
    (cross,) = [m for m in maps if m.kind == "cross"]
    top = cross.weights.max(-1).values.mean(-1)  # (layers, heads): the mean top weight
    layer, head = divmod(int(top.argmax()), top.size(1))
    page_file = attention_html(model, tokenizer, text, target=target, title=title)
    view = Opened(browser, page_file.save(tmp_path / "translator.html"), viewport=SCREENSHOT_SIZE)
    view.page.select_option("#kind", value="2")
    view.page.select_option("#layer", value=str(layer + 1))
    view.page.select_option("#head", value=str(head + 1))
    head_view_lines_equal(view, cross.weights[layer, head])
    shoot(view, screenshot_folder(tmp_path) / "attention-viewer-translator.png")
    view.close()


# ---- the attribution and features tabs ------------------------------------------------------


def attribution_result(model, chars):
    """What `glassformer attribute` computes, for the tiny GPT on TEXT against OTHER."""
    from glassformer.inspect import attribution_patching, integrated_gradients, logit_difference

    clean = torch.tensor([chars.encode(TEXT)])
    corrupt = clean.clone()
    corrupt[0, 4] = chars.encode("d")[0]
    metric = logit_difference(1, 2)
    with torch.no_grad():
        values = float(metric(model(clean).logits)), float(metric(model(corrupt).logits))
    return {
        "tokens": list(TEXT), "metric": "logit('a') - logit('b')",
        "integrated": integrated_gradients(model, clean, metric, steps=16).per_token,
        "clean": values[0], "corrupt": values[1],
        "grid": attribution_patching(model, clean, corrupt, metric),
        "heads": attribution_patching(model, clean, corrupt, metric, what="z"),
    }  # fmt: skip


@browser_test
def test_the_attribution_tab_draws_the_estimates_themselves(opened, chars, tmp_path):
    """Every cell of the layers × tokens grid and of the heads grid, and every token's bar,
    holds the number attribution_patching and integrated_gradients computed (≤ 1e-5)."""
    model = modern_gpt(chars.vocab_size)
    result = attribution_result(model, chars)
    path = viewer.attribution_page(model, chars, TEXT, result).save(tmp_path / "a.html")
    view = opened(path)
    page = view.page
    assert page.is_visible("#view-attribution") and page.is_visible("#attribution-tab")
    for selector, expected in (("#attribution-grid rect", result["grid"]),
                               ("#attribution-heads rect", result["heads"])):  # fmt: skip
        cells = page.evaluate(
            f"[...document.querySelectorAll('{selector}')].map(r => [+r.dataset.row, "
            "+r.dataset.col, +r.dataset.value])"
        )
        drawn = torch.zeros(expected.shape, dtype=torch.float64)
        for row, col, value in cells:
            drawn[row, col] = value
        assert len(cells) == expected.numel()
        torch.testing.assert_close(drawn, expected.double(), atol=1e-5, rtol=0)
    bars = page.evaluate(
        "[...document.querySelectorAll('#attribution-bars rect')].map(r => +r.dataset.value)"
    )
    expected = result["integrated"].double()
    torch.testing.assert_close(torch.tensor(bars, dtype=torch.float64), expected, atol=1e-5, rtol=0)
    page.click("button[data-view=head]")
    page.click("button[data-view=attribution]")
    assert page.is_visible("#attribution-grid")
    view.offline_and_clean()


@browser_test
def test_the_features_tab_shows_values_and_contexts_as_text(opened, chars, tmp_path):
    """The features × tokens grid holds the SAE's values; clicking a feature lists its
    contexts, whose HTML and script fragments show as text and run nothing."""
    model = modern_gpt(chars.vocab_size)
    values = torch.rand(len(TEXT), 3)
    contexts = {f: [{"before": FRAGMENTS[i], "token": FRAGMENTS[i + 1], "after": "…",
                     "value": 1.5 - i / 10} for i in range(3)] for f in (4, 9, 17)}  # fmt: skip
    result = {"tokens": list(TEXT), "features": [4, 9, 17], "values": values,
              "contexts": contexts, "sae": "blocks.1.hook_resid_post, 64 features"}  # fmt: skip
    view = opened(viewer.features_page(model, chars, TEXT, result).save(tmp_path / "f.html"))
    page = view.page
    cells = page.evaluate(
        "[...document.querySelectorAll('#features-grid rect')].map(r => [+r.dataset.row, "
        "+r.dataset.col, +r.dataset.value])"
    )
    drawn = torch.zeros(3, len(TEXT), dtype=torch.float64)
    for row, col, value in cells:
        drawn[row, col] = value
    torch.testing.assert_close(drawn, values.T.double(), atol=1e-5, rtol=0)
    page.locator("#features-grid text[data-row='2']").click()  # the third feature's label
    marks = page.evaluate(
        "[...document.querySelectorAll('#feature-contexts mark')].map(m => m.textContent)"
    )
    assert marks == [FRAGMENTS[1], FRAGMENTS[2], FRAGMENTS[3]]
    assert "feature 17" in page.text_content("#note")
    assert page.evaluate("document.querySelectorAll('img, [onload], [onerror]').length") == 0
    view.offline_and_clean()


@browser_test
def test_the_directions_tab_tracks_each_hooks_projection(opened, chars, tmp_path):
    """The hooks × tokens grid holds each token's projection on a probes file's class
    differences; the track is the best probe's hook, and clicking another hook's label
    moves the track there; labels from the file show as text and run nothing."""
    from safetensors.torch import save_file

    from glassformer.inspect.probes import projections

    model = modern_gpt(chars.vocab_size)
    hooks = ["blocks.0.hook_resid_post", "blocks.1.hook_resid_post"]
    width = model.config.d_model
    g = torch.Generator().manual_seed(0)
    tensors = {f"{h}.{part}": torch.randn(width, generator=g) for h in hooks
               for part in ("difference", "mean")}  # fmt: skip
    meta = {"hooks": hooks, "labels": FRAGMENTS[:2], "accuracy": {hooks[0]: 0.6, hooks[1]: 0.9}}
    path = tmp_path / "p.safetensors"
    save_file(tensors, str(path), metadata={"glassformer": json.dumps(meta)})
    expected = projections(model, torch.tensor([chars.encode(TEXT)]), path)["values"].double()
    view = opened(viewer.directions_page(model, chars, TEXT, path).save(tmp_path / "d.html"))
    page = view.page
    assert page.is_visible("#view-directions") and page.is_visible("#directions-tab")

    def drawn(selector: str) -> list:
        cells = "(r) => [+r.dataset.row, +r.dataset.col, +r.dataset.value]"
        return page.evaluate(f"[...document.querySelectorAll('{selector}')].map({cells})")

    grid = torch.zeros(expected.shape, dtype=torch.float64)
    for row, col, value in drawn("#directions-grid rect"):
        grid[row, col] = value
    torch.testing.assert_close(grid, expected, atol=1e-5, rtol=0)
    for row in (1, 0):  # the best probe's hook first, then the one clicked
        bars = [v for _, _, v in drawn("#directions-track rect")]
        torch.testing.assert_close(torch.tensor(bars, dtype=torch.float64), expected[row],
                                   atol=1e-5, rtol=0)  # fmt: skip
        assert hooks[row] in page.text_content("#directions-svg")
        page.locator("#directions-grid text[data-row='0']").click()
    hint = page.text_content("#directions-hint")
    assert FRAGMENTS[0] in hint and FRAGMENTS[1] in hint
    view.offline_and_clean()


def test_a_mixture_of_experts_page_carries_each_tokens_chosen_experts(chars):
    """The data of a Mixtral-shaped model's page: for every routed layer, each token's
    router weight for each expert, as the hook cache has it (k of them not 0); a model
    without experts carries none."""
    from glassformer.models.families import MixtralConfig

    torch.manual_seed(0)
    model = GPT(MixtralConfig(vocab_size=chars.vocab_size, max_len=64, d_model=32, num_heads=4,
                              num_layers=2, d_ff=24, num_experts=6, top_k=2)).eval()  # fmt: skip
    data = viewer.attention_data(model, chars, TEXT)["experts"]
    _, cache = model.run_with_cache(torch.tensor([chars.encode(TEXT)]))
    assert (data["layers"], data["experts"], data["k"]) == ([0, 1], 6, 2)
    for i, weights in enumerate(data["weights"]):
        expected = cache[f"blocks.{i}.mlp.hook_router_weights"][0]
        torch.testing.assert_close(torch.tensor(weights), expected, atol=1e-6, rtol=0)
        assert all(sum(w > 0 for w in row) == 2 for row in weights)
    assert viewer.attention_data(modern_gpt(chars.vocab_size), chars, TEXT)["experts"] is None


@browser_test
def test_the_experts_tab_colours_each_tokens_chosen_experts(opened, chars, tmp_path):
    """Offline, the experts tab draws a cell per expert and token, coloured exactly where
    the router chose the expert, its value the router's weight; the layer picker moves it."""
    from glassformer.models.families import MixtralConfig

    torch.manual_seed(0)
    model = GPT(MixtralConfig(vocab_size=chars.vocab_size, max_len=64, d_model=32, num_heads=4,
                              num_layers=2, d_ff=24, num_experts=6, top_k=2)).eval()  # fmt: skip
    _, cache = model.run_with_cache(torch.tensor([chars.encode(TEXT)]))
    view = opened(attention_html(model, chars, TEXT).save(tmp_path / "moe.html"))
    page = view.page
    assert page.is_visible("#experts-tab")
    page.click("button[data-view=experts]")
    for layer in (1, 2):
        page.select_option("#layer", value=str(layer))
        cells = page.evaluate(
            "[...document.querySelectorAll('#experts-grid rect')].map(r => "
            "[+r.dataset.row, +r.dataset.col, +r.dataset.value, r.getAttribute('fill')])"
        )
        expected = cache[f"blocks.{layer - 1}.mlp.hook_router_weights"][0]  # (T, E)
        assert len(cells) == expected.numel()
        for expert, token, value, fill in cells:
            assert value == pytest.approx(float(expected[token, expert]), abs=1e-6)
            assert (fill != "#ffffff") == (value > 0)
    view.offline_and_clean()
