"""Hugging Face GPT-2 checkpoints, read into glassformer's ``GPT`` and written back.

A GPT-2 directory holds ``config.json`` and ``model.safetensors`` (or the older
``pytorch_model.bin``, read here with ``weights_only=True``). GPT-2 is the same
architecture as glassformer's GPT (pre-norm blocks, learned positions, tied head), so the
conversion is renaming, plus one transpose: GPT-2 stores its projections as ``Conv1D``
with the weight (in, out), where ``nn.Linear`` keeps (out, in).

    GPT-2 (GPT2LMHeadModel)          glassformer GPT
    transformer.wte / wpe            embed / pos_embed
    h.N.ln_1 / ln_2                  blocks.N.ln1 / ln2
    h.N.attn.c_attn (Conv1D)         blocks.N.attn.qkv_proj  (transposed)
    h.N.attn.c_proj (Conv1D)         blocks.N.attn.out_proj  (transposed)
    h.N.mlp.c_fc / c_proj (Conv1D)   blocks.N.mlp.linear1 / linear2  (transposed)
    ln_f                             ln_final
    lm_head (tied to wte)            lm_head (tied to the token embedding)

``c_attn``'s output columns are [q; k; v], each head-major: the layout of ``qkv_proj``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from torch import Tensor

from glassformer.checkpoint import CheckpointError, register_format
from glassformer.errors import shown
from glassformer.interop._hf import (
    build_config,
    converted,
    load_weights,
    naming,
    read_config,
    read_weights,
)
from glassformer.models.base import Activation
from glassformer.models.gpt import GPT, GPTConfig

# GPT-2's activation names → glassformer's.
_ACTIVATIONS: dict[str, Activation] = {
    "gelu_new": "gelu_tanh",
    "gelu_pytorch_tanh": "gelu_tanh",
    "gelu_fast": "gelu_tanh",
    "gelu": "gelu",
    "relu": "relu",
}
_EXPORT_ACTIVATIONS = {"gelu_tanh": "gelu_new", "gelu": "gelu", "relu": "relu"}
# glassformer name piece inside a block → GPT-2's, and whether it is a Conv1D weight.
_BLOCK = (
    ("ln1.weight", "ln_1.weight", False),
    ("ln1.bias", "ln_1.bias", False),
    ("attn.qkv_proj.weight", "attn.c_attn.weight", True),
    ("attn.qkv_proj.bias", "attn.c_attn.bias", False),
    ("attn.out_proj.weight", "attn.c_proj.weight", True),
    ("attn.out_proj.bias", "attn.c_proj.bias", False),
    ("ln2.weight", "ln_2.weight", False),
    ("ln2.bias", "ln_2.bias", False),
    ("mlp.linear1.weight", "mlp.c_fc.weight", True),
    ("mlp.linear1.bias", "mlp.c_fc.bias", False),
    ("mlp.linear2.weight", "mlp.c_proj.weight", True),
    ("mlp.linear2.bias", "mlp.c_proj.bias", False),
)
_TOP = (
    ("embed.weight", "wte.weight"),
    ("pos_embed.weight", "wpe.weight"),
    ("ln_final.weight", "ln_f.weight"),
    ("ln_final.bias", "ln_f.bias"),
)


def gpt2_config(hf: dict[str, Any]) -> GPTConfig:
    """A ``GPTConfig`` equal to a GPT-2 ``config.json``; refuses what GPT cannot express."""
    activation = hf.get("activation_function", "gelu_new")
    if activation not in _ACTIVATIONS:
        raise CheckpointError(
            f"GPT-2 activation_function {shown(activation)} has no glassformer equivalent "
            f"(supported: {sorted(_ACTIVATIONS)})"
        )
    for flag in ("scale_attn_by_inverse_layer_idx", "reorder_and_upcast_attn"):
        if hf.get(flag):
            raise CheckpointError(f"GPT-2 option {flag}=true is not supported")
    if hf.get("scale_attn_weights", True) is False:
        raise CheckpointError("GPT-2 option scale_attn_weights=false is not supported")
    d_model = hf["n_embd"]
    return GPTConfig(
        vocab_size=hf["vocab_size"],
        max_len=hf["n_positions"],
        d_model=d_model,
        num_heads=hf["n_head"],
        num_layers=hf["n_layer"],
        d_ff=hf.get("n_inner") or 4 * d_model,
        dropout=hf.get("resid_pdrop", 0.1),
        attention_dropout=hf.get("attn_pdrop", 0.1),
        activation=_ACTIVATIONS[activation],
        layer_norm_eps=hf.get("layer_norm_epsilon", 1e-5),
        tie_weights=hf.get("tie_word_embeddings", True),
        pad_id=None,
    )


def from_gpt2_state(state: dict[str, Tensor], config: GPTConfig) -> dict[str, Tensor]:
    """GPT-2 weights (with or without the ``transformer.`` prefix) → a GPT state dict."""
    state = {k.removeprefix("transformer."): v for k, v in state.items()}
    out: dict[str, Tensor] = {}

    def take(theirs: str, transpose: bool = False) -> Tensor:
        if theirs not in state:
            raise CheckpointError(f"GPT-2 weights have no {theirs!r}")
        value = state[theirs]
        return value.t().contiguous() if transpose else value

    for ours, theirs in _TOP:
        out[ours] = take(theirs)
    for i in range(config.num_layers):
        for ours, theirs, conv in _BLOCK:
            out[f"blocks.{i}.{ours}"] = take(f"h.{i}.{theirs}", conv)
    if config.tie_weights:
        out["lm_head.weight"] = out["embed.weight"]
    else:
        out["lm_head.weight"] = take("lm_head.weight")
    return out


def to_gpt2_state(model: GPT) -> dict[str, Tensor]:
    """A GPT's weights in ``GPT2LMHeadModel``'s layout and names."""
    state = model.state_dict()
    out: dict[str, Tensor] = {}
    for ours, theirs in _TOP:
        out[f"transformer.{theirs}"] = state[ours]
    for i in range(model.config.num_layers):
        for ours, theirs, conv in _BLOCK:
            value = state[f"blocks.{i}.{ours}"]
            out[f"transformer.h.{i}.{theirs}"] = value.t() if conv else value
    out["lm_head.weight"] = state["lm_head.weight"]
    return {k: v.detach().contiguous().clone() for k, v in out.items()}


# ---- directories -------------------------------------------------------------------------


def load_gpt2(path: str | Path) -> GPT:
    """A ``GPT`` with the weights of the Hugging Face GPT-2 directory ``path``, in eval mode."""
    path = Path(path)
    config = build_config(gpt2_config, read_config(path, "gpt2"), path)
    with naming(path):
        return load_weights(GPT, config, converted(from_gpt2_state, read_weights(path), config))


def save_gpt2(model: GPT, path: str | Path) -> Path:
    """Write ``model`` as a Hugging Face GPT-2 directory (``GPT2LMHeadModel`` opens it)."""
    from safetensors.torch import save_file

    from glassformer.checkpoint import write_directory_atomically

    c = model.config
    if not isinstance(c, GPTConfig):
        raise ValueError(f"a {c.title} model cannot be written as GPT-2 (its parts differ)")
    problems = []
    if not c.norm_first:
        problems.append("post-norm blocks (GPT-2 is pre-norm)")
    if c.positional != "learned":
        problems.append(f"{c.positional} positions (GPT-2 learns them)")
    if not c.qkv_bias:
        problems.append("q/k/v projections without bias")
    if not c.bias:
        problems.append("linear layers and LayerNorms without bias (GPT-2 has them)")
    if c.head_dim not in (None, c.d_model // c.num_heads):
        problems.append(f"head_dim={c.head_dim} (GPT-2 uses d_model / num_heads)")
    if problems:
        raise ValueError("this GPT cannot be written as GPT-2: " + "; ".join(problems))
    hf = {
        "architectures": ["GPT2LMHeadModel"],
        "model_type": "gpt2",
        "vocab_size": c.vocab_size,
        "n_positions": c.max_len,
        "n_embd": c.d_model,
        "n_layer": c.num_layers,
        "n_head": c.num_heads,
        "n_inner": c.d_ff,
        "activation_function": _EXPORT_ACTIVATIONS[c.activation],
        "layer_norm_epsilon": c.layer_norm_eps,
        "resid_pdrop": c.dropout,
        "embd_pdrop": c.dropout,
        "attn_pdrop": c.attention_dropout,
        "tie_word_embeddings": c.tie_weights,
    }
    state = to_gpt2_state(model)
    if c.tie_weights:
        del state["lm_head.weight"]  # GPT-2 ties it to wte, as its own files do

    def write(tmp: Path) -> None:
        (tmp / "config.json").write_text(json.dumps(hf, indent=2) + "\n")
        save_file(state, str(tmp / "model.safetensors"), metadata={"format": "pt"})

    return write_directory_atomically(Path(path), write)


register_format("gpt2", "gpt", load_gpt2)
