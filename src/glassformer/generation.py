"""Turning a trained model into text: token choice and decoding loops.

Shapes: B batch, T length so far, V vocabulary, K beams.

Both model kinds decode the same way: run the model, take the last position's logits,
adjust them (repetition penalty), pick a token (greedy, or sampled with temperature,
top-k, top-p), append it, stop on a stop token or the length limit. With
``use_cache=True`` (the default) each step feeds only the newest token and the model's
key/value cache supplies the rest; ``use_cache=False`` reruns the whole sequence every
step. That reference path gives the same tokens and is kept for tests.

The translator can also search: ``beam_size > 1`` keeps the K most likely partial
translations at every step (see ``beam_search``).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import torch
from torch import Tensor

from glassformer.models.common import auto_padding_mask
from glassformer.modules.cache import DecoderCache
from glassformer.modules.masks import attention_mask_to_key_mask

Streamer = Callable[[Tensor], None]  # called with each step's new tokens (B,)


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
    check_sampling(temperature, top_k, top_p)
    logits = logits.float() / temperature
    if top_k is not None:
        kth = logits.topk(min(top_k, logits.size(-1)), dim=-1).values[:, -1:]  # (B, 1)
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p is not None:
        sorted_logits, order = logits.sort(dim=-1, descending=True)  # (B, V)
        cumulative = sorted_logits.softmax(dim=-1).cumsum(dim=-1)
        # Drop a token when the tokens before it already reach top_p (the first always stays).
        drop_sorted = (cumulative - sorted_logits.softmax(dim=-1)) >= top_p
        drop = drop_sorted.scatter(-1, order, drop_sorted)  # back to vocabulary order
        logits = logits.masked_fill(drop, float("-inf"))
    probs = logits.softmax(dim=-1)  # (B, V)
    return torch.multinomial(probs, num_samples=1, generator=generator).squeeze(-1)


def check_sampling(temperature: float, top_k: int | None, top_p: float | None) -> None:
    if not temperature > 0 or math.isinf(temperature):  # also refuses NaN
        raise ValueError(f"temperature must be > 0 when sampling, got {temperature}")
    if top_k is not None and top_k <= 0:
        raise ValueError(f"top_k must be a positive integer, got {top_k}")
    if top_p is not None and not 0.0 < top_p <= 1.0:
        raise ValueError(f"top_p must be in (0, 1], got {top_p}")


def apply_repetition_penalty(
    logits: Tensor, ids: Tensor, penalty: float, keep: Tensor | None = None
) -> Tensor:
    """Make tokens already in ``ids`` (B, T) less likely: logits (B, V) → (B, V).

    The CTRL rule (as in Hugging Face): a seen token's positive logit is divided by
    ``penalty``, a negative one multiplied, so ``penalty > 1`` always lowers it. Positions
    where ``keep`` (B, T) is False (padding) do not count as seen.
    """
    if not penalty > 0 or math.isinf(penalty):
        raise ValueError(f"repetition_penalty must be > 0, got {penalty}")
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


@torch.no_grad()
def gpt_generate(
    model,
    input_ids: Tensor,
    max_new_tokens: int,
    *,
    do_sample: bool = False,
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
    repetition_penalty: float = 1.0,
    eos_id: int | Sequence[int] | None = None,
    attention_mask: Tensor | None = None,
    use_cache: bool = True,
    generator: torch.Generator | None = None,
    streamer: Streamer | None = None,
) -> Tensor:
    """Append up to ``max_new_tokens`` tokens to ``input_ids`` (B, T) → (B, T + new).

    Args:
        model: a ``GPT``.
        input_ids: prompts (B, T). Prompts of different lengths are padded with the
            model's ``pad_id`` on either side (or described by ``attention_mask``); the
            result is left-padded: each row's prompt ends where its new tokens begin.
        max_new_tokens: at most this many tokens per row.
        do_sample, temperature, top_k, top_p: see ``choose_next``.
        repetition_penalty: > 1 discourages tokens already in the row (prompt included).
        eos_id: a stop token or several. A row that emits one is finished; its later
            columns hold ``pad_id`` (or the first stop token). Generation ends when every
            row has finished.
        attention_mask: (B, T), 1 (or True) for real prompt tokens, 0 for padding, as
            models' ``forward`` takes it; needed when the model has no ``pad_id``.
        use_cache: decode with the key/value cache (fast) or rerun the whole context
            every step (the reference path).
        generator: makes sampling reproducible.
        streamer: called with each step's new tokens (B,) as soon as they are chosen.

    Beyond ``max_len`` tokens the context is the last ``max_len`` (nanoGPT's crop); the
    positions then shift every step, so each step reruns the window, cache or not.
    """
    if input_ids.dim() != 2 or input_ids.size(1) == 0:
        raise ValueError(f"input_ids must be (batch, length>0), got {tuple(input_ids.shape)}")
    if max_new_tokens < 0:
        raise ValueError(f"max_new_tokens must be >= 0, got {max_new_tokens}")
    if do_sample:
        check_sampling(temperature, top_k, top_p)
    if not repetition_penalty > 0 or math.isinf(repetition_penalty):
        raise ValueError(f"repetition_penalty must be > 0, got {repetition_penalty}")
    c = model.config
    ids, keep = _left_align(input_ids, _real_tokens(input_ids, attention_mask, c.pad_id))
    padded = not bool(keep.all())
    stops = _stop_ids(eos_id)
    stop_tensor = torch.tensor(stops, device=ids.device)
    fill = c.pad_id if c.pad_id is not None else (stops[0] if stops else 0)
    finished = torch.zeros(ids.size(0), dtype=torch.bool, device=ids.device)
    was_training = model.training
    model.eval()
    cache = None
    try:
        for _ in range(max_new_tokens):
            logits, cache = _gpt_next_logits(model, ids, keep if padded else None, cache, use_cache)
            logits = apply_repetition_penalty(logits, ids, repetition_penalty, keep)
            next_id = choose_next(
                logits,
                do_sample=do_sample,
                temperature=temperature,
                top_k=top_k,
                top_p=top_p,
                generator=generator,
            )
            if stops:
                next_id = next_id.masked_fill(finished, fill)
                finished |= torch.isin(next_id, stop_tensor)
            ids = torch.cat([ids, next_id[:, None]], dim=1)  # (B, T + 1)
            keep = torch.cat([keep, keep.new_ones(ids.size(0), 1)], dim=1)
            if streamer is not None:
                streamer(next_id)
            if stops and finished.all():
                break
    finally:
        model.train(was_training)
    return ids


def _gpt_next_logits(
    model, ids: Tensor, keep: Tensor | None, cache: DecoderCache | None, use_cache: bool
) -> tuple[Tensor, DecoderCache | None]:
    """Last-position logits (B, V) for ``ids`` (B, T), and the cache to use next step.

    ``keep`` (B, T) marks real tokens of a left-padded batch (None: no padding); a real
    token's position is the number of real tokens before it.
    """
    max_len = model.config.max_len
    length = ids.size(1)
    if cache is not None and cache.length == length - 1 and length <= max_len:
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
    out = model(window, mask=mask, cache=cache, positions=positions)
    return out.logits[:, -1], cache


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


# ---- translator --------------------------------------------------------------------------


@torch.no_grad()
def seq2seq_generate(
    model,
    src: Tensor,
    max_new_tokens: int,
    *,
    beam_size: int = 1,
    length_penalty: float = 1.0,
    early_stopping: bool = True,
    do_sample: bool = False,
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
    repetition_penalty: float = 1.0,
    src_mask: Tensor | None = None,
    use_cache: bool = True,
    generator: torch.Generator | None = None,
    streamer: Streamer | None = None,
) -> Tensor:
    """Translate ``src`` (B, S) → target ids (B, T) starting with ``bos_id``.

    The source is encoded once. Each step decodes the target so far (with the cache:
    only its newest token) and appends a token, greedily, sampled, or, with
    ``beam_size > 1``, by beam search. A row ends at ``eos_id``; finished rows are padded
    with ``pad_id``. At most ``max_len - 1`` tokens follow the start token.

    Args:
        beam_size, length_penalty, early_stopping: see ``beam_search``.
        do_sample, temperature, top_k, top_p: see ``choose_next`` (not with beams).
        repetition_penalty: > 1 discourages target tokens already produced.
        src_mask: key mask for the source (B, 1, 1, S); built from ``pad_id`` if None.
        use_cache: key/value cache, or the reference path that reruns the target.
    """
    c = model.config
    if src.dim() != 2 or src.size(1) == 0:
        raise ValueError(f"src must be (batch, length>0), got {tuple(src.shape)}")
    if beam_size < 1:
        raise ValueError(f"beam_size must be a positive integer, got {beam_size}")
    if beam_size > 1 and do_sample:
        raise ValueError("beam search does not sample: use beam_size=1 with do_sample")
    if do_sample:
        check_sampling(temperature, top_k, top_p)
    if not repetition_penalty > 0 or math.isinf(repetition_penalty):
        raise ValueError(f"repetition_penalty must be > 0, got {repetition_penalty}")
    max_new_tokens = min(max_new_tokens, c.max_len - 1)
    was_training = model.training
    model.eval()
    try:
        if src_mask is None:
            src_mask = auto_padding_mask(src, c.pad_id)
        memory = model.encode(src, src_mask).hidden  # (B, S, D)
        if beam_size > 1:
            return beam_search(
                model,
                memory,
                src_mask,
                max_new_tokens,
                beam_size=beam_size,
                length_penalty=length_penalty,
                early_stopping=early_stopping,
                repetition_penalty=repetition_penalty,
                use_cache=use_cache,
            )
        ys = torch.full((src.size(0), 1), c.bos_id, dtype=torch.long, device=src.device)
        finished = torch.zeros(src.size(0), dtype=torch.bool, device=src.device)
        cache = model.new_cache() if use_cache else None
        for _ in range(max_new_tokens):
            logits = _decoder_logits(model, ys, memory, src_mask, cache)
            logits = apply_repetition_penalty(logits, ys[:, 1:], repetition_penalty)
            logits = _never_specials(logits, c)
            next_id = choose_next(
                logits,
                do_sample=do_sample,
                temperature=temperature,
                top_k=top_k,
                top_p=top_p,
                generator=generator,
            )
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


def _decoder_logits(
    model, ys: Tensor, memory: Tensor, src_mask: Tensor | None, cache: DecoderCache | None
) -> Tensor:
    """Next-token logits (B, V) after the target prefix ``ys`` (B, T)."""
    if cache is None:
        hidden = model.decode(ys, memory, src_mask).hidden  # (B, T, D): all of it again
    else:
        hidden = model.decode(ys[:, cache.length :], memory, src_mask, cache=cache).hidden
    return model.output_proj(hidden[:, -1])


def _never_specials(scores: Tensor, config) -> Tensor:
    """A translation never contains the pad or start token: rule them out (B, V).

    Training never asks for either, so only an untrained model would pick them; a pad
    inside a translation would also read as its end.
    """
    scores = scores.clone()
    scores[:, [config.pad_id, config.bos_id]] = float("-inf")
    return scores


def beam_search(
    model,
    memory: Tensor,
    src_mask: Tensor | None,
    max_new_tokens: int,
    *,
    beam_size: int = 4,
    length_penalty: float = 1.0,
    early_stopping: bool = True,
    repetition_penalty: float = 1.0,
    use_cache: bool = True,
    keep_greedy: bool = True,
) -> Tensor:
    """Beam search over the translator's decoder: memory (B, S, D) → ids (B, T).

    Every step extends each of the K live hypotheses of a sentence by every token and
    keeps the K best extensions by total log-probability. An extension that ends in
    ``eos_id`` (among the best K) becomes a finished hypothesis, scored
    ``log p / length ** length_penalty`` (length counts the tokens after the start
    token, the stop token included): 0 compares raw log-probabilities, larger values
    favour longer output. A sentence is done when it has K finished hypotheses and,
    without ``early_stopping``, when no live one can still beat them. The best finished
    hypothesis (or live one, at the length limit) is returned.

    Beam search can lose the greedy translation: its prefix may drop out of the K best
    on the way. With ``keep_greedy`` the greedy translation is decoded too and competes
    under the same score, so a beam never returns something the model scores lower
    (without a repetition penalty, which changes the scores).
    """
    c = model.config
    B, K = memory.size(0), beam_size
    device = memory.device
    memory = memory.repeat_interleave(K, dim=0)  # (B·K, S, D), a sentence's beams together
    if src_mask is not None:
        src_mask = src_mask.repeat_interleave(K, dim=0)
    ys = torch.full((B * K, 1), c.bos_id, dtype=torch.long, device=device)
    scores = torch.zeros(B, K, device=device)
    scores[:, 1:] = float("-inf")  # at the start all beams are the same: let only one grow
    cache = model.new_cache() if use_cache else None
    hyps = [_Hypotheses(K, length_penalty, early_stopping) for _ in range(B)]
    for step in range(max_new_tokens):
        logits = _decoder_logits(model, ys, memory, src_mask, cache)
        logits = apply_repetition_penalty(logits, ys[:, 1:], repetition_penalty)
        log_probs = _never_specials(logits.float().log_softmax(dim=-1), c)  # (B·K, V)
        V = log_probs.size(-1)
        candidates = (scores.view(B * K, 1) + log_probs).view(B, K * V)
        top_scores, top_index = candidates.topk(2 * K, dim=1)  # (B, 2K): K can end at eos
        rows, tokens, new_scores = [], [], []
        for b in range(B):
            chosen = []
            if not hyps[b].done:
                for rank, (s, i) in enumerate(
                    zip(top_scores[b].tolist(), top_index[b].tolist(), strict=True)
                ):
                    beam, token = divmod(i, V)
                    if token == c.eos_id:
                        if rank < K:
                            hyps[b].add(ys[b * K + beam, 1:].tolist() + [token], s)
                    elif s > float("-inf"):
                        chosen.append((s, b * K + beam, token))
                    if len(chosen) == K:
                        break
                hyps[b].check_done(chosen[0][0] if chosen else float("-inf"), step + 1)
            while len(chosen) < K:  # a finished sentence (or one out of options) idles
                chosen.append((float("-inf"), b * K, c.pad_id))
            for s, row, token in chosen:
                new_scores.append(s)
                rows.append(row)
                tokens.append(token)
        if all(h.done for h in hyps):
            break
        index = torch.tensor(rows, device=device)
        ys = torch.cat([ys[index], torch.tensor(tokens, device=device)[:, None]], dim=1)
        scores = torch.tensor(new_scores, device=device).view(B, K)
        if cache is not None:
            cache.reorder(index)
    else:
        # The length limit: live hypotheses count as finished ones.
        for b in range(B):
            if not hyps[b].done:
                for k in range(K):
                    if scores[b, k] > float("-inf"):
                        hyps[b].add(ys[b * K + k, 1:].tolist(), scores[b, k].item())
    if keep_greedy and repetition_penalty == 1.0:
        greedy = _greedy_with_log_probs(
            model, memory[::K], None if src_mask is None else src_mask[::K], max_new_tokens
        )
        for h, (tokens, log_prob) in zip(hyps, greedy, strict=True):
            h.add(tokens, log_prob)
    best = [h.best() for h in hyps]
    out = torch.full((B, 1 + max(map(len, best))), c.pad_id, dtype=torch.long, device=device)
    out[:, 0] = c.bos_id
    for b, tokens in enumerate(best):
        out[b, 1 : 1 + len(tokens)] = torch.tensor(tokens, dtype=torch.long)
    return out


class _Hypotheses:
    """The best K finished hypotheses of one sentence in a beam search."""

    def __init__(self, K: int, length_penalty: float, early_stopping: bool) -> None:
        self.K = K
        self.length_penalty = length_penalty
        self.early_stopping = early_stopping
        self.items: list[tuple[float, list[int]]] = []  # (normalised score, tokens)
        self.done = False

    def score(self, log_prob: float, length: int) -> float:
        return log_prob / max(length, 1) ** self.length_penalty

    def add(self, tokens: list[int], log_prob: float) -> None:
        """Keep ``tokens`` if among the K best (after earlier ones with equal scores)."""
        self.items.append((self.score(log_prob, len(tokens)), tokens))
        self.items.sort(key=lambda item: item[0], reverse=True)  # stable
        del self.items[self.K :]

    def check_done(self, best_live_log_prob: float, length: int) -> None:
        """Done with K hypotheses, and (unless stopping early) when the best live beam,
        scored at its current length, cannot beat the worst of them."""
        if len(self.items) < self.K:
            self.done = best_live_log_prob == float("-inf")  # nothing left to extend
            return
        worst = self.items[-1][0]
        self.done = self.early_stopping or self.score(best_live_log_prob, length) <= worst

    def best(self) -> list[int]:
        return self.items[0][1] if self.items else []


def _greedy_with_log_probs(
    model, memory: Tensor, src_mask: Tensor | None, max_new_tokens: int
) -> list[tuple[list[int], float]]:
    """Greedy translations and their log-probabilities, one (tokens, log p) per row."""
    c = model.config
    B = memory.size(0)
    ys = torch.full((B, 1), c.bos_id, dtype=torch.long, device=memory.device)
    total = torch.zeros(B, device=memory.device)
    finished = torch.zeros(B, dtype=torch.bool, device=memory.device)
    cache = model.new_cache()
    for _ in range(max_new_tokens):
        logits = _decoder_logits(model, ys, memory, src_mask, cache)
        log_probs = _never_specials(logits.float().log_softmax(dim=-1), c)
        best, next_id = log_probs.max(dim=-1)  # (B,), (B,)
        total += best.masked_fill(finished, 0.0)
        next_id = next_id.masked_fill(finished, c.pad_id)
        finished |= next_id == c.eos_id
        ys = torch.cat([ys, next_id[:, None]], dim=1)
        if finished.all():
            break
    rows = []
    for row, log_prob in zip(ys[:, 1:].tolist(), total.tolist(), strict=True):
        end = row.index(c.eos_id) + 1 if c.eos_id in row else len(row)
        rows.append((row[:end], log_prob))
    return rows
