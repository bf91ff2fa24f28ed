"""Optimisers: the paper's Adam and AdamW with decoupled weight decay on matrices only."""

from __future__ import annotations

import torch
from torch import nn

OPTIMIZERS = ("adam", "adamw")


def make_optimizer(
    model: nn.Module, kind: str = "adamw", *, lr: float = 1e-3, weight_decay: float = 0.1
) -> torch.optim.Optimizer:
    """Build the optimiser.

    "adam" is the paper's: Adam(β1=0.9, β2=0.98, ε=1e-9), no weight decay.
    "adamw" decays only matrices (weights of Linear and Embedding), not biases or
    LayerNorm gains, with β=(0.9, 0.95) as in GPT training.
    Both take PyTorch's fused kernel (one pass over all parameters) where it has one:
    on CPU PyTorch would otherwise loop over the tensors one by one.
    """
    if kind not in OPTIMIZERS:
        raise ValueError(f"optimizer must be one of {list(OPTIMIZERS)}, got {kind!r}")
    params = [p for p in model.parameters() if p.requires_grad]
    if kind == "adam":
        return torch.optim.Adam(params, lr=lr, betas=(0.9, 0.98), eps=1e-9, fused=_fused(params))
    decay = [p for p in params if p.dim() >= 2]
    no_decay = [p for p in params if p.dim() < 2]
    groups = [
        {"params": decay, "weight_decay": weight_decay},
        {"params": no_decay, "weight_decay": 0.0},
    ]
    return torch.optim.AdamW(groups, lr=lr, betas=(0.9, 0.95), eps=1e-8, fused=_fused(params))


def _fused(params: list[nn.Parameter]) -> bool | None:
    """True where every parameter is a floating tensor on a device with fused Adam kernels."""
    ok = all(p.is_floating_point() and p.device.type in ("cpu", "cuda") for p in params)
    return True if ok and params else None
