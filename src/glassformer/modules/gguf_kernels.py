"""The C library behind the GGUF layers and the decoding step's attention: ``csrc/gguf.c``,
compiled on first use with the machine's C compiler (``-march=native``: AVX-512 where the CPU
has it, VNNI for 8-bit products) into the cache folder, once per source, flags and CPU, and
loaded with ``ctypes``. Where no compiler is found, or the build fails, ``kernels()`` is None
(one warning) and the callers take their PyTorch paths.

It also holds the operator ``glassformer::one_query_attention``: a decoding step's attention
over the filled cache slots, in C (``one_query_attention``); ``glassformer.modules.gguf_linear``
registers ``glassformer::gguf_linear`` in the same namespace.
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
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from glassformer.cache import cache_root

SOURCE = Path(__file__).with_name("csrc") / "gguf.c"
FLAGS = ("-O3", "-march=native", "-fopenmp", "-ffp-contract=off", "-shared", "-fPIC")

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
    products = [*parts, pointer, pointer, size, size, ctypes.c_int]  # x, y, M, K, rounded
    lib.gguf_matmul.argtypes = lib.gguf_matmul_interleaved.argtypes = products
    lib.gguf_matmul_interleaved.restype = None
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


# ---- attention for one query (a decoding step) ------------------------------------------


def _one_query(q: Tensor, k: Tensor, v: Tensor, allowed: Tensor | None, scale: float) -> Tensor:
    """``glassformer::one_query_attention``: q (B, H, Dh), k (B, Hkv, Tk, Dh), v (B, Hkv, Tk,
    Dv), allowed (B, Tk) bool or None → (B, H, Dv), fp32, contiguous."""
    lib = kernels()
    assert lib is not None  # the caller checked
    B, H, Dh = q.shape
    Hkv, Tk, Dv = k.size(1), k.size(2), v.size(3)
    out = torch.empty(B, H, Dv, dtype=torch.float32, device="cpu")  # C writes fp32
    mask = 0 if allowed is None else allowed.data_ptr()
    lib.one_query_attention(
        q.data_ptr(), k.data_ptr(), v.data_ptr(), mask, out.data_ptr(), B, H, Hkv, Tk, Dh, Dv, scale
    )
    return out


_LIBRARY = torch.library.Library("glassformer", "DEF")
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
