"""ggml's tensor encodings, decoded to fp32: F32, F16, BF16 and the block formats Q4_0,
Q4_1 and Q8_0.

A block format cuts each row into blocks of 32 numbers and stores, per block, an fp16 scale
``d`` (and for Q4_1 an fp16 minimum ``m``) followed by the 32 quantised values:

    Q8_0  34 bytes: d, then 32 int8 q            x = d · q
    Q4_0  18 bytes: d, then 16 bytes of nibbles  x = d · (q − 8)
    Q4_1  20 bytes: d, m, then 16 bytes          x = d · q + m

In the 4-bit formats byte j holds value j in its low nibble and value j + 16 in its high one.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor

from glassformer.errors import CheckpointError

# ggml type ids (ggml.h's enum ggml_type) and their names, for the ones decoded here.
F32, F16, Q4_0, Q4_1, Q8_0, BF16 = 0, 1, 2, 3, 8, 30
NAMES = {F32: "F32", F16: "F16", Q4_0: "Q4_0", Q4_1: "Q4_1", Q8_0: "Q8_0", BF16: "BF16"}
BLOCK = 32


def dequantize(raw: np.ndarray, ggml_type: int, shape: tuple[int, ...], type_name: str) -> Tensor:
    """The fp32 values of one tensor.

    Args:
        raw: its bytes as ``gguf.GGUFReader`` gives them (any shape; read, never written).
        ggml_type: how they are encoded.
        shape: the tensor's shape, outermost first (the reverse of ggml's ``ne``).
        type_name: the type's name, for the error.

    Returns:
        A new fp32 tensor of ``shape``.

    Raises:
        CheckpointError: a type this does not decode.
    """
    data = torch.from_numpy(np.ascontiguousarray(raw).view(np.uint8).reshape(-1).copy())
    if ggml_type == F32:
        values = data.view(torch.float32)
    elif ggml_type == F16:
        values = data.view(torch.float16).float()
    elif ggml_type == BF16:
        values = data.view(torch.bfloat16).float()
    elif ggml_type in _BLOCK_DECODERS:
        values = _BLOCK_DECODERS[ggml_type](data)
    else:
        supported = ", ".join(NAMES.values())
        raise CheckpointError(
            f"tensor type {type_name} is not supported; glassformer reads {supported}"
        )
    return values.reshape(shape)


def _fp16(blocks: Tensor, start: int) -> Tensor:
    """The fp16 number at byte ``start`` of each block, as fp32: (N, 1)."""
    return blocks[:, start : start + 2].contiguous().view(torch.float16).float()


def _nibbles(qs: Tensor) -> Tensor:
    """16 bytes a block → 32 values 0..15: the low nibbles, then the high ones. (N, 32)"""
    return torch.cat([qs & 0x0F, qs >> 4], dim=1).float()


def _q8_0(data: Tensor) -> Tensor:
    blocks = data.view(-1, 2 + BLOCK)  # (N, 34)
    d = _fp16(blocks, 0)
    q = blocks[:, 2:].contiguous().view(torch.int8).float()  # (N, 32)
    return (d * q).reshape(-1)


def _q4_0(data: Tensor) -> Tensor:
    blocks = data.view(-1, 2 + BLOCK // 2)  # (N, 18)
    d = _fp16(blocks, 0)
    q = _nibbles(blocks[:, 2:])  # (N, 32)
    return (d * (q - 8)).reshape(-1)


def _q4_1(data: Tensor) -> Tensor:
    blocks = data.view(-1, 4 + BLOCK // 2)  # (N, 20)
    d, m = _fp16(blocks, 0), _fp16(blocks, 2)
    q = _nibbles(blocks[:, 4:])  # (N, 32)
    return (d * q + m).reshape(-1)


_BLOCK_DECODERS = {Q4_0: _q4_0, Q4_1: _q4_1, Q8_0: _q8_0}
