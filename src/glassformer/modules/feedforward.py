"""The position-wise feed-forward network: FFN(x) = act(x W1 + b1) W2 + b2,
and its gated form (SwiGLU, Llama's MLP): down(silu(gate(x)) · up(x)).

Shapes: (B, T, D) → (B, T, d_ff) → (B, T, D), the same layers at every position.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import torch.nn.functional as F
from torch import Tensor, nn

from glassformer.modules.attention import check_dropout
from glassformer.modules.hooks import HookPoint

# Activations by the name a config uses. "gelu_tanh" is GPT-2's approximation.
ACTIVATIONS: dict[str, Callable[[Tensor], Tensor]] = {
    "relu": F.relu,
    "gelu": F.gelu,
    "gelu_tanh": functools.partial(F.gelu, approximate="tanh"),
    "silu": F.silu,  # "swish": Marian's
}


# Gated activations: the named function is applied to the gate branch.
# "swiglu" is Llama's; "geglu_tanh" (GELU's tanh approximation on the gate) Gemma's and T5 v1.1's.
GATED_ACTIVATIONS: dict[str, Callable[[Tensor], Tensor]] = {
    "swiglu": F.silu,
    "geglu_tanh": functools.partial(F.gelu, approximate="tanh"),
}


def check_activation(name: str) -> None:
    names = sorted(ACTIVATIONS) + sorted(GATED_ACTIVATIONS)
    if name not in ACTIVATIONS and name not in GATED_ACTIVATIONS:
        raise ValueError(f"activation must be one of {names}, got {name!r}")


def _check(activation: str, known: dict, d_ff: int, dropout: float) -> None:
    """A block's arguments: an activation it knows, a positive width, a dropout in [0, 1)."""
    if activation not in known:
        raise ValueError(f"activation must be one of {sorted(known)}, got {activation!r}")
    check_dropout(dropout)
    if d_ff <= 0:
        raise ValueError(f"d_ff must be a positive integer, got {d_ff}")


def feed_forward(
    *, d_model: int, d_ff: int, dropout: float = 0.0, activation: str = "relu", bias: bool = True
) -> nn.Module:
    """The feed-forward block an activation name calls for: gated ("swiglu") or plain."""
    check_activation(activation)
    cls = GatedFeedForward if activation in GATED_ACTIVATIONS else FeedForward
    return cls(d_model=d_model, d_ff=d_ff, dropout=dropout, activation=activation, bias=bias)


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
        _check(activation, ACTIVATIONS, d_ff, dropout)
        self.linear1 = nn.Linear(d_model, d_ff, bias=bias)
        self.linear2 = nn.Linear(d_ff, d_model, bias=bias)
        self.dropout = nn.Dropout(dropout)
        self.activation = activation
        self._act = ACTIVATIONS[activation]
        self.hook_pre = HookPoint()  # linear1's output, (B, T, d_ff)
        self.hook_post = HookPoint()  # after the activation, (B, T, d_ff)

    def forward(self, x: Tensor) -> Tensor:
        """(B, T, D) → (B, T, D)."""
        pre = self.hook_pre(self.linear1(x))  # (B, T, d_ff), before the activation
        post = self.hook_post(self._act(pre))
        return self.linear2(self.dropout(post) if self.training else post)

    def extra_repr(self) -> str:
        return f"activation={self.activation!r}"


class GatedFeedForward(nn.Module):
    """The gated feed-forward of Llama and most current LLMs (SwiGLU, Shazeer 2020).

        FFN(x) = down_proj(silu(gate_proj(x)) · up_proj(x))

    Parameter names are Hugging Face Llama's (``gate_proj``, ``up_proj``, ``down_proj``),
    so its ``mlp.*`` weights copy across under the same names.

    Args:
        d_model: D.
        d_ff: the inner width (Llama's ``intermediate_size``).
        dropout: dropout on the gated product, before ``down_proj``.
        activation: "swiglu" (SiLU on the gate) or "geglu_tanh" (GELU, tanh approximation).
        bias: whether the three linear layers have a bias (Llama's ``mlp_bias``).
    """

    def __init__(
        self,
        *,
        d_model: int,
        d_ff: int,
        dropout: float = 0.0,
        activation: str = "swiglu",
        bias: bool = False,
    ) -> None:
        super().__init__()
        _check(activation, GATED_ACTIVATIONS, d_ff, dropout)
        self.gate_proj = nn.Linear(d_model, d_ff, bias=bias)
        self.up_proj = nn.Linear(d_model, d_ff, bias=bias)
        self.down_proj = nn.Linear(d_ff, d_model, bias=bias)
        self.dropout = nn.Dropout(dropout)
        self.activation = activation
        self._act = GATED_ACTIVATIONS[activation]
        self.hook_pre = HookPoint()  # gate_proj's output, (B, T, d_ff)
        self.hook_pre_linear = HookPoint()  # up_proj's output, (B, T, d_ff)
        self.hook_post = HookPoint()  # the gated product, (B, T, d_ff)

    def forward(self, x: Tensor) -> Tensor:
        """(B, T, D) → (B, T, D)."""
        gate, up = self.gate_proj(x), self.up_proj(x)  # (B, T, d_ff) each
        gate = self.hook_pre(gate)  # (B, T, d_ff), before the activation
        hidden = self.hook_post(self._act(gate) * self.hook_pre_linear(up))
        return self.down_proj(self.dropout(hidden) if self.training else hidden)

    def extra_repr(self) -> str:
        return f"activation={self.activation!r}"
