"""A GGUF file (llama.cpp's) as a ``GPT``: ``GPT.from_pretrained("model.gguf")``.

The file's tensors are read under Hugging Face's names (``read_gguf_weights``) and its
metadata as that family's ``config.json``; the family's own config reader then builds the
model, as for a Hugging Face directory.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from glassformer.checkpoint import register_format
from glassformer.interop._hf import build_config, model_holding
from glassformer.interop.gemma import from_gemma_state, gemma_config
from glassformer.interop.gguf import read_gguf_weights
from glassformer.interop.gpt_neox import from_gpt_neox_state, gpt_neox_config
from glassformer.interop.llama import from_llama_state, llama_config
from glassformer.interop.qwen import qwen2_config, qwen3_config
from glassformer.models.gpt import GPT

# model_type → (its config reader, its weight map), as for a Hugging Face directory
CONFIGS: dict[str, tuple[Any, Any]] = {
    "llama": (llama_config, lambda s, c: from_llama_state(s, c, "Llama")),
    "qwen2": (qwen2_config, lambda s, c: from_llama_state(s, c, "Qwen2")),
    "qwen3": (qwen3_config, lambda s, c: from_llama_state(s, c, "Qwen3")),
    "gemma3_text": (lambda hf: gemma_config(hf, "Gemma 3"), from_gemma_state),
    "gpt_neox": (gpt_neox_config, from_gpt_neox_state),
}


def load_gguf(path: str | Path, dtype: torch.dtype = torch.float32) -> GPT:
    """A ``GPT`` with the weights of the GGUF file ``path`` (architecture llama, qwen2,
    qwen3, gemma3 or gptneox), dequantised to ``dtype``, in eval mode."""
    path = Path(path)
    hf, state = read_gguf_weights(path, dtype=dtype)
    make, convert = CONFIGS[hf["model_type"]]
    config = build_config(make, hf, path)
    return model_holding(GPT, config, convert(state, config))


register_format(".gguf", "gpt", load_gguf)
