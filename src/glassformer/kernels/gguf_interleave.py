"""GGUF rows interleaved 16 at a time, as ``csrc/gguf.c``'s products read them, and back.

For each 16 rows and block of 32 columns: the 16 rows' scales d (fp16), their mins m (Q4_1,
Q5_1), their fifth bits (Q5_0, Q5_1: a 32-bit word a row, regrouped: column 4m + n's bit
at bit 8n + m, so one shift puts the bits of the four columns a value byte holds at bit 4 of
each byte), then the values' bytes four at a time: bytes 4j to 4j + 3 of rows 0 to 15, for
each j. A 512-bit vector of them holds 16 rows, one per 32-bit lane, so 16 sums grow at
once. ``GGUFLinear`` keeps a weight this way in place of the file's layout;
``deinterleave`` gives the file's bytes back.

Q4_K, per 16 rows and super-block of 256 columns: the rows' d, their dmin, their eight
sub-blocks' 6-bit scales and mins each unpacked to a byte (sub-block by sub-block, 16 rows
each: 32 bytes more than the 12 packed bytes a row, +2.8%), then the nibbles as above, four
bytes of each row in turn. Unpacked, a sub-block's 16 scales are one load away. Q6_K, the
same bytes moved: the rows' d, their 16 int8 scales scale by scale, then their low nibbles'
128 bytes and their high bit pairs' 64, four bytes of each row in turn.
"""

from __future__ import annotations

import torch
from torch import Tensor

from glassformer.kernels.gguf_blocks import (
    BLOCK_BYTES,
    Q4_0,
    Q4_1,
    Q4_K,
    Q5_0,
    Q5_1,
    Q6_K,
    Q8_0,
)

# The 32-value types whose rows interleave: the fields before a block's values (d, m, the
# fifth bits) and their widths in bytes
D, M, FIFTH = ("d", 2), ("m", 2), ("fifth", 4)
FIELDS = {Q4_0: (D,), Q4_1: (D, M), Q5_0: (D, FIFTH), Q5_1: (D, M, FIFTH), Q8_0: (D,)}
INTERLEAVED = (*FIELDS, Q4_K, Q6_K)  # every type whose rows interleave
K4_BYTES = 2368  # 16 rows of one Q4_K super-block: 32 d, 32 dmin, 128 scales, 128 mins, 2048


def group_bytes(kind: int) -> int:
    """The bytes of 16 rows' block (a K-quant's super-block), interleaved."""
    return K4_BYTES if kind == Q4_K else 16 * BLOCK_BYTES[kind]


CHUNK = 256  # groups of 16 rows rearranged at a time in place


def interleave(kind: int, blocks: Tensor, in_place: bool = False) -> Tensor:
    """Rows of Q4_0, Q4_1, Q5_0, Q5_1 or Q8_0 blocks (rows, bytes per row), 16 rows side by
    side, as ``csrc/gguf.c``'s ``sixteen_rows`` reads them: for each 16 rows and block of 32
    columns, the rows' scales (fp16), mins (Q4_1, Q5_1), fifth bits (Q5: a word each), then
    bytes 4j to 4j + 3 of the 16 rows' values, for each j.
    The same bytes, moved: (rows / 16, blocks per row, 16 * bytes per block).

    ``in_place`` (``blocks`` contiguous, and read by nothing else): a group's 16 rows take the
    same bytes interleaved as laid out, so the rows are rearranged in their own memory,
    ``CHUNK`` groups at a time, and the result is a view of ``blocks``: loading needs no
    second copy of the weight."""
    if kind == Q4_K:  # larger interleaved (its scales unpacked): never in place
        return _interleave_k4(blocks)
    if in_place and blocks.is_contiguous() and len(blocks):
        for first in range(0, len(blocks), 16 * CHUNK):
            chunk = blocks[first : first + 16 * CHUNK]
            chunk.copy_(interleave(kind, chunk).view(chunk.shape))
        return blocks.view(len(blocks) // 16, -1, 16 * BLOCK_BYTES[kind])
    if kind == Q6_K:
        return _interleave_k6(blocks)
    rows, row_bytes = blocks.shape
    size = BLOCK_BYTES[kind]
    b = blocks.view(rows // 16, 16, row_bytes // size, size).transpose(1, 2)
    out = blocks.new_empty(b.shape[:2] + (16 * size,))  # each field copied in
    at = 0  # (no copy of the whole: a 49,152-row head is 30 MiB at Q8_0; Q5's fifth bits
    # alone pass through int64 words, 8 bytes each of 4: in place, a chunk at a time)
    for field, width in FIELDS[kind]:
        out[..., 16 * at : 16 * (at + width)].unflatten(-1, (16, width)).copy_(
            _regrouped(b[..., at : at + width]) if field == "fifth" else b[..., at : at + width]
        )  # (groups, blocks, 16 rows, width)
        at += width
    values = b[..., at:].unflatten(-1, (-1, 4)).transpose(2, 3)  # (.., bytes / 4, 16 rows, 4)
    out[..., 16 * at :].unflatten(-1, values.shape[2:]).copy_(values)
    return out


def deinterleave(kind: int, packed: Tensor, which: Tensor | None = None) -> Tensor:
    """``interleave`` undone: (groups, blocks per row, 16 · bytes per block) → the rows'
    blocks as the file lays them out, (16 · groups, bytes per row); ``which`` (groups,):
    only row ``which[g]`` of each group g, (groups, bytes per row)."""
    groups, per_row, _ = packed.shape
    if kind in (Q4_K, Q6_K):
        rows = _deinterleave_k4(packed) if kind == Q4_K else _deinterleave_k6(packed)
    else:
        fields, at = [], 0
        for field, width in FIELDS[kind]:
            read = packed[..., at : at + 16 * width].unflatten(-1, (16, width))
            fields.append(_regrouped(read, back=True) if field == "fifth" else read)
            at += 16 * width  # (groups, blocks, 16 rows, width)
        values = packed[..., at:].unflatten(-1, (-1, 16, 4)).transpose(-3, -2)
        fields.append(values.flatten(-2))  # (groups, blocks, 16 rows, value bytes)
        rows = torch.cat(fields, dim=-1)  # (groups, blocks, 16 rows, bytes per block)
    if which is not None:
        return rows[torch.arange(groups), :, which].reshape(groups, -1)
    return rows.transpose(1, 2).reshape(16 * groups, -1)


def _bit_moves() -> tuple[Tensor, Tensor]:
    """Column i's fifth bit (bit i of the file's word) goes to bit 8 (i % 4) + i // 4: a table
    of each byte's bits moved, (4 bytes, 256 values) → the word they make, and back."""
    moved, back = torch.zeros(4, 256, dtype=torch.int64), torch.zeros(4, 256, dtype=torch.int64)
    values = torch.arange(256)
    for bit in range(32):
        to = 8 * (bit % 4) + bit // 4
        moved[bit // 8] |= ((values >> (bit % 8)) & 1) << to
        back[to // 8] |= ((values >> (to % 8)) & 1) << bit
    return moved, back


_MOVES = _bit_moves()


def _regrouped(words: Tensor, back: bool = False) -> Tensor:
    """Fifth-bit words (..., 4 bytes, little-endian) regrouped as ``csrc/gguf.c`` reads them
    (``back``: the file's order again)."""
    table = _MOVES[1 if back else 0].to(words.device)
    word = table[0, words[..., 0].long()]
    for byte in range(1, 4):  # each byte's bits land apart: adding is or-ing
        word = word + table[byte, words[..., byte].long()]
    shifts = torch.arange(0, 32, 8, device=words.device)
    return ((word.unsqueeze(-1) >> shifts) & 255).to(torch.uint8)


def _interleave_k4(blocks: Tensor) -> Tensor:
    """Q4_K rows (rows, 144 bytes per super-block) → (rows / 16, super-blocks, K4_BYTES)."""
    rows, row_bytes = blocks.shape
    b = blocks.view(rows // 16, 16, row_bytes // 144, 144).transpose(1, 2)  # (G, n, 16, 144)
    scales, mins = _k4_unpacked(b[..., 4:16])  # (G, n, 16 rows, 8 sub-blocks) each
    values = b[..., 16:].unflatten(-1, (4, 8, 4)).permute(0, 1, 3, 4, 2, 5)  # (.., 8, 16, 4)
    fields = [b[..., 0:2], b[..., 2:4], scales.transpose(2, 3), mins.transpose(2, 3), values]
    return torch.cat([f.reshape(*b.shape[:2], -1) for f in fields], dim=2)


def _deinterleave_k4(packed: Tensor) -> Tensor:
    """``_interleave_k4`` undone: (groups, super-blocks, 16 rows, 144 bytes)."""
    d, dmin = (packed[..., at : at + 32].unflatten(-1, (16, 2)) for at in (0, 32))
    scales, mins = (packed[..., at : at + 128].unflatten(-1, (8, 16)).mT for at in (64, 192))
    values = packed[..., 320:].unflatten(-1, (4, 8, 16, 4)).permute(0, 1, 4, 2, 3, 5)
    return torch.cat([d, dmin, _k4_packed(scales, mins), values.flatten(-3)], dim=-1)


def _k4_unpacked(s: Tensor) -> tuple[Tensor, Tensor]:
    """A Q4_K super-block's 12 bytes → its 8 sub-blocks' 6-bit scales and mins, a byte each
    (as ``csrc/gguf.c``'s ``scale_min`` reads them)."""
    low, middle, high = s[..., 0:4], s[..., 4:8], s[..., 8:12]
    scales = torch.cat([low & 63, (high & 15) | ((low >> 6) << 4)], dim=-1)
    mins = torch.cat([middle & 63, (high >> 4) | ((middle >> 6) << 4)], dim=-1)
    return scales, mins


def _k4_packed(scales: Tensor, mins: Tensor) -> Tensor:
    """``_k4_unpacked`` undone: every bit of the 12 bytes is one of a scale's or a min's."""
    first, last = scales[..., :4], scales[..., 4:]
    low = first | ((last >> 4) << 6)
    middle = mins[..., :4] | ((mins[..., 4:] >> 4) << 6)
    high = (last & 15) | ((mins[..., 4:] & 15) << 4)
    return torch.cat([low, middle, high], dim=-1)


def _interleave_k6(blocks: Tensor) -> Tensor:
    """Q6_K rows (rows, 210 bytes per super-block) → (rows / 16, super-blocks, 3,360)."""
    rows, row_bytes = blocks.shape
    b = blocks.view(rows // 16, 16, row_bytes // 210, 210).transpose(1, 2)  # (G, n, 16, 210)
    low, high = (
        b[..., a:z].unflatten(-1, (-1, 4)).transpose(2, 3) for a, z in ((0, 128), (128, 192))
    )
    fields = [b[..., 208:210], b[..., 192:208].transpose(2, 3), low, high]
    return torch.cat([f.reshape(*b.shape[:2], -1) for f in fields], dim=2)


def _deinterleave_k6(packed: Tensor) -> Tensor:
    """``_interleave_k6`` undone: (groups, super-blocks, 16 rows, 210 bytes)."""
    d = packed[..., 0:32].unflatten(-1, (16, 2))
    scales = packed[..., 32:288].unflatten(-1, (16, 16)).mT
    low, high = (packed[..., a:z].unflatten(-1, (-1, 16, 4)).transpose(-3, -2).flatten(-2)
                 for a, z in ((288, 2336), (2336, 3360)))  # fmt: skip
    return torch.cat([low, high, scales, d], dim=-1)
