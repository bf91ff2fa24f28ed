"""Training: ``RunConfig`` and ``fit`` (a whole run), the loop, tasks, schedules,
optimisers and losses."""

from glassformer.training.config import RunConfig, RunConfigError
from glassformer.training.loop import TrainConfig, TrainState, train
from glassformer.training.losses import loss_for, token_cross_entropy
from glassformer.training.optim import make_optimizer
from glassformer.training.runner import RunResult, fit
from glassformer.training.schedules import Schedule

__all__ = [
    "RunConfig",
    "RunConfigError",
    "RunResult",
    "Schedule",
    "TrainConfig",
    "TrainState",
    "fit",
    "loss_for",
    "make_optimizer",
    "token_cross_entropy",
    "train",
]
