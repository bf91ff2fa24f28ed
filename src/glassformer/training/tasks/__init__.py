"""The training tasks, one module each: ``lm`` (a GPT), ``translate`` (an encoder-decoder),
``classify`` (a classifier), ``mlm`` (an encoder pretrained by filling in masked words),
``vision`` (a Vision Transformer classifying images), ``sae`` (a sparse autoencoder on a
frozen model's activations) and ``transcoder`` (its MLPs as sparse features).

Each module has one ``build(config, *, tokenizer, labels, world) -> Task`` (the same
signature for every task: a new task is a module and a line in ``BUILDERS``), and its
``Task`` subclass: what it evaluates, reports and shows. ``build_task`` makes the one a
``RunConfig`` asks for."""

from __future__ import annotations

from collections.abc import Callable

from glassformer.data.images import ImageProcessor
from glassformer.data.tokenizers import Tokenizer
from glassformer.training.config import RunConfig
from glassformer.training.distributed import Distributed
from glassformer.training.tasks import classify, lm, mlm, sae, transcoder, translate, vision
from glassformer.training.tasks.common import (
    MappedBatches,
    ResumableBatches,
    Task,
    load_splits,
    tokenizer_files,
)

# task name -> its module's build(config, *, tokenizer, labels, world)
BUILDERS: dict[str, Callable[..., Task]] = {
    "lm": lm.build,
    "translate": translate.build,
    "classify": classify.build,
    "mlm": mlm.build,
    "vision": vision.build,
    "sae": sae.build,
    "transcoder": transcoder.build,
}

__all__ = [
    "BUILDERS",
    "MappedBatches",
    "ResumableBatches",
    "Task",
    "build_task",
    "load_splits",
    "tokenizer_files",
]


def build_task(
    config: RunConfig,
    *,
    tokenizer: Tokenizer | ImageProcessor | None = None,
    labels: list[str] | None = None,
    world: Distributed | None = None,
) -> Task:
    """The task ``config`` asks for, with its data read and its model built.

    Args:
        config: the run.
        tokenizer: a trained tokenizer to use (a resumed run's, or rank 0's under
            torchrun) instead of training one on the data; for vision, the resumed run's
            image processor.
        labels: a resumed classifier's labels, in its output order.
        world: this process's place in a torchrun job (each rank takes its own share of
            every global batch).
    """
    build = BUILDERS[config.task]
    return build(config, tokenizer=tokenizer, labels=labels, world=world or Distributed())
