"""Hugging Face Qwen2 / Qwen2.5 and Qwen3 checkpoints read into ``GPT``.

Both are Llama-shaped and share its weight names (``interop.llama``); their configs are
``models.families.qwen2`` and ``qwen3``. What differs:

    Qwen2   biases on the q, k and v projections (``attn.qkv_proj.bias``)
    Qwen3   QK-norm weights (``attn.q_norm``, ``attn.k_norm``)
"""

from __future__ import annotations

from pathlib import Path

from glassformer.checkpoint import register_format
from glassformer.interop.llama import load_llama_shaped
from glassformer.models.families import Qwen2Config, Qwen3Config
from glassformer.models.gpt import GPT


def load_qwen2(path: str | Path) -> GPT:
    """A ``GPT`` with the weights of the Hugging Face Qwen2 directory ``path``, in eval mode."""
    return load_llama_shaped(path, "qwen2", Qwen2Config.from_hf, "Qwen2")


def load_qwen3(path: str | Path) -> GPT:
    """A ``GPT`` with the weights of the Hugging Face Qwen3 directory ``path``, in eval mode."""
    return load_llama_shaped(path, "qwen3", Qwen3Config.from_hf, "Qwen3")


register_format("qwen2", "gpt", load_qwen2)
register_format("qwen3", "gpt", load_qwen3)
