"""Scoring a model: mean loss, accuracy, BLEU. (Translating and classifying texts, which
the scores use, are ``glassformer.inference``'s; they stay importable from here.)"""

from __future__ import annotations

import torch
from torch import nn

from glassformer.inference import classify_texts, device_of, translate_texts, truncate
from glassformer.training.loop import to_device

__all__ = [
    "bleu",
    "classify_texts",
    "device_of",
    "mean_loss",
    "score",
    "translate_texts",
    "truncate",
]


def mean_loss(model: nn.Module, loss_fn, batches) -> float:
    """Mean of a (sum, count) loss over batches."""
    total, count = 0.0, 0
    device = device_of(model)
    with torch.no_grad():
        for batch in batches:
            loss, n = loss_fn(model, to_device(batch, device))
            total, count = total + loss.item(), count + n
    return total / max(count, 1)


def bleu(hypotheses: list[str], references: list[str]) -> float:
    """Corpus sacreBLEU (13a tokenisation), the standard reported figure."""
    try:
        import sacrebleu
    except ImportError:
        raise ValueError("BLEU needs sacrebleu: pip install 'glassformer[data]'") from None
    return sacrebleu.corpus_bleu(hypotheses, [references]).score


def score(model: nn.Module, batches, *, prefix: str = "", outputs=None) -> dict[str, float]:
    """Mean loss and accuracy over batches: of a classifier's (ids, labels) batches, or of
    what ``outputs(model, batch) -> (logits (N, C), targets (N,))`` makes of each batch
    (a masked LM's masked positions)."""
    outputs = outputs or _class_outputs
    total, correct, count = 0.0, 0, 0
    device = device_of(model)
    for batch in batches:
        logits, targets = outputs(model, to_device(batch, device))
        total += torch.nn.functional.cross_entropy(logits.float(), targets, reduction="sum").item()
        correct += (logits.argmax(-1) == targets).sum().item()
        count += len(targets)
    return {f"{prefix}loss": total / count, f"{prefix}accuracy": correct / count}


def _class_outputs(model: nn.Module, batch) -> tuple[torch.Tensor, torch.Tensor]:
    ids, labels = batch
    return model(ids).logits, labels
