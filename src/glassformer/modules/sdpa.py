"""Scaled dot-product attention, softmax(q kᵀ / √Dh) v, spelled out or fused; and its masks.

Shapes used throughout:
    B  batch size          H   query heads (Hkv key/value heads under grouped-query attention)
    Tq query length        Dh  dimension of one head
    Tk key/value length

Masks are boolean and True means "may attend" (``F.scaled_dot_product_attention``'s
convention). They broadcast to (B, H, Tq, Tk):

    padding_mask(ids)   (B, 1, 1, T)   keys that are real tokens
    auto_padding_mask   the same, or None when nothing is padded
    key_mask            what a model's forward attends: its mask, or Hugging Face's
                        ``attention_mask`` (B, T) of 1/0, or the padding of its ids
    causal_mask(Tq, Tk) (Tq, Tk)       keys at or before each query's position
    combine_masks(a, b) their AND, None meaning "no restriction"

A query row that may attend to no key at all produces zeros (never NaN) on both paths.
``nn.MultiheadAttention``'s ``key_padding_mask`` has the opposite polarity (True =
ignore); convert with ``~`` before passing one here.

Which way a layer attends is chosen by name from ``ATTEND``: "fused" (PyTorch's kernel),
"readable" (spelled out wherever the weights, their hooks, a soft cap or a bias need it) and
"window" (``modules.local_attention``, a sliding window); a layer may be given one. What the
scores become before the softmax is the layer's ``Scores`` part. A decoding step's one query
per head has faster ways of its own outside this textbook (``modules.one_query``, where
``glassformer.kernels`` registers its C loop).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor

from glassformer.modules.hooks import HookPoint
from glassformer.modules.one_query import one_query

# ---- masks ---------------------------------------------------------------------------


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


# ---- attention -----------------------------------------------------------------------


@dataclass(frozen=True)
class Scores:
    """What the scores become before the mask and the softmax, a layer's score part:

    s = q·kᵀ × scale       (scale None: 1/√Dh, the paper's; Gemma's is its own)
      + bias              (given with each call: T5's relative positions)
    s = c·tanh(s / c)      (softcap c: Gemma 2; the readable path only)
    """

    scale: float | None = None
    softcap: float | None = None

    def queries(self, q: Tensor) -> Tensor:
        """q (…, Dh) multiplied so that every path's own 1/√Dh gives ``scale`` instead."""
        return q if self.scale is None else q * (self.scale * q.size(-1) ** 0.5)


class Attending(NamedTuple):
    """What one call of an attend function needs besides q, k and v."""

    mask: Tensor | None  # boolean, True = may attend, broadcastable to (B, H, Tq, Tk)
    dropout_p: float
    causal: bool
    need_weights: bool  # the weights wanted, or their hook points in use
    hooks: tuple[HookPoint, HookPoint]  # the scores' and the weights' hook points
    scores: Scores
    bias: Tensor | None = None  # added to every score (T5)
    window: tuple[int, int] | None = None  # a sliding window's (left, right) reach
    global_tokens: int = 0  # with a window: positions every query sees, and seen by all
    cache: Any = None  # the layer's KV cache, for a window's key positions


# (q (B, H, Tq, Dh), k, v (B, Hkv, Tk, Dh), the rest) → (output (B, H, Tq, Dv), weights or None)
Attend = Callable[[Tensor, Tensor, Tensor, Attending], "AttentionOutput"]
ATTEND: dict[str, Attend] = {}


def register_attend(name: str) -> Callable[[Attend], Attend]:
    """Make an attend function choosable by ``name`` (``MultiHeadAttention(attend=name)``)."""

    def register(fn: Attend) -> Attend:
        ATTEND[name] = fn
        return fn

    return register


class AttentionOutput(NamedTuple):
    """What attention returns: always two fields, ``weights`` None unless asked for."""

    output: Tensor  # (B, Tq, D) from the module, (B, H, Tq, Dh) from the function
    weights: Tensor | None  # (B, H, Tq, Tk), the softmax the values were mixed with


def scaled_dot_product_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    mask: Tensor | None = None,
    dropout_p: float = 0.0,
    *,
    need_weights: bool = True,
    is_causal: bool = False,
    hooks: tuple[HookPoint, HookPoint] | None = None,
    softcap: float | None = None,
    bias: Tensor | None = None,
) -> AttentionOutput:
    """softmax(q kᵀ / √Dh) v, with an optional boolean mask.

    With ``need_weights=True`` (the default) this is the readable path: the scores,
    the mask, the softmax and the weighted sum are spelled out and the weights are
    returned. With ``need_weights=False`` it calls the fused
    ``F.scaled_dot_product_attention`` and returns ``weights=None`` (except for short
    bfloat16/float16 inputs on CPU, where the matmul path is the faster one). Tests prove
    the two paths agree.

    Args:
        q: queries, (B, H, Tq, Dh).
        k: keys, (B, Hkv, Tk, Dh): H heads, or fewer that H is a multiple of (grouped-query
            attention: each key/value head serves H/Hkv query heads, neighbours in order).
        v: values, (B, Hkv, Tk, Dv).
        mask: boolean, True = may attend, broadcastable to (B, H, Tq, Tk).
        dropout_p: dropout probability on the attention weights. Pass 0.0 in eval.
        need_weights: return the attention weights (readable path) or not (fused path).
        is_causal: also forbid each query from seeing later keys. Queries align to the
            end of the keys, so a block of Tq new queries after Tk - Tq cached keys works.
        hooks: the readable path's hook points for the scaled and masked scores and for
            the weights (``MultiHeadAttention.hook_attn_scores``, ``.hook_pattern``).
        softcap: squash the scaled scores into (−c, c) as c·tanh(s / c) before the mask
            (Gemma 2); the readable path only.
        bias: added to the scaled scores before the cap and the mask, broadcastable to
            (B, H, Tq, Tk) (T5's relative positions); the readable path only.

    Returns:
        ``AttentionOutput(output (B, H, Tq, Dv), weights (B, H, Tq, Tk) or None)``.
    """
    if not 0.0 <= dropout_p < 1.0:
        raise ValueError(f"dropout_p must be in [0, 1), got {dropout_p}")
    check_mask(mask)
    if not need_weights and softcap is None and bias is None:
        return AttentionOutput(fused_attention(q, k, v, mask, dropout_p, is_causal, hooks), None)
    Tq, Tk = q.size(-2), k.size(-2)
    if is_causal and Tq > 1:  # one query at the end of the keys may see all of them
        mask = _and(mask, causal_mask(Tq, Tk, device=q.device))
    group = _group_size(q, k)
    if group > 1:  # spelled out: each key/value head repeated for the query heads it serves
        k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
    out, weights = _attend(q, k, v, mask, dropout_p, hooks, softcap, bias)
    return AttentionOutput(out, weights if need_weights else None)


def fused_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    mask: Tensor | None = None,
    dropout_p: float = 0.0,
    is_causal: bool = False,
    hooks: tuple[HookPoint, HookPoint] | None = None,
) -> Tensor:
    """The output of ``scaled_dot_product_attention`` without the weights, (B, H, Tq, Dv):
    PyTorch's fused kernel, except for short bfloat16/float16 inputs on CPU, where the
    matmul path is the faster one (the arguments are that function's, unchecked)."""
    Tq, Tk = q.size(-2), k.size(-2)
    causal = is_causal and Tq > 1  # one query at the end of the keys may see all of them
    group = _group_size(q, k)
    one_step = Tq == 1 and dropout_p == 0.0 and hooks is None
    if one_step and q.device.type == "cpu" and torch.compiler.is_compiling():  # measured there
        return one_query(q, k, v, mask, group)
    if _fused_is_slow(q, k):
        if causal:
            mask = _and(mask, causal_mask(Tq, Tk, device=q.device))
        if group > 1:
            k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
        return _attend(q, k, v, mask, dropout_p, hooks)[0]
    # The fused kernel shares the key/value heads itself (enable_gqa): measured 1.4x faster
    # than repeating them for training, 2-3x for a decoding step (B=1-8, 9 query heads on
    # 3, 256-1024 keys; bit-identical outputs).
    if causal and mask is None and Tq == Tk:  # the kernel builds the triangle itself
        return F.scaled_dot_product_attention(
            q, k, v, dropout_p=dropout_p, is_causal=True, enable_gqa=group > 1
        )
    if causal:
        mask = _and(mask, causal_mask(Tq, Tk, device=q.device))
    return F.scaled_dot_product_attention(
        q, k, v, attn_mask=mask, dropout_p=dropout_p, enable_gqa=group > 1
    )


def _attend(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    mask: Tensor | None,
    dropout_p: float,
    hooks: tuple[HookPoint, HookPoint] | None = None,
    softcap: float | None = None,
    bias: Tensor | None = None,
) -> tuple[Tensor, Tensor]:
    """The readable path, step by step: (output (B, H, Tq, Dv), weights (B, H, Tq, Tk))."""
    scores = q @ k.transpose(-2, -1)  # (B, H, Tq, Tk)
    scores = scores / math.sqrt(q.size(-1))
    if bias is not None:  # T5: each head's bias for the query–key distance
        scores = scores + bias
    if softcap is not None:  # Gemma 2: c·tanh(s / c), before the mask
        scores = torch.tanh(scores / softcap) * softcap
    if mask is not None:
        # The most negative finite value, not -inf (NaN for empty rows) nor -1e9 (overflows fp16).
        scores = scores.masked_fill(~mask, torch.finfo(scores.dtype).min)
    if hooks is not None:
        scores = hooks[0](scores)
    weights = scores.softmax(dim=-1)  # (B, H, Tq, Tk), each row sums to 1
    if mask is not None:
        # A row with no allowed key came out uniform; make it all zeros instead.
        weights = weights.masked_fill(~mask, 0.0)
    if hooks is not None:
        weights = hooks[1](weights)
    if dropout_p > 0.0:
        weights = F.dropout(weights, p=dropout_p)
    out = weights @ v  # (B, H, Tq, Dv)
    return out, weights


def _group_size(q: Tensor, k: Tensor) -> int:
    """How many query heads share each key/value head (1: plain multi-head attention)."""
    H, Hkv = q.size(-3), k.size(-3)
    if Hkv <= 0 or H % Hkv != 0:
        raise ValueError(f"{H} query heads cannot share {Hkv} key/value heads evenly")
    return H // Hkv


def _fused_is_slow(q: Tensor, k: Tensor) -> bool:
    """Whether the plain matmul path beats PyTorch's fused kernel here.

    On CPU in bfloat16/float16 the fused kernel is slow for short keys (torch 2.13, forward
    + backward: 35 vs 5-7 ms at B=64, H=4, T=40, Dh=64; 6.5 vs 2.5 ms at nanoGPT's CPU
    shape), while for long ones it wins again (97 vs 180 ms at B=32, H=8, T=256, Dh=16).
    """
    low_precision = q.dtype == torch.bfloat16 or q.dtype == torch.float16
    return low_precision and k.size(-2) <= 128 and q.device.type == "cpu"


def _and(mask: Tensor | None, other: Tensor) -> Tensor:
    return other if mask is None else mask & other


@register_attend("fused")
def _fused(q: Tensor, k: Tensor, v: Tensor, how: Attending) -> AttentionOutput:
    """PyTorch's fused kernel: the output only."""
    return AttentionOutput(fused_attention(q, k, v, how.mask, how.dropout_p, how.causal), None)


@register_attend("readable")
def _readable(q: Tensor, k: Tensor, v: Tensor, how: Attending) -> AttentionOutput:
    """Spelled out where the weights, their hooks, a soft cap or a bias need it."""
    return scaled_dot_product_attention(
        q, k, v, how.mask, how.dropout_p, need_weights=how.need_weights, is_causal=how.causal,
        hooks=how.hooks, softcap=how.scores.softcap, bias=how.bias,
    )  # fmt: skip
