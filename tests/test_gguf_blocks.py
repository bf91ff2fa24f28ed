"""glassformer.kernels.gguf_blocks: every block type llama.cpp's common files use decodes to
exactly the values of the ``gguf`` package's reference decoder (bit for bit), including the
K-quants of Q4_K_M and Q5_K_M files, which gguf cannot write (so the blocks are made here,
byte by byte)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

gguf = pytest.importorskip("gguf")

from glassformer.kernels.gguf_blocks import (  # noqa: E402
    BLOCK_BYTES,
    BLOCK_VALUES,
    NAMES,
    Q4_K,
    Q6_K,
    dequantize,
)

# where each type keeps its fp16 scales (and minimums): the rest of a block is any bytes
FP16_AT = {2: (0,), 3: (0, 2), 6: (0,), 7: (0, 2), 8: (0,), 12: (0, 2), 13: (0, 2), 14: (208,)}


def random_blocks(kind: int, rows: int, in_features: int, seed: int = 0) -> torch.Tensor:
    """(rows, bytes per row) uint8 of type ``kind``: random codes and scales, the fp16
    scales finite and small (|d| ~ 0.01, some negative, some subnormal)."""
    rng = np.random.default_rng(seed)
    per_row = in_features // BLOCK_VALUES[kind]
    raw = rng.integers(0, 256, (rows, per_row, BLOCK_BYTES[kind]), dtype=np.uint8)
    for at in FP16_AT[kind]:
        d = rng.normal(0, 0.01, (rows, per_row)).astype(np.float16)
        d[0, 0] = np.float16(3e-6)  # subnormal in fp16
        raw[:, :, at : at + 2] = d.view(np.uint8).reshape(rows, per_row, 2)
    return torch.from_numpy(raw.reshape(rows, -1).copy())


@pytest.mark.parametrize("kind", sorted(BLOCK_BYTES), ids=lambda k: NAMES[k])
def test_every_block_type_decodes_as_the_reference_bit_for_bit(kind):
    blocks = random_blocks(kind, 6, 512)
    ours = dequantize(blocks.numpy(), kind, (6, 512), NAMES[kind])
    theirs = gguf.quants.dequantize(blocks.numpy(), gguf.GGMLQuantizationType(kind))
    assert torch.equal(ours.view(torch.int32), torch.from_numpy(theirs).view(torch.int32))


def test_a_q4_k_block_made_by_hand():
    """d = 0.5, dmin = 0.25; sub-block 0 has scale 3 and min 2, sub-block 5 scale 37 (its low
    four bits in byte 9, its top two in byte 1) and min 40; value 0 is the low nibble of
    byte 0 of the codes, value 32 (sub-block 1) its high nibble."""
    block = np.zeros(144, np.uint8)
    block[0:2] = np.array([0.5], np.float16).view(np.uint8)
    block[2:4] = np.array([0.25], np.float16).view(np.uint8)
    block[4 + 0], block[4 + 4] = 3, 2  # sub-block 0: scale, min
    block[4 + 1] |= (37 >> 4) << 6  # sub-block 5's scale: top two bits
    block[4 + 5] |= (40 >> 4) << 6  # ... its min's top two bits
    block[4 + 9] = (37 & 15) | (40 & 15) << 4  # ... and their low four
    block[16 + 0] = 7 | 9 << 4  # value 0 = 7, value 32 = 9
    block[16 + 64 + 5] = 11 << 4  # value 2·64 + 32 + 5 = 165: sub-block 5, code 11
    values = dequantize(block, Q4_K, (256,), "Q4_K")
    assert values[0].item() == 0.5 * 3 * 7 - 0.25 * 2
    assert values[32].item() == 0.0  # sub-block 1: scale 0, min 0
    assert values[165].item() == 0.5 * 37 * 11 - 0.25 * 40
    assert values[160].item() == -0.25 * 40  # code 0 in sub-block 5: minus its min


def test_a_q6_k_block_made_by_hand():
    """Value 130 = 128 + 2: low nibble of byte 64 + 2, high bits 0-1 of byte 128 + 32 + 2,
    scale 8 (int8 −5); x = d · scale · (q − 32)."""
    block = np.zeros(210, np.uint8)
    block[208:210] = np.array([0.125], np.float16).view(np.uint8)
    block[192 + 8] = np.array([-5], np.int8).view(np.uint8)[0]
    block[64 + 2] = 13  # low nibble of value 130
    block[128 + 32 + 2] = 2  # its high two bits: q = 13 | 2 << 4 = 45
    values = dequantize(block, Q6_K, (256,), "Q6_K")
    assert values[130].item() == 0.125 * -5 * (45 - 32)
    assert values[131].item() == 0.125 * -5 * (0 - 32)
