"""Every model kind × every glass-box tool: each works, or says in one line why it does not
apply. And one script (run_with_cache, the logit lens, activation patching) runs unchanged,
by the same names, on a GPT, a classifier and a translator's decoder.

The tools are run as a user runs them, from the command line on saved model directories:
``attention`` (PNG and the HTML viewer), ``trace``, ``lens`` and ``patch``; and
``run_with_cache`` from Python.
"""

from __future__ import annotations

import json

import pytest
import torch
from test_viz_explain import PAGE_STEPS, offline_tab, shown_as_in_the_page

from glassformer import (
    GPT,
    BertClassifier,
    BertClassifierConfig,
    BertConfig,
    BertEncoder,
    ClassifierConfig,
    EncoderLM,
    EncoderLMConfig,
    GPTClassifier,
    GPTClassifierConfig,
    GPTConfig,
    SentenceConfig,
    SentenceEncoder,
    Seq2SeqConfig,
    Seq2SeqTransformer,
    TransformerClassifier,
    VisionTransformer,
    ViTConfig,
    load_run,
)
from glassformer.cli import main
from glassformer.data.tokenizers import CharTokenizer, WordPieceTokenizer
from glassformer.inspect import activation_patching, logit_difference, logit_lens
from glassformer.inspect.patching import per_layer
from glassformer.models.families import (
    GemmaConfig,
    GPTNeoXConfig,
    MarianConfig,
    Qwen2Config,
    Qwen3Config,
    T5Config,
)
from glassformer.viz.explain import PACKAGE

TEXT, OTHER = "the cat sat", "the dog sat"  # the same length, one word apart
LABELS = ["neg", "pos", "mid"]
TINY = dict(d_model=32, num_heads=4, num_layers=2, d_ff=64, dropout=0.0)
KINDS = ("classifier", "gpt classifier", "translator", "gpt", "modern gpt", "encoder lm",
         "bert", "bert classifier", "sentence", "vit", "qwen2 gpt", "qwen3 gpt",
         "neox gpt", "gemma gpt", "marian translator", "t5 translator")  # fmt: skip
LMS = {"gpt", "modern gpt", "qwen2 gpt", "qwen3 gpt", "neox gpt", "gemma gpt"}  # families' shapes
LENS = LMS | {"encoder lm", "classifier", "gpt classifier", "bert classifier", "vit"}
PATCH = LMS | {"encoder lm", "classifier", "gpt classifier", "bert classifier"}
# Qwen2: biases on q/k/v only and a window shorter than the text; Qwen3: QK-norm and heads
# wider than d_model / num_heads.
# (Their family configs at the modern preset's size.)
FAMILY = dict(max_len=32, d_model=128, num_heads=4, num_kv_heads=2, num_layers=4, d_ff=344,
              norm_eps=1e-5, tie_weights=True)  # fmt: skip
QWEN2 = dict(attention_window=4)
QWEN3 = dict(head_dim=16)
# GPT-NeoX: attention and MLP in parallel, half of each head rotated.
NEOX = dict(rotary_dim=4, parallel=True)
# Marian: post-norm, sines then cosines, one table for source, target and output, SiLU, the
# decoder starting from the pad id.
MARIAN = dict(activation="silu", share_embeddings=True, tie_output=True, bos_id=0, pad_id=0,
              eos_id=2)  # fmt: skip
# T5: relative position buckets, RMSNorm, no biases, unscaled scores, gated GELU, a tied
# head reading the states × d^-½.
T5 = dict(relative_buckets=8, relative_max_distance=16, activation="geglu_tanh", bos_id=0,
          pad_id=0, eos_id=2)  # fmt: skip
# (The translators' families at the paper's tiny preset's size.)
TRANSLATOR = dict(max_len=32, d_model=64, num_heads=4, num_encoder_layers=2,
                  num_decoder_layers=2, d_ff=256)  # fmt: skip
# Gemma 3: four norms a block, scaled embeddings and scores, a window on the first layer only
# with its own rotary base, QK-norm, soft-capped logits.
GEMMA = dict(version=3, attention_scale=0.3, attention_window=3, full_attention_layers=[1],
             rope_local_theta=100.0, final_softcap=5.0, head_dim=None)  # fmt: skip


def build(kind: str, chars, pieces):
    """(model, tokenizer or image processor, extra files) of one small model of ``kind``."""
    v, w = chars.vocab_size, pieces.vocab_size if pieces is not None else 0
    bert = dict(vocab_size=w, max_len=32, **TINY)
    made = {
        "classifier": lambda: TransformerClassifier(
            ClassifierConfig(vocab_size=v, num_classes=3, max_len=32, **TINY)
        ),
        "gpt classifier": lambda: GPTClassifier(
            GPTClassifierConfig(vocab_size=v, num_classes=3, max_len=32, **TINY)
        ),
        "t5 translator": lambda: Seq2SeqTransformer(
            T5Config(src_vocab_size=v, tgt_vocab_size=v, **TRANSLATOR, **T5)
        ),
        "marian translator": lambda: Seq2SeqTransformer(
            MarianConfig(src_vocab_size=v, tgt_vocab_size=v, **TRANSLATOR, **MARIAN)
        ),
        "translator": lambda: Seq2SeqTransformer(
            Seq2SeqConfig.preset("tiny", src_vocab_size=v, tgt_vocab_size=v, max_len=32)
        ),
        "gpt": lambda: GPT(GPTConfig(vocab_size=v, max_len=32, **TINY)),
        "modern gpt": lambda: GPT(GPTConfig.preset("llama-tiny", vocab_size=v, max_len=32)),
        "qwen2 gpt": lambda: GPT(Qwen2Config(vocab_size=v, **FAMILY, **QWEN2)),
        "gemma gpt": lambda: GPT(GemmaConfig(vocab_size=v, **FAMILY, **GEMMA)),
        "neox gpt": lambda: GPT(GPTNeoXConfig(vocab_size=v, max_len=32, **TINY, **NEOX)),
        "qwen3 gpt": lambda: GPT(Qwen3Config(vocab_size=v, **FAMILY, **QWEN3)),
        "encoder lm": lambda: EncoderLM(EncoderLMConfig(vocab_size=v, max_len=32, **TINY)),
        "bert": lambda: BertEncoder(BertConfig(**bert)),
        "bert classifier": lambda: BertClassifier(BertClassifierConfig(**bert, num_classes=3)),
        "sentence": lambda: SentenceEncoder(SentenceConfig(**bert, max_tokens=16), pieces),
        "vit": lambda: VisionTransformer(
            ViTConfig(image_size=8, patch_size=2, num_classes=3, **TINY)
        ),
    }
    torch.manual_seed(0)
    model = made[kind]().eval()
    tokenizer = pieces if "bert" in kind or kind == "sentence" else chars
    return model, tokenizer


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """A saved directory of every kind, with what ``load_run`` needs beside the weights;
    and an image for the ViT."""
    pytest.importorskip("tokenizers")
    from PIL import Image

    from glassformer.data.images import ImageProcessor

    chars = CharTokenizer("abcdefghijklmnopqrstuvwxyz .")
    pieces = WordPieceTokenizer.train([TEXT, OTHER, "a cat and a dog"] * 5, vocab_size=60)
    root = tmp_path_factory.mktemp("kinds")
    found = {}
    for kind in KINDS:
        model, tokenizer = build(kind, chars, pieces)
        path = root / kind.replace(" ", "-")
        files = {"labels.json": json.dumps(LABELS).encode()}
        if kind == "vit":
            files["image_processor.json"] = ImageProcessor((8, 8), 1).to_json().encode()
        elif kind != "sentence":  # the sentence encoder writes its own
            files["tokenizer.json"] = tokenizer.to_json().encode()
        model.save_pretrained(path, extra_files=files)
        found[kind] = path
    image = root / "digit.png"
    Image.fromarray((torch.rand(8, 8) * 255).byte().numpy(), mode="L").save(image)
    found["image"] = image
    return found


def text_for(kind: str, runs) -> str:
    return str(runs["image"]) if kind == "vit" else TEXT


def one_line_error(capsys) -> str:
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    return err


@pytest.mark.parametrize("kind", KINDS)
def test_the_attention_picture_and_page_of_every_kind(kind, runs, tmp_path, capsys):
    text = text_for(kind, runs)
    picture = tmp_path / "a.png"
    assert main(["attention", "--model", str(runs[kind]), text, "--out", str(picture)]) == 0
    pictures = list(tmp_path.glob("a*.png"))
    assert pictures and all(p.read_bytes()[:4] == b"\x89PNG" for p in pictures)
    assert len(pictures) == (3 if "translator" in kind else 1)  # encoder, decoder, cross
    page = tmp_path / "v.html"
    assert main(["attention", "--model", str(runs[kind]), text, "--out", str(page)]) == 0
    assert page.read_text().startswith("<!DOCTYPE html>")
    capsys.readouterr()


@pytest.mark.parametrize("kind", KINDS)
def test_the_trace_of_every_kind(kind, runs, capsys):
    assert main(["trace", "--model", str(runs[kind]), text_for(kind, runs)]) == 0
    out = capsys.readouterr().out
    assert "block 1 · feed-forward" in out and "softmax over keys" in out
    last = {"bert": "block output", "sentence": "block output"}.get(kind, "logits")
    assert last in out.strip().splitlines()[-1]


@pytest.mark.parametrize("kind", KINDS)
def test_run_with_cache_on_every_kind_has_the_shared_names(kind, runs):
    from glassformer.viz.attention import model_inputs

    model, tokenizer = load_run(runs[kind])
    args, kwargs, _ = model_inputs(model, tokenizer, text_for(kind, runs), None)
    _, cache = model.run_with_cache(*args, **kwargs)
    prefix = "decoder." if "translator" in kind else ""
    shared = (
        "hook_embed",
        "blocks.0.hook_resid_pre",
        "blocks.1.ln2.hook_normalized",
        "blocks.1.attn.hook_pattern",
        "blocks.1.mlp.hook_post",
        "blocks.1.hook_resid_post",
    )
    for name in shared:
        assert f"{prefix}{name}" in cache, name
    assert set(cache) == {n for n in model.hook_names() if not n.endswith("hook_result")}


@pytest.mark.parametrize("kind", KINDS)
def test_the_lens_of_every_kind_or_one_line_why_not(kind, runs, tmp_path, capsys):
    out = tmp_path / "lens.png"
    code = main(["lens", "--model", str(runs[kind]), text_for(kind, runs), "--out", str(out)])
    if kind in LENS:
        assert code == 0 and out.read_bytes()[:4] == b"\x89PNG"
        printed = capsys.readouterr().out
        assert "layer 2" in printed and "embeddings" in printed
        if kind not in LMS | {"encoder lm"}:
            assert any(label in printed for label in LABELS)  # a classifier's classes
    else:
        assert code == 2
        err = one_line_error(capsys)
        assert "translator" in err or "does not have" in err


@pytest.mark.parametrize("kind", KINDS)
def test_patching_every_kind_or_one_line_why_not(kind, runs, tmp_path, capsys):
    answers = ["--answer", "pos", "--wrong", "neg"] if "classifier" in kind else []
    answers = answers or ["--answer", "a", "--wrong", "o"]
    if "bert" in kind:  # a word piece that is one token
        answers = ["--answer", "pos", "--wrong", "neg"]
    argv = ["patch", "--model", str(runs[kind]), "--clean", TEXT, "--corrupt", OTHER,
            *answers, "--out", str(tmp_path / "p.png")]  # fmt: skip
    code = main(argv)
    if kind in PATCH:
        assert code == 0, capsys.readouterr().err
        assert "layer 1" in capsys.readouterr().out
    else:
        assert code == 2
        assert "`patch` runs a language model or a classifier" in one_line_error(capsys)


# ---- one script, the same names, three kinds ----------------------------------------------


def study(model, clean, corrupt, metric):
    """What an interpretability script does: the residual stream after every block, what the
    model would say after each (the logit lens), and where the clean answer lives
    (activation patching). Nothing in it knows which kind of model it reads."""
    names = per_layer(model, "hook_resid_post")
    _, cache = model.run_with_cache(*clean, names=names)
    stream = torch.stack([cache[name] for name in names])  # (L, 1, T, D)
    lens = logit_lens(model, *clean)
    effect = activation_patching(model, clean, corrupt, metric)  # (L, T)
    return stream, lens, effect


@pytest.mark.parametrize("kind", ["gpt", "classifier", "translator"])
def test_one_script_runs_unchanged_on_a_gpt_a_classifier_and_a_translators_decoder(kind):
    chars = CharTokenizer("abcdefghijklmnopqrstuvwxyz .")
    model, _ = build(kind, chars, None)
    clean_ids, corrupt_ids = torch.tensor([chars.encode(TEXT)]), torch.tensor([chars.encode(OTHER)])
    if kind == "translator":  # the decoder reads the same target; the sources differ
        target = torch.tensor([[model.config.bos_id, *chars.encode("el gato")]])
        clean, corrupt = (clean_ids, target), (corrupt_ids, target)
    else:
        clean, corrupt = (clean_ids,), (corrupt_ids,)
    metric = logit_difference(1, 2)
    stream, lens, effect = study(model, clean, corrupt, metric)
    with torch.no_grad():
        logits = model(*clean).logits
    L = 2
    assert stream.shape[0] == L and lens.stages == ["embeddings", "layer 1", "layer 2"]
    last = lens.logits[-1, 0] if kind == "classifier" else lens.logits[-1]
    torch.testing.assert_close(last, logits[0], atol=1e-5, rtol=0)  # the lens ends in the output
    assert effect.shape == (L, clean[-1].size(1))
    everything_clean = activation_patching(model, clean, clean, metric)
    torch.testing.assert_close(everything_clean, torch.full_like(effect, float(metric(logits))))


# ---- gradients at the hook points ---------------------------------------------------------


def main_tensor(output):
    """The tensor a kind's forward computes last: logits, else the states or embeddings."""
    for field in ("logits", "hidden"):
        if getattr(output, field, None) is not None:
            return getattr(output, field)
    return output


@pytest.mark.parametrize("kind", KINDS)
def test_gradients_at_every_hook_point_of_every_kind_equal_autograd(kind, runs):
    """run_with_cache(grads=metric) against torch.autograd.grad on the very tensors the
    pass went through (kept by a plain forward hook), at every hook point: ≤ 1e-6. In float64,
    so that the bound measures the method and not fp32's summation order (in fp32 the two
    differ by up to 2e-7 of the gradient's size)."""
    from glassformer.viz.attention import model_inputs

    model, tokenizer = load_run(runs[kind])
    args, kwargs, _ = model_inputs(model, tokenizer, text_for(kind, runs), None)
    model.double()
    args = [a.double() if a.is_floating_point() else a for a in args]
    torch.manual_seed(1)
    weights = {}

    def metric(output):
        out = main_tensor(output)
        if kind not in weights:
            weights[kind] = torch.randn(out.shape, dtype=out.dtype)
        return (out * weights[kind]).sum()

    _, cache = model.run_with_cache(*args, **kwargs, grads=metric)
    seen: dict[str, torch.Tensor] = {}
    with model.hooks([("*", lambda value, name: seen.__setitem__(name, value))]):
        reference = metric(model(*args, **kwargs))
    names = [n for n in seen if not n.endswith("hook_result") and seen[n].requires_grad]
    expected = torch.autograd.grad(reference, [seen[n] for n in names], allow_unused=True)
    assert len(names) > 20
    reached = 0
    for name, grad in zip(names, expected, strict=True):
        grad = torch.zeros_like(seen[name]) if grad is None else grad
        reached += bool(grad.abs().sum() > 0)
        torch.testing.assert_close(cache[name + "_grad"], grad, atol=1e-6, rtol=0, msg=name)
    assert reached > len(names) // 2  # the comparison is of gradients, not of zeros
    assert all(p.grad is None for p in model.parameters())


def corrupted(args):
    """The inputs with one thing changed: a token of the (source) text, or the image."""
    first = args[0].clone()
    if first.is_floating_point():
        first = first.flip(-1)
    else:
        first[0, 1] = first[0, 2]
    return (first, *args[1:])


@pytest.mark.parametrize("kind", KINDS)
def test_attribution_integrated_gradients_and_paths_on_every_kind(kind, runs):
    """From Python, by the same names: attribution patching's residual grid and heads, the
    edges (or one line on why not: post-norm blocks), integrated gradients that add up, and a
    path-patching sweep, on every kind; a translator's decoder, a ViT's image."""
    from glassformer.inspect import (
        attribution_patching,
        edge_attribution_patching,
        integrated_gradients,
        path_patching,
    )
    from glassformer.viz.attention import model_inputs

    model, tokenizer = load_run(runs[kind])
    args, _, _ = model_inputs(model, tokenizer, text_for(kind, runs), None)
    clean, corrupt = tuple(args), corrupted(args)

    def metric(output):
        return main_tensor(output)[0].flatten()[:5].sum()

    layers = len(per_layer(model, "hook_resid_pre"))
    grid = attribution_patching(model, clean, corrupt, metric)
    heads = attribution_patching(model, clean, corrupt, metric, what="z")
    assert grid.shape[0] == layers and heads.shape == (layers, 4) and grid.isfinite().all()
    norm_first = getattr(model.config, "norm_first", True)
    post_norm = not norm_first or "bert" in kind or kind in ("sentence", "marian translator")
    if "translator" in kind or post_norm or kind == "gemma gpt":
        with pytest.raises(ValueError, match="post-norm|cross-attention"):
            edge_attribution_patching(model, clean, corrupt, metric)
    else:
        edges = edge_attribution_patching(model, clean, corrupt, metric)
        torch.testing.assert_close(
            edges.node_scores[1:5], heads[0] - edges.metric, atol=1e-5, rtol=1e-4
        )
    # from the corrupted input's embeddings (zero embeddings are where RMSNorm turns sharply)
    result = integrated_gradients(model, clean, metric, baseline=corrupt, steps=256)
    assert abs(result.delta) <= 0.01 * abs(result.value - result.baseline_value) + 1e-4
    sweep = path_patching(model, clean, corrupt, metric, receivers=[(1, 0)], receiver_input="qkv")
    assert sweep.shape == (layers, 4) and sweep[0].isfinite().all() and sweep[1].isnan().all()


@pytest.fixture(scope="module")
def offline_page(browser):
    """A page of a Chromium with every request but the file itself refused."""
    context, page = offline_tab(browser)
    yield page
    context.close()


@pytest.mark.browser
@pytest.mark.parametrize("kind", KINDS)
def test_the_explorable_page_of_every_kind_holds_the_caches_numbers(
    kind, runs, tmp_path, offline_page
):
    """``glassformer explain`` on every kind: in the page (offline), every step's values,
    carried or computed by the page from earlier steps, equal the hook cache's (≤1e-5), and
    the page computes most of them rather than carrying them."""
    from glassformer.viz.attention import model_inputs

    text = text_for(kind, runs)
    path = tmp_path / "e.html"
    assert main(["explain", "--model", str(runs[kind]), text, "--out", str(path)]) == 0
    offline_page.goto(path.resolve().as_uri())
    offline_page.wait_for_selector("body[data-ready='1']")
    steps = offline_page.evaluate(PAGE_STEPS)
    model, tokenizer = load_run(runs[kind])
    args, kwargs, _ = model_inputs(model, tokenizer, text, None)
    _, cache = model.run_with_cache(*args, **kwargs)
    assert [s["name"] for s in steps] == list(cache)
    for step in steps:
        expected = shown_as_in_the_page(cache[step["name"]], step)
        got = torch.tensor(step["values"], dtype=torch.float64).view(expected.shape)
        masked = expected <= -1e29
        assert torch.equal(got <= -1e29, masked), step["name"]
        torch.testing.assert_close(got.masked_fill(masked, 0), expected.double().masked_fill(
            masked, 0), atol=1e-5, rtol=0, msg=step["name"])  # fmt: skip
    assert sum(s["derived"] for s in steps) > len(steps) // 3
    # by clicks, down to block 1's attention weights (a translator's cross-attention), head 1:
    # the cells drawn in the page hold the cache's values
    translator = "translator" in kind
    stack, part = ("decoder ", "cross-attention") if translator else ("", "self-attention")
    name = "decoder.blocks.1.cross_attn.hook_pattern" if stack else "blocks.1.attn.hook_pattern"
    offline_page.click(f"#flow [data-go='{stack}block 1']")
    offline_page.click(f"#flow [data-go='{stack}block 1 · {part}']")
    offline_page.click(f"#boxes button.box:has(small:text-is('{name}'))")
    cells = offline_page.evaluate(
        "[...document.querySelectorAll('#step-cells rect')]"
        ".map(r => [+r.dataset.row, +r.dataset.col, +r.dataset.value])"
    )
    expected = cache[name][0, 0].detach()
    drawn = torch.zeros_like(expected)
    for row, col, value in cells:
        drawn[row, col] = value
    assert len(cells) == expected.numel()
    torch.testing.assert_close(drawn, expected, atol=1e-5, rtol=0, msg=kind)
    # the query/key panel's score is the model's, whatever it adds to q·k (T5's position bias)
    score = float(offline_page.get_attribute("#arith-rest", "data-score"))
    scores = cache[name.replace("hook_pattern", "hook_attn_scores")][0, 0, 0, 0]
    assert score == pytest.approx(float(scores), abs=1e-5)
    # every step names a line of glassformer's source that exists and holds the text shown
    sources = offline_page.evaluate("data.steps.map(s => s.source)")
    for source in sources:
        lines = (PACKAGE.parent / source["file"]).read_text().splitlines()
        assert lines[source["line"] - 1].strip() == source["code"] != ""
