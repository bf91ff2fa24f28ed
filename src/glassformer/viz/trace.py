"""A step-by-step account of one real forward pass: every tensor's shape and a few values.

``trace(model, tokenizer, text)`` registers forward hooks on the model's modules (the
model code is not touched), runs the model once, and records what each block did in the
order it ran: token embedding, positional encoding, and in each layer the attention
(Q/K/V projections, the split into heads, scores, scaling, mask, softmax, the weighted
sum, the merge, the output projection), the residual sums, the LayerNorms and the
feed-forward network, then the output.

Inside attention only the module's input and output are observable from outside, so
the steps between are recomputed from the module's own weights with plain tensor
algebra, and the recomputed output is compared with what the module really returned
(the trace says by how much they differ: a rounding error, or the trace is wrong).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor, nn

from glassformer.modules.attention import MultiHeadAttention
from glassformer.modules.feedforward import FeedForward, GatedFeedForward
from glassformer.modules.layers import DecoderLayer, EncoderLayer
from glassformer.modules.norms import RMSNorm
from glassformer.modules.position import (
    LearnedPositionalEmbedding,
    SinusoidalPositionalEncoding,
    TokenEmbedding,
)

# which sub-layer each LayerNorm wraps: (in an encoder layer or GPT block, in a decoder layer)
_SUBLAYERS = {
    "norm1": ("self-attention", "self-attention"),
    "norm2": ("feed-forward", "cross-attention"),
    "norm3": ("feed-forward", "feed-forward"),
}


@dataclass
class Step:
    """One recorded step: where, what, the tensor's shape, a few of its values."""

    where: str  # e.g. "encoder layer 1 · self-attention"
    what: str  # e.g. "scores Q·Kᵀ"
    shape: tuple[int, ...]
    values: list[float] = field(default_factory=list)
    note: str = ""


class _Recorder:
    def __init__(self, values: int) -> None:
        self.steps: list[Step] = []
        self.values = values

    def add(self, where: str, what: str, t: Tensor, note: str = "") -> None:
        head = t.detach().float()
        while head.dim() > 1:  # the first example, first head, first position: a row
            head = head[0]
        self.steps.append(Step(where, what, tuple(t.shape), head[: self.values].tolist(), note))


@torch.no_grad()
def trace(
    model: Any,
    tokenizer: Any,
    text: str,
    *,
    layer: int | None = None,
    target: str | None = None,
    values: int = 4,
) -> list[Step]:
    """Run ``model`` once on ``text`` and return the steps it took.

    Args:
        layer: trace only this layer of each stack (from 1); all layers if None.
        target: a translator's target sentence (default: its own greedy translation).
        values: how many values of each tensor to keep (from its first row).
    """
    from glassformer.viz.attention import model_inputs

    args, kwargs, _ = model_inputs(model, tokenizer, text, target)
    rec = _Recorder(values)
    handles = _register(model, rec, layer)
    try:
        model(*args, **kwargs)
    finally:
        for h in handles:
            h.remove()
    return rec.steps


def _register(model: nn.Module, rec: _Recorder, only: int | None) -> list[Any]:
    names = dict(model.named_modules())
    layer_names = {n for n, m in names.items() if isinstance(m, (EncoderLayer, DecoderLayer))}
    if only is not None:
        stacks: dict[str, int] = {}
        for n in layer_names:
            stacks[n.rsplit(".", 1)[0]] = stacks.get(n.rsplit(".", 1)[0], 0) + 1
        deepest = max(stacks.values(), default=0)
        if not 1 <= only <= deepest:
            raise ValueError(f"layer must be in 1..{deepest}, got {only}")
    handles = []
    for name, module in names.items():
        where, layer_module = _place(name, names, layer_names)
        if layer_module is not None and only is not None and _index(layer_module) != only:
            continue
        layer = names[layer_module] if layer_module is not None else None
        hook = _hook_for(name, module, where, layer, rec)
        if hook is not None:
            handles.append(module.register_forward_hook(hook, with_kwargs=True))
    return handles


def _index(layer_name: str) -> int:
    return int(layer_name.rsplit(".", 1)[1]) + 1


def _place(name: str, names: dict, layer_names: set[str]) -> tuple[str, str | None]:
    """A readable place for module ``name``, and the name of the layer it sits in."""
    for ln in layer_names:
        if name == ln or name.startswith(ln + "."):
            layer = names[ln]
            causal = isinstance(layer, DecoderLayer) or layer.self_attn.causal
            return f"{'decoder' if causal else 'encoder'} layer {_index(ln)}", ln
    return "model", None


def _hook_for(name, module, where, layer, rec: _Recorder):
    part = name.rsplit(".", 1)[-1]
    if isinstance(module, TokenEmbedding):
        scaled = f" × √D = {module.scale:.2f}" if module.scale != 1.0 else ""
        return lambda m, a, k, out: rec.add("embedding", f"token embedding{scaled}", out)
    if isinstance(module, (SinusoidalPositionalEncoding, LearnedPositionalEmbedding)):
        kind = "sinusoidal" if isinstance(module, SinusoidalPositionalEncoding) else "learned"
        return lambda m, a, k, out: rec.add("embedding", f"+ {kind} positional encoding", out)
    if isinstance(module, MultiHeadAttention):
        title = {"self_attn": "self-attention", "cross_attn": "cross-attention"}.get(part, part)
        return lambda m, a, k, out: _explain_attention(m, a, k, out, f"{where} · {title}", rec)
    if isinstance(module, FeedForward):

        def ff(m, a, k, out):
            x = a[0]
            hidden = m._act(m.linear1(x))
            rec.add(f"{where} · feed-forward", "input", x)
            rec.add(f"{where} · feed-forward", f"linear1: D → d_ff, then {m.activation}", hidden)
            rec.add(f"{where} · feed-forward", "linear2: d_ff → D", out)

        return ff
    if isinstance(module, GatedFeedForward):

        def gated(m, a, k, out):
            x, at = a[0], f"{where} · gated feed-forward"
            rec.add(at, "input", x)
            rec.add(at, f"gate_proj: D → d_ff, then {m.activation} (SiLU)", m._act(m.gate_proj(x)))
            rec.add(at, "up_proj: D → d_ff", m.up_proj(x))
            rec.add(at, "down_proj(gate · up): d_ff → D", out)

        return gated
    if isinstance(module, (nn.LayerNorm, RMSNorm)):
        kind = "RMSNorm" if isinstance(module, RMSNorm) else "LayerNorm"
        if layer is not None and part in _SUBLAYERS:
            subs = _SUBLAYERS[part]
            sub = subs[1] if isinstance(layer, DecoderLayer) else subs[0]

            def norm(m, a, k, out, part=part, sub=sub):
                if layer.norm_first:
                    rec.add(where, f"{part}: {kind} of the stream, before {sub} (pre-norm)", out)
                else:
                    rec.add(where, f"residual sum: x + {sub}(x)", a[0])
                    scale = "root mean square 1" if kind == "RMSNorm" else "mean 0, variance 1"
                    rec.add(where, f"{part}: {kind} ({scale} per position)", out)

            return norm
        what = f"embedding {kind}" if "embed" in name else f"final {kind}"
        return lambda m, a, k, out: rec.add("embedding" if "embed" in name else "output", what, out)
    if isinstance(module, (EncoderLayer, DecoderLayer)):
        style = "pre-norm" if module.norm_first else "post-norm"
        return lambda m, a, k, out: rec.add(where, f"layer output ({style})", out.hidden)
    if (
        layer is None
        and isinstance(module, nn.Linear)
        and part in ("lm_head", "head", "output_proj", "pooler")
    ):

        def head(m, a, k, out):
            if part == "head":
                rec.add("output", "pooled sentence vector (padding ignored)", a[0])
            rec.add("output", f"{part}: logits" if part != "pooler" else "pooler", out)

        return head
    return None


def _explain_attention(m: MultiHeadAttention, args, kwargs, output, where: str, rec: _Recorder):
    query = args[0]
    key = kwargs.get("key", args[1] if len(args) > 1 else None)
    mask = kwargs.get("mask", args[3] if len(args) > 3 else None)
    memory = query if key is None else key
    H, Hkv, Dh = m.num_heads, m.num_kv_heads, m.head_dim
    inner = H * Dh
    sizes = [inner, Hkv * Dh, Hkv * Dh]
    Ws = m.qkv_proj.weight.split(sizes)
    bs = (None,) * 3 if m.qkv_proj.bias is None else m.qkv_proj.bias.split(sizes)
    q = torch.nn.functional.linear(query, Ws[0], bs[0])
    k = torch.nn.functional.linear(memory, Ws[1], bs[1])
    v = torch.nn.functional.linear(memory, Ws[2], bs[2])
    rec.add(where, "input (queries)", query)
    if key is not None:
        rec.add(where, "memory (keys and values come from here)", memory)
    for name, value in (("Q", q), ("K", k), ("V", v)):
        bias = "" if bs[0] is None else f" + b_{name.lower()}"  # modern blocks have none
        rec.add(where, f"{name} = x·W_{name.lower()}{bias}", value)
    B, Tq, Tk = q.size(0), q.size(1), k.size(1)
    q = q.view(B, -1, H, Dh).transpose(1, 2)  # (B, H, Tq, Dh)
    k, v = (t.view(B, -1, Hkv, Dh).transpose(1, 2) for t in (k, v))  # (B, Hkv, Tk, Dh)
    rec.add(where, f"Q split into {H} heads of {Dh}", q)
    if m.rotary is not None and key is None:
        positions = kwargs.get("positions")
        if positions is None:
            positions = torch.arange(Tq, device=q.device)
        q, k = m.rotary(q, positions), m.rotary(k, positions)
        rec.add(where, f"Q and K rotated by position (RoPE, theta={m.rotary.theta:g})", q)
    if Hkv != H:
        k, v = k.repeat_interleave(H // Hkv, 1), v.repeat_interleave(H // Hkv, 1)  # (B, H, Tk, Dh)
        rec.add(where, f"{Hkv} K/V heads each shared by {H // Hkv} query heads", k)
    scores = q @ k.transpose(-2, -1)  # (B, H, Tq, Tk)
    rec.add(where, "scores Q·Kᵀ", scores)
    scores = scores / math.sqrt(Dh)
    rec.add(where, f"scaled by 1/√{Dh} = {1 / math.sqrt(Dh):.4f}", scores)
    allowed = torch.ones(B, 1, Tq, Tk, dtype=torch.bool)
    if mask is not None:
        allowed = allowed & mask
    if m.causal:
        allowed = allowed & torch.ones(Tq, Tk, dtype=torch.bool).tril(Tk - Tq)
    blocked = int((~allowed).expand(B, H, Tq, Tk).sum())
    if m.causal:
        what = "causal + padding mask" if mask is not None else "causal mask"
    else:
        what = "padding mask" if mask is not None else "no mask (nothing padded)"
    scores = scores.masked_fill(~allowed, float("-inf"))
    rec.add(where, f"{what}: {blocked} of {B * H * Tq * Tk} scores set to -inf", scores)
    weights = scores.softmax(dim=-1).nan_to_num(0.0)  # a row with no key at all: zeros
    sums = weights.sum(-1)
    rec.add(where, f"softmax over keys: rows sum to {sums.min():.4f}..{sums.max():.4f}", weights)
    out = weights @ v  # (B, H, Tq, Dh)
    rec.add(where, "weighted sum of V", out)
    out = out.transpose(1, 2).reshape(B, Tq, inner)
    rec.add(where, "heads merged side by side", out)
    out = m.out_proj(out)
    diff = (out - output.output).abs().max().item()
    rec.add(where, "output projection", out, f"the module returned this to within {diff:.1e}")


def format_trace(steps: Iterable[Step]) -> str:
    """The steps as aligned text lines: place, step, shape, first values."""
    lines, last = [], None
    for s in steps:
        if s.where != last:
            lines.append(f"\n{s.where}")
            last = s.where
        shape = "(" + ", ".join(map(str, s.shape)) + ")"
        values = ", ".join(f"{x: .4f}" for x in s.values)
        note = f"  ← {s.note}" if s.note else ""
        lines.append(f"  {s.what:<58} {shape:<18} [{values}, …]{note}")
    return "\n".join(lines).lstrip("\n")
