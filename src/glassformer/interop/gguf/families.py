"""llama.cpp's ``gemma3``, ``olmo2``, ``phi3`` and ``gptneox`` layouts → Hugging Face's
names and config.

What differs from the Llama-shaped files (``layout``):

- ``gemma3`` stores each RMSNorm's scale as 1 + w (Gemma computes x̂ · (1 + w)): one is
  taken off every ``*norm.weight``. Its ``ffn_norm`` is the norm before the feed-forward
  (Gemma's ``pre_feedforward_layernorm``), ``post_attention_norm`` and ``post_ffw_norm`` the
  sandwich norms after each sub-layer. The metadata gives the global rotary base, the window
  and the head width; the local base, the query scale and the sliding pattern take
  transformers' fallbacks (10,000, the head width, every sixth layer global) unless given.
- ``olmo2`` has no norm before a sub-layer, one after each (``post_attention_norm``,
  ``post_ffw_norm``), and q/k norms as wide as all heads; its q and k rows are as Hugging
  Face stores them (llama.cpp turns OLMo 2 by rotate_half's pairing).
- ``phi3`` keeps Hugging Face's fused ``qkv_proj`` (``attn_qkv``) and ``gate_up_proj``
  (``ffn_up``), rows as they are; LongRoPE's factors are the tensors ``rope_factors_short``
  and ``rope_factors_long`` (read by the file's reader into the rope scaling).
- ``qwen2moe`` stacks each layer's experts into one tensor per projection (E, rows,
  columns; Hugging Face's names, one per expert, are written with ``*`` for its index) and
  keeps the shared expert's gate as a vector.
- ``gptneox`` keeps the fused q/k/v as [all q; all k; all v] (llama.cpp's converter regroups
  Hugging Face's per-head rows); they are put back head by head, as Hugging Face stores them.
"""

from __future__ import annotations

import re
from typing import Any

import torch
from torch import Tensor

from glassformer.errors import CheckpointError, shown
from glassformer.interop.gguf.metadata import Metadata
from glassformer.interop.gguf.shapes import Shape, kv_head_count, vocab

_BLOCK = re.compile(r"blk\.(\d+)\.(\w+)\.(weight|bias)")
_NAMES: dict[str, tuple[str, dict[str, str], dict[str, str]]] = {
    # arch: (Hugging Face prefix of a layer, block names, top-level names)
    "gemma3": (
        "model.layers",
        {"attn_norm": "input_layernorm", "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj",
         "attn_v": "self_attn.v_proj", "attn_output": "self_attn.o_proj",
         "attn_q_norm": "self_attn.q_norm", "attn_k_norm": "self_attn.k_norm",
         "post_attention_norm": "post_attention_layernorm",
         "ffn_norm": "pre_feedforward_layernorm", "post_ffw_norm": "post_feedforward_layernorm",
         "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj", "ffn_down": "mlp.down_proj"},
        {"token_embd": "model.embed_tokens", "output_norm": "model.norm", "output": "lm_head"},
    ),
    "olmo2": (
        "model.layers",
        {"attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
         "attn_output": "self_attn.o_proj", "attn_q_norm": "self_attn.q_norm",
         "attn_k_norm": "self_attn.k_norm", "post_attention_norm": "post_attention_layernorm",
         "post_ffw_norm": "post_feedforward_layernorm", "ffn_gate": "mlp.gate_proj",
         "ffn_up": "mlp.up_proj", "ffn_down": "mlp.down_proj"},
        {"token_embd": "model.embed_tokens", "output_norm": "model.norm", "output": "lm_head"},
    ),
    "phi3": (
        "model.layers",
        {"attn_norm": "input_layernorm", "attn_qkv": "self_attn.qkv_proj",
         "attn_output": "self_attn.o_proj", "ffn_norm": "post_attention_layernorm",
         "ffn_up": "mlp.gate_up_proj", "ffn_down": "mlp.down_proj"},
        {"token_embd": "model.embed_tokens", "output_norm": "model.norm", "output": "lm_head"},
    ),
    "qwen2moe": (
        "model.layers",
        {"attn_norm": "input_layernorm", "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj",
         "attn_v": "self_attn.v_proj", "attn_output": "self_attn.o_proj",
         "ffn_norm": "post_attention_layernorm", "ffn_gate_inp": "mlp.gate",
         "ffn_gate_exps": "mlp.experts.*.gate_proj", "ffn_up_exps": "mlp.experts.*.up_proj",
         "ffn_down_exps": "mlp.experts.*.down_proj",
         "ffn_gate_inp_shexp": "mlp.shared_expert_gate",
         "ffn_gate_shexp": "mlp.shared_expert.gate_proj",
         "ffn_up_shexp": "mlp.shared_expert.up_proj",
         "ffn_down_shexp": "mlp.shared_expert.down_proj"},
        {"token_embd": "model.embed_tokens", "output_norm": "model.norm", "output": "lm_head"},
    ),
    "gptneox": (
        "gpt_neox.layers",
        {"attn_norm": "input_layernorm", "attn_qkv": "attention.query_key_value",
         "attn_output": "attention.dense", "ffn_norm": "post_attention_layernorm",
         "ffn_up": "mlp.dense_h_to_4h", "ffn_down": "mlp.dense_4h_to_h"},
        {"token_embd": "gpt_neox.embed_in", "output_norm": "gpt_neox.final_layer_norm",
         "output": "embed_out"},
    ),
}  # fmt: skip


def family_name(arch: str, name: str) -> str:
    """The Hugging Face name of the ``arch`` file's tensor ``name``."""
    layer, block, top = _NAMES[arch]
    if (m := _BLOCK.fullmatch(name)) and m[2] in block:
        return f"{layer}.{int(m[1])}.{block[m[2]]}.{m[3]}"
    head, _, kind = name.rpartition(".")
    if head in top:
        return f"{top[head]}.{kind}"
    raise CheckpointError(f"the GGUF tensor {shown(name)} has no place in a {arch} model")


def family_tensor(arch: str, name: str, value: Tensor, num_heads: int) -> Tensor:
    """A tensor as Hugging Face holds it: Gemma's norms less one; NeoX's q/k/v per head."""
    if arch == "gemma3" and name.endswith("norm.weight"):
        return value - 1.0
    if arch == "qwen2moe" and name.endswith("shared_expert_gate.weight"):
        return value.reshape(1, -1)  # (D,) in the file, a (1, D) linear layer's weight
    if arch == "gptneox" and "query_key_value" in name:
        q, k, v = value.chunk(3, dim=0)  # each (H·Dh, ...)
        heads = [x.reshape(num_heads, -1, *x.shape[1:]) for x in (q, k, v)]
        return torch.stack(heads, dim=1).reshape(value.shape)  # (H, 3, Dh, ...) per head
    return value


def family_config(arch: str, meta: Metadata, shapes: dict[str, Shape]) -> dict[str, Any]:
    """The Hugging Face config fields of a ``gemma3``, ``olmo2``, ``phi3``, ``qwen2moe`` or
    ``gptneox`` file's
    metadata, each number checked to be in range (``meta``, ``shapes``: as
    ``layout.hf_config`` takes)."""

    def key(name: str) -> str:
        return f"{arch}.{name}"

    hidden = meta.count(key("embedding_length"), ...)
    heads = meta.count(key("attention.head_count"), ..., high=hidden)
    layers = meta.count(key("block_count"), ...)
    common = {
        "vocab_size": vocab(meta, key("vocab_size"), shapes),
        "hidden_size": hidden,
        "num_hidden_layers": layers,
        "num_attention_heads": heads,
        "intermediate_size": meta.count(key("feed_forward_length"), ...),
        "max_position_embeddings": meta.count(key("context_length"), 2048),
        "tie_word_embeddings": "output.weight" not in shapes,
    }
    if arch == "gptneox":
        if hidden % heads:
            raise CheckpointError(
                f"the metadata {key('attention.head_count')!r} is {heads}; expected a divisor "
                f"of the embedding_length {hidden}"
            )
        rotary = meta.count(key("rope.dimension_count"), hidden // heads, high=hidden // heads)
        if rotary % 2:  # rotated in pairs
            raise CheckpointError(
                f"the metadata {key('rope.dimension_count')!r} is {rotary}; expected an even number"
            )
        return {**common, "model_type": "gpt_neox", "hidden_act": "gelu",
                "rotary_pct": rotary / (hidden // heads),
                "rotary_emb_base": float(meta.positive(key("rope.freq_base"), 10000.0)),
                "use_parallel_residual": bool(meta(key("use_parallel_residual"), bool, True)),
                "layer_norm_eps": float(
                    meta.positive(key("attention.layer_norm_epsilon"), 1e-5, high=1)),
                }  # fmt: skip
    if arch == "qwen2moe":  # Qwen2's attention, rows as they are; every layer routed
        return {**common, **_qwen2moe(meta, heads, shapes)}
    if arch == "phi3":  # fused q/k/v and gate/up, as Hugging Face's; rotate_half's layout
        return {**common, **_phi3(meta, hidden // heads, kv_head_count(
            meta, key("attention.head_count_kv"), heads))}  # fmt: skip
    if arch == "olmo2":  # rotate_half's layout, as Hugging Face's: no rows to put back
        _refuse_olmo3(meta)
        return {**common, "model_type": "olmo2",
                "num_key_value_heads": kv_head_count(meta, key("attention.head_count_kv"), heads),
                "rope_theta": float(meta.positive(key("rope.freq_base"), 10000.0)),
                "rms_norm_eps": float(meta.positive(key("attention.layer_norm_rms_epsilon"), 1e-6,
                                                    high=1))}  # fmt: skip
    head_dim = meta.count(key("attention.key_length"), 256, low=2)
    softcap = meta.positive(key("final_logit_softcapping"), None)
    return {**common, "model_type": "gemma3_text",
            "num_key_value_heads": kv_head_count(meta, key("attention.head_count_kv"), heads),
            "head_dim": head_dim,
            "query_pre_attn_scalar": meta.count(key("attention.query_pre_attn_scalar"), head_dim),
            "sliding_window": meta.count(key("attention.sliding_window"), 4096, low=2),
            "sliding_window_pattern": meta.count(key("attention.sliding_window_pattern"), 6),
            "rope_theta": float(meta.positive(key("rope.freq_base"), 1e6)),
            "rope_local_base_freq": float(meta.positive(key("rope.local.freq_base"), 1e4)),
            "rms_norm_eps": float(meta.positive(key("attention.layer_norm_rms_epsilon"), 1e-6,
                                                high=1)),
            "final_logit_softcapping": None if softcap is None else float(softcap)}  # fmt: skip


def _phi3(meta: Metadata, head_dim: int, kv_heads: int) -> dict[str, Any]:
    """A ``phi3`` file's own fields: the rotary width (``partial_rotary_factor``), the window
    (0: none, Phi-4's), the context LongRoPE was trained on."""
    rotary = meta.count("phi3.rope.dimension_count", head_dim, high=head_dim)
    if rotary % 2:
        raise CheckpointError(
            f"the metadata 'phi3.rope.dimension_count' is {rotary}; expected an even number"
        )
    window = meta.count("phi3.attention.sliding_window", 0, low=0)
    original = meta.count("phi3.rope.scaling.original_context_length", 0, low=0)
    return {"model_type": "phi3", "num_key_value_heads": kv_heads,
            "partial_rotary_factor": rotary / head_dim, "sliding_window": window or None,
            "rope_theta": float(meta.positive("phi3.rope.freq_base", 10000.0)),
            "rms_norm_eps": float(meta.positive("phi3.attention.layer_norm_rms_epsilon", 1e-5,
                                                high=1)),
            **({"original_max_position_embeddings": original} if original else {})}  # fmt: skip


def _qwen2moe(meta: Metadata, heads: int, shapes: dict[str, Shape]) -> dict[str, Any]:
    """A ``qwen2moe`` file's own fields: the experts, their widths, the shared expert's."""
    experts = meta.count("qwen2moe.expert_count", ..., high=1 << 12)
    return {"model_type": "qwen2_moe", "qkv_bias": "blk.0.attn_q.bias" in shapes,
            "num_key_value_heads": kv_head_count(meta, "qwen2moe.attention.head_count_kv", heads),
            "num_experts": experts,
            "num_experts_per_tok": meta.count("qwen2moe.expert_used_count", ..., high=experts),
            "moe_intermediate_size": meta.count("qwen2moe.expert_feed_forward_length", ...),
            "shared_expert_intermediate_size": meta.count(
                "qwen2moe.expert_shared_feed_forward_length", ...),
            "norm_topk_prob": bool(meta("qwen2moe.expert_weights_norm", bool, False)),
            "rope_theta": float(meta.positive("qwen2moe.rope.freq_base", 10000.0)),
            "rms_norm_eps": float(meta.positive("qwen2moe.attention.layer_norm_rms_epsilon", 1e-6,
                                                high=1))}  # fmt: skip


def _refuse_olmo3(meta: Metadata) -> None:
    """llama.cpp writes OLMo 3 as ``olmo2`` too, with sliding layers and YaRN: refused, not
    read as an OLMo 2 with full attention and plain rotary."""
    keys = ("olmo2.attention.sliding_window", "olmo2.rope.scaling.")
    olmo3 = sorted(k for k in meta.fields if k.startswith(keys))
    if olmo3:
        raise CheckpointError(f"an olmo2 file with {olmo3[0]!r} (OLMo 3's sliding layers or "
                              "rotary scaling) is not supported")  # fmt: skip
