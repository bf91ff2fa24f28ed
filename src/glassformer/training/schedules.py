"""Learning-rate schedules, as plain functions of the optimizer step.

    noam:          the paper's warm-up, lr = scale · D^-0.5 · min(s^-0.5, s · warmup^-1.5)
    cosine:        linear warm-up to ``lr``, then cosine decay to ``min_lr`` at ``total_steps``
                   (or at the end of a time budget)
    constant:      linear warm-up to ``lr``, then flat

Being functions of the step (not stateful scheduler objects), they resume exactly:
restoring the step restores the learning rate.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

SCHEDULES = ("noam", "cosine", "constant")


@dataclass(frozen=True)
class Schedule:
    """A learning-rate schedule. ``lr_at(step)`` gives the rate for 0-based ``step``.

    Args:
        kind: "noam", "cosine" or "constant".
        lr: peak rate (cosine, constant) or the paper's scale factor (noam: 1.0 is the paper's).
        warmup: warm-up steps.
        total_steps: where cosine reaches ``min_lr`` (ignored by the others).
        min_lr: the floor of the cosine.
        d_model: model width, for noam's D^-0.5.
    """

    kind: str = "cosine"
    lr: float = 1e-3
    warmup: int = 100
    total_steps: int = 1000
    min_lr: float = 0.0
    d_model: int = 512

    def __post_init__(self) -> None:
        if self.kind not in SCHEDULES:
            raise ValueError(f"schedule must be one of {list(SCHEDULES)}, got {self.kind!r}")
        if self.lr <= 0:
            raise ValueError(f"learning rate must be > 0, got {self.lr}")
        if self.warmup < 0:
            raise ValueError(f"warmup must be >= 0 steps, got {self.warmup}")

    def lr_at(self, step: int, progress: float | None = None) -> float:
        """The rate for 0-based ``step``.

        ``progress`` (0..1), when given, replaces ``step / total_steps`` as the cosine's
        position: a run with a time budget decays over its time, not a guessed step count.
        """
        s = step + 1  # 1-based, so the first step has a non-zero rate
        if self.kind == "noam":
            warmup = max(self.warmup, 1)
            return self.lr * self.d_model**-0.5 * min(s**-0.5, s * warmup**-1.5)
        if s <= self.warmup:
            return self.lr * s / self.warmup
        if self.kind == "constant":
            return self.lr
        if progress is None:
            progress = (s - self.warmup) / max(self.total_steps - self.warmup, 1)
        progress = min(max(progress, 0.0), 1.0)
        return self.min_lr + 0.5 * (self.lr - self.min_lr) * (1 + math.cos(math.pi * progress))
