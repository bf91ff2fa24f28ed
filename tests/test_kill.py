"""kill -9, for real: mid-save (the checkpoint stays loadable and whole) and mid-training
(`--resume` continues with exactly the losses of an uninterrupted run)."""

import json
import os
import random
import signal
import subprocess
import sys
import textwrap
import time

import pytest
import torch

from glassformer import load_checkpoint
from glassformer.checkpoint import load_training_state
from glassformer.cli import main

# A process that saves the same checkpoint directory over and over. For each line "go
# ROUND DELAY" on stdin it forks a child that saves versions ROUND*1000+1, +2, ... (every
# weight filled with the version number, the version also in training_state.pt) and logs
# each finished save to DONE; after DELAY seconds it kills the child with SIGKILL and
# prints "killed". One thread, so forking after torch has run is safe.
SAVER = textwrap.dedent(
    """
    import os, signal, sys, time
    import torch
    torch.set_num_threads(1)
    from glassformer import GPT, GPTConfig
    from glassformer.checkpoint import save_checkpoint
    ckpt, done = sys.argv[1], sys.argv[2]
    model = GPT(GPTConfig(vocab_size=8000, max_len=64, d_model=256, num_heads=4,
                          num_layers=2, d_ff=1024))
    print("ready", flush=True)
    for line in sys.stdin:
        _, round_, delay = line.split()
        child = os.fork()
        if child == 0:
            version = int(round_) * 1000
            while True:
                version += 1
                with torch.no_grad():
                    for p in model.parameters():
                        p.fill_(float(version))
                save_checkpoint(model, ckpt, training_state={"version": torch.tensor(version)})
                with open(done, "a") as f:
                    f.write(f"{version}\\n")
        time.sleep(float(delay))
        os.kill(child, signal.SIGKILL)
        os.waitpid(child, 0)
        print("killed", flush=True)
    """
)


def test_kill_9_mid_save_leaves_a_whole_checkpoint(tmp_path):
    ckpt, done = tmp_path / "ckpt", tmp_path / "done.txt"
    saver = subprocess.Popen(
        [sys.executable, "-c", SAVER, str(ckpt), str(done)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    rng = random.Random(0)
    seen, kills_mid_write = 0, 0
    try:
        assert saver.stdout.readline().strip() == "ready"
        for round_ in range(1, 9):
            saver.stdin.write(f"go {round_} {rng.uniform(0.15, 0.6):.3f}\n")
            saver.stdin.flush()
            assert saver.stdout.readline().strip() == "killed"
            finished = [int(v) for v in done.read_text().split()] if done.exists() else []
            this_round = [v for v in finished if v // 1000 == round_]
            leftovers = [p.name for p in tmp_path.iterdir() if p.name.startswith(".ckpt.")]
            kills_mid_write += bool(leftovers)
            if not this_round and not ckpt.exists() and seen == 0:
                continue  # killed before the very first save finished: nothing to load yet
            model = load_checkpoint(ckpt)
            values = {float(v) for p in model.parameters() for v in p.unique().tolist()}
            assert len(values) == 1, f"round {round_}: a mix of saves {sorted(values)[:5]}"
            version = int(values.pop())
            assert load_training_state(ckpt)["version"].item() == version
            # one of the complete saves: the last one logged, or the one that had just been
            # renamed into place when the kill came before it was logged
            last = max(this_round, default=seen)
            assert version in (last, last + 1) and version >= seen, (round_, version, last)
            seen = version
    finally:
        saver.kill()
        saver.wait()
    assert seen > 0, "no save ever completed: make the delays longer"
    assert kills_mid_write > 0, "no kill landed inside a save: the test exercised nothing"


# ---- kill -9 while training, then --resume ------------------------------------------------


def _train_args(data, out):
    """`glassformer train lm` on a tiny model, deterministic (one thread), a checkpoint
    every 5 of its 40 steps and every step logged."""
    return ["train", "lm", "--data", str(data), "--out", str(out), "--preset", "tiny"] + [
        *("--block-size", "16", "--batch-size", "16", "--max-steps", "40"),
        *("--checkpoint-every", "5", "--eval-every", "10", "--log-every", "1"),
        *("--threads", "1", "--no-test"),
    ]


def _rows(run):
    """metrics.jsonl without the wall-clock fields (they differ between runs)."""
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in r.items() if k not in ("elapsed_s", "tokens_per_s")} for r in rows]


def test_kill_9_during_training_then_resume_gives_the_uninterrupted_losses(tmp_path, capsys):
    data = tmp_path / "story.txt"
    data.write_text("the cat sat on the mat. the dog sat on the log. " * 200)
    glassformer = [sys.executable, "-m", "glassformer"]
    killed_run = tmp_path / "killed"
    victim = subprocess.Popen(
        glassformer + _train_args(data, killed_run),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    metrics = killed_run / "metrics.jsonl"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and victim.poll() is None:
        if metrics.exists() and '"step": 12,' in metrics.read_text():
            break
        time.sleep(0.005)
    victim.send_signal(signal.SIGKILL)
    assert victim.wait() == -signal.SIGKILL, "the run ended before it could be killed"
    saved = load_training_state(killed_run)["train_state"]["step"]
    assert 10 <= saved < 40 and saved % 5 == 0
    assert max(r["step"] for r in _rows(killed_run)) >= saved  # logged past it, then lost

    resumed = subprocess.run(
        glassformer + ["train", "lm", "--resume", str(killed_run)], capture_output=True, text=True
    )
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert "Traceback" not in resumed.stderr
    # the uninterrupted run, in this process (the same code; one thread as well)
    assert main(_train_args(data, tmp_path / "straight")) == 0
    capsys.readouterr()
    expected, got = _rows(tmp_path / "straight"), _rows(killed_run)
    assert [r["step"] for r in got if r["event"] == "step"] == list(range(1, 41))
    assert got == expected  # every loss, lr, grad norm and evaluation, exactly
    a, b = load_checkpoint(tmp_path / "straight"), load_checkpoint(killed_run)
    for (name, p), q in zip(a.state_dict().items(), b.state_dict().values(), strict=True):
        assert torch.equal(p, q), name


@pytest.fixture(autouse=True)
def _posix_only():
    if not hasattr(os, "fork"):
        pytest.skip("needs fork and SIGKILL")
