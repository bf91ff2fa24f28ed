"""Reading the residual stream: the logit lens and direct logit attribution.

Both work on a decoder-only ``GPT`` (GPT-2's block or the modern one), whose residual stream
is a sum: the embeddings, then each layer's attention and MLP outputs added in turn; the
final norm and the unembedding turn the last sum into logits.

- ``logit_lens``: each layer's residual stream read as if it were the last one (through the
  final norm and the unembedding): what the model would say after that layer.
- ``direct_logit_attribution``: the final residual split into its parts (the embeddings,
  each attention head, each attention output bias, each MLP), each taken through the final
  norm with the full stream's own scale (a norm is linear once its scale is fixed), so the
  parts add up to the logits.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from glassformer.models.gpt import GPT


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


def _check_gpt(model: nn.Module) -> GPT:
    if not isinstance(model, GPT):
        raise TypeError(
            f"the lens reads a decoder-only GPT's residual stream, not a {type(model).__name__}"
        )
    if not model.config.norm_first:
        raise ValueError("the lens needs a pre-norm GPT (its residual stream is a plain sum)")
    return model


def _unembed(model: GPT, resid: Tensor, scale_from: Tensor | None = None) -> Tensor:
    """Logits of residual vectors through the final norm and the head. With
    ``scale_from``, the norm's scale (and LayerNorm's mean) come from that stream instead."""
    norm: Any = model.blocks.norm
    x = resid.float()
    ref = x if scale_from is None else scale_from.float()
    if model.config.norm == "rms":
        rms = ref.pow(2).mean(-1, keepdim=True).add(norm.eps).rsqrt()
        normed = x * rms * norm.weight.float()
    else:
        var = ref.var(-1, keepdim=True, unbiased=False)
        centred = x - x.mean(-1, keepdim=True)
        normed = centred * (var + norm.eps).rsqrt() * norm.weight.float()
    return normed @ model.lm_head.weight.float().T


# model kind -> (its stack of layers, its vocabulary head): what a logit lens reads through
LENS_PARTS = {"gpt": ("blocks", "lm_head"), "encoder_lm": ("encoder", "lm_head"),
              "seq2seq": ("decoder", "output_proj")}  # fmt: skip


@torch.no_grad()
def logit_lens(model: nn.Module, *inputs: Tensor) -> Lens:
    """What each layer's residual stream predicts, read through the stack's final norm (if it
    has one: a post-norm stream is normalised already) and the vocabulary head.

    Args:
        model: a ``GPT``, an ``EncoderLM`` or a ``Seq2SeqTransformer`` (its decoder).
        inputs: what the model's forward takes, for one example: ids (T,) or (1, T); a
            translator's source and target ids.
    """
    kind = getattr(model, "kind", None)
    if kind not in LENS_PARTS:
        raise TypeError(
            f"the logit lens reads a model with a vocabulary head (GPT, encoder LM, "
            f"translator), not a {type(model).__name__}"
        )
    stack_name, head_name = LENS_PARTS[kind]
    stack: Any = getattr(model, stack_name)
    head: Any = getattr(model, head_name)
    inputs = tuple(x.view(1, -1) for x in inputs)
    L = len(stack.layers)
    names = [f"{stack_name}.layers.0.hook_resid_pre"]
    names += [f"{stack_name}.layers.{i}.hook_resid_post" for i in range(L)]
    _, cache = model.run_with_cache(*inputs, names=names)  # type: ignore[operator]
    stream = torch.stack([cache[n][0] for n in names])  # (L + 1, T, D)
    if stack.norm is not None:
        stream = stack.norm(stream)
    logits = head(stream)  # (L + 1, T, V)
    stages = ["embeddings"] + [f"layer {i + 1}" for i in range(L)]
    return Lens(stages, logits.float())


@dataclass(frozen=True)
class Attribution:
    """The parts of one position's logits: ``logits[i]`` (V,) is what ``parts[i]`` adds.

    Their sum is the model's logits at that position (the last part is the final norm's
    bias, where it has one)."""

    parts: list[str]
    logits: Tensor  # (P, V)

    def of(self, token_id: int) -> dict[str, float]:
        """Each part's share of one token's logit, largest first."""
        shares = self.logits[:, token_id].tolist()
        return dict(sorted(zip(self.parts, shares, strict=True), key=lambda kv: -abs(kv[1])))


@torch.no_grad()
def direct_logit_attribution(model: nn.Module, ids: Tensor, *, position: int = -1) -> Attribution:
    """The logits at ``position`` split into the embeddings, each head, each attention
    output bias, each MLP and the final norm's bias.

    Args:
        model: a pre-norm ``GPT``.
        ids: one sequence, (T,) or (1, T).
        position: which position's logits (default the last).
    """
    gpt = _check_gpt(model)
    ids = ids.view(1, -1)
    L = gpt.config.num_layers
    names = ["embed.hook_embed", "embed.position.hook_pos_embed"]
    names += [f"blocks.layers.{i}.self_attn.hook_result" for i in range(L)]
    names += [f"blocks.layers.{i}.hook_mlp_out" for i in range(L)]
    names.append(f"blocks.layers.{L - 1}.hook_resid_post")
    names = [n for n in names if n in gpt.hook_names()]  # rotary models add no positions
    _, cache = gpt.run_with_cache(ids, names=names)
    T = ids.size(1)
    pos = position % T
    parts: list[str] = []
    vectors: list[Tensor] = []
    embed = cache["embed.hook_embed"][0, pos]
    parts.append("embeddings")
    vectors.append(embed)
    if "embed.position.hook_pos_embed" in cache:
        pe = cache["embed.position.hook_pos_embed"]
        parts.append("positions")
        vectors.append(pe[pos] if pe.dim() == 2 else pe[0, pos])
    layers: Any = gpt.blocks.layers
    for i in range(L):
        attn = layers[i].self_attn
        result = cache[f"blocks.layers.{i}.self_attn.hook_result"][0, pos]  # (H, D)
        for h in range(result.size(0)):
            parts.append(f"L{i + 1}H{h + 1}")
            vectors.append(result[h])
        if attn.out_proj.bias is not None:
            parts.append(f"L{i + 1} attention bias")
            vectors.append(attn.out_proj.bias)
        parts.append(f"L{i + 1} MLP")
        vectors.append(cache[f"blocks.layers.{i}.hook_mlp_out"][0, pos])
    final = cache[f"blocks.layers.{L - 1}.hook_resid_post"][0, pos]
    logits = _unembed(gpt, torch.stack(vectors), scale_from=final)  # (P, V)
    bias = getattr(gpt.blocks.norm, "bias", None)
    if bias is not None:
        parts.append("final norm bias")
        logits = torch.cat([logits, (bias.float() @ gpt.lm_head.weight.float().T)[None]])
    return Attribution(parts, logits)
