"""Rotary position embedding (RoPE, Su et al. 2021), as Llama applies it.

Shapes: B batch, H heads, T positions, Dh head width (even).

Instead of adding a position vector to the token embedding, RoPE turns each query and
key inside attention: the pair of features (i, i + Dh/2) of a vector at position p is
rotated by the angle p · θ_i, where θ_i = rope_theta^(-2i/Dh). A dot product between a
query at p and a key at p' then depends on p − p' only.

The pairing (i, i + Dh/2) is Hugging Face Llama's ``rotate_half`` convention, so its
q/k projection weights load without any permutation of rows. GPT-J pairs neighbours
instead, (2i, 2i + 1) (``interleaved=True``: the paper's own layout). Checkpoints made to read
past their training context scale θ_i (Llama 3, YaRN, LongRoPE, ...): a ``scaling`` rule
from ``modules.rope_scaling``.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import Tensor, nn

from glassformer.modules.rope_scaling import RopeScaling, frequencies


class RotaryAngles(NamedTuple):
    """The cosines and sines of the rotation angles of some positions, each (B or 1, 1, T,
    Dh): computed once per forward by the model, they turn every layer's q and k; and which
    features are paired (``interleaved``: 2i with 2i + 1; else i with i + Dh/2)."""

    cos: Tensor
    sin: Tensor
    interleaved: bool = False


def rotate_half(x: Tensor) -> Tensor:
    """(..., Dh) → (..., Dh): [x1, x2] ↦ [−x2, x1], the halves being Dh/2 wide."""
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def rotate_pairs(x: Tensor) -> Tensor:
    """(..., Dh) → (..., Dh): each neighbouring pair (a, b) ↦ (−b, a) (GPT-J's layout)."""
    a, b = x[..., 0::2], x[..., 1::2]
    return torch.stack((-b, a), dim=-1).flatten(-2)


class RotaryEmbedding(nn.Module):
    """Rotates queries and keys by their positions. No parameters.

    Args:
        head_dim: Dh, the width of one head (even).
        theta: the base ``rope_theta`` (10000 in the paper and Llama 2; larger values
            stretch the wavelengths for longer contexts).
        scaling: how the frequencies are scaled for a longer context (``RopeScaling``),
            or None.
        interleaved: pair features (2i, 2i + 1), as GPT-J does, instead of (i, i + Dh/2).
    """

    inv_freq: Tensor

    def __init__(
        self,
        head_dim: int,
        theta: float = 10000.0,
        scaling: RopeScaling | None = None,
        *,
        interleaved: bool = False,
    ) -> None:
        super().__init__()
        if head_dim <= 0 or head_dim % 2 != 0:
            raise ValueError(f"rotary embedding needs an even head_dim, got {head_dim}")
        if theta <= 0:
            raise ValueError(f"rope_theta must be positive, got {theta}")
        self.head_dim = head_dim
        self.theta = theta
        self.scaling = scaling
        self.interleaved = interleaved
        self.attention_factor = 1.0  # what cos and sin are multiplied by (yarn, longrope)
        # Not saved in the state dict: it follows from the config.
        self.register_buffer("inv_freq", self._frequencies(), persistent=False)  # (Dh/2,)

    def _frequencies(self, length: Tensor | None = None) -> Tensor:
        """θ_i, (Dh/2,): for the context trained on, or for ``length`` positions read."""
        if self.scaling is not None:
            theta, self.attention_factor = frequencies(
                self.scaling, self.theta, self.head_dim, length
            )
            return theta
        # on the CPU, then the default device: on the meta device PyTorch computes these
        # through its Python references, which import TorchDynamo (74 MiB, a second)
        exponents = torch.arange(0, self.head_dim, 2, device="cpu").float() / self.head_dim
        return (1.0 / self.theta**exponents).to(torch.get_default_device())  # (Dh/2,)

    def reset_buffers(self) -> None:
        """Compute the frequencies again (on the CPU): for a model built on the meta device
        and given its weights afterwards, which do not hold them."""
        self.inv_freq = self._frequencies()

    def forward(self, x: Tensor, positions: Tensor) -> Tensor:
        """Rotate ``x`` (B, H, T, Dh) by ``positions`` (B, T) or (T,); same shape back."""
        return self.rotate(x, self.cos_sin(positions, x.dtype))

    def cos_sin(self, positions: Tensor, dtype: torch.dtype) -> RotaryAngles:
        """The cosines and sines of ``positions`` (B, T) or (T,): each (B or 1, 1, T, Dh),
        in ``dtype``; computed once, they rotate every layer's q and k (``rotate``)."""
        if positions.dim() == 1:
            positions = positions.unsqueeze(0)  # (1, T)
        theta = self.inv_freq
        if self.scaling is not None and self.scaling.varies:  # by the length read
            theta = self._frequencies((positions.max() + 1).cpu()).to(positions.device)
        # Angles in float32 whatever x's dtype, as Hugging Face does.
        angles = positions.float()[..., None] * theta.float()  # (B, T, Dh/2)
        if self.interleaved:  # (B, T, Dh): pair 2i with 2i + 1
            angles = angles.repeat_interleave(2, dim=-1)
        else:  # (B, T, Dh): pair i with i + Dh/2
            angles = torch.cat((angles, angles), dim=-1)
        cos, sin = angles.cos(), angles.sin()
        if self.attention_factor != 1.0:  # yarn, longrope: sharper attention
            cos, sin = cos * self.attention_factor, sin * self.attention_factor
        cos, sin = cos.to(dtype).unsqueeze(1), sin.to(dtype).unsqueeze(1)  # (B, 1, T, Dh)
        return RotaryAngles(cos, sin, self.interleaved)

    @staticmethod
    def rotate(x: Tensor, angles: RotaryAngles) -> Tensor:
        """``x`` (B, H, T, Dh) rotated by ``angles`` (``cos_sin``). Angles narrower than
        Dh (partial rotary, GPT-NeoX's ``rotary_pct``) turn the first features only."""
        width = angles.cos.size(-1)
        if width < x.size(-1):
            turned = RotaryEmbedding.rotate(x[..., :width], angles)
            return torch.cat((turned, x[..., width:]), dim=-1)
        turn = rotate_pairs if angles.interleaved else rotate_half
        return x * angles.cos + turn(x) * angles.sin

    def extra_repr(self) -> str:
        scaled = "" if self.scaling is None else f", scaling={self.scaling.rope_type}"
        paired = ", interleaved=True" if self.interleaved else ""
        return f"head_dim={self.head_dim}, theta={self.theta}{scaled}{paired}"
