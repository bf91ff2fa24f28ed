"""A training run on disk: hooks that show progress, log metrics, save and resume.

    run/
      run.json          what was asked for (task, data, model and training options)
      checkpoint/       config.json, model.safetensors, tokenizer.json, training_state.pt
      metrics.jsonl     one JSON object per logged step and per evaluation
      loss.png          training and validation loss against steps

The checkpoint directory is replaced atomically, so a crash while saving leaves the
previous one loadable. Resuming restores the model, optimizer, step, RNG and data
position, so the resumed run continues with the same losses as an uninterrupted one.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch
from tqdm import tqdm

from glassformer.checkpoint import CHECKPOINT_SUBDIR, load_training_state, save_checkpoint
from glassformer.models.legacy import legacy_parameter_order
from glassformer.training.config import PROCESSES_KEY, RUN_FILE, RunConfig
from glassformer.training.distributed import (
    is_sharded,
    load_optimizer_state,
    optimizer_state,
    plain_model,
)
from glassformer.training.loop import TrainConfig, TrainState
from glassformer.training.tasks import Task

RUN_FILES = "checkpoint/, metrics.jsonl, loss.png, samples.txt, results.json"


def write_atomic(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` through a temporary file and a rename."""
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


class ProgressBar:
    """A tqdm bar over steps (or seconds, under a time budget) with loss, tokens/s and ETA."""

    def __init__(self, config: TrainConfig, state: TrainState, *, unit: str = "tok") -> None:
        self.by_steps = config.max_steps is not None
        total = (
            config.max_steps if config.max_steps is not None else round((config.minutes or 0) * 60)
        )
        done = state.step if self.by_steps else round(state.elapsed)
        self.unit = unit
        self.bar = tqdm(
            total=total,
            initial=min(done, total),
            desc="training",
            unit="step" if self.by_steps else "s",
            dynamic_ncols=True,
            # under a time budget the bar counts seconds: show the step, not a "s/s" rate
            bar_format=None
            if self.by_steps
            else "{l_bar}{bar}| {n_fmt}/{total_fmt} s [{elapsed}<{remaining}{postfix}]",
        )
        self.val: float | None = None

    def __call__(self, event: str, state: TrainState, metrics: dict[str, float]) -> None:
        if event == "step":
            target = state.step if self.by_steps else min(round(state.elapsed), self.bar.total)
            self.bar.update(max(target - self.bar.n, 0))
            post: dict[str, Any] = {} if self.by_steps else {"step": state.step}
            post |= {
                "loss": f"{metrics['loss']:.4f}",
                f"{self.unit}/s": f"{metrics['tokens_per_s']:,.0f}",
            }
            if self.val is not None:
                post["val"] = f"{self.val:.4f}"
            self.bar.set_postfix(post, refresh=False)
        elif event == "eval" and "val_loss" in metrics:
            self.val = metrics["val_loss"]
        elif event == "end":
            self.bar.close()


class MetricsLog:
    """Appends to metrics.jsonl: every ``every``-th step, every evaluation, every skipped
    (non-finite) step."""

    def __init__(self, path: Path, every: int = 10) -> None:
        if every <= 0:
            raise ValueError(f"log every must be a positive number of steps, got {every}")
        self.path, self.every = path, every

    def __call__(self, event: str, state: TrainState, metrics: dict[str, float]) -> None:
        if event == "step" and state.step % self.every == 0 or event in ("eval", "skip"):
            row = {
                "event": event,
                "step": state.step,
                "tokens": state.tokens,
                "elapsed_s": round(state.elapsed, 3),
                **metrics,
            }
            with open(self.path, "a") as f:
                f.write(json.dumps(row) + "\n")

    def truncate_after(self, step: int) -> None:
        """Drop the rows past ``step`` (and a last line cut short by a crash): a run resumed
        from the checkpoint of ``step`` logs those steps again."""
        if not self.path.is_file():
            return
        kept = []
        for line in self.path.read_text().splitlines():
            try:
                row = json.loads(line)
            except json.JSONDecodeError:
                continue  # a line the killed process was still writing
            if isinstance(row, dict) and row.get("step", 0) <= step:
                kept.append(json.dumps(row) + "\n")
        write_atomic(self.path, "".join(kept).encode())


def read_metrics(path: Path) -> list[dict[str, Any]]:
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def plot_loss(metrics_path: Path, png_path: Path, title: str = "") -> Path | None:
    """Draw training and validation loss from metrics.jsonl; None if nothing to draw."""
    rows = read_metrics(metrics_path)
    train = [(r["step"], r["loss"]) for r in rows if r["event"] == "step"]
    val = [(r["step"], r["val_loss"]) for r in rows if r["event"] == "eval" and "val_loss" in r]
    if not train and not val:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4), dpi=120)
    if train:
        ax.plot(*zip(*train, strict=True), label="training loss", linewidth=1, alpha=0.8)
    if val:
        ax.plot(*zip(*val, strict=True), "o-", label="validation loss", linewidth=2)
    ax.set_xlabel("optimizer step")
    ax.set_ylabel("cross-entropy (nats)")
    ax.set_title(title or "loss")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fd, tmp = tempfile.mkstemp(prefix=".loss.", suffix=".png", dir=png_path.parent)
    os.close(fd)
    fig.savefig(tmp)
    plt.close(fig)
    os.replace(tmp, png_path)
    return png_path


class Checkpointer:
    """Saves the model and everything a resume needs every ``every`` steps and at the end.

    For an FSDP-sharded model every rank must hold one (gathering the full weights and
    optimizer state takes them all); rank 0 writes.

    At the end of a run stopped by a non-finite loss, or after a save failed, it saves
    nothing more: the checkpoint on disk stays the last good one.
    """

    def __init__(
        self,
        run_dir: Path,
        model,
        optimizer,
        batches,
        *,
        every: int,
        extra_files: dict[str, bytes],
    ) -> None:
        self.dir = run_dir / CHECKPOINT_SUBDIR
        self.model, self.optimizer, self.batches = model, optimizer, batches
        self.every, self.extra_files = every, extra_files
        self.saved_step: int | None = None  # the step of the checkpoint on disk
        self.failed = False

    def __call__(self, event: str, state: TrainState, metrics: dict[str, float]) -> None:
        due = event == "step" and self.every and state.step % self.every == 0
        final = event == "end" and not metrics.get("nonfinite") and not self.failed
        if (due or final) and state.step != self.saved_step and state.step > 0:
            self.save(state)

    def last_good(self) -> str:
        """Where the last good checkpoint is, in words, for an error message."""
        if self.saved_step is None:
            return "no checkpoint was saved before it"
        return f"the last good checkpoint (step {self.saved_step}) is in {self.dir}"

    def save(self, state: TrainState) -> None:
        model = plain_model(self.model)  # None on ranks other than 0 under FSDP
        training_state = {
            "train_state": asdict(state),
            "optimizer": optimizer_state(self.model, self.optimizer),
            "optimizer_names": None  # a sharded model's state is keyed by name already
            if is_sharded(self.model)
            else optimizer_names(self.optimizer, self.model),
            "rng": torch.get_rng_state(),
            "data": self.batches.state_dict(),
        }
        if model is None:  # another rank of a sharded model: it helped gather
            self.saved_step = state.step
            return
        try:
            save_checkpoint(
                model, self.dir, training_state=training_state, extra_files=self.extra_files
            )
        except BaseException:
            self.failed = True
            raise
        self.saved_step = state.step


def restore(run_dir: Path, optimizer, batches, model=None) -> TrainState:
    """Load a run's training state into ``optimizer`` and ``batches``; return the TrainState.

    The model's weights are loaded separately (``load_checkpoint``), before this. Give the
    ``model`` the optimizer steps: each parameter's optimizer state is matched to it by
    name (the names saved with the state; a run saved before the blocks took their parts
    by the order its model had then), so a model whose parameters come in another order
    resumes exactly. A sharded model's state is matched by name in any case.
    """
    saved = load_training_state(run_dir)
    state = saved["optimizer"]
    by_index = not any(isinstance(k, str) for k in state.get("state", {}))
    if model is not None and by_index and not is_sharded(model):
        names = saved.get("optimizer_names") or legacy_optimizer_names(model, optimizer)
        state = reindexed(state, names, optimizer, model)
    if model is None or not is_sharded(model) and by_index:
        optimizer.load_state_dict(state)
    else:
        load_optimizer_state(model, optimizer, state)
    batches.load_state_dict(saved["data"])
    torch.set_rng_state(saved["rng"])
    return TrainState(**saved["train_state"])


def optimizer_names(optimizer, model) -> list[str] | None:
    """The name of each parameter the optimizer steps, in the order its state dict numbers
    them (None on a rank without the plain model)."""
    if model is None:
        return None
    names = {id(p): n for n, p in model.named_parameters()}
    return [names[id(p)] for group in optimizer.param_groups for p in group["params"]]


def reindexed(state: dict, names: list[str], optimizer, model) -> dict:
    """A saved optimizer state (numbered by ``names``' order) numbered as ``optimizer``
    numbers its parameters, with its groups' options as they are now."""
    current = optimizer.state_dict()
    index = {name: i for i, name in enumerate(optimizer_names(optimizer, model) or [])}
    if sorted(index) != sorted(names):
        raise ValueError(
            "the saved optimizer state is for other parameters: "
            f"{sorted(set(names) ^ set(index))[:4]}"
        )
    return {
        "state": {index[names[i]]: value for i, value in state["state"].items()},
        "param_groups": current["param_groups"],
    }


def legacy_optimizer_names(model, optimizer) -> list[str]:
    """Today's names of the parameters an optimizer built before the blocks took their
    parts numbered, in its order: the model's parameters in the order they had then, split
    into its groups as ``make_optimizer`` split them then (a fine-tuned backbone's
    embeddings, then its stack, then the rest; each matrices first under AdamW)."""
    trained = {n for group in optimizer.param_groups for n in _names(group, model)}
    order = [n for n in legacy_parameter_order(model) if n in trained]
    params = dict(model.named_parameters())
    split = len(optimizer.param_groups) > 2  # a backbone of its own: three old parts
    embeddings = ("embed.", "pos_embed.", "token_type.", "ln_embed.")
    stack = ("blocks.", "ln_final.")
    parts = [embeddings, stack, ("",)] if split else [("",)]
    decoupled = any(group.get("weight_decay", 0) for group in optimizer.param_groups)
    names: list[str] = []
    for prefixes in parts:
        taken = [n for n in order if n.startswith(prefixes)]
        order = [n for n in order if not n.startswith(prefixes)]
        if decoupled:
            names += [n for n in taken if params[n].dim() >= 2]
            names += [n for n in taken if params[n].dim() < 2]
        else:
            names += taken
    return names


def _names(group: dict, model) -> list[str]:
    names = {id(p): n for n, p in model.named_parameters()}
    return [names[id(p)] for p in group["params"]]


# ---- starting and finishing a run --------------------------------------------------------


def start_run_dir(config: RunConfig, out: Path, processes: int, *, fresh: bool) -> None:
    """Create the run directory and write run.json; a fresh run starts a new metrics.jsonl."""
    out.mkdir(parents=True, exist_ok=True)
    if fresh:
        (out / "metrics.jsonl").unlink(missing_ok=True)
    values = {**config.to_dict(), PROCESSES_KEY: processes}
    write_atomic(out / RUN_FILE, (json.dumps(values, indent=2) + "\n").encode())


def finish_run(
    config: RunConfig, task: Task, model: Any, state: TrainState, out: Path
) -> dict[str, Any]:
    """The loss plot, the held-out figures (results.json) and the samples, for any
    framework; returns the held-out figures."""
    plot_loss(out / "metrics.jsonl", out / "loss.png", title=f"glassformer train {config.task}")
    final = state.history[-1] if state.history else {}
    summary = ", ".join(f"{k} {v:.4f}" for k, v in final.items() if k != "step")
    print(f"\nstep {state.step}, {state.elapsed / 60:.1f} min of training: {summary}")
    model.eval()
    results: dict[str, Any] = {}
    if not config.no_test:
        print("held-out evaluation ...", file=sys.stderr)
        results = {"step": state.step, "minutes": state.elapsed / 60, **task.test(model)}
        write_atomic(out / "results.json", (json.dumps(results, indent=2) + "\n").encode())
        print(
            "held-out: "
            + ", ".join(
                f"{k} {v:.4f}" if isinstance(v, float) else f"{k} {v}" for k, v in results.items()
            )
        )
    samples = task.show(model)
    write_atomic(out / "samples.txt", (samples + "\n").encode())
    print(f"\n{samples}\n")
    files = RUN_FILES + (", model.keras" if config.framework == "keras" else "")
    print(f"run directory: {out} ({files})")
    return results
