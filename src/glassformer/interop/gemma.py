"""Hugging Face Gemma 3 (text) and Gemma 2 checkpoints read into ``GPT``.

Gemma's config and parts are ``models.families.gemma``'s; this file maps its weights:

    Gemma (Gemma3ForCausalLM, Gemma2ForCausalLM)        glassformer GPT
    model.embed_tokens                                  embed
    model.layers.N.input_layernorm                      blocks.N.ln1
    model.layers.N.self_attn.q/k/v_proj                 blocks.N.attn.qkv_proj (stacked)
    model.layers.N.self_attn.q_norm / k_norm (Gemma 3)  blocks.N.attn.q_norm / k_norm
    model.layers.N.self_attn.o_proj                     blocks.N.attn.out_proj
    model.layers.N.post_attention_layernorm             blocks.N.ln1_post
    model.layers.N.pre_feedforward_layernorm            blocks.N.ln2
    model.layers.N.mlp.gate/up/down_proj                blocks.N.mlp.(same names)
    model.layers.N.post_feedforward_layernorm           blocks.N.ln2_post
    model.norm                                          ln_final
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch import Tensor

from glassformer.checkpoint import register_format
from glassformer.interop._hf import load_directory, taker
from glassformer.models.families import GemmaConfig
from glassformer.models.gpt import GPT

_BLOCK = (
    ("ln1", "input_layernorm"),
    ("ln1_post", "post_attention_layernorm"),
    ("ln2", "pre_feedforward_layernorm"),
    ("ln2_post", "post_feedforward_layernorm"),
    ("attn.out_proj", "self_attn.o_proj"),
    ("mlp.gate_proj", "mlp.gate_proj"),
    ("mlp.up_proj", "mlp.up_proj"),
    ("mlp.down_proj", "mlp.down_proj"),
)


def from_gemma_state(
    state: dict[str, Tensor], config: GemmaConfig, family: str = "Gemma 3"
) -> dict[str, Tensor]:
    """Gemma weights under Hugging Face's names → a GPT state dict (the text model of a
    multimodal Gemma 3 too: ``model.language_model.``)."""
    state = {
        k.removeprefix("model.").removeprefix("language_model.").removeprefix("model."): v
        for k, v in state.items()
    }
    take = taker(state, family)
    out = {"embed.weight": take("embed_tokens.weight"), "ln_final.weight": take("norm.weight")}
    for i in range(config.num_layers):
        theirs, ours = f"layers.{i}.", f"blocks.{i}."
        for name, their_name in _BLOCK:
            out[f"{ours}{name}.weight"] = take(f"{theirs}{their_name}.weight")
        out[f"{ours}attn.qkv_proj.weight"] = torch.cat(
            [take(f"{theirs}self_attn.{p}_proj.weight") for p in "qkv"]
        )
        if config.version == 3:  # QK-norm
            for p in ("q_norm", "k_norm"):
                out[f"{ours}attn.{p}.weight"] = take(f"{theirs}self_attn.{p}.weight")
    out["lm_head.weight"] = out["embed.weight"] if config.tie_weights else take("lm_head.weight")
    return out


def load_gemma3(path: str | Path) -> GPT:
    """A ``GPT`` with the weights of the Hugging Face Gemma 3 text directory ``path``."""
    return _load(path, "gemma3_text", "Gemma 3")


def load_gemma2(path: str | Path) -> GPT:
    """A ``GPT`` with the weights of the Hugging Face Gemma 2 directory ``path``."""
    return _load(path, "gemma2", "Gemma 2")


def _load(path: str | Path, model_type: str, family: str) -> GPT:
    return load_directory(
        GPT,
        path,
        model_type,
        lambda hf: GemmaConfig.from_hf(hf, version=3 if family == "Gemma 3" else 2),
        lambda state, config: from_gemma_state(state, config, family),
    )


register_format("gemma3_text", "gpt", load_gemma3)
register_format("gemma2", "gpt", load_gemma2)
