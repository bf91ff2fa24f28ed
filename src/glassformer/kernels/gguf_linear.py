"""Layers that compute from a GGUF file's own blocks: no second quantisation.

A llama.cpp file stores each weight row as blocks (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K,
Q6_K: ``glassformer.kernels.gguf_blocks``). ``GGUFLinear`` keeps those bytes as the file has
them and multiplies by the values they decode to, so a packaged 4-bit model runs at its own
quality. ``GGUFEmbedding`` looks token rows up in the same blocks (a tied head and embedding
share them).

Two paths, equal to each other (``tests/test_gguf_linear.py``):

- the readable one: decode the blocks to fp32 (``dequantized()``, PyTorch code equal to the
  gguf package's decoder bit for bit) and call ``F.linear``;
- the fast one: ``csrc/gguf.c``, compiled on first use with the machine's C compiler into the
  cache folder and loaded with ``ctypes``. A decoding step's rows (up to ``FEW_ROWS``) are
  multiplied from a copy of the rows interleaved 16 at a time (``interleave``: Q4_0, Q4_1,
  Q8_0; rounded, Q5_0 and Q5_1 too), 16 rows' sums at once; a few rows (a short prompt, other types)
  straight from the blocks, block by block, in fp32 (AVX-512 where the compiler targets it,
  OpenMP threads over the rows); many rows (a prompt) decode the weight once, in C, and use
  PyTorch's fp32 matrix product. Where no compiler is found the readable path runs, with one
  warning.

``rounded`` (the dtype ``"gguf-q8"``) trades exactness for speed, much as llama.cpp does: every
product's input is rounded to 8 bits, 32 values to a scale (``rounded_to_8_bits``); a
decoding step's then multiply the interleaved rows in integers (AVX-512 VNNI).

Shapes: N output features, K input features, M rows of input.

    >>> layer = GGUFLinear([(Q8_0, blocks)], in_features=576)     # doctest: +SKIP
    >>> layer(torch.randn(1, 576)).shape                          # doctest: +SKIP
    torch.Size([1, 1536])
"""

from __future__ import annotations

import ctypes
from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from glassformer.kernels.gguf_blocks import (
    BLOCK_BYTES,
    BLOCK_VALUES,
    NAMES,
    Q4_0,
    Q4_1,
    Q5_0,
    Q5_1,
    Q8_0,
    dequantize,
)
from glassformer.kernels.gguf_kernels import FLAGS, SOURCE, kernels, ready  # noqa: F401
from glassformer.kernels.quantized import DecodedWeight

# From this many input rows on, the weight is decoded and multiplied by PyTorch's fp32 GEMM,
# TILE rows of it at a time (a small buffer, used again: decoding a 49,152-row head whole
# took 113 MB, which glibc then kept); below, the rows are multiplied straight from the
# blocks, four at a time per decoded block (SmolLM2, 2-core Intel Xeon, a forward of 27 rows:
# 67 ms from the blocks, 131 decoded; 64 rows 145 and 163; 128 rows 283 and 198).
MANY_ROWS = 72
TILE = 1024
# Up to this many input rows (a decoding step's), the weight's rows are read interleaved 16
# at a time where its types allow (``interleave``).
FEW_ROWS = 4
# The types whose rows interleave: the widths of the fields before a block's values (d, m,
# the fifth bits), in bytes
INTERLEAVED = {Q4_0: (2,), Q4_1: (2, 2), Q5_0: (2, 4), Q5_1: (2, 2, 4), Q8_0: (2,)}
COMPUTED = tuple(BLOCK_BYTES)  # the block types these layers hold

Part = tuple[int, Tensor]  # (ggml type, its rows' blocks: (rows, bytes per row) uint8)


class GGUFLinear(DecodedWeight):
    """``nn.Linear`` whose weight is GGUF blocks: one or more parts of stacked rows (a fused
    q/k/v projection whose three tensors have different types has three parts).

    Where every part is Q4_0, Q4_1 or Q8_0 (and, ``rounded``, Q5_0 or Q5_1) of a multiple of
    16 rows and the C library is built, the layer also keeps them interleaved (``packed()``)
    for a decoding step's few rows. ``rounded``: the input is rounded to 8 bits first
    (``for_inference("gguf-q8")``), whichever path computes."""

    blocks0: Tensor  # the first part's blocks (blocks1, ... the others')
    bias: Tensor | None

    def __init__(
        self,
        parts: Sequence[Part],
        in_features: int,
        bias: Tensor | None = None,
        rounded: bool = False,
    ):
        super().__init__()
        if not parts:
            raise ValueError("a GGUFLinear needs at least one part")
        for kind, blocks in parts:
            _check_part(kind, blocks, in_features)
        self.in_features, self.rounded = in_features, rounded
        self.types = tuple(int(kind) for kind, _ in parts)
        self.rows = tuple(int(blocks.shape[0]) for _, blocks in parts)
        self.out_features = sum(self.rows)
        for i, (_, blocks) in enumerate(parts):
            self.register_buffer(f"blocks{i}", blocks, persistent=False)
        self.register_buffer("bias", bias)
        self.fast = kernels() is not None  # built now: not while a graph is being traced
        # Q5 rows pay interleaved only in integers: exact, their fifth bits cost as much as
        # the rows save (SmolLM2's Q4_K_M file, a step's products: 8.25 ms against 8.15)
        kinds = set(INTERLEAVED) - (set() if rounded else {Q5_0, Q5_1})
        self.interleaved = self.fast and all(
            kind in kinds and len(blocks) % 16 == 0 for kind, blocks in parts
        )
        for i, (kind, blocks) in enumerate(parts if self.interleaved else []):
            self.register_buffer(f"packed{i}", interleave(kind, blocks), persistent=False)
        self._arguments: Calls | None = None  # the C calls' arrays, made once

    def parts(self) -> list[Part]:
        return [(kind, self.get_buffer(f"blocks{i}")) for i, kind in enumerate(self.types)]

    def __getstate__(self) -> dict:
        """Without the C call's arrays (pointers: not picklable), so the layer deep-copies
        and pickles; they are made again at the next call."""
        return {**self.__dict__, "_arguments": None}

    def drop_interleaved(self) -> None:
        """Free the interleaved copy (a layer whose product another layer makes: the gate and
        up projections once fused), which then multiplies from the blocks alone."""
        for i in range(len(self.types) if self.interleaved else 0):
            delattr(self, f"packed{i}")
        self.interleaved, self._arguments = False, None

    def packed(self) -> list[Tensor]:
        """The parts' rows interleaved 16 at a time (``interleave``), or [] where not."""
        if not self.interleaved:
            return []
        return [self.get_buffer(f"packed{i}") for i in range(len(self.types))]

    def dequantized(self) -> Tensor:
        """The weight this layer multiplies by, (N, K) fp32: the readable decoder's values."""
        return torch.cat(
            [
                dequantize(blocks, kind, (blocks.shape[0], self.in_features), NAMES[kind])
                for kind, blocks in self.parts()
            ]
        )

    def forward(self, x: Tensor) -> Tensor:
        if x.device.type == "cpu" and self.fast:
            flat = x.reshape(-1, self.in_features).float().contiguous()
            if torch.compiler.is_compiling():  # a custom operator: one node of the graph
                y = gguf_linear(flat, self.parts(), self.out_features, self.packed(), self.rounded)
            else:  # called straight: the operator's dispatch costs more than a small product
                if self._arguments is None or self._arguments[0][2][0] != self.blocks0.data_ptr():
                    self._arguments = (
                        _arguments(self.parts()),
                        _interleaved(self.types, self.packed()),
                    )
                blocks, packed = self._arguments
                y = _compute(flat, blocks, packed, self.out_features, self.rounded)
            y = y.view(*x.shape[:-1], self.out_features).to(x.dtype)
        else:
            x = rounded_to_8_bits(x) if self.rounded else x
            y = F.linear(x, self.dequantized().to(x.dtype, copy=False))
        return y if self.bias is None else y + self.bias.to(y.dtype)

    def forward_rows(self, x: Tensor, start: int, stop: int) -> Tensor:
        """Output features ``start:stop`` (all are computed, then cut)."""
        return self(x)[..., start:stop]

    def extra_repr(self) -> str:
        kinds = "+".join(NAMES[kind] for kind in self.types)
        rounded = ", input rounded to 8 bits" if self.rounded else ""
        return f"in_features={self.in_features}, out_features={self.out_features}, {kinds}{rounded}"


class GGUFEmbedding(nn.Module):
    """Token ids → the decoded rows of a GGUF token table (B, T) → (B, T, D), scaled by
    ``scale``; ``num_embeddings`` and ``embedding_dim`` as ``nn.Embedding`` has them."""

    blocks: Tensor

    def __init__(self, part: Part, embedding_dim: int, scale: float = 1.0) -> None:
        super().__init__()
        kind, blocks = part
        _check_part(kind, blocks, embedding_dim)
        self.kind, self.embedding_dim, self.scale = int(kind), embedding_dim, scale
        self.num_embeddings = int(blocks.shape[0])
        self.register_buffer("blocks", blocks, persistent=False)

    @property
    def weight(self) -> Tensor:
        """The whole table decoded, (V, D) fp32 (for tools that read it; decoding does not)."""
        return dequantize(self.blocks, self.kind, (self.num_embeddings, self.embedding_dim), "")

    def forward(self, ids: Tensor) -> Tensor:
        if not torch.compiler.is_compiling():
            outside = (ids < 0) | (ids >= self.num_embeddings)
            if outside.any():
                bad = ids[outside][0].item()
                raise ValueError(
                    f"token id {bad} is outside the vocabulary [0, {self.num_embeddings})"
                )
        rows = self.blocks.index_select(0, ids.reshape(-1))
        x = dequantize(rows, self.kind, (*ids.shape, self.embedding_dim), NAMES[self.kind])
        return x * self.scale if self.scale != 1.0 else x

    def extra_repr(self) -> str:
        return f"{self.num_embeddings}, {self.embedding_dim}, {NAMES[self.kind]}"


def _check_part(kind: int, blocks: Tensor, in_features: int) -> None:
    if kind not in COMPUTED:
        raise ValueError(
            f"GGUF type {NAMES.get(kind, kind)} is not computed from its blocks; "
            f"these are: {', '.join(NAMES[k] for k in COMPUTED)}"
        )
    per_row = in_features // BLOCK_VALUES[kind] * BLOCK_BYTES[kind]
    if (
        blocks.dtype != torch.uint8
        or blocks.dim() != 2
        or in_features % BLOCK_VALUES[kind]
        or blocks.shape[1] != per_row
    ):
        raise ValueError(
            f"{NAMES[kind]} blocks for {in_features} input features must be (rows, {per_row}) "
            f"uint8, got {blocks.dtype} {tuple(blocks.shape)}"
        )


def _arguments(parts: Sequence[Part], rows_each: int = 1) -> tuple:
    """The C call's arrays for ``parts``: their count, types, addresses and rows (an entry of
    an interleaved copy holds 16: ``rows_each``)."""
    n = len(parts)
    return (
        n,
        (ctypes.c_int * n)(*[kind for kind, _ in parts]),
        (ctypes.c_void_p * n)(*[blocks.data_ptr() for _, blocks in parts]),
        (ctypes.c_int64 * n)(*[rows_each * blocks.shape[0] for _, blocks in parts]),
    )


def _interleaved(types: Sequence[int], packed: Sequence[Tensor]) -> tuple | None:
    """``_arguments`` of a layer's interleaved copies, or None where it has none."""
    return _arguments(list(zip(types, packed, strict=True)), 16) if packed else None


def interleave(kind: int, blocks: Tensor) -> Tensor:
    """Rows of Q4_0, Q4_1, Q5_0, Q5_1 or Q8_0 blocks (rows, bytes per row), 16 rows side by
    side, as ``csrc/gguf.c``'s ``sixteen_rows`` reads them: for each 16 rows and block of 32
    columns, the rows' scales (fp16), mins (Q4_1, Q5_1), fifth bits (Q5: a word each), then
    bytes 4j to 4j + 3 of the 16 rows' values, for each j.
    The same bytes, moved: (rows / 16, blocks per row, 16 * bytes per block)."""
    rows, row_bytes = blocks.shape
    per_row = row_bytes // BLOCK_BYTES[kind]
    b = blocks.view(rows // 16, 16, per_row, BLOCK_BYTES[kind]).transpose(1, 2)
    widths = INTERLEAVED[kind]  # (groups, blocks, 16 rows, bytes), cut into its fields:
    ends = torch.tensor(widths).cumsum(0).tolist()
    fields = [b[..., end - width : end] for width, end in zip(widths, ends, strict=True)]
    values = b[..., ends[-1] :].unflatten(-1, (-1, 4))  # (.., 16 rows, bytes / 4, 4)
    fields.append(values.transpose(2, 3))  # four bytes of each of the 16 rows, in turn
    return torch.cat([f.reshape(rows // 16, per_row, -1) for f in fields], dim=2).contiguous()


def rounded_to_8_bits(x: Tensor) -> Tensor:
    """``x`` as ``rounded`` products see it: each 32 values of a row rounded to 8 bits with
    their own scale, d = max|x| / 127, x ≈ d · round(x · (1 / d)), ties to even (what
    ``csrc/gguf.c``'s ``round_to_8_bits`` computes; llama.cpp's Q8_0 rounding of a
    product's input, whose d is then also rounded to fp16 and ties go away from zero)."""
    blocks = x.float().unflatten(-1, (-1, 32))
    d = blocks.abs().amax(-1, keepdim=True) / 127  # NaN where the block holds one
    inverse = 1 / d  # 0 where not finite: zeros, and blocks too small for 1 / d
    inverse = torch.where((d != 0) & inverse.isfinite(), inverse, torch.zeros_like(d))
    return (torch.round(blocks * inverse) * d).flatten(-2).to(x.dtype)


def _compute(
    x: Tensor, args: tuple, packed: tuple | None, out_features: int, rounded: bool = False
) -> Tensor:
    """(M, K) fp32 times the weight of the parts of ``args`` transposed → (M, N): for a
    step's rows from the rows interleaved (``packed``, where there are; ``rounded``: x
    rounded to 8 bits first), for a few rows straight from the blocks in C, for many
    decoded in C then PyTorch's GEMM."""
    lib = kernels()
    assert lib is not None  # the layer checked
    M, K = x.shape
    y = torch.empty(M, out_features, dtype=torch.float32, device="cpu")  # C writes fp32
    if packed is not None and M <= FEW_ROWS:  # rounded: in C, multiplied in integers
        lib.gguf_matmul_interleaved(*packed, x.data_ptr(), y.data_ptr(), M, K, int(rounded))
        return y
    if M >= MANY_ROWS:
        x = rounded_to_8_bits(x) if rounded else x  # the same rounding, then exact sums
        tile = torch.empty(min(TILE, out_features), K, dtype=torch.float32, device="cpu")
        for first in range(0, out_features, TILE):
            count = min(TILE, out_features - first)
            lib.gguf_dequantize(*args, tile.data_ptr(), K, first, count)
            torch.mm(x, tile[:count].t(), out=y[:, first : first + count])
        return y
    lib.gguf_matmul(*args, x.data_ptr(), y.data_ptr(), M, K, int(rounded))  # rounded in C
    return y


def decoded(layer: GGUFLinear) -> Tensor:
    """``layer``'s weight decoded by the C code, (N, K) fp32 (equal to ``dequantized()``)."""
    lib = kernels()
    if lib is None:
        raise RuntimeError("the GGUF kernels are not built on this machine")
    w = torch.empty(layer.out_features, layer.in_features, dtype=torch.float32, device="cpu")
    args = _arguments(layer.parts())
    lib.gguf_dequantize(*args, w.data_ptr(), layer.in_features, 0, layer.out_features)
    return w


Calls = tuple[tuple, tuple | None]  # the C calls' arrays: the blocks', the interleaved rows'
_ARGUMENTS: dict[tuple[int, ...], Calls] = {}  # by the blocks' addresses


def _operator(
    x: Tensor,
    blocks: list[Tensor],
    types: list[int],
    out_features: int,
    packed: list[Tensor],
    rounded: bool,
) -> Tensor:
    """``_compute`` as the PyTorch operator ``glassformer::gguf_linear``, which a compiled
    graph calls as one node."""
    # every address the arrays hold: a freed layer's blocks may be followed at the same
    # address by another's whose interleaved copy lies elsewhere
    tensors = [*blocks, *packed]
    key = (*types, *(t.data_ptr() for t in tensors), *(len(t) for t in tensors))
    args = _ARGUMENTS.get(key)
    if args is None:
        interleaved = _interleaved(types, packed)
        args = _ARGUMENTS[key] = (_arguments(list(zip(types, blocks, strict=True))), interleaved)
    return _compute(x, args[0], args[1], out_features, rounded)


# Defined through torch.library's operator registry (not @custom_op, whose Python dispatch
# cost 10 us a call here against 3: a decoding step makes some 150 of them).
_LIBRARY = torch.library.Library("glassformer", "FRAGMENT")  # gguf_kernels defines it
_LIBRARY.define(
    "gguf_linear(Tensor x, Tensor[] blocks, int[] types, int out_features, Tensor[] packed,"
    " bool rounded) -> Tensor"
)
_LIBRARY.impl("gguf_linear", _operator, "CPU")


@torch.library.register_fake("glassformer::gguf_linear")
def _(
    x: Tensor,
    blocks: list[Tensor],
    types: list[int],
    out_features: int,
    packed: list[Tensor],
    rounded: bool,
) -> Tensor:
    return x.new_empty(x.shape[0], out_features)


def gguf_linear(
    x: Tensor,
    parts: Sequence[Part],
    out_features: int,
    packed: Sequence[Tensor] = (),
    rounded: bool = False,
) -> Tensor:
    """``x`` (M, K) fp32, contiguous, times the weight of ``parts`` transposed: (M, N);
    ``packed``: the parts interleaved (``GGUFLinear.packed``), or none; ``rounded``: x
    rounded to 8 bits first (``rounded_to_8_bits``), whichever path computes."""
    blocks, types = [b for _, b in parts], [k for k, _ in parts]
    if packed and not (
        len(packed) == len(parts)
        and all(k in INTERLEAVED for k in types)
        and all(16 * len(p) == len(b) for p, b in zip(packed, blocks, strict=True))
    ):
        raise ValueError("packed must be the parts interleaved (GGUFLinear.packed()), or empty")
    op = torch.ops.glassformer.gguf_linear
    return op(x, blocks, types, out_features, list(packed), rounded)
