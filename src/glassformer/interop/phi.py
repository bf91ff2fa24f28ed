"""Hugging Face Phi checkpoints (Phi-1, Phi-1.5, Phi-2; ``model_type`` "phi") read into
``GPT``.

    Phi (PhiForCausalLM)                        glassformer GPT
    model.embed_tokens                          embed
    model.layers.N.input_layernorm              blocks.N.ln1 (read by attention and MLP)
    model.layers.N.self_attn.q/k/v_proj         blocks.N.attn.qkv_proj (stacked, with biases)
    model.layers.N.self_attn.q/k_layernorm      blocks.N.attn.q_norm / k_norm (qk_layernorm)
    model.layers.N.self_attn.dense              blocks.N.attn.out_proj
    model.layers.N.mlp.fc1 / fc2                blocks.N.mlp.linear1 / linear2
    model.final_layernorm                       ln_final
    lm_head (weight and bias)                   lm_head

q and k are in ``rotate_half``'s layout over their first ``rotary_dim`` features: no rows
are permuted.
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch import Tensor

from glassformer.checkpoint import register_format
from glassformer.interop._hf import load_directory, taker
from glassformer.models.families.phi import PhiConfig
from glassformer.models.gpt import GPT

_BLOCK = (
    ("ln1", "input_layernorm"),
    ("attn.out_proj", "self_attn.dense"),
    ("mlp.linear1", "mlp.fc1"),
    ("mlp.linear2", "mlp.fc2"),
)
_HEAD_NORMS = (("attn.q_norm", "self_attn.q_layernorm"), ("attn.k_norm", "self_attn.k_layernorm"))


def from_phi_state(state: dict[str, Tensor], config: PhiConfig) -> dict[str, Tensor]:
    """Phi weights under Hugging Face's names (``model.`` prefix optional) → a GPT state
    dict."""
    state = {k.removeprefix("model."): v for k, v in state.items()}
    take = taker(state, config.title)
    out = {"embed.weight": take("embed_tokens.weight")}
    for part in ("weight", "bias"):
        out[f"ln_final.{part}"] = take(f"final_layernorm.{part}")
        for i in range(config.num_layers):
            theirs, ours = f"layers.{i}.", f"blocks.{i}."
            for name, their_name in _BLOCK + (_HEAD_NORMS if config.qk_norm else ()):
                out[f"{ours}{name}.{part}"] = take(f"{theirs}{their_name}.{part}")
            out[f"{ours}attn.qkv_proj.{part}"] = torch.cat(
                [take(f"{theirs}self_attn.{p}_proj.{part}") for p in "qkv"]
            )
    out["lm_head.weight"] = out["embed.weight"] if config.tie_weights else take("lm_head.weight")
    out["lm_head.bias"] = take("lm_head.bias")
    return out


def load_phi(path: str | Path) -> GPT:
    """A ``GPT`` with the weights of the Hugging Face Phi directory ``path``, in eval mode."""
    return load_directory(GPT, path, "phi", PhiConfig.from_hf, from_phi_state)


register_format("phi", "gpt", load_phi)
