"""Images for the Vision Transformer: a folder of the user's pictures, and what turns a
picture into the model's input.

    photos/                 one sub-folder per class, named after it
      cat/  a.png  b.jpg
      dog/  c.png ...

``read_image_folder`` reads every file with Pillow. The first image fixes the size (every
other must have it); the channels are 1 if every image is grey, else 3 (RGB, the grey ones
converted). A picture becomes (C, H, W) floats from 0 (black) to 1 (white).

An ``ImageProcessor`` (image_processor.json in a checkpoint, where a text model keeps its
tokenizer) says what size and channels the model reads, and turns files into tensors.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import torch
from torch import Tensor

from glassformer.errors import ImageError, MissingDependencyError, shown
from glassformer.jsonfile import read_json

IMAGE_PROCESSOR_FILE = "image_processor.json"
MAX_PROCESSOR_BYTES = 1 << 20  # the file glassformer writes is ~50 bytes
MAX_SIDE = 1 << 16  # pixels on a side (a ViT reads 224..1024)
GREY_MODES = ("1", "L", "LA", "I", "I;16", "F", "P;L")


def _pil() -> Any:
    try:
        from PIL import Image
    except ImportError:
        raise MissingDependencyError(
            "reading images needs Pillow: pip install 'glassformer[vision]'"
        ) from None
    return Image


@dataclass(frozen=True)
class ImageProcessor:
    """The images a model reads: ``image_size`` (H, W) pixels, ``channels`` 1 or 3."""

    image_size: tuple[int, int]
    channels: int
    kind: ClassVar[str] = "image"

    def describe(self) -> str:
        h, w = self.image_size
        return f"{h}×{w} {'grey' if self.channels == 1 else 'RGB'} images"

    def open(self, path: str | Path, *, resize: bool = False) -> Tensor:
        """The image file ``path`` as (C, H, W) floats 0..1. One of another size is an
        error unless ``resize`` (then it is scaled, aspect ratio not kept)."""
        image = open_image(path)
        if image.size != (self.image_size[1], self.image_size[0]):
            if not resize:
                h, w = self.image_size
                raise ImageError(
                    f"{path} is {image.height}×{image.width} pixels; the model reads {h}×{w} "
                    "(--resize scales it)"
                )
            image = image.resize((self.image_size[1], self.image_size[0]))
        return to_tensor(image, self.channels)

    def to_json(self) -> str:
        values = {"image_size": list(self.image_size), "channels": self.channels}
        return json.dumps(values, indent=1) + "\n"

    def save(self, directory: str | Path) -> Path:
        path = Path(directory) / IMAGE_PROCESSOR_FILE
        path.write_text(self.to_json(), encoding="utf-8")
        return path


def load_image_processor(directory: str | Path) -> ImageProcessor:
    """The ``ImageProcessor`` a checkpoint directory keeps (image_processor.json); anything
    else (not a file, too large, not JSON, nested too deeply, a field missing or not what
    glassformer writes) is one ``ImageError`` naming the file."""
    file = Path(directory) / IMAGE_PROCESSOR_FILE
    try:
        values = read_json(file, "an image processor file", MAX_PROCESSOR_BYTES)
    except ValueError as e:  # its message names the file
        raise ImageError(str(e)) from None
    size = values.get("image_size") if isinstance(values, dict) else None
    channels = values.get("channels") if isinstance(values, dict) else None
    if not (isinstance(size, list) and len(size) == 2 and all(_positive(s) for s in size)):
        raise ImageError(f"{file}: image_size is {shown(size)}, expected [height, width]")
    if channels not in (1, 3) or isinstance(channels, bool):
        raise ImageError(f"{file}: channels is {shown(channels)}, expected 1 or 3")
    return ImageProcessor(image_size=(size[0], size[1]), channels=channels)


def _positive(value: Any) -> bool:
    """An integer from 1 to ``MAX_SIDE`` pixels (a bool is not one)."""
    return type(value) is int and 0 < value <= MAX_SIDE


def open_image(path: str | Path) -> Any:
    """A Pillow image, fully read; a file Pillow cannot read is an ``ImageError``."""
    Image = _pil()
    try:
        with Image.open(path) as image:
            image.load()
            return image
    except FileNotFoundError:
        raise ImageError(f"{path}: no such file") from None
    except (OSError, Image.DecompressionBombError, ValueError) as e:
        raise ImageError(f"{path} is not an image Pillow can read ({e})") from None


def to_tensor(image: Any, channels: int) -> Tensor:
    """A Pillow image as (C, H, W) floats 0..1, converted to grey (C=1) or RGB (C=3)."""
    pixels = np.asarray(image.convert("L" if channels == 1 else "RGB"), dtype=np.float32)
    pixels = pixels[None] if channels == 1 else pixels.transpose(2, 0, 1)  # (C, H, W)
    return torch.from_numpy(pixels / 255.0)


def read_image_folder(
    folder: str | Path, processor: ImageProcessor | None = None
) -> tuple[list[tuple[Tensor, str]], ImageProcessor]:
    """Every image in ``folder``'s class sub-folders, as ((C, H, W), class name) pairs, and
    the ``ImageProcessor`` they fit: ``processor``'s, or else the first image's size and
    1 channel if all are grey, 3 if any is colour. Files are read in name order; hidden
    files (.name) are skipped.

    Raises:
        ImageError: no such folder, no class folders or only one, a class folder with no
            image, a file that is not an image, an image of another size than the rest.
    """
    root = Path(folder)
    if not root.is_dir():
        raise ImageError(f"{folder} is not a folder (expected one sub-folder of images per class)")
    classes = sorted(p for p in root.iterdir() if p.is_dir() and not p.name.startswith("."))
    if len(classes) < 2:
        found = f"only {classes[0].name!r}" if classes else "none"
        raise ImageError(
            f"{folder} needs one sub-folder of images per class, at least 2; it has {found}"
        )
    opened: list[tuple[Any, str]] = []
    first: Path | None = None
    size = processor.image_size if processor else None
    for class_dir in classes:
        files = sorted(p for p in class_dir.iterdir() if p.is_file() and not p.name.startswith("."))
        if not files:
            raise ImageError(f"{class_dir} has no images (every class folder needs some)")
        for file in files:
            image = open_image(file)
            if size is None:
                size, first = (image.height, image.width), file
            if (image.height, image.width) != size:
                which = f"the first, {first}, is" if first else "the model reads"
                raise ImageError(
                    f"{file} is {image.height}×{image.width} pixels; the images must all be "
                    f"the same size ({which} {size[0]}×{size[1]})"
                )
            opened.append((image, class_dir.name))
    if processor is None:  # grey if every image is, else RGB
        grey = all(image.mode in GREY_MODES for image, _ in opened)
        assert size is not None  # there was at least one image
        processor = ImageProcessor(image_size=size, channels=1 if grey else 3)
    channels = processor.channels
    return [(to_tensor(image, channels), label) for image, label in opened], processor
