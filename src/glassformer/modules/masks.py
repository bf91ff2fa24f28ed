"""Attention masks.

Every mask here is boolean with True = "may attend", the convention of
``F.scaled_dot_product_attention``. Masks broadcast to (B, H, Tq, Tk):

    padding_mask(ids)   (B, 1, 1, T)   keys that are real tokens
    auto_padding_mask   the same, or None when nothing is padded
    attention_mask_to_key_mask(am, ids)
                        (B, 1, 1, T)   the same from Hugging Face's ``attention_mask`` (B, T) of 1/0
    causal_mask(Tq, Tk) (Tq, Tk)       keys at or before each query's position
    combine_masks(a, b) their AND, None meaning "no restriction"

``nn.MultiheadAttention``'s ``key_padding_mask`` has the opposite polarity (True =
ignore); convert with ``~`` before passing one here.
"""

from __future__ import annotations

import torch
from torch import Tensor


def padding_mask(ids: Tensor, pad_id: int = 0) -> Tensor:
    """Which keys are real tokens.

    Args:
        ids: token ids, (B, T).
        pad_id: the id used for padding.

    Returns:
        (B, 1, 1, T) boolean, True where ``ids != pad_id``.
    """
    if ids.dim() != 2:
        raise ValueError(f"ids must be (batch, length), got shape {tuple(ids.shape)}")
    return (ids != pad_id)[:, None, None, :]  # (B, 1, 1, T)


def attention_mask_to_key_mask(
    attention_mask: Tensor, ids: Tensor, *, cached: int = 0, name: str = "attention_mask"
) -> Tensor:
    """Hugging Face's ``attention_mask`` (1 = real token, 0 = padding) as a key mask.

    Args:
        attention_mask: (B, Tk) of 1/0, as ints, bools or floats 1.0/0.0.
        ids: the token ids (B, T) it describes.
        cached: tokens already in a key/value cache; the mask covers them and then
            ``ids`` (Tk = cached + T), as in Hugging Face.
        name: the argument's name, for the error messages.

    Returns:
        (B, 1, 1, Tk) boolean, True where ``attention_mask`` is 1.
    """
    expected = (ids.size(0), cached + ids.size(-1))
    if tuple(attention_mask.shape) != expected:
        covers = f"(batch, {cached} cached + {ids.size(-1)} new tokens) " if cached else ""
        raise ValueError(
            f"{name} must have the ids' shape {covers}{expected}, got {tuple(attention_mask.shape)}"
        )
    if attention_mask.dtype != torch.bool:
        bad = (attention_mask != 0) & (attention_mask != 1)
        if bad.any():
            value = attention_mask[bad][0].item()
            raise ValueError(f"{name} must hold only 1 (real token) and 0 (padding), got {value}")
    return (attention_mask != 0)[:, None, None, :]  # (B, 1, 1, Tk)


def auto_padding_mask(ids: Tensor, pad_id: int | None) -> Tensor | None:
    """The key padding mask (B, 1, 1, T) for ``ids``, or None when nothing is padded.

    Returning None when the batch has no pads lets attention take its fastest path.
    """
    if pad_id is None or not (ids == pad_id).any():
        return None
    return padding_mask(ids, pad_id)


def key_mask(
    ids: Tensor,
    pad_id: int | None,
    mask: Tensor | None = None,
    attention_mask: Tensor | None = None,
    *,
    cached: int = 0,
    names: tuple[str, str] = ("mask", "attention_mask"),
) -> Tensor | None:
    """The key mask (B, 1, 1, Tk) for ``ids`` (B, T), from whichever mask the caller gave.

    ``mask`` (boolean, True = may attend) is used as given. Hugging Face's
    ``attention_mask`` (B, Tk) of 1/0 is checked and converted; it covers ``cached``
    tokens before ``ids``. With neither, keys holding ``pad_id`` are masked (none when
    ``pad_id`` is None). Giving both is an error. None means nothing is masked, which
    lets attention take its fastest path.
    """
    if attention_mask is None:
        return auto_padding_mask(ids, pad_id) if mask is None else mask
    if mask is not None:
        raise ValueError(f"give {names[0]} or {names[1]}, not both")
    keys = attention_mask_to_key_mask(attention_mask, ids, cached=cached, name=names[1])
    return None if keys.all() else keys


def causal_mask(
    query_len: int, key_len: int | None = None, *, device: torch.device | str | None = None
) -> Tensor:
    """Lower-triangular mask: query i may attend to keys 0..i.

    When there are more keys than queries (a block of new tokens after cached ones),
    the queries are the *last* ``query_len`` positions: query i sits at position
    ``key_len - query_len + i``.

    Returns:
        (Tq, Tk) boolean.
    """
    key_len = query_len if key_len is None else key_len
    if query_len <= 0 or key_len < query_len:
        raise ValueError(
            f"causal_mask needs 0 < query_len <= key_len, got query_len={query_len}, "
            f"key_len={key_len}"
        )
    ones = torch.ones(query_len, key_len, dtype=torch.bool, device=device)
    return ones.tril(diagonal=key_len - query_len)  # (Tq, Tk)


def combine_masks(*masks: Tensor | None) -> Tensor | None:
    """AND of the given masks (each broadcastable to (B, H, Tq, Tk)); None if all are None."""
    out = None
    for m in masks:
        if m is None:
            continue
        check_mask(m)
        out = m if out is None else out & m
    return out


def check_mask(mask: Tensor | None) -> None:
    """Raise a clear error for a mask that is not boolean or has too many dimensions."""
    if mask is None:
        return
    if mask.dtype != torch.bool:
        raise TypeError(
            f"attention masks must be boolean (True = may attend), got dtype {mask.dtype}"
        )
    if mask.dim() > 4:
        raise ValueError(
            f"attention mask must broadcast to (B, H, Tq, Tk), got shape {tuple(mask.shape)}"
        )
