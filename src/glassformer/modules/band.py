"""Attention on a band around the diagonal, chunk by chunk: how ``local_attention`` computes
(its notes there say why and what).

Shapes: B batch, H heads, T length, Dh head width, L and R the window's reach left and right,
W = L + R + 1 the keys of one query's window, G global tokens, c queries in one chunk.

``Chunks`` holds what every chunk reads (the keys and values padded with L zeros in front
and R behind and cut into pieces, so a chunk's keys are one contiguous span); the readable
path (``readable_band``) cuts each chunk's band out of its (c, c + L + R) rectangle of
scores by skewing it (``skew``), the fast path (``fused_band``) hands each rectangle to
PyTorch's fused kernel with the band as its mask.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor

from glassformer.modules.hooks import HookPoint


class Chunks(NamedTuple):
    """What every chunk of one local attention reads: the window, the padded keys and values
    cut into pieces, which keys are real, and the global keys."""

    left: int
    right: int
    G: int
    T: int
    chunk: int
    k_parts: tuple[Tensor, ...]  # pieces of the keys padded with L zeros in front, R behind
    v_parts: tuple[Tensor, ...]
    real: Tensor | None  # (B, L + T + R): which padded positions hold a real key
    glob_ok: Tensor | None  # (B, 1, 1, G): which global keys are real
    k_glob: Tensor  # (B, H, G, Dh)
    v_glob: Tensor

    @staticmethod
    def of(q, k, v, window, G, key_mask, chunk) -> Chunks:
        left, right = window
        kp = F.pad(k, (0, 0, left, right))  # (B, H, L + T + R, Dh), padded position = j + L
        vp = F.pad(v, (0, 0, left, right))
        real = None if key_mask is None else F.pad(key_mask, (left, right))
        glob_ok = None if key_mask is None else key_mask[:, None, None, :G]
        # Chunks are pieces of `chunk` positions, taken with split (its backward is one cat; a
        # slice per chunk would zero-fill a whole-length gradient per chunk, quadratic in T).
        return Chunks(left, right, G, q.size(2), chunk, kp.split(chunk, dim=2),
                       vp.split(chunk, dim=2), real, glob_ok, k[:, :, :G], v[:, :, :G])  # fmt: skip

    def span(self, parts: tuple[Tensor, ...], i: int, queries: int) -> Tensor:
        """Chunk i's keys (or values) [s, s + c + L + R) in padded positions: the pieces
        from its own on, joined and cut, (B, H, c + L + R, Dh)."""
        reach = self.left + self.right
        per = -(-(self.chunk + reach) // self.chunk)
        return span_of(parts[i : i + per], queries + reach)

    def band_allowed(self, s: int, e: int, device) -> Tensor:
        """The chunk's (B or 1, 1, c, G + W) mask: the global keys, then its band."""
        left, G, T = self.left, self.G, self.T
        offsets = torch.arange(left + self.right + 1, device=device)
        j = torch.arange(s, e, device=device)[:, None] - left + offsets  # (c, W) key positions
        band = ((j >= G) & (j < T))[None, None]  # keys before G are seen as global keys instead
        if self.real is not None:
            band = band & self.real[:, None, j + left]  # (B, 1, c, W)
        return with_global(band, self.glob_ok, G)

    def rect_allowed(self, s: int, e: int, device) -> Tensor:
        """The chunk's (B or 1, 1, c, G + c + L + R) mask: the global keys, then its keys
        s − L .. e + R − 1, of which each query may see its band."""
        left, right, G, T = self.left, self.right, self.G, self.T
        j = torch.arange(s - left, e + right, device=device)  # the rectangle's key positions
        i = torch.arange(s, e, device=device)
        rect = (j >= i[:, None] - left) & (j <= i[:, None] + right)  # (c, c + L + R)
        rect = rect & (j >= G) & (j < T)
        if self.real is not None:
            return with_global(rect & self.real[:, None, None, j + left], self.glob_ok, G)
        return with_global(rect[None, None], self.glob_ok, G)


def readable_band(
    c: Chunks, q: Tensor, dropout_p: float, hooks: tuple[HookPoint, HookPoint] | None
) -> tuple[Tensor, Tensor]:
    """The readable way: the whole band at once, (B, H, T, G + W), so hooks see it all;
    the output (B, H, T, Dv) and the band's weights."""
    q_parts = q.split(c.chunk, dim=2)  # each (B, H, c, Dh)
    bands = [
        chunk_scores(qc, c.span(c.k_parts, i, qc.size(2)), c.k_glob) for i, qc in enumerate(q_parts)
    ]
    starts = range(0, c.T, c.chunk)
    mask = torch.cat([c.band_allowed(s, min(s + c.chunk, c.T), q.device) for s in starts], dim=2)
    weights = masked_softmax(torch.cat(bands, dim=2), mask, dropout_p, hooks)
    outs = [
        chunk_output(w, c.span(c.v_parts, i, w.size(2)), c.v_glob)
        for i, w in enumerate(weights.split(c.chunk, dim=2))
    ]
    return torch.cat(outs, dim=2), weights


def fused_band(c: Chunks, q: Tensor, dropout_p: float) -> Tensor:
    """The fast way: PyTorch's fused kernel on each chunk's rectangle, the band as its mask.
    It keeps no (c, c + L + R) weights for backward (flash-style: the output and one
    log-sum-exp per row), so memory stays linear in T; a row with nothing to attend gives
    zeros. The output, (B, H, T, Dv)."""
    outs = []
    for i, qc in enumerate(q.split(c.chunk, dim=2)):
        s = i * c.chunk
        keys, values = c.span(c.k_parts, i, qc.size(2)), c.span(c.v_parts, i, qc.size(2))
        if c.G:  # the global keys in front
            keys, values = torch.cat([c.k_glob, keys], 2), torch.cat([c.v_glob, values], 2)
        mask = c.rect_allowed(s, s + qc.size(2), q.device)
        outs.append(
            F.scaled_dot_product_attention(qc, keys, values, attn_mask=mask, dropout_p=dropout_p)
        )
    return torch.cat(outs, dim=2)


def with_global(allowed: Tensor, global_ok: Tensor | None, G: int) -> Tensor:
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


def chunk_scores(q: Tensor, keys: Tensor, global_keys: Tensor) -> Tensor:
    """Scaled scores of a chunk's queries q (B, H, c, Dh) on the global keys (B, H, G, Dh) and on
    its band of ``keys`` (B, H, c + L + R, Dh): (B, H, c, G + W)."""
    scale = 1.0 / math.sqrt(q.size(-1))
    c = q.size(2)
    rect = (q @ keys.transpose(-2, -1)) * scale  # (B, H, c, c + L + R)
    band = skew(rect, keys.size(2) - c + 1)  # (B, H, c, W)
    if global_keys.size(2) == 0:
        return band
    glob = (q @ global_keys.transpose(-2, -1)) * scale  # (B, H, c, G)
    return torch.cat([glob, band], dim=-1)


def chunk_output(weights: Tensor, values: Tensor, global_values: Tensor) -> Tensor:
    """A chunk's output (B, H, c, Dv) from its weights (B, H, c, G + W), its band of ``values``
    (B, H, c + L + R, Dv) and the global values (B, H, G, Dv)."""
    G = global_values.size(2)
    out = unskew(weights[..., G:]) @ values  # (B, H, c, c + L + R) @ (B, H, c + L + R, Dv)
    if G:
        out = out + weights[..., :G] @ global_values  # (B, H, c, Dv)
    return out


def masked_softmax(
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


def span_of(pieces: tuple[Tensor, ...], length: int) -> Tensor:
    """The first ``length`` keys (or values) of the pieces, joined: (B, H, length, Dh)."""
    return torch.cat(pieces, dim=2)[:, :, :length]


def global_rows(
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
    weights = masked_softmax(scores, allowed, dropout_p)
    return weights @ v, weights


def skew(rect: Tensor, width: int) -> Tensor:
    """(..., c, c + W − 1) → (..., c, W): row r's columns r .. r + W − 1.

    Skewing: with c zeros after the rectangle's c·K values (K = c + W − 1), the flat index
    r·(K + 1) + m is r·K + (r + m), row r's column r + m.
    """
    *lead, c, K = rect.shape
    flat = F.pad(rect.flatten(-2), (0, c))  # (..., c·(K + 1))
    return flat.view(*lead, c, K + 1)[..., :width]


def unskew(band: Tensor) -> Tensor:
    """(..., c, W) → (..., c, c + W − 1), row r's W values at columns r .. r + W − 1, zeros
    elsewhere: ``skew`` undone."""
    *lead, c, W = band.shape
    flat = F.pad(band, (0, c)).flatten(-2)  # (..., c·(W + c)): each row then c zeros
    return flat[..., : c * (W + c - 1)].view(*lead, c, W + c - 1)
