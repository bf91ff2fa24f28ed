"""Normalisation layers: LayerNorm (torch's) and RMSNorm (Llama's), each with its output
on a hook point, ``hook_normalized``.

Shapes: (B, T, D) → (B, T, D); each position is normalised over its D features.

RMSNorm (Zhang & Sennrich, 2019) drops LayerNorm's mean subtraction and bias:

    y = x / sqrt(mean(x²) + eps) · weight

As in Hugging Face's ``LlamaRMSNorm``, the statistics are taken in float32 and the
result is cast back to the input's dtype before the weight is applied, so bf16/fp16
models give the same numbers as theirs.

Gemma's RMSNorm (``norm="gemma_rms"``) stores the scale as an offset from one, so a weight
of zeros is the identity: y = x / sqrt(mean(x²) + eps) · (1 + weight), the whole product in
float32 before the cast back (as Gemma computes it).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from glassformer.modules.hooks import HookPoint

NORMS = ("layer", "rms", "gemma_rms")


def make_norm(kind: str, d_model: int, *, eps: float = 1e-5, bias: bool = True) -> nn.Module:
    """The norm a config names: "layer" (``LayerNorm``), "rms" (``RMSNorm``, no bias) or
    "gemma_rms" (``RMSNorm`` scaling by 1 + weight)."""
    if kind == "layer":
        return LayerNorm(d_model, eps=eps, bias=bias)
    if kind in ("rms", "gemma_rms"):
        return RMSNorm(d_model, eps=eps, unit_offset=kind == "gemma_rms")
    raise ValueError(f"norm must be one of {list(NORMS)}, got {kind!r}")


class LayerNorm(nn.LayerNorm):
    """``nn.LayerNorm`` (the same parameters and numbers) whose output passes a hook point,
    ``hook_normalized``; ``affine=False``: no weight or bias (OLMo's)."""

    def __init__(
        self, d_model: int, *, eps: float = 1e-5, bias: bool = True, affine: bool = True
    ) -> None:
        super().__init__(d_model, eps=eps, elementwise_affine=affine, bias=bias and affine)
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
        unit_offset: scale by 1 + weight, in float32 (Gemma's); the weight starts at zeros.
        float_weight: scale by the weight in float32, then cast (OLMo 2's rounding).
    """

    def __init__(
        self,
        d_model: int,
        eps: float = 1e-6,
        *,
        unit_offset: bool = False,
        float_weight: bool = False,
    ) -> None:
        super().__init__()
        if d_model <= 0:
            raise ValueError(f"d_model must be a positive integer, got {d_model}")
        if eps < 0:
            raise ValueError(f"eps must be non-negative, got {eps}")
        self.eps = eps
        self.unit_offset, self.float_weight = unit_offset, float_weight
        self.weight = nn.Parameter(torch.zeros(d_model) if unit_offset else torch.ones(d_model))
        self.hook_normalized = HookPoint()  # the output

    def forward(self, x: Tensor) -> Tensor:
        """(B, T, D) → (B, T, D)."""
        dtype = x.dtype
        x32 = x.float()
        mean_square = x32.pow(2).mean(dim=-1, keepdim=True)  # (B, T, 1)
        normalised = x32 * torch.rsqrt(mean_square + self.eps)  # (B, T, D)
        if self.unit_offset or self.float_weight:  # (1 + w) or w in float32, then the cast
            scale = self.weight.float() + (1.0 if self.unit_offset else 0.0)
            return self.hook_normalized((normalised * scale).to(dtype))
        return self.hook_normalized(self.weight * normalised.to(dtype))

    def extra_repr(self) -> str:
        offset = ", unit_offset=True" if self.unit_offset else ""
        return f"{self.weight.numel()}, eps={self.eps}{offset}"


class AllHeadsRMSNorm(RMSNorm):
    """An RMSNorm over every head's features at once (OLMo 2's QK-norm, one weight of
    H·Dh): (B, T, H, Dh) is normalised as (B, T, H·Dh), which its hook point sees."""

    def forward(self, x: Tensor) -> Tensor:
        """(B, T, H, Dh) → (B, T, H, Dh)."""
        return super().forward(x.flatten(-2)).view_as(x)
