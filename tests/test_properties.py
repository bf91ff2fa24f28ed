"""Property tests (hypothesis) on masks and attention: any shapes, any mask pattern.

Whatever the batch, heads, lengths, widths and mask, attention gives finite outputs, its
weights are zero where the mask forbids, every row sums to 1 (some key allowed) or 0 (none
allowed, and then the output row is zero), and the fused path equals the readable one.
"""

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from glassformer import MultiHeadAttention, causal_mask, padding_mask, scaled_dot_product_attention
from glassformer.modules.sdpa import combine_masks

FAST = settings(max_examples=60, deadline=None)
dims = st.integers(1, 4)
lengths = st.integers(1, 9)


@st.composite
def attention_inputs(draw, dtype=torch.float32):
    """q, k, v of random shapes and scale, and a boolean mask of random pattern and of a
    random broadcastable shape ((B|1), (H|1), (Tq|1), Tk), or None."""
    B, H, Tq, Tk, Dh = draw(dims), draw(dims), draw(lengths), draw(lengths), draw(st.integers(1, 8))
    seed = draw(st.integers(0, 2**31 - 1))
    scale = draw(st.sampled_from([1e-3, 1.0, 30.0]))  # large scale: saturated softmax
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(B, H, t, Dh, generator=g, dtype=dtype) * scale for t in (Tq, Tk, Tk))
    mask = None
    if draw(st.booleans()):
        shape = [draw(st.sampled_from([n, 1])) for n in (B, H, Tq)] + [Tk]
        density = draw(st.sampled_from([0.0, 0.2, 0.5, 0.9, 1.0]))  # 0.0: every row empty
        mask = torch.rand(shape, generator=g) < density
    return q, k, v, mask


def allowed(mask, shape):
    return torch.ones(shape, dtype=torch.bool) if mask is None else mask.expand(shape)


@FAST
@given(attention_inputs(), st.booleans())
def test_weights_are_finite_zero_where_masked_and_rows_sum_to_one_or_zero(inputs, is_causal):
    q, k, v, mask = inputs
    if is_causal and q.size(-2) > k.size(-2):
        is_causal = False  # queries align to the end of the keys: needs Tq <= Tk
    out, weights = scaled_dot_product_attention(q, k, v, mask, is_causal=is_causal)
    B, H, Tq, Tk = weights.shape
    may = allowed(mask, (B, H, Tq, Tk))
    if is_causal:
        may = may & causal_mask(Tq, Tk)
    assert torch.isfinite(out).all() and torch.isfinite(weights).all()
    assert (weights >= 0).all()
    assert (weights[~may] == 0).all()
    sums = weights.sum(-1)  # (B, H, Tq)
    has_key = may.any(-1)
    torch.testing.assert_close(sums[has_key], torch.ones_like(sums[has_key]))
    assert (sums[~has_key] == 0).all()
    assert (out[~has_key] == 0).all()  # a query with nothing to see gives zeros


@FAST
@given(attention_inputs(dtype=torch.float64), st.booleans())
def test_fused_path_equals_readable_path(inputs, is_causal):
    """In float64: with scores in the thousands (scale 30) float32's rounding alone moves a
    saturated softmax by more than any fixed tolerance (hypothesis found a 4e-4 case)."""
    q, k, v, mask = inputs
    if is_causal and q.size(-2) > k.size(-2):
        is_causal = False
    readable, _ = scaled_dot_product_attention(q, k, v, mask, is_causal=is_causal)
    fused, none = scaled_dot_product_attention(
        q, k, v, mask, is_causal=is_causal, need_weights=False
    )
    assert none is None
    assert torch.isfinite(fused).all()
    torch.testing.assert_close(fused, readable, atol=1e-9, rtol=1e-9)


@settings(max_examples=30, deadline=None)
@given(attention_inputs(dtype=torch.bfloat16))
def test_bfloat16_is_finite_with_rows_summing_to_one_or_zero(inputs):
    q, k, v, mask = inputs
    out, weights = scaled_dot_product_attention(q, k, v, mask)
    assert torch.isfinite(out).all() and torch.isfinite(weights).all()
    may = allowed(mask, weights.shape)
    sums = weights.float().sum(-1)
    has_key = may.any(-1)
    torch.testing.assert_close(sums[has_key], torch.ones_like(sums[has_key]), atol=2e-2, rtol=0)
    assert (sums[~has_key] == 0).all()


@st.composite
def padded_ids(draw):
    """Token ids (B, T) with pad id 0 anywhere, whole rows of padding included."""
    B, T = draw(dims), draw(lengths)
    rows = draw(
        st.lists(st.lists(st.integers(0, 5), min_size=T, max_size=T), min_size=B, max_size=B)
    )
    return torch.tensor(rows)


@FAST
@given(padded_ids(), st.booleans(), st.booleans(), st.integers(0, 2**31 - 1))
def test_multi_head_attention_with_any_padding_is_finite(ids, causal, need_weights, seed):
    torch.manual_seed(seed)
    B, T = ids.shape
    mha = MultiHeadAttention(d_model=8, num_heads=2, causal=causal).eval()
    x = torch.randn(B, T, 8, requires_grad=True)
    mask = padding_mask(ids)
    out, weights = mha(x, mask=mask, need_weights=need_weights)
    assert out.shape == (B, T, 8) and torch.isfinite(out).all()
    out.sum().backward()
    assert torch.isfinite(x.grad).all()
    if need_weights:
        may = combine_masks(mask, causal_mask(T) if causal else None).expand(B, 2, T, T)
        sums = weights.sum(-1)
        assert (weights[~may] == 0).all()
        has_key = may.any(-1)
        torch.testing.assert_close(sums[has_key], torch.ones_like(sums[has_key]))
        assert (sums[~has_key] == 0).all()


@FAST
@given(padded_ids(), st.integers(0, 3))
def test_padding_and_causal_masks_mean_what_they_say(ids, extra_keys):
    B, T = ids.shape
    pad = padding_mask(ids)
    assert pad.shape == (B, 1, 1, T) and pad.dtype == torch.bool
    assert torch.equal(pad[:, 0, 0], ids != 0)
    causal = causal_mask(T, T + extra_keys)
    assert causal.shape == (T, T + extra_keys)
    for i in range(T):  # query i sits at position extra_keys + i
        for j in range(T + extra_keys):
            assert bool(causal[i, j]) == (j <= extra_keys + i)
    both = combine_masks(pad, causal_mask(T))
    assert torch.equal(both, pad & causal_mask(T))
    assert combine_masks(None, None) is None
