"""Where each weight of a model read from a GGUF file comes from: which of the file's tensors,
and which of their rows.

    glassformer weight               llama.cpp tensors (rows)
    embed.weight                     token_embd.weight
    blocks.N.ln1.weight              blk.N.attn_norm.weight
    blocks.N.attn.qkv_proj.weight    blk.N.attn_q.weight, blk.N.attn_k.weight, blk.N.attn_v.weight
                                     (a ``llama`` file's q and k rows in rotary order)
    blocks.N.attn.out_proj.weight    blk.N.attn_output.weight
    blocks.N.ln2.weight              blk.N.ffn_norm.weight
    blocks.N.mlp.gate/up/down_proj   blk.N.ffn_gate / ffn_up / ffn_down
    ln_final.weight                  output_norm.weight
    lm_head.weight                   output.weight (a tied head: token_embd.weight)

Qwen2 adds the q/k/v biases, Qwen3 the QK-norm weights, Gemma 3 both sandwich norms (and
stores each RMSNorm scale as 1 + w: ``value`` takes the one off), OLMo 2 the norms after
each sub-layer and none before (``ln1_post``, ``ln2_post``); GPT-NeoX's fused q/k/v is
stored as glassformer holds it, [all q; all k; all v]; Phi-3's fused q/k/v too, and its
fused ``ffn_up`` gives gate_proj its first half of rows and up_proj its second.

A weight whose tensors are kept as blocks becomes a layer computing from them (its parts:
the rows it takes of each tensor); any other is decoded to numbers. Nothing is read twice
and no weight map is run on stand-ins to find where rows went: the rows are stated here.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import torch
from torch import Tensor

from glassformer.errors import CheckpointError
from glassformer.interop.gguf.layout import rotary_rows


class Source(NamedTuple):
    """One file tensor's share of a weight."""

    tensor: str  # the file's name for it: "blk.0.attn_q.weight"
    rows: Tensor | slice | None = None  # its rows in the weight's order (int64, or a range)


WeightMap = dict[str, tuple[Source, ...]]

# glassformer's name inside block N → the file's tensors under "blk.N." (stacked in order)
_LLAMA_BLOCK: dict[str, tuple[str, ...]] = {
    "ln1.weight": ("attn_norm.weight",),
    "attn.qkv_proj.weight": ("attn_q.weight", "attn_k.weight", "attn_v.weight"),
    "attn.qkv_proj.bias": ("attn_q.bias", "attn_k.bias", "attn_v.bias"),  # qwen2
    "attn.q_norm.weight": ("attn_q_norm.weight",),  # qwen3, gemma3
    "attn.k_norm.weight": ("attn_k_norm.weight",),
    "attn.out_proj.weight": ("attn_output.weight",),
    "ln2.weight": ("ffn_norm.weight",),
    "mlp.gate_proj.weight": ("ffn_gate.weight",),
    "mlp.up_proj.weight": ("ffn_up.weight",),
    "mlp.down_proj.weight": ("ffn_down.weight",),
}
_GEMMA_BLOCK = _LLAMA_BLOCK | {
    "ln1_post.weight": ("post_attention_norm.weight",),
    "ln2_post.weight": ("post_ffw_norm.weight",),
}
_OLMO2_BLOCK = {k: v for k, v in _GEMMA_BLOCK.items() if not k.startswith(("ln1.", "ln2."))}
_PHI3_BLOCK: dict[str, tuple[str, ...]] = {
    "ln1.weight": ("attn_norm.weight",), "attn.qkv_proj.weight": ("attn_qkv.weight",),
    "attn.out_proj.weight": ("attn_output.weight",), "ln2.weight": ("ffn_norm.weight",),
    "mlp.gate_proj.weight": ("ffn_up.weight",),  # its first half (``_rows``)
    "mlp.up_proj.weight": ("ffn_up.weight",),  # its second half
    "mlp.down_proj.weight": ("ffn_down.weight",),
}  # fmt: skip
_QWEN2MOE_BLOCK = {k: v for k, v in _LLAMA_BLOCK.items() if not k.startswith("mlp.")} | {
    "mlp.shared_gate.weight": ("ffn_gate_inp_shexp.weight",),
    "mlp.shared_expert.gate_proj.weight": ("ffn_gate_shexp.weight",),
    "mlp.shared_expert.up_proj.weight": ("ffn_up_shexp.weight",),
    "mlp.shared_expert.down_proj.weight": ("ffn_down_shexp.weight",),
}
_NEOX_BLOCK: dict[str, tuple[str, ...]] = {
    f"{ours}.{kind}": (f"{theirs}.{kind}",)
    for ours, theirs in (("ln1", "attn_norm"), ("attn.qkv_proj", "attn_qkv"),
                         ("attn.out_proj", "attn_output"), ("ln2", "ffn_norm"),
                         ("mlp.linear1", "ffn_up"), ("mlp.linear2", "ffn_down"))
    for kind in ("weight", "bias")
}  # fmt: skip
_TOP: dict[str, tuple[str, ...]] = {
    "embed.weight": ("token_embd.weight",),
    "ln_final.weight": ("output_norm.weight",),
    "ln_final.bias": ("output_norm.bias",),  # gptneox
}
_BLOCKS: dict[str, dict[str, tuple[str, ...]]] = {
    "llama": _LLAMA_BLOCK, "qwen2": _LLAMA_BLOCK, "qwen3": _LLAMA_BLOCK,
    "gemma3": _GEMMA_BLOCK, "olmo2": _OLMO2_BLOCK, "phi3": _PHI3_BLOCK,
    "qwen2moe": _QWEN2MOE_BLOCK, "gptneox": _NEOX_BLOCK,
}  # fmt: skip


def weight_map(arch: str, config: dict[str, Any], shapes: dict[str, tuple[int, ...]]) -> WeightMap:
    """``{glassformer weight: its sources}`` for a model of an ``arch`` file.

    Args:
        arch: the file's ``general.architecture``.
        config: the Hugging Face config fields its metadata gives (the heads, the layers).
        shapes: the tensors the model reads (``needed_shapes``), by name: a weight is mapped
            where its tensors are there (a bias only where the file has one).

    Raises:
        CheckpointError: a weight with some of its tensors and not the others, or a tensor
            no weight takes.
    """
    head = "output.weight" if "output.weight" in shapes else "token_embd.weight"
    wanted: dict[str, tuple[str, ...]] = {**_TOP, "lm_head.weight": (head,)}
    block = _BLOCKS[arch] | _experts(config)
    for i in range(config["num_hidden_layers"]):
        for name, tensors in block.items():
            wanted[f"blocks.{i}.{name}"] = tuple(f"blk.{i}.{t}" for t in tensors)
    out: WeightMap = {}
    for name, tensors in wanted.items():
        there = [t in shapes for t in tensors]
        if any(there) and not all(there):
            gone = [t for t, ok in zip(tensors, there, strict=True) if not ok]
            raise CheckpointError(f"{name} needs the tensor {gone[0]}, which is missing")
        if all(there):
            out[name] = tuple(
                Source(t, _rows(arch, name, t, config, _row_count(shapes[t]))) for t in tensors
            )
    unused = set(shapes) - {source.tensor for sources in out.values() for source in sources}
    if unused:
        raise CheckpointError(f"the tensor {sorted(unused)[0]} has no place in the model")
    return out


def _experts(config: dict[str, Any]) -> dict[str, tuple[str, ...]]:
    """A mixture of experts' weights (Mixtral's, in a llama file): the router, and each
    expert's three from the stacked tensors (``_rows`` takes its share)."""
    experts = _expert_count(config)
    out: dict[str, tuple[str, ...]] = (
        {"mlp.router.weight": ("ffn_gate_inp.weight",)} if experts else {}
    )
    for e in range(experts):
        for ours, theirs in (("gate_proj", "ffn_gate_exps"), ("up_proj", "ffn_up_exps"),
                             ("down_proj", "ffn_down_exps")):  # fmt: skip
            out[f"mlp.experts.{e}.{ours}.weight"] = (f"{theirs}.weight",)
    return out


def _expert_count(config: dict[str, Any]) -> int:
    """The experts of each layer (Mixtral's field, or Qwen2-MoE's); 0 without."""
    return int(config.get("num_local_experts") or config.get("num_experts") or 0)


def _row_count(shape: tuple[int, ...]) -> int:
    """The rows of a tensor of ``shape``: a 3-D one's (experts stacked) every expert's."""
    return shape[0] * shape[1] if len(shape) == 3 else shape[0]


def _rows(
    arch: str, weight: str, tensor: str, config: dict[str, Any], count: int
) -> Tensor | slice | None:
    """The rows ``weight`` takes of ``tensor`` (``count`` rows), in its order: llama.cpp's
    rotary order undone for a ``llama`` file's q and k (``layout``), a half of a ``phi3``
    file's fused gate/up, else all, as stored."""
    if arch == "phi3" and tensor.endswith("ffn_up.weight"):  # [gate; up]
        half = count // 2
        return slice(half, count) if weight.endswith("up_proj.weight") else slice(0, half)
    if tensor.endswith("_exps.weight"):  # expert e's rows of the stacked (E, rows, columns)
        e, rows = int(weight.split(".")[4]), count // _expert_count(config)
        return slice(e * rows, (e + 1) * rows)  # a range: taken as a view of the rows read
    if arch != "llama" or tensor.split(".")[-2] not in ("attn_q", "attn_k"):
        return None
    heads = config["num_attention_heads" if ".attn_q." in tensor else "num_key_value_heads"]
    return rotary_rows(count, heads)


def value(arch: str, tensor: str, decoded: Tensor) -> Tensor:
    """A decoded tensor as the model holds it: Gemma 3 stores each RMSNorm scale as 1 + w;
    Qwen2-MoE the shared expert's gate (a (1, D) layer) as a vector."""
    if arch == "gemma3" and tensor.endswith("norm.weight"):
        return decoded - 1.0
    if arch == "qwen2moe" and tensor.endswith("ffn_gate_inp_shexp.weight"):
        return decoded.reshape(1, -1)
    return decoded


def rows_taken(rows: Tensor, source: Source) -> Tensor:
    """The rows ``source`` takes of its tensor's ``rows`` (decoded, or its blocks' rows; a
    decoded 3-D tensor's as every expert's rows in turn): all of them (a view), a range (a
    view), or those it names, gathered in its order."""
    if rows.dim() == 3:
        rows = rows.reshape(-1, rows.shape[-1])
    return rows if source.rows is None else rows[source.rows]


def gathered(values: list[Tensor], sources: tuple[Source, ...]) -> Tensor:
    """One weight from its sources' decoded tensors: each one's rows, stacked in order."""
    taken = [rows_taken(v, s) for v, s in zip(values, sources, strict=True)]
    return taken[0] if len(taken) == 1 else torch.cat(taken)
