"""Losses as (sum, count) pairs, so accumulation and averaging are exact.

Each task's loss function has the signature the training loop expects:
``loss_fn(model, batch) -> (loss summed over scored items, number of scored items)``.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import torch.nn.functional as F
from torch import Tensor, nn


def token_cross_entropy(
    logits: Tensor, labels: Tensor, *, ignore_index: int = -100, label_smoothing: float = 0.0
) -> tuple[Tensor, int]:
    """Cross-entropy summed over the positions whose label is not ``ignore_index``.

    Args:
        logits: (..., V).
        labels: (...) class or token ids.
        ignore_index: label value that is not scored (the pad id).
        label_smoothing: spread this much probability mass uniformly (the paper uses 0.1).

    Returns:
        (summed loss, number of scored positions).
    """
    labels = labels.reshape(-1)
    loss = F.cross_entropy(
        logits.reshape(-1, logits.size(-1)).float(),
        labels,
        ignore_index=ignore_index,
        label_smoothing=label_smoothing,
        reduction="sum",
    )
    return loss, int((labels != ignore_index).sum())


def lm_loss(model: nn.Module, batch: tuple[Tensor, Tensor], *, label_smoothing: float = 0.0):
    """Next-token loss for a GPT: batch = (x (B, T), y (B, T) = x shifted by one)."""
    x, y = batch
    pad = _config(model).pad_id
    logits = model(x).logits  # (B, T, V)
    return token_cross_entropy(
        logits, y, ignore_index=-100 if pad is None else pad, label_smoothing=label_smoothing
    )


def seq2seq_loss(
    model: nn.Module, batch: tuple[Tensor, Tensor, Tensor], *, label_smoothing: float = 0.0
):
    """Teacher-forced loss: batch = (src (B, S), tgt_in (B, T), labels (B, T))."""
    src, tgt_in, labels = batch
    logits = model(src, tgt_in).logits  # (B, T, V)
    return token_cross_entropy(
        logits, labels, ignore_index=_config(model).pad_id, label_smoothing=label_smoothing
    )


def classify_loss(model: nn.Module, batch: tuple[Tensor, Tensor], *, label_smoothing: float = 0.0):
    """Classification loss: batch = (ids (B, T), labels (B,)); one item per example."""
    ids, labels = batch
    logits = model(ids).logits  # (B, C)
    return token_cross_entropy(logits, labels, label_smoothing=label_smoothing)


def mlm_loss(model: nn.Module, batch: tuple[Tensor, Tensor], *, label_smoothing: float = 0.0):
    """Masked-LM loss: batch = (inputs (B, T), labels (B, T), -100 where not masked); only
    the masked positions are scored, and only their logits are computed."""
    inputs, labels = batch
    logits = model(inputs, labels=labels, labelled_only=True).logits  # (N, V)
    return token_cross_entropy(logits, labels[labels != -100], label_smoothing=label_smoothing)


def _config(model: nn.Module):
    """The model's config, through a ``DistributedDataParallel`` wrapper."""
    return getattr(model, "module", model).config


LOSSES: dict[str, Callable[..., tuple[Tensor, int]]] = {
    "lm": lm_loss,
    "translate": seq2seq_loss,
    "classify": classify_loss,
    "mlm": mlm_loss,
    "vision": classify_loss,  # batch = (images (B, C, H, W), labels (B,))
}


def loss_for(task: str, label_smoothing: float = 0.0):
    """The loss function of a task ("lm", "translate", "classify", "mlm", "vision")."""
    if task not in LOSSES:
        raise ValueError(f"task must be one of {sorted(LOSSES)}, got {task!r}")
    if not 0.0 <= label_smoothing < 1.0:
        raise ValueError(f"label_smoothing must be in [0, 1), got {label_smoothing}")
    return functools.partial(LOSSES[task], label_smoothing=label_smoothing)
