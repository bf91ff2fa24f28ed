"""The training loop: one model-agnostic function with hooks.

    for each optimizer step:
        for each of `accumulation` micro-batches:
            loss_sum, count = loss_fn(model, batch)   # summed over tokens (or examples)
            loss_sum.backward()
        divide the gradients by the total count         # = the mean over the whole big batch
        clip, set the step's learning rate, optimizer.step()
        hooks("step", ...)                              # progress bar, metrics, checkpoints

A non-finite loss or gradient norm never reaches the weights: by default training stops
with ``NonFiniteLossError`` naming the step (``on_nonfinite="stop"``); with
``on_nonfinite="skip"`` that step's batches are dropped, counted in ``TrainState.skipped``,
and training goes on.

Summing then dividing by the total count makes k micro-batches exactly one big batch, even
when the micro-batches hold different numbers of real (non-pad) tokens. Under ``torchrun``
(see ``training.distributed``) the counts are summed over the ranks too, so N processes
make one step over the union of their batches.
"""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor, nn

from glassformer.errors import NonFiniteLossError
from glassformer.training.distributed import Distributed, is_sharded, no_gradient_sync
from glassformer.training.optim import group_lr
from glassformer.training.schedules import Schedule

LossFn = Callable[[nn.Module, Any], tuple[Tensor, int]]
Hook = Callable[[str, "TrainState", dict[str, float]], None]
NONFINITE_POLICIES = ("stop", "skip")
MAX_CONSECUTIVE_SKIPS = 10  # with "skip": this many non-finite steps in a row stop training


@dataclass
class TrainConfig:
    """How long and how to train.

    Args:
        max_steps: stop after this many optimizer steps (None: only the time budget).
        minutes: stop once this much training time has passed (None: only max_steps).
        accumulation: micro-batches per optimizer step.
        clip_norm: clip the gradient norm to this (None: no clipping).
        bf16: run forward and loss under bfloat16 autocast.
        eval_every: evaluate every this many steps (0: only at the end).
        on_nonfinite: what a NaN/inf loss or gradient norm does: "stop" (raise
            ``NonFiniteLossError``) or "skip" (drop that step's batches and go on).
    """

    max_steps: int | None = None
    minutes: float | None = None
    accumulation: int = 1
    clip_norm: float | None = 1.0
    bf16: bool = False
    eval_every: int = 0
    on_nonfinite: str = "stop"

    def __post_init__(self) -> None:
        if self.max_steps is None and self.minutes is None:
            raise ValueError("give max_steps or minutes (or both) so training can end")
        if self.max_steps is not None and self.max_steps <= 0:
            raise ValueError(f"max_steps must be a positive integer, got {self.max_steps}")
        if self.minutes is not None and self.minutes <= 0:
            raise ValueError(f"minutes must be > 0, got {self.minutes}")
        if self.accumulation <= 0:
            raise ValueError(f"accumulation must be a positive integer, got {self.accumulation}")
        if self.clip_norm is not None and self.clip_norm <= 0:
            raise ValueError(f"clip_norm must be > 0 or None, got {self.clip_norm}")
        if self.eval_every < 0:
            raise ValueError(f"eval_every must be >= 0, got {self.eval_every}")
        if self.on_nonfinite not in NONFINITE_POLICIES:
            raise ValueError(
                f"on_nonfinite must be one of {list(NONFINITE_POLICIES)}, got {self.on_nonfinite!r}"
            )

    def evaluates_at(self, step: int) -> bool:
        """Whether ``step`` is one of every ``eval_every`` (the end is evaluated too)."""
        return bool(self.eval_every) and step % self.eval_every == 0


@dataclass
class TrainState:
    """Where training is; saved with checkpoints so a resumed run carries on."""

    step: int = 0  # optimizer steps taken
    tokens: int = 0  # real tokens (or examples) trained on
    elapsed: float = 0.0  # seconds of training, summed over resumed runs
    last_loss: float = math.nan
    history: list[dict[str, float]] = field(default_factory=list)  # eval results
    skipped: int = 0  # steps dropped for a non-finite loss (on_nonfinite="skip")

    def done(self, config: TrainConfig) -> bool:
        if config.max_steps is not None and self.step >= config.max_steps:
            return True
        return config.minutes is not None and self.elapsed >= config.minutes * 60


def train(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    schedule: Schedule,
    batches: Iterator[Any],
    loss_fn: LossFn,
    config: TrainConfig,
    *,
    state: TrainState | None = None,
    evaluate: Callable[[nn.Module], dict[str, float]] | None = None,
    hooks: tuple[Hook, ...] = (),
    world: Distributed | None = None,
) -> TrainState:
    """Train ``model`` until ``config`` says stop; return the final state.

    Args:
        model: any module; ``loss_fn`` knows how to call it.
        optimizer: its learning rate is set from ``schedule`` before every step.
        schedule: learning rate as a function of the step.
        batches: an endless iterator of batches (whatever ``loss_fn`` accepts).
        loss_fn: ``(model, batch) -> (loss summed over items, number of items)``.
        config: when to stop, accumulation, clipping, bf16, evaluation cadence.
        state: a resumed run's state; a fresh one if None.
        evaluate: ``model -> metrics``, run every ``config.eval_every`` steps and at the end,
            in eval mode without gradients.
        hooks: called as ``hook(event, state, metrics)`` for events "step" (after every
            optimizer step), "skip" (a non-finite step dropped), "eval" and "end" (also
            when interrupted, before re-raising; after a non-finite stop its metrics hold
            ``{"nonfinite": 1.0}``).
        world: this process's place in a ``torchrun`` job (``model`` then is the
            ``DistributedDataParallel`` wrapper or the FSDP-sharded model); losses, counts
            and times are agreed over the ranks, and only rank 0 evaluates (all ranks take
            part under FSDP, whose forward passes gather parameters from every rank).

    Raises:
        NonFiniteLossError: the loss or gradient norm was not finite (``on_nonfinite="stop"``,
            or too many skips in a row); the weights are those of the last good step.
    """
    state = state or TrainState()
    world = world or Distributed()
    params = [p for p in model.parameters() if p.requires_grad]
    plain = getattr(model, "module", model)  # evaluation runs outside DDP's collectives
    sharded = is_sharded(getattr(model, "_orig_mod", model))

    def emit(event: str, metrics: dict[str, float]) -> None:
        for hook in hooks:
            hook(event, state, metrics)

    def run_eval() -> None:
        if evaluate is None or not (world.is_main or sharded):
            return
        plain.eval()
        with torch.no_grad(), _autocast(plain, config.bf16):
            metrics = {"step": state.step, **evaluate(plain if world.enabled else model)}
        plain.train()
        if world.is_main:
            state.history.append(metrics)
            emit("eval", metrics)

    model.train()
    end_metrics: dict[str, float] = {}
    skips_in_a_row = 0
    try:
        while not state.done(config):
            started = time.perf_counter()
            local_loss, local_count = _accumulate(model, batches, loss_fn, config)
            loss_sum, summed_count = world.sum(local_loss, local_count)  # over the ranks
            count = int(summed_count)
            grads = [p.grad for p in params if p.grad is not None]
            # DDP has averaged the ranks' gradient sums: × world_size / count = the mean
            torch._foreach_div_(grads, max(count, 1) / world.world_size)
            grad_norm = _clip(params, config.clip_norm)
            problem = _nonfinite(loss_sum, grad_norm, state.step + 1)
            if problem is not None:
                optimizer.zero_grad(set_to_none=True)  # nothing of this step reaches the weights
                state.elapsed += world.max(time.perf_counter() - started)
                skips_in_a_row += 1
                if config.on_nonfinite == "stop" or skips_in_a_row >= MAX_CONSECUTIVE_SKIPS:
                    if config.on_nonfinite == "skip":
                        problem += f" ({skips_in_a_row} non-finite steps in a row)"
                    end_metrics = {"nonfinite": 1.0}
                    raise NonFiniteLossError(problem, step=state.step + 1)
                state.skipped += 1
                emit("skip", {"skipped": state.skipped})
                continue
            skips_in_a_row = 0
            lr = _optimizer_step(optimizer, schedule, state, config)
            seconds = world.max(time.perf_counter() - started)  # ranks agree when to stop
            state.step += 1
            state.tokens += count
            state.elapsed += seconds
            state.last_loss = loss_sum / max(count, 1)
            metrics = {"loss": state.last_loss, "lr": lr, "grad_norm": grad_norm}
            if state.skipped:
                metrics["skipped"] = state.skipped
            emit("step", {**metrics, "tokens_per_s": count / seconds})
            if config.evaluates_at(state.step) and not state.done(config):
                run_eval()
        run_eval()
    finally:
        emit("end", end_metrics)
    return state


def _optimizer_step(
    optimizer: torch.optim.Optimizer, schedule: Schedule, state: TrainState, config: TrainConfig
) -> float:
    """Set every group's rate for this step, step, clear the gradients; the schedule's rate."""
    lr = schedule.lr_at(state.step, _time_progress(state, config))
    for group in optimizer.param_groups:
        group["lr"] = group_lr(group, lr, state.step)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return lr


def _accumulate(
    model: nn.Module, batches: Iterator[Any], loss_fn: LossFn, config: TrainConfig
) -> tuple[float, int]:
    """Forward and backward over ``config.accumulation`` micro-batches; sum losses and counts."""
    total_loss, total_count = 0.0, 0
    device = next(model.parameters()).device
    for i in range(config.accumulation):
        batch = to_device(next(batches), device)
        last = i == config.accumulation - 1
        # DDP and FSDP reduce the gradients once, with the last micro-batch's backward
        with contextlib.nullcontext() if last else no_gradient_sync(model):
            with _autocast(model, config.bf16):
                loss_sum, count = loss_fn(model, batch)
            loss_sum.backward()
        total_loss += loss_sum.item()
        total_count += count
    return total_loss, total_count


def to_device(batch: Any, device: torch.device) -> Any:
    """A batch (a tensor, or a tuple/list of them) on ``device``; a no-op where it is."""
    if isinstance(batch, Tensor):
        return batch.to(device, non_blocking=True)
    if isinstance(batch, (tuple, list)):
        return type(batch)(to_device(b, device) for b in batch)
    return batch


def _nonfinite(loss_sum: float, grad_norm: float, step: int) -> str | None:
    """What is not finite at ``step`` ("loss is nan at step 37"), or None if all is well."""
    if not math.isfinite(loss_sum):
        return f"loss is {loss_sum} at step {step}"
    if not math.isfinite(grad_norm):
        return f"gradient norm is {grad_norm} at step {step}"
    return None


def _clip(params: Sequence[Tensor], clip_norm: float | None) -> float:
    """Clip the gradients' global norm to ``clip_norm`` (None: only measure it)."""
    if clip_norm is None:
        norm = torch.nn.utils.get_total_norm([p.grad for p in params if p.grad is not None])
    else:
        norm = torch.nn.utils.clip_grad_norm_(params, clip_norm)
    return float(norm.full_tensor() if hasattr(norm, "full_tensor") else norm)  # FSDP: DTensor


def _time_progress(state: TrainState, config: TrainConfig) -> float | None:
    """How far through a pure time budget training is (None when steps set the length)."""
    if config.max_steps is not None or config.minutes is None:
        return None
    return state.elapsed / (config.minutes * 60)


def _autocast(model: nn.Module, bf16: bool) -> torch.autocast:
    device = next(model.parameters()).device.type
    return torch.autocast(device, torch.bfloat16, enabled=bf16)
