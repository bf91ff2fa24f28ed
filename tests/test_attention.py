"""scaled_dot_product_attention and MultiHeadAttention against PyTorch's own.

This proves the README claims "MultiHeadAttention equals nn.MultiheadAttention with copied
weights (self- and cross-attention, padding and causal masks, per-head weights) to 1e-5 in
fp32" and "A query that may attend to nothing gives zeros, never NaN, in fp32, bf16 and
fp64, on both paths, with finite gradients; gradcheck passes on the attention function in
float64".
"""

import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from glassformer import MultiHeadAttention, causal_mask, padding_mask, scaled_dot_product_attention
from glassformer.interop import from_torch_nn
from glassformer.modules.cache import KVCache

TOL = dict(atol=1e-5, rtol=1e-5)


def qkv(B=2, H=3, Tq=5, Tk=7, Dh=4, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(B, H, T, Dh, generator=g, dtype=dtype) for T in (Tq, Tk, Tk)]


def random_key_mask(B, Tk, seed=0):
    g = torch.Generator().manual_seed(seed)
    m = torch.rand(B, 1, 1, Tk, generator=g) > 0.3
    m[..., 0] = True  # keep at least one key per row
    return m


# ---- the function ----------------------------------------------------------------------


def test_readable_path_is_the_formula():
    q, k, v = qkv()
    out, w = scaled_dot_product_attention(q, k, v)
    expected_w = torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(q.size(-1)), dim=-1)
    torch.testing.assert_close(w, expected_w, **TOL)
    torch.testing.assert_close(out, expected_w @ v, **TOL)
    torch.testing.assert_close(w.sum(-1), torch.ones(2, 3, 5), **TOL)


@pytest.mark.parametrize("masking", ["none", "padding", "causal", "both", "causal_offset"])
def test_readable_path_equals_torch_sdpa(masking):
    Tq, Tk = (4, 7) if masking == "causal_offset" else (7, 7)
    q, k, v = qkv(Tq=Tq, Tk=Tk)
    mask = random_key_mask(2, Tk) if masking in ("padding", "both") else None
    is_causal = masking in ("causal", "both", "causal_offset")
    ours, w = scaled_dot_product_attention(q, k, v, mask, is_causal=is_causal)
    full = mask
    if is_causal:
        c = causal_mask(Tq, Tk)
        full = c if full is None else full & c
    ref = F.scaled_dot_product_attention(q, k, v, attn_mask=full)
    torch.testing.assert_close(ours, ref, **TOL)
    fast, none = scaled_dot_product_attention(
        q, k, v, mask, need_weights=False, is_causal=is_causal
    )
    assert none is None
    torch.testing.assert_close(fast, ours, **TOL)
    if full is not None:
        assert (w.masked_select(~full.expand_as(w)) == 0).all()


def test_causal_queries_align_to_the_end_of_the_keys():
    # 3 new queries after 4 cached keys: the last query sees all 7 keys, the first sees 5.
    m = causal_mask(3, 7)
    assert m.sum(-1).tolist() == [5, 6, 7]
    q, k, v = qkv(Tq=7, Tk=7)
    full, _ = scaled_dot_product_attention(q, k, v, is_causal=True)
    tail, _ = scaled_dot_product_attention(q[:, :, 4:], k, v, is_causal=True)
    torch.testing.assert_close(tail, full[:, :, 4:], **TOL)
    tail_fast, _ = scaled_dot_product_attention(
        q[:, :, 4:], k, v, need_weights=False, is_causal=True
    )
    torch.testing.assert_close(tail_fast, full[:, :, 4:], **TOL)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64])
@pytest.mark.parametrize("need_weights", [True, False])
def test_fully_masked_row_gives_zeros_not_nan(dtype, need_weights):
    q, k, v = qkv(dtype=dtype)
    mask = torch.ones(2, 1, 5, 7, dtype=torch.bool)
    mask[0, :, 2] = False  # query 2 of batch 0 may attend to nothing
    out, w = scaled_dot_product_attention(q, k, v, mask, need_weights=need_weights)
    assert torch.isfinite(out).all()
    assert (out[0, :, 2] == 0).all()
    assert out[0, :, 1].abs().sum() > 0
    if need_weights:
        assert (w[0, :, 2] == 0).all()
        torch.testing.assert_close(w[0, :, 1].sum(-1).float(), torch.ones(3))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_fully_masked_row_gradients_are_finite(dtype):
    q, k, v = (t.requires_grad_() for t in qkv(dtype=dtype))
    mask = torch.ones(2, 1, 5, 7, dtype=torch.bool)
    mask[1, :, 0] = False
    for need_weights in (True, False):
        out, _ = scaled_dot_product_attention(q, k, v, mask, need_weights=need_weights)
        (gq, gk, gv) = torch.autograd.grad(out.float().sum(), (q, k, v))
        assert all(torch.isfinite(g).all() for g in (gq, gk, gv))


@pytest.mark.parametrize("Tk", [160, 256])
def test_fully_masked_row_on_the_fused_kernel_in_bfloat16(Tk, monkeypatch):
    """README: "A query that may attend to nothing gives zeros, never NaN, in ... bf16 ... on
    both paths, with finite gradients". On CPU, bf16 with Tk <= 128 keys takes the matmul
    path even without weights, so the tests above never reach the fused kernel in bf16; here
    it runs (counted). Output and gradients equal the float32 readable path to bf16's
    precision (1e-2), the empty row's output and its query's gradient are exactly zero."""
    calls = []
    fused = F.scaled_dot_product_attention

    def counted(*args, **kwargs):
        calls.append(1)
        return fused(*args, **kwargs)

    monkeypatch.setattr(F, "scaled_dot_product_attention", counted)
    q, k, v = (t.requires_grad_() for t in qkv(Tk=Tk, dtype=torch.bfloat16))
    mask = torch.ones(2, 1, 5, Tk, dtype=torch.bool)
    mask[0, :, 2] = False  # query 2 of batch 0 may attend to nothing
    mask[1, :, :, Tk // 2 :] = False  # batch 1: only the first half of the keys
    out, none = scaled_dot_product_attention(q, k, v, mask, need_weights=False)
    assert calls == [1] and none is None and out.dtype == torch.bfloat16
    assert torch.isfinite(out).all()
    assert (out[0, :, 2] == 0).all()
    grads = torch.autograd.grad(out.float().sum(), (q, k, v))
    assert all(torch.isfinite(g).all() for g in grads)
    assert (grads[0][0, :, 2] == 0).all()  # the empty row does not depend on its query
    q32, k32, v32 = (t.detach().float().requires_grad_() for t in (q, k, v))
    expected = scaled_dot_product_attention(q32, k32, v32, mask).output  # readable, fp32
    torch.testing.assert_close(out.float(), expected, atol=1e-2, rtol=1e-2)
    for got, want in zip(grads, torch.autograd.grad(expected.sum(), (q32, k32, v32)), strict=True):
        torch.testing.assert_close(got.float(), want, atol=1e-2, rtol=1e-2)


def test_gradcheck_float64():
    q, k, v = (t.requires_grad_() for t in qkv(B=1, H=2, Tq=3, Tk=4, Dh=3, dtype=torch.float64))
    mask = torch.tensor([True, True, False, True])[None, None, None, :]

    def f(q, k, v):
        return scaled_dot_product_attention(q, k, v, mask, is_causal=False)

    assert torch.autograd.gradcheck(lambda q, k, v: f(q, k, v).output, (q, k, v))
    assert torch.autograd.gradcheck(lambda q, k, v: f(q, k, v).weights, (q, k, v))
    assert torch.autograd.gradcheck(
        lambda q, k, v: scaled_dot_product_attention(q, k, v, is_causal=True).output,
        (q[:, :, :3], k[:, :, :3], v[:, :, :3]),
    )


def test_dropout_acts_on_the_weights():
    q, k, v = qkv(B=4, H=4, Tq=32, Tk=32)
    torch.manual_seed(0)
    out, w = scaled_dot_product_attention(q, k, v, dropout_p=0.5)
    zero_fraction = (w == 0).float().mean().item()
    assert 0.45 < zero_fraction < 0.55
    # survivors are scaled by 1/(1-p), so rows still sum to 1 on average; v is mixed by them
    assert abs(w.sum(-1).mean().item() - 1.0) < 0.05
    torch.testing.assert_close(out, w @ v, **TOL)
    no_drop, _ = scaled_dot_product_attention(q, k, v)
    assert not torch.allclose(out, no_drop)


@pytest.mark.parametrize("bad", [-0.1, 1.0])
def test_bad_dropout_is_refused(bad):
    with pytest.raises(ValueError, match=str(bad)):
        scaled_dot_product_attention(*qkv(), dropout_p=bad)


def test_integer_mask_is_refused():
    with pytest.raises(TypeError, match="bool"):
        scaled_dot_product_attention(*qkv(), mask=torch.ones(5, 7, dtype=torch.long))


# ---- the module against nn.MultiheadAttention -----------------------------------------


def pair(d_model=16, num_heads=4, bias=True, seed=0):
    torch.manual_seed(seed)
    ref = nn.MultiheadAttention(d_model, num_heads, bias=bias, batch_first=True)
    for p in ref.parameters():  # nn zeroes its biases at init; make them count
        nn.init.normal_(p, std=0.3)
    ours = MultiHeadAttention(d_model=d_model, num_heads=num_heads, qkv_bias=bias, out_bias=bias)
    ours.load_state_dict(from_torch_nn(ref.state_dict()))
    return ours.eval(), ref.eval()


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("masking", ["none", "padding", "causal", "both"])
def test_self_attention_equals_nn_multihead_attention(bias, masking):
    ours, ref = pair(bias=bias)
    causal_ours = MultiHeadAttention(
        d_model=16, num_heads=4, qkv_bias=bias, out_bias=bias, causal=True
    )
    causal_ours.load_state_dict(ours.state_dict())
    x = torch.randn(3, 6, 16)
    ids = torch.tensor([[5, 5, 5, 5, 5, 5], [5, 5, 5, 5, 0, 0], [5, 5, 5, 0, 0, 0]])
    key_mask = padding_mask(ids) if masking in ("padding", "both") else None
    causal = masking in ("causal", "both")
    module = causal_ours if causal else ours
    ref_out, ref_w = ref(
        x,
        x,
        x,
        key_padding_mask=None if key_mask is None else ~key_mask[:, 0, 0],
        attn_mask=~causal_mask(6) if causal else None,
        need_weights=True,
        average_attn_weights=False,
    )
    out, w = module(x, mask=key_mask, need_weights=True)
    torch.testing.assert_close(out, ref_out, **TOL)
    torch.testing.assert_close(w, ref_w, **TOL)
    fast, none = module(x, mask=key_mask)
    assert none is None
    torch.testing.assert_close(fast, ref_out, **TOL)


def test_cross_attention_equals_nn_multihead_attention():
    ours, ref = pair()
    x, memory = torch.randn(2, 4, 16), torch.randn(2, 9, 16)
    src = torch.tensor([[3] * 9, [3] * 6 + [0] * 3])
    ref_out, ref_w = ref(
        x, memory, memory, key_padding_mask=~padding_mask(src)[:, 0, 0], average_attn_weights=False
    )
    out, w = ours(x, memory, mask=padding_mask(src), need_weights=True)
    torch.testing.assert_close(out, ref_out, **TOL)
    torch.testing.assert_close(w, ref_w, **TOL)
    torch.testing.assert_close(ours(x, memory, mask=padding_mask(src)).output, ref_out, **TOL)
    # distinct key and value tensors take the general path
    value = torch.randn(2, 9, 16)
    ref_out, _ = ref(x, memory, value)
    torch.testing.assert_close(ours(x, memory, value).output, ref_out, **TOL)


def test_wide_heads_have_their_own_width():
    # Bloem's heads are each d_model wide: q, k, v are D → H·D.
    mha = MultiHeadAttention(d_model=8, num_heads=4, head_dim=8, qkv_bias=False)
    assert mha.qkv_proj.weight.shape == (3 * 4 * 8, 8)
    assert mha.out_proj.weight.shape == (8, 32)
    x = torch.randn(2, 5, 8)
    out, w = mha(x, need_weights=True)
    assert w.shape == (2, 4, 5, 5)
    torch.testing.assert_close(mha(x).output, out, **TOL)
    # by hand: head h uses rows h*8:(h+1)*8 of each of q, k, v
    W = mha.qkv_proj.weight
    heads = []
    for h in range(4):
        q = x @ W[h * 8 : (h + 1) * 8].T
        k = x @ W[32 + h * 8 : 32 + (h + 1) * 8].T
        v = x @ W[64 + h * 8 : 64 + (h + 1) * 8].T
        heads.append(torch.softmax(q @ k.transpose(1, 2) / math.sqrt(8), -1) @ v)
    torch.testing.assert_close(out, mha.out_proj(torch.cat(heads, -1)), **TOL)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(d_model=10, num_heads=3), "d_model=10 is not divisible by num_heads=3"),
        (dict(d_model=8, num_heads=2, dropout=-0.1), "-0.1"),
        (dict(d_model=8, num_heads=0), "num_heads must be a positive integer, got 0"),
        (dict(d_model=8, num_heads=2, head_dim=-4), "-4"),
    ],
)
def test_bad_constructor_arguments(kwargs, message):
    with pytest.raises(ValueError, match=message):
        MultiHeadAttention(**kwargs)


def test_wrong_query_width_is_a_clear_error():
    with pytest.raises(ValueError, match=r"\(batch, length, 16\)"):
        MultiHeadAttention(d_model=16, num_heads=4)(torch.randn(2, 3, 8))


@pytest.mark.parametrize("T", [40, 200])  # the short-key bf16 route takes the matmul path
def test_bfloat16_attention_without_weights_matches_float32(T):
    torch.manual_seed(0)
    q, k, v = (torch.randn(2, 3, T, 16) for _ in range(3))
    mask = torch.rand(2, 1, 1, T) > 0.2
    for is_causal in (False, True):
        expected = scaled_dot_product_attention(
            q, k, v, mask, need_weights=False, is_causal=is_causal
        ).output
        got = scaled_dot_product_attention(
            q.bfloat16(), k.bfloat16(), v.bfloat16(), mask, need_weights=False, is_causal=is_causal
        )
        assert got.weights is None and got.output.dtype == torch.bfloat16
        torch.testing.assert_close(got.output.float(), expected, atol=3e-2, rtol=3e-2)


# Grouped-query attention: Hkv key/value heads shared by H query heads.


def _gqa_and_its_full_twin(num_kv_heads, qkv_bias=True):
    """A GQA module and an ordinary one whose k, v rows repeat the GQA module's heads."""
    torch.manual_seed(0)
    H, Dh, D = 4, 4, 16
    gqa = MultiHeadAttention(
        d_model=D, num_heads=H, num_kv_heads=num_kv_heads, qkv_bias=qkv_bias, causal=True
    )
    full = MultiHeadAttention(d_model=D, num_heads=H, qkv_bias=qkv_bias, causal=True)
    group = H // num_kv_heads

    def widen(t):  # rows [q; k; v] with Hkv heads → [q; k; v] with H heads
        q, k, v = t.split([H * Dh, num_kv_heads * Dh, num_kv_heads * Dh])

        def rep(x):
            return (
                x.reshape(num_kv_heads, Dh, *x.shape[1:]).repeat_interleave(group, 0).flatten(0, 1)
            )

        return torch.cat([q, rep(k), rep(v)])

    with torch.no_grad():
        full.qkv_proj.weight.copy_(widen(gqa.qkv_proj.weight))
        if qkv_bias:
            full.qkv_proj.bias.copy_(widen(gqa.qkv_proj.bias))
        full.out_proj.load_state_dict(gqa.out_proj.state_dict())
    return gqa, full


@pytest.mark.parametrize("num_kv_heads", [1, 2, 4])
def test_grouped_query_attention_equals_repeated_heads(num_kv_heads):
    gqa, full = _gqa_and_its_full_twin(num_kv_heads)
    assert gqa.qkv_proj.weight.shape == ((4 + 2 * num_kv_heads) * 4, 16)
    x = torch.randn(2, 6, 16)
    mask = torch.tensor([[True] * 6, [False, True, True, True, True, True]])[:, None, None, :]
    for need_weights in (True, False):
        ours, ref = (
            gqa(x, mask=mask, need_weights=need_weights),
            full(x, mask=mask, need_weights=need_weights),
        )
        torch.testing.assert_close(ours.output, ref.output, atol=1e-6, rtol=0)
    assert gqa(x, need_weights=True).weights.shape == (2, 4, 6, 6)
    memory = torch.randn(2, 8, 16)
    torch.testing.assert_close(gqa(x, memory).output, full(x, memory).output, atol=1e-6, rtol=0)


@pytest.mark.parametrize("num_kv_heads", [1, 2])
def test_grouped_query_cache_stores_only_the_kv_heads(num_kv_heads):
    gqa, _ = _gqa_and_its_full_twin(num_kv_heads, qkv_bias=False)
    x = torch.randn(2, 7, 16)
    whole = gqa(x).output
    cache = KVCache()
    steps = [gqa(x[:, :4], cache=cache).output]
    steps += [gqa(x[:, t : t + 1], cache=cache).output for t in range(4, 7)]
    assert cache.keys.shape == (2, num_kv_heads, 7, 4)
    torch.testing.assert_close(torch.cat(steps, 1), whole, atol=1e-6, rtol=0)


@pytest.mark.parametrize("num_kv_heads", [0, 3, 8])
def test_bad_num_kv_heads(num_kv_heads):
    with pytest.raises(ValueError, match=f"num_kv_heads.*got {num_kv_heads}"):
        MultiHeadAttention(d_model=16, num_heads=4, num_kv_heads=num_kv_heads)


@pytest.mark.parametrize("num_kv_heads", [1, 2])
def test_grouped_query_fused_path_shares_kv_heads_in_the_kernel_and_equals_the_readable(
    num_kv_heads, monkeypatch
):
    """Without weights, the fused kernel gets the Hkv key/value heads as they are
    (enable_gqa=True, nothing repeated); outputs and gradients equal the readable path's."""
    gqa, _ = _gqa_and_its_full_twin(num_kv_heads)
    x = torch.randn(2, 6, 16, requires_grad=True)
    mask = torch.tensor([[True] * 6, [False, True, True, True, True, True]])[:, None, None, :]
    calls = []
    real = F.scaled_dot_product_attention

    def spy(q, k, v, **kwargs):
        calls.append((q.size(1), k.size(1), kwargs.get("enable_gqa")))
        return real(q, k, v, **kwargs)

    monkeypatch.setattr(F, "scaled_dot_product_attention", spy)
    fused = gqa(x, mask=mask).output
    (g_fused,) = torch.autograd.grad(fused.square().sum(), x)
    assert calls == [(4, num_kv_heads, True)]
    readable = gqa(x, mask=mask, need_weights=True).output
    (g_readable,) = torch.autograd.grad(readable.square().sum(), x)
    torch.testing.assert_close(fused, readable, atol=1e-6, rtol=0)
    torch.testing.assert_close(g_fused, g_readable, atol=1e-6, rtol=0)


def test_one_query_under_compilation_equals_the_fused_kernel():
    """A decoding step's attention, compiled, is spelled out as products the compiler fuses
    (``one_query.one_query``): equal to PyTorch's fused kernel, grouped heads and a padding
    mask included."""
    from glassformer.kernels import gguf_linear
    from glassformer.modules.sdpa import fused_attention

    assert gguf_linear.kernels() is not None  # then the step's attention is the C kernel
    g = torch.Generator().manual_seed(0)
    q = torch.randn(2, 6, 1, 16, generator=g)
    k, v = torch.randn(2, 2, 9, 16, generator=g), torch.randn(2, 2, 9, 16, generator=g)
    mask = torch.ones(2, 1, 1, 9, dtype=torch.bool)
    mask[1, ..., :4] = False  # a left-padded row
    for m in (None, mask):
        compiled = torch.compile(fused_attention, fullgraph=True)(q, k, v, m)
        expected = F.scaled_dot_product_attention(q, k, v, attn_mask=m, enable_gqa=True)
        torch.testing.assert_close(compiled, expected, atol=1e-6, rtol=0)


# ---- attention from parts: the score part, the window part, the attend registry ---------


def _pair(**options):
    """Two layers with the same weights, ``options`` each."""
    torch.manual_seed(0)
    layers = [
        MultiHeadAttention(d_model=16, num_heads=4, causal=True, **o) for o in options.values()
    ]
    for layer in layers[1:]:
        layer.load_state_dict(layers[0].state_dict())
    return layers


def test_the_score_part_scales_and_caps_the_scores():
    """``Scores(scale, softcap)``: the weights are softmax(c·tanh(q·kᵀ·scale / c)), computed
    here from the layer's own q and k."""
    from glassformer.modules import Scores

    (layer,) = _pair(part=dict(scores=Scores(0.3, 2.0)))
    assert (layer.scale, layer.softcap) == (0.3, 2.0)
    seen = {}
    layer.hook_q.fns.append(lambda value, name: seen.setdefault("q", value))  # (B, T, H, Dh)
    layer.hook_k.fns.append(lambda value, name: seen.setdefault("k", value))
    weights = layer.eval()(torch.randn(2, 5, 16), need_weights=True).weights
    scores = torch.einsum("bqhd,bkhd->bhqk", seen["q"], seen["k"]) * 0.3
    scores = (2.0 * torch.tanh(scores / 2.0)).masked_fill(torch.ones(5, 5).triu(1).bool(), -1e9)
    torch.testing.assert_close(weights, scores.softmax(-1), atol=1e-6, rtol=0)


def test_a_layer_attends_by_the_function_it_names():
    """``attend="readable"`` spells out what the fused kernel computes; a function registered
    under a new name is the one a layer naming it calls; unknown names and a fused layer
    asked to soft-cap are refused."""
    from glassformer.modules import ATTEND, Scores, register_attend

    fused, readable = _pair(fused=dict(attend="fused"), readable=dict(attend="readable"))
    x = torch.randn(2, 5, 16)
    torch.testing.assert_close(fused(x).output, readable(x).output, atol=1e-6, rtol=0)
    calls = []

    @register_attend("counted")
    def counted(q, k, v, how):
        calls.append(tuple(q.shape))
        return ATTEND["readable"](q, k, v, how)

    try:
        (layer,) = _pair(counted=dict(attend="counted"))
        layer.load_state_dict(fused.state_dict())
        torch.testing.assert_close(layer(x).output, fused(x).output, atol=1e-6, rtol=0)
        assert calls == [(2, 4, 5, 4)]
    finally:
        del ATTEND["counted"]
    with pytest.raises(
        ValueError, match=r"attend must be one of \['fused', 'readable', 'window'\]"
    ):
        MultiHeadAttention(d_model=16, num_heads=4, attend="flash")
    with pytest.raises(ValueError, match="cannot soft-cap"):
        MultiHeadAttention(d_model=16, num_heads=4, attend="fused", scores=Scores(softcap=5.0))


def test_the_window_part_is_the_pair_it_reaches():
    from glassformer.modules import Window

    layer = MultiHeadAttention(d_model=16, num_heads=4, causal=True, window=(3, 0))
    assert layer.window == Window(3, 0) == (3, 0) and layer.window.left == 3
