"""The tensors a model of a GGUF file's config reads, and the shape each must have.

The metadata sizes the model (``block_count``, ``embedding_length``, ...) and the tensor
table sizes its weights; ``needed_shapes`` checks that they agree, for every tensor the model
will read, before a byte of any tensor is read. Only these tensors are then decoded: a tensor
the model has no use for (a block past ``block_count``, a bias Llama has none of) costs
nothing, and the memory a load takes is the model's own weights, whatever the table lists.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from glassformer.errors import CheckpointError
from glassformer.interop.gguf.metadata import Metadata

Shape = tuple[int, ...]  # outermost first, as PyTorch has it (ggml lists dims the other way)
_BLOCK = re.compile(r"blk\.(\d+)\.")


def needed_shapes(
    arch: str, config: dict[str, Any], shapes: dict[str, Shape], hf_name: Callable[[str], str]
) -> dict[str, Shape]:
    """``{GGUF tensor name: shape}`` of every tensor a model of ``config`` reads.

    Args:
        arch: the file's ``general.architecture``.
        config: the Hugging Face config fields read from its metadata.
        shapes: every tensor the file declares, by name.
        hf_name: a GGUF name → its Hugging Face name (for the messages).

    Raises:
        CheckpointError: ``block_count`` beyond the blocks the file holds, a tensor missing,
            or one whose shape is not the one the metadata gives.
    """
    layers = config["num_hidden_layers"]
    present = {int(m[1]) for name in shapes if (m := _BLOCK.match(name))}
    if not 1 <= layers <= len(present):  # a corrupt count is not looped over
        raise CheckpointError(
            f"{arch}.block_count is {layers}; the file holds tensors for {len(present)} blocks"
        )
    top, block = _NEEDED[arch](config)
    if "output.weight" in shapes:  # an untied head
        top["output.weight"] = top["token_embd.weight"]
    needed = dict(top)
    for i in range(layers):
        needed.update({f"blk.{i}.{name}": shape for name, shape in block.items()})
    missing = [name for name in needed if name not in shapes]
    if missing:
        name = missing[0]
        raise CheckpointError(
            f"the tensor {name} ({hf_name(name)}) is missing ({len(missing)} in all)"
        )
    for name, shape in needed.items():
        if shapes[name] != shape:
            raise CheckpointError(
                f"the tensor {name} has shape {list(shapes[name])}; the metadata gives "
                f"{list(shape)}"
            )
    return needed


def vocab(meta: Metadata, key: str, shapes: dict[str, Shape]) -> int:
    """The vocabulary: the token table's rows, which the metadata may state (and must not
    contradict). The token list may be shorter (a padded table)."""
    rows = shapes.get("token_embd.weight", (1,))[0]
    size = meta.count(key, rows)
    if size != rows:
        raise CheckpointError(
            f"the metadata {key!r} is {size}; the tensor token_embd.weight has {rows} rows"
        )
    return int(size)


def kv_head_count(meta: Metadata, key: str, heads: int) -> int:
    """The key/value heads (the query heads where the metadata omits them): a divisor of
    the query heads."""
    kv_heads = meta.count(key, heads, high=heads)
    if heads % kv_heads:
        raise CheckpointError(
            f"the metadata {key!r} is {kv_heads}; expected a divisor of the {heads} heads"
        )
    return int(kv_heads)


def _llama(c: dict[str, Any]) -> tuple[dict[str, Shape], dict[str, Shape]]:
    """Llama, Qwen2 (q/k/v biases), Qwen3 (q/k norms); Gemma 3 adds its sandwich norms."""
    D, FF, Dh = c["hidden_size"], c["intermediate_size"], c["head_dim"]
    q, kv = c["num_attention_heads"] * Dh, c["num_key_value_heads"] * Dh
    top = {"token_embd.weight": (c["vocab_size"], D), "output_norm.weight": (D,)}
    block = {
        "attn_norm.weight": (D,), "attn_q.weight": (q, D), "attn_k.weight": (kv, D),
        "attn_v.weight": (kv, D), "attn_output.weight": (D, q), "ffn_norm.weight": (D,),
        "ffn_gate.weight": (FF, D), "ffn_up.weight": (FF, D), "ffn_down.weight": (D, FF),
    }  # fmt: skip
    if c.get("attention_bias"):
        block.update({"attn_q.bias": (q,), "attn_k.bias": (kv,), "attn_v.bias": (kv,)})
    if c["model_type"] in ("qwen3", "gemma3_text"):
        block.update({"attn_q_norm.weight": (Dh,), "attn_k_norm.weight": (Dh,)})
    if c["model_type"] == "gemma3_text":
        block.update({"post_attention_norm.weight": (D,), "post_ffw_norm.weight": (D,)})
    if c.get("num_local_experts"):  # Mixtral: the MLP as experts, each one's stacked
        E = c["num_local_experts"]
        del block["ffn_gate.weight"], block["ffn_up.weight"], block["ffn_down.weight"]
        block.update({"ffn_gate_inp.weight": (E, D), "ffn_gate_exps.weight": (E, FF, D),
                      "ffn_up_exps.weight": (E, FF, D),
                      "ffn_down_exps.weight": (E, D, FF)})  # fmt: skip
    return top, block


def _gptneox(c: dict[str, Any]) -> tuple[dict[str, Shape], dict[str, Shape]]:
    """GPT-NeoX: LayerNorms and linear layers with biases, q/k/v fused."""
    D, FF = c["hidden_size"], c["intermediate_size"]
    top = {"token_embd.weight": (c["vocab_size"], D), "output_norm.weight": (D,),
           "output_norm.bias": (D,)}  # fmt: skip
    block = {
        "attn_norm.weight": (D,), "attn_norm.bias": (D,), "attn_qkv.weight": (3 * D, D),
        "attn_qkv.bias": (3 * D,), "attn_output.weight": (D, D), "attn_output.bias": (D,),
        "ffn_norm.weight": (D,), "ffn_norm.bias": (D,), "ffn_up.weight": (FF, D),
        "ffn_up.bias": (FF,), "ffn_down.weight": (D, FF), "ffn_down.bias": (D,),
    }  # fmt: skip
    return top, block


def _olmo2(c: dict[str, Any]) -> tuple[dict[str, Shape], dict[str, Shape]]:
    """OLMo 2: Llama's tensors with norms after the sub-layers, q/k norms all heads wide."""
    top, block = _llama({**c, "head_dim": c["hidden_size"] // c["num_attention_heads"]})
    q, kv = block["attn_q.weight"][0], block["attn_k.weight"][0]
    del block["attn_norm.weight"], block["ffn_norm.weight"]
    D = c["hidden_size"]
    block.update({"attn_q_norm.weight": (q,), "attn_k_norm.weight": (kv,),
                  "post_attention_norm.weight": (D,), "post_ffw_norm.weight": (D,)})  # fmt: skip
    return top, block


def _phi3(c: dict[str, Any]) -> tuple[dict[str, Shape], dict[str, Shape]]:
    """Phi-3: Llama's tensors with q/k/v fused (``attn_qkv``) and gate/up (``ffn_up``)."""
    top, block = _llama({**c, "head_dim": c["hidden_size"] // c["num_attention_heads"]})
    q, kv = block.pop("attn_q.weight")[0], block.pop("attn_k.weight")[0]
    del block["attn_v.weight"], block["ffn_gate.weight"]
    D, FF = c["hidden_size"], c["intermediate_size"]
    block.update({"attn_qkv.weight": (q + 2 * kv, D), "ffn_up.weight": (2 * FF, D)})
    return top, block


def _qwen2moe(c: dict[str, Any]) -> tuple[dict[str, Shape], dict[str, Shape]]:
    """Qwen2-MoE: Qwen2's attention, every layer's MLP experts stacked and a shared one."""
    D, E, F, S = (c["hidden_size"], c["num_experts"], c["moe_intermediate_size"],
                  c["shared_expert_intermediate_size"])  # fmt: skip
    top, block = _llama({**c, "head_dim": D // c["num_attention_heads"], "attention_bias":
                         c["qkv_bias"], "model_type": "qwen2"})  # fmt: skip
    del block["ffn_gate.weight"], block["ffn_up.weight"], block["ffn_down.weight"]
    block.update({"ffn_gate_inp.weight": (E, D), "ffn_gate_exps.weight": (E, F, D),
                  "ffn_up_exps.weight": (E, F, D), "ffn_down_exps.weight": (E, D, F),
                  "ffn_gate_inp_shexp.weight": (D,), "ffn_gate_shexp.weight": (S, D),
                  "ffn_up_shexp.weight": (S, D), "ffn_down_shexp.weight": (D, S)})  # fmt: skip
    return top, block


_NEEDED = {"llama": _llama, "qwen2": _llama, "qwen3": _llama, "gemma3": _llama,
           "olmo2": _olmo2, "phi3": _phi3, "qwen2moe": _qwen2moe,
           "gptneox": _gptneox}  # fmt: skip
