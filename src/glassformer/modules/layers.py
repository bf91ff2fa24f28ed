"""Encoder and decoder layers, and the stacks made of them.

Shapes: B batch, S source length, T target length, D d_model, H heads.

Each sub-layer (attention or feed-forward) is wrapped in a residual connection with
dropout and a LayerNorm, in one of two orders:

    post-norm (the paper, ``norm_first=False``):  x = norm(x + dropout(sublayer(x)))
    pre-norm  (GPT-2 and most modern models):    x = x + dropout(sublayer(norm(x)))

A pre-norm stack ends with one more LayerNorm (``Encoder.norm``/``Decoder.norm``),
since its last residual sum is otherwise never normalised.

Parameter names match ``nn.TransformerEncoderLayer``/``nn.TransformerDecoderLayer``
(``self_attn``, ``cross_attn`` ≙ ``multihead_attn``, ``linear1``/``linear2`` inside
``feed_forward``, ``norm1..3``), so weights copy across one to one.
"""

from __future__ import annotations

from typing import Any, NamedTuple

from torch import Tensor, nn

from glassformer.modules.attention import MultiHeadAttention, check_dropout
from glassformer.modules.cache import DecoderCache, KVCache
from glassformer.modules.feedforward import feed_forward
from glassformer.modules.hooks import HookPoint
from glassformer.modules.norms import make_norm
from glassformer.modules.rotary import RotaryEmbedding


class LayerOutput(NamedTuple):
    """One layer's result. Weights are (B, H, Tq, Tk), None unless asked for."""

    hidden: Tensor  # (B, T, D)
    self_attn_weights: Tensor | None = None
    cross_attn_weights: Tensor | None = None


class StackOutput(NamedTuple):
    """A stack's result, with one weights tensor per layer when asked for."""

    hidden: Tensor  # (B, T, D)
    self_attn_weights: tuple[Tensor, ...] | None = None
    cross_attn_weights: tuple[Tensor, ...] | None = None


class _ResidualLayer(nn.Module):
    """What encoder and decoder layers share: the residual + LayerNorm wiring, and the hook
    points on the residual stream and on each sub-layer's output (all (B, T, D))."""

    def __init__(self, d_model: int, dropout: float, norm_first: bool) -> None:
        super().__init__()
        check_dropout(dropout)
        self.norm_first = norm_first
        self.dropout = nn.Dropout(dropout)  # on each sub-layer's output, before the sum
        self.hook_resid_pre = HookPoint()  # the layer's input
        self.hook_attn_out = HookPoint()  # self-attention's output, before the sum
        self.hook_resid_mid = HookPoint()  # after self-attention's residual sum (and norm)
        self.hook_mlp_out = HookPoint()  # the feed-forward's output, before the sum
        self.hook_resid_post = HookPoint()  # the layer's output

    def _in(self, x: Tensor, norm: nn.Module) -> Tensor:
        """The sub-layer's input: normalised first under pre-norm."""
        return norm(x) if self.norm_first else x

    def _out(self, x: Tensor, y: Tensor, norm: nn.Module) -> Tensor:
        """Add the sub-layer's output ``y`` to the residual ``x``; normalise under post-norm."""
        x = x + self.dropout(y)
        return x if self.norm_first else norm(x)


class EncoderLayer(_ResidualLayer):
    """Self-attention then feed-forward, each with residual + LayerNorm.

    With ``causal=True`` this is a GPT block (a decoder layer without cross-attention).

    Args:
        d_model: D.
        num_heads: H.
        d_ff: inner width of the feed-forward network.
        dropout: dropout on each residual branch and inside the FFN (where the paper has it).
        attention_dropout: dropout on the attention weights (``nn.Transformer*Layer`` uses
            ``dropout`` there; the paper none). Off by default: on CPU a non-zero value also
            forces attention off the fused kernel whenever a mask is present.
        activation: "relu", "gelu" or "gelu_tanh".
        norm_first: pre-norm (True) or the paper's post-norm (False).
        head_dim: width of one head; ``d_model // num_heads`` when None.
        qkv_bias: bias on the q, k, v projections.
        bias: bias on the output projection, the feed-forward layers and the LayerNorms
            (False, with ``qkv_bias=False``, is nanoGPT's bias-free block).
        causal: forbid attending to later positions.
        layer_norm_eps: the norms' epsilon.
        norm: "layer" (LayerNorm) or "rms" (RMSNorm, Llama's).
        num_kv_heads: key/value heads for grouped-query attention; None for H.
        rotary: rotary position embedding applied to q and k (shared by the layers).
        attention_window: w: local self-attention, each position attends the w before it
            and (unless causal) the w after it; None attends to all.
        global_tokens: with a window, the first positions that see and are seen by all.
    """

    def __init__(
        self,
        *,
        d_model: int,
        num_heads: int,
        d_ff: int,
        dropout: float = 0.1,
        attention_dropout: float = 0.0,
        activation: str = "relu",
        norm_first: bool = False,
        head_dim: int | None = None,
        qkv_bias: bool = True,
        bias: bool = True,
        causal: bool = False,
        layer_norm_eps: float = 1e-5,
        norm: str = "layer",
        num_kv_heads: int | None = None,
        rotary: RotaryEmbedding | None = None,
        attention_window: int | None = None,
        global_tokens: int = 0,
    ) -> None:
        super().__init__(d_model, dropout, norm_first)
        self.self_attn = MultiHeadAttention(
            d_model=d_model,
            num_heads=num_heads,
            head_dim=head_dim,
            dropout=attention_dropout,
            qkv_bias=qkv_bias,
            out_bias=bias,
            causal=causal,
            num_kv_heads=num_kv_heads,
            rotary=rotary,
            window=_window(attention_window, causal),
            global_tokens=global_tokens,
        )
        self.feed_forward = feed_forward(
            d_model=d_model, d_ff=d_ff, dropout=dropout, activation=activation, bias=bias
        )
        self.norm1 = make_norm(norm, d_model, eps=layer_norm_eps, bias=bias)
        self.norm2 = make_norm(norm, d_model, eps=layer_norm_eps, bias=bias)

    def forward(
        self,
        x: Tensor,
        mask: Tensor | None = None,
        *,
        need_weights: bool = False,
        cache: KVCache | None = None,
        positions: Tensor | None = None,
    ) -> LayerOutput:
        """x (B, T, D), mask broadcastable to (B, H, T, Tk) → LayerOutput.

        With a ``cache`` (decoding), ``x`` holds only the newest positions and
        self-attention also sees the cached ones (Tk = cached + T). ``positions`` (B, T)
        reach a rotary embedding, if any.
        """
        x = self.hook_resid_pre(x)
        attn = self.self_attn(
            self._in(x, self.norm1),
            mask=mask,
            need_weights=need_weights,
            cache=cache,
            positions=positions,
        )
        x = self.hook_resid_mid(self._out(x, self.hook_attn_out(attn.output), self.norm1))
        mlp = self.hook_mlp_out(self.feed_forward(self._in(x, self.norm2)))
        x = self.hook_resid_post(self._out(x, mlp, self.norm2))
        return LayerOutput(x, attn.weights)


class DecoderLayer(_ResidualLayer):
    """Masked self-attention, cross-attention to the encoder's output, then feed-forward.

    Arguments as for ``EncoderLayer``; ``causal`` defaults to True here. A window applies to
    the self-attention only: cross-attention reads the whole memory.
    """

    def __init__(
        self,
        *,
        d_model: int,
        num_heads: int,
        d_ff: int,
        dropout: float = 0.1,
        attention_dropout: float = 0.0,
        activation: str = "relu",
        norm_first: bool = False,
        head_dim: int | None = None,
        qkv_bias: bool = True,
        bias: bool = True,
        causal: bool = True,
        layer_norm_eps: float = 1e-5,
        attention_window: int | None = None,
        global_tokens: int = 0,
    ) -> None:
        super().__init__(d_model, dropout, norm_first)
        attention: dict[str, Any] = dict(
            d_model=d_model,
            num_heads=num_heads,
            head_dim=head_dim,
            dropout=attention_dropout,
            qkv_bias=qkv_bias,
            out_bias=bias,
        )
        self.self_attn = MultiHeadAttention(
            **attention,
            causal=causal,
            window=_window(attention_window, causal),
            global_tokens=global_tokens,
        )
        self.cross_attn = MultiHeadAttention(**attention)
        self.feed_forward = feed_forward(
            d_model=d_model, d_ff=d_ff, dropout=dropout, activation=activation, bias=bias
        )
        self.norm1 = make_norm("layer", d_model, eps=layer_norm_eps, bias=bias)
        self.norm2 = make_norm("layer", d_model, eps=layer_norm_eps, bias=bias)
        self.norm3 = make_norm("layer", d_model, eps=layer_norm_eps, bias=bias)
        self.hook_cross_attn_out = HookPoint()  # cross-attention's output, before the sum
        self.hook_resid_mid_cross = HookPoint()  # after cross-attention's residual sum

    def forward(
        self,
        x: Tensor,
        memory: Tensor,
        mask: Tensor | None = None,
        memory_mask: Tensor | None = None,
        *,
        need_weights: bool = False,
        cache: KVCache | None = None,
        memory_cache: KVCache | None = None,
    ) -> LayerOutput:
        """Run one decoder layer.

        Args:
            x: target-side hidden states, (B, T, D).
            memory: the encoder's output, (B, S, D).
            mask: self-attention mask, broadcastable to (B, H, T, T); causality is
                already built in.
            memory_mask: cross-attention mask, broadcastable to (B, H, T, S), usually the
                source padding mask (B, 1, 1, S).
            need_weights: return both attention maps.
            cache: self-attention keys/values of earlier positions (decoding); ``x`` then
                holds only the new positions.
            memory_cache: the memory's keys/values, filled on the first call.
        """
        x = self.hook_resid_pre(x)
        self_attn = self.self_attn(
            self._in(x, self.norm1), mask=mask, need_weights=need_weights, cache=cache
        )
        x = self.hook_resid_mid(self._out(x, self.hook_attn_out(self_attn.output), self.norm1))
        cross = self.cross_attn(
            self._in(x, self.norm2),
            memory,
            mask=memory_mask,
            need_weights=need_weights,
            cache=memory_cache,
        )
        x = self._out(x, self.hook_cross_attn_out(cross.output), self.norm2)
        x = self.hook_resid_mid_cross(x)
        mlp = self.hook_mlp_out(self.feed_forward(self._in(x, self.norm3)))
        x = self.hook_resid_post(self._out(x, mlp, self.norm3))
        return LayerOutput(x, self_attn.weights, cross.weights)


class Encoder(nn.Module):
    """A stack of ``EncoderLayer``s, with a final LayerNorm under pre-norm.

    Args:
        num_layers: how many layers.
        final_norm: add a LayerNorm after the last layer; defaults to ``norm_first``.
        **layer_kwargs: passed to every ``EncoderLayer`` (d_model, num_heads, d_ff, ...).
    """

    def __init__(self, *, num_layers: int, final_norm: bool | None = None, **layer_kwargs) -> None:
        super().__init__()
        if num_layers <= 0:
            raise ValueError(f"num_layers must be a positive integer, got {num_layers}")
        self.layers = nn.ModuleList(EncoderLayer(**layer_kwargs) for _ in range(num_layers))
        self.norm = _final_norm(final_norm, layer_kwargs)

    def forward(
        self,
        x: Tensor,
        mask: Tensor | None = None,
        *,
        need_weights: bool = False,
        cache: DecoderCache | None = None,
        positions: Tensor | None = None,
    ) -> StackOutput:
        """x (B, T, D), mask broadcastable to (B, H, T, Tk) → StackOutput.

        ``cache`` (causal stacks, decoding): one ``KVCache`` per layer; ``x`` is then only
        the newest positions. ``positions`` (B, T) reach rotary embeddings, if any.
        """
        weights = []
        for i, layer in enumerate(self.layers):
            layer_cache = None if cache is None else cache.self_attn[i]
            x, w, _ = layer(
                x, mask, need_weights=need_weights, cache=layer_cache, positions=positions
            )
            weights.append(w)
        if self.norm is not None:
            x = self.norm(x)
        return StackOutput(x, tuple(weights) if need_weights else None)


class Decoder(nn.Module):
    """A stack of ``DecoderLayer``s, with a final LayerNorm under pre-norm.

    Args:
        num_layers: how many layers.
        final_norm: add a LayerNorm after the last layer; defaults to ``norm_first``.
        **layer_kwargs: passed to every ``DecoderLayer``.
    """

    def __init__(self, *, num_layers: int, final_norm: bool | None = None, **layer_kwargs) -> None:
        super().__init__()
        if num_layers <= 0:
            raise ValueError(f"num_layers must be a positive integer, got {num_layers}")
        self.layers = nn.ModuleList(DecoderLayer(**layer_kwargs) for _ in range(num_layers))
        self.norm = _final_norm(final_norm, layer_kwargs)

    def forward(
        self,
        x: Tensor,
        memory: Tensor,
        mask: Tensor | None = None,
        memory_mask: Tensor | None = None,
        *,
        need_weights: bool = False,
        cache: DecoderCache | None = None,
    ) -> StackOutput:
        """x (B, T, D), memory (B, S, D) → StackOutput with self- and cross-attention maps.

        ``cache`` (decoding; built with ``cross_attention=True``): ``x`` is then only the
        newest positions, and the memory's keys/values are projected once.
        """
        self_weights, cross_weights = [], []
        for i, layer in enumerate(self.layers):
            caches = {}
            if cache is not None:
                cross = cache.cross_attn[i] if cache.cross_attn else None
                caches = dict(cache=cache.self_attn[i], memory_cache=cross)
            x, w_self, w_cross = layer(
                x, memory, mask, memory_mask, need_weights=need_weights, **caches
            )
            self_weights.append(w_self)
            cross_weights.append(w_cross)
        if self.norm is not None:
            x = self.norm(x)
        if not need_weights:
            return StackOutput(x)
        return StackOutput(x, tuple(self_weights), tuple(cross_weights))


def _window(attention_window: int | None, causal: bool) -> tuple[int, int] | None:
    """A layer's ``attention_window`` w as its attention's window: (w, 0) causal, else (w, w)."""
    if attention_window is None:
        return None
    return (attention_window, 0 if causal else attention_window)


def _final_norm(final_norm: bool | None, layer_kwargs: dict) -> nn.Module | None:
    if final_norm is None:
        final_norm = layer_kwargs.get("norm_first", False)
    if not final_norm:
        return None
    return make_norm(
        layer_kwargs.get("norm", "layer"),
        layer_kwargs["d_model"],
        eps=layer_kwargs.get("layer_norm_eps", 1e-5),
        bias=layer_kwargs.get("bias", True),
    )
