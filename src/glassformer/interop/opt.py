"""Hugging Face OPT checkpoints (Meta's OPT-125m … 66b) read into ``GPT``.

OPT is GPT-2's shape with ReLU: learned positions, pre-norm LayerNorms with biases, a plain
MLP, biases everywhere, a head tied to the token embedding. Its position table has two
extra rows in front (position p reads row p + 2); glassformer's table is the rest.

    OPT (OPTForCausalLM)                          glassformer GPT
    model.decoder.embed_tokens                    embed
    model.decoder.embed_positions (rows 2:)       pos_embed.weight
    model.decoder.layers.N.self_attn_layer_norm   blocks.N.ln1
    model.decoder.layers.N.self_attn.q/k/v_proj   blocks.N.attn.qkv_proj (stacked)
    model.decoder.layers.N.self_attn.out_proj     blocks.N.attn.out_proj
    model.decoder.layers.N.final_layer_norm       blocks.N.ln2
    model.decoder.layers.N.fc1 / fc2              blocks.N.mlp.linear1 / linear2
    model.decoder.final_layer_norm                ln_final
    lm_head (tied)                                lm_head

OPT-350m is the exception: post-norm blocks with no final norm (``norm_first=False``,
``final_norm=False``), and embeddings 512 wide projected in and out of the 1024-wide stream
(``embed_dim``; ``project_in`` and ``project_out``, which keep their names).
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch import Tensor

from glassformer.checkpoint import register_format
from glassformer.interop._hf import load_directory, taker
from glassformer.models.families import OPTConfig
from glassformer.models.gpt import GPT

POSITION_OFFSET = 2  # OPT's table starts two rows before position 0
_BLOCK = (
    ("ln1", "self_attn_layer_norm"),
    ("attn.out_proj", "self_attn.out_proj"),
    ("ln2", "final_layer_norm"),
    ("mlp.linear1", "fc1"),
    ("mlp.linear2", "fc2"),
)


def from_opt_state(state: dict[str, Tensor], config: OPTConfig) -> dict[str, Tensor]:
    """OPT weights under Hugging Face's names (``model.decoder.`` or ``decoder.``) → a GPT
    state dict."""
    state = {k.removeprefix("model.").removeprefix("decoder."): v for k, v in state.items()}
    take = taker(state, "OPT")
    out = {"embed.weight": take("embed_tokens.weight")}
    out["pos_embed.weight"] = take("embed_positions.weight")[POSITION_OFFSET:]
    if config.final_norm:
        for part in ("weight", "bias"):
            out[f"ln_final.{part}"] = take(f"final_layer_norm.{part}")
    if config.embed_dim is not None:  # OPT-350m's projections, under their own names
        out["project_in.weight"] = take("project_in.weight")
        out["project_out.weight"] = take("project_out.weight")
    for i in range(config.num_layers):
        theirs, ours = f"layers.{i}.", f"blocks.{i}."
        for part in ("weight", "bias"):
            for name, their_name in _BLOCK:
                out[f"{ours}{name}.{part}"] = take(f"{theirs}{their_name}.{part}")
            out[f"{ours}attn.qkv_proj.{part}"] = torch.cat(
                [take(f"{theirs}self_attn.{p}_proj.{part}") for p in "qkv"]
            )
    out["lm_head.weight"] = out["embed.weight"] if config.tie_weights else take("lm_head.weight")
    return out


def load_opt(path: str | Path) -> GPT:
    """A ``GPT`` with the weights of the Hugging Face OPT directory ``path``, in eval mode."""
    return load_directory(GPT, path, "opt", OPTConfig.from_hf, from_opt_state)


register_format("opt", "gpt", load_opt)
