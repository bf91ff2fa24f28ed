"""Local (sliding-window) attention: equal to dense attention under the equivalent mask
(outputs and gradients, fp32, to 1e-5), with padding and global tokens, in every model kind;
the rolling key/value cache equal to the uncached path; bad windows refused in one line."""

import pytest
import torch

from glassformer import (
    GPT,
    ClassifierConfig,
    EncoderLM,
    EncoderLMConfig,
    GPTConfig,
    MultiHeadAttention,
    Seq2SeqConfig,
    Seq2SeqTransformer,
    TransformerClassifier,
    scaled_dot_product_attention,
)
from glassformer.modules.cache import KVCache, RollingKVCache
from glassformer.modules.local_attention import (
    band_to_dense,
    local_attention,
    window_mask,
)

TOL = dict(atol=1e-5, rtol=1e-5)

# (left, right, global tokens, length, chunk): windows wider and narrower than a chunk,
# causal ones, a last chunk shorter than the others, a window wider than the sequence.
CASES = [
    (3, 2, 0, 17, 4),
    (4, 0, 0, 20, 8),
    (3, 3, 2, 19, 5),
    (5, 0, 2, 23, 4),
    (0, 0, 1, 9, 4),
    (40, 40, 0, 30, 7),
    (2, 5, 3, 25, 128),
]


def _qkv(B=2, H=3, T=17, Dh=8, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(B, H, T, Dh, generator=g, requires_grad=True) for _ in range(3)]


def _padding(B, T):
    real = torch.ones(B, T, dtype=torch.bool)
    real[0, :2] = False  # padded keys at the front (and a global token among them)
    real[1, T - 5 :] = False  # and at the end
    return real


@pytest.mark.parametrize("left, right, G, T, chunk", CASES)
@pytest.mark.parametrize("need_weights", [False, True])
def test_local_attention_equals_dense_attention_under_the_window_mask(
    left, right, G, T, chunk, need_weights
):
    q, k, v = _qkv(T=T)
    real = _padding(2, T)
    dense_mask = window_mask(T, window=(left, right), global_tokens=G) & real[:, None, None, :]
    ref, ref_weights = scaled_dot_product_attention(q, k, v, dense_mask)
    out, weights = local_attention(
        q, k, v, (left, right), global_tokens=G, key_mask=real, need_weights=need_weights,
        chunk=chunk,
    )  # fmt: skip
    torch.testing.assert_close(out, ref, **TOL)
    grad = torch.randn_like(out)
    ref_grads = torch.autograd.grad(ref, (q, k, v), grad)
    grads = torch.autograd.grad(out, (q, k, v), grad)
    for got, want in zip(grads, ref_grads, strict=True):
        torch.testing.assert_close(got, want, **TOL)
    if need_weights:
        assert weights is not None and weights.band.shape == (2, 3, T, G + left + right + 1)
        torch.testing.assert_close(band_to_dense(weights, (left, right)), ref_weights, **TOL)
    else:
        assert weights is None


def test_a_query_with_no_visible_key_gets_zeros_not_nan():
    q, k, v = _qkv(T=12)
    real = torch.ones(2, 12, dtype=torch.bool)
    real[0, :8] = False  # query 2's window (0 .. 4) holds only padding
    out, _ = local_attention(q, k, v, (2, 2), key_mask=real, chunk=4)
    assert torch.isfinite(out).all()
    assert torch.equal(out[0, :, 2], torch.zeros_like(out[0, :, 2]))
    out.sum().backward()
    assert torch.isfinite(q.grad).all()


def test_the_window_mask_is_the_band_with_global_rows_and_columns():
    mask = window_mask(6, window=(1, 2), global_tokens=1)
    expected = torch.tensor(
        [
            [1, 1, 1, 1, 1, 1],  # the global token sees all
            [1, 1, 1, 1, 0, 0],
            [1, 1, 1, 1, 1, 0],
            [1, 0, 1, 1, 1, 1],  # everyone sees the global token
            [1, 0, 0, 1, 1, 1],
            [1, 0, 0, 0, 1, 1],
        ],
        dtype=torch.bool,
    )
    assert torch.equal(mask, expected)
    causal = window_mask(4, window=(2, 0), global_tokens=2)  # sinks stay causal
    assert not causal.triu(diagonal=1).any()


def _dense_twin(mha: MultiHeadAttention) -> MultiHeadAttention:
    """The same weights without a window."""
    twin = MultiHeadAttention(
        d_model=mha.d_model, num_heads=mha.num_heads, num_kv_heads=mha.num_kv_heads
    )
    twin.load_state_dict(mha.state_dict())
    return twin.eval()


@pytest.mark.parametrize("window, G", [((3, 3), 0), ((3, 3), 2), ((4, 0), 0), ((4, 0), 1)])
def test_multi_head_attention_with_a_window_equals_the_dense_module_with_its_mask(window, G):
    torch.manual_seed(0)
    mha = MultiHeadAttention(
        d_model=32, num_heads=4, num_kv_heads=2, window=window, global_tokens=G
    ).eval()
    x = torch.randn(2, 300, 32, requires_grad=True)  # longer than a chunk
    real = _padding(2, 300)[:, None, None, :]
    out, weights = mha(x, mask=real, need_weights=True)
    dense_mask = window_mask(300, window=window, global_tokens=G) & real
    ref, ref_weights = _dense_twin(mha)(x, mask=dense_mask, need_weights=True)
    torch.testing.assert_close(out, ref, **TOL)
    torch.testing.assert_close(weights, ref_weights, **TOL)
    grad = torch.randn_like(out)
    (got,) = torch.autograd.grad(mha(x, mask=real).output, x, grad)  # the fast path
    (want,) = torch.autograd.grad(ref, x, grad)
    torch.testing.assert_close(got, want, **TOL)


def test_hook_points_see_the_dense_maps_of_a_windowed_layer_and_replace_them():
    torch.manual_seed(0)
    mha = MultiHeadAttention(d_model=16, num_heads=2, window=(2, 2), global_tokens=1).eval()
    x = torch.randn(1, 10, 16)
    seen = {}

    def keep(value, name):
        seen[name] = value

    points = [mha.hook_q, mha.hook_k, mha.hook_v, mha.hook_attn_scores, mha.hook_pattern]
    points.append(mha.hook_z)
    for i, point in enumerate(points):
        point.name = str(i)
        point.fns.append(keep)
    out = mha(x).output
    assert seen["0"].shape == seen["1"].shape == seen["2"].shape == (1, 10, 2, 8)
    assert seen["3"].shape == seen["4"].shape == (1, 2, 10, 10)  # as every layer's: T × T
    allowed = window_mask(10, window=(2, 2), global_tokens=1)
    assert torch.equal(seen["4"][0, 0] > 0, allowed)  # zero outside the window
    assert seen["5"].shape == (1, 10, 2, 8)
    torch.testing.assert_close(out, mha(x).output, **TOL)  # hooked or not: the same numbers
    # A replacement takes effect: zeroing every weight zeroes every output row.
    mha.hook_pattern.fns = [lambda value, name: torch.zeros_like(value)]
    zeroed = mha(x).output
    bias = mha.out_proj.bias.expand(10, 16)
    torch.testing.assert_close(zeroed[0], bias)
    assert not torch.allclose(out[0], bias)


def _lengthen(config, **overrides):
    return type(config)(**{**config.to_dict(), **overrides})


@pytest.mark.parametrize("G", [0, 2])
def test_every_model_kind_takes_the_window_from_its_config(G):
    torch.manual_seed(0)
    ids = torch.randint(1, 50, (2, 40))
    ids[1, 30:] = 0  # padding
    tgt = torch.randint(1, 50, (2, 33))
    kinds = [
        (TransformerClassifier, ClassifierConfig.preset("tiny", vocab_size=50, num_classes=3)),
        (EncoderLM, EncoderLMConfig(vocab_size=50, d_model=32, num_heads=4, num_layers=2)),
        (GPT, GPTConfig(vocab_size=50, d_model=32, num_heads=4, num_layers=2, max_len=64)),
    ]
    for cls, config in kinds:
        local = cls(_lengthen(config, attention_window=5, global_tokens=G, dropout=0.0)).eval()
        dense = cls(_lengthen(config, dropout=0.0)).eval()
        dense.load_state_dict(local.state_dict())
        causal = cls is GPT
        mask = window_mask(40, window=(5, 0 if causal else 5), global_tokens=G)
        if causal:
            mask = mask & torch.ones(40, 40, dtype=torch.bool).tril()
        mask = mask & (ids != 0)[:, None, None, :]
        got = local(ids).logits
        if cls is TransformerClassifier:  # its pooling reads a key mask, not a (T, T) one
            hidden = dense.run_stack(dense.embed_tokens(ids), mask).hidden
            want = dense.head(dense.pool(hidden, ids != 0))
        else:
            want = dense(ids, mask=mask).logits
        torch.testing.assert_close(got, want, **TOL)
        assert not torch.allclose(got, dense(ids).logits, **TOL)  # the window does something
    config = Seq2SeqConfig(
        src_vocab_size=50, tgt_vocab_size=50, d_model=32, num_heads=4, num_encoder_layers=1,
        num_decoder_layers=1, d_ff=64, dropout=0.0,
    )  # fmt: skip
    local = Seq2SeqTransformer(_lengthen(config, attention_window=4, global_tokens=G)).eval()
    assert local.encoder.blocks[0].attn.window == (4, 4)
    assert local.decoder.blocks[0].attn.window == (4, 0)
    assert local.decoder.blocks[0].cross_attn.window is None
    assert local(ids, tgt).logits.shape == (2, 33, 50)


def test_a_rolling_cache_keeps_only_the_window_and_the_global_tokens():
    cache = RollingKVCache(window=3, keep_first=1)
    for t in range(10):
        keys, _ = cache.append(torch.full((1, 1, 1, 2), float(t)), torch.zeros(1, 1, 1, 2))
        assert keys.size(2) <= 1 + 3 + 1  # the kept ones and the new one
    assert len(cache) == 10
    assert cache.keys[0, 0, :, 0].tolist() == [0.0, 7.0, 8.0, 9.0]
    assert cache.key_positions.tolist() == [0, 6, 7, 8, 9]


@pytest.mark.parametrize("G", [0, 2])
@pytest.mark.parametrize("positional", ["learned", "rope"])
def test_gpt_with_a_rolling_cache_equals_the_uncached_forward(G, positional):
    torch.manual_seed(0)
    config = GPTConfig(
        vocab_size=40, d_model=32, num_heads=4, num_layers=2, max_len=64, dropout=0.0,
        attention_window=6, global_tokens=G, positional=positional,
    )  # fmt: skip
    model = GPT(config).eval()
    ids = torch.randint(1, 40, (2, 30))
    full = model(ids).logits
    cache = model.new_cache()
    assert isinstance(cache.self_attn[0], RollingKVCache)
    pieces = [model(ids[:, :9], cache=cache).logits]  # a prompt, then one token at a time
    for t in range(9, 30):
        pieces.append(model(ids[:, t : t + 1], cache=cache).logits)
        assert cache.self_attn[0].keys.size(2) <= 6 + G  # memory stays constant
    torch.testing.assert_close(torch.cat(pieces, dim=1), full, **TOL)
    generated = model.generate(ids[:, :5], 20)
    torch.testing.assert_close(generated, model.generate(ids[:, :5], 20, use_cache=False))


def test_a_growing_cache_also_serves_a_windowed_layer():
    torch.manual_seed(0)
    mha = MultiHeadAttention(d_model=16, num_heads=2, causal=True, window=(3, 0)).eval()
    x = torch.randn(2, 12, 16)
    cache = KVCache()
    pieces = [mha(x[:, :5], cache=cache).output]
    pieces += [mha(x[:, t : t + 1], cache=cache).output for t in range(5, 12)]
    torch.testing.assert_close(torch.cat(pieces, dim=1), mha(x).output, **TOL)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(window=(3,)), "window must be (left, right), two integers >= 0, got (3,)"),
        (dict(window=(-1, 2)), "window must be (left, right), two integers >= 0, got (-1, 2)"),
        (dict(window=(2.5, 2)), "window must be (left, right), two integers >= 0, got (2.5, 2)"),
        (dict(window=(2, 2), causal=True), "a causal layer's window looks back only: (w, 0)"),
        (dict(global_tokens=1), "global_tokens=1 needs a window"),
        (dict(window=(2, 2), global_tokens=-1), "global_tokens must be an integer >= 0, got -1"),
    ],
)
def test_bad_windows_are_refused_in_one_line(kwargs, message):
    with pytest.raises(ValueError) as error:
        MultiHeadAttention(d_model=16, num_heads=2, **kwargs)
    assert message in str(error.value) and "\n" not in str(error.value)


@pytest.mark.parametrize(
    "overrides, message",
    [
        (dict(attention_window=0), "attention_window must be a positive integer or None, got 0"),
        (dict(attention_window="64"), "attention_window must be a positive integer or None"),
        (dict(global_tokens=1), "global_tokens=1 needs an attention_window"),
        (dict(attention_window=8, global_tokens=-2), "global_tokens must be an integer >= 0"),
    ],
)
def test_bad_window_configs_are_refused(overrides, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        ClassifierConfig(vocab_size=10, num_classes=2, **overrides)


def test_a_windowed_layer_refuses_a_per_query_mask_and_cross_attention():
    mha = MultiHeadAttention(d_model=16, num_heads=2, window=(2, 2))
    x = torch.randn(1, 6, 16)
    with pytest.raises(ValueError, match=r"key mask broadcastable to \(1, 1, 1, 6\)"):
        mha(x, mask=torch.ones(6, 6, dtype=torch.bool))
    with pytest.raises(ValueError, match="attends to itself"):
        mha(x, x)
