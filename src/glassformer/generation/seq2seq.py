"""The encoder-decoder (translator) loop: encode the source once, then decode.

Shapes: B batch, S source length, T target length so far, D d_model.

Each step decodes the target so far (with the cache: only its newest token) and appends
a token, greedily or sampled (``choose_next``), or hands the whole search to
``beam_search`` when ``beam_size > 1``. The result starts with the start token
(``bos_id``); a row ends at ``eos_id`` and is padded with ``pad_id`` after it.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from glassformer.generation.beam import beam_search, decoder_logits, never_specials
from glassformer.generation.config import GenerationConfig, resolve_config
from glassformer.generation.protocols import Seq2SeqLM
from glassformer.generation.sampling import Streamer, apply_repetition_penalty, choose_next
from glassformer.modules.sdpa import auto_padding_mask

_SEQ2SEQ_CALL_ARGUMENTS = ("generation_config", "src_mask", "generator", "streamer")


@torch.no_grad()
def seq2seq_generate(
    model: Seq2SeqLM,
    src: Tensor,
    max_new_tokens: int,
    *,
    generation_config: GenerationConfig | None = None,
    src_mask: Tensor | None = None,
    generator: torch.Generator | None = None,
    streamer: Streamer | None = None,
    **options: Any,
) -> Tensor:
    """Translate ``src`` (B, S) → target ids (B, T) starting with ``bos_id``.

    At most ``max_len - 1`` tokens follow the start token.

    Args:
        model: a ``Seq2SeqTransformer``.
        src: source ids (B, S), padded with the model's ``pad_id``.
        max_new_tokens: at most this many tokens after the start token.
        generation_config: the decoding options (``GenerationConfig``; None: greedy).
            ``beam_size > 1`` searches (see ``beam_search``); sampling needs
            ``beam_size=1``. ``repetition_penalty`` counts the target's tokens only. The
            stop token is the model's ``eos_id``, so ``eos_id`` must be None.
        src_mask: key mask for the source (B, 1, 1, S); built from ``pad_id`` if None.
        generator: makes sampling reproducible.
        streamer: called with each step's new tokens (B,) (not with beam search, whose
            tokens are only known at the end).
        **options: ``GenerationConfig`` fields (``beam_size=4``, ...), overriding
            ``generation_config``'s.
    """
    gen = resolve_config(generation_config, options, _SEQ2SEQ_CALL_ARGUMENTS)
    c = model.config
    if src.dim() != 2 or src.size(1) == 0:
        raise ValueError(f"src must be (batch, length>0), got {tuple(src.shape)}")
    if gen.eos_id is not None:
        raise ValueError(
            f"the translator stops at its config's eos_id ({c.eos_id}); "
            f"eos_id must be None, got {gen.eos_id}"
        )
    max_new_tokens = min(max_new_tokens, c.max_len - 1)
    was_training = model.training
    model.eval()
    try:
        if src_mask is None:
            src_mask = auto_padding_mask(src, c.pad_id)
        memory = model.encode(src, src_mask).hidden  # (B, S, D)
        if gen.beam_size > 1:
            return beam_search(model, memory, src_mask, max_new_tokens, generation_config=gen)
        ys = torch.full((src.size(0), 1), c.bos_id, dtype=torch.long, device=src.device)
        finished = torch.zeros(src.size(0), dtype=torch.bool, device=src.device)
        cache = model.new_cache() if gen.use_cache else None
        for step in range(1, max_new_tokens + 1):
            logits = decoder_logits(model, ys, memory, src_mask, cache)
            logits = apply_repetition_penalty(logits, ys[:, 1:], gen.repetition_penalty)
            logits = never_specials(logits, c)
            next_id = choose_next(logits, generation_config=gen, generator=generator, step=step)
            next_id = next_id.masked_fill(finished, c.pad_id)
            finished |= next_id == c.eos_id
            ys = torch.cat([ys, next_id[:, None]], dim=1)  # (B, T + 1)
            if streamer is not None:
                streamer(next_id)
            if finished.all():
                break
        return ys
    finally:
        model.train(was_training)
