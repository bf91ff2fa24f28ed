"""From token ids to batches: padding, language-model windows, length buckets.

The training streams are deterministic given their seed and resumable: ``state_dict()``
captures where they are, and ``load_state_dict()`` makes a fresh stream continue with
exactly the batches the interrupted one would have produced next.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch
from torch import Tensor


def pad_batch(seqs: Sequence[Sequence[int]], pad_id: int = 0) -> Tensor:
    """Right-pad id lists to the longest: (B, T_longest) long tensor."""
    if not seqs:
        raise ValueError("cannot pad an empty batch")
    width = max(len(s) for s in seqs)
    out = torch.full((len(seqs), width), pad_id, dtype=torch.long)
    for i, s in enumerate(seqs):
        out[i, : len(s)] = torch.as_tensor(s, dtype=torch.long)
    return out


class LMBatches:
    """Endless random windows of a token stream, as nanoGPT samples them.

    Each batch is ``(x, y)``: B windows x = ids[i : i+T] and their continuations
    y = ids[i+1 : i+T+1], with offsets drawn from a seeded generator.
    """

    def __init__(self, ids: Tensor, block_size: int, batch_size: int, *, seed: int = 0) -> None:
        if ids.dim() != 1 or len(ids) <= block_size + 1:
            raise ValueError(
                f"need a 1-D stream longer than block_size + 1 = {block_size + 1}, "
                f"got shape {tuple(ids.shape)}"
            )
        if block_size <= 0 or batch_size <= 0:
            raise ValueError(
                f"block_size and batch_size must be positive, got {block_size}, {batch_size}"
            )
        self.ids, self.block_size, self.batch_size = ids, block_size, batch_size
        self.generator = torch.Generator().manual_seed(seed)
        self._offsets = torch.arange(block_size)  # (T,)

    def __iter__(self) -> Iterator[tuple[Tensor, Tensor]]:
        return self

    def __next__(self) -> tuple[Tensor, Tensor]:
        high = len(self.ids) - self.block_size - 1
        starts = torch.randint(0, high + 1, (self.batch_size,), generator=self.generator)
        index = starts[:, None] + self._offsets  # (B, T)
        return self.ids[index], self.ids[index + 1]

    def state_dict(self) -> dict[str, Any]:
        return {"generator": self.generator.get_state()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.generator.set_state(state["generator"])


def eval_batches(
    ids: Tensor, block_size: int, batch_size: int, max_batches: int | None = None
) -> Iterator[tuple[Tensor, Tensor]]:
    """Non-overlapping windows over a split, in order; with ``max_batches``, windows spread
    evenly over the whole split. Deterministic, so every evaluation sees the same text."""
    n_windows = (len(ids) - 1) // block_size
    if n_windows == 0:
        raise ValueError(f"split of {len(ids)} tokens is too short for block_size {block_size}")
    starts = torch.arange(n_windows) * block_size
    if max_batches is not None and n_windows > max_batches * batch_size:
        pick = torch.linspace(0, n_windows - 1, max_batches * batch_size).round().long()
        starts = starts[pick]
    offsets = torch.arange(block_size)
    for i in range(0, len(starts), batch_size):
        index = starts[i : i + batch_size, None] + offsets  # (B, T)
        yield ids[index], ids[index + 1]


class BucketBatches:
    """Batches of examples of similar length, reshuffled every epoch.

    Each epoch: shuffle the examples (seed + epoch), cut them into chunks of
    ``batch_size * bucket_size_multiplier``, sort each chunk by ``key``, slice it into
    batches and shuffle the batches. Similar lengths share a batch, so little padding.
    Iterating yields one epoch of batches (lists of examples) from the saved position.
    """

    def __init__(
        self,
        examples: Sequence[Any],
        batch_size: int,
        *,
        key: Callable[[Any], int] = len,
        seed: int = 0,
        shuffle: bool = True,
        bucket_size_multiplier: int = 50,
        drop_last: bool = False,
    ) -> None:
        if batch_size <= 0:
            raise ValueError(f"batch_size must be a positive integer, got {batch_size}")
        if not examples:
            raise ValueError("no examples to batch")
        self.examples, self.batch_size, self.key = examples, batch_size, key
        self.seed, self.shuffle, self.drop_last = seed, shuffle, drop_last
        self.chunk = batch_size * bucket_size_multiplier
        self.epoch = self.position = 0

    def _plan(self, epoch: int) -> list[list[int]]:
        rng = random.Random(self.seed * 1_000_003 + epoch)
        order = list(range(len(self.examples)))
        if self.shuffle:
            rng.shuffle(order)
        batches = []
        for start in range(0, len(order), self.chunk):
            part = sorted(
                order[start : start + self.chunk], key=lambda i: self.key(self.examples[i])
            )
            batches += [part[k : k + self.batch_size] for k in range(0, len(part), self.batch_size)]
        if self.drop_last:
            batches = [b for b in batches if len(b) == self.batch_size]
        if self.shuffle:
            rng.shuffle(batches)
        return batches

    def __len__(self) -> int:
        return len(self._plan(0)) if self.drop_last else -(-len(self.examples) // self.batch_size)

    def __iter__(self) -> Iterator[list[Any]]:
        plan = self._plan(self.epoch)
        while self.position < len(plan):
            batch = plan[self.position]
            self.position += 1  # before yielding: the state names the next batch
            yield [self.examples[i] for i in batch]
        self.epoch, self.position = self.epoch + 1, 0

    def state_dict(self) -> dict[str, int]:
        return {"epoch": self.epoch, "position": self.position}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.epoch, self.position = int(state["epoch"]), int(state["position"])


def collate_pairs(
    pairs: Sequence[tuple[Sequence[int], Sequence[int]]], pad_id: int, bos_id: int, eos_id: int
) -> tuple[Tensor, Tensor, Tensor]:
    """Teacher forcing: (src (B, S), tgt_in = [BOS] + tgt (B, T), labels = tgt + [EOS] (B, T))."""
    src = pad_batch([s for s, _ in pairs], pad_id)
    tgt_in = pad_batch([[bos_id, *t] for _, t in pairs], pad_id)
    labels = pad_batch([[*t, eos_id] for _, t in pairs], pad_id)
    return src, tgt_in, labels


def collate_labelled(
    ids: Sequence[Sequence[int]], labels: Sequence[int], pad_id: int = 0
) -> tuple[Tensor, Tensor]:
    """(ids (B, T) right-padded, labels (B,))."""
    return pad_batch(ids, pad_id), torch.as_tensor(labels, dtype=torch.long)
