"""Token embeddings and positional encodings."""

import math

import pytest
import torch

from glassformer import LearnedPositionalEmbedding, SinusoidalPositionalEncoding, TokenEmbedding


def test_sinusoidal_table_is_the_papers_formula_interleaved():
    d, n = 6, 12
    pe = SinusoidalPositionalEncoding(d_model=d, max_len=n)
    x = torch.zeros(1, n, d)
    table = pe(x)[0]
    for pos in range(n):
        for i in range(d // 2):
            angle = pos / 10000 ** (2 * i / d)
            assert table[pos, 2 * i].item() == pytest.approx(math.sin(angle), abs=1e-6)
            assert table[pos, 2 * i + 1].item() == pytest.approx(math.cos(angle), abs=1e-6)


def test_sinusoidal_is_added_and_continues_from_start():
    pe = SinusoidalPositionalEncoding(d_model=8, max_len=20)
    x = torch.randn(2, 10, 8)
    full = pe(x)
    torch.testing.assert_close(full - x, pe(torch.zeros(1, 10, 8)).expand(2, -1, -1))
    torch.testing.assert_close(pe(x[:, 4:], start=4), full[:, 4:])
    assert "pe" not in pe.state_dict()  # recomputed, never saved


def test_sinusoidal_keeps_the_input_dtype():
    pe = SinusoidalPositionalEncoding(d_model=8, max_len=4)
    assert pe(torch.zeros(1, 4, 8, dtype=torch.bfloat16)).dtype == torch.bfloat16


def test_learned_positions_are_an_embedding_per_position():
    pe = LearnedPositionalEmbedding(max_len=10, d_model=4)
    x = torch.randn(3, 6, 4)
    torch.testing.assert_close(pe(x), x + pe.weight[:6])
    torch.testing.assert_close(pe(x[:, 2:], start=2), x[:, 2:] + pe.weight[2:6])


@pytest.mark.parametrize("cls", [SinusoidalPositionalEncoding, LearnedPositionalEmbedding])
def test_too_long_a_sequence_names_both_lengths(cls):
    pe = cls(d_model=4, max_len=5)
    with pytest.raises(ValueError, match="length 7 is longer than the model's max_len=5"):
        pe(torch.zeros(1, 7, 4))
    with pytest.raises(ValueError, match="length 6"):
        pe(torch.zeros(1, 2, 4), start=4)


def test_odd_width_sinusoidal_is_refused():
    with pytest.raises(ValueError, match="even d_model, got 7"):
        SinusoidalPositionalEncoding(d_model=7)


def test_token_embedding_scales_by_sqrt_d():
    emb = TokenEmbedding(vocab_size=10, d_model=16, scale=True)
    ids = torch.tensor([[1, 2, 3]])
    torch.testing.assert_close(emb(ids), emb.weight[ids] * 4.0)
    plain = TokenEmbedding(vocab_size=10, d_model=16)
    torch.testing.assert_close(plain(ids), plain.weight[ids])


@pytest.mark.parametrize("bad", [10, -1])
def test_token_outside_the_vocabulary_is_a_clear_error(bad):
    emb = TokenEmbedding(vocab_size=10, d_model=4)
    with pytest.raises(ValueError, match=rf"token id {bad} is outside the vocabulary \[0, 10\)"):
        emb(torch.tensor([[1, bad]]))
