"""Hugging Face GPT-J checkpoints (EleutherAI's GPT-J-6B and its kin) read into ``GPT``.

    GPT-J (GPTJForCausalLM)                     glassformer GPT
    transformer.wte                             embed
    transformer.h.N.ln_1                        blocks.N.ln1 (read by attention and MLP)
    transformer.h.N.attn.q/k/v_proj             blocks.N.attn.qkv_proj (stacked, no bias)
    transformer.h.N.attn.out_proj               blocks.N.attn.out_proj
    transformer.h.N.mlp.fc_in / fc_out          blocks.N.mlp.linear1 / linear2
    transformer.ln_f                            ln_final
    lm_head (weight and bias)                   lm_head

q and k keep their rows: glassformer turns GPT-J's neighbouring pairs as GPT-J does
(``RotaryEmbedding(interleaved=True)``), so ``attn.hook_q`` is GPT-J's q_proj output.
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch import Tensor

from glassformer.checkpoint import register_format
from glassformer.interop._hf import load_directory, taker
from glassformer.models.families.gptj import GPTJConfig
from glassformer.models.gpt import GPT


def from_gptj_state(state: dict[str, Tensor], config: GPTJConfig) -> dict[str, Tensor]:
    """GPT-J weights under Hugging Face's names (``transformer.`` prefix optional) → a GPT
    state dict."""
    state = {k.removeprefix("transformer."): v for k, v in state.items()}
    take = taker(state, config.title)
    out = {"embed.weight": take("wte.weight")}
    for part in ("weight", "bias"):
        out[f"ln_final.{part}"] = take(f"ln_f.{part}")
    for i in range(config.num_layers):
        theirs, ours = f"h.{i}.", f"blocks.{i}."
        for part in ("weight", "bias"):
            out[f"{ours}ln1.{part}"] = take(f"{theirs}ln_1.{part}")
            out[f"{ours}mlp.linear1.{part}"] = take(f"{theirs}mlp.fc_in.{part}")
            out[f"{ours}mlp.linear2.{part}"] = take(f"{theirs}mlp.fc_out.{part}")
        out[f"{ours}attn.qkv_proj.weight"] = torch.cat(
            [take(f"{theirs}attn.{p}_proj.weight") for p in "qkv"]
        )
        out[f"{ours}attn.out_proj.weight"] = take(f"{theirs}attn.out_proj.weight")
    out["lm_head.weight"] = out["embed.weight"] if config.tie_weights else take("lm_head.weight")
    out["lm_head.bias"] = take("lm_head.bias")
    return out


def load_gptj(path: str | Path) -> GPT:
    """A ``GPT`` with the weights of the Hugging Face GPT-J directory ``path``, in eval mode."""
    return load_directory(GPT, path, "gptj", GPTJConfig.from_hf, from_gptj_state)


register_format("gptj", "gpt", load_gptj)
