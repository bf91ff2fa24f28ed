"""A GGUF file (llama.cpp's) as a ``GPT``: ``GPT.from_pretrained("model.gguf")``.

The file's tensors are read under Hugging Face's names (``read_gguf_weights``) and its
metadata as that family's ``config.json``; the family's own config reader then builds the
model, as for a Hugging Face directory.

The model keeps where it came from: ``model.for_inference("gguf")`` puts the file's own
blocks back in its linear layers (``gguf_parts``: which rows of which tensors each layer's
weight is, as the file's weight map, ``interop.gguf.maps``, states them).

``GPT.from_pretrained("model.gguf", dtype="gguf")`` (or ``"gguf-q8"``) reads the file once,
straight into those layers: the model is built on the meta device, its block-typed weights
become layers computing from the blocks, and only the others (norms, tensors of types not
computed from blocks) are read as numbers. No fp32 copy of the model is ever made.
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from glassformer.checkpoint import FOREIGN_TOKENIZERS, register_format
from glassformer.errors import CheckpointError
from glassformer.interop._hf import (
    build_config,
    converted,
    model_holding,
    naming,
    reset_meta_buffers,
    skeleton,
)
from glassformer.interop.gemma import from_gemma_state
from glassformer.interop.gguf import read_gguf_mapped, read_gguf_weights
from glassformer.interop.gpt_neox import from_gpt_neox_state
from glassformer.interop.llama import from_llama_state
from glassformer.interop.mixtral import from_moe_state
from glassformer.interop.olmo import from_olmo_state
from glassformer.interop.phi3 import from_phi3_state
from glassformer.kernels.gguf_linear import Part
from glassformer.kernels.quantize import compute_from_blocks
from glassformer.kernels.quantized import GGUF_DTYPES
from glassformer.models.families import (
    GemmaConfig,
    GPTNeoXConfig,
    LlamaConfig,
    MixtralConfig,
    Olmo2Config,
    Phi3Config,
    Qwen2Config,
    Qwen2MoeConfig,
    Qwen3Config,
)
from glassformer.models.gpt import GPT

# model_type → (its config reader, its weight map), as for a Hugging Face directory
CONFIGS: dict[str, tuple[Any, Any]] = {
    "llama": (LlamaConfig.from_hf, lambda s, c: from_llama_state(s, c, "Llama")),
    "qwen2": (Qwen2Config.from_hf, lambda s, c: from_llama_state(s, c, "Qwen2")),
    "qwen3": (Qwen3Config.from_hf, lambda s, c: from_llama_state(s, c, "Qwen3")),
    "gemma3_text": (GemmaConfig.from_hf, from_gemma_state),
    "gpt_neox": (GPTNeoXConfig.from_hf, from_gpt_neox_state),
    "olmo2": (Olmo2Config.from_hf, from_olmo_state),
    "phi3": (Phi3Config.from_hf, from_phi3_state),
    "mixtral": (MixtralConfig.from_hf, from_moe_state),
    "qwen2_moe": (Qwen2MoeConfig.from_hf, from_moe_state),
}


def load_gguf(path: str | Path, dtype: torch.dtype | str = torch.float32) -> GPT:
    """A ``GPT`` with the weights of the GGUF file ``path`` (architecture llama, qwen2,
    qwen3, gemma3 or gptneox), in eval mode: dequantised to ``dtype`` (``torch.float32`` or
    ``torch.bfloat16``), or with ``dtype="gguf"`` / ``"gguf-q8"`` computing from the file's
    own blocks as ``for_inference`` makes it, read straight into them."""
    path = Path(path)
    if isinstance(dtype, str):
        if dtype not in GGUF_DTYPES:
            raise ValueError(
                f"dtype must be torch.float32, torch.bfloat16, 'gguf' or 'gguf-q8'; got {dtype!r}"
            )
        return _read_into_blocks(path, dtype)
    # the file's tensors are dropped once mapped: q, k and v are not kept beside their stack
    config, weights = _mapped(*read_gguf_weights(path, dtype=dtype), path)
    with naming(path):
        return remembering_blocks(model_holding(GPT, config, weights), path)


def _mapped(hf: dict[str, Any], state: dict[str, Tensor], path: Path) -> tuple[Any, dict]:
    """(the config, the weights under glassformer's names) of the family ``hf`` names."""
    make, convert = CONFIGS[hf["model_type"]]
    config = build_config(make, hf, path)
    with naming(path):  # weights that do not fit the config: one line naming the file
        return config, converted(convert, state, config)


def _read_into_blocks(path: Path, dtype: str) -> GPT:
    """The model of ``path`` computing from its blocks (``dtype`` "gguf" or "gguf-q8"), the
    file read once by its weight map: built on the meta device, the weights that are numbers
    assigned, the block-typed ones made layers of their parts (``compute_from_blocks``)."""
    hf, numbers, blocks = read_gguf_mapped(path)
    make, _ = CONFIGS[hf["model_type"]]
    config = build_config(make, hf, path)
    with naming(path):
        model = skeleton(GPT, config, numbers)
        missing, unexpected = model.load_state_dict(numbers, strict=False, assign=True)
        unmet = set(missing) - set(blocks)
        if unexpected or unmet or set(blocks) - set(model.state_dict()):
            names = sorted(unexpected or unmet or set(blocks) - set(model.state_dict()))
            raise CheckpointError(f"the weights do not fit the config: {names[:5]}")
        compute_from_blocks(model, blocks, rounded=dtype == "gguf-q8")
    reset_meta_buffers(model)
    unread = [name for name, p in model.named_parameters() if p.is_meta]
    if unread:
        raise CheckpointError(f"{path}: no tensor for {unread[:5]}")
    return model.eval().for_inference(dtype)


def remembering_blocks(model: GPT, path: Path) -> GPT:
    """``model``, able to put the blocks of ``path`` back (``for_inference("gguf")``)."""
    model.remember_source(functools.partial(gguf_parts, path))
    return model


def gguf_parts(path: str | Path) -> dict[str, list[Part]]:
    """``{weight name: parts}`` for every weight of the model of ``path`` whose tensors are
    of a type computed from blocks: the (type, rows) of each tensor it takes (``maps``)."""
    return read_gguf_mapped(path, numbers=False)[2]


def _tokenizer(path: Path) -> Any:
    """The tokenizer a GGUF file holds (its metadata; no tensor is decoded)."""
    from glassformer.interop.gguf import read_gguf_tokenizer

    return read_gguf_tokenizer(path)


register_format(".gguf", "gpt", load_gguf)
FOREIGN_TOKENIZERS[".gguf"] = _tokenizer
