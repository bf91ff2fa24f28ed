"""The steps the explorable page computes from other steps instead of carrying them.

Carrying every hook point's tensor of SmolLM2 for 40 tokens would make a page of ~36 MB.
Most steps follow from earlier ones by one line of arithmetic, the line the model itself
ran: a residual sum adds two steps, the weights are the softmax of the scores, each head's
weighted sum is its weights times its values, the scores are q·k/√Dh under the mask, the
rotated q and k are q and k turned by a table of cosines and sines, and a block's input is
the previous block's output. Such a step travels as its rule (``{"op": ..., "of": [steps]}``)
and the page computes it (``explain.js``, ``derived``).

Each rule is written twice, here in torch and in the page, and a step travels as its rule
only where the rule, applied here to the steps the page holds, gives the hook cache's value
within ``TOLERANCE``: a block that adds a bias to its scores, caps them, attends in a window
or sums its residual after a norm carries its own tensor. Nothing the page shows is a guess.
"""

from __future__ import annotations

import base64
import math
from typing import Any

import torch
from torch import Tensor, nn

from glassformer.models.base import PretrainedModel
from glassformer.modules.feedforward import ACTIVATIONS
from glassformer.modules.norms import RMSNorm
from glassformer.modules.rotary import RotaryEmbedding, rotate_half, rotate_pairs

TOLERANCE = 1e-6  # of the largest magnitude in the step, or absolute where that is below 1
FUNCTIONS = ACTIVATIONS  # relu, gelu, gelu_tanh, silu: each MLP's is found by trying them
MASKED = -1e30  # how a masked score travels (the cache holds the dtype's lowest value)


def derivations(
    model: PretrainedModel, steps: list[dict], shown: list[Tensor], full: list[Tensor]
) -> tuple[dict[int, dict], dict[str, dict]]:
    """For the steps (their ``name``), the values the page would show (heads first where the
    layout says so, masked scores as ``MASKED``) and the same values not thinned: the rule of
    each step the page can compute from earlier ones (JSON-ready), and the tables those
    rules read."""
    index = {step["name"]: i for i, step in enumerate(steps)}
    seen: dict[tuple, int] = {}
    rules: dict[int, dict] = {}
    tables = _rope_tables(model, shown)
    for i, (step, value) in enumerate(zip(steps, shown, strict=True)):
        candidates = [*_same(value, seen), *_candidates(step["name"], index, shown, tables),
                      *_norms(model, step["name"], index, full, value.shape)]  # fmt: skip
        for rule in candidates:
            if all(j < i for j in rule["of"]) and _reproduces(rule, shown, tables, value):
                rules[i] = _json(rule)
                break
        seen.setdefault(_key(value), i)
    used = {rule["table"] for rule in rules.values() if "table" in rule}
    return rules, {name: _json(tables[name]) for name in sorted(used)}


def compute(rule: dict, shown: list[Tensor], tables: dict[str, dict]) -> Tensor:
    """What ``rule`` gives from the shown values of the steps it names (as ``explain.js``)."""
    parts = [shown[j].double() for j in rule["of"]]
    op = rule["op"]
    if op == "same":
        return parts[0]
    if op == "sum":
        return parts[0] + parts[1]
    if op == "softmax":  # a row that may read no key gives zeros, as the model does
        empty = (parts[0] <= MASKED / 2).all(-1, keepdim=True)
        return parts[0].softmax(-1).masked_fill(empty, 0.0)
    if op == "weighted":  # weights (H, Tq, Tk) @ values (Hkv, Tk, Dv)
        weights, v = parts
        return weights @ v.repeat_interleave(weights.size(0) // v.size(0), dim=0)
    if op == "scores":  # q (H, Tq, Dh), k (Hkv, Tk, Dh)
        return scores(rule, parts[0], parts[1], None)
    if op == "rope":  # x (H, T, Dh) turned by the table's (T, width) cosines and sines
        x, table = parts[0], tables[rule["table"]]
        cos, sin = (table[part].double()[: x.size(-2)] for part in ("cos", "sin"))
        width = cos.size(-1)
        partner = rotate_pairs if table.get("interleaved") else rotate_half  # GPT-J's: 2i, 2i+1
        turned = x[..., :width] * cos + partner(x[..., :width]) * sin
        return torch.cat((turned, x[..., width:]), dim=-1)
    if op == "norm":  # (x − shift) · scale per row, then · weight + bias per feature
        x = parts[0]
        rows = (*x.shape[:-1], 1)  # the statistics, one per row, flattened in the rule
        shift = rule["shift"].double().view(rows) if "shift" in rule else 0.0
        bias = rule["bias"].double() if "bias" in rule else 0.0
        return (x - shift) * rule["scale"].double().view(rows) * rule["weight"].double() + bias
    if op == "act":  # the activation of the first part, times the second where there is one
        out = FUNCTIONS[rule["fn"]](parts[0])
        return out * parts[1] if len(parts) == 2 else out
    raise ValueError(f"no rule {op!r}")


def scores(rule: dict, q: Tensor, k: Tensor, ids: Tensor | None) -> Tensor:
    """q·kᵀ × scale (1/√Dh unless the rule says) (H, Tq, Tk), squashed to c·tanh(s/c) where
    it has a ``softcap``; a key later than the query (``mask`` "causal"), outside the query's
    ``window`` [left, right] (its first ``global`` positions seen by all), or padded (its id
    in ``ids`` the rule's ``pad``: a live page's) masked. The one scores rule of both pages."""
    k = k.repeat_interleave(q.size(0) // k.size(0), dim=0)
    out = q @ k.transpose(-2, -1) * rule.get("scale", 1 / math.sqrt(q.size(-1)))
    if rule.get("softcap"):
        out = rule["softcap"] * torch.tanh(out / rule["softcap"])
    Tq, Tk = out.shape[-2:]
    allowed = torch.ones(Tq, Tk, dtype=torch.bool)
    if rule.get("mask") == "causal":
        allowed = allowed.tril(Tk - Tq)
    if rule.get("window") is not None:
        from glassformer.modules.local_attention import window_mask

        allowed &= window_mask(Tq, Tk, window=rule["window"], global_tokens=rule["global"])
    if rule.get("pad") is not None and ids is not None:
        allowed &= (ids != rule["pad"])[None, :]
    return out.masked_fill(~allowed, MASKED)


def _candidates(
    name: str, index: dict[str, int], shown: list[Tensor], tables: dict[str, dict]
) -> list[dict]:
    """The rules that might compute the step ``name``, by what its hook point is."""
    owner, _, leaf = name.rpartition(".")
    base = f"{owner}." if owner else ""

    def of(*leaves: str) -> list[int] | None:
        names = [base + leaf for leaf in leaves]
        return [index[n] for n in names] if all(n in index for n in names) else None

    def first(*leaves: str) -> int | None:
        return next((index[base + leaf] for leaf in leaves if base + leaf in index), None)

    rules: list[dict] = []
    if leaf in ("hook_resid_mid", "hook_resid_mid_cross", "hook_resid_post"):
        parts = {"hook_resid_mid": of("hook_resid_pre", "hook_attn_out"),
                 "hook_resid_mid_cross": of("hook_resid_mid", "hook_cross_attn_out"),
                 "hook_resid_post": of("hook_resid_mid_cross", "hook_mlp_out")
                 or of("hook_resid_mid", "hook_mlp_out")}[leaf]  # fmt: skip
        rules += [{"op": "sum", "of": parts}] if parts else []
    elif leaf == "hook_pattern" and (parts := of("hook_attn_scores")):
        rules.append({"op": "softmax", "of": parts})
    elif leaf == "hook_z" and (parts := of("hook_pattern", "hook_v")):
        rules.append({"op": "weighted", "of": parts})
    elif leaf == "hook_attn_scores":
        q, k = first("hook_rot_q", "hook_q"), first("hook_rot_k", "hook_k")
        if q is not None and k is not None:
            rules += [{"op": "scores", "of": [q, k], "mask": mask} for mask in ("causal", "none")]
    elif leaf in ("hook_rot_q", "hook_rot_k"):  # from q (k), or its QK-norm where there is one
        which = leaf[-1]
        parts = of(f"{which}_norm.hook_normalized") or of(f"hook_{which}")
        rules += [{"op": "rope", "of": parts, "table": table} for table in tables] if parts else []
    elif leaf == "hook_post" and (parts := of("hook_pre", "hook_pre_linear") or of("hook_pre")):
        rules += [{"op": "act", "of": parts, "fn": fn} for fn in FUNCTIONS]
    return rules


def _norms(
    model: PretrainedModel, name: str, index: dict[str, int], full: list[Tensor], shape: torch.Size
) -> list[dict]:
    """A norm's output from its input: one of the residual-stream steps just before it, or
    for a QK-norm the attention's q or k (heads × positions × features). The norm's
    statistics of each row shown (over all its features, so from the values not thinned)
    travel with the rule, flattened, and its weight and bias (the features shown; an
    RMSNorm's shift and bias, zeros, are left out). ``shape``: the output as shown."""
    owner, _, leaf = name.rpartition(".")
    module = model.get_submodule(owner) if owner else None
    if leaf != "hook_normalized" or not isinstance(module, (RMSNorm, nn.LayerNorm)):
        return []
    attention, _, norm = owner.rpartition(".")
    if norm in ("q_norm", "k_norm"):
        before = [index[n] for n in (f"{attention}.hook_{norm[0]}",) if n in index]
    else:
        before = [i for n, i in index.items() if i < index[name] and ".hook_resid" in f".{n}"]
    rules, features = (
        [],
        int(module.weight.numel() if module.weight is not None else module.normalized_shape[0]),
    )  # (OLMo's LayerNorm has no weight)
    for j in before[-3:]:
        x = full[j].double()
        if x.dim() != len(shape) or x.size(-1) != features:
            continue
        x, width = x[..., : shape[-2], :], shape[-1]  # the rows and features shown
        weight = torch.ones(features) if module.weight is None else module.weight.detach()
        weight = weight.double()[:width]
        if isinstance(module, RMSNorm):
            scale = torch.rsqrt(x.pow(2).mean(-1) + module.eps).flatten()
            weight = 1 + weight if module.unit_offset else weight
            rules.append({"op": "norm", "of": [j], "scale": scale.float(),
                          "weight": weight.float()})  # fmt: skip
            continue
        rule = {"op": "norm", "of": [j], "shift": x.mean(-1).flatten().float(),
                "scale": torch.rsqrt(x.var(-1, unbiased=False) + module.eps).flatten().float(),
                "weight": weight.float()}  # fmt: skip
        if module.bias is not None:
            rule["bias"] = module.bias.detach()[:width].float()
        rules.append(rule)
    return rules


def tensors(rule: dict) -> dict:
    """A rule (or tables) as the page holds it, with its base64 values back as tensors:
    what ``compute`` reads."""
    import numpy as np

    def decoded(key: str, value: Any) -> Any:
        if isinstance(value, dict):
            return tensors(value)
        if isinstance(value, str) and key in ("shift", "scale", "weight", "bias", "cos", "sin"):
            array = np.frombuffer(base64.b64decode(value), dtype="<f4").copy()
            return torch.from_numpy(array)
        return value

    out = {k: decoded(k, v) for k, v in rule.items()}
    if "cos" in out:  # a table: (T, width)
        out["cos"], out["sin"] = out["cos"].view(rule["shape"]), out["sin"].view(rule["shape"])
    return out


def _json(rule: dict) -> dict:
    """The rule (or table) as the page holds it: its tensors as base64 float32 values."""
    from glassformer.viz.viewer import base64_floats

    return {k: base64_floats(v) if isinstance(v, Tensor) else v for k, v in rule.items()}


def _same(value: Tensor, seen: dict[tuple, int]) -> list[dict]:
    """The rule "the same as an earlier step" (a block's input is the last block's output)."""
    earlier = seen.get(_key(value))
    return [{"op": "same", "of": [earlier]}] if earlier is not None else []


def _key(value: Tensor) -> tuple:
    return (tuple(value.shape), hash(value.numpy().tobytes()))


def _reproduces(rule: dict, shown: list[Tensor], tables: dict[str, dict], value: Tensor) -> bool:
    try:
        computed = compute(rule, shown, tables)
    except RuntimeError:  # shapes that do not go together: not this rule
        return False
    if computed.shape != value.shape:
        return False
    if rule["op"] in ("same", "sum", "act", "norm", "rope") and any(
        shown[j].shape != value.shape for j in rule["of"]
    ):  # elementwise: the page reads every part at the value's own indices
        return False
    value = value.double()
    masked = value <= MASKED / 2
    if not torch.equal(masked, computed <= MASKED / 2):
        return False
    peak = max(1.0, float(value.abs().masked_fill(masked, 0).max()) if value.numel() else 1.0)
    return bool(((computed - value).abs().masked_fill(masked, 0) <= TOLERANCE * peak).all())


def _rope_tables(model: PretrainedModel, shown: list[Tensor]) -> dict[str, dict]:
    """The cosines and sines of each rotary embedding in ``model`` at positions 0, 1, ...
    (as many as the longest shown step has rows), each (T, width)."""
    rows = max((v.size(-2) for v in shown if v.dim() >= 2), default=0)
    tables: dict[str, dict] = {}
    for module in model.modules():
        if isinstance(module, RotaryEmbedding):
            angles = module.cos_sin(torch.arange(rows), torch.float32)
            cos, sin = angles.cos[0, 0], angles.sin[0, 0]  # (T, width)
            if not any(torch.equal(cos, t["cos"]) for t in tables.values()):
                tables[f"rope{len(tables)}"] = {"cos": cos, "sin": sin, "shape": list(cos.shape),
                                                "interleaved": module.interleaved}  # fmt: skip
    return tables
