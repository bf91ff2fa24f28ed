"""The encoder block and the encoder stack in Keras: the twin of ``glassformer.modules.block``
and ``glassformer.modules.stack``.

Shapes: B batch, T length, D d_model, H heads. Each sub-layer is wrapped in a residual
connection with dropout and a LayerNorm, in one of two orders:

    post-norm (the paper, ``norm_first=False``):  x = norm(x + dropout(sublayer(x)))
    pre-norm  (``norm_first=True``):              x = x + dropout(sublayer(norm(x)))

A pre-norm stack ends with one more LayerNorm (``Encoder.ln_final``).
"""

from __future__ import annotations

from typing import Any

import keras

from glassformer.keras.attention import MultiHeadAttention
from glassformer.keras.feedforward import FeedForward
from glassformer.modules.attention import check_dropout
from glassformer.modules.block import BlockOutput, StackOutput


@keras.saving.register_keras_serializable(package="glassformer")
class EncoderLayer(keras.layers.Layer):
    """Self-attention then feed-forward, each with residual + LayerNorm.

    Sub-layers as in PyTorch: ``attn``, ``mlp`` (``linear1``, ``linear2``), ``ln1``, ``ln2``.

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
        self.attn = MultiHeadAttention(
            d_model=d_model,
            num_heads=num_heads,
            head_dim=head_dim,
            dropout=attention_dropout,
            qkv_bias=qkv_bias,
            causal=causal,
            name="attn",
        )
        self.mlp = FeedForward(
            d_model=d_model, d_ff=d_ff, dropout=dropout, activation=activation, name="mlp"
        )
        self.ln1 = keras.layers.LayerNormalization(epsilon=layer_norm_eps, name="ln1")
        self.ln2 = keras.layers.LayerNormalization(epsilon=layer_norm_eps, name="ln2")
        self.dropout = keras.layers.Dropout(dropout, name="dropout")

    def build(self, x_shape) -> None:
        shape = (None, None, self.d_model)
        for layer in (self.attn, self.mlp, self.ln1, self.ln2):
            layer.build(shape)

    def call(
        self,
        x,
        attention_mask=None,
        need_weights: bool = False,
        training: bool | None = None,
    ) -> BlockOutput:
        """x (B, T, D), mask broadcastable to (B, H, T, T) → ``BlockOutput``."""
        attn = self.attn(
            self._in(x, self.ln1),
            attention_mask=attention_mask,
            need_weights=need_weights,
            training=training,
        )
        x = self._out(x, attn.output, self.ln1, training)
        y = self.mlp(self._in(x, self.ln2), training=training)
        return BlockOutput(self._out(x, y, self.ln2, training), attn.weights)

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
    """A stack of ``EncoderLayer``s (``blocks``), with a final LayerNorm (``ln_final``) under
    pre-norm.

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
        **layer_options: Any,
    ) -> None:
        keras_keys = ("name", "trainable", "dtype")
        super().__init__(**{k: layer_options.pop(k) for k in keras_keys if k in layer_options})
        self.num_layers, self.d_model = num_layers, d_model
        layer_options = dict(d_model=d_model, num_heads=num_heads, d_ff=d_ff, **layer_options)
        self.layer_options = layer_options
        self.blocks = encoder_blocks(num_layers, layer_options)
        if final_norm is None:
            final_norm = layer_options.get("norm_first", False)
        self.final_norm = final_norm
        eps = layer_options.get("layer_norm_eps", 1e-5)
        self.ln_final = None
        if final_norm:
            self.ln_final = keras.layers.LayerNormalization(epsilon=eps, name="ln_final")

    def build(self, x_shape) -> None:
        build_stack(self.blocks, self.ln_final, self.d_model)

    def call(
        self, x, attention_mask=None, need_weights: bool = False, training: bool | None = None
    ) -> StackOutput:
        """x (B, T, D), mask broadcastable to (B, H, T, T) → ``StackOutput``."""
        out = run_blocks(self.blocks, x, attention_mask, need_weights, training)
        return out if self.ln_final is None else out._replace(hidden=self.ln_final(out.hidden))

    def get_config(self) -> dict:
        return {
            **super().get_config(),
            "num_layers": self.num_layers,
            "final_norm": self.final_norm,
            **self.layer_options,
        }


def encoder_blocks(num_layers: int, layer_options: dict) -> list[EncoderLayer]:
    """``num_layers`` encoder blocks, named as PyTorch's are numbered (``blocks_0``, ...)."""
    if num_layers <= 0:
        raise ValueError(f"num_layers must be a positive integer, got {num_layers}")
    return [EncoderLayer(**layer_options, name=f"blocks_{i}") for i in range(num_layers)]


def build_stack(blocks: list, ln_final, d_model: int) -> None:
    """Build every block and the final norm for a stream (B, T, D)."""
    shape = (None, None, d_model)
    for block in blocks:
        block.build(shape)
    if ln_final is not None:
        ln_final.build(shape)


def run_blocks(blocks: list, x, attention_mask, need_weights: bool, training) -> StackOutput:
    """Each block in turn on x (B, T, D): the twin of ``glassformer.modules.block.run_blocks``."""
    weights = []
    for block in blocks:
        x, w, _ = block(
            x, attention_mask=attention_mask, need_weights=need_weights, training=training
        )
        weights.append(w)
    return StackOutput(x, tuple(weights) if need_weights else None)
