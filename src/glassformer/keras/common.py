"""What the Keras models share: the backbone, the automatic mask, pooling.

The twin of ``glassformer.models.backbone`` and ``glassformer.models.common``. Shapes: B
batch, T length, D d_model.
"""

from __future__ import annotations

from typing import Any, ClassVar

import keras
from keras import ops

from glassformer.keras.attention import most_negative
from glassformer.keras.block import build_stack, encoder_blocks, run_blocks
from glassformer.keras.masks import padding_mask
from glassformer.keras.position import TokenEmbedding, positional_encoding
from glassformer.models.parts import layer_options


class EncoderModel(keras.Model):
    """What the classifier and the encoder LM share: a config and the twin of PyTorch's
    ``Backbone``: ``embed``, ``pos_embed``, ``blocks`` and ``ln_final``.

    A subclass names its ``config_class`` and adds its head; ``encode`` runs the body.
    """

    config_class: ClassVar[Any]  # the PyTorch model's config class

    def __init__(self, config: Any, **kwargs) -> None:
        super().__init__(**kwargs)
        if isinstance(config, dict):  # as get_config stores it
            config = self.config_class.from_dict(config)
        self.config = c = config
        options = layer_options(c)
        if not options.pop("bias"):  # the classifier and encoder LM configs always have them
            raise ValueError("the Keras twin has biases in its linear layers and LayerNorms")
        window = options.pop("attention_window")
        options.pop("global_tokens")  # a config allows them only with a window
        if window is not None:  # every twin, from_torch's too, is built here
            raise ValueError(
                f"the Keras twin attends densely; this model has attention_window={window}"
            )
        scale = getattr(c, "scale_embeddings", False)
        self.embed = TokenEmbedding(
            vocab_size=c.vocab_size, d_model=c.d_model, scale=scale, name="embed"
        )
        self.pos_embed = positional_encoding(c.positional, d_model=c.d_model, max_len=c.max_len)
        self.dropout = keras.layers.Dropout(c.dropout, name="dropout")
        self.blocks = encoder_blocks(c.num_layers, options)
        self.ln_final = None
        if c.norm_first:
            self.ln_final = keras.layers.LayerNormalization(epsilon=1e-5, name="ln_final")

    def build(self, ids_shape) -> None:
        self.embed.build(ids_shape)
        self.pos_embed.build((None, None, self.config.d_model))
        build_stack(self.blocks, self.ln_final, self.config.d_model)

    def encode(self, ids, attention_mask=None, training: bool | None = None):
        """(hidden (B, T, D), the mask used) for ids (B, T); the mask built from ``pad_id``."""
        if attention_mask is None:
            attention_mask = auto_padding_mask(ids, self.config.pad_id)
        x = self.dropout(self.pos_embed(self.embed(ids)), training=training)  # (B, T, D)
        x = run_blocks(self.blocks, x, attention_mask, False, training).hidden
        return x if self.ln_final is None else self.ln_final(x), attention_mask

    def get_config(self) -> dict:
        return {**super().get_config(), "config": self.config.to_dict()}


def auto_padding_mask(ids, pad_id: int | None):
    """The key padding mask (B, 1, 1, T) for ``ids``, or None without a pad id.

    Unlike PyTorch's version it does not look at the values to return None for a batch
    without pads (that would be a data-dependent branch, which JAX and TF graphs forbid);
    an all-True mask gives the same numbers.
    """
    return None if pad_id is None else padding_mask(ids, pad_id)


POOLING = ("mean", "cls", "max")


def pool(x, mask, pooling: str):
    """(B, T, D) → (B, D) by ``pooling`` ("mean", "cls" or "max"), ignoring padded positions.

    ``mask`` is a padding mask whose last dimension is T (True for real tokens), or None.
    A row with no real token pools to zeros.
    """
    if pooling == "cls":
        return x[:, 0]
    if mask is None:
        return ops.mean(x, axis=1) if pooling == "mean" else ops.max(x, axis=1)
    real = ops.reshape(mask, (ops.shape(mask)[0], -1, 1))  # (B, T, 1), True for real tokens
    count = ops.sum(ops.cast(real, x.dtype), axis=1)  # (B, 1)
    if pooling == "mean":
        total = ops.sum(ops.where(real, x, 0.0), axis=1)  # (B, D)
        return total / ops.maximum(count, 1.0)
    pooled = ops.max(ops.where(real, x, most_negative(x.dtype)), axis=1)  # (B, D)
    return ops.where(count > 0, pooled, 0.0)
