"""Vision: a Vision Transformer reads an image, cut into patches, and names its class.

Training batches are shuffled images; evaluation is loss and accuracy on the validation
split; the held-out report is accuracy on the test split (validation for a folder of the
user's, which has none); the show is a few validation images with their verdicts. The run
keeps, where a text run keeps its tokenizer, the image processor (the size and channels the
model reads), and the labels.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, cast

import torch
from torch import Tensor, nn

from glassformer.data.images import IMAGE_PROCESSOR_FILE, ImageProcessor
from glassformer.data.tokenizers import Tokenizer
from glassformer.inference import classify_images
from glassformer.models import VisionTransformer, ViTConfig
from glassformer.models.base import PretrainedModel
from glassformer.training.config import RunConfig, filled
from glassformer.training.distributed import Distributed
from glassformer.training.evaluation import score
from glassformer.training.losses import loss_for
from glassformer.training.tasks.common import (
    MappedBatches,
    Task,
    labels_file,
    load_splits,
    model_overrides,
)

Example = tuple[Tensor, int]  # an image (C, H, W) and its class index
SHOWN = 6  # validation images the show classifies


def build(
    config: RunConfig,
    *,
    tokenizer: Tokenizer | ImageProcessor | None = None,
    labels: list[str] | None = None,
    world: Distributed,
) -> VisionTask:
    """A ViT of the config's preset for the data's images (their size and channels: the
    image processor, checked against a resumed run's ``tokenizer``) and its labels (a
    resumed run's ``labels``, or the training images' classes)."""
    from glassformer.data.batching import BucketBatches

    if tokenizer is not None and not isinstance(tokenizer, ImageProcessor):
        raise ValueError("a vision run reads images: its checkpoint has no tokenizer")
    train_rows, val_rows, test_rows, description = load_splits(config)
    train_rows = train_rows[: config.max_examples]
    labels = labels or sorted({label for _, label in train_rows})
    if len(labels) < 2:
        raise ValueError(f"classification needs at least 2 classes, found {labels}")
    first = train_rows[0][0]  # (C, H, W)
    processor = ImageProcessor(image_size=(first.shape[1], first.shape[2]), channels=first.shape[0])
    if tokenizer is not None and tokenizer != processor:
        raise ValueError(
            f"the run reads {tokenizer.describe()}, but the data holds {processor.describe()}"
        )
    shape = dict(image_size=processor.image_size, channels=processor.channels,
                 patch_size=filled(config.patch_size), num_classes=len(labels))  # fmt: skip
    model = VisionTransformer(ViTConfig.preset(config.preset, **shape, **model_overrides(config)))
    shuffled = BucketBatches(
        examples(train_rows, labels), filled(config.batch_size), key=lambda e: 1,
        seed=config.seed, rank=world.rank, world_size=world.world_size,
    )  # fmt: skip
    return VisionTask(
        config=config,
        tokenizer=processor,
        model=model,
        batches=MappedBatches(shuffled, collate),
        loss_fn=loss_for("vision"),
        extra_files={
            IMAGE_PROCESSOR_FILE: processor.to_json().encode(),
            "labels.json": labels_file(labels),
        },  # fmt: skip
        description=f"{description}; {processor.describe()}",
        labels=labels,
        val_rows=val_rows,
        val_batches=fixed_batches(examples(val_rows, labels)),
        test_rows=test_rows,
    )


def examples(rows: list[tuple[Tensor, str]], labels: list[str]) -> list[Example]:
    """(image, class index) of the rows whose class is one of ``labels``."""
    index = {label: i for i, label in enumerate(labels)}
    return [(x, index[y]) for x, y in rows if y in index]


def collate(batch: list[Example]) -> tuple[Tensor, Tensor]:
    images = torch.stack([x for x, _ in batch])  # (B, C, H, W)
    return images, torch.tensor([y for _, y in batch])


def fixed_batches(items: list[Example]) -> list[tuple[Tensor, Tensor]]:
    return [collate(items[i : i + 256]) for i in range(0, len(items), 256)]


@dataclass(kw_only=True)
class VisionTask(Task):
    """A ViT classifying images."""

    name = "vision"
    unit = "img"
    labels: list[str]
    val_rows: list[Any]
    val_batches: list
    test_rows: list[Any]

    def evaluate(self, model: nn.Module) -> dict[str, float]:
        return score(model, self.val_batches, prefix="val_")

    def test(self, model: nn.Module) -> dict[str, float]:
        """Accuracy on the test split (or validation, if the data has none)."""
        prefix = "test_" if self.test_rows else "val_"
        held_out = examples(self.test_rows or self.val_rows, self.labels)
        figures = score(model, fixed_batches(held_out), prefix=prefix)
        return {**figures, f"{prefix}examples": len(held_out)}

    def show(self, model: nn.Module) -> str:
        """A few validation images, their classes and the model's verdicts."""
        rows = self.val_rows[:SHOWN]
        verdicts = classify_images(
            cast(PretrainedModel, model), self.labels, torch.stack([x for x, _ in rows])
        )
        lines = []
        for i, ((_, gold), (pred, p)) in enumerate(zip(rows, verdicts, strict=True)):
            mark = "ok" if pred == gold else "WRONG"
            lines.append(f"[{mark:>5}] {pred} ({p:.2f}) vs {gold}: validation image {i}")
        return "\n".join(lines)
