"""`glassformer train classify --framework keras` end to end on a tiny file: the run holds
model.keras and a PyTorch checkpoint with the same numbers, which `glassformer classify` uses."""

import json

import keras
import numpy as np
import pytest

import glassformer.keras  # noqa: F401  (registers the layers for load_model)
from glassformer import TransformerClassifier, load_checkpoint
from glassformer.cli import main
from glassformer.data.batching import pad_batch
from glassformer.data.tokenizers import load_tokenizer

# Keras's torch backend calls np.array(tensor, copy=False), which torch's __array__ predates
pytestmark = pytest.mark.filterwarnings("ignore:__array__ implementation:DeprecationWarning")

FAST = ["--preset", "tiny", "--eval-every", "4", "--threads", "1", "--vocab-size", "60"]


@pytest.fixture(scope="module")
def reviews(tmp_path_factory):
    good = ["a great fun film", "wonderful and moving", "great acting, loved it"]
    bad = ["a dull boring mess", "awful and slow", "boring, hated it"]
    lines = ["text,label"] + [f'"{t}",pos' for t in good * 10] + [f'"{t}",neg' for t in bad * 10]
    path = tmp_path_factory.mktemp("data") / "reviews.csv"
    path.write_text("\n".join(lines) + "\n")
    return path


def test_keras_run_is_a_run_every_command_reads(reviews, tmp_path, capsys):
    run = tmp_path / "keras-run"
    argv = ["train", "classify", "--framework", "keras", "--data", str(reviews), "--out", str(run)]
    assert main([*argv, *FAST, "--max-steps", "8"]) == 0
    printed = capsys.readouterr().out
    assert "step 8," in printed and "held-out: " in printed and "model.keras" in printed
    assert json.loads((run / "run.json").read_text())["framework"] == "keras"
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows if r["event"] == "eval"] == [4, 8]
    assert "val_accuracy" in json.loads((run / "results.json").read_text())

    texts = ["a great fun film", "boring, hated it", "wonderful"]
    assert main(["classify", "--model", str(run), *texts]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line.split("\t")[2] for line in lines] == texts
    # the PyTorch checkpoint and model.keras give the same probabilities
    model = load_checkpoint(run)
    assert isinstance(model, TransformerClassifier)
    twin = keras.saving.load_model(run / "model.keras")
    tokenizer = load_tokenizer(run / "checkpoint")
    ids = pad_batch(tokenizer.encode_batch(texts), tokenizer.pad_id)
    want = model(ids).logits.softmax(-1).detach().numpy()
    got = keras.ops.convert_to_numpy(keras.ops.softmax(twin(ids.numpy(), training=False)))
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-5)
    printed_p = [float(line.split("\t")[1]) for line in lines]
    np.testing.assert_allclose(printed_p, want.max(-1), atol=1e-3)  # printed to 3 places


@pytest.mark.parametrize(
    "extra, message",
    [
        (["lm", "--framework", "keras"], "trains the classifier (classify) only, not 'lm'"),
        (["translate", "--framework", "keras"], "only, not 'translate'"),
        (["classify", "--framework", "keras", "--bf16"], "--bf16 cannot be used with --framework"),
        (["classify", "--framework", "keras", "--accumulation", "2"], "--accumulation cannot"),
    ],
)
def test_what_keras_does_not_train_is_refused_in_one_line(extra, message, tmp_path, capsys):
    assert main(["train", *extra, "--out", str(tmp_path / "run"), "--max-steps", "1"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message in err and "Traceback" not in err


def test_a_keras_run_does_not_resume(tmp_path, capsys):
    run = tmp_path / "run"
    run.mkdir()
    (run / "run.json").write_text(json.dumps({"task": "classify", "framework": "keras"}))
    assert main(["train", "classify", "--resume", str(run)]) == 2
    assert "was trained with Keras; only PyTorch runs resume" in capsys.readouterr().err
