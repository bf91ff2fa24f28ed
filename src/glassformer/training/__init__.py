"""Training: the loop, schedules, optimisers and losses."""

from glassformer.training.loop import TrainConfig, TrainState, train
from glassformer.training.losses import loss_for, token_cross_entropy
from glassformer.training.optim import make_optimizer
from glassformer.training.schedules import Schedule

__all__ = [
    "Schedule",
    "TrainConfig",
    "TrainState",
    "loss_for",
    "make_optimizer",
    "token_cross_entropy",
    "train",
]
