"""Pieces the model assemblies share: the embedding front end, automatic masks, pooling."""

from __future__ import annotations

import torch
from torch import Tensor, nn

from glassformer.modules.hooks import HookPoint
from glassformer.modules.masks import (
    attention_mask_to_key_mask,
    auto_padding_mask,  # lives with the other masks; the models import it from here too
)
from glassformer.modules.position import ATTENTION_POSITIONAL, TokenEmbedding, positional_encoding


class Embeddings(nn.Module):
    """Token embedding (optionally ×√D), plus positions, then dropout: ids (B, T) → (B, T, D)."""

    def __init__(
        self,
        *,
        vocab_size: int,
        d_model: int,
        max_len: int,
        positional: str,
        dropout: float,
        scale: bool = False,
    ) -> None:
        super().__init__()
        self.token = TokenEmbedding(vocab_size=vocab_size, d_model=d_model, scale=scale)
        self.position: nn.Module
        if positional in ATTENTION_POSITIONAL:  # positions enter in attention (rotary)
            self.position = ATTENTION_POSITIONAL[positional](d_model=d_model, max_len=max_len)
        else:
            self.position = positional_encoding(positional, d_model=d_model, max_len=max_len)
        self.dropout = nn.Dropout(dropout)
        self.hook_embed = HookPoint()  # the token embeddings, (B, T, D)

    def forward(self, ids: Tensor, start: int = 0, positions: Tensor | None = None) -> Tensor:
        """ids (B, T) at positions ``start..start+T-1`` (or ``positions`` (B, T)) → (B, T, D)."""
        tokens = self.hook_embed(self.token(ids))
        return self.dropout(self.position(tokens, start, positions))  # (B, T, D)


def layer_options(c) -> dict:
    """The keyword arguments every encoder/decoder layer takes, read from a model config."""
    return dict(
        d_model=c.d_model,
        num_heads=c.num_heads,
        d_ff=c.d_ff,
        dropout=c.dropout,
        attention_dropout=c.attention_dropout,
        activation=c.activation,
        norm_first=c.norm_first,
        head_dim=c.head_dim,
        qkv_bias=c.qkv_bias and getattr(c, "bias", True),
        bias=getattr(c, "bias", True),
        attention_window=getattr(c, "attention_window", None),  # a ViT attends densely
        global_tokens=getattr(c, "global_tokens", 0),
    )


def key_mask(
    ids: Tensor,
    pad_id: int | None,
    mask: Tensor | None = None,
    attention_mask: Tensor | None = None,
    *,
    cached: int = 0,
    names: tuple[str, str] = ("mask", "attention_mask"),
) -> Tensor | None:
    """The key mask (B, 1, 1, Tk) for ``ids`` (B, T), from whichever mask the caller gave.

    ``mask`` (boolean, True = may attend) is used as given. Hugging Face's
    ``attention_mask`` (B, Tk) of 1/0 is checked and converted; it covers ``cached``
    tokens before ``ids``. With neither, keys holding ``pad_id`` are masked (none when
    ``pad_id`` is None). Giving both is an error. None means nothing is masked, which
    lets attention take its fastest path.
    """
    if attention_mask is None:
        return auto_padding_mask(ids, pad_id) if mask is None else mask
    if mask is not None:
        raise ValueError(f"give {names[0]} or {names[1]}, not both")
    keys = attention_mask_to_key_mask(attention_mask, ids, cached=cached, name=names[1])
    return None if keys.all() else keys


POOLING = ("mean", "cls", "max")


def pool(x: Tensor, mask: Tensor | None, pooling: str) -> Tensor:
    """(B, T, D) → (B, D) by ``pooling`` ("mean", "cls" or "max"), ignoring padded positions.

    ``mask`` is a padding mask whose last dimension is T (True for real tokens), or None.
    A row with no real token pools to zeros.
    """
    if pooling == "cls":
        return x[:, 0]
    if mask is None:
        return x.mean(dim=1) if pooling == "mean" else x.amax(dim=1)
    real = mask.reshape(mask.size(0), -1, 1).to(x.dtype)  # (B, T, 1), 1 for real tokens
    if pooling == "mean":
        return (x * real).sum(dim=1) / real.sum(dim=1).clamp(min=1)
    pooled = x.masked_fill(real == 0, torch.finfo(x.dtype).min).amax(dim=1)  # (B, D)
    return pooled.masked_fill(real.sum(dim=1) == 0, 0.0)
