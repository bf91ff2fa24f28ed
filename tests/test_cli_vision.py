"""`glassformer train vision`, `classify` on image files and `attention` over an image, end to
end on a tiny folder of pictures; the attention overlay's values are the model's weights.
The slow test trains on the digits for 3 minutes and checks the README's figure."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from glassformer import VisionTransformer, load_run
from glassformer.cli import main
from glassformer.data.images import ImageProcessor
from glassformer.viz.image_attention import (
    attention_rollout,
    image_attention,
    plot_image_attention,
    upsample,
)

FAST = ["--preset", "tiny", "--eval-every", "4", "--checkpoint-every", "4", "--threads", "1"]
FAST += ["--batch-size", "8"]


def picture(path: Path, bright_rows: slice, seed: int, size=(8, 8)) -> Path:
    """A grey picture, dark with noise, with the rows ``bright_rows`` lit."""
    rng = np.random.default_rng(seed)
    pixels = rng.integers(0, 60, size)
    pixels[bright_rows] = 230
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(pixels.astype(np.uint8), mode="L").save(path)
    return path


@pytest.fixture(scope="module")
def shapes(tmp_path_factory):
    """A folder with two classes: the top half lit, or the bottom half."""
    root = tmp_path_factory.mktemp("shapes")
    for i in range(12):
        picture(root / "top" / f"{i}.png", slice(0, 4), i)
        picture(root / "bottom" / f"{i}.png", slice(4, 8), 100 + i)
    return root


@pytest.fixture(scope="module")
def run(shapes, tmp_path_factory):
    out = tmp_path_factory.mktemp("runs") / "vision"
    assert main(["train", "vision", "--data", str(shapes), "--out", str(out), *FAST,
                 "--max-steps", "8"]) == 0  # fmt: skip
    return out


def metrics(run_dir: Path) -> list[dict]:
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in r.items() if k not in ("elapsed_s", "tokens_per_s")} for r in rows]


def test_a_vision_run_has_every_file_and_loads(run):
    for name in ("run.json", "metrics.jsonl", "loss.png", "results.json", "samples.txt"):
        assert (run / name).is_file(), name
    model, processor = load_run(run)
    assert isinstance(model, VisionTransformer)
    assert processor == ImageProcessor(image_size=(8, 8), channels=1)
    assert json.loads((run / "checkpoint" / "labels.json").read_text()) == ["bottom", "top"]
    results = json.loads((run / "results.json").read_text())
    assert results["val_examples"] == 2 and 0.0 <= results["val_accuracy"] <= 1.0  # no test split


def test_a_resumed_vision_run_logs_the_uninterrupted_losses(shapes, run, tmp_path, monkeypatch):
    import glassformer.training.runner as runner

    def ctrl_c(event, state, _):
        if event == "step" and state.step == 6:  # after the checkpoint of step 4
            raise KeyboardInterrupt

    fit = runner.fit
    monkeypatch.setattr(runner, "fit", lambda *a, **kw: fit(*a, **kw, hooks=(ctrl_c,)))
    cut = tmp_path / "cut"
    args = ["train", "vision", "--data", str(shapes), "--out", str(cut), *FAST, "--max-steps", "8"]
    assert main(args) == 130
    monkeypatch.setattr(runner, "fit", fit)
    assert main(["train", "vision", "--resume", str(cut)]) == 0
    assert metrics(cut) == metrics(run)


def test_classify_prints_each_images_class_and_probability(shapes, run, capsys):
    files = [str(shapes / "top" / "0.png"), str(shapes / "bottom" / "3.png")]
    assert main(["classify", "--model", str(run), *files]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    model, processor = load_run(run)
    model.eval()
    images = torch.stack([processor.open(f) for f in files])
    with torch.no_grad():
        probs = model(images).logits.softmax(-1)
    labels = ["bottom", "top"]
    for line, path, row in zip(lines, files, probs, strict=True):
        label, p, shown = line.split("\t")
        assert (label, shown) == (labels[int(row.argmax())], path)
        assert float(p) == pytest.approx(float(row.max()), abs=1e-3)


def test_an_image_of_another_size_is_one_line_unless_resized(shapes, run, tmp_path, capsys):
    big = picture(tmp_path / "big.png", slice(0, 8), 0, size=(16, 16))
    assert main(["classify", "--model", str(run), str(big)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.endswith("big.png is 16×16 pixels; the model reads 8×8 (--resize scales it)")
    assert "\n" not in err
    assert main(["classify", "--model", str(run), "--resize", str(big)]) == 0
    not_image = tmp_path / "notes.txt"
    not_image.write_text("hello")
    assert main(["attention", "--model", str(run), str(not_image), "--out", "x.png"]) == 2
    assert "notes.txt is not an image Pillow can read" in capsys.readouterr().err


def test_attention_draws_the_image_and_names_the_verdict(shapes, run, tmp_path, capsys):
    out = tmp_path / "att.png"
    image = str(shapes / "top" / "1.png")
    assert main(["attention", "--model", str(run), image, "--out", str(out)]) == 0
    assert out.stat().st_size > 5000 and out.read_bytes()[:4] == b"\x89PNG"
    printed = capsys.readouterr().out
    assert "where the class token looks, 2 layers × 2 heads, and the rollout" in printed
    page = tmp_path / "a.html"
    assert main(["attention", "--model", str(run), image, "--out", str(page)]) == 0
    html = page.read_text()  # the patches are the page's tokens, by row and column
    assert '"[class]","r1c1"' in html and "an attention viewer page" in capsys.readouterr().out


@pytest.mark.parametrize("pooling", ["cls", "mean"])
def test_the_overlays_values_are_the_models_weights(pooling):
    from glassformer import ViTConfig

    torch.manual_seed(0)
    config = ViTConfig(image_size=(8, 6), patch_size=2, num_classes=3, d_model=16, num_heads=2,
                       num_layers=2, d_ff=32, pooling=pooling)  # fmt: skip
    model = VisionTransformer(config).eval()
    image = torch.rand(1, 8, 6)
    with torch.no_grad():
        weights = model(image[None], need_weights=True).encoder_attentions  # (1, H, T, T) each
    att = image_attention(model, image, ["a", "b", "c"])
    fig = plot_image_attention(att)
    by_title = {ax.get_title(): ax for ax in fig.axes}
    for layer in range(2):
        for head in range(2):
            w = weights[layer][0, head]  # (T, T)
            reads = w[0, 1:] if pooling == "cls" else w.mean(dim=0)  # (N,)
            expected = upsample(reads.reshape(4, 3), 2)  # (8, 6): each patch on its pixels
            overlay = by_title[f"layer {layer + 1} · head {head + 1}"].images[1].get_array()
            np.testing.assert_allclose(np.asarray(overlay), expected.numpy(), atol=1e-6)
            picture_shown = by_title[f"layer {layer + 1} · head {head + 1}"].images[0]
            np.testing.assert_allclose(np.asarray(picture_shown.get_array()), image[0].numpy())
    with torch.no_grad():
        assert att.label == ["a", "b", "c"][int(model(image[None]).logits.argmax())]


def test_one_layers_rollout_is_half_its_mean_attention_off_the_diagonal():
    """(mean over heads + I) / 2, row-normalised: off the diagonal, half the mean weight."""
    torch.manual_seed(0)
    weights = torch.rand(1, 3, 5, 5).softmax(-1)  # (L=1, H, T, T)
    rollout = attention_rollout(weights)
    mean = weights[0].mean(0)
    off = ~torch.eye(5, dtype=torch.bool)
    torch.testing.assert_close(rollout[off], mean[off] / 2)
    torch.testing.assert_close(rollout.sum(-1), torch.ones(5))
    two = attention_rollout(torch.cat([weights, weights]))
    torch.testing.assert_close(two, rollout @ rollout)


def test_the_digits_corpus_trains_and_reports_its_held_out_fifth(tmp_path):
    out = tmp_path / "digits"
    assert main(["train", "vision", "--corpus", "digits", "--out", str(out), *FAST,
                 "--max-steps", "3"]) == 0  # fmt: skip
    results = json.loads((out / "results.json").read_text())
    assert results["test_examples"] == 359 and results["step"] == 3


def test_vision_options_are_checked(shapes, tmp_path, capsys):
    args = ["train", "vision", "--data", str(shapes), "--out", str(tmp_path / "x")]
    assert main([*args, "--tokenizer", "bpe"]) == 2
    assert "--tokenizer is for text; vision reads images" in capsys.readouterr().err
    assert main([*args, "--patch-size", "3"]) == 2
    assert "patch_size 3 must divide the image size 8×8" in capsys.readouterr().err
    assert main(["train", "lm", "--patch-size", "2", "--out", str(tmp_path / "y")]) == 2
    assert "--patch-size is for vision (images), not 'lm'" in capsys.readouterr().err


@pytest.mark.slow
def test_three_minutes_on_the_digits_reach_097_held_out_accuracy(tmp_path):
    """The README's figure: `glassformer train vision --corpus digits --minutes 3 --seed 1337`."""
    out = tmp_path / "vit"
    assert main(["train", "vision", "--corpus", "digits", "--minutes", "3", "--seed", "1337",
                 "--out", str(out)]) == 0  # fmt: skip
    results = json.loads((out / "results.json").read_text())
    assert results["test_accuracy"] >= 0.97, results
