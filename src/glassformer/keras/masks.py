"""Attention masks in ``keras.ops``, as in ``glassformer.modules.sdpa``.

Boolean, True = may attend: ``padding_mask(ids)`` is (B, 1, 1, T), the keys that are real
tokens; ``causal_mask(Tq, Tk)`` is (Tq, Tk), the keys at or before each query's position.
"""

from __future__ import annotations

from keras import ops


def padding_mask(ids, pad_id: int = 0):
    """(B, T) token ids → (B, 1, 1, T) boolean, True where ``ids != pad_id``."""
    if len(ids.shape) != 2:
        raise ValueError(f"ids must be (batch, length), got shape {tuple(ids.shape)}")
    return ops.not_equal(ids, pad_id)[:, None, None, :]  # (B, 1, 1, T)


def causal_mask(query_len: int, key_len: int | None = None):
    """Lower-triangular (Tq, Tk) mask; with more keys than queries the queries are the last ones."""
    key_len = query_len if key_len is None else key_len
    if query_len <= 0 or key_len < query_len:
        raise ValueError(
            f"causal_mask needs 0 < query_len <= key_len, got query_len={query_len}, "
            f"key_len={key_len}"
        )
    rows = ops.arange(query_len)[:, None] + (key_len - query_len)  # (Tq, 1) query positions
    return ops.arange(key_len)[None, :] <= rows  # (Tq, Tk)


def combine(mask, other):
    """AND of two masks, None meaning "no restriction"."""
    if mask is None:
        return other
    return other if other is None else ops.logical_and(mask, other)
