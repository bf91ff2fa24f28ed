"""`glassformer train` under torchrun: 2 CPU processes (gloo) make the same steps as one.

Each check launches real processes with ``torchrun --standalone``: the training and
evaluation losses of the 2-process run (DistributedDataParallel, or FSDP with ``--strategy
fsdp``) equal those of a single process with the same global batch, step by step (rtol
1e-5), and so do the final weights (atol and rtol 1e-5). Resuming across a change in the
number of processes (DDP → 1, 1 → DDP, 1 → FSDP, FSDP → 1) continues the same curve to the
same weights, and 2 processes × accumulation 2 equal 1 process × accumulation 4."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import glassformer
from glassformer import load_checkpoint
from glassformer.cli import main
from glassformer.data.batching import BucketBatches
from glassformer.training.distributed import Distributed

COMMON = ["--preset", "tiny", "--dropout", "0", "--no-test", "--threads", "1", "--log-every", "1"]
LM = ["lm", "--block-size", "16", "--eval-every", "4", "--checkpoint-every", "4", *COMMON]


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("data")
    (d / "story.txt").write_text("the cat sat on the mat. the dog ran to the log. " * 300)
    good = ["a great fun film", "wonderful and moving", "great acting, loved it", "superb"]
    bad = ["a dull boring mess", "awful and slow", "boring, hated it", "dreadful"]
    lines = ["text,label"] + [f'"{t}",pos' for t in good * 8] + [f'"{t}",neg' for t in bad * 8]
    (d / "reviews.csv").write_text("\n".join(lines) + "\n")
    return d


def torchrun(*args: str) -> None:
    """``torchrun --standalone --nproc_per_node 2 -m glassformer train ...``; fails loudly.

    The processes import the glassformer this test imported (its source directory goes
    first on PYTHONPATH), not whichever one is installed."""
    src = str(Path(glassformer.__file__).parents[1])
    path = os.pathsep.join(filter(None, [src, os.environ.get("PYTHONPATH")]))
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": path}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2"]
    done = subprocess.run(
        [*cmd, "-m", "glassformer", "train", *args], capture_output=True, text=True, env=env
    )
    assert done.returncode == 0, done.stderr[-3000:]


def rows(run, event="step"):
    lines = (run / "metrics.jsonl").read_text().splitlines()
    return [r for r in map(json.loads, lines) if r["event"] == event]


def assert_same_curve(a, b, steps):
    for event, key in (("step", "loss"), ("eval", "val_loss")):
        ra, rb = rows(a, event), rows(b, event)
        assert [r["step"] for r in ra] == [r["step"] for r in rb] != []
        assert [r["tokens"] for r in ra] == [r["tokens"] for r in rb]
        torch.testing.assert_close(
            torch.tensor([r[key] for r in ra]),
            torch.tensor([r[key] for r in rb]),
            rtol=1e-5,
            atol=0,
        )
    assert rows(a)[-1]["step"] == steps


def assert_same_weights(a, b):
    """The final checkpoints of two runs hold the same weights to 1e-5 (measured: they
    differ by 2e-7 at most, 1e-6 for the classifier with accumulation)."""
    reference = load_checkpoint(a).state_dict()
    for name, tensor in load_checkpoint(b).state_dict().items():
        torch.testing.assert_close(
            tensor, reference[name], atol=1e-5, rtol=1e-5, msg=lambda m, n=name: f"{n}: {m}"
        )


@pytest.fixture(scope="module")
def uninterrupted(files, tmp_path_factory):
    """One process, 8 windows a step, 8 steps: the curve every other run must follow."""
    one = tmp_path_factory.mktemp("one")
    data = ["--data", str(files / "story.txt")]
    assert (
        main(["train", *LM, *data, "--batch-size", "8", "--max-steps", "8", "--out", str(one)]) == 0
    )
    return one


@pytest.mark.parametrize(
    "first, then",
    [("ddp", "one"), ("one", "ddp"), ("one", "fsdp"), ("fsdp", "one")],
    ids=["ddp-then-one", "one-then-ddp", "one-then-fsdp", "fsdp-then-one"],
)
def test_two_processes_equal_one_with_the_same_global_batch(
    files, uninterrupted, tmp_path, first, then
):
    """4 steps one way, 4 more after --resume the other way: the losses of one process
    with 8 windows a step, and the same final weights. Two processes take 4 windows each."""
    data = ["--data", str(files / "story.txt")]
    run = tmp_path / "run"
    if first == "one":
        assert (
            main(["train", *LM, *data, "--batch-size", "8", "--max-steps", "4", "--out", str(run)])
            == 0
        )
    else:
        torchrun(
            *LM,
            *data,
            "--batch-size",
            "4",
            "--max-steps",
            "4",
            "--strategy",
            first,
            "--out",
            str(run),
        )
        assert json.loads((run / "run.json").read_text())["processes"] == 2
    if then == "one":
        assert main(["train", "lm", "--resume", str(run), "--max-steps", "8"]) == 0
    else:
        torchrun("lm", "--resume", str(run), "--max-steps", "8", "--strategy", then)
        assert json.loads((run / "run.json").read_text())["processes"] == 2

    assert_same_curve(uninterrupted, run, 8)
    assert_same_weights(uninterrupted, run)


def test_two_processes_with_accumulation_equal_one_accumulating_their_batches(files, tmp_path):
    """Buckets: rank r takes every 2nd batch, so 2 ranks × accumulation 2 are the same four
    micro-batches as one process accumulating 4 (DDP syncs once, at the last): the same
    losses step by step and the same final weights. Characters, not WordPiece: a trained
    subword vocabulary can differ from one process to the next, so the single-process run
    could not be compared (under torchrun rank 0 shares its own)."""
    args = ["classify", "--data", str(files / "reviews.csv"), *COMMON, "--batch-size", "2"]
    args += ["--tokenizer", "char"]
    args += ["--max-steps", "6", "--eval-every", "3", "--checkpoint-every", "3"]
    one, two = tmp_path / "one", tmp_path / "two"
    assert main(["train", *args, "--accumulation", "4", "--out", str(one)]) == 0
    torchrun(*args, "--accumulation", "2", "--out", str(two))
    assert_same_curve(one, two, 6)
    assert_same_weights(one, two)


def test_bucket_position_carries_over_to_another_number_of_processes():
    examples = [[0] * (1 + i % 7) for i in range(40)]
    two = BucketBatches(examples, 2, seed=3, rank=1, world_size=2)  # 10 batches per rank
    for _ in zip(range(5), iter(two), strict=False):
        pass
    one = BucketBatches(examples, 4, seed=3)  # the same global batch on one process
    one.load_state_dict(two.state_dict())
    assert (one.epoch, one.position) == (0, 5)  # half-way through the epoch, as before
    four = BucketBatches(examples, 1, seed=3, rank=3, world_size=4)
    four.load_state_dict(two.state_dict())
    assert four.position == 5


def test_single_process_needs_no_process_group():
    world = Distributed()
    assert not world.enabled and world.is_main
    assert world.sum(1.5, 2) == [1.5, 2] and world.max(3.0) == 3.0
