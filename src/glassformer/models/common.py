"""What the models' forwards share: pooling the states into one vector, and the loss."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

POOLING = ("mean", "cls", "max")  # and "last", a causal model's


def pool(x: Tensor, mask: Tensor | None, pooling: str) -> Tensor:
    """(B, T, D) → (B, D) by ``pooling``, ignoring padded positions: "mean" or "max" over
    the real tokens, "cls" (the first position), or "last" (each row's last real token:
    the only one that has read the whole text in a causal model).

    ``mask`` is a padding mask whose last dimension is T (True for real tokens), or None.
    A row with no real token pools to zeros (by "mean" and "max").
    """
    if pooling == "cls":
        return x[:, 0]
    if pooling == "last":
        B, T = x.shape[:2]
        if mask is None:
            return x[:, -1]
        real = mask.reshape(B, T)
        last = (real * torch.arange(T, device=x.device)).argmax(dim=1)  # (B,) last real token
        return x[torch.arange(B, device=x.device), last]  # (B, D)
    if mask is None:
        return x.mean(dim=1) if pooling == "mean" else x.amax(dim=1)
    real = mask.reshape(mask.size(0), -1, 1).to(x.dtype)  # (B, T, 1), 1 for real tokens
    if pooling == "mean":
        return (x * real).sum(dim=1) / real.sum(dim=1).clamp(min=1)
    pooled = x.masked_fill(real == 0, torch.finfo(x.dtype).min).amax(dim=1)  # (B, D)
    return pooled.masked_fill(real.sum(dim=1) == 0, 0.0)


def cross_entropy(logits: Tensor, labels: Tensor, ignore_index: int | None) -> Tensor:
    """Mean cross-entropy over positions whose label is not ``ignore_index``.

    logits (..., V) and labels (...) are flattened; pass -100 or the pad id to ignore.
    """
    return F.cross_entropy(
        logits.reshape(-1, logits.size(-1)).float(),
        labels.reshape(-1),
        ignore_index=-100 if ignore_index is None else ignore_index,
    )
