"""What the benchmarks share: interleaved timing, the in-run matmul peak, nanoGPT's files.

Every comparison runs its contenders in one process, interleaved (so drift in the
machine's speed hits all alike), several repeats, and reports medians.
"""

from __future__ import annotations

import statistics
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import torch


def timed(fn: Callable[[], object], inner: int) -> float:
    """Mean seconds per call of ``fn`` over ``inner`` calls."""
    start = time.perf_counter()
    for _ in range(inner):
        fn()
    return (time.perf_counter() - start) / inner


def interleaved(
    fns: dict[str, Callable[[], object]], repeats: int, inner: int, warmup: int = 1
) -> dict[str, float]:
    """Median seconds per call of each contender, run in turn ``repeats`` times."""
    for fn in fns.values():
        for _ in range(warmup):
            fn()
    times: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            times[name].append(timed(fn, inner))
    return {name: statistics.median(t) for name, t in times.items()}


def compare(title: str, fns: dict[str, Callable[[], object]], repeats: int, inner: int) -> dict:
    """Print each contender's median time and its ratio to the first (glassformer)."""
    medians = interleaved(fns, repeats, inner)
    ours = next(iter(medians.values()))
    print(f"\n{title}")
    for name, m in medians.items():
        print(f"  {name:<44} {m * 1e3:9.2f} ms   time relative to glassformer: {m / ours:5.2f}x")
    return medians


def matmul_peak(dtype: torch.dtype = torch.float32, n: int = 1024, repeats: int = 5) -> float:
    """FLOP/s of the best of several (n × n) @ (n × n) products: this machine's practical peak."""
    a, b = torch.randn(n, n, dtype=dtype), torch.randn(n, n, dtype=dtype)
    inner = 8
    best = min(timed(lambda: a @ b, inner) for _ in range(repeats + 1))
    return 2 * n**3 / best


def native_bf16() -> bool:
    """Whether this CPU multiplies bfloat16 natively (AVX512-BF16 / AMX); else it is emulated."""
    return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())


def load_child(imports: str, load: str) -> str:
    """A script for ``python -c`` that times one model load in a fresh process and prints
    JSON: import seconds, load seconds (the ``load`` code alone, which sets ``model``), the
    peak resident MiB the load added, and the parameter count. ``imports`` runs after torch
    is imported; both may read ``sys.argv``. The peak is the load's own: the process's
    high-water mark is reset after the imports (``/proc/self/clear_refs``), else the imports'
    peak (transformers' is 400 MiB) would hide a smaller load's."""
    return f"""
import json, re, resource, sys, time
t0 = time.perf_counter()
import torch
{imports}
imported = time.perf_counter() - t0

def rss_kib():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * resource.getpagesize() // 1024

def peak_kib():
    with open("/proc/self/status") as f:
        return int(re.search(r"VmHWM:\\s+(\\d+)", f.read())[1])

before = rss_kib()
with open("/proc/self/clear_refs", "w") as f:
    f.write("5")  # the high-water mark back to the resident size now
t1 = time.perf_counter()
{load}
seconds = time.perf_counter() - t1
peak = peak_kib()
params = sum(p.numel() for p in model.parameters())
print(json.dumps({{"import_s": imported, "load_s": seconds,
                  "peak_mib": (peak - before) / 1024, "params": params}}))
"""


def export_checkout(path: Path, dest: Path) -> Path:
    """A clean copy of nanoGPT's files (from a git checkout or a bare mirror)."""
    dest.mkdir(parents=True)
    if (path / "train.py").is_file():
        for name in ("train.py", "model.py", "configurator.py"):
            (dest / name).write_bytes((path / name).read_bytes())
        (dest / "config").mkdir()
        for f in (path / "config").glob("*.py"):
            (dest / "config" / f.name).write_bytes(f.read_bytes())
    else:  # a bare repository
        archive = subprocess.run(
            ["git", f"--git-dir={path}", "archive", "HEAD"], check=True, capture_output=True
        ).stdout
        subprocess.run(["tar", "-x", "-C", str(dest)], input=archive, check=True)
    return dest
