"""Reading the residual stream: the logit lens and direct logit attribution.

Both read a stack of blocks whose residual stream ends in a head: a ``GPT``'s, an
``EncoderLM``'s or a translator's decoder's vocabulary head (the lens reads a classifier's
pooled class head too). The stream is a sum: the embeddings, then each
block's attention (and cross-attention) and MLP outputs added in turn; the final norm and
the head turn the last sum into logits.

- ``logit_lens``: each layer's residual stream read as if it were the last one (through the
  final norm and the head): what the model would say after that layer.
- ``direct_logit_attribution``: the final residual split into its parts (the embeddings,
  each attention head, each attention output bias, each MLP), each taken through the final
  norm with the full stream's own scale (a norm is linear once its scale is fixed), so the
  parts add up to the logits.

Everything is read at the hook points (``run_with_cache``), by the names every model kind
shares: ``{stack}blocks.{i}.hook_resid_post``, ``{stack}blocks.{i}.attn.hook_result``, ...
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NamedTuple

import torch
from torch import Tensor, nn

from glassformer.models.base import PretrainedModel
from glassformer.models.common import pool
from glassformer.models.seq2seq import Seq2SeqTransformer
from glassformer.modules.norms import RMSNorm


class Readout(NamedTuple):
    """Where a model's residual stream becomes logits: the hook-name prefix of its stack
    ("" or "decoder."), the stack (a ``Backbone``), the head that turns normalised states
    (S, T, D) into logits (S, T, V) (a classifier's: pooled, (S, 1, C)), and the vocabulary
    head's ``nn.Linear`` (None for a class head)."""

    prefix: str
    stack: Any
    head: Callable[[Tensor], Tensor]
    vocabulary: nn.Module | None


def readout(model: PretrainedModel, inputs: tuple[Tensor, ...] = ()) -> Readout:
    """The stack and head a lens reads: a GPT's or an encoder LM's vocabulary head, a
    translator's decoder's, a classifier's pooling and class head (``inputs``, the ids,
    say which positions are padding). Other models have no head: a one-line error says so."""
    kind = getattr(model, "kind", type(model).__name__)  # any module may be given
    if isinstance(model, Seq2SeqTransformer):
        return Readout("decoder.", model.decoder, model.unembed, model.output_proj)
    head = getattr(model, "lm_head", None)
    if isinstance(head, nn.Module) and hasattr(model, "blocks"):
        return Readout("", model, getattr(model, "unembed", head), head)
    class_head = getattr(model, "head", None)
    if isinstance(class_head, nn.Module) and hasattr(model, "hook_pooled"):
        pad_id = getattr(model.config, "pad_id", None)
        ids = inputs[0] if inputs and not inputs[0].is_floating_point() else None
        mask = None if ids is None or pad_id is None else (ids != pad_id)[:, None, None, :]

        def classify(states: Tensor) -> Tensor:  # (S, T, D) → (S, 1, C)
            pooled = pool(states, None if mask is None else mask.expand(len(states), -1, -1, -1),
                          model.config.pooling)  # fmt: skip
            return class_head(pooled)[:, None]

        return Readout("", model, classify, None)
    raise TypeError(
        f"the lens reads a residual stream through a vocabulary or class head, which a "
        f"{kind!r} model does not have (a language model, a classifier and a translator's "
        "decoder do)"
    )


@dataclass(frozen=True)
class Lens:
    """The logit lens of one input: ``logits[i]`` (T, V) is what the stream after
    ``stages[i]`` says ("embeddings", "layer 1", ..., the last equal to the model's)."""

    stages: list[str]
    logits: Tensor  # (L + 1, T, V)

    def top(self, k: int = 1) -> tuple[Tensor, Tensor]:
        """The ``k`` likeliest tokens at every stage and position: (ids, probabilities),
        each (L + 1, T, k)."""
        probs = self.logits.float().softmax(-1)
        p, ids = probs.topk(k, dim=-1)
        return ids, p


@torch.no_grad()
def logit_lens(model: PretrainedModel, *inputs: Tensor) -> Lens:
    """What each layer's residual stream predicts, read through the stack's final norm (if it
    has one: a post-norm stream is normalised already) and the head: a language model's
    next (or masked) token at every position, a classifier's class (its pooling of the
    states first: one "position").

    Args:
        model: a ``GPT``, an ``EncoderLM``, a classifier or a ``Seq2SeqTransformer`` (its
            decoder).
        inputs: what the model's forward takes, for one example: ids (T,) or (1, T); a
            translator's source and target ids; a ViT's image (C, H, W) or (1, C, H, W).
    """
    inputs = tuple(x[None] if x.dim() in (1, 3) else x for x in inputs)  # one example
    prefix, stack, head, _ = readout(model, inputs)
    L = len(stack.blocks)
    names = [f"{prefix}blocks.0.hook_resid_pre"]
    names += [f"{prefix}blocks.{i}.hook_resid_post" for i in range(L)]
    _, cache = model.run_with_cache(*inputs, names=names)
    stream = torch.stack([cache[n][0] for n in names])  # (L + 1, T, D)
    if stack.ln_final is not None:
        stream = stack.ln_final(stream)
    logits = head(stream)  # (L + 1, T, V); a classifier's (L + 1, 1, C)
    stages = ["embeddings"] + [f"layer {i + 1}" for i in range(L)]
    return Lens(stages, logits.float())


@dataclass(frozen=True)
class Attribution:
    """The parts of one position's logits: ``logits[i]`` (V,) is what ``parts[i]`` adds.

    Their sum is the model's logits at that position (the last parts are the final norm's
    bias and the head's, where there are)."""

    parts: list[str]
    logits: Tensor  # (P, V)

    def of(self, token_id: int) -> dict[str, float]:
        """Each part's share of one token's logit, largest first."""
        shares = self.logits[:, token_id].tolist()
        return dict(sorted(zip(self.parts, shares, strict=True), key=lambda kv: -abs(kv[1])))


@torch.no_grad()
def direct_logit_attribution(
    model: PretrainedModel, *inputs: Tensor, position: int = -1
) -> Attribution:
    """The logits at ``position`` split into the embeddings, each head (of self- and
    cross-attention), each attention output bias, each MLP and the biases of the final
    norm and the head. A block that normalises its attention's output before the sum
    (Gemma's ``ln1_post``) gives its attention as one part; a soft-capped head's logits
    (Gemma) are split before the cap.

    Args:
        model: a pre-norm model with a vocabulary head (a ``GPT``; a pre-norm encoder LM or
            translator).
        inputs: one example, as the model's forward takes it (ids (T,) or (1, T)).
        position: which position's logits (default the last).
    """
    prefix, stack, _, head = readout(model)
    if head is None:
        raise TypeError("direct logit attribution splits a vocabulary head's logits; a "
                        f"{model.kind!r} model's head reads a pooled vector")  # fmt: skip
    if not all(block.norm_first for block in stack.blocks):
        raise ValueError("direct logit attribution needs pre-norm blocks (a plain-sum stream)")
    inputs = tuple(x.view(1, -1) for x in inputs)
    L = len(stack.blocks)
    _, cache = model.run_with_cache(
        *inputs, names=lambda name: name.startswith(prefix) and _is_part(name)
    )
    pos = position % cache[f"{prefix}hook_embed"].size(1)
    parts, vectors = _stream_parts(cache, prefix, stack, pos)
    final = cache[f"{prefix}blocks.{L - 1}.hook_resid_post"][0, pos]
    logits = _unembed(stack.ln_final, head, torch.stack(vectors), scale_from=final)  # (P, V)
    norm_bias = getattr(stack.ln_final, "bias", None)
    if norm_bias is not None:
        parts.append("final norm bias")
        logits = torch.cat([logits, (norm_bias.float() @ head.weight.float().T)[None]])
    config: Any = model.config
    if getattr(config, "scale_output", False):  # T5: the states × d^-½ before the head
        logits = logits * config.d_model**-0.5
    head_bias = getattr(head, "bias", None)
    if head_bias is not None:
        parts.append("head bias")
        logits = torch.cat([logits, head_bias.float()[None]])
    return Attribution(parts, logits)


_PARTS = ("hook_embed", "hook_pos_embed", "hook_result", "hook_attn_out", "hook_mlp_out",
          "hook_resid_post")  # fmt: skip


def _is_part(name: str) -> bool:
    return name.endswith(_PARTS)


def _stream_parts(cache: Any, prefix: str, stack: Any, pos: int) -> tuple[list[str], list[Tensor]]:
    """The residual stream at ``pos`` as its summands, each named: (names, vectors (D,))."""
    parts, vectors = ["embeddings"], [cache[f"{prefix}hook_embed"][0, pos]]
    if f"{prefix}hook_pos_embed" in cache:
        pe = cache[f"{prefix}hook_pos_embed"]
        parts.append("positions")
        vectors.append(pe[pos] if pe.dim() == 2 else pe[0, pos])
    for i, block in enumerate(stack.blocks):
        for attn_name, short in (("attn", ""), ("cross_attn", " cross")):
            attn = getattr(block, attn_name, None)
            if attn is None:
                continue
            if attn_name == "attn" and getattr(block, "ln1_post", None) is not None:
                parts.append(f"L{i + 1} attention")  # normalised: no longer a sum of heads
                vectors.append(cache[f"{prefix}blocks.{i}.hook_attn_out"][0, pos])
                continue
            result = cache[f"{prefix}blocks.{i}.{attn_name}.hook_result"][0, pos]  # (H, D)
            for h in range(result.size(0)):
                parts.append(f"L{i + 1}{short}H{h + 1}")
                vectors.append(result[h])
            if attn.out_proj.bias is not None:
                parts.append(f"L{i + 1}{short} attention bias")
                vectors.append(attn.out_proj.bias)
        parts.append(f"L{i + 1} MLP")
        vectors.append(cache[f"{prefix}blocks.{i}.hook_mlp_out"][0, pos])
    return parts, vectors


def _unembed(norm: Any, head: nn.Module, resid: Tensor, scale_from: Tensor) -> Tensor:
    """Logits of residual vectors through the final norm (its scale, and LayerNorm's mean,
    taken from the stream ``scale_from``: the norm is then linear) and the head's weight."""
    x, ref = resid.float(), scale_from.float()
    if norm is None:
        normed = x
    elif isinstance(norm, RMSNorm):
        scale = norm.weight.float() + (1.0 if norm.unit_offset else 0.0)  # Gemma's: 1 + w
        normed = x * ref.pow(2).mean(-1, keepdim=True).add(norm.eps).rsqrt() * scale
    else:
        var = ref.var(-1, keepdim=True, unbiased=False)
        centred = x - x.mean(-1, keepdim=True)
        normed = centred * (var + norm.eps).rsqrt()
        if norm.weight is not None:  # (OLMo's LayerNorm learns none)
            normed = normed * norm.weight.float()
    return normed @ head.weight.float().T  # type: ignore[operator]
