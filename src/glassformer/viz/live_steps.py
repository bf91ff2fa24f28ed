"""Which rule gives each step of the live page (``live_rules``): found by trying what the
step could be and keeping the one that, run in float64 from the rules before it, gives the
hook cache's value within ``TOLERANCE`` of the step's largest magnitude. Only the layer's own
activation and rotary table are tried. A step no rule gives (T5's relative position bias, a
bias the page does not know) refuses the live page in one line naming it.
"""

from __future__ import annotations

from typing import Any, cast

import torch
from torch import Tensor, nn

from glassformer.errors import LiveError
from glassformer.models.base import PretrainedModel
from glassformer.modules.attention import MultiHeadAttention
from glassformer.modules.norms import RMSNorm
from glassformer.modules.rotary import RotaryEmbedding
from glassformer.viz.derive import FUNCTIONS, _candidates, _rope_tables
from glassformer.viz.live_rules import close, run_rule

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
    if leaf in ("hook_embed", "hook_pos_embed"):
        rules += _embedding_rules(model, owner, leaf, full[index[name]], weights)
    elif leaf == "hook_resid_pre":
        rules += _stream_start(model, name, index, weights)
    elif leaf == "hook_normalized" and owner.endswith("_post"):  # Gemma's sandwich
        rules += _post_norm_rules(model, owner, before, weights)
    elif leaf == "hook_normalized":
        rules += _norm_rules(model, model.get_submodule(owner), before, full, weights)
        types = getattr(model, "token_type", None)
        if owner.endswith("ln_embed") and isinstance(types, nn.Embedding):  # BERT's sum
            segment = _carry(model, types.weight, weights)  # every position in segment 0
            rules = [{**rule, "segment": segment} for rule in rules]
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
        cap = getattr(model, "final_softcap", None)  # Gemma: logits squashed to c·tanh(s/c)
        rules = [{**rule, "softcap": float(cap)} for rule in rules] if cap else rules
    else:
        found = _attention_rules(model, name, index, full, tables)
        rules += _own(model, owner, leaf, found, tables)
    return rules + [{"op": "same", "of": [j]} for j in before[:2]]  # post-norm: resid_mid = ln1


def _embedding_rules(
    model: PretrainedModel, owner: str, leaf: str, value: Tensor, weights: dict
) -> list[dict]:
    """The embedding's rows (a ViT's patches), or the position table's."""
    if leaf == "hook_embed" and model.kind == "vit":
        proj = cast(nn.Conv2d, cast(Any, model).embed.proj)
        return [{"op": "patches", "weight": _carry(model, proj.weight, weights),
                 **({"bias": _carry(model, proj.bias, weights)} if proj.bias is not None
                    else {})}]  # fmt: skip
    if leaf == "hook_embed":
        embed = cast(nn.Embedding, model.get_submodule(f"{owner}.embed" if owner else "embed"))
        scale = float(getattr(embed, "scale", 1.0))
        return [{"op": "embed", "weight": _carry(model, embed.weight, weights),
                 **({"scale": scale} if scale != 1.0 else {})}]  # fmt: skip
    pos: Any = model.get_submodule(f"{owner}.pos_embed" if owner else "pos_embed")
    rows = len(value) if model.kind == "vit" else model.config.max_len
    table = pos.rows(torch.zeros(1, rows, value.size(-1)), 0, None).detach()
    key = f"{owner}.pos_embed.table".lstrip(".")
    weights[key] = table.float()
    return [{"op": "rows", "weight": key, **({"count": rows} if model.kind == "vit" else {})}]


def _own(model: PretrainedModel, owner: str, leaf: str, rules: list[dict], tables: dict) -> list:
    """Of the activations and rotary tables tried, the layer's own only: on one opening text
    another may come close enough (GELU and its tanh approximation, two rotary bases over a
    few positions), and would be wrong on the next."""
    if leaf == "hook_post":  # the MLP's activation (on the gate, where it is gated)
        name = str(getattr(model.get_submodule(owner), "activation", ""))
        fn = {"swiglu": "silu", "geglu_tanh": "gelu_tanh"}.get(name, name)
        return [r for r in rules if r.get("fn") == fn] if fn in FUNCTIONS else rules
    if leaf in ("hook_rot_q", "hook_rot_k"):
        attn = model.get_submodule(owner)
        shared = [m for n, m in model.named_modules()
                  if isinstance(m, RotaryEmbedding) and ".attn." not in f".{n}."]  # fmt: skip
        rotary = getattr(attn, "rotary", None) or (shared[0] if len(shared) == 1 else None)
        if rotary is None:
            return rules
        cos = rotary.cos_sin(torch.arange(model.config.max_len), torch.float32).cos[0, 0]
        own = [k for k, t in tables.items() if torch.equal(t["cos"], cos)]
        return [r for r in rules if r.get("table") in own]
    return rules


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
    """LayerNorm or RMSNorm of one of the latest steps of its width, or of the sum of two."""
    rule = _norm_rule(model, norm, weights)
    if rule is None:
        return []
    known = cast(nn.LayerNorm | RMSNorm, norm)
    width = int(known.weight.numel()) if known.weight is not None else known.normalized_shape[0]
    fits = [j for j in before if full[j].size(-1) == width]
    pairs = [[a, b] for n, a in enumerate(fits[:4]) for b in fits[n + 1 : 4]]  # post-norm's sum
    return [{**rule, "of": [j]} for j in fits] + [{**rule, "of": sorted(p)} for p in pairs]


def _norm_rule(model: PretrainedModel, norm: nn.Module, weights: dict) -> dict | None:
    """The norm's rule, without what it reads (None: not a norm the page knows)."""
    if not isinstance(norm, (nn.LayerNorm, RMSNorm)):
        return None
    rule: dict[str, Any] = {"op": "rmsnorm" if isinstance(norm, RMSNorm) else "layernorm",
                            "eps": float(norm.eps)}  # fmt: skip
    if norm.weight is not None:
        rule["weight"] = _carry(model, norm.weight, weights)
    if isinstance(norm, RMSNorm) and norm.unit_offset:
        rule["offset"] = 1.0
    bias = getattr(norm, "bias", None)
    if bias is not None:
        rule["bias"] = _carry(model, bias, weights)
    return rule


def _post_norm_rules(model: PretrainedModel, owner: str, before: list[int], weights: dict) -> list:
    """Gemma's norm after a sub-layer, of the sub-layer's output projection, which has no
    step of its own (the sub-layer's output is the norm's): the norm of ``project``, a
    Linear of one of the latest steps."""
    block, _, name = owner.rpartition(".")
    which = {"ln1_post": ("attn", "out_proj"), "ln2_post": ("mlp", "down_proj")}.get(name)
    rule = _norm_rule(model, model.get_submodule(owner), weights)
    if which is None or rule is None:
        return []
    inner = model.get_submodule(f"{block}.{which[0]}")
    projection = getattr(inner, which[1], None) or getattr(inner, "linear2", None)
    projects = _linear_rules(model, projection, before, weights) if projection else []
    return [{**rule, "of": project.pop("of"), "project": project} for project in projects]


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
