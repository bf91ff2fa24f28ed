"""Hugging Face Llama checkpoints (Llama, SmolLM2, TinyLlama, ...) and Mistral's read into ``GPT``.

A Llama directory holds ``config.json`` (``model_type`` "llama") and ``model.safetensors``
or shards listed in ``model.safetensors.index.json``. Llama is glassformer's GPT with the
modern parts: rotary positions, RMSNorm, the SwiGLU MLP, grouped-query attention, no
biases, usually an untied head.

    Llama (LlamaForCausalLM)                       glassformer GPT
    model.embed_tokens                             embed
    model.layers.N.input_layernorm                 blocks.N.ln1
    model.layers.N.self_attn.q/k/v_proj            blocks.N.attn.qkv_proj (stacked)
    model.layers.N.self_attn.o_proj                blocks.N.attn.out_proj
    model.layers.N.post_attention_layernorm        blocks.N.ln2
    model.layers.N.mlp.gate_proj/up_proj/down_proj blocks.N.mlp.(same names)
    model.norm                                     ln_final
    lm_head (or tied to embed_tokens)              lm_head

Mistral is Llama with a sliding window on every layer (``sliding_window`` W: each query
sees its W latest keys, itself included, which is glassformer's ``attention_window`` W − 1).
Qwen2 and Qwen3 share this weight map (``interop.qwen``): q/k/v biases, and QK-norm weights
``self_attn.q_norm``/``k_norm`` → ``attn.q_norm``/``attn.k_norm``.

Hugging Face's q/k projections are already in the ``rotate_half`` layout that
``modules.rotary`` uses, so no rows are permuted (GGUF files differ; their reader undoes
llama.cpp's permutation before calling ``from_llama_state``).
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from glassformer.checkpoint import CheckpointError, register_format
from glassformer.errors import shown
from glassformer.interop._hf import load_directory, taker
from glassformer.models.gpt import GPT, GPTConfig

# glassformer name inside a block → Llama's, for the weights that are simply renamed.
_BLOCK = (
    ("ln1.weight", "input_layernorm.weight"),
    ("ln2.weight", "post_attention_layernorm.weight"),
    ("attn.out_proj.weight", "self_attn.o_proj.weight"),
    ("attn.out_proj.bias", "self_attn.o_proj.bias"),
    ("mlp.gate_proj.weight", "mlp.gate_proj.weight"),
    ("mlp.gate_proj.bias", "mlp.gate_proj.bias"),
    ("mlp.up_proj.weight", "mlp.up_proj.weight"),
    ("mlp.up_proj.bias", "mlp.up_proj.bias"),
    ("mlp.down_proj.weight", "mlp.down_proj.weight"),
    ("mlp.down_proj.bias", "mlp.down_proj.bias"),
)


def rope_theta(hf: dict[str, Any], family: str) -> float:
    """``rope_theta``, refusing any rope scaling (transformers 4's and 5's spellings)."""
    params = hf.get("rope_parameters") or {}
    scaling = hf.get("rope_scaling")
    rope_type = params.get("rope_type", "default")
    if scaling is not None and scaling.get("rope_type", scaling.get("type")) != "default":
        raise CheckpointError(
            f"{family} rope_scaling={shown(scaling)} is not supported (only None)"
        )
    if rope_type != "default":
        raise CheckpointError(
            f"{family} rope_parameters rope_type={shown(rope_type)} is not supported"
        )
    return float(params.get("rope_theta", hf.get("rope_theta", 10000.0)))


def window_from_sliding(family: str, sliding_window: Any) -> int | None:
    """Hugging Face's ``sliding_window`` W (each query sees W keys, itself included) as
    glassformer's ``attention_window`` (the keys before itself): W − 1; None stays None."""
    if sliding_window is None:
        return None
    if not isinstance(sliding_window, int) or sliding_window < 2:
        raise CheckpointError(
            f"{family} sliding_window={shown(sliding_window)} is not supported (>= 2)"
        )
    return sliding_window - 1


def layer_windows(family: str, hf: dict[str, Any], default_types: list[str]) -> dict[str, Any]:
    """The window fields (``attention_window``, ``full_attention_layers``) of a config whose
    layers are each "sliding_attention" or "full_attention": its ``layer_types``, or
    ``default_types`` (the family's own pattern) where it has none."""
    types = hf.get("layer_types")
    types = default_types if types is None else types
    if len(types) != hf["num_hidden_layers"] or set(types) - {
        "sliding_attention",
        "full_attention",
    }:
        raise CheckpointError(f"{family} layer_types={shown(types)} is not supported")
    if "sliding_attention" not in types:
        return {"attention_window": None, "full_attention_layers": []}
    return {
        "attention_window": window_from_sliding(family, hf.get("sliding_window")),
        "full_attention_layers": [i for i, t in enumerate(types) if t == "full_attention"],
    }


def mistral_config(hf: dict[str, Any]) -> GPTConfig:
    """A ``GPTConfig`` equal to a Mistral ``config.json``: Llama's, with its sliding window."""
    if hf.get("layer_types") is not None:
        raise CheckpointError(f"Mistral layer_types={shown(hf['layer_types'])} is not supported")
    window = window_from_sliding("Mistral", hf.get("sliding_window"))
    return replace(llama_config(hf, family="Mistral"), attention_window=window)


def llama_config(hf: dict[str, Any], family: str = "Llama") -> GPTConfig:
    """A ``GPTConfig`` equal to a Llama ``config.json``; refuses what GPT cannot express,
    naming the ``family`` whose config it reads."""
    if hf.get("hidden_act", "silu") != "silu":
        raise CheckpointError(
            f"{family} hidden_act={shown(hf['hidden_act'])} is not supported (silu)"
        )
    attention_bias, mlp_bias = hf.get("attention_bias", False), hf.get("mlp_bias", False)
    if attention_bias != mlp_bias:
        raise CheckpointError(
            f"{family} attention_bias={attention_bias} with mlp_bias={mlp_bias} is not "
            "supported (glassformer's bias covers both)"
        )
    if hf.get("pretraining_tp", 1) != 1:
        raise CheckpointError(f"{family} pretraining_tp={hf['pretraining_tp']} is not supported")
    d_model, num_heads = hf["hidden_size"], hf["num_attention_heads"]
    head_dim = hf.get("head_dim") or d_model // num_heads
    return GPTConfig(
        vocab_size=hf["vocab_size"],
        max_len=hf.get("max_position_embeddings", 2048),
        d_model=d_model,
        num_heads=num_heads,
        num_kv_heads=hf.get("num_key_value_heads") or num_heads,
        head_dim=None if head_dim * num_heads == d_model else head_dim,
        num_layers=hf["num_hidden_layers"],
        d_ff=hf["intermediate_size"],
        dropout=0.0,
        attention_dropout=hf.get("attention_dropout", 0.0),
        activation="swiglu",
        positional="rope",
        rope_theta=rope_theta(hf, family),
        norm="rms",
        norm_eps=hf.get("rms_norm_eps", 1e-6),
        bias=bool(attention_bias),
        qkv_bias=bool(attention_bias),
        tie_weights=hf.get("tie_word_embeddings", False),
        pad_id=None,
    )


def from_llama_state(
    state: dict[str, Tensor], config: GPTConfig, family: str = "Llama"
) -> dict[str, Tensor]:
    """Llama weights under Hugging Face's names (``model.`` prefix optional) → a GPT state
    dict; a missing tensor is one error naming the ``family``."""
    state = {k.removeprefix("model."): v for k, v in state.items()}
    take = taker(state, family)
    out = {"embed.weight": take("embed_tokens.weight")}
    out["ln_final.weight"] = take("norm.weight")
    for i in range(config.num_layers):
        theirs, ours = f"layers.{i}.", f"blocks.{i}."
        for name, their_name in _BLOCK:
            if name.endswith(".bias") and config.bias is not True:
                continue
            out[ours + name] = take(theirs + their_name)
        qkv = ("q_proj", "k_proj", "v_proj")  # rows [q; k; v]: qkv_proj's layout
        out[ours + "attn.qkv_proj.weight"] = torch.cat(
            [take(f"{theirs}self_attn.{p}.weight") for p in qkv]
        )
        if config.qk_norm:  # Qwen3's
            for p in ("q_norm", "k_norm"):
                out[f"{ours}attn.{p}.weight"] = take(f"{theirs}self_attn.{p}.weight")
        if config.qkv_bias and config.bias in (True, "qkv"):
            out[ours + "attn.qkv_proj.bias"] = torch.cat(
                [take(f"{theirs}self_attn.{p}.bias") for p in qkv]
            )
    if config.tie_weights:
        out["lm_head.weight"] = out["embed.weight"]
    else:
        out["lm_head.weight"] = take("lm_head.weight")
    return out


def load_llama(path: str | Path) -> GPT:
    """A ``GPT`` with the weights of the Hugging Face Llama directory ``path``, in eval mode."""
    return load_llama_shaped(path, "llama", llama_config, "Llama")


def load_mistral(path: str | Path) -> GPT:
    """A ``GPT`` with the weights of the Hugging Face Mistral directory ``path``, in eval mode."""
    return load_llama_shaped(path, "mistral", mistral_config, "Mistral")


def load_llama_shaped(path: str | Path, model_type: str, make_config: Any, family: str) -> GPT:
    """A ``GPT`` from a directory of ``model_type`` whose weights carry Llama's names, its
    config read by ``make_config``."""

    def convert(state: dict[str, Tensor], config: GPTConfig) -> dict[str, Tensor]:
        return from_llama_state(state, config, family)

    return load_directory(GPT, path, model_type, make_config, convert)


register_format("llama", "gpt", load_llama)
register_format("mistral", "gpt", load_mistral)
