"""Normalisation layers: LayerNorm (torch's) and RMSNorm (Llama's), each with its output
on a hook point, ``hook_normalized``.

Shapes: (B, T, D) → (B, T, D); each position is normalised over its D features.

RMSNorm (Zhang & Sennrich, 2019) drops LayerNorm's mean subtraction and bias:

    y = x / sqrt(mean(x²) + eps) · weight

As in Hugging Face's ``LlamaRMSNorm``, the statistics are taken in float32 and the
result is cast back to the input's dtype before the weight is applied, so bf16/fp16
models give the same numbers as theirs.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from glassformer.modules.hooks import HookPoint

NORMS = ("layer", "rms")


def make_norm(kind: str, d_model: int, *, eps: float = 1e-5, bias: bool = True) -> nn.Module:
    """The norm a config names: "layer" (``LayerNorm``) or "rms" (``RMSNorm``, no bias)."""
    if kind == "layer":
        return LayerNorm(d_model, eps=eps, bias=bias)
    if kind == "rms":
        return RMSNorm(d_model, eps=eps)
    raise ValueError(f"norm must be one of {list(NORMS)}, got {kind!r}")


class LayerNorm(nn.LayerNorm):
    """``nn.LayerNorm`` (the same parameters and numbers) whose output passes a hook point,
    ``hook_normalized``."""

    def __init__(self, d_model: int, *, eps: float = 1e-5, bias: bool = True) -> None:
        super().__init__(d_model, eps=eps, bias=bias)
        self.hook_normalized = HookPoint()

    def forward(self, x: Tensor) -> Tensor:
        """(B, T, D) → (B, T, D)."""
        y = F.layer_norm(x, self.normalized_shape, self.weight, self.bias, self.eps)
        return self.hook_normalized(y)


class RMSNorm(nn.Module):
    """Root-mean-square normalisation with a learned per-feature scale (no bias).

    Args:
        d_model: D, the width normalised over.
        eps: added to the mean square inside the square root.
    """

    def __init__(self, d_model: int, eps: float = 1e-6) -> None:
        super().__init__()
        if d_model <= 0:
            raise ValueError(f"d_model must be a positive integer, got {d_model}")
        if eps < 0:
            raise ValueError(f"eps must be non-negative, got {eps}")
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(d_model))
        self.hook_normalized = HookPoint()  # the output

    def forward(self, x: Tensor) -> Tensor:
        """(B, T, D) → (B, T, D)."""
        dtype = x.dtype
        x32 = x.float()
        mean_square = x32.pow(2).mean(dim=-1, keepdim=True)  # (B, T, 1)
        normalised = x32 * torch.rsqrt(mean_square + self.eps)  # (B, T, D)
        return self.hook_normalized(self.weight * normalised.to(dtype))

    def extra_repr(self) -> str:
        return f"{self.weight.numel()}, eps={self.eps}"
