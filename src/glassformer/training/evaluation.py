"""Using and scoring a trained model: translate or classify texts, BLEU, accuracy, loss."""

from __future__ import annotations

import torch
from torch import nn

from glassformer.generation import GenerationConfig
from glassformer.training.loop import to_device


def device_of(model) -> torch.device:
    """Where a model's weights are (the CPU for a model that is not a torch module)."""
    params = model.parameters() if isinstance(model, nn.Module) else iter(())
    return next(params, torch.empty(0)).device


def translate_texts(
    model,
    tokenizer,
    texts: list[str],
    *,
    max_len: int | None = None,
    batch_size: int = 64,
    generation_config: GenerationConfig | None = None,
    **generate_kwargs,
) -> list[str]:
    """Translate a list of sentences with ``model.generate``; returns decoded strings.

    ``generation_config`` and ``generate_kwargs`` (its fields as keywords, overriding it,
    and ``generator``) go to ``generate`` unchanged.
    """
    from glassformer.data.batching import pad_batch

    limit = max_len or model.config.max_len - 1
    out: list[str] = [""] * len(texts)
    encoded = tokenizer.encode_batch(texts)
    order = sorted(range(len(texts)), key=lambda i: len(encoded[i]))
    device = device_of(model)
    model.eval()
    for start in range(0, len(order), batch_size):
        idx = order[start : start + batch_size]
        src = pad_batch([encoded[i][:limit] or [tokenizer.unk_id] for i in idx], tokenizer.pad_id)
        src = src.to(device)
        new_tokens = min(limit, int(src.size(1) * 1.5) + 10)
        ys = model.generate(src, new_tokens, generation_config=generation_config, **generate_kwargs)
        for i, row in zip(idx, ys.tolist(), strict=True):
            out[i] = tokenizer.decode(row[1:])
    return out


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


def truncate(ids: list[int], max_len: int) -> list[int]:
    """Keep the head and the tail of a long sequence (reviews state their verdict at both ends)."""
    if len(ids) <= max_len:
        return ids
    head = max_len // 2
    return ids[:head] + ids[len(ids) - (max_len - head) :]


def score(model: nn.Module, batches, *, prefix: str = "") -> dict[str, float]:
    """Mean loss and accuracy of a classifier over (ids, labels) batches."""
    total, correct, count = 0.0, 0, 0
    device = device_of(model)
    for ids, labels in batches:
        ids, labels = ids.to(device), labels.to(device)
        logits = model(ids).logits
        total += torch.nn.functional.cross_entropy(logits.float(), labels, reduction="sum").item()
        correct += (logits.argmax(-1) == labels).sum().item()
        count += len(labels)
    return {f"{prefix}loss": total / count, f"{prefix}accuracy": correct / count}


def classify_texts(
    model,
    tokenizer,
    labels: list[str],
    texts: list[str],
    *,
    max_len: int | None = None,
    batch_size: int = 64,
) -> list[tuple[str, float]]:
    """(label, probability) for each text."""
    from glassformer.data.batching import pad_batch

    limit = max_len or model.config.max_len
    encoded = [truncate(i, limit) or [tokenizer.unk_id] for i in tokenizer.encode_batch(texts)]
    out: list[tuple[str, float]] = []
    device = device_of(model)
    model.eval()
    with torch.no_grad():
        for start in range(0, len(encoded), batch_size):
            ids = pad_batch(encoded[start : start + batch_size], tokenizer.pad_id)
            ids = ids.to(device)
            probs = model(ids).logits.float().softmax(-1)
            p, k = probs.max(-1)
            out += [(labels[i], float(q)) for i, q in zip(k.tolist(), p.tolist(), strict=True)]
    return out
