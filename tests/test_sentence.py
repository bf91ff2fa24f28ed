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
