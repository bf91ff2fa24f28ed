"""Where a Vision Transformer looks: its attention drawn over the image.

``image_attention(model, image)`` runs one forward pass reading every layer's weights at its
``hook_pattern`` and keeps, per layer and head, the attention the class token pays to each
patch (with mean pooling, which has no class token: the attention each patch receives,
averaged over every query), laid out on the patch grid. It also computes the attention
*rollout* (Abnar & Zuidema 2020): each layer's head-averaged weights, plus the identity for
the residual connection and renormalised, multiplied from the first layer to the last, which
estimates how much of each patch reaches the class token through all the layers together.


``plot_image_attention`` draws the image and the rollout in the first row, then a row per
layer and a column per head, each map over the picture, one patch a square of colour.

Shapes: L layers, H heads, T tokens (N patches, after the class token if any), rows × cols
the patch grid.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from glassformer.models.base import PretrainedModel


@dataclass(frozen=True)
class ImageAttention:
    """One image's attention maps.

    Attributes:
        image: (C, H, W), pixels 0..1.
        per_head: (L, H, rows, cols): what the class token (or, with mean pooling, the
            average query) pays each patch, in each layer and head.
        rollout: (rows, cols): the same across all layers (attention rollout).
        reader: "class token" or "mean of queries": whose attention ``per_head`` shows.
        patch_size: pixels per patch side.
        label: the model's verdict, and ``probability`` its probability.
    """

    image: Tensor
    per_head: Tensor
    rollout: Tensor
    reader: str
    patch_size: int
    label: str
    probability: float


def attention_rollout(weights: Tensor) -> Tensor:
    """(L, H, T, T) attention weights → (T, T): how much each token (column) reaches each
    token (row) after all L layers, heads averaged and the residual stream counted."""
    T = weights.size(-1)
    eye = torch.eye(T, dtype=weights.dtype, device=weights.device)
    result = eye
    for layer in weights:  # (H, T, T)
        mixed = layer.mean(dim=0) + eye  # (T, T): attention plus the residual path
        mixed = mixed / mixed.sum(dim=-1, keepdim=True)
        result = mixed @ result  # (T, T)
    return result


@torch.no_grad()
def image_attention(
    model: PretrainedModel, image: Tensor, labels: list[str] | None = None
) -> ImageAttention:
    """Run ``model`` (a ``VisionTransformer``) on ``image`` (C, H, W) and return its
    attention per layer and head and its rollout, each on the patch grid."""
    was_training = model.training
    model.eval()
    out, cache = model.run_with_cache(image[None], names="*.hook_pattern")
    model.train(was_training)
    weights = cache.stack("blocks.*.attn.hook_pattern")[:, 0].float()  # (L, H, T, T)
    cls = model.config.pooling == "cls"
    rows, cols = model.config.grid
    if cls:  # the class token (query 0) looking at the patches (keys 1..N)
        per_head, reach = weights[:, :, 0, 1:], attention_rollout(weights)[0, 1:]
    else:  # no class token: what each patch receives, averaged over the queries
        per_head, reach = weights.mean(dim=2), attention_rollout(weights).mean(dim=0)
    probs = out.logits[0].float().softmax(-1)
    k = int(probs.argmax())
    return ImageAttention(
        image=image.float().cpu(),
        per_head=per_head.reshape(*per_head.shape[:2], rows, cols).cpu(),  # (L, H, rows, cols)
        rollout=reach.reshape(rows, cols).cpu(),
        reader="class token" if cls else "mean of queries",
        patch_size=model.config.patch_size,
        label=labels[k] if labels else str(k),
        probability=float(probs[k]),
    )


def upsample(grid: Tensor, patch_size: int) -> Tensor:
    """(rows, cols) → (rows·P, cols·P): each patch's value on each of its pixels."""
    return grid.repeat_interleave(patch_size, dim=0).repeat_interleave(patch_size, dim=1)


def plot_image_attention(att: ImageAttention, *, alpha: float = 0.6):
    """A matplotlib Figure: the image and the rollout, then a row per layer and a column per
    head, each map drawn over the picture (one colour scale per map, its own maximum)."""
    import matplotlib

    matplotlib.use("Agg")  # files only, no display needed
    import matplotlib.pyplot as plt

    num_layers, num_heads = att.per_head.shape[:2]
    columns = max(num_heads, 2)
    fig, axes = plt.subplots(
        num_layers + 1,
        columns,
        figsize=(1.9 * columns + 0.4, 1.9 * (num_layers + 1) + 0.6),
        squeeze=False,
        layout="constrained",
    )
    for ax in axes.flat:
        ax.set_axis_off()
    _picture(axes[0][0], att.image)
    axes[0][0].set_title(f"{att.label} ({att.probability:.2f})", fontsize=9)
    _overlay(axes[0][1], att, att.rollout, alpha)
    axes[0][1].set_title("rollout, all layers", fontsize=9)
    for li in range(num_layers):
        for hi in range(num_heads):
            _overlay(axes[li + 1][hi], att, att.per_head[li, hi], alpha)
            axes[li + 1][hi].set_title(f"layer {li + 1} · head {hi + 1}", fontsize=8)
    fig.suptitle(f"where the {att.reader} looks", fontsize=11)
    return fig


def _picture(ax, image: Tensor) -> None:
    if image.size(0) == 1:
        ax.imshow(image[0].numpy(), cmap="gray", vmin=0.0, vmax=1.0, interpolation="nearest")
    else:
        ax.imshow(image.permute(1, 2, 0).clamp(0, 1).numpy(), interpolation="nearest")


def _overlay(ax, att: ImageAttention, grid: Tensor, alpha: float) -> None:
    """The picture, and over it ``grid`` (rows, cols), each patch one square of colour."""
    _picture(ax, att.image)
    values = upsample(grid, att.patch_size)  # (H, W)
    ax.imshow(values.numpy(), cmap="inferno", alpha=alpha, vmin=0.0, interpolation="nearest")
