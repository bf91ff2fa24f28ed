"""ggml's tensor encodings, decoded to fp32: F32, F16, BF16, the block formats Q4_0, Q4_1,
Q5_0, Q5_1 and Q8_0, and the K-quants Q4_K, Q5_K and Q6_K (the common Q4_K_M and Q5_K_M
files are made of these).

A block format cuts each row into blocks of 32 numbers and stores, per block, an fp16 scale
``d`` (and for Q4_1 an fp16 minimum ``m``) followed by the 32 quantised values:

    Q8_0  34 bytes: d, then 32 int8 q            x = d · q
    Q4_0  18 bytes: d, then 16 bytes of nibbles  x = d · (q − 8)
    Q4_1  20 bytes: d, m, then 16 bytes          x = d · q + m
    Q5_0  22 bytes: d, 4 bytes of fifth bits, 16 bytes of nibbles   x = d · (q − 16)
    Q5_1  24 bytes: d, m, 4 bytes of fifth bits, 16 bytes          x = d · q + m

In the 4- and 5-bit formats byte j holds value j in its low nibble and value j + 16 in its
high one; value i's fifth bit is bit i of the little-endian 32-bit word before them.

A K-quant cuts rows into super-blocks of 256, each of sub-blocks with their own small integer
scales, themselves scaled by the super-block's fp16 ``d`` (and ``dmin``):

    Q4_K  144 bytes: d, dmin, 12 bytes of 6-bit (scale, min) for 8 sub-blocks of 32,
          128 bytes of nibbles                   x = d·sc · q − dmin·mn,  q in 0..15
    Q5_K  176 bytes: as Q4_K, and 32 bytes holding each value's fifth bit
                                                 x = d·sc · q − dmin·mn,  q in 0..31
    Q6_K  210 bytes: 128 bytes of low nibbles, 64 of high bit pairs, 16 int8 scales of
          sub-blocks of 16, d                    x = d·sc · (q − 32),    q in 0..63

The arithmetic follows the ``gguf`` package's reference decoder operation for operation (in
fp32), so the values are equal bit for bit (``tests/test_gguf.py``).
"""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor

from glassformer.errors import CheckpointError

# ggml type ids (ggml.h's enum ggml_type) and their names, for the ones decoded here.
F32, F16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K, Q6_K, BF16 = (
    0,
    1,
    2,
    3,
    6,
    7,
    8,
    12,
    13,
    14,
    30,
)
NAMES = {
    F32: "F32",
    F16: "F16",
    Q4_0: "Q4_0",
    Q4_1: "Q4_1",
    Q5_0: "Q5_0",
    Q5_1: "Q5_1",
    Q8_0: "Q8_0",
    Q4_K: "Q4_K",
    Q5_K: "Q5_K",
    Q6_K: "Q6_K",
    BF16: "BF16",
}
BLOCK = 32
SUPER = 256  # a K-quant's super-block
# bytes per block and values per block of each block format
BLOCK_BYTES = {Q4_0: 18, Q4_1: 20, Q5_0: 22, Q5_1: 24, Q8_0: 34, Q4_K: 144, Q5_K: 176, Q6_K: 210}
BLOCK_VALUES = {t: SUPER if t in (Q4_K, Q5_K, Q6_K) else BLOCK for t in BLOCK_BYTES}


def dequantize(
    raw: np.ndarray | Tensor, ggml_type: int, shape: tuple[int, ...], type_name: str
) -> Tensor:
    """The fp32 values of one tensor.

    Args:
        raw: its bytes, a uint8 tensor (any shape; read, never written) or a numpy array
            (copied first: it may be a read-only memory map).
        ggml_type: how they are encoded.
        shape: the tensor's shape, outermost first (the reverse of ggml's ``ne``).
        type_name: the type's name, for the error.

    Returns:
        A new fp32 tensor of ``shape``.

    Raises:
        CheckpointError: a type this does not decode.
    """
    if isinstance(raw, Tensor):  # read, not copied: every decoder below makes a new tensor
        data = raw.contiguous().view(torch.uint8).reshape(-1)
    else:  # (a read-only memory map, say)
        data = torch.from_numpy(np.ascontiguousarray(raw).view(np.uint8).reshape(-1).copy())
    if ggml_type == F32:
        values = data.view(torch.float32).clone()
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
    return q.mul_(d).reshape(-1)  # in place: a table's decoding peaks at twice its size


def _q4_0(data: Tensor) -> Tensor:
    blocks = data.view(-1, 2 + BLOCK // 2)  # (N, 18)
    d = _fp16(blocks, 0)
    q = _nibbles(blocks[:, 2:])  # (N, 32)
    return q.sub_(8).mul_(d).reshape(-1)


def _q4_1(data: Tensor) -> Tensor:
    blocks = data.view(-1, 4 + BLOCK // 2)  # (N, 20)
    d, m = _fp16(blocks, 0), _fp16(blocks, 2)
    q = _nibbles(blocks[:, 4:])  # (N, 32)
    return q.mul_(d).add_(m).reshape(-1)


def _fifth_bits(blocks: Tensor, start: int) -> Tensor:
    """The 32 fifth bits of the little-endian word at byte ``start``, value i's as bit i,
    shifted into place (16 or 0): (N, 32) uint8."""
    word = blocks[:, start : start + 4].to(torch.int64)
    word = word[:, 0] | word[:, 1] << 8 | word[:, 2] << 16 | word[:, 3] << 24  # (N,)
    bits = (word[:, None] >> torch.arange(32)) & 1
    return (bits << 4).to(torch.uint8)


def _q5_0(data: Tensor) -> Tensor:
    blocks = data.view(-1, BLOCK_BYTES[Q5_0])  # (N, 22)
    d = _fp16(blocks, 0)
    q = torch.cat([blocks[:, 6:] & 0x0F, blocks[:, 6:] >> 4], dim=1) | _fifth_bits(blocks, 2)
    return (d * (q.to(torch.int8) - 16).float()).reshape(-1)


def _q5_1(data: Tensor) -> Tensor:
    blocks = data.view(-1, BLOCK_BYTES[Q5_1])  # (N, 24)
    d, m = _fp16(blocks, 0), _fp16(blocks, 2)
    q = torch.cat([blocks[:, 8:] & 0x0F, blocks[:, 8:] >> 4], dim=1) | _fifth_bits(blocks, 4)
    return (d * q.float() + m).reshape(-1)


def _k_scales(packed: Tensor) -> tuple[Tensor, Tensor]:
    """Q4_K's and Q5_K's 12 bytes → 8 six-bit scales and 8 six-bit mins, each (N, 8).

    Bytes 0-3 hold scales 0-3 in their low six bits, bytes 4-7 mins 0-3; bytes 8-11 hold
    the low four bits of scales 4-7 (low nibble) and mins 4-7 (high nibble), whose top two
    bits are the top bits of bytes 0-3 (scales) and 4-7 (mins)."""
    low, high, mixed = packed[:, 0:4], packed[:, 4:8], packed[:, 8:12]
    scales = torch.cat([low & 0x3F, (mixed & 0x0F) | ((low >> 2) & 0x30)], dim=1)
    mins = torch.cat([high & 0x3F, (mixed >> 4) | ((high >> 2) & 0x30)], dim=1)
    return scales.float(), mins.float()


def _bits(packed: Tensor, shifts: tuple[int, ...], mask: int, width: int) -> Tensor:
    """Each byte's fields at ``shifts`` (``mask`` wide), the first field of every byte in a
    run of ``width`` bytes first: (N, bytes) → (N, len(shifts) · bytes), as uint8."""
    n = packed.shape[0]
    runs = packed.reshape(n, -1, 1, width)
    fields = torch.stack([(runs[:, :, 0] >> s) & mask for s in shifts], dim=2)
    return fields.reshape(n, -1)


def _k4_or_5(blocks: Tensor, fifth_bits: bool) -> Tensor:
    n = blocks.shape[0]
    d, dmin = _fp16(blocks, 0), _fp16(blocks, 2)
    sc, mn = _k_scales(blocks[:, 4:16])
    scale = (d * sc).reshape(n, -1, 1)  # (N, 8, 1)
    low = blocks[:, 48:] if fifth_bits else blocks[:, 16:]
    q = _bits(low, (0, 4), 0x0F, BLOCK)  # sub-block 2j: low nibbles of bytes 32j.., 2j+1: high
    if fifth_bits:  # sub-block i's fifth bits: bit i of the 32 bytes after the scales
        q = q | (_bits(blocks[:, 16:48], tuple(range(8)), 0x01, BLOCK) << 4)
    q = q.reshape(n, -1, BLOCK).float()
    return (scale * q - (dmin * mn).reshape(n, -1, 1)).reshape(-1)


def _q4_k(data: Tensor) -> Tensor:
    return _k4_or_5(data.view(-1, BLOCK_BYTES[Q4_K]), fifth_bits=False)


def _q5_k(data: Tensor) -> Tensor:
    return _k4_or_5(data.view(-1, BLOCK_BYTES[Q5_K]), fifth_bits=True)


def _q6_k(data: Tensor) -> Tensor:
    blocks = data.view(-1, BLOCK_BYTES[Q6_K])
    n = blocks.shape[0]
    low = _bits(blocks[:, :128], (0, 4), 0x0F, 64)  # (N, 256)
    high = _bits(blocks[:, 128:192], (0, 2, 4, 6), 0x03, BLOCK)  # (N, 256)
    q = ((low | (high << 4)).view(torch.int8) - 32).reshape(n, SUPER // 16, 16).float()
    sc = blocks[:, 192:208].contiguous().view(torch.int8).float()
    scale = (_fp16(blocks, 208) * sc).reshape(n, SUPER // 16, 1)
    return (scale * q).reshape(-1)


_BLOCK_DECODERS = {
    Q4_0: _q4_0,
    Q4_1: _q4_1,
    Q5_0: _q5_0,
    Q5_1: _q5_1,
    Q8_0: _q8_0,
    Q4_K: _q4_k,
    Q5_K: _q5_k,
    Q6_K: _q6_k,
}
