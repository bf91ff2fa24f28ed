"""The position-wise feed-forward network in ``keras.ops``: FFN(x) = act(x W1 + b1) W2 + b2.

The twin of ``glassformer.modules.feedforward``. Shapes: (B, T, D) → (B, T, d_ff) → (B, T, D).
"""

from __future__ import annotations

import functools

import keras
from keras import ops

from glassformer.modules.attention import check_dropout
from glassformer.modules.feedforward import ACTIVATIONS as TORCH_ACTIVATIONS

# The same names as the PyTorch side; Keras's gelu is the tanh approximation unless told.
ACTIVATIONS = {
    "relu": ops.relu,
    "gelu": functools.partial(ops.gelu, approximate=False),
    "gelu_tanh": functools.partial(ops.gelu, approximate=True),
    "silu": ops.silu,
}
assert set(ACTIVATIONS) == set(TORCH_ACTIVATIONS)


@keras.saving.register_keras_serializable(package="glassformer")
class FeedForward(keras.layers.Layer):
    """Two Dense layers (``linear1``, ``linear2``) with an activation and dropout between them.

    Args:
        d_model: D.
        d_ff: the inner width.
        dropout: dropout after the activation.
        activation: "relu", "gelu" or "gelu_tanh".
        bias: whether both Dense layers have a bias.
    """

    def __init__(
        self,
        *,
        d_model: int,
        d_ff: int,
        dropout: float = 0.0,
        activation: str = "relu",
        bias: bool = True,
        **kwargs,
    ) -> None:
        super().__init__(**kwargs)
        if activation not in ACTIVATIONS:
            raise ValueError(f"activation must be one of {sorted(ACTIVATIONS)}, got {activation!r}")
        check_dropout(dropout)
        if d_ff <= 0:
            raise ValueError(f"d_ff must be a positive integer, got {d_ff}")
        self.d_model, self.d_ff, self.activation, self.bias = d_model, d_ff, activation, bias
        self.rate = dropout
        self.linear1 = keras.layers.Dense(d_ff, use_bias=bias, name="linear1")
        self.linear2 = keras.layers.Dense(d_model, use_bias=bias, name="linear2")
        self.dropout = keras.layers.Dropout(dropout, name="dropout")

    def build(self, x_shape) -> None:
        self.linear1.build((None, None, self.d_model))
        self.linear2.build((None, None, self.d_ff))

    def call(self, x, training: bool | None = None):
        """(B, T, D) → (B, T, D)."""
        h = ACTIVATIONS[self.activation](self.linear1(x))  # (B, T, d_ff)
        return self.linear2(self.dropout(h, training=training))

    def get_config(self) -> dict:
        return {
            **super().get_config(),
            "d_model": self.d_model,
            "d_ff": self.d_ff,
            "dropout": self.rate,
            "activation": self.activation,
            "bias": self.bias,
        }
