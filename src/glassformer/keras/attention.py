"""Scaled dot-product attention and multi-head attention in ``keras.ops``.

The twin of ``glassformer.modules.attention``. Shapes:
    B  batch size          H   number of heads
    Tq query length        Dh  dimension of one head
    Tk key/value length    D   model width (d_model)

Masks are boolean, True = may attend, broadcastable to (B, H, Tq, Tk). A query row that
may attend to no key gives zeros, never NaN.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import keras
import ml_dtypes
from keras import ops

from glassformer.keras.masks import causal_mask, combine
from glassformer.modules.attention import AttentionOutput, check_dropout, check_heads


def scaled_dot_product_attention(
    q, k, v, mask=None, dropout: Callable | None = None, *, need_weights: bool = True
):
    """softmax(q kᵀ / √Dh) v, with an optional boolean mask.

    With ``need_weights=True`` (the default) this is the readable path: the scores, the
    mask, the softmax and the weighted sum spelled out, the weights returned. With
    ``need_weights=False`` and no ``dropout`` it calls the backend's fused kernel
    (``keras.ops.dot_product_attention``; on the torch backend PyTorch's) and returns
    ``weights=None``. Tests prove the two paths agree.

    Args:
        q: queries, (B, H, Tq, Dh).
        k: keys, (B, H, Tk, Dh).
        v: values, (B, H, Tk, Dh).
        mask: boolean, True = may attend, broadcastable to (B, H, Tq, Tk).
        dropout: applied to the weights before they mix the values (a Keras ``Dropout``
            called with the right ``training`` flag), or None.
        need_weights: return the weights (readable path) or not (fused path).

    Returns:
        ``AttentionOutput(output (B, H, Tq, Dh), weights (B, H, Tq, Tk) or None)``.
    """
    if not need_weights and dropout is None:
        return AttentionOutput(_fused(q, k, v, mask), None)
    scores = ops.matmul(q, ops.swapaxes(k, -2, -1))  # (B, H, Tq, Tk)
    scores = scores / math.sqrt(q.shape[-1])
    if mask is not None:
        # The most negative finite value, not -inf (NaN for empty rows) nor -1e9 (fp16).
        scores = ops.where(mask, scores, most_negative(scores.dtype))
    weights = ops.softmax(scores, axis=-1)  # (B, H, Tq, Tk), each row sums to 1
    if mask is not None:
        weights = ops.where(mask, weights, 0.0)  # a row with no allowed key: zeros
    if dropout is not None:
        weights = dropout(weights)
    out = ops.matmul(weights, v)  # (B, H, Tq, Dh)
    return AttentionOutput(out, weights if need_weights else None)


def _fused(q, k, v, mask):
    """The fused kernel, which wants (B, T, H, Dh); rows with no allowed key made zeros."""
    out = ops.dot_product_attention(
        ops.swapaxes(q, 1, 2),  # (B, Tq, H, Dh)
        ops.swapaxes(k, 1, 2),  # (B, Tk, H, Dh)
        ops.swapaxes(v, 1, 2),
        mask=mask,
    )  # (B, Tq, H, Dh)
    out = ops.swapaxes(out, 1, 2)  # (B, H, Tq, Dh)
    if mask is None:
        return out
    return ops.where(ops.any(mask, axis=-1, keepdims=True), out, 0.0)  # empty rows: zeros


def most_negative(dtype) -> float:
    """The dtype's most negative finite value (bfloat16 included)."""
    name = keras.backend.standardize_dtype(dtype)
    return float(ml_dtypes.finfo(getattr(ml_dtypes, name, name)).min)


@keras.saving.register_keras_serializable(package="glassformer")
class MultiHeadAttention(keras.layers.Layer):
    """Multi-head attention: project, split into heads, attend, merge, project.

    The twin of ``glassformer.MultiHeadAttention``: ``qkv_proj`` is one Dense D → 3·H·Dh
    whose output columns are [q; k; v], each head-major (the PyTorch weight transposed),
    and ``out_proj`` a Dense H·Dh → D. Self-attention when ``key`` is omitted;
    cross-attention applies the q columns to the query and the k, v columns to the memory.

    Args:
        d_model: model width D.
        num_heads: number of heads H.
        head_dim: width of one head Dh; ``d_model // num_heads`` when None.
        dropout: dropout on the attention weights.
        qkv_bias: whether the q, k, v projections have a bias.
        out_bias: whether the output projection has a bias.
        causal: each query may only attend to keys at or before its own position.
    """

    def __init__(
        self,
        *,
        d_model: int,
        num_heads: int,
        head_dim: int | None = None,
        dropout: float = 0.0,
        qkv_bias: bool = True,
        out_bias: bool = True,
        causal: bool = False,
        **kwargs,
    ) -> None:
        super().__init__(**kwargs)
        head_dim = check_heads(d_model, num_heads, head_dim)
        check_dropout(dropout)
        self.d_model, self.num_heads, self.head_dim = d_model, num_heads, head_dim
        self.dropout, self.qkv_bias, self.out_bias, self.causal = (
            dropout,
            qkv_bias,
            out_bias,
            causal,
        )
        inner = num_heads * head_dim
        self.qkv_proj = keras.layers.Dense(3 * inner, use_bias=qkv_bias, name="qkv_proj")
        self.out_proj = keras.layers.Dense(d_model, use_bias=out_bias, name="out_proj")
        self.attention_dropout = keras.layers.Dropout(dropout, name="attention_dropout")

    def build(self, query_shape, key_shape=None, value_shape=None) -> None:
        self.qkv_proj.build((None, None, self.d_model))
        self.out_proj.build((None, None, self.num_heads * self.head_dim))

    def call(
        self,
        query,
        key=None,
        value=None,
        attention_mask=None,
        need_weights: bool = False,
        training: bool | None = None,
    ) -> AttentionOutput:
        """Attend from ``query`` (B, Tq, D) to ``key``/``value`` (B, Tk, D) or to itself.

        Returns:
            ``AttentionOutput(output (B, Tq, D), weights (B, H, Tq, Tk) or None)``.
        """
        if len(query.shape) != 3 or query.shape[-1] != self.d_model:
            raise ValueError(
                f"query must be (batch, length, {self.d_model}), got {tuple(query.shape)}"
            )
        q, k, v = self._project(query, key, value)  # each (B, H, T, Dh)
        mask = attention_mask
        if self.causal:
            mask = combine(mask, causal_mask(q.shape[2], k.shape[2]))
        dropout = None
        if training and self.dropout > 0:
            dropout = lambda w: self.attention_dropout(w, training=training)  # noqa: E731
        out, weights = scaled_dot_product_attention(
            q, k, v, mask, dropout, need_weights=need_weights
        )
        out = ops.swapaxes(out, 1, 2)  # (B, Tq, H, Dh)
        inner = self.num_heads * self.head_dim
        out = ops.reshape(out, (-1, ops.shape(out)[1], inner))  # (B, Tq, H·Dh)
        return AttentionOutput(self.out_proj(out), weights)

    def _project(self, query, key, value):
        """The q, k, v projections, split into heads: three (B, H, T, Dh) tensors."""
        inner = self.num_heads * self.head_dim
        if key is None:
            if value is not None:
                raise ValueError("value given without key; pass both for cross-attention")
            qkv = self.qkv_proj(query)  # (B, T, 3·H·Dh), one matmul for all three
            q, k, v = ops.split(qkv, 3, axis=-1)  # each (B, T, H·Dh)
        else:
            value = key if value is None else value
            kernel = self.qkv_proj.kernel  # (D, 3·H·Dh)
            bias = self.qkv_proj.bias if self.qkv_bias else None
            q = self._linear(query, kernel[:, :inner], bias, 0, inner)  # (B, Tq, H·Dh)
            k = self._linear(key, kernel[:, inner : 2 * inner], bias, inner, 2 * inner)
            v = self._linear(value, kernel[:, 2 * inner :], bias, 2 * inner, 3 * inner)
        return self._split_heads(q), self._split_heads(k), self._split_heads(v)

    @staticmethod
    def _linear(x, kernel, bias, start: int, stop: int):
        y = ops.matmul(x, kernel)  # (B, T, H·Dh)
        return y if bias is None else y + bias[start:stop]

    def _split_heads(self, x):
        x = ops.reshape(x, (-1, ops.shape(x)[1], self.num_heads, self.head_dim))  # (B, T, H, Dh)
        return ops.swapaxes(x, 1, 2)  # (B, H, T, Dh)

    def get_config(self) -> dict:
        return {
            **super().get_config(),
            "d_model": self.d_model,
            "num_heads": self.num_heads,
            "head_dim": self.head_dim,
            "dropout": self.dropout,
            "qkv_bias": self.qkv_bias,
            "out_bias": self.out_bias,
            "causal": self.causal,
        }
