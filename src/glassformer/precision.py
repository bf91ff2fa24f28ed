"""Precision chosen by measurement: is bfloat16 faster than float32 on this machine?

A CPU's flags do not say. On one 2-core Intel Xeon reporting AVX512-BF16, ``torch.mm`` ran
at 147 GFLOP/s in bf16 against 276 in fp32; on a 2-core AMD EPYC with the same flag, at
1,000 against 177. So glassformer times what it would run: matrix products of the model's
own shapes, in both dtypes, alternating, once per machine. The answer is cached in
``precision.json`` under the cache folder (``$GLASSFORMER_CACHE`` or ``~/.cache/glassformer``),
keyed by the processor, torch's version, the thread count and the shapes.

    >>> m = bf16_measurement([(4096, 384, 1536)])
    >>> m.fp32_gflops, m.bf16_gflops, m.bf16_faster    # doctest: +SKIP
    (177.0, 1000.0, True)

``resolve_bf16(setting, shapes)`` is what ``train --bf16 auto|on|off`` does with it, and
``resolve_dtype(model, "auto")`` what ``model.for_inference("auto")`` and ``--dtype auto``
do (bf16 where the model's decoding products run measurably faster in it, else fp32);
``glassformer.models.quantize`` then casts or quantises the model to what was chosen.
"""

from __future__ import annotations

import json
import os
import platform
import tempfile
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from glassformer.cache import cache_root

CACHE_FILE = "precision.json"
# bf16 must be at least this much faster to be chosen: a product that is only as fast
# in bf16 costs accuracy for nothing.
MARGIN = 1.1
Shape = tuple[int, int, int]  # (m, k, n): an (m, k) by (k, n) product


@dataclass(frozen=True)
class Measurement:
    """Matrix-product throughput of the same shapes in fp32 and bf16 (GFLOP/s)."""

    fp32_gflops: float
    bf16_gflops: float

    @property
    def speedup(self) -> float:
        """bf16's throughput over fp32's (> 1: bf16 faster)."""
        return self.bf16_gflops / self.fp32_gflops

    @property
    def bf16_faster(self) -> bool:
        return self.speedup >= MARGIN

    def describe(self) -> str:
        return (
            f"bf16 {self.bf16_gflops:,.0f} vs fp32 {self.fp32_gflops:,.0f} GFLOP/s "
            f"({self.speedup:.2f}x), measured here"
        )


def bf16_measurement(
    shapes: Sequence[Shape],
    device: str | torch.device = "cpu",
    *,
    seconds: float = 0.25,
    cache_dir: str | Path | None = None,
    linear: bool = False,
) -> Measurement:
    """Time ``shapes`` in fp32 and bf16 on ``device`` (cached per machine).

    ``linear=True`` times them as a linear layer does, ``F.linear(x, w)`` with the weight
    stored (n, k), the layout decoding reads; bf16's gain differs by layout (SmolLM2's
    decoding products, 2-core AMD EPYC: 1.44x fp32 as (k, n), 2.24x as (n, k))."""
    if not shapes or any(len(s) != 3 or min(s) < 1 for s in shapes):
        raise ValueError(f"shapes must be (m, k, n) triples of positive sizes, got {shapes!r}")
    device = torch.device(device)
    key = _cache_key(shapes, device) + ("; linear" if linear else "")
    path = cache_root(cache_dir) / CACHE_FILE
    cached = _read_cache(path)
    if key in cached:
        return Measurement(**cached[key])
    measured = _measure(shapes, device, seconds, linear)
    cached[key] = asdict(measured)
    _write_cache(path, cached)
    return measured


def resolve_bf16(
    setting: bool | str,
    shapes: Sequence[Shape],
    device: str | torch.device = "cpu",
    **options,
) -> tuple[bool, Measurement | None, str | None]:
    """``(use_bf16, measurement, warning)`` for ``setting`` True, False or ``"auto"``.

    ``"auto"`` measures and uses bf16 when it is faster. True uses it regardless, with a
    warning that gives both figures when the measurement says it is slower. False measures
    nothing.
    """
    if setting is False:
        return False, None, None
    if setting not in (True, "auto"):
        raise ValueError(f"bf16 must be True, False or 'auto', got {setting!r}")
    measured = bf16_measurement(shapes, device, **options)
    if setting == "auto":
        return measured.bf16_faster, measured, None
    warning = None
    if measured.speedup < 1.0:
        warning = f"--bf16 is slower than fp32 on this machine: {measured.describe()}"
    return True, measured, warning


# ---- the precision a model decodes in: for_inference(dtype), --dtype -------------------

DTYPES = ("auto", "fp32", "bf16", "int8", "int4")


def check_dtype(dtype: str) -> str:
    if dtype not in DTYPES:
        raise ValueError(f"dtype must be one of {', '.join(DTYPES)}; got {dtype!r}")
    return dtype


def decoding_shapes(model: nn.Module, batch: int = 1) -> list[tuple[int, int, int]]:
    """The (m, k, n) products of one decoding step at ``batch``: one per linear layer, in
    the model's order, repeats kept. Measured as they come (each with its own weights), the
    products read as many bytes as a step does, so they meet the memory limits a step meets
    (a model larger than the cache reads its weights from memory: there bf16's half the
    bytes counts; a few small products that stay in the cache would not show it)."""
    return [
        (batch, m.in_features, m.out_features) for m in model.modules() if isinstance(m, nn.Linear)
    ]


def decoding_measurement(
    model: nn.Module, device: str | torch.device = "cpu", **options: Any
) -> Measurement:
    """bf16 against fp32 on ``model``'s decoding products, timed as its linear layers run
    them (measured once per machine, then cached)."""
    return bf16_measurement(decoding_shapes(model), device, linear=True, **options)


def resolve_dtype(
    model: nn.Module, dtype: str, device: str | torch.device = "cpu", **options: Any
) -> tuple[str, Measurement | None]:
    """The precision ``dtype`` means for ``model`` here: ``auto`` becomes fp32 or bf16 by
    measurement (returned with it); any other is itself."""
    check_dtype(dtype)
    if dtype != "auto":
        return dtype, None
    measured = decoding_measurement(model, device, **options)
    return ("bf16" if measured.bf16_faster else "fp32"), measured


def _measure(
    shapes: Sequence[Shape], device: torch.device, seconds: float, linear: bool = False
) -> Measurement:
    """Median throughput over alternating rounds of every shape in each dtype."""

    def operands(m: int, k: int, n: int, dtype: torch.dtype) -> tuple[torch.Tensor, ...]:
        second = (n, k) if linear else (k, n)  # a linear layer's weight is stored (n, k)
        return (
            torch.randn(m, k, device=device, dtype=dtype),
            torch.randn(*second, device=device, dtype=dtype),
        )

    product = torch.nn.functional.linear if linear else torch.matmul

    pairs = {
        dtype: [operands(m, k, n, dtype) for m, k, n in shapes]
        for dtype in (torch.float32, torch.bfloat16)
    }
    flops = sum(2 * m * k * n for m, k, n in shapes)

    def one_round(dtype: torch.dtype) -> float:
        start = time.perf_counter()
        for a, b in pairs[dtype]:
            product(a, b)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        return time.perf_counter() - start

    for dtype in pairs:  # warm-up: kernels chosen, memory touched
        one_round(dtype)
    rounds: dict[torch.dtype, list[float]] = {dtype: [] for dtype in pairs}
    deadline = time.perf_counter() + 2 * seconds
    while time.perf_counter() < deadline or len(rounds[torch.bfloat16]) < 3:
        for dtype in pairs:
            rounds[dtype].append(one_round(dtype))
    fp32, bf16 = (flops / sorted(r)[len(r) // 2] / 1e9 for r in rounds.values())
    return Measurement(fp32_gflops=round(fp32, 1), bf16_gflops=round(bf16, 1))


def _cache_key(shapes: Sequence[Shape], device: torch.device) -> str:
    if device.type == "cuda":
        where = torch.cuda.get_device_name(device)
    else:
        where = f"{_processor()}, {torch.get_num_threads()} threads"
    counts = Counter(tuple(s) for s in shapes)  # in first-seen order
    dims = " ".join("x".join(map(str, s)) + (f"*{n}" if n > 1 else "") for s, n in counts.items())
    return f"{where}; torch {torch.__version__}; {dims}"


def _processor() -> str:
    """The CPU's model name (/proc/cpuinfo on Linux), else what platform knows."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _read_cache(path: Path) -> dict:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):  # none yet, or unreadable: measure again
        return {}
    return data if isinstance(data, dict) else {}


def _write_cache(path: Path, data: dict) -> None:
    """Write the cache whole or not at all; a folder that cannot be written is skipped."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
        with os.fdopen(fd, "w") as f:
            json.dump(data, f, indent=1, sort_keys=True)
        os.replace(tmp, path)
    except OSError:
        pass
