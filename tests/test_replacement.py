"""The local replacement model (glassformer.inspect.replacement): held norms and patterns
give the model's own values and the linear model's gradients; interventions set features
as they say, held or run on."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from glassformer.inspect.replacement import frozen, held_norm, intervene, norm_scale
from glassformer.modules.norms import LayerNorm, RMSNorm
from tests.graph_models import IDS, SHAPES, small_model, small_transcoders


@pytest.mark.parametrize("shape", SHAPES)
def test_a_held_model_gives_its_own_logits(shape: str) -> None:
    model = small_model(shape)
    with torch.no_grad():
        plain = model(IDS[None]).logits
        with frozen(model, IDS[None]):
            held = model(IDS[None].expand(3, -1)).logits
    torch.testing.assert_close(held, plain.expand(3, -1, -1), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("norm", [LayerNorm(6), RMSNorm(6), RMSNorm(6, unit_offset=True)])
def test_a_held_norm_is_the_linear_map_with_its_scale_fixed(norm) -> None:
    torch.manual_seed(0)
    with torch.no_grad():
        for p in norm.parameters():
            p.add_(torch.randn_like(p))
    x = torch.randn(2, 6, requires_grad=True)
    scale = norm_scale(norm, x).detach()
    y = held_norm(norm, x, scale)
    torch.testing.assert_close(y, norm(x), atol=1e-6, rtol=1e-5)
    direction = torch.randn(2, 6)
    (grad,) = torch.autograd.grad(y, x, direction)
    # d/dx of (x − mean x) · s · w (LayerNorm), x · s · w (RMSNorm), s held
    weight = norm.weight + 1 if getattr(norm, "unit_offset", False) else norm.weight
    g = direction * weight * scale
    if isinstance(norm, LayerNorm):
        g = g - g.mean(-1, keepdim=True)
    torch.testing.assert_close(grad, g, atol=1e-6, rtol=1e-5)


def test_intervening_with_nothing_changes_nothing() -> None:
    model, tc = small_model("llama"), small_transcoders("relu")
    with torch.no_grad():
        plain = model(IDS[None]).logits
    for direct in (False, True):
        torch.testing.assert_close(intervene(model, tc, IDS, direct=direct).logits, plain,
                                   atol=1e-5, rtol=1e-5)  # fmt: skip


def test_setting_a_feature_moves_its_mlp_output_by_its_decoder_row() -> None:
    """Run on (not held): the MLP at the feature's layer outputs what the model's own MLP
    does plus (value − activation) × the feature's decoder row, at its position only."""
    model, tc = small_model("gpt2"), small_transcoders("relu")
    before = intervene(model, tc, IDS)
    layer, pos = 1, 3
    feature = int(before.features[layer, pos].argmax())
    value = float(before.features[layer, pos, feature])
    seen: dict[str, torch.Tensor] = {}
    name = tc.config.hook(layer, "output")
    keep = (name, lambda v, n: seen.__setitem__("out", v.clone()))
    after = intervene(model, tc, IDS, [(layer, pos, feature, 3 * value)], hooks=[keep])
    with torch.no_grad():  # the model's own MLP at that layer, on the intervened run's input
        x = seen["out"]
    moved = x[0] - model.run_with_cache(IDS[None], names=[name])[1][name][0]
    expected = torch.zeros_like(moved)
    expected[pos] = 2 * value * tc.W_dec[layer, feature]
    torch.testing.assert_close(moved, expected, atol=1e-5, rtol=1e-4)
    assert not torch.equal(after.logits, before.logits)


def test_a_rescaled_set_intervenes_as_its_unfolded_twin() -> None:
    """Trained sets keep their decoder-norm scaling: interventions read them as the
    equivalent set with unit rows."""
    model, tc = small_model("gpt2"), small_transcoders("relu")
    scaled = type(tc)(dataclasses.replace(tc.config, rescale_acts_by_decoder_norm=True))
    scaled.load_state_dict(tc.state_dict())
    with torch.no_grad():
        scaled.W_dec.mul_(torch.rand(3, 40, 1) + 0.5)
    plain = scaled.unfolded()
    change = [(1, 2, 7, 1.5)]
    for direct in (False, True):
        a = intervene(model, scaled, IDS, change, direct=direct)
        b = intervene(model, plain, IDS, change, direct=direct)
        torch.testing.assert_close(a.logits, b.logits)
        torch.testing.assert_close(a.evidence, b.evidence)


def test_a_change_at_a_block_without_a_transcoder_is_one_line() -> None:
    model = small_model("gpt2")
    tc = small_transcoders("relu")
    with pytest.raises(ValueError, match=r"no transcoder at block 7; these cover \[0, 1, 2\]"):
        intervene(model, tc, IDS, [(7, 1, 0, 0.0)])
