"""Hugging Face Qwen2 / Qwen2.5 and Qwen3 checkpoints read into ``GPT``.

Both are Llama-shaped and share its weight names (``interop.llama``). What differs:

    Qwen2   biases on the q, k and v projections only (``bias="qkv"``)
    Qwen3   no biases by default (``attention_bias`` puts them on q, k, v and o), and an
            RMSNorm over each head's queries and keys before the rotation (``qk_norm``),
            with ``head_dim`` its own field (128 by default, not hidden / heads)

Both can slide a window over the later layers (``use_sliding_window``: layer i slides iff
i ≥ ``max_window_layers``); glassformer's window is one for every layer, so a checkpoint
that slides on some layers only is refused, one that slides on all (or none) loads.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

from glassformer.checkpoint import CheckpointError, register_format
from glassformer.interop.llama import llama_config, load_llama_shaped, window_from_sliding
from glassformer.models.gpt import GPT, GPTConfig


def _window(family: str, hf: dict[str, Any]) -> int | None:
    """The one window of every layer, from ``use_sliding_window`` and ``max_window_layers``
    (or ``layer_types``); a mix of sliding and full layers is refused."""
    layers = hf["num_hidden_layers"]
    types = hf.get("layer_types")
    if types is None:
        sliding = hf.get("use_sliding_window", False) and hf.get("sliding_window") is not None
        first = hf.get("max_window_layers", 28)
        types = [
            "sliding_attention" if sliding and i >= first else "full_attention"
            for i in range(layers)
        ]
    if set(types) - {"sliding_attention", "full_attention"}:
        raise CheckpointError(f"{family} layer_types={types!r} is not supported")
    if len(set(types)) > 1:
        raise CheckpointError(
            f"{family} layer_types={types!r} (a sliding window on some layers only) is not "
            "supported: glassformer's window is the same for every layer"
        )
    if types and types[0] == "sliding_attention":
        return window_from_sliding(family, hf.get("sliding_window"))
    return None


def qwen2_config(hf: dict[str, Any]) -> GPTConfig:
    """A ``GPTConfig`` equal to a Qwen2 ``config.json``."""
    config = llama_config({**hf, "attention_bias": False, "mlp_bias": False}, family="Qwen2")
    return replace(config, bias="qkv", qkv_bias=True, attention_window=_window("Qwen2", hf))


def qwen3_config(hf: dict[str, Any]) -> GPTConfig:
    """A ``GPTConfig`` equal to a Qwen3 ``config.json``."""
    if hf.get("attention_bias", False):
        raise CheckpointError(
            "Qwen3 attention_bias=True is not supported (biases on q, k, v and o_proj "
            "without the MLP's: glassformer has bias on all, none, or q/k/v)"
        )
    config = llama_config({**hf, "head_dim": hf.get("head_dim", 128)}, family="Qwen3")
    return replace(config, qk_norm=True, attention_window=_window("Qwen3", hf))


def load_qwen2(path: str | Path) -> GPT:
    """A ``GPT`` with the weights of the Hugging Face Qwen2 directory ``path``, in eval mode."""
    return load_llama_shaped(path, "qwen2", qwen2_config, "Qwen2")


def load_qwen3(path: str | Path) -> GPT:
    """A ``GPT`` with the weights of the Hugging Face Qwen3 directory ``path``, in eval mode."""
    return load_llama_shaped(path, "qwen3", qwen3_config, "Qwen3")


register_format("qwen2", "gpt", load_qwen2)
register_format("qwen3", "gpt", load_qwen3)
