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

The configs are the families' (``models.families.llama``, ``mistral``, ``qwen2``,
``qwen3``); this file holds the weight map they share: Mistral's is Llama's, and Qwen2's
and Qwen3's add q/k/v biases and the QK-norm weights ``self_attn.q_norm``/``k_norm`` →
``attn.q_norm``/``attn.k_norm``.

Hugging Face's q/k projections are already in the ``rotate_half`` layout that
``modules.rotary`` uses, so no rows are permuted (GGUF files differ; their reader undoes
llama.cpp's permutation before calling ``from_llama_state``).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from glassformer.checkpoint import register_format
from glassformer.interop._hf import load_directory, taker
from glassformer.models.families import LlamaConfig, MistralConfig, Qwen3Config
from glassformer.models.families.olmoe import OlmoeConfig
from glassformer.models.gpt import GPT

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


def from_llama_state(
    state: dict[str, Tensor],
    config: LlamaConfig,
    family: str = "Llama",
    dense: Callable[[int], bool] = lambda layer: True,
) -> dict[str, Tensor]:
    """Llama weights under Hugging Face's names (``model.`` prefix optional) → a GPT state
    dict; a missing tensor is one error naming the ``family``. The MLP of a layer for which
    ``dense`` is false is left to the caller (a mixture of experts)."""
    state = {k.removeprefix("model."): v for k, v in state.items()}
    take = taker(state, family)
    out = {"embed.weight": take("embed_tokens.weight")}
    out["ln_final.weight"] = take("norm.weight")
    for i in range(config.num_layers):
        theirs, ours = f"layers.{i}.", f"blocks.{i}."
        for name, their_name in _BLOCK:
            if (
                name.endswith(".bias")
                and not config.bias
                or (name.startswith("mlp.") and not dense(i))
            ):
                continue
            out[ours + name] = take(theirs + their_name)
        qkv = ("q_proj", "k_proj", "v_proj")  # rows [q; k; v]: qkv_proj's layout
        out[ours + "attn.qkv_proj.weight"] = torch.cat(
            [take(f"{theirs}self_attn.{p}.weight") for p in qkv]
        )
        if isinstance(config, Qwen3Config | OlmoeConfig):  # QK-norm
            for p in ("q_norm", "k_norm"):
                out[f"{ours}attn.{p}.weight"] = take(f"{theirs}self_attn.{p}.weight")
        if config.qkv_bias:
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
    return load_llama_shaped(path, "llama", LlamaConfig.from_hf, "Llama")


def load_mistral(path: str | Path) -> GPT:
    """A ``GPT`` with the weights of the Hugging Face Mistral directory ``path``, in eval mode."""
    return load_llama_shaped(path, "mistral", MistralConfig.from_hf, "Mistral")


def load_llama_shaped(path: str | Path, model_type: str, make_config: Any, family: str) -> GPT:
    """A ``GPT`` from a directory of ``model_type`` whose weights carry Llama's names, its
    config read by ``make_config``."""

    def convert(state: dict[str, Tensor], config: LlamaConfig) -> dict[str, Tensor]:
        return from_llama_state(state, config, family)

    return load_directory(GPT, path, model_type, make_config, convert)


register_format("llama", "gpt", load_llama)
register_format("mistral", "gpt", load_mistral)
