"""Hugging Face OLMo and OLMo 2 checkpoints (AI2's OLMo-1B-hf, OLMo-7B-0424-hf, OLMo-2-*)
read into ``GPT``.

    OLMo 2 (Olmo2ForCausalLM)                       glassformer GPT
    model.embed_tokens                              embed
    model.layers.N.self_attn.q/k/v_proj             blocks.N.attn.qkv_proj (stacked)
    model.layers.N.self_attn.q_norm / k_norm        blocks.N.attn.q_norm / k_norm (H·Dh wide)
    model.layers.N.self_attn.o_proj                 blocks.N.attn.out_proj
    model.layers.N.post_attention_layernorm         blocks.N.ln1_post
    model.layers.N.mlp.gate_proj/up_proj/down_proj  blocks.N.mlp.(same names)
    model.layers.N.post_feedforward_layernorm       blocks.N.ln2_post
    model.norm                                      ln_final
    lm_head (or tied to embed_tokens)               lm_head

OLMo 1 (``OlmoForCausalLM``) is Llama's map without a norm weight: its LayerNorms learn
nothing. Neither permutes rows: q and k are in ``rotate_half``'s layout, as Llama's.
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch import Tensor

from glassformer.checkpoint import register_format
from glassformer.interop._hf import load_directory, taker
from glassformer.models.families.olmo import Olmo2Config, OlmoConfig
from glassformer.models.gpt import GPT

_BLOCK = (
    ("attn.out_proj", "self_attn.o_proj"),
    ("mlp.gate_proj", "mlp.gate_proj"),
    ("mlp.up_proj", "mlp.up_proj"),
    ("mlp.down_proj", "mlp.down_proj"),
)
_OLMO2_NORMS = (
    ("attn.q_norm", "self_attn.q_norm"),
    ("attn.k_norm", "self_attn.k_norm"),
    ("ln1_post", "post_attention_layernorm"),
    ("ln2_post", "post_feedforward_layernorm"),
)


def from_olmo_state(
    state: dict[str, Tensor], config: OlmoConfig | Olmo2Config
) -> dict[str, Tensor]:
    """OLMo or OLMo 2 weights under Hugging Face's names (``model.`` prefix optional) → a
    GPT state dict."""
    olmo2 = isinstance(config, Olmo2Config)
    state = {k.removeprefix("model."): v for k, v in state.items()}
    take = taker(state, config.title)
    out = {"embed.weight": take("embed_tokens.weight")}
    if olmo2:
        out["ln_final.weight"] = take("norm.weight")
    for i in range(config.num_layers):
        theirs, ours = f"layers.{i}.", f"blocks.{i}."
        for name, their_name in _BLOCK + (_OLMO2_NORMS if olmo2 else ()):
            out[f"{ours}{name}.weight"] = take(f"{theirs}{their_name}.weight")
        out[f"{ours}attn.qkv_proj.weight"] = torch.cat(
            [take(f"{theirs}self_attn.{p}_proj.weight") for p in "qkv"]
        )
    out["lm_head.weight"] = out["embed.weight"] if config.tie_weights else take("lm_head.weight")
    return out


def load_olmo(path: str | Path) -> GPT:
    """A ``GPT`` with the weights of the Hugging Face OLMo directory ``path``, in eval mode."""
    return load_directory(GPT, path, "olmo", OlmoConfig.from_hf, from_olmo_state)


def load_olmo2(path: str | Path) -> GPT:
    """A ``GPT`` with the weights of the Hugging Face OLMo 2 directory ``path``, in eval mode."""
    return load_directory(GPT, path, "olmo2", Olmo2Config.from_hf, from_olmo_state)


register_format("olmo", "gpt", load_olmo)
register_format("olmo2", "gpt", load_olmo2)
