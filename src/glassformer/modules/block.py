"""One Transformer block, built from the parts it is given.

Shapes: B batch, T length (of the stream), S memory length, D d_model, H heads.

A block is an attention sub-layer and an MLP sub-layer (and, in a translator's decoder, a
cross-attention sub-layer between them), each on the residual stream. Which attention,
MLP and norms it has is decided by whoever builds it (``glassformer.models.parts``); the
block only wires them, in one of three ways:

    pre-norm (GPT-2, Llama, ``norm_first=True``):   x = x + sublayer(norm(x))
    post-norm (the paper, BERT, ``norm_first=False``): x = norm(x + sublayer(x))
    parallel (GPT-J, Pythia, ``parallel=True``):     x = x + attn(ln1(x)) + mlp(ln2(x))

A pre-norm block can also normalise each sub-layer's output before the sum (Gemma's
"sandwich": ``ln1_post``, ``ln2_post``): x = x + ln1_post(attn(ln1(x))).

Every value on the way passes a hook point, named as TransformerLens names it
(``hook_resid_pre``, ``hook_attn_out``, ``hook_resid_mid``, ``hook_mlp_out``,
``hook_resid_post``; with cross-attention ``hook_cross_attn_out`` and
``hook_resid_mid_cross``), and the parts carry their own (``attn.hook_pattern``,
``mlp.hook_post``, ``ln1.hook_normalized``, ...).

A ``Stack`` is blocks and a final norm: ``run_blocks`` runs the blocks one after another,
handing each its own key/value cache when decoding and collecting the attention maps when
asked, and the norm follows. Every model's ``Backbone`` is a stack with embeddings in
front. The paper's ``EncoderLayer`` and ``DecoderLayer``, blocks built from keyword
arguments, and its ``Encoder`` and ``Decoder`` stacks are in ``modules.stack``.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any, NamedTuple

from torch import Tensor, nn

from glassformer.modules.attention import check_dropout
from glassformer.modules.cache import DecoderCache, KVCache
from glassformer.modules.hooks import HookPoint
from glassformer.modules.old_names import TorchLayerNames, rename_old_keys
from glassformer.modules.rotary import RotaryAngles


class BlockInputs(NamedTuple):
    """What a block reads besides its stream: the same for every block of a stack in one
    call, made once (by the model, ``Backbone.run_stack``) and handed down as one bundle."""

    mask: Tensor | None = None  # self-attention's, broadcastable to (B, H, T, Tk)
    memory: Tensor | None = None  # what cross-attention reads, (B, S, D)
    memory_mask: Tensor | None = None  # cross-attention's, usually (B, 1, 1, S)
    positions: Tensor | None = None  # where the tokens are, for rotary attention
    angles: RotaryAngles | None = None  # the rotation, computed once for every block
    pos_bias: Tensor | None = None  # added to every self-attention score (T5), (1, H, T, Tk)
    need_weights: bool = False  # return the attention maps


class BlockOutput(NamedTuple):
    """One block's result. Weights are (B, H, Tq, Tk), None unless asked for."""

    hidden: Tensor  # (B, T, D)
    self_attn_weights: Tensor | None = None
    cross_attn_weights: Tensor | None = None


LayerOutput = BlockOutput  # the name the layers' result had before blocks took parts


class Block(TorchLayerNames, nn.Module):
    """Self-attention, optionally cross-attention, and an MLP, each on the residual stream.

    Args:
        attn: the self-attention (``MultiHeadAttention``; causal or not, windowed or not).
        mlp: the feed-forward network, (B, T, D) → (B, T, D).
        ln1: the norm of the attention sub-layer (None: none, OLMo 2 normalises outputs only).
        ln2: the norm of the MLP sub-layer (None: none; parallel, the MLP reads ln1's output).
        cross_attn: attention to a memory (the translator's decoder), or None.
        ln_cross: the cross-attention sub-layer's norm (given with ``cross_attn``).
        norm_first: pre-norm (True) or the paper's post-norm (False).
        parallel: attention and MLP read the same stream and both add to it (pre-norm only,
            no cross-attention); there is then no ``hook_resid_mid``.
        ln1_post: a norm of the attention's output before the sum (Gemma), or None.
        ln2_post: a norm of the MLP's output before the sum (Gemma), or None.
        dropout: on each sub-layer's output, before it is added to the stream.
    """

    def __init__(
        self,
        *,
        attn: nn.Module,
        mlp: nn.Module,
        ln1: nn.Module | None,
        ln2: nn.Module | None,
        cross_attn: nn.Module | None = None,
        ln_cross: nn.Module | None = None,
        norm_first: bool = True,
        parallel: bool = False,
        dropout: float = 0.0,
        ln1_post: nn.Module | None = None,
        ln2_post: nn.Module | None = None,
    ) -> None:
        super().__init__()
        if (ln1_post is not None or ln2_post is not None) and not norm_first:
            raise ValueError("ln1_post and ln2_post normalise a pre-norm block's sub-layers")
        if (cross_attn is None) != (ln_cross is None):
            raise ValueError("cross_attn and ln_cross come together: give both or neither")
        if parallel and (not norm_first or cross_attn is not None):
            raise ValueError("a parallel block is pre-norm and has no cross-attention")
        check_dropout(dropout)
        # Registered in this order, so parameters come as the layers before them had them.
        self.attn = attn
        self.cross_attn = cross_attn
        self.mlp = mlp
        self.ln1 = ln1
        self.ln_cross = ln_cross
        self.ln2 = ln2
        self.ln1_post = ln1_post
        self.ln2_post = ln2_post
        self.norm_first = norm_first
        self.parallel = parallel
        self.dropout = nn.Dropout(dropout)
        self.hook_resid_pre = HookPoint()  # the block's input, (B, T, D)
        self.hook_attn_out = HookPoint()  # self-attention's output, before the sum
        if not parallel:
            self.hook_resid_mid = HookPoint()  # after self-attention's residual sum (and norm)
        if cross_attn is not None:
            self.hook_cross_attn_out = HookPoint()  # cross-attention's output, before the sum
            self.hook_resid_mid_cross = HookPoint()  # after cross-attention's residual sum
        self.hook_mlp_out = HookPoint()  # the MLP's output, before the sum
        self.hook_resid_post = HookPoint()  # the block's output
        self.register_load_state_dict_pre_hook(rename_old_keys)

    def forward(
        self,
        x: Tensor,
        mask: Tensor | None = None,
        *,
        inputs: BlockInputs | None = None,
        cache: KVCache | None = None,
        memory_cache: KVCache | None = None,
        **given: Any,
    ) -> BlockOutput:
        """Run the block on the stream ``x`` (B, T, D).

        Args:
            inputs: what it reads besides the stream (``BlockInputs``: the masks, the
                memory, the positions, the angles, T5's position bias, whether to return the
                attention maps). ``mask`` and ``BlockInputs``' fields as keywords
                (``block(x, mask, memory=m)``) make one for this call.
            cache: self-attention keys/values of earlier positions (decoding); ``x`` then
                holds only the new positions.
            memory_cache: the memory's keys/values, filled on the first call.
        """
        if inputs is None:
            inputs = BlockInputs(mask, **given)
        elif mask is not None or given:
            raise ValueError("give a block its inputs= or their fields as keywords, not both")
        mask, memory, need_weights = inputs.mask, inputs.memory, inputs.need_weights
        x = self.hook_resid_pre(x)
        normed = self._in(x, self.ln1)
        attn = self.attn(
            normed, mask=mask, need_weights=need_weights, cache=cache,
            positions=inputs.positions, angles=inputs.angles,
            **({"bias": inputs.pos_bias} if inputs.pos_bias is not None else {}),
        )  # fmt: skip
        attn_out = self.hook_attn_out(_post(self.ln1_post, attn.output))
        if self.parallel:  # both sub-layers read the block's input (one norm: GPT-J, Phi)
            mlp_in = normed if self.ln2 is None else self.ln2(x)
            mlp = self.hook_mlp_out(_post(self.ln2_post, self.mlp(mlp_in)))
            out = x + self.dropout(attn_out) + self.dropout(mlp)
            return BlockOutput(self.hook_resid_post(out), attn.weights)
        x = self.hook_resid_mid(self._add(x, attn_out, self.ln1))
        cross_weights = None
        if self.cross_attn is not None:
            if memory is None:
                raise ValueError("a block with cross-attention needs the memory it reads")
            cross = self.cross_attn(
                self._in(x, self.ln_cross), memory, mask=inputs.memory_mask,
                need_weights=need_weights, cache=memory_cache,
            )  # fmt: skip
            x = self._add(x, self.hook_cross_attn_out(cross.output), self.ln_cross)
            x, cross_weights = self.hook_resid_mid_cross(x), cross.weights
        mlp = self.hook_mlp_out(_post(self.ln2_post, self.mlp(self._in(x, self.ln2))))
        x = self.hook_resid_post(self._add(x, mlp, self.ln2))
        return BlockOutput(x, attn.weights, cross_weights)

    def _in(self, x: Tensor, norm: nn.Module | None) -> Tensor:
        """A sub-layer's input: the stream, normalised first under pre-norm."""
        return norm(x) if self.norm_first and norm is not None else x

    def _add(self, x: Tensor, y: Tensor, norm: nn.Module | None) -> Tensor:
        """The stream ``x`` plus a sub-layer's output ``y``, normalised under post-norm."""
        x = x + (self.dropout(y) if self.training else y)  # (dropout is off in eval)
        return x if self.norm_first or norm is None else norm(x)

    def extra_repr(self) -> str:
        wiring = "parallel" if self.parallel else "pre-norm" if self.norm_first else "post-norm"
        return f"wiring={wiring}"


def _post(norm: nn.Module | None, y: Tensor) -> Tensor:
    """A sub-layer's output, normalised by its post-norm if the block has one (Gemma)."""
    return y if norm is None else norm(y)


class StackOutput(NamedTuple):
    """A stack's result, with one weights tensor per block when asked for."""

    hidden: Tensor  # (B, T, D)
    self_attn_weights: tuple[Tensor, ...] | None = None
    cross_attn_weights: tuple[Tensor, ...] | None = None


def run_blocks(
    blocks: Iterable[nn.Module],
    x: Tensor,
    inputs: BlockInputs,
    cache: DecoderCache | None = None,
) -> StackOutput:
    """Each block in turn on the stream ``x`` (B, T, D), each reading ``inputs`` →
    ``StackOutput``; ``cache`` holds one key/value cache per block (and per cross-attention,
    for a decoder), from ``DecoderCache``."""
    self_weights, cross_weights = [], []
    for i, block in enumerate(blocks):
        caches: dict[str, Any] = {}
        if cache is not None:
            caches["cache"] = cache.self_attn[i]
            caches["memory_cache"] = cache.cross_attn[i] if cache.cross_attn else None
        x, w_self, w_cross = block(x, inputs=inputs, **caches)
        self_weights.append(w_self)
        cross_weights.append(w_cross)
    if not inputs.need_weights:
        return StackOutput(x)
    crossed = inputs.memory is not None
    return StackOutput(x, tuple(self_weights), tuple(cross_weights) if crossed else None)


class Stack(nn.Module):
    """Blocks and a final norm (or none): the stream (B, T, D) → ``StackOutput``.

    Args:
        blocks: the blocks, run in order (held as ``blocks.{i}``).
        ln_final: the norm after the last block (pre-norm stacks need one: their last
            residual sum is otherwise never normalised), or None.
    """

    blocks: nn.ModuleList
    ln_final: nn.Module | None

    def __init__(self, blocks: Sequence[nn.Module], ln_final: nn.Module | None = None) -> None:
        super().__init__()
        self.hold(blocks, ln_final)

    def hold(self, blocks: Sequence[nn.Module], ln_final: nn.Module | None) -> None:
        """Take ``blocks`` and ``ln_final`` (a ``Backbone`` does after its embeddings, so
        that its module tree lists them in the order they run)."""
        if not blocks:
            raise ValueError("a stack needs at least one block")
        self.blocks = nn.ModuleList(blocks)
        self.ln_final = ln_final

    def run(self, x: Tensor, inputs: BlockInputs, cache: DecoderCache | None = None) -> StackOutput:
        """The blocks on ``x`` (B, T, D), each reading ``inputs``, then the final norm."""
        out = run_blocks(self.blocks, x, inputs, cache)
        if self.ln_final is None:
            return out
        return out._replace(hidden=self.ln_final(out.hidden))

    def forward(
        self,
        x: Tensor,
        mask: Tensor | None = None,
        *,
        cache: DecoderCache | None = None,
        **inputs: Any,
    ) -> StackOutput:
        """x (B, T, D), mask broadcastable to (B, H, T, Tk) → ``StackOutput``; ``inputs``
        are ``BlockInputs``' other fields (``memory``, ``need_weights``, ...), ``cache`` a
        ``DecoderCache``."""
        return self.run(x, BlockInputs(mask, **inputs), cache)
