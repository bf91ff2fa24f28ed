"""A NaN or infinite loss: training stops naming the step (or skips the batch), and a
checkpoint with non-finite weights is never written."""

import json
import math

import pytest
import torch
from torch import nn

from glassformer.checkpoint import load_training_state
from glassformer.cli import main
from glassformer.training import Schedule, TrainConfig, train
from glassformer.training.loop import MAX_CONSECUTIVE_SKIPS, NonFiniteLossError


def batches():
    g = torch.Generator().manual_seed(0)
    while True:
        yield torch.randn(4, 3, generator=g), torch.randn(4, 1, generator=g)


def poisoned(bad_calls, kind="loss"):
    """A loss function that goes wrong on the given (1-based) calls: a NaN loss, or a
    finite loss whose gradient is infinite."""
    calls = {"n": 0}

    def loss_fn(model, batch):
        calls["n"] += 1
        x, y = batch
        loss = ((model(x) - y) ** 2).sum()
        if calls["n"] in bad_calls:
            if kind == "loss":
                loss = loss * math.nan
            else:  # sqrt'(0) = inf: the loss stays finite, its gradient does not
                w = model.weight
                loss = loss + torch.sqrt(w - w.detach()).sum()
        return loss, len(x)

    return loss_fn


def run(loss_fn, on_nonfinite="stop", max_steps=6):
    torch.manual_seed(0)
    model = nn.Linear(3, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    events, snapshots = [], {}

    def hook(event, state, metrics):
        events.append((event, state.step, dict(metrics)))
        if event == "step":
            snapshots[state.step] = [p.detach().clone() for p in model.parameters()]

    config = TrainConfig(max_steps=max_steps, on_nonfinite=on_nonfinite)
    schedule = Schedule("constant", lr=0.1, warmup=0)
    try:
        state = train(model, optimizer, schedule, batches(), loss_fn, config, hooks=(hook,))
    except NonFiniteLossError as e:
        return model, events, snapshots, e
    return model, events, snapshots, state


@pytest.mark.parametrize("kind, what", [("loss", "loss is nan"), ("grad", "gradient norm is")])
def test_stop_names_the_step_and_keeps_the_last_good_weights(kind, what):
    model, events, snapshots, error = run(poisoned({4}, kind))
    assert isinstance(error, NonFiniteLossError)
    assert str(error).startswith(f"{what}") and "at step 4" in str(error) and error.step == 4
    # the weights are exactly those after step 3: the bad step changed nothing
    for p, good in zip(model.parameters(), snapshots[3], strict=True):
        assert torch.equal(p, good) and torch.isfinite(p).all()
    assert events[-1] == ("end", 3, {"nonfinite": 1.0})


@pytest.mark.parametrize("kind", ["loss", "grad"])
def test_skip_drops_the_batch_counts_it_and_goes_on(kind):
    model, events, _, state = run(poisoned({2, 5}, kind), on_nonfinite="skip")
    assert state.step == 6 and state.skipped == 2
    assert all(torch.isfinite(p).all() for p in model.parameters())
    skips = [(step, m["skipped"]) for event, step, m in events if event == "skip"]
    assert skips == [(1, 1), (3, 2)]  # after step 1 the 2nd batch, after step 3 the 5th
    steps = [m for event, _, m in events if event == "step"]
    assert "skipped" not in steps[0] and steps[-1]["skipped"] == 2
    assert all(math.isfinite(m["loss"]) for m in steps)


def test_skip_gives_up_after_too_many_in_a_row():
    bad = set(range(3, 3 + MAX_CONSECUTIVE_SKIPS))
    _, _, _, error = run(poisoned(bad), on_nonfinite="skip", max_steps=50)
    assert isinstance(error, NonFiniteLossError)
    assert f"at step 3 ({MAX_CONSECUTIVE_SKIPS} non-finite steps in a row)" in str(error)


def test_on_nonfinite_must_be_known():
    with pytest.raises(ValueError, match="on_nonfinite must be one of \\['stop', 'skip'\\]"):
        TrainConfig(max_steps=1, on_nonfinite="ignore")


# ---- the command line ---------------------------------------------------------------------


@pytest.fixture
def nan_at_call(monkeypatch):
    """Make `glassformer train`'s loss NaN on the given call of each run's loss function."""
    import glassformer.training.runner as cli_train

    real_build = cli_train.build_task

    def arm(n):
        def build(*args, **kwargs):
            task = real_build(*args, **kwargs)
            real_loss, calls = task.loss_fn, {"n": 0}

            def loss_fn(model, batch):
                calls["n"] += 1
                loss, count = real_loss(model, batch)
                return (loss * math.nan if calls["n"] == n else loss), count

            task.loss_fn = loss_fn
            return task

        monkeypatch.setattr(cli_train, "build_task", build)

    return arm


def test_train_stops_with_one_line_naming_the_step_and_the_last_checkpoint(
    tmp_path, capsys, nan_at_call
):
    data = tmp_path / "story.txt"
    data.write_text("the cat sat on the mat. the dog sat on the log. " * 100)
    run_dir = tmp_path / "run"
    argv = ["train", "lm", "--data", str(data), "--out", str(run_dir), "--preset", "tiny"]
    argv += ["--block-size", "16", "--max-steps", "10", "--checkpoint-every", "4"]
    argv += ["--eval-every", "0", "--log-every", "1", "--threads", "1", "--no-test"]
    nan_at_call(7)
    assert main(argv) == 2
    err = capsys.readouterr().err
    last = err.strip().splitlines()[-1]
    assert last == (
        f"glassformer train: error: loss is nan at step 7; the last good checkpoint (step 4) "
        f"is in {run_dir / 'checkpoint'} (training stopped; --resume {run_dir} --on-nonfinite "
        "skip continues from it, skipping such batches)"
    )
    assert "Traceback" not in err
    # the checkpoint is the step-4 one, not one written at the failure
    assert load_training_state(run_dir)["train_state"]["step"] == 4
    from glassformer import load_checkpoint

    assert all(torch.isfinite(p).all() for p in load_checkpoint(run_dir).parameters())

    # resumed with skip: the bad batch comes again (the 3rd after step 4), is dropped, counted
    nan_at_call(3)
    assert main(["train", "lm", "--resume", str(run_dir), "--on-nonfinite", "skip"]) == 0
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows if r["event"] == "step"] == list(range(1, 11))
    assert [(r["step"], r["skipped"]) for r in rows if r["event"] == "skip"] == [(6, 1)]
    assert [r for r in rows if r["event"] == "step"][-1]["skipped"] == 1
    assert load_training_state(run_dir)["train_state"]["skipped"] == 1
