"""Choosing the next token, and the decoder-only (GPT) loop.

Shapes: B batch, T length so far, V vocabulary.

Each step runs the model, takes the last position's logits, adjusts them (repetition
penalty), picks a token (``choose_next``: greedy, or sampled with temperature, top-k,
top-p), appends it, and stops on a stop token or the length limit. With ``use_cache``
(the default) each step feeds only the newest token and the model's key/value cache
supplies the rest; ``use_cache=False`` reruns the whole sequence every step. That
reference path gives the same tokens and is kept for tests.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import Tensor

from glassformer.errors import NonFiniteLogitsError
from glassformer.generation.config import (
    GenerationConfig,
    check_repetition_penalty,
    resolve_config,
)
from glassformer.generation.protocols import CausalLM
from glassformer.generation.static import (
    can_decode_statically,
    compiled_step,
    decode_step,
    static_cache,
    use_whole_buffers,
)
from glassformer.modules.cache import DecoderCache
from glassformer.modules.sdpa import attention_mask_to_key_mask

Streamer = Callable[[Tensor], None]  # called with each step's new tokens (B,)


def choose_next(
    logits: Tensor,
    *,
    generation_config: GenerationConfig | None = None,
    generator: torch.Generator | None = None,
    step: int | None = None,
    **options: Any,
) -> Tensor:
    """Pick the next token from last-position logits (B, V) → ids (B,).

    Greedy takes the arg-max. Sampling (``do_sample=True``) divides by ``temperature``,
    keeps the ``top_k`` most likely tokens and/or the smallest set whose probability
    reaches ``top_p``, then draws from what is left with ``generator``. Ids from
    ``vocab_limit`` on are never chosen. The options come as a ``GenerationConfig`` and/or
    keywords (see ``resolve_config``); ``step`` (the decoding step) is named in errors.

    Raises:
        NonFiniteLogitsError: logits with a NaN or +inf, or a row without a finite one.
    """
    call_arguments = ("generation_config", "generator", "step")
    c = resolve_config(generation_config, options, call_arguments)
    logits = usable_logits(logits, c.vocab_limit, step)
    if not c.do_sample:
        return logits.argmax(dim=-1)
    logits = logits.float() / c.temperature
    if c.top_k is not None:
        kth = logits.topk(min(c.top_k, logits.size(-1)), dim=-1).values[:, -1:]  # (B, 1)
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if c.top_p is not None:
        sorted_logits, order = logits.sort(dim=-1, descending=True)  # (B, V)
        cumulative = sorted_logits.softmax(dim=-1).cumsum(dim=-1)
        # Drop a token when the tokens before it already reach top_p (the first always stays).
        drop_sorted = (cumulative - sorted_logits.softmax(dim=-1)) >= c.top_p
        drop = drop_sorted.scatter(-1, order, drop_sorted)  # back to vocabulary order
        logits = logits.masked_fill(drop, float("-inf"))
    probs = logits.softmax(dim=-1)  # (B, V)
    return torch.multinomial(probs, num_samples=1, generator=generator).squeeze(-1)


def usable_logits(logits: Tensor, vocab_limit: int | None, step: int | None = None) -> Tensor:
    """Logits (B, V) a token can be chosen from: ids from ``vocab_limit`` on ruled out
    (-inf), then checked to be finite where they count.

    A model with a NaN weight, quantisation scale or norm epsilon gives NaN logits: the
    arg-max of those is nonsense, and sampling from them fails deep inside PyTorch. They
    are refused here, naming the decoding ``step``; the padded ids past ``vocab_limit``
    (which may hold anything) do not count.

    Raises:
        NonFiniteLogitsError: a NaN or +inf among the ids that count, or a row where no
            id has a finite logit.
    """
    if vocab_limit is not None and vocab_limit < logits.size(-1):
        logits = logits.clone()
        logits[:, vocab_limit:] = float("-inf")
    best = logits.amax(dim=-1)  # (B,): NaN where a row has one, +inf, or -inf if none finite
    bad = ~torch.isfinite(best)
    if bool(bad.any()):
        row = int(bad.nonzero()[0])
        at = f"decoding step {step}: " if step is not None else ""
        raise NonFiniteLogitsError(
            f"{at}the model's logits are not finite (NaN or infinite in row {row}); "
            "its weights, a quantisation scale or a norm's epsilon are likely NaN or infinite",
            step=step,
        )
    return logits


def apply_repetition_penalty(
    logits: Tensor, ids: Tensor, penalty: float, keep: Tensor | None = None
) -> Tensor:
    """Make tokens already in ``ids`` (B, T) less likely: logits (B, V) → (B, V).

    The CTRL rule (as in Hugging Face): a seen token's positive logit is divided by
    ``penalty``, a negative one multiplied, so ``penalty > 1`` always lowers it. Positions
    where ``keep`` (B, T) is False (padding) do not count as seen.
    """
    check_repetition_penalty(penalty)
    if penalty == 1.0:
        return logits
    real = torch.ones_like(ids, dtype=logits.dtype) if keep is None else keep.to(logits.dtype)
    seen = torch.zeros_like(logits).scatter_add_(1, ids, real) > 0  # (B, V)
    penalised = torch.where(logits > 0, logits / penalty, logits * penalty)
    return torch.where(seen, penalised, logits)


def _stop_ids(eos_id: int | Sequence[int] | None) -> list[int]:
    if eos_id is None:
        return []
    return [eos_id] if isinstance(eos_id, int) else list(eos_id)


# ---- GPT ---------------------------------------------------------------------------------

_GPT_CALL_ARGUMENTS = ("generation_config", "attention_mask", "generator", "streamer")


@torch.no_grad()
def gpt_generate(
    model: CausalLM,
    input_ids: Tensor,
    max_new_tokens: int,
    *,
    generation_config: GenerationConfig | None = None,
    attention_mask: Tensor | None = None,
    generator: torch.Generator | None = None,
    streamer: Streamer | None = None,
    **options: Any,
) -> Tensor:
    """Append up to ``max_new_tokens`` tokens to ``input_ids`` (B, T) → (B, T + new).

    Args:
        model: a ``GPT``.
        input_ids: prompts (B, T). Prompts of different lengths are padded with the
            model's ``pad_id`` on either side (or described by ``attention_mask``); the
            result is left-padded: each row's prompt ends where its new tokens begin.
        max_new_tokens: at most this many tokens per row.
        generation_config: the decoding options (``GenerationConfig``; None: greedy).
            A row that emits a stop token (``eos_id``) is finished; its later columns
            hold ``pad_id`` (or the first stop token). Generation ends when every row
            has finished. ``repetition_penalty`` counts the prompt's tokens too.
        attention_mask: (B, T), 1 (or True) for real prompt tokens, 0 for padding, as
            models' ``forward`` takes it; needed when the model has no ``pad_id``.
        generator: makes sampling reproducible.
        streamer: called with each step's new tokens (B,) as soon as they are chosen.
        **options: ``GenerationConfig`` fields (``do_sample=True``, ``top_k=50``, ...),
            overriding ``generation_config``'s.

    Beyond ``max_len`` tokens the context is the last ``max_len`` (nanoGPT's crop); the
    positions then shift every step, so each step reruns the window, cache or not.
    """
    gen = resolve_config(generation_config, options, _GPT_CALL_ARGUMENTS)
    if input_ids.dim() != 2 or input_ids.size(1) == 0:
        raise ValueError(f"input_ids must be (batch, length>0), got {tuple(input_ids.shape)}")
    if max_new_tokens < 0:
        raise ValueError(f"max_new_tokens must be >= 0, got {max_new_tokens}")
    if gen.beam_size != 1:
        raise ValueError(
            f"beam search is the translator's; a GPT decodes with beam_size=1, got {gen.beam_size}"
        )
    c = model.config
    ids, keep = _left_align(input_ids, _real_tokens(input_ids, attention_mask, c.pad_id))
    stops = _stop_ids(gen.eos_id)
    stop_tensor = torch.tensor(stops, device=ids.device)
    fill = c.pad_id if c.pad_id is not None else (stops[0] if stops else 0)
    B, prompt_len = ids.shape
    total = prompt_len + max_new_tokens
    # The whole output is allocated once; each step writes a column (no growing copies).
    out = ids.new_full((B, total), fill)
    out[:, :prompt_len] = ids
    real = keep.new_ones(B, total)  # (B, total): False at the prompt's padding
    real[:, :prompt_len] = keep
    finished = torch.zeros(B, dtype=torch.bool, device=ids.device)
    was_training = model.training
    model.eval()
    later = contextlib.ExitStack()  # what a step puts in place for the rest of the generation
    next_logits = _next_logits_function(model, gen, ids, keep, total, later)
    length = prompt_len
    try:
        for length in range(prompt_len, total):
            logits = next_logits(out, real, length)  # (B, V) after out[:, :length]
            logits = apply_repetition_penalty(
                logits, out[:, :length], gen.repetition_penalty, real[:, :length]
            )
            step = length - prompt_len + 1
            next_id = choose_next(logits, generation_config=gen, generator=generator, step=step)
            if stops:
                next_id = next_id.masked_fill(finished, fill)
                finished |= torch.isin(next_id, stop_tensor)
            out[:, length] = next_id
            if streamer is not None:
                streamer(next_id)
            if stops and finished.all():
                return out[:, : length + 1]
        length = total
    finally:
        later.close()
        model.train(was_training)
    return out[:, :length]


def _next_logits_function(
    model: CausalLM, gen: GenerationConfig, ids: Tensor, keep: Tensor, total: int, later: Any
):
    """``next_logits(out, real, length)``: the last-position logits (B, V) after the first
    ``length`` columns of ``out`` (B, total); ``real`` (B, total) marks the non-padding.

    The static path (a preallocated cache and a one-token step) where the model takes it,
    else the plain path through the model's forward.
    """
    padded = not bool(keep.all())
    static = gen.use_cache and gen.static_cache and total <= model.config.max_len
    switch = rope_switch(model)  # a static cache cannot be recomputed where LongRoPE switches
    static = static and (switch is None or not ids.size(1) <= switch < total)
    if static and can_decode_statically(model) is None:
        return _static_next_logits(model, ids, keep, total, gen.compile, later)
    cache: list[DecoderCache | None] = [None]

    def plain(out: Tensor, real: Tensor, length: int) -> Tensor:
        keep_so_far = real[:, :length] if padded else None
        logits, cache[0] = _gpt_next_logits(
            model, out[:, :length], keep_so_far, cache[0], gen.use_cache
        )
        return logits

    return plain


def _static_next_logits(
    model: CausalLM,
    ids: Tensor,
    keep: Tensor,
    total: int,
    compile: bool,
    later: contextlib.ExitStack,
):
    """The static path: the prompt through the model's forward into a static cache, then
    ``decode_step`` (the model's forward again, one token) for each new token."""
    B, prompt_len = ids.shape
    # Compiled, the step's shapes include the cache's length: rounded up to a multiple of
    # 256, one compilation serves every generation of that batch size up to that length.
    capacity = min(model.config.max_len, -(-total // 256) * 256) if compile else total
    cache = static_cache(model, B, capacity)
    filled = torch.zeros(B, 1, 1, capacity, dtype=torch.bool, device=ids.device)
    filled[:, 0, 0, :prompt_len] = keep  # the slots holding real tokens so far
    positions = keep.sum(dim=1, keepdim=True)  # (B, 1) the next token's position
    token = ids.new_zeros(B, 1)  # the newest token, in one buffer for every step
    step = compiled_step(model) if compile else decode_step
    padded = not bool(keep.all())

    def next_logits(out: Tensor, real: Tensor, length: int) -> Tensor:
        if length == prompt_len:  # the prompt, all at once: fused causal attention
            prompt_positions = (keep.cumsum(dim=1) - 1).clamp(min=0) if padded else None
            mask = keep[:, None, None, :] if padded else None
            logits = model(
                ids, mask=mask, cache=cache, positions=prompt_positions, logits_to_keep=1
            ).logits[:, -1]
            if compile:  # from now on the same shapes every step: one compilation
                use_whole_buffers(cache)
            return logits
        filled[:, 0, 0, length - 1] = True  # the newest token's slot
        token.copy_(out[:, length - 1 : length])
        # Eager, the cache hands attention the filled slots only: they need a mask only
        # where a prompt had padding.
        mask = filled if compile else filled[..., :length] if padded else None
        if compile and length == prompt_len + 2:
            # From the second step on, this generation's shapes are those the guards of the
            # graph compiled (or picked) for the first step checked: only the guards that
            # tell graphs apart are evaluated again (1.3 ms a step for SmolLM2). Set once,
            # until the generation ends: entering the stance costs 0.8 ms.
            later.enter_context(torch.compiler.set_stance("default", skip_guard_eval_unsafe=True))
        logits = step(model, token, positions, mask, cache)
        positions.add_(1)
        return logits

    return next_logits


def _gpt_next_logits(
    model: CausalLM, ids: Tensor, keep: Tensor | None, cache: DecoderCache | None, use_cache: bool
) -> tuple[Tensor, DecoderCache | None]:
    """Last-position logits (B, V) for ``ids`` (B, T), and the cache to use next step.

    ``keep`` (B, T) marks real tokens of a left-padded batch (None: no padding); a real
    token's position is the number of real tokens before it.
    """
    max_len = model.config.max_len
    length = ids.size(1)
    if (
        cache is not None
        and cache.length == length - 1
        and length <= max_len
        and cache.length != rope_switch(model)  # (crossing it: every key turned anew)
    ):
        # The cache holds every token but the newest: feed that one alone.
        positions = mask = None
        if keep is not None:
            positions = keep[:, :-1].sum(dim=1, keepdim=True)  # (B, 1)
            mask = keep[:, None, None, :]  # (B, 1, 1, T): the cached keys and the new one
        out = model(ids[:, -1:], mask=mask, cache=cache, positions=positions)
        return out.logits[:, -1], cache
    window = ids[:, -max_len:]  # the whole context (cropped to max_len)
    positions = mask = None
    if keep is not None:
        window_keep = keep[:, -max_len:]
        positions = (window_keep.cumsum(dim=1) - 1).clamp(min=0)  # pads sit at 0, unseen
        mask = window_keep[:, None, None, :]
    # A cache only helps while the context still fits: past max_len every step shifts.
    cache = model.new_cache() if use_cache and length < max_len else None
    out = model(window, mask=mask, cache=cache, positions=positions, logits_to_keep=1)
    return out.logits[:, -1], cache


def rope_switch(model: CausalLM) -> int | None:
    """The length past which a LongRoPE model (Phi-3) turns every position by its long
    factors, or None. A generation crossing it recomputes its cache, as transformers does:
    the keys cached so far were turned by the short factors."""
    scaling = getattr(getattr(model, "rotary", None), "scaling", None)
    if scaling is None or scaling.rope_type != "longrope":
        return None
    return scaling.original_max_len


def _real_tokens(ids: Tensor, attention_mask: Tensor | None, pad_id: int | None) -> Tensor:
    """(B, T) bool: which prompt positions are real tokens."""
    if attention_mask is not None:
        keep = attention_mask_to_key_mask(attention_mask, ids)[:, 0, 0]  # checked, (B, T)
    elif pad_id is not None:
        keep = ids != pad_id
    else:
        keep = torch.ones_like(ids, dtype=torch.bool)
    empty = (~keep.any(dim=1)).nonzero()
    if len(empty):
        raise ValueError(f"prompt row {empty[0].item()} has no tokens, only padding")
    return keep


def _left_align(ids: Tensor, keep: Tensor) -> tuple[Tensor, Tensor]:
    """Move each row's real tokens to the right end, keeping their order (left padding)."""
    order = keep.int().sort(dim=1, stable=True).indices  # pads first, then the real tokens
    return ids.gather(1, order), keep.gather(1, order)
