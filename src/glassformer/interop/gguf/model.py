"""A GGUF file (llama.cpp's) as a ``GPT``: ``GPT.from_pretrained("model.gguf")``.

The file's tensors are read under Hugging Face's names (``read_gguf_weights``) and its
metadata as that family's ``config.json``; the family's own config reader then builds the
model, as for a Hugging Face directory.
"""

from __future__ import annotations

from pathlib import Path

import torch

from glassformer.checkpoint import register_format
from glassformer.interop._hf import build_config, model_holding
from glassformer.interop.gguf import read_gguf_weights
from glassformer.interop.llama import from_llama_state, llama_config
from glassformer.interop.qwen import qwen2_config, qwen3_config
from glassformer.models.gpt import GPT

CONFIGS = {"llama": (llama_config, "Llama"), "qwen2": (qwen2_config, "Qwen2"),
           "qwen3": (qwen3_config, "Qwen3")}  # fmt: skip


def load_gguf(path: str | Path, dtype: torch.dtype = torch.float32) -> GPT:
    """A ``GPT`` with the weights of the GGUF file ``path`` (architecture llama, qwen2 or
    qwen3), dequantised to ``dtype``, in eval mode."""
    path = Path(path)
    hf, state = read_gguf_weights(path, dtype=dtype)
    make, family = CONFIGS[hf["model_type"]]
    config = build_config(make, hf, path)
    return model_holding(GPT, config, from_llama_state(state, config, family))


register_format(".gguf", "gpt", load_gguf)
