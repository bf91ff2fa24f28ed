"""Masked-language-model inputs: BERT's masking (Devlin et al. 2019, §3.1).

Of the real tokens of each sequence, ``prob`` (15%) are chosen to be predicted. Of the
chosen, 80% are replaced by ``[MASK]``, 10% by a random token and 10% are left as they are,
so the model cannot learn that only ``[MASK]`` needs predicting. The labels hold the
original id at the chosen positions and -100 (not scored) everywhere else. With whole-word
masking a word's pieces (WordPiece's ``##`` continuations) are chosen together.

    inputs, labels = mask_tokens(ids, mask_id=tok.mask_id, vocab_size=tok.vocab_size,
                                 special_ids=[tok.pad_id, tok.bos_id, tok.eos_id],
                                 generator=torch.Generator().manual_seed(0))
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import torch
from torch import Tensor

from glassformer.data.batching import LMBatches

IGNORE = -100  # a label that is not scored
MASK_PROB = 0.15
# Of the chosen tokens: replaced by [MASK], by a random token, kept.
REPLACE_MASK, REPLACE_RANDOM = 0.8, 0.1


def mask_tokens(
    ids: Tensor,
    *,
    mask_id: int,
    vocab_size: int,
    special_ids: Sequence[int] = (),
    prob: float = MASK_PROB,
    word_continues: Tensor | None = None,
    generator: torch.Generator | None = None,
) -> tuple[Tensor, Tensor]:
    """BERT's masking of a batch.

    Args:
        ids: (B, T) token ids.
        mask_id: the ``[MASK]`` token.
        vocab_size: random replacements are drawn from ``[0, vocab_size)`` less the specials.
        special_ids: never chosen (padding, [CLS], [SEP], ...) and never drawn.
        prob: the share of real tokens chosen; each sequence gets at least one.
        word_continues: (B, T) bool, True where a token continues the word before it
            (whole-word masking); None masks tokens independently.
        generator: the random source (seed it for reproducible masks).

    Returns:
        ``(inputs, labels)``, both (B, T): the ids with the chosen tokens replaced, and the
        original ids at the chosen positions, -100 elsewhere.
    """
    if not 0.0 < prob < 1.0:
        raise ValueError(f"the masking probability must be in (0, 1), got {prob}")
    special = torch.tensor(sorted({*special_ids, mask_id}), dtype=ids.dtype)
    real = ~torch.isin(ids, special)  # (B, T)
    if word_continues is None:
        chosen = _draw(ids.shape, prob, generator) & real
    else:  # choose words: a word is its first piece and the continuations after it
        word = torch.cumsum(~word_continues, dim=1)  # (B, T) word index per token
        pick = _draw(ids.shape, prob, generator)  # one draw per word, at its start
        chosen = pick.gather(1, _first_of_word(word)) & real
    chosen = _at_least_one(chosen, real, generator)
    labels = torch.where(chosen, ids, torch.full_like(ids, IGNORE))
    roll = torch.rand(ids.shape, generator=generator)
    inputs = ids.clone()
    inputs[chosen & (roll < REPLACE_MASK)] = mask_id
    swap = chosen & (roll >= REPLACE_MASK) & (roll < REPLACE_MASK + REPLACE_RANDOM)
    allowed = torch.ones(vocab_size, dtype=torch.bool)
    allowed[special[special < vocab_size]] = False
    choices = allowed.nonzero().squeeze(1)  # (V',) ids a random replacement may take
    draw = torch.randint(len(choices), (int(swap.sum()),), generator=generator)
    inputs[swap] = choices[draw].to(ids.dtype)
    return inputs, labels


def _draw(shape: torch.Size, prob: float, generator: torch.Generator | None) -> Tensor:
    return torch.rand(shape, generator=generator) < prob


def _first_of_word(word: Tensor) -> Tensor:
    """(B, T): for each token, the position of the first token of its word."""
    T = word.size(1)
    positions = torch.arange(T).expand_as(word)
    is_start = torch.ones_like(word, dtype=torch.bool)
    is_start[:, 1:] = word[:, 1:] != word[:, :-1]
    starts = torch.where(is_start, positions, torch.zeros_like(positions))
    return torch.cummax(starts, dim=1).values


def _at_least_one(chosen: Tensor, real: Tensor, generator: torch.Generator | None) -> Tensor:
    """Choose one random real token in each row that has real tokens but none chosen
    (a short sequence would otherwise give nothing to predict, and a NaN loss)."""
    empty = ~chosen.any(1) & real.any(1)  # (B,)
    if empty.any():
        scores = torch.rand(real.shape, generator=generator).masked_fill(~real, -1.0)
        one = torch.zeros_like(chosen)
        one[torch.arange(len(scores)), scores.argmax(1)] = True
        chosen = chosen | (one & empty[:, None])
    return chosen


class MaskedLMBatches:
    """Endless masked windows of a token stream: ``LMBatches``' windows, each masked with
    ``mask_tokens`` by a generator of its own, so that a resumed run sees the same masks.

    Each batch is ``(inputs, labels)``, both (B, T). ``continues`` (1-D bool, True where a
    token of the stream continues the word before it) turns on whole-word masking.
    """

    def __init__(
        self,
        ids: Tensor,
        block_size: int,
        batch_size: int,
        *,
        mask_id: int,
        vocab_size: int,
        special_ids: Sequence[int],
        prob: float = MASK_PROB,
        continues: Tensor | None = None,
        seed: int = 0,
        rank: int = 0,
        world_size: int = 1,
    ) -> None:
        self.ids, self.continues = ids, continues
        # windows of positions, so that the ids and their word flags are cut alike
        self.windows = LMBatches(
            torch.arange(len(ids)), block_size, batch_size, seed=seed, rank=rank,
            world_size=world_size,
        )  # fmt: skip
        self.options: dict[str, Any] = dict(
            mask_id=mask_id, vocab_size=vocab_size, special_ids=special_ids, prob=prob
        )
        self.generator = torch.Generator().manual_seed(seed * 1000 + rank + 1)

    def __iter__(self) -> Iterator[tuple[Tensor, Tensor]]:
        return self

    def __next__(self) -> tuple[Tensor, Tensor]:
        positions, _ = next(self.windows)  # (B, T)
        continues = None if self.continues is None else self.continues[positions]
        return mask_tokens(
            self.ids[positions].long(),
            word_continues=continues,
            generator=self.generator,
            **self.options,
        )

    def state_dict(self) -> dict[str, Any]:
        return {"windows": self.windows.state_dict(), "generator": self.generator.get_state()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.windows.load_state_dict(state["windows"])
        self.generator.set_state(state["generator"])
