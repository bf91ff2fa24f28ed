"""The encoder language model in Keras: the twin of ``glassformer.EncoderLM``.

ids (B, T) → token + position embeddings → encoder blocks → Dense(V) → logits (B, T, V).
"""

from __future__ import annotations

from typing import Any

import keras

from glassformer.keras.common import EncoderModel
from glassformer.models.encoder_lm import EncoderLMConfig


@keras.saving.register_keras_serializable(package="glassformer")
class EncoderLM(EncoderModel):
    """Bidirectional encoder that predicts a token at every position.

    Sub-layers as in PyTorch: ``embed``, ``pos_embed``, ``blocks``, ``ln_final``,
    ``lm_head``. Tied weights (``tie_weights=True``) are not mirrored and are refused.

    Args:
        config: an ``EncoderLMConfig`` (or its dict, as ``get_config`` stores it).
    """

    kind = "encoder_lm"
    config_class = EncoderLMConfig

    def __init__(self, config: EncoderLMConfig | dict[str, Any], **kwargs) -> None:
        tied = config.get("tie_weights") if isinstance(config, dict) else config.tie_weights
        if tied:
            raise ValueError("the Keras EncoderLM does not tie weights; got tie_weights=True")
        super().__init__(config, **kwargs)
        self.lm_head = keras.layers.Dense(self.config.vocab_size, name="lm_head")

    def build(self, ids_shape) -> None:
        super().build(ids_shape)
        self.lm_head.build((None, None, self.config.d_model))

    def call(self, ids, attention_mask=None, training: bool | None = None):
        """Token ids (B, T) → vocabulary logits (B, T, V); the mask as for the classifier."""
        x, _ = self.encode(ids, attention_mask, training)  # (B, T, D)
        return self.lm_head(x)  # (B, T, V)
