"""The paper's encoder and decoder built from keyword arguments: their layers and stacks.

Shapes: B batch, T length, S memory length, D d_model, H heads.

``EncoderLayer`` and ``DecoderLayer`` are ``Block``s whose parts are chosen as
``nn.TransformerEncoderLayer``'s are; ``Encoder`` and ``Decoder`` are ``Stack``s
(``modules.block``: blocks and a final norm) built from the keyword arguments of their
layers. The models' ``Backbone`` is the same ``Stack`` with embeddings in front.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from torch import Tensor, nn

from glassformer.modules.attention import MultiHeadAttention
from glassformer.modules.block import (
    Block,
    BlockOutput,
    Stack,
    StackOutput,
)
from glassformer.modules.feedforward import feed_forward
from glassformer.modules.local_attention import window_of
from glassformer.modules.norms import make_norm
from glassformer.modules.old_names import rename_old_keys
from glassformer.modules.rotary import RotaryEmbedding


class EncoderLayer(Block):
    """The paper's encoder layer: self-attention, then feed-forward, each with residual +
    LayerNorm; with ``causal=True`` a GPT block.

    Args:
        d_model: D.
        num_heads: H.
        d_ff: inner width of the feed-forward network.
        dropout: dropout on each residual branch and inside the FFN.
        attention_dropout: dropout on the attention weights (off by default: on CPU a
            non-zero value also forces attention off the fused kernel under a mask).
        activation: "relu", "gelu", "gelu_tanh" or "swiglu".
        norm_first: pre-norm (True) or the paper's post-norm (False).
        head_dim: width of one head; ``d_model // num_heads`` when None.
        qkv_bias: bias on the q, k, v projections.
        bias: bias on the output projection, the feed-forward layers and the LayerNorms.
        causal: forbid attending to later positions.
        layer_norm_eps: the norms' epsilon.
        norm: "layer" (LayerNorm) or "rms" (RMSNorm).
        num_kv_heads: key/value heads for grouped-query attention; None for H.
        rotary: a rotary embedding the attention applies itself, or True: rotated by the
            angles the caller passes (``forward(angles=)``, as models do).
        attention_window: w: local self-attention over the w positions before (and,
            unless causal, after) each one; None attends to all.
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
        rotary: RotaryEmbedding | bool | None = None,
        attention_window: int | None = None,
        global_tokens: int = 0,
    ) -> None:
        super().__init__(
            attn=MultiHeadAttention(
                d_model=d_model,
                num_heads=num_heads,
                head_dim=head_dim,
                dropout=attention_dropout,
                qkv_bias=qkv_bias,
                out_bias=bias,
                causal=causal,
                num_kv_heads=num_kv_heads,
                rotary=rotary,
                window=window_of(attention_window, causal),
                global_tokens=global_tokens,
            ),  # fmt: skip
            mlp=feed_forward(
                d_model=d_model, d_ff=d_ff, dropout=dropout, activation=activation, bias=bias
            ),
            ln1=make_norm(norm, d_model, eps=layer_norm_eps, bias=bias),
            ln2=make_norm(norm, d_model, eps=layer_norm_eps, bias=bias),
            norm_first=norm_first,
            dropout=dropout,
        )


class DecoderLayer(Block):
    """The paper's decoder layer: masked self-attention, cross-attention to the encoder's
    output, then feed-forward, each with residual + LayerNorm.

    Arguments as for ``EncoderLayer``; ``causal`` defaults to True. A window applies to the
    self-attention only: cross-attention reads the whole memory.
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
        heads: dict[str, Any] = dict(d_model=d_model, num_heads=num_heads, head_dim=head_dim)
        projections: dict[str, Any] = dict(
            dropout=attention_dropout, qkv_bias=qkv_bias, out_bias=bias
        )
        super().__init__(
            attn=MultiHeadAttention(
                **heads,
                **projections,
                causal=causal,
                window=window_of(attention_window, causal),
                global_tokens=global_tokens,
            ),  # fmt: skip
            cross_attn=MultiHeadAttention(**heads, **projections),
            mlp=feed_forward(
                d_model=d_model, d_ff=d_ff, dropout=dropout, activation=activation, bias=bias
            ),
            ln1=make_norm("layer", d_model, eps=layer_norm_eps, bias=bias),
            ln_cross=make_norm("layer", d_model, eps=layer_norm_eps, bias=bias),
            ln2=make_norm("layer", d_model, eps=layer_norm_eps, bias=bias),
            norm_first=norm_first,
            dropout=dropout,
        )

    def forward(  # type: ignore[override]
        self,
        x: Tensor,
        memory: Tensor | None = None,
        mask: Tensor | None = None,
        memory_mask: Tensor | None = None,
        **options,
    ) -> BlockOutput:
        """``Block.forward`` with the memory second, as ``nn.TransformerDecoderLayer`` takes it
        (or in ``inputs=``, as a stack hands it)."""
        if memory is None and mask is None and memory_mask is None:
            return super().forward(x, **options)
        return super().forward(x, mask, memory=memory, memory_mask=memory_mask, **options)


class TorchStack(Stack):
    """A ``Stack`` that also answers to ``nn.TransformerEncoder``'s names (``layers``,
    ``norm``) and loads weights saved under them (as the paper's stacks were before blocks
    took parts)."""

    def __init__(self, blocks: Sequence[nn.Module], ln_final: nn.Module | None) -> None:
        super().__init__(blocks, ln_final)
        self.register_load_state_dict_pre_hook(rename_old_keys)  # layers.N, norm: before

    def old_names(self) -> dict[str, str]:
        return {"layers": "blocks", "norm": "ln_final"}

    layers = property(lambda self: self.blocks)
    norm = property(lambda self: self.ln_final)


class Encoder(TorchStack):
    """A stack of ``EncoderLayer``s, with a final LayerNorm under pre-norm.

    Args:
        num_layers: how many layers.
        final_norm: add a LayerNorm after the last layer; defaults to ``norm_first``.
        **layer_kwargs: passed to every ``EncoderLayer`` (d_model, num_heads, d_ff, ...).
    """

    def __init__(
        self, *, num_layers: int, final_norm: bool | None = None, **layer_kwargs: Any
    ) -> None:
        _check_layers(num_layers)
        layers = [EncoderLayer(**layer_kwargs) for _ in range(num_layers)]
        super().__init__(layers, _final_norm(final_norm, layer_kwargs))


class Decoder(TorchStack):
    """A stack of ``DecoderLayer``s, with a final LayerNorm under pre-norm.

    Args:
        num_layers: how many layers.
        final_norm: add a LayerNorm after the last layer; defaults to ``norm_first``.
        **layer_kwargs: passed to every ``DecoderLayer``.
    """

    def __init__(
        self, *, num_layers: int, final_norm: bool | None = None, **layer_kwargs: Any
    ) -> None:
        _check_layers(num_layers)
        layers = [DecoderLayer(**layer_kwargs) for _ in range(num_layers)]
        super().__init__(layers, _final_norm(final_norm, layer_kwargs))

    def forward(  # type: ignore[override]
        self,
        x: Tensor,
        memory: Tensor,
        mask: Tensor | None = None,
        memory_mask: Tensor | None = None,
        **options: Any,
    ) -> StackOutput:
        """x (B, T, D), memory (B, S, D) → ``StackOutput`` with self- and cross-attention
        maps; the memory second, as ``nn.TransformerDecoder`` takes it."""
        return super().forward(x, mask, memory=memory, memory_mask=memory_mask, **options)


def _check_layers(num_layers: int) -> None:
    if num_layers <= 0:
        raise ValueError(f"num_layers must be a positive integer, got {num_layers}")


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
