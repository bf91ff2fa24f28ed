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

import io
import json
import sys
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch
from tqdm import tqdm

from glassformer.atomic import make_folder, remove_partial_files, tidy_directory, write_atomic
from glassformer.checkpoint import CHECKPOINT_SUBDIR, load_training_state, save_checkpoint
from glassformer.errors import shown
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

OWN_FILES = ("metrics.jsonl", "loss.png", "samples.txt", "results.json")
RUN_FILES = ", ".join((f"{CHECKPOINT_SUBDIR}/", *OWN_FILES))


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
        self.evaluated_at: int | None = None  # a resumed run's step whose evaluation is logged

    def __call__(self, event: str, state: TrainState, metrics: dict[str, float]) -> None:
        if event == "eval" and state.step == self.evaluated_at:
            self.evaluated_at = None  # a finished run, resumed, evaluates its last step again
            return
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
        kept = [row for row in read_metrics(self.path) if row["step"] <= step]
        if any(row["event"] == "eval" and row["step"] == step for row in kept):
            self.evaluated_at = step
        write_atomic(self.path, "".join(json.dumps(row) + "\n" for row in kept).encode())


EVENTS = ("step", "eval", "skip")  # the rows MetricsLog writes


def read_metrics(path: Path) -> list[dict[str, Any]]:
    """The rows of metrics.jsonl, each checked to be one ``MetricsLog`` writes. A last line
    that is not JSON is what a kill mid-append leaves: it is dropped. Anything else no run
    writes (a row without ``event``, a bad line before the last) is refused in one line
    naming the file, the line and the field: nothing a run did not write is deleted."""
    if not path.is_file():
        return []
    lines = path.read_text(encoding="utf-8", errors="replace").splitlines()
    rows = []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except (ValueError, RecursionError):
            if number == len(lines):
                break  # the line the killed process was still writing
            message = f"{path} line {number} is not JSON; a run writes one object a line"
            raise ValueError(message) from None
        rows.append(_checked_row(row, path, number))
    return rows


def _checked_row(row: Any, path: Path, number: int) -> dict[str, Any]:
    where = f"{path} line {number}"
    if not isinstance(row, dict):
        raise ValueError(f"{where} is not a JSON object; a run writes one object a line")
    if row.get("event") not in EVENTS:
        raise ValueError(f"{where}: event {shown(row.get('event'))} is none of {list(EVENTS)}")
    step = row.get("step")
    if not isinstance(step, int) or isinstance(step, bool) or step < 0:
        raise ValueError(f"{where}: step {shown(step)} is not a step number (a whole number >= 0)")
    for name in ("loss", "val_loss"):
        value = row.get(name, 0.0)
        if not isinstance(value, (int, float)) or isinstance(value, bool):
            raise ValueError(f"{where}: {name} {shown(value)} is not a number")
    return row


def plot_loss(metrics_path: Path, png_path: Path, title: str = "") -> Path | None:
    """Draw training and validation loss from metrics.jsonl; None if nothing to draw."""
    rows = read_metrics(metrics_path)
    train = [(r["step"], r["loss"]) for r in rows if r["event"] == "step" and "loss" in r]
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
    image = io.BytesIO()
    fig.savefig(image, format="png")
    plt.close(fig)
    write_atomic(png_path, image.getbuffer())
    return png_path


class Checkpointer:
    """Saves the model and everything a resume needs every ``every`` steps and at the end.

    For an FSDP-sharded model every rank must hold one (gathering the full weights and
    optimizer state takes them all); rank 0 writes.

    At the end of a run stopped by a non-finite loss, or after a save failed, it saves
    nothing more: the checkpoint on disk stays the last good one.

    Given the ``loop_config`` of a loop that evaluates, a checkpoint due at a step the loop
    evaluates after is saved after that evaluation (the last step's at the end): a run
    killed between the two finds both or neither on resuming, never a checkpoint whose
    evaluation is lost; a run interrupted between the two saves nothing at its end. (Not for
    a sharded model: its other ranks see no evaluations.)
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
        loop_config: TrainConfig | None = None,
    ) -> None:
        self.dir = run_dir / CHECKPOINT_SUBDIR
        self.model, self.optimizer, self.batches = model, optimizer, batches
        self.every, self.extra_files = every, extra_files
        self.loop_config = None if is_sharded(model) else loop_config
        self.saved_step: int | None = None  # the step of the checkpoint on disk
        self.evaluated_step: int | None = None
        self.failed = False

    def __call__(self, event: str, state: TrainState, metrics: dict[str, float]) -> None:
        due = bool(self.every) and state.step % self.every == 0
        if event == "step":
            save = due and not self._evaluates_after(state)
        elif event == "eval":
            self.evaluated_step, save = state.step, due  # (without a loop_config: saved)
        else:  # not when interrupted before the evaluation that follows this step
            reached = not self._evaluates_after(state) or self.evaluated_step == state.step
            save = event == "end" and not metrics.get("nonfinite") and not self.failed and reached
        if save and state.step != self.saved_step and state.step > 0:
            self.save(state)

    def _evaluates_after(self, state: TrainState) -> bool:
        """Whether the loop evaluates the model after this step (``train``'s cadence)."""
        c = self.loop_config
        return c is not None and (c.evaluates_at(state.step) or state.done(c))

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
    """Create the run directory (and at most its parent: ``make_folder``) and write run.json;
    a fresh run starts a new metrics.jsonl. What a kill left of the run's own writes (one
    writer: this run) is tidied: temporaries, a checkpoint moved aside."""
    make_folder(out)
    tidy_directory(out / CHECKPOINT_SUBDIR)
    for name in (RUN_FILE, *OWN_FILES):
        remove_partial_files(out / name)
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
