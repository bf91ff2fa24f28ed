"""A step-by-step account of one real forward pass: every tensor's shape and a few values.

``trace(model, tokenizer, text)`` runs the model once with ``run_with_cache`` and lists the
value at every hook point, in the order the forward pass reached it, each with what
computed it: the token embedding and the positions, then in each block the norms, Q, K and
V per head (rotated, where the model uses rotary positions), the scaled and masked scores,
the softmax, each head's weighted sum of V, the output projection, the residual sums and
the MLP, then the final norm, the pooled vector of a classifier and the logits.

Nothing is recomputed: every number shown is the one the model computed (the scores and
weights on the readable attention path, which a hook on them selects). The same code
traces every model kind, since every kind names its activations alike.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor, nn

from glassformer.models.base import PretrainedModel
from glassformer.modules.experts import Expert, MixtureOfExperts
from glassformer.modules.feedforward import GatedFeedForward
from glassformer.modules.norms import AllHeadsRMSNorm, RMSNorm

# a hook point's name: an optional stack (the translator's), a block, and the rest
_NAME = re.compile(r"^(?:(?P<stack>encoder|decoder)\.)?(?:blocks\.(?P<block>\d+)\.)?(?P<rest>.+)$")
_SUBLAYER = {"ln1": "self-attention", "attn": "self-attention", "hook_attn_out": "self-attention",
             "hook_resid_mid": "self-attention", "ln_cross": "cross-attention",
             "cross_attn": "cross-attention", "hook_cross_attn_out": "cross-attention",
             "hook_resid_mid_cross": "cross-attention", "ln2": "feed-forward",
             "mlp": "feed-forward", "hook_mlp_out": "feed-forward",
             "hook_resid_post": "feed-forward", "ln1_post": "self-attention",
             "ln2_post": "feed-forward"}  # fmt: skip


@dataclass
class Step:
    """One recorded step: where, what, the tensor's shape, a few of its values."""

    where: str  # e.g. "encoder block 1 · self-attention"
    what: str  # e.g. "softmax over the keys"
    shape: tuple[int, ...]
    values: list[float] = field(default_factory=list)
    name: str = ""  # the hook point it was read at


@torch.no_grad()
def trace(
    model: PretrainedModel,
    tokenizer: Any,
    text: str,
    *,
    layer: int | None = None,
    target: str | None = None,
    values: int = 4,
) -> list[Step]:
    """Run ``model`` once on ``text`` and return the steps it took.

    Args:
        layer: trace only this block of each stack (from 1); all blocks if None.
        target: a translator's target sentence (default: its own greedy translation).
        values: how many values of each tensor to keep (from its first row).
    """
    from glassformer.viz.attention import model_inputs

    args, kwargs, _ = model_inputs(model, tokenizer, text, target)
    blocks = [m["block"] for name in model.hook_names() if (m := _NAME.match(name))]
    deepest = max(int(block) + 1 for block in blocks if block is not None)
    if layer is not None and not 1 <= layer <= deepest:
        raise ValueError(f"layer must be in 1..{deepest}, got {layer}")
    _, cache = model.run_with_cache(*args, **kwargs)
    steps = []
    for step in describe(model, cache, values):
        block = _NAME.match(step.name)["block"]  # type: ignore[index]
        if layer is None or block is None or int(block) == layer - 1:
            steps.append(step)
    return steps


def describe(model: PretrainedModel, cache: Any, values: int = 4) -> list[Step]:
    """Each value of a ``run_with_cache`` cache as a step: where it is, what computed it, its
    shape and its first ``values`` values, in the order the forward pass reached them."""
    modules = dict(model.named_modules())
    steps = []
    for name, value in cache.items():
        parts = _NAME.match(name)
        assert parts is not None
        where = _where(parts, model)
        what = _what(name, parts, value, modules)
        steps.append(Step(where, what, tuple(value.shape), _first(value, values), name))
    return steps


def _first(t: Tensor, count: int) -> list[float]:
    """The first example's first row (first head, first position): its first ``count`` values.

    A masked score (attention fills it with the lowest float) reads as -inf."""
    head = t.detach()
    while head.dim() > 1:
        head = head[0]
    if head.is_floating_point():
        head = head.masked_fill(head == torch.finfo(head.dtype).min, -math.inf)
    return head[:count].float().tolist()


def _where(parts: re.Match, model: PretrainedModel) -> str:
    """A readable place: "embedding", "block 1 · feed-forward" (blocks.1), "decoder block 0",
    "output"."""
    stack = f"{parts['stack']} " if parts["stack"] else ""
    if parts["block"] is None:
        head = parts["rest"].startswith(("ln_final", "hook_pooled", "hook_logits"))
        return f"{stack}output" if head else f"{stack}embedding"
    where = f"{stack}block {parts['block']}"  # the index the code and the hook names use
    part = _SUBLAYER.get(parts["rest"].split(".")[0])
    return f"{where} · {part}" if part else where


def _what(name: str, parts: re.Match, value: Tensor, modules: dict[str, nn.Module]) -> str:
    """What computed the value at hook point ``name``, in words."""
    rest = parts["rest"]
    owner = modules[name.rpartition(".")[0]] if "." in name else None
    block = modules.get(name[: name.index(parts["rest"])].rstrip(".")) if parts["block"] else None
    stack = modules[parts["stack"]] if parts["stack"] else modules[""]
    if rest.endswith(("q_norm.hook_normalized", "k_norm.hook_normalized")):
        letter, width = rest.split(".")[-2][0].upper(), value.size(-1)
        if isinstance(owner, AllHeadsRMSNorm):
            return f"{letter} normalised over every head at once: RMSNorm over {width} features"
        kind = "LayerNorm" if isinstance(owner, nn.LayerNorm) else "RMSNorm"
        return f"{letter} normalised per head: {kind} over its {width} features (QK-norm)"
    if ".hook_" in rest and rest.split(".")[0] in ("attn", "cross_attn"):
        return _attention_step(rest, owner, stack, value)
    if rest.endswith("hook_normalized"):
        return _norm_step(rest.split(".")[0], owner, block)
    if rest.startswith("mlp."):
        return _mlp_step(rest, owner)
    return _stream_step(rest, block, stack, value)


def _stream_step(rest: str, block: Any, stack: Any, value: Tensor) -> str:
    """The residual stream, the embeddings and the heads."""
    post = block is not None and not block.norm_first
    if rest == "hook_embed":
        return _embed_text(stack)
    if rest == "hook_pos_embed":
        return f"+ {_positions_text(stack)}"
    if rest == "hook_pos_bias":
        bias = stack.relative_bias
        way = "before and after" if bias.bidirectional else "before"
        return (f"relative positions: a bias per head on every score, by distance bucket "
                f"({bias.num_buckets} buckets, keys {way}; T5)")  # fmt: skip
    if rest == "hook_pooled":
        return f"pooled: {_pooling_text(stack)}"
    if rest == "hook_logits":
        return f"logits ({value.size(-1)} {'classes' if value.dim() == 2 else 'tokens'})"
    text = {
        "hook_resid_pre": "input: the residual stream",
        "hook_attn_out": "heads side by side, output projection: H·Dh → D",
        "hook_resid_mid": "residual sum: x + self-attention(x)" + (", then ln1" if post else ""),
        "hook_cross_attn_out": "heads side by side, output projection: H·Dh → D",
        "hook_resid_mid_cross": "residual sum: x + cross-attention(x)"
        + (", then ln_cross" if post else ""),
        "hook_mlp_out": "the MLP's output: d_ff → D",
        "hook_resid_post": "block output: x + feed-forward(x)" + (", then ln2" if post else ""),
    }
    if getattr(block, "parallel", False):
        text["hook_resid_post"] = (
            "block output: x + self-attention(x) + feed-forward(x), in parallel"
        )
    return text.get(rest, rest)


def _embed_text(model: PretrainedModel) -> str:
    embed = model.embed
    if hasattr(embed, "patch_size"):
        p = embed.patch_size
        return f"patches of {p}×{p} pixels, each projected to D"
    scale = getattr(embed, "scale", 1.0)
    return "token embedding" + (f" × √D = {scale:.2f}" if scale != 1.0 else "")


def _positions_text(model: PretrainedModel) -> str:
    kind = type(model.pos_embed).__name__
    if getattr(model.pos_embed, "halves", False):
        return "sinusoidal positions (sines, then cosines: Marian's layout)"
    return {"SinusoidalPositionalEncoding": "sinusoidal positions (the paper's)",
            "SinusoidalGridEncoding": "sinusoidal positions on the patch grid",
            "LearnedPositionalEmbedding": "learned positions"}.get(kind, kind)  # fmt: skip


def _pooling_text(model: PretrainedModel) -> str:
    pooling = getattr(model.config, "pooling", "")
    return {"mean": "the mean of the real tokens' states (padding ignored)",
            "max": "the maximum over the real tokens' states",
            "cls": "the first position's state",
            "last": "the last real token's state (the one that read the whole text)"
            }.get(pooling, pooling)  # fmt: skip


def _norm_step(part: str, norm: Any, block: Any) -> str:
    kind = "RMSNorm" if isinstance(norm, RMSNorm) else "LayerNorm"
    if isinstance(norm, RMSNorm) and norm.unit_offset:
        kind = "RMSNorm × (1 + w)"
    if isinstance(norm, nn.LayerNorm) and norm.weight is None:
        kind = "LayerNorm without weight or bias"
    if part == "ln_final":
        return f"final {kind}"
    if part == "ln_embed":
        return f"+ token types, then {kind} (BERT normalises the embeddings)"
    if part in ("ln1_post", "ln2_post"):
        sub = "self-attention" if part == "ln1_post" else "feed-forward"
        alone = block is not None and getattr(block, part[:3]) is None  # no norm before
        where = "OLMo 2: the only norm of the sub-layer" if alone else "Gemma's sandwich"
        return f"{part}: {kind} of the {sub}'s output, before the sum ({where})"
    sub = {"ln1": "self-attention", "ln_cross": "cross-attention", "ln2": "feed-forward"}[part]
    if block is not None and block.norm_first:
        both = part == "ln1" and block.parallel and block.ln2 is None  # Phi, GPT-J
        return f"{part}: {kind} of the stream, before {sub}{' and feed-forward' * both} (pre-norm)"
    scale = "root mean square 1" if kind == "RMSNorm" else "mean 0, variance 1"
    return f"{part}: {kind} of x + {sub}(x) ({scale} per position, post-norm)"


def _attention_step(rest: str, attn: Any, stack: Any, value: Tensor) -> str:
    leaf = rest.split(".")[-1]
    H, Hkv, Dh = attn.num_heads, attn.num_kv_heads, attn.head_dim
    bias = attn.qkv_proj.bias is not None
    source = "memory" if rest.startswith("cross_attn") else "x"
    if leaf in ("hook_q", "hook_k", "hook_v"):
        letter = leaf[-1].upper()
        x = "x" if letter == "Q" else source
        heads = H if letter == "Q" else Hkv
        shared = f", each shared by {H // Hkv} query heads" if heads != H else ""
        plus = f" + b_{letter.lower()}" if bias else ""
        projected = f"{x}·W_{letter.lower()}{plus}"
        clip = getattr(attn, "clip", None)
        projected = projected if clip is None else f"clamp({projected}, ±{clip:g})"
        return f"{letter} = {projected}, in {heads} heads of {Dh}{shared}"
    if leaf in ("hook_rot_q", "hook_rot_k"):
        rotary = getattr(stack, "rotary", None) or attn.rotary
        theta, width = getattr(rotary, "theta", 0), getattr(rotary, "head_dim", Dh)
        part = f", its first {width} of {Dh} features" if width < Dh else ""
        part += ", in neighbouring pairs" if getattr(rotary, "interleaved", False) else ""
        return f"{leaf[-1].upper()} rotated by position (RoPE, theta={theta:g}{part})"
    if leaf == "hook_attn_scores":
        masked = int((value == torch.finfo(value.dtype).min).sum())
        why = "causal" if attn.causal else "padding"
        mask = f", {masked} of {value.numel()} masked ({why})" if masked else ""
        scale = (
            f"/√{Dh} (× {1 / math.sqrt(Dh):.4f})" if attn.scale is None else f" × {attn.scale:.4g}"
        )
        bias = getattr(stack, "relative_bias", None) is not None and source == "x"
        extra = (" + position bias" if bias else "") + (
            f", capped at ±{attn.softcap:g}" if attn.softcap is not None else ""
        )
        return f"scores Q·Kᵀ{scale}{extra}{mask}"
    if leaf == "hook_pattern":
        sums = value.sum(-1)
        return f"softmax over keys: rows sum to {sums.min():.4f}..{sums.max():.4f}"
    if leaf == "hook_z":
        return "weighted sum of V, per head"
    if leaf == "hook_result":
        return "each head's share of the output"
    return leaf


def _mlp_step(rest: str, mlp: Any) -> str:
    leaf = rest.split(".")[-1]
    if isinstance(mlp, Expert):
        if ".shared_expert." in rest:
            return "the shared expert's output at every token: down(silu(gate(x)) · up(x))"
        expert = rest.split(".")[2]
        return f"expert {expert}'s output: down(silu(gate(x)) · up(x)), 0 where not chosen"
    if isinstance(mlp, MixtureOfExperts):
        E, k = mlp.num_experts, mlp.top_k
        return {"hook_router_logits": f"router: x·W_router, a score for each of {E} experts",
                "hook_router_weights": f"softmax of the scores at the {k} largest"
                + (", renormalised to sum to 1" if mlp.normalize else "") + "; 0 elsewhere",
                "hook_shared_weight": "sigmoid(x·w_gate): the shared expert's weight"}.get(
                    leaf, leaf)  # fmt: skip
    if isinstance(mlp, GatedFeedForward):
        return {"hook_pre": "gate_proj: D → d_ff",
                "hook_pre_linear": "up_proj: D → d_ff",
                "hook_post": f"{mlp.activation}: {_GATES[mlp.activation]}(gate) · up"}.get(
                    leaf, leaf)  # fmt: skip
    return {"hook_pre": "linear1: D → d_ff",
            "hook_post": f"{mlp.activation}(linear1)"}.get(leaf, leaf)  # fmt: skip


_GATES = {"swiglu": "silu", "geglu_tanh": "gelu_tanh"}


def format_trace(steps: Iterable[Step]) -> str:
    """The steps as aligned text lines: place, step, shape, first values."""
    lines, last = [], None
    for s in steps:
        if s.where != last:
            lines.append(f"\n{s.where}")
            last = s.where
        shape = "(" + ", ".join(map(str, s.shape)) + ")"
        values = ", ".join(f"{x: .4f}" for x in s.values)
        lines.append(f"  {s.what:<62} {shape:<18} [{values}, …]")
    return "\n".join(lines).lstrip("\n")
