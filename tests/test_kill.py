"""kill -9, for real: mid-save (the checkpoint stays loadable and whole) and mid-training
(`--resume` continues with exactly the losses of an uninterrupted run); in the slow suite,
50 kills at random points of whole runs, each resumed to the uninterrupted losses."""

import json
import os
import random
import signal
import subprocess
import sys
import textwrap
import time
from collections import Counter

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


# ---- kill -9 at random points of a whole run, then --resume, many times -------------------

# A fork server: it imports glassformer, matplotlib and torch's optimizers once, with one
# thread, then for each line [kill_after, argv, log] on stdin forks a child that runs
# `glassformer ARGV` (its output into LOG), kills it with SIGKILL after KILL_AFTER seconds
# (null: waits for it) and prints [exit code, seconds]. A run then starts in a few
# milliseconds instead of the seconds an interpreter takes to import torch.
SERVER = textwrap.dedent(
    """
    import json, os, signal, sys, time, traceback
    import torch
    torch.set_num_threads(1)
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot
    from glassformer.cli import main
    torch.optim.AdamW([torch.zeros(1, requires_grad=True)])  # imports torch._dynamo here
    print("ready", flush=True)
    for line in sys.stdin:
        kill_after, argv, log = json.loads(line)
        started = time.monotonic()
        child = os.fork()
        if child == 0:
            fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
            os.dup2(fd, 1)
            os.dup2(fd, 2)
            try:
                code = main(argv)
            except BaseException:
                traceback.print_exc()
                code = 99
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(code)
        status = None
        while kill_after is not None and status is None:
            pid, found = os.waitpid(child, os.WNOHANG)
            if pid:
                status = found
            elif time.monotonic() - started >= kill_after:
                os.kill(child, signal.SIGKILL)
                break
            else:
                time.sleep(0.001)
        if status is None:
            status = os.waitpid(child, 0)[1]
        print(json.dumps([os.waitstatus_to_exitcode(status), time.monotonic() - started]))
        sys.stdout.flush()
    """
)


class ForkServer:
    """``run(argv, log, kill_after=None)``: (exit code, seconds) of `glassformer ARGV`."""

    def __init__(self) -> None:
        self.process = subprocess.Popen(
            [sys.executable, "-c", SERVER], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
        )
        assert self.process.stdout.readline().strip() == "ready"

    def run(self, argv, log, kill_after=None):
        self.process.stdin.write(json.dumps([kill_after, argv, str(log)]) + "\n")
        self.process.stdin.flush()
        code, seconds = json.loads(self.process.stdout.readline())
        return code, seconds

    def close(self) -> None:
        self.process.kill()
        self.process.wait()


def _trial_args(data, out):
    """A run of about a second: 20 steps of a one-layer GPT, a checkpoint every 2 (so that
    saving takes half of its training time), every step logged, an evaluation every 10."""
    return ["train", "lm", "--data", str(data), "--out", str(out), "--preset", "tiny"] + [
        *("--d-model", "32", "--num-layers", "1", "--block-size", "16", "--batch-size", "16"),
        *("--max-steps", "20", "--checkpoint-every", "2", "--eval-every", "10"),
        *("--log-every", "1", "--threads", "1", "--no-test", "--bf16", "off"),
    ]


def _where_the_kill_landed(run):
    """What the run directory says about the moment of the kill."""
    if not (run / "run.json").exists():
        return "starting"
    if any(p.name.startswith(".checkpoint.") for p in run.iterdir()):
        return "saving"  # a temporary, or the previous checkpoint moved aside
    if not (run / "checkpoint").exists():
        return "before the first checkpoint"
    return "finishing" if (run / "loss.png").exists() else "training"


def _weights(run):
    from safetensors.torch import load_file

    return load_file(str(run / "checkpoint" / "model.safetensors"))


def _kill_trials(tmp_path, kill_points):
    """Kill a run at each of ``kill_points`` (fractions of an uninterrupted run's time),
    resume it (or, killed before it wrote run.json, start it again) and compare it with
    the uninterrupted run: every logged figure and every final weight. Returns where the
    kills landed."""
    data = tmp_path / "story.txt"
    data.write_text("the cat sat on the mat. the dog sat on the log. " * 200)
    server = ForkServer()
    landed = []
    try:
        code, whole = server.run(
            _trial_args(data, tmp_path / "straight"), tmp_path / "straight.log"
        )
        assert code == 0, (tmp_path / "straight.log").read_text()[-2000:]
        expected, weights = _rows(tmp_path / "straight"), _weights(tmp_path / "straight")
        for i, point in enumerate(kill_points):
            run, log = tmp_path / f"trial{i}", tmp_path / f"trial{i}.log"
            code, _ = server.run(_trial_args(data, run), log, kill_after=point * whole)
            where = "finished" if code == 0 else _where_the_kill_landed(run)
            assert code in (0, -signal.SIGKILL), log.read_text()[-2000:]
            landed.append(where)
            again = _trial_args(data, run) if where == "starting" else ["train", "lm", "--resume"]
            code, _ = server.run(again if where == "starting" else [*again, str(run)], log)
            assert code == 0, f"trial {i} (killed {where}): {log.read_text()[-2000:]}"
            assert _rows(run) == expected, f"trial {i} (killed {where})"
            assert all(torch.equal(weights[k], v) for k, v in _weights(run).items()), i
            left = {p.name for p in run.iterdir()} - {"run.json", "metrics.jsonl", "loss.png"}
            assert left == {"checkpoint", "samples.txt"}, f"trial {i} (killed {where}): {left}"
    finally:
        server.close()
    return landed


@pytest.mark.slow
def test_fifty_kills_at_random_points_each_resume_to_the_uninterrupted_losses(tmp_path):
    """Issue 49: 50 SIGKILLs anywhere from the start to the end of a run (startup, steps,
    saves, the loss plot and samples); every run resumes to the uninterrupted losses."""
    rng = random.Random(49)
    landed = _kill_trials(tmp_path, [rng.uniform(0.0, 1.0) for _ in range(50)])
    print("where the kills landed:", dict(Counter(landed)))  # shown with -s
    assert {"saving", "training"} <= set(landed), landed
