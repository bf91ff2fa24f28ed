"""Multi-head attention: project, split into heads, attend, merge, project.

Shapes used throughout:
    B  batch size          H   number of heads (Hkv key/value heads)
    Tq query length        Dh  dimension of one head
    Tk key/value length    D   model width (d_model)

The attention itself, softmax(q kᵀ / √Dh) v with its masks, is ``modules.sdpa``; sliding
windows are ``modules.local_attention``. Masks are boolean, True = may attend, broadcast
to (B, H, Tq, Tk).
"""

from __future__ import annotations

import math
from typing import cast

import torch
from torch import Tensor, nn

from glassformer.modules.cache import KVCache
from glassformer.modules.heads import check_dropout, check_heads, linear_rows, split_heads
from glassformer.modules.hooks import HookPoint
from glassformer.modules.local_attention import Window, check_global_tokens, check_window
from glassformer.modules.rotary import RotaryAngles, RotaryEmbedding
from glassformer.modules.sdpa import ATTEND, Attending, AttentionOutput, Scores, fused_attention

__all__ = [
    "AttentionOutput",
    "MultiHeadAttention",
    "Scores",
    "Window",
    "check_dropout",
    "check_heads",
]


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
        rotary: rotate queries and keys by their positions (RoPE) before attending:
            a ``RotaryEmbedding`` of its own, or True for the angles the model computes
            once for every layer and passes in (``forward(angles=)``);
            self-attention only.
        window: ``(left, right)``: local (sliding-window) self-attention, query i attends
            keys i − left .. i + right, computed in chunks (``modules.local_attention``) so
            time and memory grow as T·(left + right), not T². A causal layer's window is
            ``(w, 0)``. Masks must then be key masks, (B, 1, 1, Tk).
        global_tokens: with a window, the first this many positions see every key and are
            seen by every query (Longformer's [CLS]).
        q_norm: a norm over each head's Dh features, applied to the projected queries
            before the rotation (QK-norm: Qwen3, Gemma 3); given with ``k_norm``. Its
            output passes its own ``hook_normalized``, seen as (B, T, H, Dh).
        k_norm: the same for the keys, (B, T, Hkv, Dh).
        clip: q, k and v clamped into [−clip, clip] as they are projected (OLMo's
            ``clip_qkv``), or None.
        scores: what the scores become before the softmax, ``Scores(scale, softcap)``:
            multiplied by ``scale`` instead of 1/√Dh (Gemma's ``query_pre_attn_scalar``^-½;
            applied to the queries as they enter attention, so every path honours it), then
            squashed into (−c, c) as c·tanh(s / c) by ``softcap`` (Gemma 2; such a layer
            attends on the readable path). None: the paper's scores.
        attend: the name in ``modules.sdpa.ATTEND`` of the way this layer always attends
            ("readable", "fused", "window", or one registered elsewhere); None chooses per
            call: PyTorch's fused kernel where nothing needs more (called directly: the
            common case), else the window's where there is one, else the readable path.
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
        rotary: RotaryEmbedding | bool | None = None,
        window: tuple[int, int] | None = None,
        global_tokens: int = 0,
        q_norm: nn.Module | None = None,
        k_norm: nn.Module | None = None,
        scores: Scores | None = None,
        attend: str | None = None,
        clip: float | None = None,
    ) -> None:
        super().__init__()
        if attend is not None and attend not in ATTEND:
            raise ValueError(f"attend must be one of {sorted(ATTEND)} or None, got {attend!r}")
        if attend == "fused" and scores is not None and scores.softcap is not None:
            raise ValueError("the fused kernel cannot soft-cap the scores; attend='readable'")
        if (attend == "window") != (window is not None) and attend is not None:
            raise ValueError(f"attend={attend!r} with window={window!r}: a window attends 'window'")
        if (q_norm is None) != (k_norm is None):
            raise ValueError("q_norm and k_norm come together: give both or neither")
        head_dim = check_heads(d_model, num_heads, head_dim)
        if clip is not None and not 0 < clip < math.inf:
            raise ValueError(f"clip must be a positive number, got {clip!r}")
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
        if isinstance(rotary, RotaryEmbedding) and rotary.head_dim != head_dim:
            raise ValueError(f"rotary head_dim={rotary.head_dim} differs from head_dim={head_dim}")
        self.rotary = rotary if isinstance(rotary, RotaryEmbedding) else None
        self.rotates = rotary is not None and rotary is not False
        inner = num_heads * head_dim
        kv_inner = num_kv_heads * head_dim
        self.qkv_proj = nn.Linear(d_model, inner + 2 * kv_inner, bias=qkv_bias)
        self.out_proj = nn.Linear(inner, d_model, bias=out_bias)
        self.q_norm, self.k_norm, self.clip = q_norm, k_norm, clip
        self.scores = Scores() if scores is None else scores
        self.attend = attend
        # What a look inside can read or replace (B batch, T positions, H heads):
        self.hook_q = HookPoint()  # (B, Tq, H, Dh), projected (before any rotation)
        self.hook_k = HookPoint()  # (B, Tk, Hkv, Dh); this call's keys, not the cached ones
        self.hook_v = HookPoint()  # (B, Tk, Hkv, Dh)
        if self.rotates:
            self.hook_rot_q = HookPoint()  # (B, Tq, H, Dh), rotated by position
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
        *,
        angles: RotaryAngles | None = None,
        bias: Tensor | None = None,
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
            angles: the rotation of this call's positions, computed once for every layer
                by the model (``RotaryEmbedding.cos_sin``): q and k are turned by them
                (self-attention only), with or without a ``rotary`` of the module's own.
            bias: added to every score (after the scale, before the mask), broadcastable to
                (B, H, Tq, Tk): positions as T5 gives them. It takes the readable path.

        Returns:
            ``AttentionOutput(output (B, Tq, D), weights (B, H, Tq, Tk) or None)``.
        """
        if query.dim() != 3 or query.size(-1) != self.d_model:
            raise ValueError(
                f"query must be (batch, length, {self.d_model}), got {tuple(query.shape)}"
            )
        if key is None:  # q (B, H, T, Dh), k and v (B, Hkv, Tk, Dh), the cached ones too
            q, k, v = self._project(query, None, None)
            if self.q_norm is not None:
                q, k = self._normed(self.q_norm, q), self._normed(cast(nn.Module, self.k_norm), k)
            if self.rotates or angles is not None:
                q, k = self._rotate(q, k, angles, positions, cache)
            if cache is not None:
                k, v = cache.append(k, v)
        else:
            q, k, v = self._project_memory(query, key, value, cache)
        if self.scores.scale is not None:  # scores × scale instead of / √Dh
            q = self.scores.queries(q)
        looking = need_weights or bool(self.hook_attn_scores.fns or self.hook_pattern.fns)
        dropout_p = self.dropout if self.training else 0.0
        plain = self.scores.softcap is None and bias is None and k.dtype == q.dtype
        if self.attend is None and self.window is None and plain and not looking:
            out = fused_attention(q, k, v, mask, dropout_p, self.causal)  # the common case
            return AttentionOutput(self._merge(out), None)
        if self.window is not None and key is not None:
            raise ValueError("a windowed attention layer attends to itself")
        how = Attending(
            mask, dropout_p, self.causal, looking, (self.hook_attn_scores, self.hook_pattern),
            self.scores, bias, self.window, self.global_tokens, cache,
        )  # fmt: skip
        path = self.attend or ("window" if self.window is not None else "readable")
        if k.dtype != q.dtype and path != "fused":  # a cache keeping its keys wider (static)
            q = q.to(k.dtype)
        out, weights = ATTEND[path](q, k, v, how)
        if out.dtype != query.dtype:
            out = out.to(query.dtype)
        return AttentionOutput(self._merge(out), weights if need_weights else None)

    @property
    def scale(self) -> float | None:
        """What the scores q·k are multiplied by (None: 1/√Dh)."""
        return self.scores.scale

    @property
    def softcap(self) -> float | None:
        """The scores' soft cap c (None: none)."""
        return self.scores.softcap

    def _project_memory(
        self, query: Tensor, key: Tensor, value: Tensor | None, cache: KVCache | None
    ) -> tuple[Tensor, Tensor, Tensor]:
        """Cross-attention's q, k and v: k and v from the memory, projected on the first
        call and kept in the ``cache`` (if any) for the next ones."""
        if cache is not None and len(cache) > 0:
            q = self._hooked(self.hook_q, split_heads(self._project_query(query), self.num_heads))
            return q, cache.keys, cache.values  # the memory's, computed on the first call
        q, k, v = self._project(query, key, value)
        if cache is not None:
            k, v = cache.append(k, v)
        return q, k, v

    def _rotate(
        self,
        q: Tensor,
        k: Tensor,
        angles: RotaryAngles | None,
        positions: Tensor | None,
        cache: KVCache | None,
    ) -> tuple[Tensor, Tensor]:
        """q and k turned by their positions: by the module's own ``rotary`` if it has one
        (a layer whose base differs from the model's: Gemma's sliding layers), else by the
        ``angles`` the model passes. Angles given to a module that does not rotate are an
        error."""
        if not self.rotates:
            raise ValueError("angles given to an attention that does not rotate (rotary=None)")
        if self.rotary is not None or angles is None:
            if self.rotary is None:
                raise ValueError("this attention rotates by the angles it is given; pass angles=")
            if positions is None:
                start = 0 if cache is None else len(cache)
                positions = torch.arange(start, start + q.size(2), device=q.device)
            angles = self.rotary.cos_sin(positions, q.dtype)
        q, k = RotaryEmbedding.rotate(q, angles), RotaryEmbedding.rotate(k, angles)
        return self._hooked(self.hook_rot_q, q), self._hooked(self.hook_rot_k, k)

    def _merge(self, out: Tensor) -> Tensor:
        """The heads' outputs (B, H, Tq, Dh) side by side, projected: (B, Tq, D)."""
        z = self.hook_z(out.transpose(1, 2))  # (B, Tq, H, Dh)
        if self.hook_result.fns:
            return self._from_heads(z)
        B, Tq, H, Dh = z.shape
        return self.out_proj(z.reshape(B, Tq, H * Dh))  # heads side by side (B, Tq, H·Dh)

    @staticmethod
    def _normed(norm: nn.Module, x: Tensor) -> Tensor:
        """``norm`` over each head's features: x (B, H, T, Dh), normed as (B, T, H, Dh)."""
        return norm(x.transpose(1, 2)).transpose(1, 2)

    @staticmethod
    def _hooked(point: HookPoint, x: Tensor) -> Tensor:
        """A hook point on per-head values, which it sees as (B, T, H, Dh); x is (B, H, T, Dh)."""
        if not point.fns:  # (no hook attached: the common case, kept to one test)
            return x
        return point(x.transpose(1, 2)).transpose(1, 2)

    def _from_heads(self, z: Tensor) -> Tensor:
        """The output as the sum of each head's share (``hook_result``), plus the bias:
        z (B, Tq, H, Dh) → (B, Tq, D)."""
        H, Dh = self.num_heads, self.head_dim
        W = self.out_proj.weight.to(z.dtype).view(self.d_model, H, Dh)  # head h's columns
        result = self.hook_result(torch.einsum("bthd,mhd->bthm", z, W))  # (B, Tq, H, D)
        out = result.sum(dim=2)
        return out if self.out_proj.bias is None else out + self.out_proj.bias

    def _project_query(self, query: Tensor) -> Tensor:
        """The q projection alone, (B, Tq, H·Dh)."""
        return linear_rows(self.qkv_proj, query, 0, self.num_heads * self.head_dim)

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
            if self.clip is not None:
                qkv = qkv.clamp(-self.clip, self.clip)
            if Hkv == H:
                qkv = qkv.view(B, T, 3, H, Dh).permute(2, 0, 3, 1, 4)  # (3, B, H, T, Dh)
                q, k, v = qkv.unbind(0)  # views; unbind's backward is one stack, no zero-fill
                return self._hooked_qkv(q, k, v)
            q, k, v = (  # (B, T, H·Dh), (B, T, Hkv·Dh) twice → (B, heads, T, Dh)
                x.view(B, T, -1, Dh).transpose(1, 2) for x in qkv.split(sizes, dim=-1)
            )
            return self._hooked_qkv(q, k, v)

        value = key if value is None else value
        q = linear_rows(self.qkv_proj, query, 0, inner)  # (B, Tq, H·Dh)
        end = inner + 2 * Hkv * Dh
        if value is key:
            # The memory is both keys and values: one matmul for the two.
            k, v = linear_rows(self.qkv_proj, key, inner, end).chunk(2, dim=-1)
        else:  # each (B, Tk, Hkv·Dh)
            k = linear_rows(self.qkv_proj, key, inner, inner + Hkv * Dh)
            v = linear_rows(self.qkv_proj, value, inner + Hkv * Dh, end)
        return self._hooked_qkv(split_heads(q, H), split_heads(k, Hkv), split_heads(v, Hkv))

    def _hooked_qkv(self, q: Tensor, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """q, k and v through their hook points."""
        points = self.hook_q, self.hook_k, self.hook_v
        if not (points[0].fns or points[1].fns or points[2].fns):
            return q, k, v
        hooked = self._hooked
        return hooked(points[0], q), hooked(points[1], k), hooked(points[2], v)

    def extra_repr(self) -> str:
        return (
            f"d_model={self.d_model}, num_heads={self.num_heads}, "
            f"num_kv_heads={self.num_kv_heads}, head_dim={self.head_dim}, "
            f"dropout={self.dropout}, causal={self.causal}"
            + ("" if self.window is None else f", window={self.window}")
            + (f", global_tokens={self.global_tokens}" if self.global_tokens else "")
        )
