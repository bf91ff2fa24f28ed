"""Integrated gradients (glassformer.inspect.integrated): completeness within 1% at 64
steps on a model far from linear, where a crude quadrature is not; the baseline and the
method chosen by the caller; a classifier, a translator's source and a ViT's patches."""

from __future__ import annotations

import pytest
import torch

from glassformer import (
    GPT,
    GPTConfig,
    Seq2SeqConfig,
    Seq2SeqTransformer,
    VisionTransformer,
    ViTConfig,
)
from glassformer.inspect import integrated_gradients, logit_difference
from glassformer.inspect.integrated import quadrature


def curved_gpt() -> GPT:
    """A GPT whose logits are far from linear in its embeddings: weights scaled up."""
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=20, max_len=16, d_model=32, num_heads=4, num_layers=2,
                          d_ff=64, dropout=0.0, norm_first=True)).eval()  # fmt: skip
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 2:
                p.mul_(12)
    return model


def test_completeness_within_one_percent_at_64_steps():
    model = curved_gpt()
    ids = torch.tensor([[3, 7, 1, 12, 5, 9]])
    metric = logit_difference(3, 4)
    result = integrated_gradients(model, ids, metric, steps=64)
    change = result.value - result.baseline_value
    assert abs(change) > 1.0
    assert abs(result.delta) < 0.01 * abs(change)
    assert float(result.per_token.sum()) == pytest.approx(change, rel=0.01)
    # the integral is not trivial here: two midpoints miss completeness by far more
    crude = integrated_gradients(model, ids, metric, steps=2, method="midpoint")
    assert abs(crude.delta) > 0.05 * abs(change)
    midpoint = integrated_gradients(model, ids, metric, steps=64, method="midpoint")
    assert abs(midpoint.delta) < 0.01 * abs(change)
    assert result.attributions.shape == (6, 32) and result.per_token.shape == (6,)


def test_the_baseline_is_the_callers_and_zero_inputs_give_zero():
    """A baseline of pad tokens: the attributions sum to F(input) − F(pad input); where the
    input equals the baseline, that token's attribution is exactly zero."""
    model = curved_gpt()
    ids = torch.tensor([[3, 7, 1, 12, 5, 9]])
    baseline = ids.clone()
    baseline[0, 1:4] = 2  # (not the pad id 0: the mask stays the input's)
    metric = logit_difference(3, 4)
    result = integrated_gradients(model, ids, metric, baseline=baseline, steps=64)
    with torch.no_grad():
        far = float(metric(model(ids).logits)) - float(metric(model(baseline).logits))
    assert result.value - result.baseline_value == pytest.approx(far, abs=1e-4)
    assert abs(result.delta) < 0.01 * abs(far)
    assert (result.per_token[[0, 4, 5]] == 0).all() and (result.per_token[1:4] != 0).all()
    embedding = (
        model.embed.weight[baseline[0]][None] * 0.5
    )  # a float baseline, the embedding's shape
    half = integrated_gradients(model, ids, metric, baseline=embedding.detach(), steps=64)
    assert abs(half.delta) < 0.01 * abs(half.value - half.baseline_value)


def test_a_translators_source_and_a_vits_patches():
    torch.manual_seed(0)
    translator = Seq2SeqTransformer(Seq2SeqConfig.preset(
        "tiny", src_vocab_size=20, tgt_vocab_size=20, max_len=16, dropout=0.0)).eval()  # fmt: skip
    source, target = torch.tensor([[4, 5, 6, 7]]), torch.tensor([[1, 8, 9]])
    # ReLU's kinks (and a post-norm block's norm near zero embeddings) make the integrand
    # rough: 64 steps miss completeness by 1.7% here, 256 by 0.2%
    result = integrated_gradients(translator, (source, target), logit_difference(3, 4), steps=256)
    assert result.attributions.shape == (4, translator.config.d_model)
    assert abs(result.delta) < 0.01 * abs(result.value - result.baseline_value)
    shape = dict(d_model=32, num_heads=4, num_layers=2, d_ff=64, dropout=0.0)
    vit = VisionTransformer(ViTConfig(image_size=8, patch_size=2, num_classes=3, **shape)).eval()
    image = torch.rand(1, 1, 8, 8)
    patches = integrated_gradients(vit, image, logit_difference(0, 1))
    assert patches.per_token.shape[0] == 16  # 4 × 4 patches
    assert abs(patches.delta) < 0.01 * abs(patches.value - patches.baseline_value)


def test_bad_requests_are_one_line():
    model = curved_gpt()
    ids = torch.tensor([[3, 7, 1]])
    with pytest.raises(ValueError, match="steps must be at least 1"):
        integrated_gradients(model, ids, logit_difference(1, 2), steps=0)
    with pytest.raises(ValueError, match="method must be one of"):
        quadrature(8, "simpson")


def rms_gpt() -> GPT:
    """SmolLM2's shape in small (RMSNorm, rotary, no position embeddings) with small
    embeddings: the norms see the embeddings' scale only near zero, so F along the straight
    path from zero barely moves until α is small, then turns sharply."""
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=20, max_len=16, d_model=32, num_heads=4, num_layers=2,
                          d_ff=64, dropout=0.0, norm="rms", positional="rope",
                          activation="swiglu")).eval()  # fmt: skip
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() == 2 and not name.startswith("embed"):
                p.mul_(8)  # far from linear
        model.embed.weight.mul_(0.3)
        for block in model.blocks:
            block.ln1.eps = block.ln2.eps = 1e-5
    return model


def by_pieces(model, ids, metric) -> torch.Tensor:
    """Integrated gradients from zero embeddings written out here: 16 Gauss–Legendre points
    on each of 80 stretches of the path, of geometric lengths from 10⁻⁸ to 1: (T, D)."""
    _, cache = model.run_with_cache(ids, names=["hook_embed"])
    x = cache["hook_embed"]
    edges = [0.0, *torch.logspace(-8, 0, 81, dtype=torch.float64).tolist()]
    nodes, weights = quadrature(16, "gausslegendre")
    total = torch.zeros_like(x)
    for a, b in zip(edges, edges[1:], strict=False):
        for alpha, weight in zip((a + (b - a) * nodes).tolist(), ((b - a) * weights).tolist(),
                                 strict=True):  # fmt: skip
            e = (alpha * x).requires_grad_()
            out = model.run_with_hooks(ids, hooks=[("hook_embed", lambda value, name, e=e: e)])
            (grad,) = torch.autograd.grad(metric.tensor(out.logits), e)
            total += weight * grad
    return (x * total)[0]


def test_the_adaptive_quadrature_follows_a_sharp_turn_to_one_percent():
    """Where 64 Gauss–Legendre points miss completeness by more than the change itself, and
    8,192 midpoints by over 1%, the adaptive quadrature meets 1% with a few dozen points, and
    each token's share is that of a fine quadrature on geometric stretches."""
    model = rms_gpt()
    ids = torch.tensor([[3, 7, 1, 12, 5, 9]])
    metric = logit_difference(3, 4)
    fixed = integrated_gradients(model, ids, metric, steps=64)
    change = fixed.value - fixed.baseline_value
    assert abs(change) > 1e-2 and abs(fixed.delta) > abs(change)
    fine = integrated_gradients(model, ids, metric, steps=8192, method="midpoint")
    assert abs(fine.delta) > 0.01 * abs(change)
    adaptive = integrated_gradients(model, ids, metric, steps=1024, method="adaptive")
    assert abs(adaptive.delta) < 0.001 * abs(change) and 40 <= adaptive.steps <= 400
    reference = by_pieces(model, ids, metric)
    assert abs(float(reference.sum()) - change) < 1e-3 * abs(change)
    torch.testing.assert_close(adaptive.per_token, reference.sum(-1), atol=0.01 * abs(change),
                               rtol=0)  # fmt: skip
    with pytest.raises(ValueError, match="steps must be at least that, got 16"):
        integrated_gradients(model, ids, metric, steps=16, method="adaptive")
