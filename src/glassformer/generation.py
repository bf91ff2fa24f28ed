"""Turning a trained model into text: token choice and decoding loops.

Shapes: B batch, T length so far, V vocabulary.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from glassformer.models.common import auto_padding_mask


def choose_next(
    logits: Tensor,
    *,
    do_sample: bool = False,
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
    generator: torch.Generator | None = None,
) -> Tensor:
    """Pick the next token from last-position logits (B, V) → ids (B,).

    Greedy takes the arg-max. Sampling divides by ``temperature``, keeps the ``top_k``
    most likely tokens and/or the smallest set whose probability reaches ``top_p``,
    then draws from what is left.
    """
    if not do_sample:
        return logits.argmax(dim=-1)
    if not temperature > 0 or math.isinf(temperature):  # also refuses NaN
        raise ValueError(f"temperature must be > 0 when sampling, got {temperature}")
    logits = logits.float() / temperature
    if top_k is not None:
        if top_k <= 0:
            raise ValueError(f"top_k must be a positive integer, got {top_k}")
        kth = logits.topk(min(top_k, logits.size(-1)), dim=-1).values[:, -1:]  # (B, 1)
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p is not None:
        if not 0.0 < top_p <= 1.0:
            raise ValueError(f"top_p must be in (0, 1], got {top_p}")
        sorted_logits, order = logits.sort(dim=-1, descending=True)  # (B, V)
        cumulative = sorted_logits.softmax(dim=-1).cumsum(dim=-1)
        # Drop a token when the tokens before it already reach top_p (the first always stays).
        drop_sorted = (cumulative - sorted_logits.softmax(dim=-1)) >= top_p
        drop = drop_sorted.scatter(-1, order, drop_sorted)  # back to vocabulary order
        logits = logits.masked_fill(drop, float("-inf"))
    probs = logits.softmax(dim=-1)  # (B, V)
    return torch.multinomial(probs, num_samples=1, generator=generator).squeeze(-1)


def gpt_generate(
    model,
    input_ids: Tensor,
    max_new_tokens: int,
    *,
    do_sample: bool = False,
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
    eos_id: int | None = None,
    generator: torch.Generator | None = None,
) -> Tensor:
    """Append up to ``max_new_tokens`` tokens to ``input_ids`` (B, T) → (B, T + new).

    The context is cropped to the model's ``max_len``. Rows that have emitted ``eos_id``
    are filled with the pad id (or ``eos_id``) until every row has finished.
    """
    if input_ids.dim() != 2 or input_ids.size(1) == 0:
        raise ValueError(f"input_ids must be (batch, length>0), got {tuple(input_ids.shape)}")
    was_training = model.training
    model.eval()
    max_len = model.config.max_len
    fill = model.config.pad_id if model.config.pad_id is not None else eos_id
    ids = input_ids
    finished = torch.zeros(ids.size(0), dtype=torch.bool, device=ids.device)
    for _ in range(max_new_tokens):
        logits = model(ids[:, -max_len:]).logits[:, -1]  # (B, V)
        next_id = choose_next(
            logits,
            do_sample=do_sample,
            temperature=temperature,
            top_k=top_k,
            top_p=top_p,
            generator=generator,
        )
        if eos_id is not None:
            next_id = next_id.masked_fill(finished, fill)
            finished |= next_id == eos_id
        ids = torch.cat([ids, next_id[:, None]], dim=1)  # (B, T + 1)
        if eos_id is not None and finished.all():
            break
    model.train(was_training)
    return ids


def seq2seq_generate(model, src: Tensor, max_new_tokens: int) -> Tensor:
    """Greedy translation: (B, S) source ids → (B, T) target ids starting with ``bos_id``.

    The source is encoded once; each step decodes the target so far and appends the
    most likely token. Stops when every row has produced ``eos_id``; finished rows are
    padded with ``pad_id``.
    """
    c = model.config
    was_training = model.training
    model.eval()
    src_mask = auto_padding_mask(src, c.pad_id)
    memory = model.encode(src, src_mask).hidden  # (B, S, D)
    ys = torch.full((src.size(0), 1), c.bos_id, dtype=torch.long, device=src.device)
    finished = torch.zeros(src.size(0), dtype=torch.bool, device=src.device)
    for _ in range(max_new_tokens):
        hidden = model.decode(ys, memory, src_mask).hidden  # (B, T, D)
        next_id = model.output_proj(hidden[:, -1]).argmax(dim=-1)  # (B,)
        next_id = next_id.masked_fill(finished, c.pad_id)
        finished |= next_id == c.eos_id
        ys = torch.cat([ys, next_id[:, None]], dim=1)  # (B, T + 1)
        if finished.all():
            break
    model.train(was_training)
    return ys
