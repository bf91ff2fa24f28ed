"""Hugging Face Qwen2 / Qwen2.5 and Qwen3 checkpoints read into ``GPT``.

Both are Llama-shaped and share its weight names (``interop.llama``). What differs:

    Qwen2   biases on the q, k and v projections only (``bias="qkv"``)
    Qwen3   no biases by default (``attention_bias`` puts them on q, k, v and o), and an
            RMSNorm over each head's queries and keys before the rotation (``qk_norm``),
            with ``head_dim`` its own field (128 by default, not hidden / heads)

Both can slide a window over the later layers (``use_sliding_window``: layer i slides iff
i ≥ ``max_window_layers``, or as ``layer_types`` says): the earlier ones are glassformer's
``full_attention_layers``.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

from glassformer.checkpoint import CheckpointError, register_format
from glassformer.interop.llama import layer_windows, llama_config, load_llama_shaped
from glassformer.models.gpt import GPT, GPTConfig


def _windows(family: str, hf: dict[str, Any]) -> dict[str, Any]:
    """The window fields of the layers ``use_sliding_window`` and ``max_window_layers`` (or
    ``layer_types``) slide: layer i slides iff i ≥ ``max_window_layers``."""
    sliding = hf.get("use_sliding_window", False) and hf.get("sliding_window") is not None
    first = hf.get("max_window_layers", 28)
    default = ["sliding_attention" if sliding and i >= first else "full_attention"
               for i in range(hf["num_hidden_layers"])]  # fmt: skip
    return layer_windows(family, hf, default)


def qwen2_config(hf: dict[str, Any]) -> GPTConfig:
    """A ``GPTConfig`` equal to a Qwen2 ``config.json``."""
    config = llama_config({**hf, "attention_bias": False, "mlp_bias": False}, family="Qwen2")
    return replace(config, bias="qkv", qkv_bias=True, **_windows("Qwen2", hf))


def qwen3_config(hf: dict[str, Any]) -> GPTConfig:
    """A ``GPTConfig`` equal to a Qwen3 ``config.json``."""
    if hf.get("attention_bias", False):
        raise CheckpointError(
            "Qwen3 attention_bias=True is not supported (biases on q, k, v and o_proj "
            "without the MLP's: glassformer has bias on all, none, or q/k/v)"
        )
    config = llama_config({**hf, "head_dim": hf.get("head_dim", 128)}, family="Qwen3")
    return replace(config, qk_norm=True, **_windows("Qwen3", hf))


def load_qwen2(path: str | Path) -> GPT:
    """A ``GPT`` with the weights of the Hugging Face Qwen2 directory ``path``, in eval mode."""
    return load_llama_shaped(path, "qwen2", qwen2_config, "Qwen2")


def load_qwen3(path: str | Path) -> GPT:
    """A ``GPT`` with the weights of the Hugging Face Qwen3 directory ``path``, in eval mode."""
    return load_llama_shaped(path, "qwen3", qwen3_config, "Qwen3")


register_format("qwen2", "gpt", load_qwen2)
register_format("qwen3", "gpt", load_qwen3)
