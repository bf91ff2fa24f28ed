"""Masks: True = may attend, broadcastable to (B, H, Tq, Tk)."""

import pytest
import torch

from glassformer import causal_mask, combine_masks, padding_mask
from glassformer.modules import attention_mask_to_key_mask


def test_causal_mask_is_lower_triangular():
    m = causal_mask(4)
    assert m.dtype == torch.bool and m.shape == (4, 4)
    assert torch.equal(m, torch.tril(torch.ones(4, 4)).bool())


def test_causal_mask_with_more_keys_aligns_queries_to_the_end():
    m = causal_mask(2, 5)
    assert m.tolist() == [[True, True, True, True, False], [True, True, True, True, True]]
    assert torch.equal(causal_mask(5, 5), causal_mask(5))


@pytest.mark.parametrize("q, k", [(0, 3), (4, 3), (-1, None)])
def test_causal_mask_rejects_impossible_lengths(q, k):
    with pytest.raises(ValueError, match=f"query_len={q}"):
        causal_mask(q, k)


def test_padding_mask_marks_real_tokens():
    ids = torch.tensor([[5, 6, 0, 0], [7, 0, 0, 0]])
    m = padding_mask(ids)
    assert m.shape == (2, 1, 1, 4)
    assert m[:, 0, 0].tolist() == [[True, True, False, False], [True, False, False, False]]
    assert padding_mask(ids, pad_id=5)[0, 0, 0].tolist() == [False, True, True, True]


def test_padding_mask_needs_two_dimensions():
    with pytest.raises(ValueError, match=r"\(batch, length\), got shape \(4,\)"):
        padding_mask(torch.tensor([1, 2, 0, 0]))


def test_combination_broadcasts_to_batch_heads_queries_keys():
    ids = torch.tensor([[5, 6, 0], [7, 8, 9]])
    m = combine_masks(padding_mask(ids), causal_mask(3))
    assert m.shape == (2, 1, 3, 3)
    assert m[0, 0].tolist() == [[True, False, False], [True, True, False], [True, True, False]]
    assert torch.equal(m[1, 0], causal_mask(3))
    assert combine_masks(None, None) is None
    assert torch.equal(combine_masks(None, causal_mask(3)), causal_mask(3))


def test_combining_a_non_boolean_mask_is_refused():
    with pytest.raises(TypeError, match="torch.int64"):
        combine_masks(causal_mask(3), torch.ones(3, 3, dtype=torch.long))


def test_a_hugging_face_attention_mask_becomes_the_key_mask():
    ids = torch.tensor([[5, 6, 0], [7, 8, 9]])
    ones_zeros = [[1, 1, 0], [1, 1, 1]]
    expected = torch.tensor(ones_zeros).bool()[:, None, None, :]  # (B, 1, 1, T)
    for dtype in (torch.long, torch.int32, torch.bool, torch.float32, torch.float16):
        got = attention_mask_to_key_mask(torch.tensor(ones_zeros, dtype=dtype), ids)
        assert got.dtype == torch.bool and torch.equal(got, expected)


@pytest.mark.parametrize("bad", [-1, 3, 0.5, float("nan")])
def test_an_attention_mask_holding_anything_but_0_and_1_is_refused_with_the_value(bad):
    am = torch.tensor([[1.0, bad, 0.0]])
    with pytest.raises(ValueError, match=f"only 1 .* and 0 .*, got {bad}"):
        attention_mask_to_key_mask(am, torch.ones(1, 3, dtype=torch.long))
