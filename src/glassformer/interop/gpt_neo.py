"""Hugging Face GPT-Neo checkpoints (EleutherAI's GPT-Neo, the TinyStories models) read into
``GPT``.

    GPT-Neo (GPTNeoForCausalLM)                   glassformer GPT
    transformer.wte / wpe                         embed / pos_embed
    transformer.h.N.ln_1                          blocks.N.ln1
    transformer.h.N.attn.attention.q/k/v_proj     blocks.N.attn.qkv_proj (stacked, no bias)
    transformer.h.N.attn.attention.out_proj       blocks.N.attn.out_proj
    transformer.h.N.ln_2                          blocks.N.ln2
    transformer.h.N.mlp.c_fc / c_proj             blocks.N.mlp.linear1 / linear2
    transformer.ln_f                              ln_final
    lm_head (tied)                                lm_head

Its MLP and attention are ``nn.Linear`` layers (unlike GPT-2's Conv1D), so no weight is
transposed.
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch import Tensor

from glassformer.checkpoint import register_format
from glassformer.interop._hf import load_directory, taker
from glassformer.models.families import GPTNeoConfig
from glassformer.models.gpt import GPT

_BLOCK = (
    ("ln1", "ln_1"),
    ("attn.out_proj", "attn.attention.out_proj"),
    ("ln2", "ln_2"),
    ("mlp.linear1", "mlp.c_fc"),
    ("mlp.linear2", "mlp.c_proj"),
)


def from_gpt_neo_state(state: dict[str, Tensor], config: GPTNeoConfig) -> dict[str, Tensor]:
    """GPT-Neo weights under Hugging Face's names (``transformer.`` prefix optional) → a GPT
    state dict."""
    state = {k.removeprefix("transformer."): v for k, v in state.items()}
    take = taker(state, "GPT-Neo")
    out = {"embed.weight": take("wte.weight"), "pos_embed.weight": take("wpe.weight")}
    for part in ("weight", "bias"):
        out[f"ln_final.{part}"] = take(f"ln_f.{part}")
    for i in range(config.num_layers):
        theirs, ours = f"h.{i}.", f"blocks.{i}."
        for part in ("weight", "bias"):
            for name, their_name in _BLOCK:
                out[f"{ours}{name}.{part}"] = take(f"{theirs}{their_name}.{part}")
        out[f"{ours}attn.qkv_proj.weight"] = torch.cat(
            [take(f"{theirs}attn.attention.{p}_proj.weight") for p in "qkv"]
        )
    out["lm_head.weight"] = out["embed.weight"] if config.tie_weights else take("lm_head.weight")
    return out


def load_gpt_neo(path: str | Path) -> GPT:
    """A ``GPT`` with the weights of the Hugging Face GPT-Neo directory ``path``, in eval mode."""
    return load_directory(GPT, path, "gpt_neo", GPTNeoConfig.from_hf, from_gpt_neo_state)


register_format("gpt_neo", "gpt", load_gpt_neo)
