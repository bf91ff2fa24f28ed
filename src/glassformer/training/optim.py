"""Optimisers: the paper's Adam and AdamW with decoupled weight decay on matrices only."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from torch import nn

OPTIMIZERS = ("adam", "adamw")


def make_optimizer(
    model: nn.Module,
    kind: str = "adamw",
    *,
    lr: float = 1e-3,
    weight_decay: float = 0.1,
    parts: Mapping[str | tuple[str, ...], Mapping[str, float]] | None = None,
) -> torch.optim.Optimizer:
    """Build the optimiser.

    "adam" is the paper's: Adam(β1=0.9, β2=0.98, ε=1e-9), no weight decay.
    "adamw" decays only matrices (weights of Linear and Embedding), not biases or
    LayerNorm gains, with β=(0.9, 0.95) as in GPT training.
    Both take PyTorch's fused kernel (one pass over all parameters) where it has one:
    on CPU PyTorch would otherwise loop over the tensors one by one.

    Args:
        parts: options for the parameters whose names start with a prefix (or one of a
            tuple of prefixes), each a parameter group of its own: ``lr_scale`` (the
            schedule's rate times this) and ``frozen_until`` (rate 0 before this step).
            Fine-tuning gives a pretrained backbone
            ``{("embed.", "blocks.", ...): {"lr_scale": 0.1, "frozen_until": 100}}``.
    """
    if kind not in OPTIMIZERS:
        raise ValueError(f"optimizer must be one of {list(OPTIMIZERS)}, got {kind!r}")
    named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    params = [p for _, p in named]
    groups = []
    everything: tuple[str, ...] = ("",)
    for prefix, options in [*(parts or {}).items(), (everything, {})]:
        taken = [p for n, p in named if n.startswith(prefix)]
        named = [(n, p) for n, p in named if not n.startswith(prefix)]
        if kind == "adam":
            groups.append({"params": taken, **options})
            continue
        decay = [p for p in taken if p.dim() >= 2]
        no_decay = [p for p in taken if p.dim() < 2]
        groups.append({"params": decay, "weight_decay": weight_decay, **options})
        groups.append({"params": no_decay, "weight_decay": 0.0, **options})
    if kind == "adam":
        return torch.optim.Adam(groups, lr=lr, betas=(0.9, 0.98), eps=1e-9, fused=_fused(params))
    return torch.optim.AdamW(groups, lr=lr, betas=(0.9, 0.95), eps=1e-8, fused=_fused(params))


def group_lr(group: Mapping[str, Any], lr: float, step: int) -> float:
    """The rate of one parameter group at ``step`` when the schedule gives ``lr``."""
    if step < group.get("frozen_until", 0):
        return 0.0
    return lr * group.get("lr_scale", 1.0)


def _fused(params: list[nn.Parameter]) -> bool | None:
    """True where every parameter is a floating tensor on a device with fused Adam kernels."""
    ok = all(p.is_floating_point() and p.device.type in ("cpu", "cuda") for p in params)
    return True if ok and params else None
