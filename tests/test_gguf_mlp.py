"""glassformer.kernels.gguf_mlp: the gated MLP swapped in where a model decodes from GGUF
blocks computes what the textbook ``GatedFeedForward`` computes from the same layers, with
its gate and up products as one, and keeps its layers, hook points and hook names; the
textbook module itself has no slot for it."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("gguf")

from test_gguf_blocks import random_blocks  # noqa: E402  (tests/ is on the path)

from glassformer import GatedFeedForward  # noqa: E402
from glassformer.kernels.gguf_blocks import Q4_0, Q8_0  # noqa: E402
from glassformer.kernels.gguf_linear import GGUFLinear  # noqa: E402
from glassformer.kernels.gguf_mlp import FusedGatedFeedForward  # noqa: E402
from glassformer.modules.hooking import hook_points  # noqa: E402

D, FF = 64, 96


def gguf_mlp(bias: bool = False) -> GatedFeedForward:
    """A GatedFeedForward whose three layers compute from random Q8_0/Q4_0 blocks."""
    mlp = GatedFeedForward(d_model=D, d_ff=FF).eval()
    b = torch.randn(FF) if bias else None
    mlp.gate_proj = GGUFLinear([(Q8_0, random_blocks(Q8_0, FF, D, seed=1))], D, b)
    mlp.up_proj = GGUFLinear([(Q4_0, random_blocks(Q4_0, FF, D, seed=2))], D)
    mlp.down_proj = GGUFLinear([(Q8_0, random_blocks(Q8_0, D, FF, seed=3))], FF)
    return mlp


@pytest.mark.parametrize("rows", [1, 3, 20])
def test_the_fused_mlp_computes_what_the_textbook_one_computes(rows):
    mlp = gguf_mlp()
    x = torch.randn(2, rows, D, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        expected = mlp(x)
        fused = FusedGatedFeedForward.fuse(mlp)
        assert fused is not None and isinstance(fused, GatedFeedForward)
        assert fused.gate_up.out_features == 2 * FF
        torch.testing.assert_close(fused(x), expected, rtol=1e-6, atol=1e-6)


def test_the_fused_mlp_keeps_the_layers_hook_points_and_their_names():
    mlp = gguf_mlp()
    fused = FusedGatedFeedForward.fuse(mlp)
    assert fused is not None
    assert fused.gate_proj is mlp.gate_proj and fused.down_proj is mlp.down_proj
    assert fused.hook_pre is mlp.hook_pre and fused.hook_post is mlp.hook_post
    modules = {name for name, _ in mlp.named_modules()}
    assert modules | {"gate_up"} == {name for name, _ in fused.named_modules()}
    assert list(hook_points(fused)) == list(hook_points(mlp))
    seen = []
    fused.hook_pre.fns.append(lambda x, name: seen.append(x.shape))
    with torch.no_grad():
        fused(torch.randn(1, 4, D))
    assert seen == [torch.Size([1, 4, FF])]
    shared = [t.data_ptr() for t in fused.gate_proj.packed() + fused.up_proj.packed()]
    assert [t.data_ptr() for t in fused.gate_up.packed()] == shared  # one copy of the rows


def test_layers_that_cannot_share_a_product_are_left_as_they_are():
    assert FusedGatedFeedForward.fuse(gguf_mlp(bias=True)) is None
    assert FusedGatedFeedForward.fuse(GatedFeedForward(d_model=D, d_ff=FF)) is None


def test_the_textbook_mlp_has_no_slot_for_a_fused_layer():
    mlp = GatedFeedForward(d_model=D, d_ff=FF)
    assert not hasattr(mlp, "gate_up")


def test_the_fused_product_follows_a_part_that_moved():
    """gate_up shares its second part with up_proj: when only that tensor moves (here: put
    in shared memory), the fused product reads it where it now is."""
    mlp = gguf_mlp()
    fused = FusedGatedFeedForward.fuse(mlp)
    assert fused is not None
    x = torch.randn(1, 1, D)
    with torch.no_grad():
        before = fused(x)
        moved = fused.up_proj.packed()[0]
        fused.gate_up.register_buffer("packed1", moved.clone().share_memory_(), persistent=False)
        assert torch.equal(fused(x), before)
        fused.gate_up.packed()[1].zero_()
        assert not torch.equal(fused(x), before)
