"""Weight-only quantised linear layers (glassformer.kernels.quantized): each one multiplies
by the weight it says it holds (checked against a plain product with that weight), that
weight is within half a quantisation step of the original, and a slice of its rows is the
slice of its output."""

import pytest
import torch
from torch import nn

from glassformer.kernels.quantized import Int4Linear, Int8Linear, int4_group_size


def linear(n=96, k=128, bias=True, seed=0):
    torch.manual_seed(seed)
    return nn.Linear(k, n, bias=bias)


@pytest.mark.parametrize("bias", [True, False])
def test_int8_multiplies_by_its_dequantised_weight_within_half_a_step(bias):
    layer = linear(bias=bias)
    q = Int8Linear.from_linear(layer)
    w = q.dequantized()
    step = layer.weight.abs().amax(dim=1, keepdim=True) / 127  # one scale per output row
    assert ((w - layer.weight).abs() <= step / 2 + 1e-7).all()
    x = torch.randn(3, 5, 128)
    torch.testing.assert_close(q(x), nn.functional.linear(x, w, layer.bias), atol=1e-4, rtol=0)
    assert q.qweight.dtype == torch.int8 and q.qweight.shape == (96, 128)


@pytest.mark.parametrize("group_size", [32, 64, 128])
def test_int4_multiplies_by_its_dequantised_weight_within_half_a_step(group_size):
    layer = linear()
    q = Int4Linear.from_linear(layer, group_size)
    w = q.dequantized()
    groups = layer.weight.view(96, -1, group_size)
    step = (groups.amax(-1) - groups.amin(-1)) / 15  # (N, K / G)
    error = (w - layer.weight).abs().view(96, -1, group_size)
    assert (error <= step[..., None] / 2 + 1e-5).all()
    x = torch.randn(4, 128)
    torch.testing.assert_close(q(x), nn.functional.linear(x, w, layer.bias), atol=1e-4, rtol=0)
    assert q.packed.numel() == 96 * 128 // 2  # two weights a byte


@pytest.mark.parametrize("cls", [Int8Linear, Int4Linear])
def test_forward_rows_is_the_slice_of_the_output(cls):
    q = cls.from_linear(linear(n=3 * 64, k=64))
    x = torch.randn(2, 7, 64)
    torch.testing.assert_close(q.forward_rows(x, 64, 192), q(x)[..., 64:192])


def test_int8_follows_bf16_activations():
    q = Int8Linear.from_linear(linear(), dtype=torch.bfloat16)
    x = torch.randn(2, 128, dtype=torch.bfloat16)
    y = q(x)
    assert y.dtype == torch.bfloat16
    reference = nn.functional.linear(x.float(), q.dequantized().float(), q.bias.float())
    torch.testing.assert_close(y.float(), reference, atol=0.1, rtol=0.02)


def test_bad_int4_shapes_are_refused_with_the_value():
    with pytest.raises(ValueError, match="group_size must be one of .* dividing in_features=96"):
        Int4Linear.from_linear(linear(k=96), 64)
    with pytest.raises(ValueError, match="in_features divisible by 32, got 40"):
        int4_group_size(40)
    assert int4_group_size(576) == 32 and int4_group_size(96) == 32


@pytest.mark.parametrize("cls", [Int8Linear, Int4Linear])
def test_a_strided_input_gives_the_contiguous_ones_output(cls):
    """The last position of a batch of sequences (what generation feeds the output head) is
    a view with gaps between its rows; the kernels read rows densely."""
    q = cls.from_linear(linear(k=64), dtype=torch.bfloat16)
    x = torch.randn(3, 5, 64, dtype=torch.bfloat16)
    last = x[:, -1:]  # (3, 1, 64), rows 5 · 64 apart
    assert not last.reshape(-1, 64).is_contiguous()
    torch.testing.assert_close(q(last), q(last.contiguous()))


def test_int4_keeps_weights_that_are_already_on_a_4_bit_grid():
    """A GGUF Q4_1 block is min + q · step with q in 0..15; where a block uses only levels
    0..9, min/max over 15 steps would round every weight onto another grid."""
    torch.manual_seed(0)
    steps = torch.rand(64, 4, 1) * 0.01 + 0.001  # (N, K / 32, 1): one step per block
    mins = torch.randn(64, 4, 1) * 0.02
    levels = torch.randint(0, 10, (64, 4, 32))
    levels[..., 0], levels[..., 1] = 0, 9  # each block spans 9 steps exactly
    layer = nn.Linear(128, 64, bias=False)
    with torch.no_grad():
        layer.weight.copy_((mins + levels * steps).view(64, 128))
    w = Int4Linear.from_linear(layer, 32).dequantized()
    torch.testing.assert_close(w, layer.weight, atol=1e-6, rtol=0)


@pytest.mark.parametrize("k", [24, 72, 100])
def test_int8_with_input_widths_the_kernel_cannot_take_multiplies_correctly(k):
    """PyTorch's int8 CPU kernel crashes the process for K not a multiple of 16 (a
    T5/Llama test shape with d_ff 72 did): those layers take the plain product instead."""
    layer = linear(n=40, k=k, bias=False)
    q = Int8Linear.from_linear(layer, torch.bfloat16)
    x = torch.randn(2, 5, k, dtype=torch.bfloat16)
    expected = nn.functional.linear(x, q.dequantized().to(x.dtype))
    torch.testing.assert_close(q(x), expected, atol=1e-2, rtol=1e-2)
