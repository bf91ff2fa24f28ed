"""The live page (glassformer.viz.live and html/live-*.js): its JavaScript tokenizers give the
Python tokenizers' ids on lines of the bundled corpora and on awkward strings; tokenizers the
page cannot follow are refused in one line."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import torch

from glassformer.data.tokenizers import BPETokenizer, CharTokenizer, WordPieceTokenizer
from glassformer.viz.live import LiveError, tokenizer_spec

HTML = Path(__file__).parents[1] / "src" / "glassformer" / "viz" / "html"

# what a reader may type: accents, other scripts, CJK (padded by BERT's normaliser, and the
# range next to it that is not), whitespace JavaScript's \s and Unicode's White_Space tell
# apart, controls, the specials, a word over WordPiece's 100 characters, final sigma
AWKWARD = [
    "Café déjà vu, naïve façade — «quoted» ‘single’ “double”…",
    "ΣΊΣΥΦΟΣ ΟΔΥΣΣΕΥΣ and İstanbul; Straße ǅemal ﬁne",
    "漢字かなカナ 한국어 \U0002b820\U0002b920 \u4e00\U00020000",
    "tab\there\nnew line\r\nand\u00a0nbsp\u2003em\u3000ideographic\u0085next\ufeffbom",
    "\x00nul\x07bell\u200bzero-width\u00adsoft\ufffdreplacement\U000e0041tag\ue000private",
    "[CLS] the [MASK] was <pad> and <unk>[SEP]<bos>x<eos>",
    "x" * 120 + " " + "supercalifragilisticexpialidocious" * 4,
    "emoji 👍🏽 family 👨‍👩‍👧 flags 🇫🇷 and ½ ² ③ ⅷ numbers 1,234.56 ١٢٣",
    "don't you'll I'm we've they're it's 'quoted' ''double'' ---- ... !!!",
    "   leading and trailing   ",
    "",
    "$5 + 3 = 8 < 9 > 7 ^ ` | ~ @ # % & * ( ) [ ] { } \\ / _",
    "right-to-left שלום عربى and combining e\u0301 a\u0308 n\u0303",
    "\U0001d400\U0001d401 math letters, \u2160\u2161 numerals, \u00b5 micro",
]


def corpus_lines(n: int = 1000) -> list[str]:
    """``n`` lines from each of the bundled IMDb and Austen corpora (their test splits)."""
    from glassformer.data.corpora import CorpusUnavailableError, load_corpus

    try:
        reviews = [text for text, _ in load_corpus("imdb", "classify").test[:n]]
        austen = [line for line in load_corpus("austen", "lm").test.splitlines() if line][:n]
    except CorpusUnavailableError as err:
        pytest.skip(f"the bundled corpora cannot be prepared here: {err}")
    return reviews + austen


# each text's ids as a short fingerprint (their count and an FNV-1a hash), so that a
# thousand reviews' ids need not cross from the browser one by one
FINGERPRINT = """(ids) => {
  let h = 0x811c9dc5;
  for (const id of ids) { h ^= id; h = Math.imul(h, 0x01000193) >>> 0; }
  return `${ids.length}:${h}`;
}"""


def fingerprint(ids: list[int]) -> str:
    h = 0x811C9DC5
    for i in ids:
        h = ((h ^ i) * 0x01000193) & 0xFFFFFFFF
    return f"{len(ids)}:{h}"


def javascript_ids(browser, spec: dict, texts: list[str], *, prints: bool = False) -> list:
    """The ids live-tokenize.js gives each text in a real browser (or their fingerprints)."""
    page = browser.new_page()
    try:
        page.set_content("<!doctype html><meta charset='utf-8'><body></body>")
        page.add_script_tag(content=(HTML / "live-tokenize.js").read_text(encoding="utf-8"))
        shown = FINGERPRINT if prints else "(ids) => ids"
        return page.evaluate(
            f"([spec, texts]) => {{ const t = makeTokenizer(spec); const f = {shown};"
            " return texts.map((x) => f(t(x))); }",
            [spec, texts],
        )
    finally:
        page.close()


@pytest.fixture(scope="module")
def lines():
    return corpus_lines()


def tokenizers(lines: list[str]) -> dict:
    return {
        "char": CharTokenizer.train(lines[1000:1500]),  # an Austen vocabulary: much is unknown
        "char lower-cased": CharTokenizer.train(lines[1000:], lowercase=True),
        "wordpiece uncased (the demo's)": WordPieceTokenizer.train(
            lines, vocab_size=4000, lowercase=True
        ),  # fmt: skip
        "wordpiece cased": WordPieceTokenizer.train(lines, vocab_size=2000),
        "bpe": BPETokenizer.train(lines, vocab_size=2000),
        "bpe lower-cased": BPETokenizer.train(lines[:500], vocab_size=600, lowercase=True),
    }


@pytest.mark.browser
def test_the_pages_tokenizers_give_pythons_ids(browser, lines):
    texts = [*lines, *AWKWARD]
    for name, tokenizer in tokenizers(lines).items():
        spec = json.loads(json.dumps(tokenizer_spec(tokenizer)))  # as the page carries it
        ours = [tokenizer.encode(t) for t in texts]
        prints = javascript_ids(browser, spec, texts, prints=True)
        wrong = [i for i, (ids, p) in enumerate(zip(ours, prints, strict=True))
                 if fingerprint(ids) != p]  # fmt: skip
        if wrong:
            text, expected = texts[wrong[0]], ours[wrong[0]]
            theirs = javascript_ids(browser, spec, [text])[0]
            at = next((i for i, (a, b) in enumerate(zip(expected, theirs, strict=False)) if a != b),
                      min(len(expected), len(theirs)))  # fmt: skip
            raise AssertionError(
                f"{name}: {len(wrong)} of {len(texts)} texts differ; in "
                f"{text[:80]!r}, from token {at}: Python "
                f"{expected[at : at + 8]}, the page {theirs[at : at + 8]}"
            )


@pytest.mark.browser
def test_a_tokenizer_that_drops_unknown_characters_fails(browser, lines):
    """The break-check the issue asks for: a char tokenizer whose unknown characters vanish
    instead of becoming <unk> is caught by the comparison above."""
    tokenizer = CharTokenizer.train(lines[1000:1200])
    spec = tokenizer_spec(tokenizer)
    script = (HTML / "live-tokenize.js").read_text(encoding="utf-8")
    broken = script.replace("ids.get(c) ?? spec.unk", "ids.get(c) ?? null")
    assert broken != script
    page = browser.new_page()
    page.set_content("<!doctype html><meta charset='utf-8'><body></body>")
    page.add_script_tag(content=broken)
    dropping = "([s, t]) => t.map((x) => makeTokenizer(s)(x).filter((i) => i !== null))"
    theirs = page.evaluate(dropping, [spec, AWKWARD[:3]])
    page.close()
    assert theirs != [tokenizer.encode(t) for t in AWKWARD[:3]]


def test_tokenizers_the_page_cannot_follow_are_refused_in_one_line():
    import tokenizers as tk

    backend = tk.Tokenizer(tk.models.WordPiece({"[UNK]": 0, "a": 1}, unk_token="[UNK]"))
    backend.normalizer = tk.normalizers.NFKC()
    backend.pre_tokenizer = tk.pre_tokenizers.BertPreTokenizer()
    with pytest.raises(LiveError, match="BERT's normaliser and pre-tokeniser; this one has NFKC"):
        tokenizer_spec(WordPieceTokenizer(backend))
    bpe = BPETokenizer.train(["some text here"] * 10, vocab_size=300)
    bpe.backend.pre_tokenizer = tk.pre_tokenizers.Whitespace()
    with pytest.raises(LiveError, match="GPT-2's byte-level BPE"):
        tokenizer_spec(bpe)
    with pytest.raises(LiveError, match="char, WordPiece or byte-level BPE"):
        tokenizer_spec(object())


# ---- the page runs the model ---------------------------------------------------------------

TYPED = ["a cat sat on the mat, and then it ran.", "zebra", "the the the quick brown fox jumps"]
STEPS = ("data.steps.map((s, i) => ({name: s.name, shape: live.results[i].shape, "
         "values: Array.from(live.results[i].data)}))")  # fmt: skip


def small_models() -> dict:
    """One model of each shape the live page runs: the paper's GPT (LayerNorm, learned
    positions, GELU), a Llama-shaped one (RMSNorm, rotary, grouped queries, SwiGLU), and a
    GPT classifier shaped like the demo's, over a WordPiece vocabulary."""
    from glassformer import GPT, GPTClassifier, GPTClassifierConfig, GPTConfig

    chars = CharTokenizer("abcdefghijklmnopqrstuvwxyz .,")
    words = WordPieceTokenizer.train([*TYPED, "the film was fine and moving"] * 4,
                                     vocab_size=200, lowercase=True)  # fmt: skip
    torch.manual_seed(0)
    gpt = GPT(GPTConfig.preset("tiny", vocab_size=chars.vocab_size, max_len=32)).eval()
    llama = GPT(GPTConfig.preset("llama-tiny", vocab_size=chars.vocab_size, max_len=32)).eval()
    config = GPTClassifierConfig(vocab_size=words.vocab_size, max_len=24, d_model=32,
                                 num_heads=4, num_layers=2, d_ff=64, dropout=0.0,
                                 num_classes=2, pooling="last")  # fmt: skip
    classifier = GPTClassifier(config).eval()
    return {"gpt": (gpt, chars, None), "llama": (llama, chars, None),
            "classifier": (classifier, words, ["no", "yes"])}  # fmt: skip


def open_live(browser, path: Path):
    context = browser.new_context()
    context.route("**/*", lambda r: r.continue_() if r.request.url.startswith("file:")
                  else r.abort())  # fmt: skip
    tab = context.new_page()
    errors: list[str] = []
    tab.on("pageerror", lambda e: errors.append(str(e)))
    tab.goto(path.resolve().as_uri())
    tab.wait_for_selector("body[data-ready='1']")
    return context, tab, errors


def typed_steps_match(tab, model, tokenizer, text: str) -> list[str]:
    """Type ``text`` into the page; the steps whose values leave the model's (more than
    1e-4 of their largest magnitude), by name, with the error."""
    from glassformer.viz.live import _ids, relative_error
    from glassformer.viz.live_rules import page_values

    tab.fill("#live-text", text)
    steps = tab.evaluate(STEPS)
    ids = _ids(model, tokenizer, text)
    assert tab.evaluate("live.ids") == ids.tolist()
    expected = page_values(model, [s["name"] for s in steps], ids)
    wrong = []
    for step, value in zip(steps, expected, strict=True):
        squeezed = [n for n in step["shape"] if n != 1] == [n for n in value.shape if n != 1]
        assert squeezed, (step["name"], step["shape"], value.shape)  # (one token: T = 1 kept)
        found = torch.tensor(step["values"], dtype=torch.float64).view(value.shape)
        error = relative_error(found, value)
        if error > 1e-4:
            wrong.append(f"{step['name']} ({error:.1e})")
    return wrong


@pytest.mark.browser
@pytest.mark.parametrize("kind", ["gpt", "llama", "classifier"])
def test_typed_text_gives_every_step_the_models_values(browser, tmp_path, kind):
    from glassformer.viz.live import live_html

    model, tokenizer, labels = small_models()[kind]
    path = live_html(model, tokenizer, "the film", labels).save(tmp_path / "live.html")
    context, tab, errors = open_live(browser, path)
    for text in TYPED:
        assert typed_steps_match(tab, model, tokenizer, text) == [], text
        with torch.no_grad():
            logits = model(torch.tensor([tab.evaluate("live.ids")])).logits[0]
        logits = logits if logits.dim() == 1 else logits[-1]
        shown = tab.evaluate("Array.from(data.output.positions ? data.output.positions[0].logits"
                             " : data.output.logits)")  # fmt: skip
        torch.testing.assert_close(torch.tensor(shown, dtype=torch.float64), logits.double(),
                                   atol=1e-4 * float(logits.abs().max()), rtol=0)  # fmt: skip
        items = tab.eval_on_selector_all("#distribution li", "l => l.map(i => +i.dataset.prob)")
        top = logits.softmax(-1).sort(descending=True).values[: len(items)]
        torch.testing.assert_close(torch.tensor(items), top.float(), atol=1e-4, rtol=0)
    assert errors == []
    context.close()


BREAKS = {  # a mistake in the page's arithmetic, and the step it first shows in
    "a wrong sign in LayerNorm": ("(row[c] - mean) * scale", "(row[c] + mean) * scale"),
    "a transposed product": ("w.data[off + k]", "w.data[k * w.shape[0] + lo + o]"),
}


@pytest.mark.browser
@pytest.mark.parametrize("mistake", list(BREAKS))
def test_a_mistake_in_the_pages_arithmetic_fails(browser, tmp_path, mistake):
    """The break-checks: each mistake, put into the page's script, leaves the model's values
    at some step, and the comparison above names it."""
    from glassformer.viz.live import live_html

    model, tokenizer, _ = small_models()["gpt"]
    html = live_html(model, tokenizer, "the film").html
    right, wrong = BREAKS[mistake]
    script = (HTML / "live-forward.js").read_text(encoding="utf-8")
    assert right in script and right in html
    broken = html.replace(right, wrong).replace("script-src", "script-src 'unsafe-inline'", 1)
    broken = re.sub(r"script-src [^;]*;", "script-src 'unsafe-inline';", broken, count=1)
    path = tmp_path / "broken.html"
    path.write_text(broken, encoding="utf-8")
    context, tab, _ = open_live(browser, path)
    assert typed_steps_match(tab, model, tokenizer, TYPED[0]) != []
    context.close()
