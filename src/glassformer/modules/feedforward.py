"""The position-wise feed-forward network: FFN(x) = act(x W1 + b1) W2 + b2.

Shapes: (B, T, D) → (B, T, d_ff) → (B, T, D), the same two layers at every position.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import torch.nn.functional as F
from torch import Tensor, nn

from glassformer.modules.attention import check_dropout

# Activations by the name a config uses. "gelu_tanh" is GPT-2's approximation.
ACTIVATIONS: dict[str, Callable[[Tensor], Tensor]] = {
    "relu": F.relu,
    "gelu": F.gelu,
    "gelu_tanh": functools.partial(F.gelu, approximate="tanh"),
}


def check_activation(name: str) -> None:
    if name not in ACTIVATIONS:
        raise ValueError(f"activation must be one of {sorted(ACTIVATIONS)}, got {name!r}")


class FeedForward(nn.Module):
    """Two linear layers with an activation and dropout between them.

    Parameter names match ``nn.TransformerEncoderLayer`` (``linear1``, ``linear2``).

    Args:
        d_model: D.
        d_ff: the inner width (2048 in the paper, 4·D in GPT).
        dropout: dropout after the activation.
        activation: "relu" (paper), "gelu" or "gelu_tanh".
        bias: whether both linear layers have a bias.
    """

    def __init__(
        self,
        *,
        d_model: int,
        d_ff: int,
        dropout: float = 0.0,
        activation: str = "relu",
        bias: bool = True,
    ) -> None:
        super().__init__()
        check_activation(activation)
        check_dropout(dropout)
        if d_ff <= 0:
            raise ValueError(f"d_ff must be a positive integer, got {d_ff}")
        self.linear1 = nn.Linear(d_model, d_ff, bias=bias)
        self.linear2 = nn.Linear(d_ff, d_model, bias=bias)
        self.dropout = nn.Dropout(dropout)
        self.activation = activation
        self._act = ACTIVATIONS[activation]

    def forward(self, x: Tensor) -> Tensor:
        """(B, T, D) → (B, T, D)."""
        return self.linear2(self.dropout(self._act(self.linear1(x))))

    def extra_repr(self) -> str:
        return f"activation={self.activation!r}"
