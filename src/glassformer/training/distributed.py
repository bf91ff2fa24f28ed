"""Data-parallel training under ``torchrun``: one process per core group, GPU or node.

    torchrun --nproc_per_node 2 -m glassformer train lm --corpus austen ...

torchrun starts the processes and sets RANK, WORLD_SIZE and LOCAL_RANK (and the
rendezvous address); ``setup()`` reads them and joins the process group: gloo on CPU,
NCCL on CUDA GPUs (device ``cuda:LOCAL_RANK``). Started without torchrun, it is one
process and nothing changes.

Each rank draws its own slice of every global batch (the samplers in
``glassformer.data.batching`` take ``rank`` and ``world_size``), computes the loss summed
over its tokens, and ``DistributedDataParallel`` averages the gradients while backward
runs. The loop then rescales them by ``world_size / global token count``, so a step is
exactly the single-process step over the union of the ranks' batches. Only rank 0 shows
progress, writes metrics and saves checkpoints.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn


@dataclass(frozen=True)
class Distributed:
    """This process's place in the job."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    device: torch.device = torch.device("cpu")

    @property
    def enabled(self) -> bool:
        return self.world_size > 1

    @property
    def is_main(self) -> bool:
        """Rank 0: the one that logs and saves."""
        return self.rank == 0

    def sum(self, *values: float) -> list[float]:
        """The sum of each value over all ranks (the values themselves on one process)."""
        if not self.enabled:
            return list(values)
        t = torch.tensor(values, dtype=torch.float64, device=self.device)
        dist.all_reduce(t, op=dist.ReduceOp.SUM)
        return t.tolist()

    def max(self, value: float) -> float:
        """The largest of a value over all ranks: the ranks agree on e.g. elapsed time."""
        if not self.enabled:
            return value
        t = torch.tensor([value], dtype=torch.float64, device=self.device)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return t.item()

    def broadcast_bytes(self, data: bytes | None) -> bytes:
        """Rank 0's ``data``, on every rank (``data`` is ignored elsewhere)."""
        if not self.enabled:
            assert data is not None
            return data
        box = [data if self.is_main else None]
        dist.broadcast_object_list(box, src=0, device=self.device)
        return box[0]

    def barrier(self) -> None:
        if self.enabled:
            dist.barrier()


def setup(device: str = "auto") -> Distributed:
    """Join the process group torchrun describes in the environment (if any).

    Args:
        device: "auto" (CUDA if there is a GPU, else CPU), "cpu" or "cuda".
    """
    if device not in ("auto", "cpu", "cuda"):
        raise ValueError(f"device must be 'auto', 'cpu' or 'cuda', got {device!r}")
    cuda = torch.cuda.is_available() if device == "auto" else device == "cuda"
    if cuda and not torch.cuda.is_available():
        raise ValueError("--device cuda was asked for, but PyTorch sees no CUDA GPU")
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if world_size < 1 or not 0 <= rank < world_size:
        raise ValueError(f"bad torchrun environment: RANK={rank}, WORLD_SIZE={world_size}")
    where = torch.device("cuda", local_rank) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(where)
    if world_size > 1 and not dist.is_initialized():
        dist.init_process_group(backend="nccl" if cuda else "gloo")
    return Distributed(rank, world_size, local_rank, where)


def teardown(world: Distributed) -> None:
    if world.enabled and dist.is_initialized():
        dist.destroy_process_group()


def wrap(model: nn.Module, world: Distributed) -> nn.Module:
    """The module the training steps run through: the model itself on one process,
    ``DistributedDataParallel`` on several. Checkpoints always save the plain model."""
    if not world.enabled:
        return model
    ids = [world.device.index] if world.device.type == "cuda" else None
    # the buffers (position tables) never change: no broadcast before every forward
    return nn.parallel.DistributedDataParallel(model, device_ids=ids, broadcast_buffers=False)
