"""`glassformer train`'s PyTorch side: the training loop with its hooks, on one process or
under torchrun (DDP or FSDP), resuming where a run stopped."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import torch

from glassformer.cli.train import start_run_dir
from glassformer.training import TrainState, distributed, make_optimizer, train
from glassformer.training.loop import NonFiniteLossError
from glassformer.training.run import Checkpointer, MetricsLog, ProgressBar, restore


def train_torch(args, o: dict[str, Any], task, model, schedule, config, world):
    """The PyTorch loop with its hooks (progress bar, metrics.jsonl, checkpoints), on one
    process or under torchrun; returns (the trained plain model, or None on ranks other
    than 0, and the final TrainState)."""
    out = Path(o["out"])
    resume_dir = Path(args.resume) if args.resume else None
    # The module the steps run through: DDP around the model, or the model sharded in place
    # (FSDP, before the optimizer sees its parameters); torch.compile outermost. Checkpoints
    # hold the plain model's keys.
    strategy = getattr(args, "strategy", "ddp")
    stepped = distributed.wrap(model, world, strategy)
    stepped = torch.compile(stepped) if o.get("compile") else stepped
    optimizer = make_optimizer(model, o["optimizer"], lr=o["lr"], weight_decay=o["weight_decay"])
    if o["bf16"] and _cpu_without_bf16(model) and world.is_main:
        print(
            "warning: --bf16 on a CPU without native bfloat16 (no AVX512-BF16 or AMX): "
            "PyTorch emulates it, and training will be many times slower than fp32",
            file=sys.stderr,
        )
    state = restore(resume_dir, optimizer, task.batches, model) if resume_dir else None
    if world.enabled:  # each rank its own dropout stream (the data streams are shared)
        torch.manual_seed(o["seed"] + 1_000_003 * world.rank + (state.step if state else 0))
    metrics_log = MetricsLog(out / "metrics.jsonl", every=o.get("log_every") or 10)
    if world.is_main:
        start_run_dir(o, fresh=state is None)
        if state is not None:  # rows logged after the checkpoint, by the cut-short run, come again
            metrics_log.truncate_after(state.step)
    checkpointer = Checkpointer(
        out,
        model,
        optimizer,
        task.batches,
        every=o["checkpoint_every"],
        extra_files=task.extra_files,
    )
    checkpointer.saved_step = state.step if state is not None else None
    sharded = distributed.is_sharded(model)
    hooks = (checkpointer,) if sharded else ()  # every rank helps gather a sharded model
    if world.is_main:
        hooks = (
            ProgressBar(config, state or TrainState(), unit=task.unit),
            metrics_log,
            checkpointer,
        )
    try:
        state = train(
            stepped,
            optimizer,
            schedule,
            task.batches,
            task.loss_fn,
            config,
            state=state,
            evaluate=task.evaluate,
            hooks=hooks,
            world=world,
        )
    except NonFiniteLossError as e:
        raise NonFiniteLossError(
            f"{e}; {checkpointer.last_good()} (training stopped; --resume {out} "
            "--on-nonfinite skip continues from it, skipping such batches)",
            step=e.step,
        ) from None
    return distributed.plain_model(model), state  # a sharded model is gathered onto rank 0


def _cpu_without_bf16(model) -> bool:
    """True when the model is on a CPU whose bfloat16 matrix products PyTorch emulates."""
    if next(model.parameters()).device.type != "cpu":
        return False
    return not torch.ops.mkldnn._is_mkldnn_bf16_supported()
