"""Layers that compute from a GGUF file's own blocks: no second quantisation.

A llama.cpp file stores each weight row as blocks (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K,
Q6_K: ``glassformer.modules.gguf_blocks``). ``GGUFLinear`` keeps those bytes as the file has
them and multiplies by the values they decode to, so a packaged 4-bit model runs at its own
quality. ``GGUFEmbedding`` looks token rows up in the same blocks (a tied head and embedding
share them).

Two paths, equal to each other (``tests/test_gguf_linear.py``):

- the readable one: decode the blocks to fp32 (``dequantized()``, PyTorch code equal to the
  gguf package's decoder bit for bit) and call ``F.linear``;
- the fast one: ``csrc/gguf.c``, compiled on first use with the machine's C compiler into the
  cache folder and loaded with ``ctypes``. A few rows (decoding) are multiplied straight from
  the blocks, block by block, in fp32 (AVX-512 where the compiler targets it, OpenMP threads
  over the rows); many rows (a prompt) decode the weight once, in C, and use PyTorch's fp32
  matrix product. Where no compiler is found the readable path runs, with one warning.

Shapes: N output features, K input features, M rows of input.

    >>> layer = GGUFLinear([(Q8_0, blocks)], in_features=576)     # doctest: +SKIP
    >>> layer(torch.randn(1, 576)).shape                          # doctest: +SKIP
    torch.Size([1, 1536])
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import platform
import shutil
import subprocess
import tempfile
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from glassformer.cache import cache_root
from glassformer.modules.gguf_blocks import BLOCK_BYTES, BLOCK_VALUES, NAMES, dequantize

SOURCE = Path(__file__).with_name("csrc") / "gguf.c"
FLAGS = ("-O3", "-march=native", "-fopenmp", "-ffp-contract=off", "-shared", "-fPIC")
# From this many input rows on, the weight is decoded and multiplied by PyTorch's fp32 GEMM,
# TILE rows of it at a time (a small buffer, used again: decoding a 49,152-row head whole
# took 113 MB, which glibc then kept); below, the rows are multiplied straight from the
# blocks, four at a time per decoded block (SmolLM2, 2-core Intel Xeon, a forward of 27 rows:
# 67 ms from the blocks, 131 decoded; 64 rows 145 and 163; 128 rows 283 and 198).
MANY_ROWS = 72
TILE = 1024
COMPUTED = tuple(BLOCK_BYTES)  # the block types these layers hold

Part = tuple[int, Tensor]  # (ggml type, its rows' blocks: (rows, bytes per row) uint8)


class GGUFLinear(nn.Module):
    """``nn.Linear`` whose weight is GGUF blocks: one or more parts of stacked rows (a fused
    q/k/v projection whose three tensors have different types has three parts)."""

    blocks0: Tensor  # the first part's blocks (blocks1, ... the others')
    bias: Tensor | None

    def __init__(self, parts: Sequence[Part], in_features: int, bias: Tensor | None = None):
        super().__init__()
        if not parts:
            raise ValueError("a GGUFLinear needs at least one part")
        for kind, blocks in parts:
            _check_part(kind, blocks, in_features)
        self.in_features = in_features
        self.types = tuple(int(kind) for kind, _ in parts)
        self.rows = tuple(int(blocks.shape[0]) for _, blocks in parts)
        self.out_features = sum(self.rows)
        for i, (_, blocks) in enumerate(parts):
            self.register_buffer(f"blocks{i}", blocks, persistent=False)
        self.register_buffer("bias", bias)
        self.fast = kernels() is not None  # built now: not while a graph is being traced
        self._arguments: tuple | None = None  # the C call's arrays, made once

    def parts(self) -> list[Part]:
        return [(kind, self.get_buffer(f"blocks{i}")) for i, kind in enumerate(self.types)]

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
                y = gguf_linear(flat, self.parts(), self.out_features)
            else:  # called straight: the operator's dispatch costs more than a small product
                if self._arguments is None or self._arguments[2][0] != self.blocks0.data_ptr():
                    self._arguments = _arguments(self.parts())
                y = _compute(flat, self._arguments, self.out_features)
            y = y.view(*x.shape[:-1], self.out_features).to(x.dtype)
        else:
            y = F.linear(x, self.dequantized().to(x.dtype, copy=False))
        return y if self.bias is None else y + self.bias.to(y.dtype)

    def forward_rows(self, x: Tensor, start: int, stop: int) -> Tensor:
        """Output features ``start:stop`` (all are computed, then cut)."""
        return self(x)[..., start:stop]

    def extra_repr(self) -> str:
        kinds = "+".join(NAMES[kind] for kind in self.types)
        return f"in_features={self.in_features}, out_features={self.out_features}, {kinds}"


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


# ---- the compiled kernels ---------------------------------------------------------------


_READY: bool | None = None  # whether kernels() built the library; None: not asked yet


def ready() -> bool:
    """Whether the library is built and loaded, as a compiled graph may ask: it reads a
    flag, never the disk (``kernels()`` sets it; ``compiled_step`` calls that first)."""
    return bool(_READY)


@functools.cache
def kernels() -> ctypes.CDLL | None:
    """The compiled ``csrc/gguf.c`` (built once per machine, source and compiler, under the
    cache folder), or None where it cannot be built (a warning says why)."""
    global _READY
    _READY = False
    compiler = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        warnings.warn("no C compiler: GGUF blocks are decoded in PyTorch (slow)", stacklevel=2)
        return None
    source = SOURCE.read_bytes()
    key = hashlib.sha256(source + " ".join(FLAGS).encode() + _machine().encode()).hexdigest()
    target = cache_root() / "kernels" / f"gguf-{key[:16]}.so"
    if not target.exists():
        error = _build(compiler, target)
        if error:
            message = f"the GGUF kernels did not build ({error}); decoding in PyTorch (slow)"
            warnings.warn(message, stacklevel=2)
            return None
    lib = ctypes.CDLL(str(target))
    pointer, size = ctypes.c_void_p, ctypes.c_int64
    parts: list[Any] = [ctypes.c_int, pointer, pointer, pointer]  # count, types, blocks, rows
    lib.gguf_matmul.argtypes = [*parts, pointer, pointer, size, size]  # x, y, M, K
    lib.gguf_dequantize.argtypes = [*parts, pointer, size, size, size]  # w, K, first, count
    lib.one_query_attention.argtypes = [*[pointer] * 5, *[size] * 6, ctypes.c_float]
    lib.gguf_matmul.restype = lib.gguf_dequantize.restype = lib.one_query_attention.restype = None
    _READY = True
    return lib


def _build(compiler: str, target: Path) -> str | None:
    """Compile into ``target`` whole or not at all; the compiler's last line on failure."""
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".gguf-", suffix=".so", dir=target.parent)
    os.close(fd)
    try:
        try:
            command = [compiler, *FLAGS, "-o", tmp, str(SOURCE), "-lm"]
            out = subprocess.run(command, capture_output=True, text=True)
        except OSError as e:  # no such compiler, or not runnable
            return f"{compiler}: {e.strerror}"
        if out.returncode != 0:
            lines = (out.stderr or out.stdout).strip().splitlines()
            return lines[-1] if lines else f"{compiler} exited with {out.returncode}"
        os.replace(tmp, target)
        return None
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def _machine() -> str:
    """What -march=native depends on: the CPU's model and flags."""
    try:
        info = Path("/proc/cpuinfo").read_text()
        lines = [line for line in info.splitlines() if line.startswith(("model name", "flags"))]
        return "\n".join(lines[:2])
    except OSError:
        return platform.processor() or platform.machine()


def _arguments(parts: Sequence[Part]) -> tuple:
    n = len(parts)
    return (
        n,
        (ctypes.c_int * n)(*[kind for kind, _ in parts]),
        (ctypes.c_void_p * n)(*[blocks.data_ptr() for _, blocks in parts]),
        (ctypes.c_int64 * n)(*[blocks.shape[0] for _, blocks in parts]),
    )


def _compute(x: Tensor, args: tuple, out_features: int) -> Tensor:
    """(M, K) fp32 times the weight of the parts of ``args`` transposed → (M, N): straight
    from the blocks in C for a few rows, decoded in C then PyTorch's GEMM for many."""
    lib = kernels()
    assert lib is not None  # the layer checked
    M, K = x.shape
    y = torch.empty(M, out_features)
    if M >= MANY_ROWS:
        tile = torch.empty(min(TILE, out_features), K)
        for first in range(0, out_features, TILE):
            count = min(TILE, out_features - first)
            lib.gguf_dequantize(*args, tile.data_ptr(), K, first, count)
            torch.mm(x, tile[:count].t(), out=y[:, first : first + count])
        return y
    lib.gguf_matmul(*args, x.data_ptr(), y.data_ptr(), M, K)
    return y


def decoded(layer: GGUFLinear) -> Tensor:
    """``layer``'s weight decoded by the C code, (N, K) fp32 (equal to ``dequantized()``)."""
    lib = kernels()
    if lib is None:
        raise RuntimeError("the GGUF kernels are not built on this machine")
    w = torch.empty(layer.out_features, layer.in_features)
    args = _arguments(layer.parts())
    lib.gguf_dequantize(*args, w.data_ptr(), layer.in_features, 0, layer.out_features)
    return w


_ARGUMENTS: dict[tuple[int, ...], tuple] = {}  # the C call's arrays, by the blocks' addresses


def _operator(x: Tensor, blocks: list[Tensor], types: list[int], out_features: int) -> Tensor:
    """``_compute`` as the PyTorch operator ``glassformer::gguf_linear``, which a compiled
    graph calls as one node."""
    key = (*types, *(b.data_ptr() for b in blocks), *(len(b) for b in blocks))
    args = _ARGUMENTS.get(key)
    if args is None:
        args = _ARGUMENTS[key] = _arguments(list(zip(types, blocks, strict=True)))
    return _compute(x, args, out_features)


# Defined through torch.library's operator registry (not @custom_op, whose Python dispatch
# cost 10 us a call here against 3: a decoding step makes some 150 of them).
_LIBRARY = torch.library.Library("glassformer", "DEF")
_LIBRARY.define("gguf_linear(Tensor x, Tensor[] blocks, int[] types, int out_features) -> Tensor")
_LIBRARY.impl("gguf_linear", _operator, "CPU")


@torch.library.register_fake("glassformer::gguf_linear")
def _(x: Tensor, blocks: list[Tensor], types: list[int], out_features: int) -> Tensor:
    return x.new_empty(x.shape[0], out_features)


def gguf_linear(x: Tensor, parts: Sequence[Part], out_features: int) -> Tensor:
    """``x`` (M, K) fp32, contiguous, times the weight of ``parts`` transposed: (M, N)."""
    blocks, types = [b for _, b in parts], [k for k, _ in parts]
    return torch.ops.glassformer.gguf_linear(x, blocks, types, out_features)


# ---- attention for one query (a decoding step), in the same library ---------------------


def _one_query(q: Tensor, k: Tensor, v: Tensor, allowed: Tensor | None, scale: float) -> Tensor:
    """``glassformer::one_query_attention``: q (B, H, Dh), k (B, Hkv, Tk, Dh), v (B, Hkv, Tk,
    Dv), allowed (B, Tk) bool or None → (B, H, Dv), fp32, contiguous."""
    lib = kernels()
    assert lib is not None  # the caller checked
    B, H, Dh = q.shape
    Hkv, Tk, Dv = k.size(1), k.size(2), v.size(3)
    out = torch.empty(B, H, Dv)
    mask = 0 if allowed is None else allowed.data_ptr()
    lib.one_query_attention(
        q.data_ptr(), k.data_ptr(), v.data_ptr(), mask, out.data_ptr(), B, H, Hkv, Tk, Dh, Dv, scale
    )
    return out


_LIBRARY.define(
    "one_query_attention(Tensor q, Tensor k, Tensor v, Tensor? allowed, float scale) -> Tensor"
)
_LIBRARY.impl("one_query_attention", _one_query, "CPU")


@torch.library.register_fake("glassformer::one_query_attention")
def _(q: Tensor, k: Tensor, v: Tensor, allowed: Tensor | None, scale: float) -> Tensor:
    return q.new_empty(q.shape[0], q.shape[1], v.shape[3])


def one_query_attention(
    q: Tensor, k: Tensor, v: Tensor, allowed: Tensor | None, scale: float
) -> Tensor | None:
    """A decoding step's attention in C, (B, H, 1, Dh) queries → (B, H, 1, Dv), or None where
    it does not apply (not fp32 on the CPU, a mask other than one row of keys per sequence,
    no compiler); ``allowed`` (B, 1, 1, Tk) bool."""
    fp32_cpu = all(t.device.type == "cpu" and t.dtype == torch.float32 for t in (q, k, v))
    rows = allowed is None or (allowed.dim() == 4 and allowed.shape[1:3] == (1, 1))
    if not (fp32_cpu and rows and q.size(2) == 1 and ready()):
        return None
    B, H = q.shape[:2]
    flat = None if allowed is None else allowed.reshape(B, -1).contiguous()
    if flat is not None and (flat.dtype != torch.bool or flat.shape[1] != k.size(2)):
        return None
    out = torch.ops.glassformer.one_query_attention(
        q.reshape(B, H, -1).contiguous(), k.contiguous(), v.contiguous(), flat, scale
    )
    return out[:, :, None]
