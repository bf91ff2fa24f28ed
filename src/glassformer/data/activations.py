"""The activation store: a model's activations over a text, computed once and kept on disk
as safetensors shards, so later passes over the text (and later runs) read them instead of
running the model again.

    store = ActivationStore.open(path, about, shard_shape)   # refuses if the disk is short
    acts = store.region(r, compute)   # shard r if written, else compute(r), written, returned

A shard is one region of windows (every hook point's activations for them, as the trainer
uses them: a tensor whose shape ``about`` fixes), in float32, so training from the store
gives exactly what training from the stream gives: the same numbers, in the same order.
``about`` (the model, hook points, text, window size, a digest of the weights and of every
window, ...) is written beside the shards (``store.json``) and held against a store opened
again: activations of another model or text are refused, not read. Each shard is written
atomically (a temporary name, then a rename): a crash leaves whole shards or none, and a
resumed run writes what is missing.
Memory: one region at a time, shuffled within itself, as the stream does.
"""

from __future__ import annotations

import json
import math
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save
from torch import Tensor

from glassformer.atomic import make_folder, write_atomic
from glassformer.errors import CheckpointError, one_line

ABOUT = "store.json"
HEADROOM = 1.1  # the disk must hold the store's estimate and a tenth more


def shard_bytes(shape: tuple[int, ...]) -> int:
    """A float32 shard's size on disk (its header aside)."""
    return 4 * math.prod(shape)


class ActivationStore:
    """Shards of activations in a folder (see the module's docstring)."""

    def __init__(self, path: Path, about: dict[str, Any], regions: int) -> None:
        self.path, self.about, self.regions = path, about, regions

    @classmethod
    def open(cls, path: str | Path, about: dict[str, Any], shard_shape: tuple[int, ...],
             regions: int) -> ActivationStore:  # fmt: skip
        """The store at ``path`` for ``regions`` shards of ``shard_shape``: created, or
        opened where it holds the same ``about``. The size it will reach is estimated
        first, and refused (in one line, with the figures) where the disk cannot hold it."""
        path = Path(path)
        about = {**about, "shard_shape": list(shard_shape), "regions": regions}
        total = shard_bytes(shard_shape) * regions
        written = path / ABOUT
        if written.is_file():
            try:
                held = json.loads(written.read_text())
            except (OSError, ValueError) as e:
                raise CheckpointError(f"cannot read {written}: {one_line(e)}") from None
            if held != about:
                changed = sorted(k for k in {*held, *about} if held.get(k) != about.get(k))
                raise ValueError(
                    f"{path} holds activations of another run (differing in {', '.join(changed)})"
                    ": give another --store folder, or delete this one"
                )
        else:
            make_folder(path)
            free = shutil.disk_usage(path).free
            if total * HEADROOM > free:
                raise ValueError(
                    f"the activation store would take {total / 1e9:.1f} GB ({regions} shards of "
                    f"{shard_bytes(shard_shape) / 1e6:.0f} MB); {path} has {free / 1e9:.1f} GB "
                    "free: fewer layers, less text, or another disk"
                )
            write_atomic(written, (json.dumps(about, indent=1) + "\n").encode())
        return cls(path, about, regions)

    def shard(self, r: int) -> Path:
        return self.path / f"region-{r:05d}.safetensors"

    def region(self, r: int, compute: Callable[[int], Tensor]) -> Tensor:
        """Region r's activations: read from its shard, or computed and written first."""
        shape = tuple(self.about["shard_shape"])
        file = self.shard(r)
        if file.is_file():
            try:
                acts = load_file(str(file))["activations"]
            except Exception as e:  # safetensors raises its own types
                raise CheckpointError(f"cannot read {file}: {one_line(e)}") from None
            if tuple(acts.shape) != shape or acts.dtype != torch.float32:
                raise CheckpointError(f"{file} holds {tuple(acts.shape)} {acts.dtype}, not {shape}")
            return acts
        acts = compute(r).float().contiguous()
        if tuple(acts.shape) != shape:
            raise ValueError(f"region {r}'s activations are {tuple(acts.shape)}, not {shape}")
        write_atomic(file, save({"activations": acts}))
        return acts

    def written(self) -> int:
        """How many shards are on disk."""
        return sum(self.shard(r).is_file() for r in range(self.regions))
