"""`glassformer train` under torchrun: 2 CPU processes (gloo) make the same steps as one.

Each check launches real processes with ``torchrun --standalone``: the training losses of
the 2-process run (DistributedDataParallel, or FSDP with ``--strategy fsdp``) equal those of
a single process with the same global batch, step by step, and resuming across a change in
the number of processes continues the same curve.
"""

import json
import os
import subprocess
import sys

import pytest
import torch

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
    """``torchrun --standalone --nproc_per_node 2 -m glassformer train ...``; fails loudly."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
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


@pytest.mark.parametrize(
    "first, then",
    [("ddp", "one"), ("one", "fsdp"), ("fsdp", "one")],
    ids=["ddp-then-one", "one-then-fsdp", "fsdp-then-one"],
)
def test_two_processes_equal_one_with_the_same_global_batch(files, tmp_path, first, then):
    """4 steps one way, 4 more after --resume the other way: the losses of one process
    with 8 windows a step, and the same final weights. Two processes take 4 windows each."""
    data = ["--data", str(files / "story.txt")]
    one = tmp_path / "one"
    assert (
        main(["train", *LM, *data, "--batch-size", "8", "--max-steps", "8", "--out", str(one)]) == 0
    )
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

    assert_same_curve(one, run, 8)
    reference = load_checkpoint(one).state_dict()
    for name, tensor in load_checkpoint(run).state_dict().items():
        torch.testing.assert_close(tensor, reference[name], atol=1e-5, rtol=1e-4)


def test_two_processes_with_accumulation_equal_one_accumulating_their_batches(files, tmp_path):
    """Buckets: rank r takes every 2nd batch, so 2 ranks × accumulation 2 are the same four
    micro-batches as one process accumulating 4 (DDP syncs once, at the last). Characters,
    not WordPiece: a trained subword vocabulary can differ from one process to the next, so
    the single-process run could not be compared (under torchrun rank 0 shares its own)."""
    args = ["classify", "--data", str(files / "reviews.csv"), *COMMON, "--batch-size", "2"]
    args += ["--tokenizer", "char"]
    args += ["--max-steps", "6", "--eval-every", "3", "--checkpoint-every", "3"]
    one, two = tmp_path / "one", tmp_path / "two"
    assert main(["train", *args, "--accumulation", "4", "--out", str(one)]) == 0
    torchrun(*args, "--accumulation", "2", "--out", str(two))
    assert_same_curve(one, two, 6)


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
