"""Reading a checked GGUF file's tensors: the ones a model needs, each once.

A tensor's bytes are read into memory of the process's own (``read_blocks``), never left
in a memory map of the file: a model computing from a file's blocks (``for_inference("gguf")``)
keeps them, and a mapped file truncated under it would kill it with SIGBUS at its next step,
silently. Read, a truncated file is a short read at load time (one line), and afterwards
the file may change or vanish without the model noticing. Reading costs the blocks' size
in private memory, which a memory map would have spent in the page cache once touched.
"""

from __future__ import annotations

import re
from collections import defaultdict
from io import BufferedReader

import torch
from torch import Tensor

from glassformer.errors import shown
from glassformer.interop.gguf.header import TensorInfo, read_span
from glassformer.kernels.gguf_blocks import NAMES, dequantize
from glassformer.kernels.gguf_linear import COMPUTED

_QKV = re.compile(r"(blk\.\d+)\.attn_[qkv]\.weight")


def read_blocks(f: BufferedReader, t: TensorInfo) -> Tensor:
    """The bytes of tensor ``t``, (nbytes,) uint8, read from ``f`` (an open GGUF file)."""
    return torch.frombuffer(
        read_span(f, t.start, t.nbytes, f"tensor {shown(t.name)}"), dtype=torch.uint8
    )


def read_tensor(f: BufferedReader, t: TensorInfo) -> Tensor:
    """Tensor ``t`` decoded to fp32, its shape outermost first."""
    shape = tuple(reversed(t.dims))
    return dequantize(read_blocks(f, t), t.ggml_type, shape, NAMES.get(t.ggml_type, ""))


def read_rows(f: BufferedReader, t: TensorInfo) -> Tensor:
    """A 2-D tensor's blocks as its rows: (rows, bytes per row) uint8; a 3-D one's (experts
    stacked) as every expert's rows in turn."""
    rows = t.dims[1] * (t.dims[2] if len(t.dims) == 3 else 1)
    return read_blocks(f, t).view(rows, t.nbytes // rows)


def kept_as_blocks(tensors: list[TensorInfo]) -> set[str]:
    """The 2-D tensors (and 3-D ones, experts stacked) of a computed block type
    (``COMPUTED``) that a model can compute from as blocks. A layer's q, k and v are stacked
    into one weight, so where some of them are of a float type (F32, F16, BF16) the three are
    decoded, and their stacked weight stays in fp32 (the file's other layers still compute
    from blocks)."""
    blocks = {t.name for t in tensors if len(t.dims) in (2, 3) and t.ggml_type in COMPUTED}
    layers: dict[str, list[str]] = defaultdict(list)
    for t in tensors:
        if m := _QKV.fullmatch(t.name):
            layers[m[1]].append(t.name)
    for names in layers.values():
        if len({name in blocks for name in names}) > 1:  # some blocks, some floats
            blocks -= set(names)
    return blocks
