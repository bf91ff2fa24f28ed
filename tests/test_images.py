"""Images: the folder reader (pixels, classes, one-line errors for bad folders and files),
the image processor, and the bundled digits corpus and its split."""

from __future__ import annotations

import os
import threading
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from glassformer.data.corpora import load_corpus
from glassformer.data.images import (
    ImageProcessor,
    load_image_processor,
    read_image_folder,
)
from glassformer.errors import ImageError


def write(path: Path, pixels: np.ndarray, mode: str = "L") -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(pixels.astype(np.uint8), mode=mode).save(path)
    return path


def folder(tmp_path: Path) -> Path:
    """cat/ holds two 4×6 grey images, dog/ one."""
    root = tmp_path / "photos"
    write(root / "cat" / "a.png", np.full((4, 6), 255))
    write(root / "cat" / "b.png", np.arange(24).reshape(4, 6) * 10)
    write(root / "dog" / "c.png", np.zeros((4, 6)))
    return root


def test_a_folder_gives_each_image_its_pixels_and_its_sub_folders_name(tmp_path):
    examples, processor = read_image_folder(folder(tmp_path))
    assert processor == ImageProcessor(image_size=(4, 6), channels=1)
    assert [label for _, label in examples] == ["cat", "cat", "dog"]
    assert examples[0][0].shape == (1, 4, 6)
    assert torch.equal(examples[0][0], torch.ones(1, 4, 6))
    expected = torch.arange(24, dtype=torch.float32).reshape(1, 4, 6) * 10 / 255
    torch.testing.assert_close(examples[1][0], expected)
    assert torch.equal(examples[2][0], torch.zeros(1, 4, 6))


def test_colour_images_are_rgb_channels_first(tmp_path):
    pixels = np.zeros((2, 3, 3))
    pixels[..., 0] = 255  # red
    write(tmp_path / "f" / "red" / "x.png", pixels, "RGB")
    write(tmp_path / "f" / "grey" / "y.png", np.full((2, 3), 51))
    examples, processor = read_image_folder(tmp_path / "f")
    assert processor.channels == 3
    grey, red = examples[0][0], examples[1][0]  # "grey" sorts before "red"
    assert red.shape == (3, 2, 3) and red[0].eq(1).all() and red[1:].eq(0).all()
    torch.testing.assert_close(grey, torch.full((3, 2, 3), 0.2))  # grey made RGB


def test_a_file_that_is_not_an_image_is_named(tmp_path):
    root = folder(tmp_path)
    (root / "dog" / "notes.txt").write_text("not a picture")
    with pytest.raises(ImageError, match=r"notes\.txt is not an image Pillow can read"):
        read_image_folder(root)


def test_an_image_of_another_size_is_named_with_both_sizes(tmp_path):
    root = folder(tmp_path)
    write(root / "dog" / "d.png", np.zeros((5, 6)))
    with pytest.raises(ImageError) as e:
        read_image_folder(root)
    message = str(e.value)
    assert "d.png is 5×6 pixels" in message and "a.png, is 4×6" in message
    assert "\n" not in message


def test_an_empty_class_folder_is_named(tmp_path):
    root = folder(tmp_path)
    (root / "eel").mkdir()
    with pytest.raises(ImageError, match=r"eel has no images"):
        read_image_folder(root)


def test_one_class_only_is_refused(tmp_path):
    write(tmp_path / "one" / "cat" / "a.png", np.zeros((4, 4)))
    with pytest.raises(ImageError, match=r"at least 2; it has only 'cat'"):
        read_image_folder(tmp_path / "one")


def test_a_missing_folder_is_refused(tmp_path):
    with pytest.raises(ImageError, match="nowhere is not a folder"):
        read_image_folder(tmp_path / "nowhere")


def test_the_processor_opens_files_refuses_other_sizes_and_resizes_when_asked(tmp_path):
    processor = ImageProcessor(image_size=(4, 6), channels=1)
    big = write(tmp_path / "big.png", np.full((8, 12), 255))
    with pytest.raises(ImageError, match=r"big\.png is 8×12 pixels; the model reads 4×6"):
        processor.open(big)
    assert torch.equal(processor.open(big, resize=True), torch.ones(1, 4, 6))
    processor.save(tmp_path)
    assert load_image_processor(tmp_path) == processor


@pytest.mark.parametrize(
    "text, message",
    [
        ('{"image_size": ' + "[" * 5000 + "]" * 5000 + "}", "JSON nested too deeply"),
        ("{oops", "invalid JSON"),
        ('{"channels": 1}', "image_size is None, expected \\[height, width\\]"),
        ('{"image_size": [4, 1e400], "channels": 1}', r"image_size is \[4, inf\]"),
        ('{"image_size": [4, 6], "channels": 2}', "channels is 2, expected 1 or 3"),
        ('{"image_size": [4, 6], "channels": true}', "channels is True, expected 1 or 3"),
        ("[4, 6]", "image_size is None"),
    ],
    ids=["nested", "not-json", "no-size", "infinite", "channels", "bool", "list"],
)
def test_a_bad_image_processor_file_is_one_line_naming_it(tmp_path, text, message):
    """Nested 5,000 deep, image_processor.json once ended the run in a RecursionError
    traceback; an infinite side in an OverflowError."""
    (tmp_path / "image_processor.json").write_text(text)
    with pytest.raises(ImageError, match=message) as e:
        load_image_processor(tmp_path)
    assert str(tmp_path / "image_processor.json") in str(e.value) and "\n" not in str(e.value)


def test_an_image_processor_fifo_is_refused_not_waited_on(tmp_path):
    """Opened without blocking (a hang fails here: the FIFO is unblocked after 5 s)."""
    fifo = tmp_path / "image_processor.json"
    os.mkfifo(fifo)
    caught: list[BaseException] = []

    def load() -> None:
        try:
            load_image_processor(tmp_path)
        except Exception as e:
            caught.append(e)

    worker = threading.Thread(target=load, daemon=True)
    worker.start()
    worker.join(timeout=5)
    if worker.is_alive():
        os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))  # the reader sees the end
        worker.join()
        pytest.fail("load_image_processor waited on a FIFO")
    assert isinstance(caught[0], ImageError) and "not a regular file" in str(caught[0])


def test_digits_split_is_stratified_fixed_and_holds_out_a_fifth_of_each_digit():
    splits = load_corpus("digits", "vision")
    train, validation, test = splits.train, splits.validation, splits.test
    assert (len(train), len(validation), len(test)) == (1295, 143, 359)  # all 1,797, once
    assert train[0][0].shape == (1, 8, 8)
    assert min(float(x.min()) for x, _ in train) == 0.0
    assert max(float(x.max()) for x, _ in train) == 1.0
    test_digits = Counter(label for _, label in test)
    for digit, n in Counter(label for _, label in train + validation + test).items():
        assert test_digits[digit] == round(n / 5)
    again = load_corpus("digits", "vision").test
    assert all(torch.equal(a, b) and y == z for (a, y), (b, z) in zip(test, again, strict=True))
