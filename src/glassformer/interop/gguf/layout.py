"""llama.cpp's Llama-shaped layouts (``llama``, ``qwen2``, ``qwen3``) → Hugging Face's: the
config dict, tensor names, and the row order of the query and key projections.

Only ``llama`` files have their q/k rows reordered (below); llama.cpp rotates Qwen's halves
as Hugging Face does ("NEOX" rope), so their rows are stored as they are.

llama.cpp's converter (``convert_hf_to_gguf.py``) reorders the rows of ``q_proj`` and
``k_proj`` within each head for its rotary layout. Hugging Face rotates the two halves of a
head (dimension i pairs with i + Dh/2); ggml rotates adjacent pairs (2i with 2i + 1). So the
converter writes row ``h·Dh + 2i`` from HF row ``h·Dh + i`` and row ``h·Dh + 2i + 1`` from
HF row ``h·Dh + Dh/2 + i``. ``unpermute_rope_rows`` puts them back.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

from glassformer.errors import CheckpointError, shown
from glassformer.interop.gguf.metadata import Metadata
from glassformer.interop.gguf.shapes import Shape, kv_head_count, vocab

# llama.cpp's name inside block N → Hugging Face's, under "model.layers.N.".
_BLOCK_NAMES = {
    "attn_norm": "input_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_norm": "post_attention_layernorm",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
    "attn_q_norm": "self_attn.q_norm",  # qwen3
    "attn_k_norm": "self_attn.k_norm",
    # a llama file with experts (Mixtral): the router, and each expert's weights stacked
    # into one tensor (E, rows, columns), its Hugging Face names one per expert ("*": e)
    "ffn_gate_inp": "block_sparse_moe.gate",
    "ffn_gate_exps": "block_sparse_moe.experts.*.w1",
    "ffn_up_exps": "block_sparse_moe.experts.*.w3",
    "ffn_down_exps": "block_sparse_moe.experts.*.w2",
}
ARCHITECTURES = ("llama", "qwen2", "qwen3")  # the general.architecture values read here
_TOP_NAMES = {
    "token_embd": "model.embed_tokens",
    "output_norm": "model.norm",
    "output": "lm_head",
}
_BLOCK = re.compile(r"blk\.(\d+)\.(\w+)\.(weight|bias)")
_TOP = re.compile(r"(\w+)\.(weight|bias)")


def hf_name(name: str) -> str:
    """The Hugging Face Llama name of the llama.cpp tensor ``name``.

    Raises:
        CheckpointError: a tensor a Llama model has no place for (``rope_freqs``, ...).
    """
    if (m := _BLOCK.fullmatch(name)) and m[2] in _BLOCK_NAMES:
        return f"model.layers.{int(m[1])}.{_BLOCK_NAMES[m[2]]}.{m[3]}"
    if (m := _TOP.fullmatch(name)) and m[1] in _TOP_NAMES:
        return f"{_TOP_NAMES[m[1]]}.{m[2]}"
    raise CheckpointError(f"the GGUF tensor {shown(name)} has no place in a Llama model")


def unpermute_rope_rows(weight: Tensor, num_heads: int) -> Tensor:
    """Undo llama.cpp's per-head interleaving of q_proj / k_proj rows (see the module doc).

    Args:
        weight: (H·Dh, ...) as llama.cpp stores it (a weight, or a bias).
        num_heads: H (the query heads for q_proj, the key/value heads for k_proj).
    """
    return weight[rotary_rows(weight.shape[0], num_heads)]


def rotary_rows(rows: int, num_heads: int) -> Tensor:
    """Which stored row each of Hugging Face's ``rows`` q (or k) rows is, for ``num_heads``
    heads: within a head, HF row i is stored at 2i and HF row Dh/2 + i at 2i + 1."""
    if rows % (2 * num_heads):
        raise CheckpointError(f"{rows} projection rows do not split into {num_heads} heads")
    pairs = rows // num_heads // 2
    stored = torch.arange(rows).reshape(num_heads, pairs, 2)  # (H, Dh/2, 2)
    return stored.transpose(1, 2).reshape(rows)  # (H, 2, Dh/2): the halves, each in order


def hf_config(meta: Metadata, shapes: dict[str, Shape], arch: str = "llama") -> dict[str, Any]:
    """The Hugging Face config fields (``LlamaConfig``'s, ``Qwen2Config``'s or
    ``Qwen3Config``'s) a GGUF file's metadata gives, each number checked to be in range.

    Args:
        meta: the file's metadata (``CheckpointError`` for a key missing, of another type,
            or out of range).
        shapes: the file's tensors' shapes, by name (an ``output.weight`` means an untied
            head; the token table's rows are the vocabulary where the metadata omits it).
        arch: its ``general.architecture``, the prefix of its keys.
    """

    def key(name: str) -> str:
        return f"{arch}.{name}"

    hidden = meta.count(key("embedding_length"), ...)
    heads = meta.count(key("attention.head_count"), ..., high=hidden)
    if hidden % heads and arch != "qwen3":
        raise CheckpointError(
            f"the metadata {key('attention.head_count')!r} is {heads}; expected a divisor of "
            f"the embedding_length {hidden}"
        )
    kv_heads = kv_head_count(meta, key("attention.head_count_kv"), heads)
    head_dim = meta.count(key("attention.key_length"), hidden // heads, low=2)
    rope_dims = meta.count(key("rope.dimension_count"), head_dim)
    if rope_dims != head_dim:
        raise CheckpointError(
            f"rotary embedding on {rope_dims} of {head_dim} head dimensions; "
            "a Llama config rotates all of them"
        )
    scaling = meta(key("rope.scaling.type"), str, "none")
    if scaling not in ("none", "linear", "yarn"):
        raise CheckpointError(f"rope scaling {shown(scaling)} is not supported")
    vocab_size = vocab(meta, key("vocab_size"), shapes)
    config: dict[str, Any] = {
        "model_type": arch,
        "vocab_size": vocab_size,
        "hidden_size": hidden,
        "intermediate_size": meta.count(key("feed_forward_length"), ...),
        "num_hidden_layers": meta.count(key("block_count"), ...),
        "num_attention_heads": heads,
        "num_key_value_heads": kv_heads,
        "head_dim": head_dim,
        "hidden_act": "silu",
        "rope_theta": float(meta.positive(key("rope.freq_base"), 10000.0)),
        "rms_norm_eps": float(meta.positive(key("attention.layer_norm_rms_epsilon"), ..., high=1)),
        "max_position_embeddings": meta.count(key("context_length"), 2048),
        "tie_word_embeddings": "output.weight" not in shapes,
        "attention_bias": "blk.0.attn_q.bias" in shapes,
        "mlp_bias": False,
    }
    experts = meta.count(key("expert_count"), 0, low=0, high=1 << 12)
    if experts:  # Mixtral, as llama.cpp writes it: a llama file with experts
        used = meta.count(key("expert_used_count"), ..., high=experts)
        config.update(model_type="mixtral", num_local_experts=experts, num_experts_per_tok=used)
        del config["attention_bias"], config["mlp_bias"]
    if scaling == "linear":
        factor = float(meta.positive(key("rope.scaling.factor"), ...))
        config["rope_scaling"] = {"rope_type": "linear", "factor": factor}
    if scaling == "yarn":  # Qwen2.5's long context: transformers' yarn with llama.cpp's keys
        config["rope_scaling"] = _yarn(meta, key)
    for name in ("bos", "eos", "padding"):  # ids in the vocabulary
        token_id = meta.count(f"tokenizer.ggml.{name}_token_id", None, 0, vocab_size - 1)
        config[f"{'pad' if name == 'padding' else name}_token_id"] = token_id
    return config


def _yarn(meta: Metadata, key: Callable[[str], str]) -> dict[str, Any]:
    """YaRN as llama.cpp's keys give it: the factor, the context trained on, the ramp's
    ends where stated (its other keys, DeepSeek's temperature, are refused by name)."""
    for other in ("rope.scaling.yarn_log_multiplier", "rope.scaling.yarn_attn_factor",
                  "rope.scaling.yarn_ext_factor", "rope.scaling.attn_factor"):  # fmt: skip
        if key(other) in meta.fields:
            raise CheckpointError(f"YaRN with {key(other)!r} is not supported")
    spec: dict[str, Any] = {
        "rope_type": "yarn",
        "factor": float(meta.positive(key("rope.scaling.factor"), ...)),
        "original_max_position_embeddings": meta.count(
            key("rope.scaling.original_context_length"), ...
        ),
    }
    for ours, theirs in (("beta_fast", "yarn_beta_fast"), ("beta_slow", "yarn_beta_slow")):
        value = meta.positive(key(f"rope.scaling.{theirs}"), None)
        if value is not None:
            spec[ours] = float(value)
    return spec
