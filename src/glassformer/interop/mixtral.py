"""Hugging Face mixtures of experts read into ``GPT``: Mixtral, OLMoE, Qwen2-MoE and
Qwen1.5-MoE. Their attention and norms are Llama's (``interop.llama``); the MLP is:

    Mixtral (MixtralForCausalLM)                          glassformer GPT
    model.layers.N.block_sparse_moe.gate                  blocks.N.mlp.router
    model.layers.N.block_sparse_moe.experts.E.w1 / w3     blocks.N.mlp.experts.E.gate_proj / up_proj
    model.layers.N.block_sparse_moe.experts.E.w2          blocks.N.mlp.experts.E.down_proj

    OLMoE, Qwen2-MoE                                       glassformer GPT
    model.layers.N.mlp.gate                               blocks.N.mlp.router
    model.layers.N.mlp.experts.E.gate/up/down_proj        blocks.N.mlp.experts.E.(same names)
    model.layers.N.mlp.shared_expert.gate/up/down_proj    blocks.N.mlp.shared_expert.(same)
    model.layers.N.mlp.shared_expert_gate                 blocks.N.mlp.shared_gate

OLMoE's QK-norm weights (``self_attn.q_norm``, ``k_norm``) are read as Qwen3's; a Qwen2-MoE
layer with a dense MLP (``mlp_only_layers``) as Llama's.
"""

from __future__ import annotations

from pathlib import Path

from torch import Tensor

from glassformer.checkpoint import register_format
from glassformer.interop._hf import load_directory, taker
from glassformer.interop.llama import from_llama_state
from glassformer.models.families.mixtral import MixtralConfig
from glassformer.models.families.olmoe import OlmoeConfig
from glassformer.models.families.qwen2_moe import Qwen2MoeConfig
from glassformer.models.gpt import GPT

_MIXTRAL_EXPERT = (("gate_proj", "w1"), ("up_proj", "w3"), ("down_proj", "w2"))
_EXPERT = tuple((p, p) for p in ("gate_proj", "up_proj", "down_proj"))

MoEConfig = MixtralConfig | OlmoeConfig | Qwen2MoeConfig


def from_moe_state(state: dict[str, Tensor], config: MoEConfig) -> dict[str, Tensor]:
    """A mixture of experts' weights under Hugging Face's names (``model.`` prefix
    optional) → a GPT state dict."""
    mixtral = isinstance(config, MixtralConfig)
    dense = getattr(config, "dense_layers", ())
    out = from_llama_state(state, config, config.title, dense=lambda i: i in dense)
    take = taker({k.removeprefix("model."): v for k, v in state.items()}, config.title)
    moe, expert = ("block_sparse_moe", _MIXTRAL_EXPERT) if mixtral else ("mlp", _EXPERT)
    for i in range(config.num_layers):
        if i in dense:
            continue
        theirs, ours = f"layers.{i}.{moe}.", f"blocks.{i}.mlp."
        out[f"{ours}router.weight"] = take(f"{theirs}gate.weight")
        for e in range(config.num_experts):
            for name, their_name in expert:
                out[f"{ours}experts.{e}.{name}.weight"] = take(
                    f"{theirs}experts.{e}.{their_name}.weight"
                )
        if getattr(config, "shared_d_ff", None) is not None:
            for name, their_name in _EXPERT:
                out[f"{ours}shared_expert.{name}.weight"] = take(
                    f"{theirs}shared_expert.{their_name}.weight"
                )
            out[f"{ours}shared_gate.weight"] = take(f"{theirs}shared_expert_gate.weight")
    return out


def load_mixtral(path: str | Path) -> GPT:
    """A ``GPT`` with the weights of the Hugging Face Mixtral directory ``path``, in eval mode."""
    return load_directory(GPT, path, "mixtral", MixtralConfig.from_hf, from_moe_state)


def load_olmoe(path: str | Path) -> GPT:
    """A ``GPT`` with the weights of the Hugging Face OLMoE directory ``path``, in eval mode."""
    return load_directory(GPT, path, "olmoe", OlmoeConfig.from_hf, from_moe_state)


def load_qwen2_moe(path: str | Path) -> GPT:
    """A ``GPT`` with the weights of the Hugging Face Qwen2-MoE directory ``path``, in eval
    mode."""
    return load_directory(GPT, path, "qwen2_moe", Qwen2MoeConfig.from_hf, from_moe_state)


register_format("mixtral", "gpt", load_mixtral)
register_format("olmoe", "gpt", load_olmoe)
register_format("qwen2_moe", "gpt", load_qwen2_moe)
