"""The body every model shares: embeddings, then a stack of blocks and a final norm.

    ids (B, T) → embed (+ pos_embed, + token_type; ln_embed) → dropout
               → blocks.0 … blocks.{L-1} → ln_final → hidden states (B, T, D)

A language model puts a vocabulary head on it, a classifier a pooling and a class head
(``models.gpt``, ``models.classifier``, ...); the translator has two, its ``encoder`` and
its ``decoder``. Which embeddings, blocks and norms a model has is chosen by its builder
(``models.parts``); the backbone only runs them, so every model kind names its
activations alike:

    hook_embed                 the token embeddings (B, T, D)
    hook_pos_embed             the position vectors added to them (T, D) or (B, T, D)
    hook_pos_bias              T5's relative positions: what each score gets (1, H, T, Tk)
    blocks.{i}.…               each block's (``modules.block``)
    ln_final.hook_normalized   the final norm's output

(the translator's under ``encoder.`` and ``decoder.``). Positions enter as a table added to
the embeddings (``pos_embed``) or as rotary angles (``rotary``), computed here once per
forward for every block.

Shapes: B batch, T length, D d_model.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor, nn

from glassformer.models.base import PretrainedModel
from glassformer.modules.block import BlockInputs, Stack, StackOutput
from glassformer.modules.cache import DecoderCache
from glassformer.modules.hooks import HookPoint
from glassformer.modules.position import check_length, check_positions
from glassformer.modules.rotary import RotaryEmbedding


class Backbone(Stack, PretrainedModel):
    """Embeddings, then a ``Stack`` (blocks and a final norm): ids (B, T) → hidden states
    (B, T, D).

    Args:
        config: the model's config (kept as ``config``).
        embed: token ids → vectors (``TokenEmbedding``; a ViT's ``PatchEmbedding``).
        blocks: the blocks, run in order.
        max_len: the longest sequence the model reads.
        pos_embed: a positional module whose ``rows`` are added to the embeddings, or None.
        rotary: rotary positions (the blocks' attention turns q and k by its angles), or None.
        token_type: an embedding of segment ids added too (BERT), or None.
        ln_embed: a norm on the embeddings' sum (BERT), or None.
        project_in: a linear map from narrower token embeddings to the stream's width,
            before the positions are added (OPT-350m), or None.
        ln_final: the norm after the last block (pre-norm stacks), or None.
        relative_bias: a bias on every self-attention score for the query–key distance
            (T5's ``RelativePositionBias``), computed here once per forward, or None.
        dropout: on the embeddings.
    """

    # The positional module: ``rows(x, start, positions)`` gives what is added.
    pos_embed: Any

    def __init__(
        self,
        config: Any,
        *,
        embed: nn.Module,
        blocks: Sequence[nn.Module],
        max_len: int,
        pos_embed: nn.Module | None = None,
        rotary: RotaryEmbedding | None = None,
        token_type: nn.Module | None = None,
        ln_embed: nn.Module | None = None,
        ln_final: nn.Module | None = None,
        relative_bias: nn.Module | None = None,
        project_in: nn.Module | None = None,
        dropout: float = 0.0,
    ) -> None:
        nn.Module.__init__(self)  # the stack is taken last: the module tree in running order
        self.config = config
        self.max_len = max_len
        self.embed = embed
        self.project_in = project_in
        self.pos_embed = pos_embed
        self.token_type = token_type
        self.ln_embed = ln_embed
        self.rotary = rotary
        self.dropout = nn.Dropout(dropout)
        self.hook_embed = HookPoint()  # the token embeddings, (B, T, D)
        if pos_embed is not None:
            self.hook_pos_embed = HookPoint()  # the position vectors added, (T, D) or (B, T, D)
        self.relative_bias = relative_bias
        if relative_bias is not None:
            self.hook_pos_bias = HookPoint()  # (1, H, T, Tk), added to every score
        self.hold(blocks, ln_final)

    def embed_tokens(
        self,
        ids: Tensor,
        start: int = 0,
        positions: Tensor | None = None,
        token_type_ids: Tensor | None = None,
    ) -> Tensor:
        """ids (B, T) at positions ``start..start+T-1`` (or ``positions`` (B, T)) → the
        stream the first block reads, (B, T, D)."""
        x = self.hook_embed(self.embed(ids))  # (B, T, D)
        if self.project_in is not None:  # OPT-350m: narrower embeddings, widened
            x = self.project_in(x)
        if self.pos_embed is not None:
            x = x + self.hook_pos_embed(self.pos_embed.rows(x, start, positions))
        elif positions is not None:  # rotary: the positions still have to fit
            check_positions(positions, x, self.max_len)
        else:
            check_length(start + x.size(1), self.max_len)
        if self.token_type is not None:
            types = torch.zeros_like(ids) if token_type_ids is None else token_type_ids
            x = x + self.token_type(types)
        if self.ln_embed is not None:
            x = self.ln_embed(x)
        return self.dropout(x) if self.training else x

    def run_stack(
        self,
        x: Tensor,
        mask: Tensor | None = None,
        *,
        memory: Tensor | None = None,
        memory_mask: Tensor | None = None,
        need_weights: bool = False,
        cache: DecoderCache | None = None,
        positions: Tensor | None = None,
        start: int = 0,
    ) -> StackOutput:
        """The blocks, then the final norm, on the stream ``x`` (B, T, D) → ``StackOutput``.

        What every block reads besides the stream is made here once, as one ``BlockInputs``:
        the masks and the memory given, the rotary angles for ``positions`` (or
        start..start+T-1), T5's position bias.
        """
        angles = None
        if self.rotary is not None:
            if positions is None:
                positions = torch.arange(start, start + x.size(1), device=x.device)
            angles = self.rotary.cos_sin(positions, x.dtype)
        pos_bias = None
        if self.relative_bias is not None:  # queries start.., keys 0..start+T-1
            T = x.size(1)
            pos_bias = self.hook_pos_bias(self.relative_bias(T, start + T, start).to(x.dtype))
        inputs = BlockInputs(mask, memory, memory_mask, positions, angles, pos_bias, need_weights)
        return self.run(x, inputs, cache)

    def forward(  # type: ignore[override]
        self,
        ids: Tensor,
        mask: Tensor | None = None,
        *,
        memory: Tensor | None = None,
        memory_mask: Tensor | None = None,
        need_weights: bool = False,
        cache: DecoderCache | None = None,
        positions: Tensor | None = None,
    ) -> StackOutput:
        """ids (B, T) → ``StackOutput`` (hidden states (B, T, D), the attention maps when
        asked for). With a ``cache`` the ids continue the positions already seen."""
        start = 0 if cache is None or positions is not None else cache.length
        x = self.embed_tokens(ids, start, positions)
        return self.run_stack(
            x,
            mask,
            memory=memory,
            memory_mask=memory_mask,
            need_weights=need_weights,
            cache=cache,
            positions=positions,
            start=start,
        )

    @property
    def num_layers(self) -> int:
        return len(self.blocks)

    def backbone_state_dict(self) -> dict[str, Tensor]:
        """The weights of the backbone alone (no head): what a classifier starts from."""
        heads = tuple(name + "." for name in self.HEADS)
        return {k: v for k, v in self.state_dict().items() if not k.startswith(heads)}

    # The attributes holding heads (not part of the backbone); each model names its own.
    HEADS: tuple[str, ...] = ()
