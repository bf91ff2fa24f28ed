"""A run's PyTorch side: the training loop with its hooks (progress bar, metrics.jsonl,
checkpoints), on one process or under torchrun (DDP or FSDP), resuming where a run
stopped. ``fit`` calls ``train_torch``; ``keras_fit.train_keras`` is its Keras twin."""

from __future__ import annotations

import dataclasses
import functools
from pathlib import Path
from typing import Any

import torch
from torch import nn

from glassformer.errors import NonFiniteLossError
from glassformer.kernels.precision import resolve_bf16
from glassformer.models.base import PretrainedModel
from glassformer.training import distributed
from glassformer.training.bf16_check import STEPS, TrainingFidelity, short_runs, taken
from glassformer.training.config import RunConfig, filled
from glassformer.training.distributed import Distributed
from glassformer.training.loop import Hook, TrainConfig, TrainState, train
from glassformer.training.optim import make_optimizer
from glassformer.training.run import Checkpointer, MetricsLog, ProgressBar, restore, start_run_dir
from glassformer.training.schedules import Schedule
from glassformer.training.tasks import Task
from glassformer.training.tasks.classify import ENCODER_PARTS


def schedule_and_config(
    config: RunConfig, model: PretrainedModel, bf16: bool | None = None
) -> tuple[Schedule, TrainConfig]:
    """The learning-rate schedule and the loop's configuration, from a run's config;
    ``bf16`` is the autocast decision (``bf16_for``), else the config's own True/False."""
    lr = filled(config.lr)
    # Under a pure time budget the cosine decays over the time (see Schedule.lr_at).
    schedule = Schedule(
        filled(config.schedule),
        lr=lr,
        warmup=filled(config.warmup),
        total_steps=config.max_steps or 1,
        min_lr=lr / 10,
        d_model=model.config.d_model,
    )
    loop_config = TrainConfig(
        max_steps=config.max_steps,
        minutes=config.minutes,
        accumulation=config.accumulation,
        clip_norm=config.clip_norm,
        bf16=config.bf16 is True if bf16 is None else bf16,
        eval_every=config.eval_every,
        on_nonfinite=config.on_nonfinite,
    )
    return schedule, loop_config


def run_optimizer(config: RunConfig, model: nn.Module) -> torch.optim.Optimizer:
    """The run's optimizer over ``model``'s parameters (its kind, rate, decay and parts)."""
    return make_optimizer(
        model,
        filled(config.optimizer),
        lr=filled(config.lr),
        weight_decay=config.weight_decay,
        parts=encoder_parts(config),
    )


def encoder_parts(config: RunConfig) -> dict[str | tuple[str, ...], dict[str, float]] | None:
    """A fine-tuned classifier's pretrained parts: their own rate and freezing."""
    if config.init is None:
        return None
    options = {
        "lr_scale": (config.encoder_lr or filled(config.lr)) / filled(config.lr),
        "frozen_until": config.freeze_encoder_steps,
    }
    return {tuple(f"{part}." for part in ENCODER_PARTS): options}  # one group: the backbone


def train_torch(
    config: RunConfig,
    task: Task,
    model: nn.Module,
    schedule: Schedule,
    loop_config: TrainConfig,
    world: Distributed,
    resume_dir: Path | None,
    hooks: tuple[Hook, ...],
) -> tuple[Any, TrainState]:
    """The PyTorch loop with its hooks (progress bar, metrics.jsonl, checkpoints), on one
    process or under torchrun; returns (the trained plain model, or None on ranks other
    than 0, and the final TrainState)."""
    out = Path(config.out or ".")
    # The module the steps run through: DDP around the model, or the model sharded in place
    # (FSDP, before the optimizer sees its parameters); torch.compile outermost. Checkpoints
    # hold the plain model's keys.
    stepped: Any = distributed.wrap(model, world, config.strategy)
    stepped = torch.compile(stepped) if config.compile else stepped
    optimizer = run_optimizer(config, model)
    state = restore(resume_dir, optimizer, task.batches, model) if resume_dir else None
    if world.enabled:  # each rank its own dropout stream (the data streams are shared)
        torch.manual_seed(config.seed + 1_000_003 * world.rank + (state.step if state else 0))
    metrics_log = MetricsLog(out / "metrics.jsonl", every=config.log_every)
    if world.is_main:
        start_run_dir(config, out, world.world_size, fresh=state is None)
        if state is not None:  # rows logged after the checkpoint, by the cut-short run, come again
            metrics_log.truncate_after(state.step)
    checkpointer = Checkpointer(
        out,
        model,
        optimizer,
        task.batches,
        every=config.checkpoint_every,
        extra_files=task.extra_files,
        loop_config=loop_config,
    )
    checkpointer.saved_step = state.step if state is not None else None
    sharded = distributed.is_sharded(model)
    loop_hooks: tuple[Hook, ...] = (checkpointer,) if sharded else ()  # all ranks gather
    if world.is_main:
        progress = ProgressBar(loop_config, state or TrainState(), unit=task.unit)
        loop_hooks = (progress, metrics_log, checkpointer, *hooks)
    try:
        state = train(
            stepped,
            optimizer,
            schedule,
            task.batches,
            task.loss_fn,
            loop_config,
            state=state,
            evaluate=task.evaluate,
            hooks=loop_hooks,
            world=world,
        )
    except NonFiniteLossError as e:
        raise NonFiniteLossError(
            f"{e}; {checkpointer.last_good()} (training stopped; --resume {out} "
            "--on-nonfinite skip continues from it, skipping such batches)",
            step=e.step,
        ) from None
    return distributed.plain_model(model), state  # a sharded model is gathered onto rank 0


def bf16_for(
    config: RunConfig, model: PretrainedModel, task: Task | None = None
) -> tuple[bool, str | None]:
    """Whether the run trains under bf16 autocast, and a line saying why (None: nothing to
    say). ``bf16="auto"`` (the default) times matrix products of the model's shapes in fp32
    and bf16 (once per machine, cached); where bf16 is faster and ``task`` is given, it is
    taken only if a few steps of the model on the task's first batches keep fp32's losses
    (``bf16_check``). ``True`` warns, with both figures, where bf16 measures slower;
    ``False`` measures nothing."""
    if config.bf16 is False:
        return False, None
    c = model.config
    rows: int = min(filled(config.batch_size) * getattr(c, "max_len", 256), 4096)
    d: int = c.d_model
    d_ff: int = getattr(c, "d_ff", 4 * d)
    shapes = [(rows, d, 3 * d), (rows, d, d_ff), (rows, d_ff, d)]
    device = next(model.parameters()).device
    with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
        # (the measurement's random matrices are not the run's draws: a seed gives the same
        # run whether the verdict was cached or measured)
        use, measured, warning = resolve_bf16(config.bf16, shapes, device)
    if warning is not None:
        return use, f"warning: {warning}"
    if measured is None or config.bf16 != "auto":
        return use, None
    why = measured.describe()
    if use and task is not None:
        check = _short_runs(config, model, task)
        use, why = check.within_bound, f"{why}; bf16 against fp32: {check.describe()}"
    return use, f"bf16 autocast {'on' if use else 'off'} (--bf16 auto): {why}"


# Run options that do not change the short runs' losses (kept out of their cache key)
_NOT_IN_THE_LOSSES = frozenset(
    {"out", "minutes", "max_steps", "eval_every", "checkpoint_every", "log_every", "no_test",
     "compile", "bf16", "threads"}
)  # fmt: skip


def _short_runs(config: RunConfig, model: PretrainedModel, task: Task) -> TrainingFidelity:
    """``bf16_check.short_runs`` with the run's own optimizer, schedule and first batches."""
    schedule, loop = schedule_and_config(config, model, False)
    if config.max_steps is None:  # the run's cosine follows its clock: at its start, the peak
        schedule = dataclasses.replace(schedule, total_steps=10**9)
    batches = taken(task.batches, STEPS * loop.accumulation)
    optimizer_for = functools.partial(run_optimizer, config)
    options = {k: v for k, v in config.to_dict().items() if k not in _NOT_IN_THE_LOSSES}
    settings = f"{sorted(options.items())} {schedule}"
    return short_runs(model, optimizer_for, schedule, batches, task.loss_fn, loop, settings)
