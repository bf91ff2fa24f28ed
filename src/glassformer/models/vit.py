"""Vision Transformer (Dosovitskiy et al., "An Image is Worth 16x16 Words"): patches as tokens.

images (B, C, H, W) → P × P patches, each a vector (B, N, D) → + positions → [class token]
→ the same encoder layers as the text models → pool (the class token, or the mean) → linear
→ (B, num_classes).

Shapes: B batch, C channels, H × W pixels, P patch side, N = (H/P)·(W/P) patches, D d_model.
Pixels are floats, 0 to 1 (``glassformer.data.images`` reads files that way).

The class token is one learned vector put before the patches; it has no position of its
own (with learned positions its own would add one constant to the same learned vector).
Every image has all its patches, so nothing is ever masked.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Literal

import torch
from torch import Tensor, nn

from glassformer.errors import shown
from glassformer.models import parts
from glassformer.models.backbone import Backbone
from glassformer.models.base import Activation, ConfigBase, ModelOutput, Norm
from glassformer.models.common import cross_entropy, pool
from glassformer.modules.hooks import HookPoint
from glassformer.modules.patches import PatchEmbedding, SinusoidalGridEncoding, check_patches
from glassformer.modules.position import LearnedPositionalEmbedding

ImagePooling = Literal["cls", "mean"]


@dataclass(kw_only=True)
class ViTConfig(ConfigBase):
    """Configuration of ``VisionTransformer``.

    Attributes:
        image_size: the images' side in pixels, or (height, width).
        patch_size: P, the side of a square patch; must divide both sides.
        channels: 1 (grey) or 3 (RGB), or any other count.
        num_classes: how many classes.
        pooling: "cls" (a learned class token, read at the end) or "mean" over the patches.
        positional: "learned" (a vector per patch) or "sinusoidal" (the paper's sinusoids
            along rows and along columns, ``SinusoidalGridEncoding``; D divisible by 4).

    The other fields are as in ``ModelConfig``; a ViT is pre-norm with GELU.
    """

    image_size: int | tuple[int, int]
    num_classes: int
    patch_size: int = 2
    channels: int = 1
    d_model: int = 64
    num_heads: int = 4
    head_dim: int | None = None
    num_layers: int = 4
    d_ff: int = 128
    dropout: float = 0.1
    attention_dropout: float = 0.0
    activation: Activation = "gelu"
    norm_first: bool = True
    positional: Literal["learned", "sinusoidal"] = "learned"
    pooling: ImagePooling = "cls"
    qkv_bias: bool = True
    norm: Norm = "layer"
    layer_norm_eps: float = 1e-5
    bias: bool = True

    PRESETS: ClassVar[dict] = {
        "tiny": dict(d_model=32, num_heads=2, num_layers=2, d_ff=64),
        "small": dict(d_model=64, num_heads=4, num_layers=4, d_ff=128),
        # DeiT-Ti's width and depth (192 wide, 3 heads, 12 layers)
        "base": dict(d_model=192, num_heads=3, num_layers=12, d_ff=768),
    }

    def __post_init__(self) -> None:
        size = self.image_size  # an int, a pair, or a list (from JSON)
        pair = (size, size) if isinstance(size, int) else tuple(size)
        check_patches(pair, self.patch_size)
        self.image_size = (pair[0], pair[1])
        if not isinstance(self.channels, int) or self.channels <= 0:
            raise ValueError(f"channels must be a positive integer, got {shown(self.channels)}")
        self._check()
        if self.pooling not in ("cls", "mean"):
            raise ValueError(f"pooling must be one of ['cls', 'mean'], got {shown(self.pooling)}")
        if self.positional == "sinusoidal" and self.d_model % 4:
            raise ValueError(
                f"2-D sinusoidal positions need d_model divisible by 4, got {self.d_model}"
            )

    @property
    def grid(self) -> tuple[int, int]:
        """(rows, columns) of patches."""
        h, w = self.image_size  # type: ignore[misc]  # a pair after __post_init__
        return h // self.patch_size, w // self.patch_size

    @property
    def num_patches(self) -> int:
        return self.grid[0] * self.grid[1]

    @property
    def max_len(self) -> int:
        """The sequence the encoder reads: the patches, and the class token if any."""
        return self.num_patches + (self.pooling == "cls")


class VisionTransformer(Backbone):
    """Classify images: patches as tokens, glassformer's own blocks on top."""

    kind = "vit"
    config_class = ViTConfig
    config: ViTConfig
    HEADS = ("head",)

    def __init__(self, config: ViTConfig) -> None:
        super().__init__(config, **vit_parts(config))
        c = config
        if c.positional == "learned":
            nn.init.normal_(self.pos_embed.weight, std=0.02)
        self.cls_token = nn.Parameter(torch.zeros(1, 1, c.d_model)) if c.pooling == "cls" else None
        self.head = nn.Linear(c.d_model, c.num_classes)
        self.hook_pooled = HookPoint()  # the vector the head reads, (B, D)
        self.hook_logits = HookPoint()  # (B, num_classes)

    def embed_images(self, images: Tensor) -> Tensor:
        """images (B, C, H, W) → the stream the first block reads: the patch vectors with
        their positions, after the class token if there is one, (B, T, D)."""
        x = self.hook_embed(self.embed(images))  # (B, N, D)
        x = x + self.hook_pos_embed(self.pos_embed.rows(x))
        if self.cls_token is not None:
            cls = self.cls_token.expand(x.size(0), -1, -1)  # (B, 1, D)
            x = torch.cat([cls, x], dim=1)  # (B, 1 + N, D)
        return self.dropout(x)

    def forward(  # type: ignore[override]
        self, images: Tensor, *, labels: Tensor | None = None, need_weights: bool = False
    ) -> ModelOutput:
        """Classify a batch of images.

        Args:
            images: (B, C, H, W) floats, pixels 0 to 1.
            labels: class indices (B,); when given, ``loss`` is their cross-entropy.
            need_weights: return every layer's attention weights, (B, H, T, T) each, where
                T = N patches, after the class token (position 0) if there is one.
        """
        x = self.embed_images(images)
        x, attentions, _ = self.run_stack(x, None, need_weights=need_weights)
        pooled = self.hook_pooled(pool(x, None, self.config.pooling))  # (B, D)
        logits = self.hook_logits(self.head(pooled))  # (B, num_classes)
        loss = None if labels is None else cross_entropy(logits, labels, None)
        return ModelOutput(logits, loss, encoder_attentions=attentions)


def vit_parts(c: ViTConfig) -> dict:
    """A ViT's parts: the patch embedding, positions on the patch grid, pre-norm blocks."""
    pos_embed: nn.Module
    if c.positional == "sinusoidal":
        pos_embed = SinusoidalGridEncoding(d_model=c.d_model, grid=c.grid)
    else:
        pos_embed = LearnedPositionalEmbedding(max_len=c.num_patches, d_model=c.d_model)
    embed = PatchEmbedding(
        image_size=c.image_size,  # type: ignore[arg-type]  # a pair after __post_init__
        patch_size=c.patch_size,
        channels=c.channels,
        d_model=c.d_model,
    )
    return dict(
        embed=embed,
        pos_embed=pos_embed,
        blocks=parts.blocks(c, c.num_layers, causal=False),
        ln_final=parts.norm(c) if c.norm_first else None,
        max_len=c.max_len,
        dropout=c.dropout,
    )
