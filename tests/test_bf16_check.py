"""bf16 autocast is chosen for training only where a short run keeps fp32's losses
(glassformer.training.bf16_check), and ``--bf16 auto`` is the default."""

import json
import math

import pytest
import torch
from torch import nn

from glassformer.cli import main
from glassformer.training import bf16_check, loop
from glassformer.training.bf16_check import MAX_GAP, STEPS, TrainingFidelity, short_runs, taken
from glassformer.training.loop import TrainConfig
from glassformer.training.schedules import Schedule


class Line(nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = nn.Linear(8, 1)


def squared_error(model, batch):
    x, y = batch
    return ((model.linear(x).float().squeeze(-1) - y) ** 2).sum(), len(y)


def regression(offset: float) -> list:
    """y = w · s from inputs s + offset: near 1,024 bf16 holds a value only to steps of 8, so
    the signal s (about ±1) is lost under autocast; at 0 nothing is lost."""
    g = torch.Generator().manual_seed(0)
    w = torch.randn(8, generator=g)
    signals = [torch.randn(64, 8, generator=g) for _ in range(STEPS)]
    return [(offset + s, s @ w) for s in signals]


def check(batches, tmp_path, settings="", model=None):
    if model is None:
        torch.manual_seed(0)
        model = Line()
    adam = lambda twin: torch.optim.Adam(twin.parameters(), lr=0.01)  # noqa: E731
    schedule = Schedule("constant", lr=0.01, warmup=0)
    config = TrainConfig(max_steps=1)
    return model, short_runs(
        model, adam, schedule, batches, squared_error, config, settings, cache_dir=tmp_path
    )


def test_bf16_is_refused_where_its_losses_leave_fp32s_and_taken_where_they_stay(tmp_path):
    _, lost = check(regression(1024.0), tmp_path / "a")
    assert len(lost.fp32) == len(lost.bf16) == STEPS
    assert lost.gap > 2 * MAX_GAP and not lost.within_bound, lost.describe()
    assert "outside the bound (2%)" in lost.describe()
    _, kept = check(regression(0.0), tmp_path / "b")
    assert kept.gap < MAX_GAP / 4 and kept.within_bound, kept.describe()
    assert kept.fp32 != kept.bf16  # two runs, in two precisions


def test_a_non_finite_loss_fails_the_check(tmp_path):
    assert not TrainingFidelity(fp32=(1.0, 0.9), bf16=(1.0, math.nan)).within_bound
    assert not TrainingFidelity(fp32=(1.0, math.inf), bf16=(1.0, 0.9)).within_bound
    stopped = TrainingFidelity(fp32=(1.0, 0.9, 0.8), bf16=(1.0, math.nan))  # a copy stopped
    assert stopped.gap == math.inf and "outside the bound" in stopped.describe()
    assert TrainingFidelity(fp32=(1.0, 0.9), bf16=(1.01, 0.9)).within_bound
    batches = regression(0.0)
    batches[2] = (batches[2][0] * math.inf, batches[2][1])  # both copies stop at step 3
    _, result = check(batches, tmp_path)
    assert len(result.fp32) == len(result.bf16) == 3 and math.isnan(result.bf16[-1])
    assert not result.within_bound
    assert not (tmp_path / "training_fidelity.json").exists()  # not cached


def test_the_check_leaves_the_model_and_the_random_stream_as_they_were(tmp_path):
    model = Line()
    weights = {k: v.clone() for k, v in model.state_dict().items()}
    torch.manual_seed(3)
    expected = torch.rand(4)
    torch.manual_seed(3)
    _, result = check(regression(0.0), tmp_path, model=model)
    assert not result.cached
    assert torch.equal(torch.rand(4), expected)  # the draws after the check: as without it
    assert all(torch.equal(v, weights[k]) for k, v in model.state_dict().items())


def test_a_result_is_cached_by_weights_batches_and_settings(tmp_path, monkeypatch):
    _, first = check(regression(0.0), tmp_path)
    assert not first.cached
    monkeypatch.setattr(bf16_check._Twins, "losses", lambda *a, **k: pytest.fail("ran again"))
    _, again = check(regression(0.0), tmp_path)
    assert again.cached and again.fp32 == first.fp32 and again.bf16 == first.bf16
    entry = next(iter(json.loads((tmp_path / "training_fidelity.json").read_text()).values()))
    assert len(entry["fp32"]) == STEPS
    monkeypatch.undo()
    for other in (regression(0.5), regression(0.0)[::-1]):  # other batches: run again
        _, fresh = check(other, tmp_path)
        assert not fresh.cached
    _, fresh = check(regression(0.0), tmp_path, settings="adamw 3e-4")  # other settings
    assert not fresh.cached
    torch.manual_seed(1)
    _, fresh = check(regression(0.0), tmp_path, model=Line())  # other weights
    assert not fresh.cached


def test_taken_batches_are_seen_again_by_the_run(tmp_path):
    from glassformer.training.config import RunConfig
    from glassformer.training.tasks import build_task

    (tmp_path / "story.txt").write_text("the cat sat on the mat. " * 300)
    config = RunConfig(task="lm", data=str(tmp_path / "story.txt"), block_size=16, max_steps=1)
    stream = build_task(config).batches
    torch.manual_seed(1)
    seen = taken(stream, 3)
    after = torch.rand(1)
    torch.manual_seed(1)
    assert torch.equal(torch.rand(1), after)  # the shuffling's draws put back too
    for batch in seen:
        assert torch.equal(torch.as_tensor(next(stream)[0]), torch.as_tensor(batch[0]))


def train_with_the_default(tmp_path, capsys, monkeypatch) -> tuple[str, list[bool]]:
    """A short lm run with no --bf16 (auto): the line saying what it chose, and whether each
    forward pass ran under autocast, in order."""
    (tmp_path / "story.txt").write_text("the cat sat on the mat. the dog sat on the log. " * 200)
    monkeypatch.setenv("GLASSFORMER_CACHE", str(tmp_path / "cache"))
    used, real = [], loop._autocast
    spy = lambda model, bf16: used.append(bf16) or real(model, bf16)  # noqa: E731
    monkeypatch.setattr(loop, "_autocast", spy)
    argv = ["train", "lm", "--data", str(tmp_path / "story.txt"), "--out", str(tmp_path / "run")]
    assert main([*argv, "--max-steps", "2", "--block-size", "16", "--no-test"]) == 0
    said = [line for line in capsys.readouterr().err.splitlines() if "bf16 autocast" in line]
    assert len(said) == 1, said
    assert json.loads((tmp_path / "run" / "run.json").read_text())["bf16"] == "auto"
    return said[0], used


@pytest.mark.measured_choice
def test_training_takes_bf16_by_default_only_where_it_is_faster_and_keeps_the_losses(
    faster, tmp_path, capsys, monkeypatch
):
    """The default (--bf16 auto): where bf16 is faster, the short runs decide and the run
    trains under autocast; where it is slower, nothing more is measured and it trains in fp32."""
    said, used = train_with_the_default(tmp_path, capsys, monkeypatch)
    if faster == "bf16":
        assert said.startswith("bf16 autocast on (--bf16 auto): bf16 taken as faster")
        assert f"bf16 against fp32: {STEPS} steps' losses at most" in said
        assert "within the bound (2%)" in said
        assert used[: 2 * STEPS] == [False] * STEPS + [True] * STEPS  # the check's two runs
        assert used[2 * STEPS :] and all(used[2 * STEPS :])  # then the run, under autocast
    else:
        assert said.startswith("bf16 autocast off (--bf16 auto): fp32 taken as faster")
        assert "bf16 against fp32" not in said
        assert used and not any(used)


@pytest.mark.measured_choice
def test_a_faster_bf16_whose_losses_leave_fp32s_is_refused_by_the_run(
    faster, tmp_path, capsys, monkeypatch
):
    from glassformer.training import torch_fit

    departed = TrainingFidelity(fp32=(2.0,) * STEPS, bf16=(2.2,) * STEPS)
    monkeypatch.setattr(torch_fit, "short_runs", lambda *a, **k: departed)
    said, used = train_with_the_default(tmp_path, capsys, monkeypatch)
    assert said.startswith("bf16 autocast off (--bf16 auto)"), said
    if faster == "bf16":
        assert "at most 10.00% from fp32's: outside the bound (2%)" in said
    assert used and not any(used)


@pytest.mark.measures_this_machine
def test_the_speed_measurement_draws_nothing_from_the_runs_random_stream(tmp_path, monkeypatch):
    """A seed gives the same run whether the verdict was cached or measured just now."""
    from types import SimpleNamespace

    from glassformer.kernels import precision
    from glassformer.training.config import RunConfig
    from glassformer.training.torch_fit import bf16_for

    monkeypatch.setenv("GLASSFORMER_CACHE", str(tmp_path))
    slower = precision.Measurement(fp32_gflops=200.0, bf16_gflops=100.0)
    monkeypatch.setattr(precision, "_measure", lambda *args: (torch.randn(100), slower)[1])
    model = nn.Linear(4, 4)
    model.config = SimpleNamespace(d_model=16, max_len=8, d_ff=32)  # type: ignore[assignment]
    torch.manual_seed(5)
    expected = torch.rand(3)
    torch.manual_seed(5)
    use, said = bf16_for(RunConfig(task="lm", bf16="auto"), model)  # type: ignore[arg-type]
    assert not use and said is not None and "measured here" in said
    assert torch.equal(torch.rand(3), expected)
