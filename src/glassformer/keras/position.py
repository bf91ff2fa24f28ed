"""Token embeddings and positions in ``keras.ops``: the twin of ``glassformer.modules.position``.

Shapes: B batch, T length, D d_model, V vocabulary. Both positional layers take token
embeddings (B, T, D) and return them with the positions ``start .. start+T-1`` added.
"""

from __future__ import annotations

import functools
import math
from typing import Any

import keras
from keras import ops

from glassformer.modules.position import POSITIONAL, check_length, sinusoidal_table


@keras.saving.register_keras_serializable(package="glassformer")
class TokenEmbedding(keras.layers.Embedding):
    """Token ids (B, T) → vectors (B, T, D), optionally scaled by √D (the paper, section 3.4):
    a Keras ``Embedding`` (its table is ``embeddings``, (V, D)), as PyTorch's is an
    ``nn.Embedding``.

    Args:
        vocab_size: V.
        d_model: D.
        scale: multiply by √D.
    """

    def __init__(self, *, vocab_size: int, d_model: int, scale: bool = False, **kwargs) -> None:
        if vocab_size <= 0:
            raise ValueError(f"vocab_size must be a positive integer, got {vocab_size}")
        super().__init__(vocab_size, d_model, **kwargs)
        self.vocab_size, self.d_model, self.scale = vocab_size, d_model, scale

    def call(self, ids):
        x = super().call(ids)  # (B, T, D)
        return x * math.sqrt(self.d_model) if self.scale else x

    def get_config(self) -> dict:
        return {
            **keras.layers.Layer.get_config(self),
            "vocab_size": self.vocab_size,
            "d_model": self.d_model,
            "scale": self.scale,
        }


@keras.saving.register_keras_serializable(package="glassformer")
class SinusoidalPositionalEncoding(keras.layers.Layer):
    """The paper's fixed encoding, sine and cosine interleaved (or, with ``halves``, all
    sines then all cosines: Marian's); a constant, never saved.

    Args:
        d_model: D (even).
        max_len: longest sequence the table covers.
        halves: sines then cosines, instead of interleaved.
    """

    def __init__(
        self, *, d_model: int, max_len: int = 5000, halves: bool = False, **kwargs
    ) -> None:
        super().__init__(**kwargs)
        if d_model <= 0 or d_model % 2:
            raise ValueError(f"sinusoidal encoding needs an even d_model, got {d_model}")
        if max_len <= 0:
            raise ValueError(f"max_len must be a positive integer, got {max_len}")
        self.d_model, self.max_len, self.halves = d_model, max_len, halves
        self._table = sinusoidal_table(max_len, d_model, halves).numpy()  # (max_len, D), float32

    def call(self, x, start: int = 0):
        """(B, T, D) → (B, T, D) with positions start..start+T-1 added."""
        T = x.shape[1]
        if T is not None:
            check_length(start + T, self.max_len)
        table = ops.convert_to_tensor(self._table, dtype=x.dtype)
        return x + ops.slice(table, (start, 0), (ops.shape(x)[1], self.d_model))  # (T, D)

    def get_config(self) -> dict:
        config = {"d_model": self.d_model, "max_len": self.max_len, "halves": self.halves}
        return {**super().get_config(), **config}


@keras.saving.register_keras_serializable(package="glassformer")
class LearnedPositionalEmbedding(keras.layers.Embedding):
    """A trained vector per position (Bloem, GPT, BERT): a Keras ``Embedding`` indexed by
    position, whose ``call`` adds its rows to the token embeddings.

    Args:
        max_len: number of positions.
        d_model: D.
    """

    def __init__(self, *, max_len: int, d_model: int, **kwargs) -> None:
        if max_len <= 0:
            raise ValueError(f"max_len must be a positive integer, got {max_len}")
        super().__init__(max_len, d_model, **kwargs)
        self.max_len, self.d_model = max_len, d_model

    def build(self, x_shape=None) -> None:
        super().build((None,))

    def call(self, x, start: int = 0):
        """(B, T, D) → (B, T, D) with positions start..start+T-1 added."""
        T = x.shape[1]
        if T is not None:
            check_length(start + T, self.max_len)
        positions = ops.arange(start, start + ops.shape(x)[1])  # (T,)
        rows = ops.take(self.embeddings, positions, axis=0)  # (T, D), broadcast over B
        return x + ops.cast(rows, x.dtype)

    def get_config(self) -> dict:
        return {
            **keras.layers.Layer.get_config(self),
            "max_len": self.max_len,
            "d_model": self.d_model,
        }


KERAS_POSITIONAL: dict[str, Any] = {
    "sinusoidal": SinusoidalPositionalEncoding,
    "sinusoidal_halves": functools.partial(SinusoidalPositionalEncoding, halves=True),
    "learned": LearnedPositionalEmbedding,
}
assert set(KERAS_POSITIONAL) == set(POSITIONAL)


def positional_encoding(kind: str, *, d_model: int, max_len: int) -> keras.layers.Layer:
    """The positional layer named by a config's ``positional`` value."""
    if kind not in KERAS_POSITIONAL:
        raise ValueError(f"positional must be one of {sorted(KERAS_POSITIONAL)}, got {kind!r}")
    return KERAS_POSITIONAL[kind](d_model=d_model, max_len=max_len, name="pos_embed")
