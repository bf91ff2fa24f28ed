"""The live page's program: every step of the forward pass as a rule over the model's weights.

The explorable page (``explain``) carries each step's values, or the one line of arithmetic
that computes it from earlier steps (``derive``). A live page carries neither: it carries the
weights, and every step is a rule the page runs on the ids of whatever the reader types,

    hook_embed                the embedding's rows for the ids (times √D where it scales)
    hook_pos_embed            the position table's first T rows
    ln1.hook_normalized       LayerNorm or RMSNorm of the stream, statistics computed
    attn.hook_q / _k / _v     the stream times rows of the fused projection, split in heads
    hook_attn_out             the heads side by side, times the output projection
    mlp.hook_pre, hook_mlp_out   the MLP's two products; hook_post its activation
    hook_pooled, hook_logits  a classifier's pooling, the head

and the rules ``derive`` already has (sums, softmax, the weighted values, q·kᵀ/√d under the
mask, rotary). Each rule is found here by trying what the step could be and keeping the one
that, run in float64 from the rules before it, gives the hook cache's value within
``TOLERANCE`` of the step's largest magnitude. A step no rule gives (a window, a cap, a
bias the page does not know) refuses the live page in one line naming it.
"""

from __future__ import annotations

import math
from typing import Any, cast

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from glassformer.errors import LiveError
from glassformer.models.base import PretrainedModel
from glassformer.modules.attention import MultiHeadAttention
from glassformer.modules.norms import RMSNorm
from glassformer.viz.derive import FUNCTIONS, MASKED, _candidates, _rope_tables

TOLERANCE = 1e-4  # of the step's largest magnitude: a float64 rule against the float32 model
LINEARS = {  # a step's leaf → the Linear under the step's owner that makes it
    "hook_pre": ("linear1", "gate_proj"), "hook_pre_linear": ("up_proj",),
}  # fmt: skip


def live_program(
    model: PretrainedModel, steps: list[dict], full: list[Tensor], ids: Any
) -> tuple[list[dict], dict[str, Tensor], dict[str, dict]]:
    """Each step's rule (JSON-ready but for its tensors), the weights the rules read by name,
    and the rotary tables, for ``steps`` (the page's, in order) whose values on ``ids`` (T,)
    are ``full`` (the page's layout, not thinned)."""
    index = {step["name"]: i for i, step in enumerate(steps)}
    weights: dict[str, Tensor] = {}
    tables = _rope_tables(model, [torch.zeros(model.config.max_len, 1)])
    found: list[Tensor] = []
    rules: list[dict] = []
    for i, step in enumerate(steps):
        for rule in _inputs(model, step["name"], _tried(model, step["name"], index, full,
                                                        weights, tables)):  # fmt: skip
            if not all(j < i for j in rule.get("of", [])):
                continue
            value = run_rule(rule, found, weights, ids, tables)
            if value is not None and close(value, full[i]):
                rules.append(rule)
                found.append(value)
                break
        else:
            raise LiveError(f"the live page has no rule that gives {step['name']} "
                            f"({step['what']}); the page keeps its text fixed")  # fmt: skip
    return rules, weights, tables


def _inputs(model: PretrainedModel, name: str, rules: list[dict]) -> list[dict]:
    """A translator's rules that read ids name whose: the source's in the encoder and for
    the keys of cross-attention, else the target's."""
    if model.kind != "seq2seq":
        return rules
    own = "source" if name.startswith("encoder.") else "target"
    keys = "source" if ".cross_attn." in name else own
    return [{**rule, "ids": keys if rule["op"] == "scores" else own}
            if rule["op"] in ("embed", "rows", "scores") else rule for rule in rules]  # fmt: skip


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
            return _linear(rule, parts[0], weights)
        if op in ("layernorm", "rmsnorm"):  # of one step, or of the sum of two (post-norm)
            return _norm(rule, sum(parts[1:], parts[0]), weights)
        if op == "pool":
            return _pool(rule["how"], parts[0], ids, rule.get("pad"))
        if op == "scores":
            return _scores(rule, parts[0], parts[1], ids)
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


def _scores(rule: dict, q: Tensor, k: Tensor, ids: Tensor) -> Tensor:
    """q·kᵀ × scale (1/√Dh unless the rule says) (H, Tq, Tk), squashed to c·tanh(s/c) where
    it has a ``softcap``; a key padded (its id ``pad``), later than the query (causal) or
    outside the query's ``window`` [left, right] masked."""
    k = k.repeat_interleave(q.size(0) // k.size(0), dim=0)
    scores = q @ k.transpose(-2, -1) * rule.get("scale", 1 / math.sqrt(q.size(-1)))
    if rule.get("softcap"):
        scores = rule["softcap"] * torch.tanh(scores / rule["softcap"])
    Tq, Tk = scores.shape[-2:]
    allowed = torch.ones(Tq, Tk, dtype=torch.bool)
    if rule.get("mask") == "causal":
        allowed = allowed.tril(Tk - Tq)
    if rule.get("window") is not None:
        from glassformer.modules.local_attention import window_mask

        allowed &= window_mask(Tq, Tk, window=rule["window"], global_tokens=rule["global"])
    if rule.get("pad") is not None:
        allowed &= (ids != rule["pad"])[None, :]
    return scores.masked_fill(~allowed, MASKED)


def _tried(
    model: PretrainedModel,
    name: str,
    index: dict[str, int],
    full: list[Tensor],
    weights: dict[str, Tensor],
    tables: dict[str, dict],
) -> list[dict]:
    """The rules that might give step ``name``, the weights they read put in ``weights``."""
    owner, _, leaf = name.rpartition(".")
    before = [i for i in range(index[name] - 1, -1, -1)][:16]  # the latest steps first
    rules: list[dict] = []
    if leaf == "hook_embed" and model.kind == "vit":
        proj = cast(nn.Conv2d, cast(Any, model).embed.proj)
        rules.append({"op": "patches", "weight": _carry(model, proj.weight, weights),
                      **({"bias": _carry(model, proj.bias, weights)} if proj.bias is not None
                         else {})})  # fmt: skip
    elif leaf == "hook_embed":
        embed = cast(nn.Embedding, model.get_submodule(f"{owner}.embed" if owner else "embed"))
        scale = float(getattr(embed, "scale", 1.0))
        rules.append({"op": "embed", "weight": _carry(model, embed.weight, weights),
                      **({"scale": scale} if scale != 1.0 else {})})  # fmt: skip
    elif leaf == "hook_pos_embed":
        pos: Any = model.get_submodule(f"{owner}.pos_embed" if owner else "pos_embed")
        width = full[index[name]].size(-1)
        rows = len(full[index[name]]) if model.kind == "vit" else model.config.max_len
        table = pos.rows(torch.zeros(1, rows, width), 0, None).detach()
        key = f"{owner}.pos_embed.table".lstrip(".")
        weights[key] = table.float()
        rules.append({"op": "rows", "weight": key,
                      **({"count": rows} if model.kind == "vit" else {})})  # fmt: skip
    elif leaf == "hook_resid_pre":
        rules += _stream_start(model, name, index, weights)
    elif leaf == "hook_normalized":
        rules += _norm_rules(model, model.get_submodule(owner), before, full, weights)
    elif leaf in ("hook_q", "hook_k", "hook_v"):
        if ".cross_attn" in name and leaf != "hook_q":  # the encoder's output, its memory
            before = [max(i for n, i in index.items() if n.startswith("encoder."))]
        rules += _qkv_rules(model, model.get_submodule(owner), leaf, before, weights)
    elif leaf in ("hook_attn_out", "hook_cross_attn_out"):
        which = "cross_attn" if leaf == "hook_cross_attn_out" else "attn"
        attn = cast(MultiHeadAttention, model.get_submodule(f"{owner}.{which}"))
        rules += _linear_rules(model, attn.out_proj, before, weights)
    elif leaf in LINEARS:
        for child in LINEARS[leaf]:
            if hasattr(model.get_submodule(owner), child):
                module = model.get_submodule(f"{owner}.{child}")
                rules += _linear_rules(model, module, before, weights)
    elif leaf == "hook_mlp_out":
        mlp = model.get_submodule(f"{owner}.mlp")
        out = getattr(mlp, "linear2", None) or getattr(mlp, "down_proj", None)
        rules += _linear_rules(model, out, before, weights) if out is not None else []
    elif leaf == "hook_pooled":
        pad = getattr(model.config, "pad_id", None)
        rules += [{"op": "pool", "of": [j], "how": model.config.pooling, "pad": pad}
                  for j in before[:2]]  # fmt: skip
    elif leaf == "hook_logits":
        head = next((getattr(model, n) for n in ("lm_head", "head", "output_proj")
                     if hasattr(model, n)), None)  # fmt: skip
        rules += _linear_rules(model, head, before, weights) if head is not None else []
    else:
        rules += _attention_rules(model, name, index, full, tables)
    return rules + [{"op": "same", "of": [j]} for j in before[:2]]  # post-norm: resid_mid = ln1


def _stream_start(
    model: PretrainedModel, name: str, index: dict[str, int], weights: dict
) -> list[dict]:
    """A block's input: the last block's output, or the embeddings (with the positions; a
    ViT's after its class token)."""
    prefix, layer = name.split(".hook_resid_pre")[0].rsplit(".", 1)
    stack = prefix.rpartition("blocks")[0]
    if int(layer) > 0:
        return [{"op": "same", "of": [index[f"{prefix}.{int(layer) - 1}.hook_resid_post"]]}]
    embed, pos = index.get(f"{stack}hook_embed"), index.get(f"{stack}hook_pos_embed")
    if embed is None:
        return []
    cls = getattr(model, "cls_token", None)
    if cls is not None and pos is not None:
        return [{"op": "cls", "of": [embed, pos], "weight": _carry(model, cls, weights)}]
    return (
        [{"op": "sum", "of": [embed, pos]}] if pos is not None else [{"op": "same", "of": [embed]}]
    )


def _attention_rules(
    model: PretrainedModel, name: str, index: dict[str, int], full: list[Tensor], tables: dict
) -> list[dict]:
    """derive's rules for the attention's steps and the sums, with the live page's masks."""
    rules = _candidates(name, index, full, tables)
    if name.endswith("hook_attn_scores"):
        attn = model.get_submodule(name.rpartition(".")[0])
        if not isinstance(attn, MultiHeadAttention):
            return []
        how: dict[str, Any] = {"pad": getattr(model.config, "pad_id", None)}
        if attn.scale is not None:
            how["scale"] = float(attn.scale)
        if attn.softcap is not None:
            how["softcap"] = float(attn.softcap)
        if attn.window is not None:
            how.update(window=[int(attn.window[0]), int(attn.window[1])],
                       **{"global": int(attn.global_tokens)})  # fmt: skip
        rules = [{**rule, **how} for rule in rules]
    if name.endswith("hook_resid_post"):  # a parallel block: x + attention + MLP
        parts = [index.get(name.replace("hook_resid_post", leaf))
                 for leaf in ("hook_resid_pre", "hook_attn_out", "hook_mlp_out")]  # fmt: skip
        if None not in parts:
            rules.append({"op": "sum", "of": parts})
    return rules


def _norm_rules(
    model: PretrainedModel, norm: nn.Module, before: list[int], full: list[Tensor], weights: dict
) -> list[dict]:
    """LayerNorm or RMSNorm of one of the latest steps of its width."""
    if not isinstance(norm, (nn.LayerNorm, RMSNorm)):
        return []
    rule: dict[str, Any] = {"op": "rmsnorm" if isinstance(norm, RMSNorm) else "layernorm",
                            "eps": float(norm.eps)}  # fmt: skip
    if norm.weight is not None:
        rule["weight"] = _carry(model, norm.weight, weights)
    if isinstance(norm, RMSNorm) and norm.unit_offset:
        rule["offset"] = 1.0
    bias = getattr(norm, "bias", None)
    if bias is not None:
        rule["bias"] = _carry(model, bias, weights)
    width = int(norm.weight.numel()) if norm.weight is not None else norm.normalized_shape[0]
    fits = [j for j in before if full[j].size(-1) == width]
    pairs = [[a, b] for n, a in enumerate(fits[:4]) for b in fits[n + 1 : 4]]  # post-norm's sum
    return [{**rule, "of": [j]} for j in fits] + [{**rule, "of": sorted(p)} for p in pairs]


def _qkv_rules(
    model: PretrainedModel, attn: nn.Module, leaf: str, before: list[int], weights: dict
) -> list[dict]:
    """q, k or v: rows of the fused projection of one of the latest steps, in heads."""
    if not isinstance(attn, MultiHeadAttention) or attn.clip is not None:
        return []
    H, Hkv, Dh = attn.num_heads, attn.num_kv_heads, attn.head_dim
    lo, hi, heads = {"hook_q": (0, H * Dh, H), "hook_k": (H * Dh, (H + Hkv) * Dh, Hkv),
                     "hook_v": ((H + Hkv) * Dh, (H + 2 * Hkv) * Dh, Hkv)}[leaf]  # fmt: skip
    rules = _linear_rules(model, attn.qkv_proj, before, weights)
    return [{**rule, "rows": [lo, hi], "heads": heads} for rule in rules]


def _linear_rules(
    model: PretrainedModel, linear: nn.Module, before: list[int], weights: dict
) -> list[dict]:
    if not isinstance(linear, nn.Linear):
        return []
    rule: dict[str, Any] = {"op": "linear", "weight": _carry(model, linear.weight, weights)}
    if linear.bias is not None:
        rule["bias"] = _carry(model, linear.bias, weights)
    return [{**rule, "of": [j]} for j in before]


def _carry(model: PretrainedModel, parameter: Tensor, weights: dict[str, Tensor]) -> str:
    """The name the page carries ``parameter`` under (a tied weight once), put in ``weights``."""
    for name, value in weights.items():
        if value.data_ptr() == parameter.data_ptr() and value.shape == parameter.shape:
            return name
    name = next(n for n, p in model.named_parameters(remove_duplicate=False) if p is parameter)
    weights[name] = parameter.detach()
    return name


@torch.no_grad()
def page_values(model: PretrainedModel, names: list[str], ids: Any) -> list[Tensor]:
    """The model's value at each of ``names`` for ``ids`` (T,), as the page lays it out: the
    one example, per-head values as heads × positions × features, masked scores as MASKED."""
    from glassformer.viz.explain import laid_out

    inputs = (ids["source"][None], ids["target"][None]) if isinstance(ids, dict) else (ids[None],)
    _, cache = model.run_with_cache(*inputs, names=names)  # ids, a ViT's image, a translator's
    return [laid_out(name, cache[name])[0] for name in names]
