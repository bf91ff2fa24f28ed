"""Does bf16 autocast train this model as fp32 does? Checked before ``--bf16 auto`` (the
default) trains in it.

Speed alone must not choose how a model trains, as it must not choose how one decodes
(``glassformer.kernels.fidelity``). Where the model's matrix products measure faster in bf16
(``glassformer.kernels.precision``), the run first takes ``STEPS`` optimizer steps twice, from
the same weights, on the same first batches, with its own optimizer, schedule, clipping and
random draws: once in fp32, once under bf16 autocast. bf16 is chosen only where every step's
loss stays within ``MAX_GAP`` of fp32's (relative): the copies start equal, so the gap grows
from rounding alone, and a gap past the bound says bf16 changes what is learnt.

    >>> check = short_runs(model, optimizer_for, schedule, batches, loss_fn, loop)  # doctest: +SKIP
    >>> check.gap, check.within_bound                                          # doctest: +SKIP
    (0.0021, True)

A result is cached in ``training_fidelity.json`` under the cache folder, keyed by the
processor and device, torch's version, the model's kind, configuration and weights, the
batches (a digest of both), the loop's settings and the caller's (the run's options).
"""

from __future__ import annotations

import copy
import hashlib
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from glassformer.cache import cache_root
from glassformer.errors import NonFiniteLossError
from glassformer.kernels.fidelity import fingerprint
from glassformer.kernels.precision_cache import processor, read_cache, write_cache
from glassformer.training.loop import LossFn, TrainConfig, train
from glassformer.training.schedules import Schedule

CACHE_FILE = "training_fidelity.json"
STEPS = 8  # optimizer steps of each precision
# The bound on |loss_bf16 - loss_fp32| / loss_fp32 at any of the steps. The packaged tasks'
# models measured 0.00% to 0.08% over 12 steps (2-core Xeon; docs/guides/training.md); a
# linear model whose inputs sit at 1,024 ± 1, which bf16 cannot hold apart, 8% over 8.
MAX_GAP = 0.02
SEED = 20_240_601  # the random draws (dropout) both copies share


@dataclass(frozen=True)
class TrainingFidelity:
    """The losses of ``STEPS`` steps in fp32 and under bf16 autocast, and whether they came
    from the cache."""

    fp32: tuple[float, ...]
    bf16: tuple[float, ...]
    cached: bool = False

    @property
    def gap(self) -> float:
        """The largest relative difference of a step's losses (inf where one is not finite)."""
        if len(self.fp32) != len(self.bf16) or not all(map(_finite, (*self.fp32, *self.bf16))):
            return float("inf")  # a copy stopped early: its loss was not finite
        pairs = zip(self.fp32, self.bf16, strict=True)
        return max((abs(b - f) / max(abs(f), 1e-12) for f, b in pairs), default=0.0)

    @property
    def within_bound(self) -> bool:
        return self.gap <= MAX_GAP

    def describe(self) -> str:
        bound = "within" if self.within_bound else "outside"
        return (
            f"{len(self.fp32)} steps' losses at most {self.gap:.2%} from fp32's: {bound} the "
            f"bound ({MAX_GAP:.0%}){' (cached)' if self.cached else ''}"
        )


def short_runs(
    model: nn.Module,
    optimizer_for: Callable[[nn.Module], torch.optim.Optimizer],
    schedule: Schedule,
    batches: Sequence[Any],
    loss_fn: LossFn,
    loop: TrainConfig,
    settings: str = "",
    cache_dir: str | Path | None = None,
) -> TrainingFidelity:
    """``len(batches) / loop.accumulation`` steps of copies of ``model`` in fp32 and under bf16
    autocast (``model`` itself and the random streams untouched), or the cached result;
    ``settings``: what else the losses depend on (the optimizer's kind and rates), for the
    cache's key."""
    loop = replace(loop, max_steps=len(batches) // loop.accumulation, minutes=None)
    key = _key(model, batches, loop, settings)
    found = _cached(key, cache_dir)
    if found is not None:
        return found
    runs = _Twins(model, optimizer_for, schedule, batches, loss_fn, loop)
    fp32, bf16 = runs.losses(bf16=False), runs.losses(bf16=True)
    result = TrainingFidelity(fp32=fp32, bf16=bf16)
    if all(map(_finite, (*fp32, *bf16))):
        _remember(key, result, cache_dir)
    return result


def taken(batches: Any, count: int) -> list[Any]:
    """The next ``count`` batches of a run's resumable stream, which is then put back where it
    was (its position and the random draws of its shuffling), so the run sees them again."""
    saved = batches.state_dict()
    with torch.random.fork_rng(devices=[]):
        out = [next(batches) for _ in range(count)]
    batches.load_state_dict(saved)
    return out


@dataclass(frozen=True)
class _Twins:
    """Copies of a model trained from the same weights, on the same batches and draws."""

    model: nn.Module
    optimizer_for: Callable[[nn.Module], torch.optim.Optimizer]
    schedule: Schedule
    batches: Sequence[Any]
    loss_fn: LossFn
    loop: TrainConfig

    def losses(self, bf16: bool) -> tuple[float, ...]:
        """Each step's loss, a copy trained under bf16 autocast or not (NaN last where the
        loss stopped being finite)."""
        seen: list[float] = []

        def record(event: str, state: Any, metrics: dict[str, float]) -> None:
            if event == "step":
                seen.append(float(metrics["loss"]))

        device = next(self.model.parameters()).device
        with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
            torch.manual_seed(SEED)
            twin = copy.deepcopy(self.model)
            config = replace(self.loop, bf16=bf16, on_nonfinite="stop")
            optimizer, batches = self.optimizer_for(twin), iter(self.batches)
            try:
                train(
                    twin, optimizer, self.schedule, batches, self.loss_fn, config, hooks=(record,)
                )
            except NonFiniteLossError:  # the check fails
                seen.append(float("nan"))
        return tuple(seen)


def _key(model: nn.Module, batches: Sequence[Any], loop: TrainConfig, settings: str) -> str:
    tensors = tuple(_tensors(batches))
    device = next(model.parameters()).device
    config = getattr(model, "config", None)
    described = (
        f"{type(model).__name__} {config!r} {device} {loop.accumulation} {loop.clip_norm} "
        f"{SEED} {len(batches)} {settings}"
    )
    digest = hashlib.sha256(described.encode()).hexdigest()[:16]
    return f"{processor()}; torch {torch.__version__}; {fingerprint(model, tensors)} {digest}"


def _tensors(batch: Any) -> list[Tensor]:
    if isinstance(batch, Tensor):
        return [batch]
    if isinstance(batch, (tuple, list)):
        return [t for item in batch for t in _tensors(item)]
    if isinstance(batch, dict):
        return [t for key in sorted(batch, key=str) for t in _tensors(batch[key])]
    return []


def _cached(key: str, cache_dir: str | Path | None) -> TrainingFidelity | None:
    entry: Any = read_cache(cache_root(cache_dir) / CACHE_FILE).get(key)
    try:
        fp32, bf16 = (tuple(float(v) for v in entry[name]) for name in ("fp32", "bf16"))
    except (TypeError, KeyError, ValueError):  # none, or unreadable: run again
        return None
    if not fp32 or len(fp32) != len(bf16):
        return None
    return TrainingFidelity(fp32=fp32, bf16=bf16, cached=True)


def _remember(key: str, result: TrainingFidelity, cache_dir: str | Path | None) -> None:
    path = cache_root(cache_dir) / CACHE_FILE
    data = read_cache(path)
    entry = {k: list(v) for k, v in asdict(result).items() if k != "cached"}
    data[key] = {**entry, "measured_at": round(time.time())}
    write_cache(path, data)


def _finite(value: float) -> bool:
    return value == value and abs(value) != float("inf")
