"""Hugging Face Gemma 3 (text) and Gemma 2 checkpoints read into ``GPT``.

Gemma is a Llama-shaped decoder with these parts (``GPTConfig``'s fields):

    RMSNorm scaling by 1 + weight, in float32       norm="gemma_rms"
    embeddings × √d_model                           scale_embeddings
    a norm after each sub-layer too (four a block)  sandwich_norms (ln1_post, ln2_post)
    scores × query_pre_attn_scalar^-½               attention_scale
    gated GELU (tanh approximation)                 activation="geglu_tanh"
    sliding layers between global ones              attention_window, full_attention_layers
    Gemma 3: QK-norm, its own rotary base for the   qk_norm, rope_local_theta
      sliding layers, a soft cap on the logits      final_softcap
    Gemma 2: soft caps on the scores and logits     attention_softcap, final_softcap

Gemma 3 stores ``attn_logit_softcapping`` but does not use it; neither does glassformer.
Hugging Face's ``sliding_window`` W lets a query see W keys, itself included: glassformer's
``attention_window`` W − 1.

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
from typing import Any

import torch
from torch import Tensor

from glassformer.checkpoint import CheckpointError, register_format
from glassformer.errors import shown
from glassformer.interop._hf import load_directory, taker
from glassformer.interop.llama import layer_windows, rope_theta
from glassformer.models.gpt import GPT, GPTConfig

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
ACTIVATIONS = ("gelu_pytorch_tanh", "gelu_new", "gelu_fast")  # GELU's tanh approximation


def _windows(hf: dict[str, Any], family: str) -> dict[str, Any]:
    """The window fields of ``layer_types`` or the family's own pattern (Gemma 3: every sixth
    layer global; Gemma 2: every other)."""
    every = hf.get("sliding_window_pattern", 6) if family == "Gemma 3" else 2
    default = ["full_attention" if (i + 1) % every == 0 else "sliding_attention"
               for i in range(hf["num_hidden_layers"])]  # fmt: skip
    return layer_windows(family, hf, default)


def _theta(family: str, params: dict[str, Any] | None, default: float) -> float:
    """One rotary table's base (a rope_parameters entry); any rope scaling is refused."""
    return rope_theta({"rope_parameters": params or {}, "rope_theta": default}, family)


def gemma_config(hf: dict[str, Any], family: str) -> GPTConfig:
    """A ``GPTConfig`` equal to a Gemma 3 text or Gemma 2 ``config.json``."""
    act = hf.get("hidden_activation") or hf.get("hidden_act") or "gelu_pytorch_tanh"
    if act not in ACTIVATIONS:
        raise CheckpointError(
            f"{family} hidden_activation={shown(act)} is not supported {ACTIVATIONS}"
        )
    for option in ("attention_bias", "use_bidirectional_attention"):
        if hf.get(option):
            raise CheckpointError(f"{family} {option}={shown(hf[option])} is not supported")
    gemma3 = family == "Gemma 3"
    windows = _windows(hf, family)
    sliding = windows["attention_window"] is not None
    rope = hf.get("rope_parameters") or {}
    if gemma3:
        nested = "full_attention" in rope or "sliding_attention" in rope
        full = rope.get("full_attention") if nested else rope or None
        theta = _theta(family, full, hf.get("rope_theta", 1e6))
        local = _theta(family, rope.get("sliding_attention") if nested else None,
                       hf.get("rope_local_base_freq", 1e4))  # fmt: skip
    else:
        theta, local = _theta(family, rope, hf.get("rope_theta", 1e4)), None
    if hf.get("rope_scaling"):
        raise CheckpointError(f"{family} rope_scaling={shown(hf['rope_scaling'])} is not supported")
    return GPTConfig(
        vocab_size=hf["vocab_size"],
        max_len=hf.get("max_position_embeddings", 8192),
        d_model=hf["hidden_size"],
        num_heads=hf["num_attention_heads"],
        num_kv_heads=hf.get("num_key_value_heads") or hf["num_attention_heads"],
        head_dim=hf.get("head_dim", 256),
        num_layers=hf["num_hidden_layers"],
        d_ff=hf["intermediate_size"],
        dropout=0.0,
        attention_dropout=0.0,
        activation="geglu_tanh",
        positional="rope",
        rope_theta=theta,
        rope_local_theta=local if sliding else None,
        norm="gemma_rms",
        norm_eps=hf.get("rms_norm_eps", 1e-6),
        bias=False,
        qk_norm=gemma3,
        scale_embeddings=True,
        sandwich_norms=True,
        attention_scale=hf.get("query_pre_attn_scalar", 256) ** -0.5,
        **windows,
        final_softcap=hf.get("final_logit_softcapping"),
        attention_softcap=None if gemma3 else hf.get("attn_logit_softcapping"),
        tie_weights=hf.get("tie_word_embeddings", True),
        pad_id=None,
    )


def from_gemma_state(
    state: dict[str, Tensor], config: GPTConfig, family: str = "Gemma 3"
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
        if config.qk_norm:
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
        lambda hf: gemma_config(hf, family),
        lambda state, config: from_gemma_state(state, config, family),
    )


register_format("gemma3_text", "gpt", load_gemma3)
register_format("gemma2", "gpt", load_gemma2)
