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

import math
from collections.abc import Sequence
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor

from glassformer.modules.hooks import HookPoint
from glassformer.modules.masks import check_mask

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


def check_window(window: Sequence[int]) -> tuple[int, int]:
    """``(left, right)`` as two integers ≥ 0, or a ValueError naming what was given."""
    ok = (
        isinstance(window, (tuple, list))
        and len(window) == 2
        and all(isinstance(x, int) and not isinstance(x, bool) and x >= 0 for x in window)
    )
    if not ok:
        raise ValueError(f"window must be (left, right), two integers >= 0, got {window!r}")
    return int(window[0]), int(window[1])


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
    G = min(G, T)
    chunk = CHUNK if chunk is None else chunk
    kp = F.pad(k, (0, 0, left, right))  # (B, H, L + T + R, Dh), padded position = j + L
    vp = F.pad(v, (0, 0, left, right))  # (B, H, L + T + R, Dv)
    real = None if key_mask is None else F.pad(key_mask, (left, right))  # (B, L + T + R)
    k_glob, v_glob = k[:, :, :G], v[:, :, :G]  # (B, H, G, Dh), (B, H, G, Dv)
    glob_ok = None if key_mask is None else key_mask[:, None, None, :G]  # (B, 1, 1, G)
    starts = range(0, T, chunk)

    def allowed(s: int, e: int) -> Tensor:
        """The chunk's (B or 1, 1, c, G + W) mask: the global keys, then its band."""
        offsets = torch.arange(left + right + 1, device=q.device)
        j = torch.arange(s, e, device=q.device)[:, None] - left + offsets  # (c, W) key positions
        band = ((j >= G) & (j < T))[None, None]  # keys before G are seen as global keys instead
        if real is not None:
            band = band & real[:, None, j + left]  # (B, 1, c, W)
        return _with_global(band, glob_ok, G)

    def rect_allowed(s: int, e: int) -> Tensor:
        """The chunk's (B or 1, 1, c, G + c + L + R) mask: the global keys, then its keys
        s − L .. e + R − 1, of which each query may see its band."""
        j = torch.arange(s - left, e + right, device=q.device)  # the rectangle's key positions
        i = torch.arange(s, e, device=q.device)
        rect = window_allowed(i, j, (left, right)) & (j >= G) & (j < T)  # (c, c + L + R)
        rect = rect[None, None] if real is None else rect & real[:, None, None, j + left]
        return _with_global(rect, glob_ok, G)

    # Chunks are pieces of `chunk` positions, taken with split (its backward is one cat; a
    # slice per chunk would zero-fill a whole-length gradient per chunk, quadratic in T). A
    # chunk's keys [s, s + c + L + R) in padded positions are the `per` pieces from its own on.
    reach = left + right
    per = -(-(chunk + reach) // chunk)
    q_parts = q.split(chunk, dim=2)  # each (B, H, c, Dh)
    k_parts, v_parts = kp.split(chunk, dim=2), vp.split(chunk, dim=2)

    def keys(i: int) -> tuple[Tensor, ...]:
        return k_parts[i : i + per]

    def values(i: int) -> tuple[Tensor, ...]:
        return v_parts[i : i + per]

    if need_weights or (hooks is not None and (hooks[0].active or hooks[1].active)):
        # The readable way: the whole band at once, (B, H, T, G + W), so hooks see it all.
        bands = [
            _chunk_scores(qc, _span(keys(i), qc.size(2) + reach), k_glob)
            for i, qc in enumerate(q_parts)
        ]
        mask = torch.cat([allowed(s, min(s + chunk, T)) for s in starts], dim=2)
        weights = _masked_softmax(torch.cat(bands, dim=2), mask, dropout_p, hooks)
        outs = [
            _chunk_output(w, _span(values(i), w.size(2) + reach), v_glob)
            for i, w in enumerate(weights.split(chunk, dim=2))
        ]
        band_weights: Tensor | None = weights
    else:
        # The fast way: PyTorch's fused kernel on each chunk's rectangle, the band as its
        # mask. It keeps no (c, c + L + R) weights for backward (flash-style: the output and
        # one log-sum-exp per row), so memory stays linear in T; a row with nothing to
        # attend gives zeros.
        band_weights = None
        outs = []
        for i, (s, qc) in enumerate(zip(starts, q_parts, strict=True)):
            e = s + qc.size(2)
            keys_c, values_c = _span(keys(i), e - s + reach), _span(values(i), e - s + reach)
            if G:  # the global keys in front
                keys_c, values_c = torch.cat([k_glob, keys_c], 2), torch.cat([v_glob, values_c], 2)
            outs.append(
                F.scaled_dot_product_attention(
                    qc, keys_c, values_c, attn_mask=rect_allowed(s, e), dropout_p=dropout_p
                )
            )
    out = torch.cat(outs, dim=2)  # (B, H, T, Dv)

    global_rows = None
    if G:  # the global queries attend to every key: (B, H, G, T), dense
        out_g, global_rows = _global_rows(q[:, :, :G], k, v, key_mask, right == 0, dropout_p)
        out = torch.cat([out_g, out[:, :, G:]], dim=2)
    if band_weights is None:
        return LocalAttentionOutput(out, None)
    if G:  # the global queries' band rows were not used: their weights are global_rows
        band_weights = torch.cat(
            [torch.zeros_like(band_weights[:, :, :G]), band_weights[:, :, G:]], 2
        )
    return LocalAttentionOutput(out, LocalWeights(band_weights, global_rows))


def _with_global(allowed: Tensor, global_ok: Tensor | None, G: int) -> Tensor:
    """A chunk's mask (B or 1, 1, c, K) with the G global keys' columns in front (B, 1, c, G),
    True where the key is real."""
    if not G:
        return allowed
    c, K = allowed.size(2), allowed.size(3)
    if global_ok is None:
        glob = torch.ones(1, 1, c, G, dtype=torch.bool, device=allowed.device)
    else:
        glob = global_ok.expand(-1, 1, c, G)  # (B, 1, c, G)
    B = max(glob.size(0), allowed.size(0))
    return torch.cat([glob.expand(B, 1, c, G), allowed.expand(B, 1, c, K)], dim=-1)


def _chunk_scores(q: Tensor, keys: Tensor, global_keys: Tensor) -> Tensor:
    """Scaled scores of a chunk's queries q (B, H, c, Dh) on the global keys (B, H, G, Dh) and on
    its band of ``keys`` (B, H, c + L + R, Dh): (B, H, c, G + W)."""
    scale = 1.0 / math.sqrt(q.size(-1))
    c = q.size(2)
    rect = (q @ keys.transpose(-2, -1)) * scale  # (B, H, c, c + L + R)
    band = _band(rect, keys.size(2) - c + 1)  # (B, H, c, W)
    if global_keys.size(2) == 0:
        return band
    glob = (q @ global_keys.transpose(-2, -1)) * scale  # (B, H, c, G)
    return torch.cat([glob, band], dim=-1)


def _chunk_output(weights: Tensor, values: Tensor, global_values: Tensor) -> Tensor:
    """A chunk's output (B, H, c, Dv) from its weights (B, H, c, G + W), its band of ``values``
    (B, H, c + L + R, Dv) and the global values (B, H, G, Dv)."""
    G = global_values.size(2)
    out = _unband(weights[..., G:]) @ values  # (B, H, c, c + L + R) @ (B, H, c + L + R, Dv)
    if G:
        out = out + weights[..., :G] @ global_values  # (B, H, c, Dv)
    return out


def _masked_softmax(
    scores: Tensor,
    allowed: Tensor | None,
    dropout_p: float,
    hooks: tuple[HookPoint, HookPoint] | None = None,
) -> Tensor:
    """Mask (the most negative finite value), softmax, zero the masked weights (so a row with
    no allowed key is all zeros, not uniform), dropout."""
    if allowed is not None:
        scores = scores.masked_fill(~allowed, torch.finfo(scores.dtype).min)
    if hooks is not None:
        scores = hooks[0](scores)
    weights = scores.softmax(dim=-1)
    if allowed is not None:
        weights = weights.masked_fill(~allowed, 0.0)
    if hooks is not None:
        weights = hooks[1](weights)
    return F.dropout(weights, p=dropout_p) if dropout_p > 0.0 else weights


def _span(pieces: tuple[Tensor, ...], length: int) -> Tensor:
    """The first ``length`` keys (or values) of the pieces, joined: (B, H, length, Dh)."""
    return torch.cat(pieces, dim=2)[:, :, :length]


def _global_rows(
    q: Tensor, k: Tensor, v: Tensor, key_mask: Tensor | None, causal: bool, dropout_p: float
) -> tuple[Tensor, Tensor]:
    """The global queries q (B, H, G, Dh) against every key (every earlier one if ``causal``):
    (output (B, H, G, Dv), weights (B, H, G, T))."""
    scores = (q @ k.transpose(-2, -1)) / math.sqrt(q.size(-1))  # (B, H, G, T)
    allowed = None if key_mask is None else key_mask[:, None, None, :]  # (B, 1, 1, T)
    if causal:
        G, T = q.size(2), k.size(2)
        earlier = torch.ones(G, T, dtype=torch.bool, device=q.device).tril()  # (G, T)
        allowed = earlier if allowed is None else allowed & earlier
    weights = _masked_softmax(scores, allowed, dropout_p)
    return weights @ v, weights


def _band(rect: Tensor, width: int) -> Tensor:
    """(..., c, c + W − 1) → (..., c, W): row r's columns r .. r + W − 1.

    Skewing: with c zeros after the rectangle's c·K values (K = c + W − 1), the flat index
    r·(K + 1) + m is r·K + (r + m), row r's column r + m.
    """
    *lead, c, K = rect.shape
    flat = F.pad(rect.flatten(-2), (0, c))  # (..., c·(K + 1))
    return flat.view(*lead, c, K + 1)[..., :width]


def _unband(band: Tensor) -> Tensor:
    """(..., c, W) → (..., c, c + W − 1), row r's W values at columns r .. r + W − 1, zeros
    elsewhere: ``_band`` undone."""
    *lead, c, W = band.shape
    flat = F.pad(band, (0, c)).flatten(-2)  # (..., c·(W + c)): each row then c zeros
    return flat[..., : c * (W + c - 1)].view(*lead, c, W + c - 1)


def band_to_dense(weights: LocalWeights, window: Sequence[int]) -> Tensor:
    """Local attention's weights as the dense (B, H, T, T) map dense attention would return
    (zeros outside the window): for short inputs, heatmaps and tests."""
    left, _ = check_window(window)
    band, global_rows = weights
    G = 0 if global_rows is None else global_rows.size(2)
    T = band.size(2)
    dense = _unband(band[..., G:])[..., left : left + T]  # (B, H, T, T): keys 0 .. T − 1
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
