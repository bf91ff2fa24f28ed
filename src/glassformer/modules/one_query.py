"""A decoding step's attention, one query per head, as few loops as possible.

During decoding each layer attends one new query per head against every cached key. Under
``torch.compile`` on the CPU, ``modules.sdpa.fused_attention`` hands that step here: first to
any faster path registered with ``register_one_query`` (``glassformer.kernels`` registers its
C loop), then to plain products the compiler fuses.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
from torch import Tensor

# A faster one-query attention: (q (B, H, 1, Dh), k, v (B, Hkv, Tk, Dh), key mask (B, 1, 1, Tk)
# or None, scale) → (B, H, 1, Dv), or None where it does not apply (a dtype, a device).
OneQuery = Callable[[Tensor, Tensor, Tensor, Tensor | None, float], Tensor | None]
ONE_QUERY_PATHS: list[OneQuery] = []


def register_one_query(path: OneQuery) -> OneQuery:
    """Consult ``path`` for a decoding step's attention (compiled, on the CPU) before the
    plain products; returns it, so that it can be used as a decorator."""
    if path not in ONE_QUERY_PATHS:
        ONE_QUERY_PATHS.append(path)
    return path


def one_query(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, group: int) -> Tensor:
    """One query per head (a decoding step), as plain products the compiler fuses into a few
    loops: each key/value head's ``group`` query heads side by side, no repeated keys.
    (B, H, 1, Dh) → (B, H, 1, Dv); measured 50 us a layer by the fused kernel, compiled."""
    B, H, _, Dh = q.shape
    Hkv, Tk = k.size(1), k.size(2)
    for path in ONE_QUERY_PATHS:  # registered elsewhere (glassformer.kernels: in C)
        fast = path(q, k, v, mask, 1 / math.sqrt(Dh))
        if fast is not None:
            return fast
    scores = q.view(B, Hkv, group, Dh) @ k.transpose(-2, -1) / math.sqrt(Dh)  # (B, Hkv, g, Tk)
    if mask is not None:
        allowed = mask.expand(B, H, 1, Tk).reshape(B, Hkv, group, Tk)
        scores = scores.masked_fill(~allowed, torch.finfo(scores.dtype).min)
    out = scores.softmax(dim=-1) @ v  # (B, Hkv, g, Dv)
    return out.reshape(B, H, 1, v.size(-1))
