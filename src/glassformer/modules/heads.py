"""Head geometry: its checks, splitting a projection into heads, and a slice of a linear
layer's output rows (q alone, or k and v alone, of a stacked q/k/v projection).

Shapes: B batch, T length, H heads, Dh the width of one head.
"""

from __future__ import annotations

from typing import Any, cast

import torch.nn.functional as F
from torch import Tensor, nn


def linear_rows(layer: nn.Module, x: Tensor, start: int, stop: int) -> Tensor:
    """Output features ``start:stop`` of the linear ``layer`` applied to ``x``: a slice of
    the weight's rows, or what a layer standing in for ``nn.Linear`` offers for it
    (``forward_rows``)."""
    if isinstance(layer, nn.Linear):
        b = None if layer.bias is None else layer.bias[start:stop]
        return F.linear(x, layer.weight[start:stop], b)
    return cast(Any, layer).forward_rows(x, start, stop)


def split_heads(x: Tensor, num_heads: int) -> Tensor:
    B, T, inner = x.shape
    return x.view(B, T, num_heads, inner // num_heads).transpose(1, 2)  # (B, H, T, Dh)


def check_heads(d_model: int, num_heads: int, head_dim: int | None) -> int:
    """Validate the head geometry and return the head width Dh."""
    if d_model <= 0:
        raise ValueError(f"d_model must be a positive integer, got {d_model}")
    if num_heads <= 0:
        raise ValueError(f"num_heads must be a positive integer, got {num_heads}")
    if head_dim is None:
        if d_model % num_heads != 0:
            raise ValueError(
                f"d_model={d_model} is not divisible by num_heads={num_heads}; "
                "choose another num_heads or set head_dim explicitly"
            )
        return d_model // num_heads
    if head_dim <= 0:
        raise ValueError(f"head_dim must be a positive integer or None, got {head_dim}")
    return head_dim


def check_dropout(p: float, name: str = "dropout") -> None:
    if not 0.0 <= p < 1.0:
        raise ValueError(f"{name} must be in [0, 1), got {p}")
