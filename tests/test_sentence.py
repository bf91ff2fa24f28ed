"""SentenceEncoder: pooling over real tokens only, order and batch size do not matter,
texts are cut to max_tokens, bad configs and calls are refused."""

import pytest
import torch

from glassformer import SentenceConfig, SentenceEncoder
from glassformer.data.tokenizers import WordPieceTokenizer

pytest.importorskip("tokenizers")

TEXTS = [
    "the cat sat on the mat",
    "a dog barked at the mail carrier all night long",
    "attention",
    "tokens pieces and words",
    "",
]


@pytest.fixture(scope="module")
def encoder():
    tok = WordPieceTokenizer.train(TEXTS * 5, vocab_size=100, lowercase=True)
    torch.manual_seed(0)
    config = SentenceConfig.preset("tiny", vocab_size=tok.vocab_size, max_len=32, max_tokens=8)
    return SentenceEncoder(config, tokenizer=tok).eval()


def test_embeddings_are_unit_vectors_in_the_order_given(encoder):
    together = encoder.encode(TEXTS, batch_size=2)
    alone = torch.cat([encoder.encode(t) for t in TEXTS])
    torch.testing.assert_close(together, alone, atol=1e-6, rtol=0)
    torch.testing.assert_close(together.norm(dim=1), torch.ones(len(TEXTS)))
    assert together.shape == (len(TEXTS), 64)


def test_mean_pooling_ignores_padding_even_when_the_pad_id_appears(encoder):
    ids = torch.tensor([encoder.tokenize(["the cat sat"])[0]])
    padded = torch.cat([ids, torch.full((1, 3), encoder.config.pad_id)], dim=1)
    real = (torch.arange(padded.size(1)) < ids.size(1))[None, None, None]
    with torch.no_grad():
        torch.testing.assert_close(
            encoder.sentence_embeddings(padded, real), encoder.sentence_embeddings(ids)
        )


@pytest.mark.parametrize("pooling", ["mean", "max", "cls"])
def test_attention_mask_decides_what_is_pooled_and_attended(encoder, pooling):
    config = SentenceConfig(**{**encoder.config.to_dict(), "pooling": pooling})
    model = SentenceEncoder(config, tokenizer=encoder.tokenizer).eval()
    model.load_state_dict(encoder.state_dict())
    rows = model.tokenize(["the cat sat on the mat", "attention", "a dog barked"])
    width = max(map(len, rows))
    filler = model.tokenizer.bos_id  # not the pad id: only the attention_mask marks padding
    assert filler != config.pad_id
    ids = torch.tensor([row + [filler] * (width - len(row)) for row in rows])
    am = torch.tensor([[1] * len(row) + [0] * (width - len(row)) for row in rows])
    with torch.no_grad():
        got = model.sentence_embeddings(ids, attention_mask=am)
        mask = am.bool()[:, None, None, :]
        torch.testing.assert_close(got, model.sentence_embeddings(ids, mask), atol=1e-6, rtol=0)
        torch.testing.assert_close(
            model(ids, attention_mask=am).hidden, model(ids, mask=mask).hidden
        )
        for i, row in enumerate(rows):
            alone = model.sentence_embeddings(torch.tensor([row]))[0]
            torch.testing.assert_close(got[i], alone, atol=1e-6, rtol=0)
        # the pad id inside a text is a token when the attention_mask says so
        ids[:, 1] = config.pad_id
        everything = torch.ones_like(am)
        torch.testing.assert_close(
            model.sentence_embeddings(ids, attention_mask=everything),
            model.sentence_embeddings(ids, everything.bool()[:, None, None, :]),
        )
    with pytest.raises(ValueError, match="give mask or attention_mask, not both"):
        model.sentence_embeddings(ids, mask, attention_mask=am)


def test_a_long_text_is_cut_to_max_tokens_with_its_end_marker(encoder):
    (row,) = encoder.tokenize(["a dog barked at the mail carrier all night long"])
    tok = encoder.tokenizer
    assert len(row) == 8 and row[0] == tok.bos_id and row[-1] == tok.eos_id


def test_unnormalised_mean_is_the_average_of_the_hidden_states(encoder):
    config = SentenceConfig(**{**encoder.config.to_dict(), "normalize": False})
    plain = SentenceEncoder(config, tokenizer=encoder.tokenizer).eval()
    plain.load_state_dict(encoder.state_dict())
    ids = torch.tensor(plain.tokenize(["the cat sat on the mat"]))
    with torch.no_grad():
        expected = plain(ids).hidden.mean(dim=1)
    torch.testing.assert_close(plain.encode("the cat sat on the mat"), expected)


@pytest.mark.parametrize(
    "values, message",
    [
        (dict(pooling="sum"), "pooling must be one of"),
        (dict(max_tokens=40, max_len=32), r"max_tokens must be in 3..max_len \(32\), got 40"),
        (dict(positional="sinusoidal"), "BERT learns its positions"),
    ],
)
def test_bad_configs_are_refused(values, message):
    with pytest.raises(ValueError, match=message):
        SentenceConfig.preset("tiny", **values)


def test_bad_calls_are_refused(encoder):
    with pytest.raises(ValueError, match="at least one text"):
        encoder.encode([])
    with pytest.raises(ValueError, match="batch_size must be a positive integer, got 0"):
        encoder.encode(["x"], batch_size=0)
    bare = SentenceEncoder(encoder.config)
    with pytest.raises(ValueError, match="has no tokenizer"):
        bare.encode(["x"])
