"""From token ids to batches: padding, language-model windows, length buckets, collation.

Shapes: ``B`` batch, ``T`` length (``S`` source, ``T`` target).

The training streams (``LMBatches``, ``BucketBatches``) are deterministic given their seed
and resumable: ``state_dict()`` captures where they are (plain ints and a byte tensor, so it
saves with ``torch.save`` and loads with ``weights_only=True``), and ``load_state_dict()``
makes a fresh stream continue with exactly the batches the interrupted one would have given.

With ``world_size > 1`` (``torchrun``), rank ``r`` gets its own share of the batches of the
one-process stream, every rank the same number, so no rank waits on another.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterator, Sequence
from typing import Any, Generic, TypeVar

import torch
from torch import Tensor

E = TypeVar("E")


def pad_batch(
    seqs: Sequence[Sequence[int]], pad_id: int = 0, *, max_len: int | None = None
) -> Tensor:
    """Right-pad id lists to the longest one.

    Args:
        seqs: B sequences of token ids (lists or 1-D tensors).
        pad_id: the id to fill with.
        max_len: cut longer sequences to their first ``max_len`` ids.

    Returns:
        A (B, T_longest) long tensor.
    """
    if len(seqs) == 0:
        raise ValueError("cannot pad an empty batch")
    if max_len is not None and max_len <= 0:
        raise ValueError(f"max_len must be positive, got {max_len}")
    rows = [torch.as_tensor(s, dtype=torch.long)[:max_len] for s in seqs]
    out = torch.full((len(rows), max(len(r) for r in rows)), pad_id, dtype=torch.long)
    for i, row in enumerate(rows):
        out[i, : len(row)] = row
    return out


def _check_shard(rank: int, world_size: int) -> None:
    if world_size < 1 or not 0 <= rank < world_size:
        raise ValueError(f"need 0 <= rank < world_size, got rank={rank}, world_size={world_size}")


class LMBatches:
    """Endless random windows of a token stream, as nanoGPT samples them.

    Each batch is ``(x, y)``, both (B, T): B windows ``x = ids[i : i+T]`` and their
    continuations ``y = ids[i+1 : i+T+1]``, with offsets drawn from a seeded generator.
    With ``world_size > 1`` each step draws ``world_size * batch_size`` offsets from the
    shared generator and rank ``r`` takes the r-th slice of them.

    Args:
        ids: the token stream, a 1-D integer tensor (any integer dtype; batches are long).
        block_size: T, the window length.
        batch_size: B, windows per batch (per rank).
        seed: seeds the generator.
        rank: this process's rank.
        world_size: the number of processes.
    """

    def __init__(
        self,
        ids: Tensor,
        block_size: int,
        batch_size: int,
        *,
        seed: int = 0,
        rank: int = 0,
        world_size: int = 1,
    ) -> None:
        if block_size <= 0 or batch_size <= 0:
            raise ValueError(
                f"block_size and batch_size must be positive, got {block_size}, {batch_size}"
            )
        if ids.dim() != 1 or len(ids) < block_size + 1:
            raise ValueError(
                f"need a 1-D stream of at least block_size + 1 = {block_size + 1} tokens, "
                f"got shape {tuple(ids.shape)}"
            )
        _check_shard(rank, world_size)
        self.ids, self.block_size, self.batch_size = ids, block_size, batch_size
        self.rank, self.world_size = rank, world_size
        self.generator = torch.Generator().manual_seed(seed)
        self.batches_drawn = 0
        self._offsets = torch.arange(block_size)  # (T,)

    def __iter__(self) -> Iterator[tuple[Tensor, Tensor]]:
        return self

    def __next__(self) -> tuple[Tensor, Tensor]:
        high = len(self.ids) - self.block_size  # starts in [0, high): y's last id is ids[-1]
        starts = torch.randint(
            0, high, (self.world_size * self.batch_size,), generator=self.generator
        )
        starts = starts.view(self.world_size, self.batch_size)[self.rank]  # (B,)
        self.batches_drawn += 1
        index = starts[:, None] + self._offsets  # (B, T)
        return self.ids[index].long(), self.ids[index + 1].long()

    def state_dict(self) -> dict[str, Any]:
        return {"generator": self.generator.get_state(), "batches_drawn": self.batches_drawn}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.generator.set_state(state["generator"])
        self.batches_drawn = int(state.get("batches_drawn", 0))


def eval_batches(
    ids: Tensor, block_size: int, batch_size: int, max_batches: int | None = None
) -> Iterator[tuple[Tensor, Tensor]]:
    """Non-overlapping windows over a split, in order: ``(x, y)`` pairs, each (B, T).

    Every token but the first is a target once. With ``max_batches``, only that many
    batches, of windows spread evenly over the whole split. Deterministic, so every
    evaluation sees the same text.
    """
    if block_size <= 0 or batch_size <= 0:
        raise ValueError(
            f"block_size and batch_size must be positive, got {block_size}, {batch_size}"
        )
    n_windows = (len(ids) - 1) // block_size
    if ids.dim() != 1 or n_windows == 0:
        raise ValueError(
            f"need a 1-D split of at least block_size + 1 = {block_size + 1} tokens, "
            f"got shape {tuple(ids.shape)}"
        )
    starts = torch.arange(n_windows) * block_size
    if max_batches is not None and n_windows > max_batches * batch_size:
        pick = torch.linspace(0, n_windows - 1, max_batches * batch_size).round().long()
        starts = starts[pick]
    offsets = torch.arange(block_size)
    for i in range(0, len(starts), batch_size):
        index = starts[i : i + batch_size, None] + offsets  # (B, T)
        yield ids[index].long(), ids[index + 1].long()


class BucketBatches(Generic[E]):
    """Batches of examples of similar length, reshuffled every epoch.

    Each epoch: shuffle the examples (seeded by ``seed`` and the epoch), cut them into
    chunks of ``bucket_size_multiplier`` batches, sort each chunk by length, slice it into
    batches and shuffle the batches. Similar lengths share a batch, so there is little
    padding, and the batch order stays random.

    A batch holds ``batch_size`` examples, or, with ``max_tokens``, as many as fit in that
    many padded tokens (``len(batch) * longest <= max_tokens``; an example longer than the
    budget goes alone); with both, whichever limit comes first.

    Iterating yields one epoch of batches, each a list of examples, from the saved
    position; the next iteration is the next epoch. ``batch_indices(epoch)`` gives the
    same plan as lists of indices into ``examples``.

    Args:
        examples: the examples (anything ``key`` can measure).
        batch_size: examples per batch.
        max_tokens: padded tokens per batch, instead of (or as well as) ``batch_size``.
        key: an example's length.
        seed: seeds the shuffles.
        shuffle: shuffle examples and batches; without it the plan is the same every epoch
            (still sorted within chunks, which suits evaluation).
        bucket_size_multiplier: batches per sorted chunk; larger sorts more globally.
        drop_last: drop the one short batch of a fixed ``batch_size`` epoch.
        rank: this process's rank.
        world_size: the number of processes; each rank takes every world_size-th batch, and
            the last ``len % world_size`` batches of an epoch are left out so every rank
            takes the same number.
    """

    def __init__(
        self,
        examples: Sequence[E],
        batch_size: int | None = None,
        *,
        max_tokens: int | None = None,
        key: Callable[[E], int] = len,  # type: ignore[assignment]  # E is sized by default
        seed: int = 0,
        shuffle: bool = True,
        bucket_size_multiplier: int = 50,
        drop_last: bool = False,
        rank: int = 0,
        world_size: int = 1,
    ) -> None:
        if len(examples) == 0:
            raise ValueError("no examples to batch")
        if batch_size is None and max_tokens is None:
            raise ValueError("give batch_size, max_tokens, or both")
        for name, value in (("batch_size", batch_size), ("max_tokens", max_tokens)):
            if value is not None and value <= 0:
                raise ValueError(f"{name} must be a positive integer, got {value}")
        if bucket_size_multiplier <= 0:
            raise ValueError(
                f"bucket_size_multiplier must be positive, got {bucket_size_multiplier}"
            )
        _check_shard(rank, world_size)
        self.examples, self.batch_size, self.max_tokens = examples, batch_size, max_tokens
        self.seed, self.shuffle, self.drop_last = seed, shuffle, drop_last
        self.rank, self.world_size = rank, world_size
        self.lengths = [int(key(e)) for e in examples]
        per_batch = batch_size or max(1, (max_tokens or 1) // max(1, _mean(self.lengths)))
        self.chunk_size = per_batch * bucket_size_multiplier
        self.epoch = self.position = 0
        self._plan: tuple[int, list[list[int]]] | None = None  # (epoch, batches) cache
        if not self.batch_indices(0):
            raise ValueError(
                f"{len(examples)} examples make no batches "
                f"(batch_size={batch_size}, drop_last={drop_last}, world_size={world_size})"
            )

    def batch_indices(self, epoch: int) -> list[list[int]]:
        """This rank's batches in ``epoch``, as lists of indices into ``examples``."""
        if self._plan is not None and self._plan[0] == epoch:
            return self._plan[1]
        rng = random.Random(f"glassformer-buckets:{self.seed}:{epoch}")
        order = list(range(len(self.examples)))
        if self.shuffle:
            rng.shuffle(order)
        batches: list[list[int]] = []
        for start in range(0, len(order), self.chunk_size):
            chunk = sorted(order[start : start + self.chunk_size], key=self.lengths.__getitem__)
            batches += self._split(chunk)
        if self.drop_last and self.batch_size is not None:
            batches = [b for b in batches if len(b) == self.batch_size]
        if self.shuffle:
            rng.shuffle(batches)
        usable = len(batches) - len(batches) % self.world_size
        batches = batches[self.rank : usable : self.world_size]
        self._plan = (epoch, batches)
        return batches

    def _split(self, chunk: list[int]) -> list[list[int]]:
        """Cut a length-sorted chunk into batches."""
        if self.max_tokens is None:
            size = self.batch_size or 1  # one of the two is set
            return [chunk[k : k + size] for k in range(0, len(chunk), size)]
        batches: list[list[int]] = []
        batch: list[int] = []
        for i in chunk:  # lengths ascend, so the newest example is the longest
            full = self.batch_size is not None and len(batch) == self.batch_size
            if batch and (full or (len(batch) + 1) * self.lengths[i] > self.max_tokens):
                batches.append(batch)
                batch = []
            batch.append(i)
        return [*batches, batch]

    def __len__(self) -> int:
        """Batches in the current epoch (for this rank)."""
        return len(self.batch_indices(self.epoch))

    def __iter__(self) -> Iterator[list[E]]:
        plan = self.batch_indices(self.epoch)
        while self.position < len(plan):
            batch = plan[self.position]
            self.position += 1  # before yielding: the state names the next batch
            yield [self.examples[i] for i in batch]
        self.epoch, self.position = self.epoch + 1, 0

    def state_dict(self) -> dict[str, int]:
        return {"epoch": self.epoch, "position": self.position, "batches": len(self)}

    def load_state_dict(self, state: dict[str, int]) -> None:
        """Go back to a saved position. A state saved with another plan for the epoch (by
        a different number of processes, or another batch size) resumes the same fraction
        of the way through the epoch, rounded down."""
        epoch, position = int(state["epoch"]), int(state["position"])
        saved_batches = int(state.get("batches", 0))
        if epoch >= 0 and saved_batches and saved_batches != len(self.batch_indices(epoch)):
            position = position * len(self.batch_indices(epoch)) // saved_batches
        if epoch < 0 or not 0 <= position <= len(self.batch_indices(epoch)):
            raise ValueError(
                f"cannot resume at epoch {epoch}, batch {position}: "
                f"that epoch has {len(self.batch_indices(max(epoch, 0)))} batches"
            )
        self.epoch, self.position = epoch, position


def _mean(values: Sequence[int]) -> int:
    return round(sum(values) / len(values))


def collate_pairs(
    pairs: Sequence[tuple[Sequence[int], Sequence[int]]], pad_id: int, bos_id: int, eos_id: int
) -> tuple[Tensor, Tensor, Tensor]:
    """Teacher-forcing tensors for a batch of (source ids, target ids) pairs.

    Returns:
        ``src`` (B, S); ``tgt_in`` (B, T) = [BOS] + target, the decoder's input; and
        ``labels`` (B, T) = target + [EOS], what it should predict at each position. All
        right-padded with ``pad_id``.
    """
    src = pad_batch([s for s, _ in pairs], pad_id)
    tgt_in = pad_batch([[bos_id, *t] for _, t in pairs], pad_id)
    labels = pad_batch([[*t, eos_id] for _, t in pairs], pad_id)
    return src, tgt_in, labels


def collate_labelled(
    ids: Sequence[Sequence[int]],
    labels: Sequence[int],
    pad_id: int = 0,
    *,
    max_len: int | None = None,
) -> tuple[Tensor, Tensor]:
    """A classification batch: ids (B, T) right-padded (cut to ``max_len``), labels (B,)."""
    if len(ids) != len(labels):
        raise ValueError(f"{len(ids)} sequences but {len(labels)} labels")
    return pad_batch(ids, pad_id, max_len=max_len), torch.as_tensor(labels, dtype=torch.long)
