"""GGUF rows interleaved 16 at a time, as ``csrc/gguf.c``'s products read them, and back.

For each 16 rows and block of 32 columns: the 16 rows' scales d (fp16), their mins m (Q4_1,
Q5_1), their fifth bits (Q5_0, Q5_1: a 32-bit word a row), then the values' bytes four at a
time: bytes 4j to 4j + 3 of rows 0 to 15, for each j. A 512-bit vector of them holds 16
rows, one per 32-bit lane, so 16 sums grow at once. ``GGUFLinear`` keeps a weight this way
in place of the file's layout; ``deinterleave`` gives the file's bytes back.
"""

from __future__ import annotations

import torch
from torch import Tensor

from glassformer.kernels.gguf_blocks import BLOCK_BYTES, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0

# The types whose rows interleave: the widths of the fields before a block's values (d, m,
# the fifth bits), in bytes
INTERLEAVED = {Q4_0: (2,), Q4_1: (2, 2), Q5_0: (2, 4), Q5_1: (2, 2, 4), Q8_0: (2,)}


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
    if in_place and blocks.is_contiguous():
        for first in range(0, len(blocks), 16 * CHUNK):
            rows = blocks[first : first + 16 * CHUNK]
            rows.copy_(interleave(kind, rows).view(rows.shape))
        return blocks.view(len(blocks) // 16, -1, 16 * BLOCK_BYTES[kind])
    rows, row_bytes = blocks.shape
    size = BLOCK_BYTES[kind]
    b = blocks.view(rows // 16, 16, row_bytes // size, size).transpose(1, 2)
    out = torch.empty(b.shape[:2] + (16 * size,), dtype=torch.uint8)  # each field copied in
    at = 0  # (no temporary copies: a 49,152-row head is 30 MiB at Q8_0)
    for width in INTERLEAVED[kind]:  # (groups, blocks, 16 rows, width)
        out[..., 16 * at : 16 * (at + width)].unflatten(-1, (16, width)).copy_(
            b[..., at : at + width]
        )
        at += width
    values = b[..., at:].unflatten(-1, (-1, 4)).transpose(2, 3)  # (.., bytes / 4, 16 rows, 4)
    out[..., 16 * at :].unflatten(-1, values.shape[2:]).copy_(values)
    return out


def deinterleave(kind: int, packed: Tensor, which: Tensor | None = None) -> Tensor:
    """``interleave`` undone: (groups, blocks per row, 16 · bytes per block) → the rows'
    blocks as the file lays them out, (16 · groups, bytes per row); ``which`` (groups,):
    only row ``which[g]`` of each group g, (groups, bytes per row)."""
    groups, per_row, _ = packed.shape
    fields, at = [], 0
    for width in INTERLEAVED[kind]:  # (groups, blocks, 16 rows, width)
        fields.append(packed[..., at : at + 16 * width].unflatten(-1, (16, width)))
        at += 16 * width
    values = packed[..., at:].unflatten(-1, (-1, 16, 4)).transpose(-3, -2)
    fields.append(values.flatten(-2))  # (groups, blocks, 16 rows, value bytes)
    rows = torch.cat(fields, dim=-1)  # (groups, blocks, 16 rows, bytes per block)
    if which is not None:
        return rows[torch.arange(groups), :, which].reshape(groups, -1)
    return rows.transpose(1, 2).reshape(16 * groups, -1)
