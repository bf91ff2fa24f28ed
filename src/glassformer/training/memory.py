"""Keep freed memory in the process, so a training step does not pay for it again.

A training step allocates and frees the same large tensors (activations, gradients) every
time. glibc's malloc hands blocks over its mmap threshold straight back to the kernel when
they are freed, and the next step's allocation gets fresh pages that the kernel must fault
in and zero one 4 KiB page at a time: about 100 MB of page faults per step for the medium
GPT (6 layers, 384 wide, context 256, batch 8). Raising the mmap and trim thresholds keeps
those blocks in the heap for reuse: the faults go to zero and a step is a few percent
faster (``benchmarks/malloc.py`` measures it).

Only glibc on Linux has ``mallopt``; elsewhere this does nothing.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import sys

_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
_KEEP = 1 << 30  # blocks up to 1 GiB come from the heap; up to 1 GiB of free heap is kept


def keep_freed_memory() -> bool:
    """Tell glibc's malloc to reuse freed blocks; True if it took the settings."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):  # not glibc (musl has no mallopt)
        return False
    return bool(mallopt(_M_MMAP_THRESHOLD, _KEEP)) and bool(mallopt(_M_TRIM_THRESHOLD, _KEEP))
