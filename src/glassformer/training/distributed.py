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

With ``strategy="fsdp"`` each encoder/decoder layer, and then the whole model, is sharded
with FSDP (``fully_shard``): every rank keeps 1/N of the parameters, gradients and
optimizer state, and gathers a layer's parameters just before it runs. Every rank then
takes part in evaluation and in gathering the full weights and optimizer state for a
checkpoint, which rank 0 writes in the usual format.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

# FSDP and its state-dict helpers are imported where they are used: importing them costs
# half a second, which every glassformer command would otherwise pay.

STRATEGIES = ("ddp", "fsdp")


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
        received = box[0]
        assert isinstance(received, bytes)
        return received

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


def wrap(model: nn.Module, world: Distributed, strategy: str = "ddp") -> nn.Module:
    """The module the training steps run through: the model itself on one process;
    on several, ``DistributedDataParallel`` around it ("ddp") or the model sharded in
    place, layer by layer ("fsdp"). Checkpoints always hold the plain model's weights."""
    if strategy not in STRATEGIES:
        raise ValueError(f"strategy must be one of {list(STRATEGIES)}, got {strategy!r}")
    if not world.enabled:
        return model
    if strategy == "fsdp":
        from torch.distributed.fsdp import fully_shard

        from glassformer.modules.block import Block

        for module in model.modules():
            if isinstance(module, Block):
                fully_shard(module)
        fully_shard(model)
        return model
    ids = [world.device.index] if world.device.type == "cuda" else None
    # the buffers (position tables) never change: no broadcast before every forward
    return nn.parallel.DistributedDataParallel(model, device_ids=ids, broadcast_buffers=False)


def is_sharded(model: nn.Module) -> bool:
    """True for an FSDP-sharded model: every rank must join its forward passes."""
    if not (dist.is_available() and dist.is_initialized()):
        return False  # sharding needs a process group
    from torch.distributed.fsdp import FSDPModule

    return isinstance(model, FSDPModule)


@contextlib.contextmanager
def no_gradient_sync(model: nn.Module) -> Iterator[None]:
    """Backward passes that keep their gradients local (all but an accumulated step's last)."""
    model = getattr(model, "_orig_mod", model)  # through torch.compile
    sharded: Any = model  # fully_shard adds set_requires_gradient_sync to the model
    if isinstance(model, nn.parallel.DistributedDataParallel):
        with model.no_sync():
            yield
    elif is_sharded(model):
        sharded.set_requires_gradient_sync(False)
        try:
            yield
        finally:
            sharded.set_requires_gradient_sync(True)
    else:
        yield


def _full():
    from torch.distributed.checkpoint.state_dict import StateDictOptions

    return StateDictOptions(full_state_dict=True, cpu_offload=True)


def plain_model(model: nn.Module) -> Any:
    """An unsharded copy of a sharded model, on the CPU of rank 0 (every rank must call
    this; the others get None). An unsharded model is returned as it is."""
    if not is_sharded(model):
        return model
    from torch.distributed.checkpoint.state_dict import get_model_state_dict
    from torch.distributed.fsdp import FSDPModule

    state = get_model_state_dict(model, options=_full())  # gathered onto rank 0's CPU
    if dist.get_rank() != 0:
        return None
    with torch.device("meta"):  # no memory and no random numbers drawn
        # fully_shard made the model's class a subclass of FSDPModule and the model's own
        cls: Any = next(c for c in type(model).__mro__ if not issubclass(c, FSDPModule))
        copy = cls(model.config)
    tied = _tied_names(copy)
    copy.to_empty(device="cpu")
    for first, *others in tied:  # to_empty unties shared parameters: tie them again
        for name in others:
            owner, _, attr = name.rpartition(".")
            setattr(copy.get_submodule(owner), attr, copy.get_parameter(first))
    copy.load_state_dict(state)
    return copy


def _tied_names(model: nn.Module) -> list[list[str]]:
    groups: dict[int, list[str]] = {}
    for name, p in model.named_parameters(remove_duplicate=False):
        groups.setdefault(id(p), []).append(name)
    return [names for names in groups.values() if len(names) > 1]


def optimizer_state(model: nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    """The optimizer's state to save: the usual ``state_dict()`` for an unsharded model;
    gathered in full and keyed by parameter name for a sharded one (every rank calls)."""
    if not is_sharded(model):
        return optimizer.state_dict()
    from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict

    return get_optimizer_state_dict(model, optimizer, options=_full())


def load_optimizer_state(
    model: nn.Module, optimizer: torch.optim.Optimizer, saved: dict[str, Any]
) -> None:
    """Restore a saved optimizer state, whichever of the two forms it has, into a sharded
    or an unsharded model's optimizer."""
    by_name = any(isinstance(k, str) for k in saved.get("state", {}))
    if not by_name and not is_sharded(model):
        optimizer.load_state_dict(saved)
        return
    if not by_name:  # index-keyed: name the parameters in the order the optimizer has them
        names = {id(p): n for n, p in model.named_parameters()}
        order = [names[id(p)] for group in optimizer.param_groups for p in group["params"]]
        saved = {
            "state": {order[i]: v for i, v in saved["state"].items()},
            "param_groups": [
                {**g, "params": [order[i] for i in g["params"]]} for g in saved["param_groups"]
            ],
        }
    from torch.distributed.checkpoint.state_dict import (
        StateDictOptions,
        set_optimizer_state_dict,
    )

    set_optimizer_state_dict(
        model, optimizer, saved, options=StateDictOptions(full_state_dict=True)
    )
