"""The training tasks, one module each: ``lm`` (a GPT), ``translate`` (an encoder-decoder),
``classify`` (an encoder classifier), ``mlm`` (an encoder pretrained by filling in
masked words) and ``vision`` (a Vision Transformer classifying images). ``build_task``
makes the one a ``RunConfig`` asks for."""

from __future__ import annotations

from typing import Any

from glassformer.data.images import ImageProcessor
from glassformer.data.tokenizers import Tokenizer
from glassformer.training.config import RunConfig, filled
from glassformer.training.distributed import Distributed
from glassformer.training.tasks.classify import classify_task
from glassformer.training.tasks.common import (
    DEFAULT_CORPUS,
    DEFAULT_TOKENIZER,
    TASKS,
    DataOptions,
    MappedBatches,
    ResumableBatches,
    Task,
    load_splits,
    tokenizer_files,
)
from glassformer.training.tasks.lm import lm_task
from glassformer.training.tasks.mlm import mlm_task
from glassformer.training.tasks.translate import translate_task
from glassformer.training.tasks.vision import vision_task

__all__ = [
    "DEFAULT_CORPUS",
    "DEFAULT_TOKENIZER",
    "TASKS",
    "DataOptions",
    "MappedBatches",
    "ResumableBatches",
    "Task",
    "build_task",
    "classify_task",
    "data_options",
    "load_splits",
    "lm_task",
    "mlm_task",
    "tokenizer_files",
    "translate_task",
    "vision_task",
]


def data_options(config: RunConfig) -> DataOptions:
    """The data part of a run's config."""
    return DataOptions(
        task=config.task,
        corpus=config.corpus,
        data=config.data,
        tokenizer=config.tokenizer,
        vocab_size=filled(config.vocab_size),
        lowercase=bool(config.lowercase),
        src_column=config.src_column,
        tgt_column=config.tgt_column,
        text_column=config.text_column,
        label_column=config.label_column,
        max_examples=config.max_examples,
    )


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
    world = world or Distributed()
    overrides: dict[str, Any] = {
        name: getattr(config, name)
        for name in (
            "d_model",
            "num_heads",
            "d_ff",
            "dropout",
            "norm_first",
            "bias",
            "positional",
            "attention_window",
            "global_tokens",
        )
        if getattr(config, name) is not None
    }
    common: dict[str, Any] = dict(
        preset=config.preset,
        batch_size=config.batch_size,
        seed=config.seed,
        tokenizer=tokenizer,
        rank=world.rank,
        world_size=world.world_size,
    )
    data = data_options(config)
    if config.task == "lm":
        if config.num_layers:
            overrides["num_layers"] = config.num_layers
        return lm_task(data, block_size=config.block_size, model_overrides=overrides, **common)
    if config.task == "translate":
        if config.num_layers:
            overrides["num_encoder_layers"] = overrides["num_decoder_layers"] = config.num_layers
        return translate_task(
            data,
            max_len=filled(config.max_len),
            model_overrides=overrides,
            label_smoothing=config.label_smoothing,
            **common,
        )
    if config.num_layers:
        overrides["num_layers"] = config.num_layers
    if config.task == "vision":
        if tokenizer is not None and not isinstance(tokenizer, ImageProcessor):
            raise ValueError("a vision run reads images: its checkpoint has no tokenizer")
        return vision_task(
            data,
            model_overrides=overrides,
            patch_size=filled(config.patch_size),
            labels=labels,
            **{**common, "tokenizer": tokenizer},
        )
    if isinstance(tokenizer, ImageProcessor):
        raise ValueError(f"a {config.task} run reads text, not images")
    if config.task == "mlm":
        return mlm_task(
            data,
            max_len=filled(config.max_len),
            model_overrides=overrides,
            mask_prob=config.mask_prob,
            whole_word_mask=config.whole_word_mask,
            **common,
        )
    return classify_task(
        data,
        max_len=filled(config.max_len),
        model_overrides=overrides,
        labels=labels,
        init=config.init,
        linear_probe=config.linear_probe,
        **common,
    )
