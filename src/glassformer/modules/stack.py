"""Blocks one after another: the stack of an encoder, a decoder or a GPT.

Shapes: B batch, T length, S memory length, D d_model, H heads.

``run_blocks`` runs a list of blocks over the stream, handing each its own key/value cache
when decoding and collecting the attention maps when asked. ``Stack`` is blocks and a final
norm (pre-norm stacks need one: their last residual sum is otherwise never normalised);
``Encoder`` and ``Decoder`` build one from the keyword arguments of ``EncoderLayer`` and
``DecoderLayer``. The models hold their blocks themselves (``model.blocks``), beside their
embeddings and final norm, and run them with ``run_blocks`` too.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any, NamedTuple

from torch import Tensor, nn

from glassformer.modules.block import DecoderLayer, EncoderLayer, rename_old_keys
from glassformer.modules.cache import DecoderCache
from glassformer.modules.norms import make_norm
from glassformer.modules.rotary import RotaryAngles


class StackOutput(NamedTuple):
    """A stack's result, with one weights tensor per block when asked for."""

    hidden: Tensor  # (B, T, D)
    self_attn_weights: tuple[Tensor, ...] | None = None
    cross_attn_weights: tuple[Tensor, ...] | None = None


def run_blocks(
    blocks: Iterable[nn.Module],
    x: Tensor,
    mask: Tensor | None = None,
    *,
    memory: Tensor | None = None,
    memory_mask: Tensor | None = None,
    need_weights: bool = False,
    cache: DecoderCache | None = None,
    positions: Tensor | None = None,
    angles: RotaryAngles | None = None,
    pos_bias: Tensor | None = None,
) -> StackOutput:
    """Each block in turn on the stream ``x`` (B, T, D) → ``StackOutput``.

    Arguments as ``Block.forward`` takes them; ``cache`` holds one key/value cache per
    block (and per cross-attention, for a decoder), from ``DecoderCache``.
    """
    self_weights, cross_weights = [], []
    for i, block in enumerate(blocks):
        caches: dict[str, Any] = {}
        if cache is not None:
            caches["cache"] = cache.self_attn[i]
            caches["memory_cache"] = cache.cross_attn[i] if cache.cross_attn else None
        x, w_self, w_cross = block(
            x,
            mask=mask,
            memory=memory,
            memory_mask=memory_mask,
            need_weights=need_weights,
            positions=positions,
            angles=angles,
            **({"pos_bias": pos_bias} if pos_bias is not None else {}),
            **caches,
        )
        self_weights.append(w_self)
        cross_weights.append(w_cross)
    if not need_weights:
        return StackOutput(x)
    crossed = memory is not None
    return StackOutput(x, tuple(self_weights), tuple(cross_weights) if crossed else None)


class Stack(nn.Module):
    """A list of blocks and a final norm (or none): (B, T, D) → (B, T, D).

    Args:
        blocks: the blocks, run in order (``model.blocks`` holds them as ``blocks.{i}``).
        ln_final: the norm after the last block (pre-norm stacks), or None.
    """

    def __init__(self, blocks: Sequence[nn.Module], ln_final: nn.Module | None = None) -> None:
        super().__init__()
        if not blocks:
            raise ValueError("a stack needs at least one block")
        self.blocks = nn.ModuleList(blocks)
        self.ln_final = ln_final
        self.register_load_state_dict_pre_hook(rename_old_keys)  # layers.N, norm: before

    def old_names(self) -> dict[str, str]:
        """The names a stack's parts had before blocks took parts (``nn.TransformerEncoder``'s)."""
        return {"layers": "blocks", "norm": "ln_final"}

    layers = property(lambda self: self.blocks)
    norm = property(lambda self: self.ln_final)

    def forward(self, x: Tensor, mask: Tensor | None = None, **options: Any) -> StackOutput:
        """x (B, T, D), mask broadcastable to (B, H, T, Tk) → ``StackOutput``; the options
        are ``run_blocks``'s (``memory``, ``cache``, ``need_weights``, ...)."""
        out = run_blocks(self.blocks, x, mask, **options)
        if self.ln_final is None:
            return out
        return out._replace(hidden=self.ln_final(out.hidden))


class Encoder(Stack):
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


class Decoder(Stack):
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
