"""The live page's rules: what each step of the forward pass computes, over the model's weights.

The explorable page (``explain``) carries each step's values, or the one line of arithmetic
that computes it from earlier steps (``derive``). A live page carries neither: it carries the
weights, and every step is a rule the page runs on the ids of whatever the reader types,

    hook_embed                the embedding's rows for the ids (times √D where it scales)
    hook_pos_embed            the position table's first T rows
    ln1.hook_normalized       LayerNorm or RMSNorm of the stream, statistics computed (of the
                              sum with segment 0's row: BERT's; of a projection: Gemma's)
    attn.hook_q / _k / _v     the stream times rows of the fused projection, split in heads
    hook_attn_out             the heads side by side, times the output projection
    mlp.hook_pre, hook_mlp_out   the MLP's two products; hook_post its activation
    hook_pooled, hook_logits  a classifier's pooling, the head (capped: Gemma's)

and the rules ``derive`` already has (sums, softmax, the weighted values, q·kᵀ/√d under the
mask, rotary). ``run_rule`` here computes a rule as ``html/live-forward.js`` does;
``live_steps`` finds each step's rule.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from glassformer.models.base import PretrainedModel
from glassformer.viz.derive import FUNCTIONS, MASKED, scores

TOLERANCE = 1e-4  # of the step's largest magnitude: a float64 rule against the float32 model


def close(value: Tensor, expected: Tensor) -> bool:
    """``value`` is ``expected`` within ``TOLERANCE`` of its largest magnitude, masked
    scores masked alike."""
    from glassformer.viz.explain import relative_error

    if value.shape != expected.shape:
        return False
    masked = expected <= MASKED / 2
    if not torch.equal(masked, value <= MASKED / 2):
        return False
    return not expected.numel() or relative_error(value, expected) <= TOLERANCE


def run_rule(
    rule: dict, found: list[Tensor], weights: dict[str, Tensor], ids: Any, tables: dict
) -> Tensor | None:
    """What ``rule`` gives (float64), as ``html/live-forward.js`` computes it; None where
    its parts do not go together. ``ids``: the input's (T,), a ViT's image, or a
    translator's ``{"source": ..., "target": ...}``, of which the rule names one."""
    parts = [found[j] for j in rule.get("of", [])]
    op = rule["op"]
    w = weights[rule["weight"]].double() if "weight" in rule else torch.empty(0)
    if isinstance(ids, dict):  # a translator's: the rule reads the source's or the target's
        ids = ids[rule.get("ids", "source")]
    try:
        if op == "embed":
            return w[ids] * rule.get("scale", 1.0)
        if op == "patches":  # an image (C, H, W): each patch, in raster order, · W + b
            b = weights[rule["bias"]].double() if "bias" in rule else None
            return F.conv2d(ids.double()[None], w, b, stride=w.shape[-2:]).flatten(2)[0].T
        if op == "cls":  # the class token, then the patches with their positions
            return torch.cat([w.view(1, -1), parts[0] + parts[1]])
        if op == "rows":
            return w[: rule.get("count", len(ids))]
        if op == "linear":
            y = _linear(rule, parts[0], weights)
            return rule["softcap"] * torch.tanh(y / rule["softcap"]) if "softcap" in rule else y
        if op in ("layernorm", "rmsnorm"):  # of one step, or of the sum of two (post-norm)
            x = sum(parts[1:], parts[0])
            if "project" in rule:  # Gemma's norm after a sub-layer: of its output projection
                x = _linear(rule["project"], x, weights)
            if "segment" in rule:  # BERT's embeddings: every position in segment 0
                x = x + weights[rule["segment"]][0].double()
            return _norm(rule, x, weights)
        if op == "pool":
            return _pool(rule["how"], parts[0], ids, rule.get("pad"))
        if op == "scores":
            return scores(rule, parts[0], parts[1], ids)
        if op == "same":
            return parts[0]
        if op == "sum":
            same = all(part.shape == parts[0].shape for part in parts)
            return sum(parts[1:], parts[0]) if same else None
        if op == "act":
            out = FUNCTIONS[rule["fn"]](parts[0])
            return out * parts[1] if len(parts) == 2 else out
        from glassformer.viz.derive import compute

        return compute({**rule, "of": list(range(len(parts)))}, parts, tables)  # softmax, ...
    except (RuntimeError, IndexError):
        return None


def _linear(rule: dict, x: Tensor, weights: dict[str, Tensor]) -> Tensor:
    """x · Wᵀ + b over rows [lo, hi) of W: x (T, in), (in,) or heads (H, T, Dh) side by side;
    the output (T, out), (out,), or split in ``heads`` (heads, T, out / heads)."""
    lo, hi = rule.get("rows", [0, weights[rule["weight"]].size(0)])
    w = weights[rule["weight"]].double()[lo:hi]
    b = weights[rule["bias"]].double()[lo:hi] if "bias" in rule else None
    if x.dim() == 3:  # (H, T, Dh) → (T, H·Dh)
        x = x.transpose(0, 1).reshape(x.size(1), -1)
    y = F.linear(x, w, b)
    if "heads" in rule:
        y = y.view(y.size(0), rule["heads"], -1).transpose(0, 1)
    return y


def _norm(rule: dict, x: Tensor, weights: dict[str, Tensor]) -> Tensor:
    """LayerNorm or RMSNorm over the last dimension, its weight (plus 1 where ``offset``)
    and bias where it has them."""
    if rule["op"] == "layernorm":
        x = (x - x.mean(-1, keepdim=True)) * torch.rsqrt(
            x.var(-1, unbiased=False, keepdim=True) + rule["eps"]
        )
    else:
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + rule["eps"])
    if "weight" in rule:
        x = x * (weights[rule["weight"]].double() + rule.get("offset", 0.0))
    return x + weights[rule["bias"]].double() if "bias" in rule else x


def _pool(how: str, x: Tensor, ids: Tensor, pad: int | None) -> Tensor:
    """(T, D) → (D,) as ``models.common.pool`` does for one row: padded positions left out."""
    real = torch.ones(len(x), dtype=torch.bool) if pad is None else ids != pad
    if how == "cls":
        return x[0]
    if how == "last":
        kept = real.nonzero()
        return x[int(kept[-1]) if len(kept) else 0]
    if how == "mean":
        return (x * real[:, None]).sum(0) / real.sum().clamp(min=1)
    raise IndexError(how)


@torch.no_grad()
def page_values(model: PretrainedModel, names: list[str], ids: Any) -> list[Tensor]:
    """The model's value at each of ``names`` for ``ids`` (T,), as the page lays it out: the
    one example, per-head values as heads × positions × features, masked scores as MASKED."""
    from glassformer.viz.explain import laid_out

    inputs = (ids["source"][None], ids["target"][None]) if isinstance(ids, dict) else (ids[None],)
    _, cache = model.run_with_cache(*inputs, names=names)  # ids, a ViT's image, a translator's
    return [laid_out(name, cache[name])[0] for name in names]
