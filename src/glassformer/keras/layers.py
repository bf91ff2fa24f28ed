"""The encoder layer and the encoder stack in Keras: the twin of ``glassformer.modules.layers``.

Shapes: B batch, T length, D d_model, H heads. Each sub-layer is wrapped in a residual
connection with dropout and a LayerNorm, in one of two orders:

    post-norm (the paper, ``norm_first=False``):  x = norm(x + dropout(sublayer(x)))
    pre-norm  (``norm_first=True``):              x = x + dropout(sublayer(norm(x)))

A pre-norm stack ends with one more LayerNorm (``Encoder.norm``).
"""

from __future__ import annotations

import keras

from glassformer.keras.attention import MultiHeadAttention
from glassformer.keras.feedforward import FeedForward
from glassformer.modules.attention import check_dropout
from glassformer.modules.layers import LayerOutput, StackOutput


@keras.saving.register_keras_serializable(package="glassformer")
class EncoderLayer(keras.layers.Layer):
    """Self-attention then feed-forward, each with residual + LayerNorm.

    Sub-layers as in PyTorch: ``self_attn``, ``feed_forward`` (``linear1``, ``linear2``),
    ``norm1``, ``norm2``.

    Args:
        d_model: D.
        num_heads: H.
        d_ff: inner width of the feed-forward network.
        dropout: dropout on each residual branch and inside the feed-forward network.
        attention_dropout: dropout on the attention weights.
        activation: "relu", "gelu" or "gelu_tanh".
        norm_first: pre-norm (True) or the paper's post-norm (False).
        head_dim: width of one head; ``d_model // num_heads`` when None.
        qkv_bias: bias on the q, k, v projections.
        causal: forbid attending to later positions.
        layer_norm_eps: LayerNorm epsilon (PyTorch's 1e-5, not Keras's 1e-3).
    """

    def __init__(
        self,
        *,
        d_model: int,
        num_heads: int,
        d_ff: int,
        dropout: float = 0.1,
        attention_dropout: float = 0.0,
        activation: str = "relu",
        norm_first: bool = False,
        head_dim: int | None = None,
        qkv_bias: bool = True,
        causal: bool = False,
        layer_norm_eps: float = 1e-5,
        **kwargs,
    ) -> None:
        super().__init__(**kwargs)
        check_dropout(dropout)
        self.options = dict(
            d_model=d_model,
            num_heads=num_heads,
            d_ff=d_ff,
            dropout=dropout,
            attention_dropout=attention_dropout,
            activation=activation,
            norm_first=norm_first,
            head_dim=head_dim,
            qkv_bias=qkv_bias,
            causal=causal,
            layer_norm_eps=layer_norm_eps,
        )
        self.d_model, self.norm_first = d_model, norm_first
        self.self_attn = MultiHeadAttention(
            d_model=d_model,
            num_heads=num_heads,
            head_dim=head_dim,
            dropout=attention_dropout,
            qkv_bias=qkv_bias,
            causal=causal,
            name="self_attn",
        )
        self.feed_forward = FeedForward(
            d_model=d_model, d_ff=d_ff, dropout=dropout, activation=activation, name="feed_forward"
        )
        self.norm1 = keras.layers.LayerNormalization(epsilon=layer_norm_eps, name="norm1")
        self.norm2 = keras.layers.LayerNormalization(epsilon=layer_norm_eps, name="norm2")
        self.dropout = keras.layers.Dropout(dropout, name="dropout")

    def build(self, x_shape) -> None:
        shape = (None, None, self.d_model)
        for layer in (self.self_attn, self.feed_forward, self.norm1, self.norm2):
            layer.build(shape)

    def call(
        self,
        x,
        attention_mask=None,
        need_weights: bool = False,
        training: bool | None = None,
    ) -> LayerOutput:
        """x (B, T, D), mask broadcastable to (B, H, T, T) → ``LayerOutput``."""
        attn = self.self_attn(
            self._in(x, self.norm1),
            attention_mask=attention_mask,
            need_weights=need_weights,
            training=training,
        )
        x = self._out(x, attn.output, self.norm1, training)
        y = self.feed_forward(self._in(x, self.norm2), training=training)
        return LayerOutput(self._out(x, y, self.norm2, training), attn.weights)

    def _in(self, x, norm):
        """The sub-layer's input: normalised first under pre-norm."""
        return norm(x) if self.norm_first else x

    def _out(self, x, y, norm, training):
        """Add the sub-layer's output ``y`` to the residual ``x``; normalise under post-norm."""
        x = x + self.dropout(y, training=training)
        return x if self.norm_first else norm(x)

    def get_config(self) -> dict:
        return {**super().get_config(), **self.options}


@keras.saving.register_keras_serializable(package="glassformer")
class Encoder(keras.layers.Layer):
    """A stack of ``EncoderLayer``s (``layers``), with a final LayerNorm (``norm``) under pre-norm.

    Args:
        num_layers: how many layers.
        final_norm: add a LayerNorm after the last layer; defaults to ``norm_first``.
        **layer_options: passed to every ``EncoderLayer`` (d_model, num_heads, d_ff, ...).
    """

    def __init__(
        self,
        *,
        num_layers: int,
        final_norm: bool | None = None,
        d_model: int,
        num_heads: int,
        d_ff: int,
        **layer_options,
    ) -> None:
        keras_keys = ("name", "trainable", "dtype")
        super().__init__(**{k: layer_options.pop(k) for k in keras_keys if k in layer_options})
        if num_layers <= 0:
            raise ValueError(f"num_layers must be a positive integer, got {num_layers}")
        self.num_layers, self.d_model = num_layers, d_model
        layer_options = dict(d_model=d_model, num_heads=num_heads, d_ff=d_ff, **layer_options)
        self.layer_options = layer_options
        self.layers = [EncoderLayer(**layer_options, name=f"layers_{i}") for i in range(num_layers)]
        if final_norm is None:
            final_norm = layer_options.get("norm_first", False)
        self.final_norm = final_norm
        eps = layer_options.get("layer_norm_eps", 1e-5)
        self.norm = None
        if final_norm:
            self.norm = keras.layers.LayerNormalization(epsilon=eps, name="norm")

    def build(self, x_shape) -> None:
        shape = (None, None, self.d_model)
        for layer in self.layers:
            layer.build(shape)
        if self.norm is not None:
            self.norm.build(shape)

    def call(
        self, x, attention_mask=None, need_weights: bool = False, training: bool | None = None
    ) -> StackOutput:
        """x (B, T, D), mask broadcastable to (B, H, T, T) → ``StackOutput``."""
        weights = []
        for layer in self.layers:
            x, w, _ = layer(
                x, attention_mask=attention_mask, need_weights=need_weights, training=training
            )
            weights.append(w)
        if self.norm is not None:
            x = self.norm(x)
        return StackOutput(x, tuple(weights) if need_weights else None)

    def get_config(self) -> dict:
        return {
            **super().get_config(),
            "num_layers": self.num_layers,
            "final_norm": self.final_norm,
            **self.layer_options,
        }
