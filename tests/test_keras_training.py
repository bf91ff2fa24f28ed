"""Training the Keras twin: plain ``model.fit`` learns a small sentiment task well above
chance, and glassformer's ``fit`` drives it like the PyTorch loop (steps, schedule, hooks),
its evaluations the model's own at each step."""

import itertools
import random

import keras
import numpy as np
import pytest
import torch

import glassformer.keras as gk
from glassformer import ClassifierConfig
from glassformer.data.batching import collate_labelled
from glassformer.training import Schedule, TrainConfig
from glassformer.training.evaluation import score
from glassformer.training.keras_fit import TorchView, compile_classifier, fit

# Keras's torch backend calls np.array(tensor, copy=False), which torch's __array__ predates
# (and one torch thread: on a busy 2-core machine two make these small steps many times slower)
pytestmark = [
    pytest.mark.filterwarnings("ignore:__array__ implementation:DeprecationWarning"),
    pytest.mark.usefixtures("one_thread"),
]


FILLER, GOOD, BAD = range(10, 90), range(90, 100), range(100, 110)


def reviews(n: int, seed: int) -> tuple[list[list[int]], list[int]]:
    """IMDb-like: 5-40 neutral words with 1-3 words of the label's sentiment among them."""
    rng = random.Random(seed)
    texts, labels = [], []
    for _ in range(n):
        label = rng.randrange(2)
        words = [rng.choice(FILLER) for _ in range(rng.randint(5, 40))]
        for _ in range(rng.randint(1, 3)):
            words.insert(rng.randrange(len(words)), rng.choice(GOOD if label else BAD))
        texts.append(words)
        labels.append(label)
    return texts, labels


def padded(texts, labels):
    ids, y = collate_labelled(texts, labels)
    return ids.numpy().astype("int32"), y.numpy().astype("int32")


def small_classifier() -> gk.TransformerClassifier:
    keras.utils.set_random_seed(0)
    config = ClassifierConfig.preset(
        "tiny", vocab_size=110, num_classes=2, max_len=48, num_layers=1, dropout=0.0
    )
    return gk.TransformerClassifier(config)


def test_plain_fit_beats_chance_and_the_torch_copy_agrees():
    x, y = padded(*reviews(384, seed=0))
    x_test, y_test = padded(*reviews(256, seed=1))
    model = small_classifier()
    compile_classifier(model, lr=3e-3, weight_decay=0.0)
    model.fit(x, y, batch_size=32, epochs=3, verbose=0)
    _, accuracy = model.evaluate(x_test, y_test, batch_size=128, verbose=0)
    assert accuracy > 0.85, accuracy  # chance is 0.5
    # glassformer's scoring code on the Keras model and on its PyTorch copy: the same figure
    batches = [(torch.as_tensor(x_test), torch.as_tensor(y_test, dtype=torch.long))]
    seen_by_torch = score(TorchView(model), batches)["accuracy"]
    converted = score(gk.to_torch(model), batches)["accuracy"]
    assert seen_by_torch == pytest.approx(accuracy) and converted == pytest.approx(accuracy)


def test_fit_follows_the_schedule_evaluates_and_stops_at_max_steps():
    """Each evaluation ``fit`` reports is that of the model as it stands at that step: its
    loss and accuracy equal those recomputed, in NumPy, from Keras's own predictions."""
    texts, labels = reviews(64, seed=2)
    batches = itertools.cycle(
        [collate_labelled(texts[i : i + 16], labels[i : i + 16]) for i in range(0, 64, 16)]
    )
    x_val, y_val = padded(texts, labels)
    model = small_classifier()
    compile_classifier(model)
    events, recomputed = [], []

    def record(event, s, metrics):
        events.append((event, s.step, metrics))
        if event == "eval":  # what the model predicts now, without glassformer's scoring
            logits = np.asarray(model.predict_on_batch(x_val), dtype=np.float64)
            shifted = logits - logits.max(-1, keepdims=True)
            log_probs = shifted - np.log(np.exp(shifted).sum(-1, keepdims=True))
            loss = -log_probs[np.arange(len(y_val)), y_val].mean()
            recomputed.append((s.step, loss, (logits.argmax(-1) == y_val).mean()))

    schedule = Schedule("cosine", lr=1e-3, warmup=2, total_steps=6, min_lr=1e-4)
    state = fit(
        model,
        batches,
        schedule,
        TrainConfig(max_steps=6, eval_every=4),
        evaluate=lambda m: score(m, [collate_labelled(texts, labels)], prefix="val_"),
        hooks=(record,),
    )
    assert state.step == 6 and state.tokens >= 6 * 16
    steps = [m for e, _, m in events if e == "step"]
    assert [m["lr"] for m in steps] == pytest.approx([schedule.lr_at(i) for i in range(6)])
    assert [(e, s) for e, s, _ in events if e != "step"] == [("eval", 4), ("eval", 6), ("end", 6)]
    reported = [(m["step"], m["val_loss"], m["val_accuracy"]) for m in state.history]
    assert reported == [pytest.approx(r, rel=1e-5) for r in recomputed]
    assert recomputed[0][1] != recomputed[1][1]  # two steps of training moved the loss
