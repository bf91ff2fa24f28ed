"""Beam search over the translator's decoder, and the decoder step it shares with the
greedy loop (``seq2seq_generate``).

Shapes: B batch, S source length, T target length so far, D d_model, V vocabulary,
K beams.

Greedy decoding keeps one partial translation per sentence; beam search keeps the K
most likely ones at every step and returns the best that finished. The K beams of a
sentence sit next to each other in the batch (B·K rows), so one decoder call serves them
all, and the key/value cache follows the surviving beams with ``DecoderCache.reorder``.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from glassformer.generation.config import GenerationConfig, resolve_config
from glassformer.generation.protocols import Seq2SeqLM
from glassformer.generation.sampling import apply_repetition_penalty, usable_logits
from glassformer.modules.cache import DecoderCache


def decoder_logits(
    model: Seq2SeqLM,
    ys: Tensor,
    memory: Tensor,
    src_mask: Tensor | None,
    cache: DecoderCache | None,
) -> Tensor:
    """Next-token logits (B, V) after the target prefix ``ys`` (B, T)."""
    if cache is None:
        hidden = model.decode(ys, memory, src_mask).hidden  # (B, T, D): all of it again
    else:
        hidden = model.decode(ys[:, cache.length :], memory, src_mask, cache=cache).hidden
    return model.unembed(hidden[:, -1])


def never_specials(scores: Tensor, config) -> Tensor:
    """A translation never contains the pad or start token: rule them out (B, V).

    Training never asks for either, so only an untrained model would pick them; a pad
    inside a translation would also read as its end.
    """
    scores = scores.clone()
    scores[:, [config.pad_id, config.bos_id]] = float("-inf")
    return scores


def beam_search(
    model: Seq2SeqLM,
    memory: Tensor,
    src_mask: Tensor | None,
    max_new_tokens: int,
    *,
    generation_config: GenerationConfig | None = None,
    keep_greedy: bool = True,
    **options: Any,
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

    Of the ``GenerationConfig`` (``generation_config`` and/or keyword ``options``) it uses
    ``beam_size`` (K), ``length_penalty``, ``early_stopping``, ``repetition_penalty``,
    ``use_cache`` and ``vocab_limit``. Logits that are not finite are refused
    (``NonFiniteLogitsError``, naming the step).
    """
    gen = resolve_config(generation_config, options, ("generation_config", "keep_greedy"))
    c = model.config
    B, K = memory.size(0), gen.beam_size
    device = memory.device
    memory = memory.repeat_interleave(K, dim=0)  # (B·K, S, D), a sentence's beams together
    if src_mask is not None:
        src_mask = src_mask.repeat_interleave(K, dim=0)
    ys = torch.full((B * K, 1), c.bos_id, dtype=torch.long, device=device)
    scores = torch.zeros(B, K, device=device)
    scores[:, 1:] = float("-inf")  # at the start all beams are the same: let only one grow
    cache = model.new_cache() if gen.use_cache else None
    hyps = [_Hypotheses(K, gen.length_penalty, gen.early_stopping) for _ in range(B)]
    for step in range(max_new_tokens):
        logits = decoder_logits(model, ys, memory, src_mask, cache)
        logits = usable_logits(logits, gen.vocab_limit, step + 1)
        logits = apply_repetition_penalty(logits, ys[:, 1:], gen.repetition_penalty)
        log_probs = never_specials(logits.float().log_softmax(dim=-1), c)  # (B·K, V)
        V = log_probs.size(-1)
        candidates = (scores.view(B * K, 1) + log_probs).view(B, K * V)
        top_scores, top_index = candidates.topk(2 * K, dim=1)  # (B, 2K): K can end at eos
        rows, tokens, new_scores = [], [], []
        for b in range(B):
            candidates_b = zip(top_scores[b].tolist(), top_index[b].tolist(), strict=True)
            for s, row, token in _extend(hyps[b], candidates_b, b, ys, V, c, step):
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
    if keep_greedy and gen.repetition_penalty == 1.0:
        greedy = _greedy_with_log_probs(
            model,
            memory[::K],
            None if src_mask is None else src_mask[::K],
            max_new_tokens,
            gen.vocab_limit,
        )
        for h, (tokens, log_prob) in zip(hyps, greedy, strict=True):
            h.add(tokens, log_prob)
    return _best_ids(hyps, c, device)


def _extend(hyps: _Hypotheses, candidates, b: int, ys: Tensor, V: int, c, step: int) -> list:
    """Sentence ``b``'s K best extensions (score, row of ``ys``, token) among its 2K best
    ``candidates`` (score, flat index over beams × vocabulary); those that end in the stop
    token among the first K become finished hypotheses. A finished sentence (or one out of
    options) idles on padding."""
    K = hyps.K
    chosen: list[tuple[float, int, int]] = []
    if not hyps.done:
        for rank, (s, i) in enumerate(candidates):
            beam, token = divmod(i, V)
            if token == c.eos_id:
                if rank < K:
                    hyps.add(ys[b * K + beam, 1:].tolist() + [token], s)
            elif s > float("-inf"):
                chosen.append((s, b * K + beam, token))
            if len(chosen) == K:
                break
        hyps.check_done(chosen[0][0] if chosen else float("-inf"), step + 1)
    while len(chosen) < K:
        chosen.append((float("-inf"), b * K, c.pad_id))
    return chosen


def _best_ids(hyps: list[_Hypotheses], c, device) -> Tensor:
    """Each sentence's best hypothesis after its start token, padded: (B, T)."""
    best = [h.best() for h in hyps]
    out = torch.full(
        (len(hyps), 1 + max(map(len, best))), c.pad_id, dtype=torch.long, device=device
    )
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
    model, memory: Tensor, src_mask: Tensor | None, max_new_tokens: int, vocab_limit: int | None
) -> list[tuple[list[int], float]]:
    """Greedy translations and their log-probabilities, one (tokens, log p) per row."""
    c = model.config
    B = memory.size(0)
    ys = torch.full((B, 1), c.bos_id, dtype=torch.long, device=memory.device)
    total = torch.zeros(B, device=memory.device)
    finished = torch.zeros(B, dtype=torch.bool, device=memory.device)
    cache = model.new_cache()
    for step in range(max_new_tokens):
        logits = usable_logits(
            decoder_logits(model, ys, memory, src_mask, cache), vocab_limit, step + 1
        )
        log_probs = never_specials(logits.float().log_softmax(dim=-1), c)
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
