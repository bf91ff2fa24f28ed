"""Hugging Face GPT-NeoX checkpoints (Pythia, GPT-NeoX-20B) read into ``GPT``.

GPT-NeoX is glassformer's GPT with these parts: rotary positions on the first
``rotary_pct`` of each head's features only (``rotary_dim``), attention and MLP reading the
same stream (``parallel``, from ``use_parallel_residual``), LayerNorms with biases, a plain
GELU MLP with biases, an untied head.

    GPT-NeoX (GPTNeoXForCausalLM)                 glassformer GPT
    gpt_neox.embed_in                             embed
    gpt_neox.layers.N.input_layernorm             blocks.N.ln1
    gpt_neox.layers.N.attention.query_key_value   blocks.N.attn.qkv_proj (rows regrouped)
    gpt_neox.layers.N.attention.dense             blocks.N.attn.out_proj
    gpt_neox.layers.N.post_attention_layernorm    blocks.N.ln2
    gpt_neox.layers.N.mlp.dense_h_to_4h / 4h_to_h blocks.N.mlp.linear1 / linear2
    gpt_neox.final_layer_norm                     ln_final
    embed_out (lm_head in newer files)            lm_head

The fused ``query_key_value`` holds its rows head by head, [q₀ k₀ v₀ q₁ k₁ v₁ …], each
Dh rows; glassformer's ``qkv_proj`` holds all of q, then k, then v.
"""

from __future__ import annotations

from pathlib import Path

from torch import Tensor

from glassformer.checkpoint import register_format
from glassformer.interop._hf import load_directory, taker
from glassformer.models.families import GPTNeoXConfig
from glassformer.models.gpt import GPT

# glassformer name inside a block → GPT-NeoX's, for the weights that are simply renamed.
_BLOCK = (
    ("ln1", "input_layernorm"),
    ("ln2", "post_attention_layernorm"),
    ("attn.out_proj", "attention.dense"),
    ("mlp.linear1", "mlp.dense_h_to_4h"),
    ("mlp.linear2", "mlp.dense_4h_to_h"),
)


def from_gpt_neox_state(state: dict[str, Tensor], config: GPTNeoXConfig) -> dict[str, Tensor]:
    """GPT-NeoX weights under Hugging Face's names (``gpt_neox.`` prefix optional) → a GPT
    state dict."""
    state = {k.removeprefix("gpt_neox."): v for k, v in state.items()}
    take = taker(state, "GPT-NeoX")
    H, D = config.num_heads, config.d_model
    out = {"embed.weight": take("embed_in.weight")}
    for part in ("weight", "bias"):
        out[f"ln_final.{part}"] = take(f"final_layer_norm.{part}")
    for i in range(config.num_layers):
        theirs, ours = f"layers.{i}.", f"blocks.{i}."
        for part in ("weight", "bias"):
            for name, their_name in _BLOCK:
                out[f"{ours}{name}.{part}"] = take(f"{theirs}{their_name}.{part}")
            fused = take(f"{theirs}attention.query_key_value.{part}")  # rows per head: q k v
            by_head = fused.reshape(H, 3, D // H, *fused.shape[1:])
            out[f"{ours}attn.qkv_proj.{part}"] = by_head.transpose(0, 1).reshape(fused.shape)
    head = "lm_head.weight" if "lm_head.weight" in state else "embed_out.weight"
    out["lm_head.weight"] = out["embed.weight"] if config.tie_weights else take(head)
    return out


def load_gpt_neox(path: str | Path) -> GPT:
    """A ``GPT`` with the weights of the Hugging Face GPT-NeoX directory ``path``, in eval mode."""
    return load_directory(GPT, path, "gpt_neox", GPTNeoXConfig.from_hf, from_gpt_neox_state)


register_format("gpt_neox", "gpt", load_gpt_neox)
