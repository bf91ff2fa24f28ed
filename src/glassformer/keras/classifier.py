"""The encoder-only sequence classifier in Keras: the twin of ``glassformer.TransformerClassifier``.

ids (B, T) → embeddings + positions → encoder blocks → pool over T → Dense → logits (B, C).
Built from the same ``ClassifierConfig``; ``call`` returns the logits, so ``fit`` and
``evaluate`` work with a sparse cross-entropy on them.
"""

from __future__ import annotations

from typing import Any

import keras

from glassformer.keras.common import EncoderModel, pool
from glassformer.models.classifier import ClassifierConfig


@keras.saving.register_keras_serializable(package="glassformer")
class TransformerClassifier(EncoderModel):
    """Classify a token sequence into one of ``config.num_classes``.

    Sub-layers as in PyTorch: ``embed``, ``pos_embed``, ``blocks``, ``ln_final``, ``head``.

    Args:
        config: a ``ClassifierConfig`` (or its dict, as ``get_config`` stores it).
    """

    kind = "classifier"
    config_class = ClassifierConfig

    def __init__(self, config: ClassifierConfig | dict[str, Any], **kwargs) -> None:
        super().__init__(config, **kwargs)
        self.head = keras.layers.Dense(self.config.num_classes, name="head")

    def build(self, ids_shape) -> None:
        super().build(ids_shape)
        self.head.build((None, self.config.d_model))

    def call(self, ids, attention_mask=None, training: bool | None = None):
        """Token ids (B, T), ``pad_id`` marking padding → logits (B, C).

        ``attention_mask`` (B, 1, 1, T), True = real token, is built from ``pad_id`` if None.
        """
        x, attention_mask = self.encode(ids, attention_mask, training)  # (B, T, D)
        return self.head(pool(x, attention_mask, self.config.pooling))  # (B, C)
