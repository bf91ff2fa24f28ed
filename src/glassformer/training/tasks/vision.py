"""Vision: a Vision Transformer reads an image, cut into patches, and names its class.

Training batches are shuffled images; evaluation is loss and accuracy on the validation
split; the held-out report is accuracy on the test split (validation for a folder of the
user's, which has none); the show is a few validation images with their verdicts. The run
keeps, where a text run keeps its tokenizer, the image processor (the size and channels the
model reads), and the labels.
"""

from __future__ import annotations

import json
from typing import Any

import torch
from torch import Tensor, nn

from glassformer.data.images import IMAGE_PROCESSOR_FILE, ImageProcessor
from glassformer.inference import classify_images
from glassformer.models import VisionTransformer, ViTConfig
from glassformer.training.evaluation import score
from glassformer.training.losses import loss_for
from glassformer.training.tasks.common import DataOptions, MappedBatches, Task, load_splits

Example = tuple[Tensor, int]  # an image (C, H, W) and its class index


def vision_task(
    opts: DataOptions,
    *,
    preset: str,
    batch_size: int,
    seed: int,
    model_overrides: dict[str, Any],
    patch_size: int,
    rank: int = 0,
    world_size: int = 1,
    tokenizer: ImageProcessor | None = None,
    labels: list[str] | None = None,
    show_count: int = 6,
) -> Task:
    from glassformer.data.batching import BucketBatches

    train_rows, val_rows, test_rows, description = load_splits(opts)
    if opts.max_examples:
        train_rows = train_rows[: opts.max_examples]
    labels = labels or sorted({label for _, label in train_rows})
    if len(labels) < 2:
        raise ValueError(f"classification needs at least 2 classes, found {labels}")
    label_id = {label: i for i, label in enumerate(labels)}
    first = train_rows[0][0]  # (C, H, W)
    found = ImageProcessor(image_size=(first.shape[1], first.shape[2]), channels=first.shape[0])
    if tokenizer is not None and tokenizer != found:
        raise ValueError(
            f"the run reads {tokenizer.describe()}, but the data holds {found.describe()}"
        )
    processor = found
    config = ViTConfig.preset(
        preset,
        **{
            "image_size": processor.image_size,
            "channels": processor.channels,
            "patch_size": patch_size,
            "num_classes": len(labels),
            **model_overrides,
        },
    )
    model = VisionTransformer(config)

    def encode(rows) -> list[Example]:
        return [(x, label_id[y]) for x, y in rows if y in label_id]

    def collate(examples: list[Example]) -> tuple[Tensor, Tensor]:
        images = torch.stack([x for x, _ in examples])  # (B, C, H, W)
        return images, torch.tensor([y for _, y in examples])

    def fixed_batches(examples: list[Example]) -> list[tuple[Tensor, Tensor]]:
        return [collate(examples[i : i + 256]) for i in range(0, len(examples), 256)]

    train_ex, val_batches = encode(train_rows), fixed_batches(encode(val_rows))
    shuffled = BucketBatches(
        train_ex, batch_size, key=lambda e: 1, seed=seed, rank=rank, world_size=world_size
    )
    batches = MappedBatches(shuffled, collate)

    def evaluate(m: nn.Module) -> dict[str, float]:
        return score(m, val_batches, prefix="val_")

    def test(m: nn.Module) -> dict[str, float]:
        """Accuracy on the test split (or validation, if the data has none)."""
        prefix = "test_" if test_rows else "val_"
        examples = encode(test_rows or val_rows)
        return {
            **score(m, fixed_batches(examples), prefix=prefix),
            f"{prefix}examples": len(examples),
        }

    def show(m: nn.Module) -> str:
        rows = val_rows[:show_count]
        verdicts = classify_images(m, labels, torch.stack([x for x, _ in rows]))
        lines = []
        for i, ((_, gold), (pred, p)) in enumerate(zip(rows, verdicts, strict=True)):
            mark = "ok" if pred == gold else "WRONG"
            lines.append(f"[{mark:>5}] {pred} ({p:.2f}) vs {gold}: validation image {i}")
        return "\n".join(lines)

    extra = {
        IMAGE_PROCESSOR_FILE: processor.to_json().encode(),
        "labels.json": (json.dumps(labels, indent=1) + "\n").encode(),
    }
    return Task(
        name="vision",
        tokenizer=processor,
        model=model,
        batches=batches,
        loss_fn=loss_for("vision"),
        evaluate=evaluate,
        show=show,
        unit="img",
        extra_files=extra,
        description=f"{description}; {processor.describe()}",
        test=test,
    )
