"""Scaled dot-product attention and multi-head attention.

Shapes used throughout:
    B  batch size          H   number of heads
    Tq query length        Dh  dimension of one head
    Tk key/value length    D   model width (d_model)

Masks are boolean and True means "may attend". They broadcast to (B, H, Tq, Tk):
a padding mask is (B, 1, 1, Tk), a causal mask (Tq, Tk). A query row that may
attend to no key at all produces zeros (never NaN) on both paths.
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple, cast

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from glassformer.modules.cache import KVCache
from glassformer.modules.hooks import HookPoint
from glassformer.modules.local_attention import (
    as_key_mask,
    band_to_dense,
    check_global_tokens,
    check_window,
    local_attention,
    window_allowed,
)
from glassformer.modules.masks import causal_mask, check_mask
from glassformer.modules.rotary import RotaryEmbedding


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

    Returns:
        ``AttentionOutput(output (B, H, Tq, Dv), weights (B, H, Tq, Tk) or None)``.
    """
    if not 0.0 <= dropout_p < 1.0:
        raise ValueError(f"dropout_p must be in [0, 1), got {dropout_p}")
    check_mask(mask)
    Tq, Tk = q.size(-2), k.size(-2)
    if is_causal and Tq == 1:
        is_causal = False  # one query at the end of the keys may see all of them
    group = _group_size(q, k)

    if not need_weights and not _fused_is_slow(q, k):
        # The fused kernel shares the key/value heads itself (enable_gqa): measured 1.4x
        # faster than repeating them for training, 2-3x for a decoding step (B=1-8, 9 query
        # heads on 3, 256-1024 keys; bit-identical outputs).
        gqa = group > 1
        if is_causal and mask is None and Tq == Tk:
            # The fused kernel builds the triangle itself; no mask is materialised.
            out = F.scaled_dot_product_attention(
                q, k, v, dropout_p=dropout_p, is_causal=True, enable_gqa=gqa
            )
            return AttentionOutput(out, None)
        if is_causal:
            mask = _and(mask, causal_mask(Tq, Tk, device=q.device))
        out = F.scaled_dot_product_attention(
            q, k, v, attn_mask=mask, dropout_p=dropout_p, enable_gqa=gqa
        )
        return AttentionOutput(out, None)

    if is_causal:
        mask = _and(mask, causal_mask(Tq, Tk, device=q.device))
    if group > 1:  # spelled out: each key/value head repeated for the query heads it serves
        k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
    out, weights = _attend(q, k, v, mask, dropout_p, hooks)
    return AttentionOutput(out, weights if need_weights else None)


def _attend(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    mask: Tensor | None,
    dropout_p: float,
    hooks: tuple[HookPoint, HookPoint] | None = None,
) -> tuple[Tensor, Tensor]:
    """The readable path, step by step: (output (B, H, Tq, Dv), weights (B, H, Tq, Tk))."""
    scores = q @ k.transpose(-2, -1)  # (B, H, Tq, Tk)
    scores = scores / math.sqrt(q.size(-1))
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
    low_precision = q.dtype in (torch.bfloat16, torch.float16)
    return q.device.type == "cpu" and low_precision and k.size(-2) <= 128


def _and(mask: Tensor | None, other: Tensor) -> Tensor:
    return other if mask is None else mask & other


class MultiHeadAttention(nn.Module):
    """Multi-head attention: project, split into heads, attend, merge, project.

    One module does self-attention (``key`` omitted) and cross-attention (``key`` and
    ``value`` given, usually the encoder's output). Causality is fixed at construction.

    The projections follow ``nn.MultiheadAttention``'s layout so weights copy across:
    ``qkv_proj`` is a Linear D → 3·H·Dh whose rows are [q; k; v], each head-major, and
    ``out_proj`` a Linear H·Dh → D. Cross-attention applies the q rows to the query and
    the k, v rows to the memory.

    Args:
        d_model: model width D.
        num_heads: number of heads H.
        head_dim: width of one head Dh; ``d_model // num_heads`` when None. Bloem's
            "wide" heads are ``head_dim=d_model``.
        dropout: dropout on the attention weights.
        qkv_bias: whether the q, k, v projections have a bias.
        out_bias: whether the output projection has a bias.
        causal: each query may only attend to keys at or before its own position.
        num_kv_heads: key/value heads Hkv for grouped-query attention (Ainslie et al.,
            2023); None means one per query head (H). Query head h reads key/value head
            h // (H / Hkv), as in Hugging Face's ``repeat_kv``. The k and v rows of
            ``qkv_proj`` are then Hkv·Dh each, and a cache stores only the Hkv heads.
        rotary: rotate queries and keys by their positions (RoPE) before attending;
            self-attention only.
        window: ``(left, right)``: local (sliding-window) self-attention, query i attends
            keys i − left .. i + right, computed in chunks (``modules.local_attention``) so
            time and memory grow as T·(left + right), not T². A causal layer's window is
            ``(w, 0)``. Masks must then be key masks, (B, 1, 1, Tk).
        global_tokens: with a window, the first this many positions see every key and are
            seen by every query (Longformer's [CLS]).
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
        num_kv_heads: int | None = None,
        rotary: RotaryEmbedding | None = None,
        window: tuple[int, int] | None = None,
        global_tokens: int = 0,
    ) -> None:
        super().__init__()
        head_dim = check_heads(d_model, num_heads, head_dim)
        self.window = None if window is None else check_window(window)
        self.global_tokens = check_global_tokens(global_tokens)
        if self.window is None and global_tokens:
            raise ValueError(
                f"global_tokens={global_tokens} needs a window; pass window=(left, right)"
            )
        if causal and self.window is not None and self.window[1] != 0:
            raise ValueError(f"a causal layer's window looks back only: (w, 0), got {self.window}")
        num_kv_heads = num_heads if num_kv_heads is None else num_kv_heads
        if num_kv_heads <= 0 or num_heads % num_kv_heads != 0:
            raise ValueError(
                f"num_kv_heads must be a positive divisor of num_heads={num_heads}, "
                f"got {num_kv_heads}"
            )
        check_dropout(dropout)
        self.d_model = d_model
        self.num_heads = num_heads
        self.num_kv_heads = num_kv_heads
        self.head_dim = head_dim
        self.dropout = dropout
        self.causal = causal
        if rotary is not None and rotary.head_dim != head_dim:
            raise ValueError(f"rotary head_dim={rotary.head_dim} differs from head_dim={head_dim}")
        self.rotary = rotary
        inner = num_heads * head_dim
        kv_inner = num_kv_heads * head_dim
        self.qkv_proj = nn.Linear(d_model, inner + 2 * kv_inner, bias=qkv_bias)
        self.out_proj = nn.Linear(inner, d_model, bias=out_bias)
        # What a look inside can read or replace (B batch, T positions, H heads):
        self.hook_q = HookPoint()  # (B, Tq, H, Dh), projected (before any rotation)
        self.hook_k = HookPoint()  # (B, Tk, Hkv, Dh); this call's keys, not the cached ones
        self.hook_v = HookPoint()  # (B, Tk, Hkv, Dh)
        self.hook_rot_q = HookPoint()  # (B, Tq, H, Dh), rotated by position (rotary only)
        self.hook_rot_k = HookPoint()  # (B, Tk, Hkv, Dh)
        self.hook_attn_scores = HookPoint()  # (B, H, Tq, Tk), scaled, masked to the lowest float
        self.hook_pattern = HookPoint()  # (B, H, Tq, Tk), the weights
        self.hook_z = HookPoint()  # (B, Tq, H, Dh), each head's weighted sum of values
        self.hook_result = HookPoint()  # (B, Tq, H, D), each head's share of the output;
        # computed only when hooked (it is H times the output)

    def forward(
        self,
        query: Tensor,
        key: Tensor | None = None,
        value: Tensor | None = None,
        mask: Tensor | None = None,
        need_weights: bool = False,
        cache: KVCache | None = None,
        positions: Tensor | None = None,
    ) -> AttentionOutput:
        """Attend from ``query`` to ``key``/``value`` (or to itself).

        Args:
            query: (B, Tq, D).
            key: (B, Tk, D), or None for self-attention.
            value: (B, Tk, D); defaults to ``key``.
            mask: boolean, True = may attend, broadcastable to (B, H, Tq, Tk), where Tk
                counts the cached keys too.
            need_weights: also return the per-head weights (B, H, Tq, Tk). Without them
                the fused kernel runs.
            cache: decoding state. Self-attention appends this call's keys and values
                and attends over all of them (the queries are the newest positions);
                cross-attention fills it from ``key`` once and then reuses it.
            positions: with ``rotary``, each query's position (B, Tq) or (Tq,); by
                default they follow on from the cache (0, 1, ... without one).

        Returns:
            ``AttentionOutput(output (B, Tq, D), weights (B, H, Tq, Tk) or None)``.
        """
        if query.dim() != 3 or query.size(-1) != self.d_model:
            raise ValueError(
                f"query must be (batch, length, {self.d_model}), got {tuple(query.shape)}"
            )
        if cache is not None and key is not None and len(cache) > 0:
            q = _split_heads(self._project_query(query), self.num_heads)
            q = _by_position(self.hook_q, q)
            k, v = cache.keys, cache.values  # the memory's, computed on the first call
        else:
            q, k, v = self._project(query, key, value)  # q (B, H, T, Dh), k, v (B, Hkv, T, Dh)
            q, k = _by_position(self.hook_q, q), _by_position(self.hook_k, k)
            v = _by_position(self.hook_v, v)
            if self.rotary is not None and key is None:
                if positions is None:
                    start = 0 if cache is None else len(cache)
                    positions = torch.arange(start, start + q.size(2), device=q.device)
                q, k = self.rotary(q, positions), self.rotary(k, positions)  # cached rotated
                q, k = _by_position(self.hook_rot_q, q), _by_position(self.hook_rot_k, k)
            if cache is not None:
                k, v = cache.append(k, v)
        dropout_p = self.dropout if self.training else 0.0  # k, v keep their Hkv heads
        # The scores and weights exist on the readable path only: a hook on them takes it.
        looking = self.hook_attn_scores.active or self.hook_pattern.active
        if self.window is not None:
            if key is not None:
                raise ValueError("a windowed attention layer attends to itself; key must be None")
            out, weights = self._local(q, k, v, mask, dropout_p, need_weights or looking, cache)
        else:
            out, weights = self._dense(q, k, v, mask, dropout_p, need_weights or looking)
        z = self.hook_z(out.transpose(1, 2))  # (B, Tq, H, Dh)
        B, Tq, H, Dh = z.shape
        if self.hook_result.active:
            return AttentionOutput(self._from_heads(z), weights if need_weights else None)
        out = self.out_proj(z.reshape(B, Tq, H * Dh))  # heads side by side (B, Tq, H·Dh)
        return AttentionOutput(out, weights if need_weights else None)

    def _dense(
        self, q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, dropout_p: float, weights: bool
    ) -> AttentionOutput:
        """Every query against every key it may attend: (B, H, Tq, Dh), weights or None."""
        return scaled_dot_product_attention(
            q,
            k,
            v,
            mask,
            dropout_p,
            need_weights=weights,
            is_causal=self.causal,
            hooks=(self.hook_attn_scores, self.hook_pattern),
        )

    def _local(
        self,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        mask: Tensor | None,
        dropout_p: float,
        weights: bool,
        cache: KVCache | None,
    ) -> AttentionOutput:
        """Each query against the keys in its window: (B, H, Tq, Dh), dense weights
        (B, H, Tq, Tk) or None. The scores and pattern hooks see the band (B, H, T, G + W).

        Without earlier keys (no cache, or its first call) this is ``local_attention``'s
        chunked band. Decoding with a cache, the few new queries attend the keys the cache
        kept (a rolling one keeps only the window) through a dense window mask.
        """
        assert self.window is not None
        B, Tq, Tk = q.size(0), q.size(2), k.size(2)
        hooks = (self.hook_attn_scores, self.hook_pattern)
        if Tk == Tq:
            out, band = local_attention(
                q,
                k,
                v,
                self.window,
                global_tokens=self.global_tokens,
                key_mask=as_key_mask(mask, B, Tk),
                dropout_p=dropout_p,
                need_weights=weights,
                hooks=hooks,
            )
            return AttentionOutput(out, None if band is None else band_to_dense(band, self.window))
        assert cache is not None  # more keys than queries: the cache's
        key_pos = cache.key_positions.to(q.device)  # (Tk,) the kept keys' positions
        query_pos = torch.arange(len(cache) - Tq, len(cache), device=q.device)
        allowed = window_allowed(query_pos, key_pos, self.window, self.global_tokens)
        keys = as_key_mask(mask, B, len(cache))  # the mask covers every key seen so far
        if keys is not None:
            allowed = allowed & keys[:, None, None, key_pos]  # (B, 1, Tq, Tk)
        return scaled_dot_product_attention(
            q, k, v, allowed, dropout_p, need_weights=weights, hooks=hooks
        )

    def _from_heads(self, z: Tensor) -> Tensor:
        """The output as the sum of each head's share (``hook_result``), plus the bias:
        z (B, Tq, H, Dh) → (B, Tq, D)."""
        H, Dh = self.num_heads, self.head_dim
        W = self.out_proj.weight if isinstance(self.out_proj, nn.Linear) else None
        W = self.out_proj.dequantized() if W is None else W  # a quantised layer's, unpacked
        W = W.view(self.d_model, H, Dh)  # (D, H, Dh): head h's columns
        result = self.hook_result(torch.einsum("bthd,mhd->bthm", z, W))  # (B, Tq, H, D)
        out = result.sum(dim=2)
        return out if self.out_proj.bias is None else out + self.out_proj.bias

    def _project_query(self, query: Tensor) -> Tensor:
        """The q projection alone, (B, Tq, H·Dh)."""
        return _linear_rows(self.qkv_proj, query, 0, self.num_heads * self.head_dim)

    def _project(
        self, query: Tensor, key: Tensor | None, value: Tensor | None
    ) -> tuple[Tensor, Tensor, Tensor]:
        """The q, k, v projections, split into heads: q (B, H, T, Dh), k and v (B, Hkv, T, Dh)."""
        H, Hkv, Dh = self.num_heads, self.num_kv_heads, self.head_dim
        inner = H * Dh
        sizes = [inner, Hkv * Dh, Hkv * Dh]
        if key is None:
            if value is not None:
                raise ValueError("value given without key; pass both for cross-attention")
            B, T, _ = query.shape
            qkv = self.qkv_proj(query)  # (B, T, (H + 2·Hkv)·Dh), one matmul for all three
            if Hkv == H:
                qkv = qkv.view(B, T, 3, H, Dh).permute(2, 0, 3, 1, 4)  # (3, B, H, T, Dh)
                q, k, v = qkv.unbind(0)  # views; unbind's backward is one stack, no zero-fill
                return q, k, v
            q, k, v = qkv.split(sizes, dim=-1)  # (B, T, H·Dh), (B, T, Hkv·Dh) twice
            return _split_heads(q, H), _split_heads(k, Hkv), _split_heads(v, Hkv)

        value = key if value is None else value
        q = _linear_rows(self.qkv_proj, query, 0, inner)  # (B, Tq, H·Dh)
        end = inner + 2 * Hkv * Dh
        if value is key:
            # The memory is both keys and values: one matmul for the two.
            k, v = _linear_rows(self.qkv_proj, key, inner, end).chunk(2, dim=-1)
        else:  # each (B, Tk, Hkv·Dh)
            k = _linear_rows(self.qkv_proj, key, inner, inner + Hkv * Dh)
            v = _linear_rows(self.qkv_proj, value, inner + Hkv * Dh, end)
        return _split_heads(q, H), _split_heads(k, Hkv), _split_heads(v, Hkv)

    def extra_repr(self) -> str:
        return (
            f"d_model={self.d_model}, num_heads={self.num_heads}, "
            f"num_kv_heads={self.num_kv_heads}, head_dim={self.head_dim}, "
            f"dropout={self.dropout}, causal={self.causal}"
            + ("" if self.window is None else f", window={self.window}")
            + (f", global_tokens={self.global_tokens}" if self.global_tokens else "")
        )


def _by_position(point: HookPoint, x: Tensor) -> Tensor:
    """A hook point on per-head values, which it sees as (B, T, H, Dh); x is (B, H, T, Dh)."""
    if not point.active:
        return x
    return point(x.transpose(1, 2)).transpose(1, 2)


def _linear_rows(layer: nn.Module, x: Tensor, start: int, stop: int) -> Tensor:
    """Output features ``start:stop`` of the linear ``layer`` applied to ``x``: a slice of
    the weight's rows, or what a quantised layer offers for it (``forward_rows``)."""
    if isinstance(layer, nn.Linear):
        b = None if layer.bias is None else layer.bias[start:stop]
        return F.linear(x, layer.weight[start:stop], b)
    return cast(Any, layer).forward_rows(x, start, stop)


def _split_heads(x: Tensor, num_heads: int) -> Tensor:
    B, T, inner = x.shape
    return x.view(B, T, num_heads, inner // num_heads).transpose(1, 2)  # (B, H, T, Dh)


def check_heads(d_model: int, num_heads: int, head_dim: int | None) -> int:
    """Validate the head geometry and return the head width Dh."""
    if d_model <= 0:
        raise ValueError(f"d_model must be a positive integer, got {d_model}")
    if num_heads <= 0:
        raise ValueError(f"num_heads must be a positive integer, got {num_heads}")
    if head_dim is None:
        if d_model % num_heads != 0:
            raise ValueError(
                f"d_model={d_model} is not divisible by num_heads={num_heads}; "
                "choose another num_heads or set head_dim explicitly"
            )
        return d_model // num_heads
    if head_dim <= 0:
        raise ValueError(f"head_dim must be a positive integer or None, got {head_dim}")
    return head_dim


def check_dropout(p: float, name: str = "dropout") -> None:
    if not 0.0 <= p < 1.0:
        raise ValueError(f"{name} must be in [0, 1), got {p}")
