"""Hugging Face Phi-3 checkpoints (Phi-3-mini/medium, Phi-3.5-mini, Phi-4-mini) read into
``GPT``.

    Phi-3 (Phi3ForCausalLM)                    glassformer GPT
    model.embed_tokens                         embed
    model.layers.N.input_layernorm             blocks.N.ln1
    model.layers.N.self_attn.qkv_proj          blocks.N.attn.qkv_proj (the same rows: [q; k; v])
    model.layers.N.self_attn.o_proj            blocks.N.attn.out_proj
    model.layers.N.post_attention_layernorm    blocks.N.ln2
    model.layers.N.mlp.gate_up_proj            blocks.N.mlp.gate_proj (first half of the rows)
                                               blocks.N.mlp.up_proj (second half)
    model.layers.N.mlp.down_proj               blocks.N.mlp.down_proj
    model.norm                                 ln_final
    lm_head (or tied to embed_tokens)          lm_head

q and k are in ``rotate_half``'s layout, as Llama's: no rows are permuted.
"""

from __future__ import annotations

from pathlib import Path

from torch import Tensor

from glassformer.checkpoint import CheckpointError, register_format
from glassformer.interop._hf import load_directory, taker
from glassformer.models.families.phi3 import Phi3Config
from glassformer.models.gpt import GPT

_BLOCK = (
    ("ln1", "input_layernorm"),
    ("ln2", "post_attention_layernorm"),
    ("attn.qkv_proj", "self_attn.qkv_proj"),
    ("attn.out_proj", "self_attn.o_proj"),
    ("mlp.down_proj", "mlp.down_proj"),
)


def from_phi3_state(state: dict[str, Tensor], config: Phi3Config) -> dict[str, Tensor]:
    """Phi-3 weights under Hugging Face's names (``model.`` prefix optional) → a GPT state
    dict."""
    state = {k.removeprefix("model."): v for k, v in state.items()}
    take = taker(state, config.title)
    out = {"embed.weight": take("embed_tokens.weight"), "ln_final.weight": take("norm.weight")}
    for i in range(config.num_layers):
        theirs, ours = f"layers.{i}.", f"blocks.{i}."
        for name, their_name in _BLOCK:
            out[f"{ours}{name}.weight"] = take(f"{theirs}{their_name}.weight")
        gate_up = take(f"{theirs}mlp.gate_up_proj.weight")
        if gate_up.dim() != 2 or gate_up.size(0) != 2 * config.d_ff:
            raise CheckpointError(
                f"{config.title} {theirs}mlp.gate_up_proj.weight has shape "
                f"{tuple(gate_up.shape)}, expected ({2 * config.d_ff}, {config.d_model})"
            )
        out[f"{ours}mlp.gate_proj.weight"], out[f"{ours}mlp.up_proj.weight"] = gate_up.chunk(2)
    out["lm_head.weight"] = out["embed.weight"] if config.tie_weights else take("lm_head.weight")
    return out


def load_phi3(path: str | Path) -> GPT:
    """A ``GPT`` with the weights of the Hugging Face Phi-3 directory ``path``, in eval mode."""
    return load_directory(GPT, path, "phi3", Phi3Config.from_hf, from_phi3_state)


register_format("phi3", "gpt", load_phi3)
