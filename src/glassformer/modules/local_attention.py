"""Local (sliding-window) attention: each query sees the keys near it, in time and memory T·w.

Shapes used throughout:
    B  batch size        L  the window's reach to the left (earlier keys)
    H  number of heads   R  its reach to the right (later keys)
    T  length            W  = L + R + 1, the keys in one query's window
    Dh head width        G  global tokens
    c  queries in one chunk

Query i may attend key j iff i − L ≤ j ≤ i + R: a band around the diagonal (Longformer's).
A causal window is (w, 0) (Mistral's). With G global tokens the first G positions see every
key and every query sees them (Longformer's [CLS]); in a window that looks back only (R = 0)
they stay causal (no key after the query): the first tokens every later one reads, the
"attention sinks" of StreamingLLM.

How it is computed, chunk by chunk of c queries, never (T, T):
  1. The keys and values are padded with L zeros in front and R behind, so the queries of the
     chunk [s, s + c) read one contiguous slice of them, [s, s + c + L + R) in padded
     positions: a view, no copy.
  2. One matmul gives the chunk's (c, c + L + R) rectangle of scores. Row r's window starts
     r columns after row 0's: the band (c, W) is cut out of the rectangle by skewing it.
  3. The band (and the scores on the G global keys, in front) is masked, softmaxed, put back
     on the rectangle's diagonal (zeros elsewhere) and multiplied with the value slice.
Work and memory per chunk are c·(c + L + R), over the sequence T·(c + L + R): linear in T.

The global queries (rows 0..G−1) attend densely to all T keys, (G, T), computed apart.

That is the readable path, taken when the weights are asked for (or hooked). Without them,
each chunk's rectangle goes to PyTorch's fused kernel (``F.scaled_dot_product_attention``)
with its band as the mask: the same numbers, faster, and nothing of size (c, c + L + R) kept
for backward, so memory grows as T·Dh (the inputs and outputs), not T·W.

Weights come back in band form (B, H, T, G + W): columns 0..G−1 are the global keys, then the
keys i − L .. i + R (zero where that key does not exist or may not be seen); the global
queries' own rows (B, H, G, T) beside it. ``band_to_dense`` turns both into (B, H, T, T).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import torch
from torch import Tensor

from glassformer.modules.band import Chunks, fused_band, global_rows, readable_band, unskew
from glassformer.modules.cache import KVCache
from glassformer.modules.hooks import HookPoint
from glassformer.modules.sdpa import (
    Attending,
    AttentionOutput,
    check_mask,
    register_attend,
    scaled_dot_product_attention,
)

# Queries per chunk: smaller wastes fewer scores (c + L + R computed for W kept), larger
# makes fewer, bigger matmuls.
CHUNK = 128


class LocalWeights(NamedTuple):
    """Local attention's weights: the band, and the global queries' full rows."""

    band: Tensor  # (B, H, T, G + W): the G global keys, then keys i − L .. i + R
    global_rows: Tensor | None  # (B, H, G, T), None without global tokens


class LocalAttentionOutput(NamedTuple):
    output: Tensor  # (B, H, T, Dh)
    weights: LocalWeights | None  # only when asked for


class Window(NamedTuple):
    """A sliding window, a layer's mask part: query i attends keys i − left .. i + right
    (a causal layer's is ``Window(w, 0)``). Equal to the pair ``(left, right)``."""

    left: int
    right: int


def window_of(attention_window: int | None, causal: bool) -> tuple[int, int] | None:
    """A config's ``attention_window`` w as an attention's window: (w, 0) causal, else (w, w)."""
    if attention_window is None:
        return None
    return (attention_window, 0 if causal else attention_window)


def check_window(window: Sequence[int]) -> Window:
    """``(left, right)`` as a ``Window`` of two integers ≥ 0, or a ValueError naming what was
    given."""
    ok = (
        isinstance(window, (tuple, list))
        and len(window) == 2
        and all(isinstance(x, int) and not isinstance(x, bool) and x >= 0 for x in window)
    )
    if not ok:
        raise ValueError(f"window must be (left, right), two integers >= 0, got {window!r}")
    return Window(int(window[0]), int(window[1]))


def check_global_tokens(global_tokens: int) -> int:
    if not isinstance(global_tokens, int) or isinstance(global_tokens, bool) or global_tokens < 0:
        raise ValueError(f"global_tokens must be an integer >= 0, got {global_tokens!r}")
    return global_tokens


def window_allowed(
    query_pos: Tensor, key_pos: Tensor, window: tuple[int, int], global_tokens: int = 0
) -> Tensor:
    """Which key each query may attend, from their positions: (Tq,) and (Tk,) → (Tq, Tk) bool."""
    left, right = window
    i, j = query_pos[:, None], key_pos[None, :]
    allowed = (j >= i - left) & (j <= i + right)
    if global_tokens:
        allowed = allowed | (j < global_tokens) | (i < global_tokens)
        if right == 0:  # a window that looks back only stays causal: no key after the query
            allowed = allowed & (j <= i)
    return allowed


def window_mask(
    query_len: int,
    key_len: int | None = None,
    *,
    window: Sequence[int],
    global_tokens: int = 0,
    device: torch.device | str | None = None,
) -> Tensor:
    """The dense boolean mask (True = may attend) that local attention is equal to.

    As with ``causal_mask``, when there are more keys than queries the queries are the last
    ``query_len`` positions.

    Returns:
        (Tq, Tk) boolean.
    """
    key_len = query_len if key_len is None else key_len
    keys = torch.arange(key_len, device=device)
    return window_allowed(keys[key_len - query_len :], keys, check_window(window), global_tokens)


def local_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    window: Sequence[int],
    *,
    global_tokens: int = 0,
    key_mask: Tensor | None = None,
    dropout_p: float = 0.0,
    need_weights: bool = False,
    hooks: tuple[HookPoint, HookPoint] | None = None,
    chunk: int | None = None,
) -> LocalAttentionOutput:
    """Sliding-window attention, equal to dense attention under ``window_mask``.

    Args:
        q: queries, (B, H, T, Dh).
        k: keys, (B, Hkv, T, Dh), H or a divisor of H heads (grouped-query attention).
        v: values, (B, Hkv, T, Dv).
        window: (left, right): query i may attend keys i − left .. i + right.
        global_tokens: G: the first G positions see all keys and are seen by all queries.
        key_mask: which keys are real tokens, (B, T) boolean, True = may attend.
        dropout_p: dropout on the weights. Pass 0.0 in eval.
        need_weights: also return the weights, ``LocalWeights``.
        hooks: hook points for the band's scores and weights, (B, H, T, G + W) each.
        chunk: queries per chunk (default ``CHUNK``).

    Returns:
        ``LocalAttentionOutput(output (B, H, T, Dv), weights or None)``. A query with no
        key it may attend gets zeros.
    """
    left, right = check_window(window)
    G = check_global_tokens(global_tokens)
    B, H, T, Dh = q.shape
    if k.size(-2) != T:
        raise ValueError(f"local attention is self-attention: {T} queries but {k.size(-2)} keys")
    if key_mask is not None and (key_mask.dtype != torch.bool or key_mask.shape != (B, T)):
        raise ValueError(
            f"key_mask must be boolean (batch, length) = {(B, T)}, got "
            f"{key_mask.dtype} {tuple(key_mask.shape)}"
        )
    if k.size(1) != H:  # each key/value head serves H / Hkv query heads, neighbours in order
        k, v = k.repeat_interleave(H // k.size(1), dim=1), v.repeat_interleave(H // v.size(1), 1)
    c = Chunks.of(q, k, v, (left, right), min(G, T), key_mask, CHUNK if chunk is None else chunk)
    looking = need_weights or (hooks is not None and bool(hooks[0].fns or hooks[1].fns))
    if looking:
        out, band_weights = readable_band(c, q, dropout_p, hooks)
    else:
        out, band_weights = fused_band(c, q, dropout_p), None
    G = c.G
    rows = None
    if G:  # the global queries attend to every key: (B, H, G, T), dense
        out_g, rows = global_rows(q[:, :, :G], k, v, key_mask, right == 0, dropout_p)
        out = torch.cat([out_g, out[:, :, G:]], dim=2)
    if band_weights is None:
        return LocalAttentionOutput(out, None)
    if G:  # the global queries' band rows were not used: their weights are global_rows
        band_weights = torch.cat(
            [torch.zeros_like(band_weights[:, :, :G]), band_weights[:, :, G:]], 2
        )
    return LocalAttentionOutput(out, LocalWeights(band_weights, rows))


def attend_window(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    window: tuple[int, int],
    global_tokens: int,
    mask: Tensor | None,
    dropout_p: float,
    need_weights: bool,
    cache: KVCache | None,
    hooks: tuple[HookPoint, HookPoint],
    softcap: float | None = None,
) -> AttentionOutput:
    """A windowed attention layer's attention: (B, H, Tq, Dh), weights (B, H, Tq, Tk) or None.

    Unobserved, over the whole sequence (no cache, or its first call), this is
    ``local_attention``'s fused kernel chunk by chunk: time and memory linear in T. When the
    weights are asked for or hooked it is the readable dense path under the window's mask
    (the same numbers; the hooks then see (B, H, Tq, Tk) as in every layer). Decoding with a
    cache, the few new queries attend the keys the cache kept (a rolling one keeps only the
    window) the same way. Soft-capped scores (``softcap``) take the readable path too.
    """
    B, Tq, Tk = q.size(0), q.size(2), k.size(2)
    if Tk == Tq and not need_weights and softcap is None:
        key_mask = as_key_mask(mask, B, Tk)
        out, _ = local_attention(q, k, v, window, global_tokens=global_tokens,
                                 key_mask=key_mask, dropout_p=dropout_p)  # fmt: skip
        return AttentionOutput(out, None)
    seen = Tk if cache is None else len(cache)  # positions so far, the new queries' last
    key_pos = torch.arange(Tk, device=q.device) if cache is None else cache.key_positions
    query_pos = torch.arange(seen - Tq, seen, device=q.device)
    allowed = window_allowed(query_pos, key_pos.to(q.device), window, global_tokens)
    keys = as_key_mask(mask, B, seen)  # the mask covers every key seen so far
    if keys is not None:
        allowed = allowed & keys[:, None, None, key_pos]  # (B, 1, Tq, Tk)
    return scaled_dot_product_attention(
        q, k, v, allowed, dropout_p, need_weights=need_weights, hooks=hooks, softcap=softcap
    )


def band_to_dense(weights: LocalWeights, window: Sequence[int]) -> Tensor:
    """Local attention's weights as the dense (B, H, T, T) map dense attention would return
    (zeros outside the window): for short inputs, heatmaps and tests."""
    left, _ = check_window(window)
    band, global_rows = weights
    G = 0 if global_rows is None else global_rows.size(2)
    T = band.size(2)
    dense = unskew(band[..., G:])[..., left : left + T]  # (B, H, T, T): keys 0 .. T − 1
    if global_rows is None:
        return dense
    dense = torch.cat([dense[..., :G] + band[..., :G], dense[..., G:]], dim=-1)
    return torch.cat([global_rows, dense[:, :, G:]], dim=2)  # the global queries' own rows


def as_key_mask(mask: Tensor | None, batch: int, key_len: int) -> Tensor | None:
    """A mask broadcastable to (B, 1, 1, Tk) as the (B, Tk) key mask local attention takes.

    Local attention's window does the rest; a mask that differs between queries would be a
    dense (T, T) mask, which is what it avoids.
    """
    if mask is None:
        return None
    check_mask(mask)
    m = mask.reshape((1,) * (4 - mask.dim()) + tuple(mask.shape))  # (B or 1, H or 1, Tq or 1, Tk)
    if m.size(1) != 1 or m.size(2) != 1 or m.size(3) != key_len or m.size(0) not in (1, batch):
        raise ValueError(
            f"a windowed attention layer takes a key mask broadcastable to "
            f"({batch}, 1, 1, {key_len}) (the window does the rest), got {tuple(mask.shape)}"
        )
    return m[:, 0, 0].expand(batch, key_len)


@register_attend("window")
def _windowed(q: Tensor, k: Tensor, v: Tensor, how: Attending) -> AttentionOutput:
    """A sliding window's attention (``attend_window``), the layer's window given with the call."""
    if how.window is None or how.bias is not None:
        raise ValueError("the window path attends a windowed layer's own keys, with no bias")
    return attend_window(
        q, k, v, how.window, how.global_tokens, how.mask, how.dropout_p, how.need_weights,
        how.cache, how.hooks, how.scores.softcap,
    )  # fmt: skip
