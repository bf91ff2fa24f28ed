"""One contract every block keeps: shape, dtype, eval determinism, gradients to every
parameter, and a state-dict round trip into a fresh instance."""

import pytest
import torch

from glassformer import (
    Decoder,
    DecoderLayer,
    Encoder,
    EncoderLayer,
    FeedForward,
    LearnedPositionalEmbedding,
    MultiHeadAttention,
    SinusoidalPositionalEncoding,
    TokenEmbedding,
    padding_mask,
)
from glassformer.modules.feedforward import GatedFeedForward
from glassformer.modules.norms import RMSNorm
from glassformer.modules.rotary import RotaryEmbedding

D = 16
IDS = torch.tensor([[3, 4, 5, 6, 7], [3, 4, 5, 0, 0]])
MASK = padding_mask(IDS)
LAYER = dict(d_model=D, num_heads=4, d_ff=32, dropout=0.1)


def x(dtype=torch.float32):
    return torch.randn(2, 5, D, generator=torch.Generator().manual_seed(0)).to(dtype)


def memory(dtype=torch.float32):
    return torch.randn(2, 7, D, generator=torch.Generator().manual_seed(1)).to(dtype)


def _randomised(module):
    """Random weights for a block that starts at a constant (a norm's ones)."""
    with torch.no_grad():
        for p in module.parameters():
            p.normal_(1.0, 0.5)
    return module


# name: (factory, call(module, dtype) -> output tensor, output shape)
BLOCKS = {
    "self-attention": (
        lambda: MultiHeadAttention(d_model=D, num_heads=4, dropout=0.1),
        lambda m, dt: m(x(dt), mask=MASK).output,
        (2, 5, D),
    ),
    "causal wide-head attention": (
        lambda: MultiHeadAttention(d_model=D, num_heads=2, head_dim=D, qkv_bias=False, causal=True),
        lambda m, dt: m(x(dt), need_weights=True).output,
        (2, 5, D),
    ),
    "grouped-query attention": (
        lambda: MultiHeadAttention(d_model=D, num_heads=4, num_kv_heads=2, causal=True),
        lambda m, dt: m(x(dt), mask=MASK, need_weights=True).output,
        (2, 5, D),
    ),
    "rotary grouped-query attention": (
        lambda: MultiHeadAttention(
            d_model=D, num_heads=4, num_kv_heads=1, causal=True, rotary=RotaryEmbedding(4)
        ),
        lambda m, dt: m(x(dt), mask=MASK).output,
        (2, 5, D),
    ),
    "cross-attention": (
        lambda: MultiHeadAttention(d_model=D, num_heads=4),
        lambda m, dt: m(x(dt), memory(dt)).output,
        (2, 5, D),
    ),
    "feed-forward relu": (
        lambda: FeedForward(d_model=D, d_ff=32, dropout=0.1),
        lambda m, dt: m(x(dt)),
        (2, 5, D),
    ),
    "feed-forward swiglu": (
        lambda: GatedFeedForward(d_model=D, d_ff=24, dropout=0.1, bias=True),
        lambda m, dt: m(x(dt)),
        (2, 5, D),
    ),
    "rms norm": (
        lambda: _randomised(RMSNorm(D, eps=1e-5)),
        lambda m, dt: m(x(dt)),
        (2, 5, D),
    ),
    "feed-forward gelu": (
        lambda: FeedForward(d_model=D, d_ff=32, activation="gelu"),
        lambda m, dt: m(x(dt)),
        (2, 5, D),
    ),
    "encoder layer post-norm": (
        lambda: EncoderLayer(**LAYER),
        lambda m, dt: m(x(dt), MASK).hidden,
        (2, 5, D),
    ),
    "encoder layer pre-norm causal": (
        lambda: EncoderLayer(**LAYER, norm_first=True, causal=True, activation="gelu_tanh"),
        lambda m, dt: m(x(dt), MASK, need_weights=True).hidden,
        (2, 5, D),
    ),
    "decoder layer": (
        lambda: DecoderLayer(**LAYER),
        lambda m, dt: m(x(dt), memory(dt), MASK).hidden,
        (2, 5, D),
    ),
    "decoder layer pre-norm": (
        lambda: DecoderLayer(**LAYER, norm_first=True),
        lambda m, dt: m(x(dt), memory(dt), None, None, need_weights=True).hidden,
        (2, 5, D),
    ),
    "encoder": (
        lambda: Encoder(num_layers=2, **LAYER, norm_first=True),
        lambda m, dt: m(x(dt), MASK).hidden,
        (2, 5, D),
    ),
    "decoder": (
        lambda: Decoder(num_layers=2, **LAYER),
        lambda m, dt: m(x(dt), memory(dt), MASK).hidden,
        (2, 5, D),
    ),
    "learned positions": (
        lambda: LearnedPositionalEmbedding(max_len=8, d_model=D),
        lambda m, dt: m(x(dt)),
        (2, 5, D),
    ),
    "sinusoidal positions": (
        lambda: SinusoidalPositionalEncoding(d_model=D, max_len=8),
        lambda m, dt: m(x(dt)),
        (2, 5, D),
    ),
    "token embedding": (
        lambda: TokenEmbedding(vocab_size=10, d_model=D, scale=True),
        lambda m, dt: m(IDS),
        (2, 5, D),
    ),
}


@pytest.fixture(params=sorted(BLOCKS))
def block(request):
    return BLOCKS[request.param]


def test_shape_and_finite(block):
    factory, call, shape = block
    out = call(factory().eval(), torch.float32)
    assert out.shape == shape
    assert torch.isfinite(out).all()


@pytest.mark.parametrize("dtype", [torch.float64, torch.bfloat16])
def test_dtype_is_kept(block, dtype):
    factory, call, _ = block
    module = factory().to(dtype).eval()
    assert call(module, dtype).dtype == dtype


def test_eval_is_deterministic(block):
    factory, call, _ = block
    module = factory().eval()
    torch.testing.assert_close(
        call(module, torch.float32), call(module, torch.float32), atol=0, rtol=0
    )


def test_gradients_reach_every_parameter(block):
    factory, call, _ = block
    module = factory().train()
    if not list(module.parameters()):
        pytest.skip("no parameters (a fixed table)")
    torch.manual_seed(0)
    call(module, torch.float32).square().sum().backward()
    for name, p in module.named_parameters():
        assert p.grad is not None, f"{name} got no gradient"
        assert p.grad.abs().sum() > 0, f"{name} got an all-zero gradient"


def test_state_dict_round_trip(block):
    factory, call, _ = block
    torch.manual_seed(0)
    a = factory().eval()
    torch.manual_seed(1)
    b = factory().eval()
    if list(a.parameters()):
        assert not torch.allclose(call(a, torch.float32), call(b, torch.float32))
    b.load_state_dict(a.state_dict())
    torch.testing.assert_close(call(b, torch.float32), call(a, torch.float32), atol=0, rtol=0)
