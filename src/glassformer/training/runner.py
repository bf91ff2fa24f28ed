"""``fit``: one whole training run from a ``RunConfig``, for Python and the CLI alike.

    >>> import glassformer
    >>> result = glassformer.fit(glassformer.RunConfig(task="lm", data="story.txt",
    ...                                                preset="tiny", max_steps=300))
    >>> result.model.generate(...)                                       # doctest: +SKIP

A run: seed, build the task (read the data, train the tokenizer, build the model), train
with the loop's hooks (progress bar, metrics.jsonl, checkpoints), then write the loss
plot, the held-out figures (results.json) and samples.txt into the run directory:

    run/
      run.json        the RunConfig (and how many processes trained it)
      checkpoint/     config.json, model.safetensors, tokenizer.json, training_state.pt
      metrics.jsonl   loss.png   results.json   samples.txt

``fit(config, resume=run_dir)`` continues an interrupted run with the losses the
uninterrupted run would have had; only the budget and how it runs may change
(``RESUMABLE``). Under ``torchrun`` every process calls ``fit`` with the same config: rank 0
trains the tokenizer and the others load it, each takes its share of every global batch,
and rank 0 writes the run directory.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from glassformer.atomic import make_folder, previous_name
from glassformer.checkpoint import CHECKPOINT_SUBDIR, load_checkpoint, resolve_checkpoint_dir
from glassformer.data.images import IMAGE_PROCESSOR_FILE, ImageProcessor, load_image_processor
from glassformer.data.tokenizers import Tokenizer, load_tokenizer
from glassformer.inference import LABELS_FILE, read_labels
from glassformer.training import distributed
from glassformer.training.config import RESUMABLE, RunConfig, filled, read_run
from glassformer.training.distributed import Distributed
from glassformer.training.loop import Hook, TrainState
from glassformer.training.memory import keep_freed_memory
from glassformer.training.run import finish_run, start_run_dir
from glassformer.training.tasks import Task, build_task
from glassformer.training.torch_fit import bf16_for, schedule_and_config, train_torch


@dataclass(frozen=True)
class RunResult:
    """What ``fit`` gives back.

    Attributes:
        model: the trained model, in eval mode (None on torchrun ranks other than 0); after
            a Keras run, the PyTorch twin of its weights (``model.keras`` holds the Keras one).
        tokenizer: its tokenizer (a vision run: its ``ImageProcessor``).
        run_dir: the run directory.
        results: the held-out figures (results.json); empty with ``no_test``.
        state: where training ended (steps, tokens, seconds, the evaluations).
        config: the config the run used (task defaults filled in).
        labels: a classifier's labels, in the order of its outputs; None for other tasks.
    """

    model: Any
    tokenizer: Tokenizer | ImageProcessor
    run_dir: Path
    results: dict[str, Any] = field(default_factory=dict)
    state: TrainState = field(default_factory=TrainState)
    config: RunConfig | None = None
    labels: list[str] | None = None


def fit(
    config: RunConfig, *, resume: str | Path | None = None, hooks: tuple[Hook, ...] = ()
) -> RunResult:
    """Train the run ``config`` describes, into its run directory (``config.out``).

    Args:
        config: the run (``RunConfig``).
        resume: a run directory to continue where it stopped. ``config`` must be that
            run's (``RunConfig.from_run(resume)``), changed only in ``RESUMABLE`` fields.
        hooks: more ``hook(event, state, metrics)`` callables for the training loop, after
            the progress bar, metrics log and checkpointer (events "step", "skip", "eval",
            "end"; see ``glassformer.training.train``).

    Returns:
        The trained model, its tokenizer, the run directory and the held-out figures.

    Raises:
        ValueError: bad data, a run that cannot be resumed, a config that does not match
            the resumed run.
        NonFiniteLossError: the loss went NaN or infinite (``on_nonfinite="stop"``).
    """
    keep_freed_memory()  # no page faults for the tensors every step allocates again
    world = distributed.setup(config.device)
    try:
        result = _fit(config, Path(resume) if resume else None, tuple(hooks), world)
        # Every rank done before any takes the group down: a rank that destroyed it while
        # another was still writing the run was seen to abort at exit (gloo, FSDP).
        world.barrier()
        return result
    finally:
        distributed.teardown(world)


def _fit(
    config: RunConfig, resume_dir: Path | None, hooks: tuple[Hook, ...], world: Distributed
) -> RunResult:
    processes = world.world_size
    if resume_dir is not None:
        config = _resumed_config(config, resume_dir, world)
        resume_dir = _saved_or_none(resume_dir, world)
    _check_requirements(config, world)
    out = make_folder(config.out or f"runs/{config.task}", create=False)
    if config.threads:  # the run's own on resume: sums in another order differ in the last bit
        torch.set_num_threads(config.threads)
    torch.manual_seed(config.seed)
    tokenizer, labels = _resumed_inputs(resume_dir) if resume_dir is not None else (None, None)
    _say(world, f"preparing data for {config.task} ...")
    task = _build_task_on_all_ranks(config, tokenizer, labels, world)
    model: Any = task.model
    if resume_dir is not None:
        model = load_checkpoint(resume_dir)
    model.to(world.device)
    _say(world, f"data: {task.description}")
    _say(world, _model_line(config, task, model, world))

    bf16 = None
    if config.framework == "torch":
        bf16, note = bf16_for(config, model, task)
        if world.enabled:  # the ranks train alike: bf16 only where every rank chose it
            bf16 = world.max(0.0 if bf16 else 1.0) == 0.0
        if note is not None:
            _say(world, note)
    schedule, loop_config = schedule_and_config(config, model, bf16)
    if config.framework == "keras":
        from glassformer.training.keras_fit import train_keras

        start_run_dir(config, out, processes, fresh=True)
        model, state = train_keras(
            task,
            schedule,
            loop_config,
            out,
            seed=config.seed,
            lr=filled(config.lr),
            weight_decay=config.weight_decay,
            clip_norm=config.clip_norm,
            hooks=hooks,
        )
    else:
        model, state = train_torch(
            config, task, model, schedule, loop_config, world, resume_dir, hooks
        )
        if not world.is_main:
            return RunResult(None, task.tokenizer, out, state=state, config=config)
    results = finish_run(config, task, model, state, out)
    if config.framework == "keras":  # the result holds the PyTorch twin of the trained weights
        model = load_checkpoint(out)
    labels_json = task.extra_files.get("labels.json")
    return RunResult(
        model,
        task.tokenizer,
        out,
        results=results,
        state=state,
        config=config,
        labels=json.loads(labels_json) if labels_json else None,
    )


def _require(module: str, message: str) -> None:
    """Fail in the first second, not after the training, when an optional library is missing."""
    if importlib.util.find_spec(module) is None:
        raise ValueError(message)


def _say(world: Distributed, message: str) -> None:
    """A line on stderr, from rank 0 only."""
    if world.is_main:
        print(message, file=sys.stderr)


def _model_line(config: RunConfig, task: Task, model: Any, world: Distributed) -> str:
    inputs = task.tokenizer
    if isinstance(inputs, ImageProcessor):
        reads = inputs.describe()
    else:
        reads = f"tokenizer {inputs.kind} ({inputs.vocab_size:,} tokens)"
    line = f"model: {type(model).__name__}, {model.num_parameters():,} parameters, {reads}"
    if world.enabled:
        global_batch = filled(config.batch_size) * world.world_size * config.accumulation
        line += f"; {world.world_size} processes, global batch {global_batch}"
    return line + (", Keras twin" if config.framework == "keras" else "")


# ---- resuming -----------------------------------------------------------------------------


def _resumed_config(config: RunConfig, resume_dir: Path, world: Distributed) -> RunConfig:
    """The config to continue ``resume_dir`` with: the run's own, with ``config``'s budget
    and running options, and the batch rescaled to this number of processes."""
    saved, processes = read_run(resume_dir)
    if saved.framework != "torch":
        raise ValueError(f"{resume_dir} was trained with Keras; only PyTorch runs resume")
    changed = [
        f.name
        for f in dataclasses.fields(RunConfig)
        if f.name not in RESUMABLE and getattr(config, f.name) != getattr(saved, f.name)
    ]
    if changed:
        listed = ", ".join(
            f"{name} (the run's: {getattr(saved, name)!r}, given: {getattr(config, name)!r})"
            for name in changed
        )
        raise ValueError(
            f"{resume_dir} is resumed with its own options; these differ: {listed} "
            f"(only {', '.join(RESUMABLE)} may change)"
        )
    config = config.replace(out=str(resume_dir))
    return _rescale_batch(config, processes, world)


def _saved_or_none(resume_dir: Path, world: Distributed) -> Path | None:
    """``resume_dir``, or None where the run was stopped before its first checkpoint: it is
    then trained again from the start (the same seed: the same losses), into the same
    directory."""
    ckpt = resume_dir / CHECKPOINT_SUBDIR
    if ckpt.exists() or previous_name(ckpt).exists():
        return resume_dir
    _say(world, f"{resume_dir} stopped before its first checkpoint: training it from the start")
    return None


def _rescale_batch(config: RunConfig, saved: int, world: Distributed) -> RunConfig:
    """Resuming with another number of processes keeps the global batch: each process
    takes global / processes examples (or windows) per micro-batch."""
    if saved == world.world_size:
        return config
    global_batch = filled(config.batch_size) * saved
    if global_batch % world.world_size:
        raise ValueError(
            f"the run's global batch of {global_batch} ({saved} processes × "
            f"{config.batch_size}) does not split evenly over {world.world_size} processes"
        )
    _say(
        world,
        f"resuming on {world.world_size} processes: batch {global_batch // world.world_size} each",
    )
    return config.replace(batch_size=global_batch // world.world_size)


def _check_requirements(config: RunConfig, world: Distributed) -> None:
    """The optional packages a run needs, and what a Keras run cannot do."""
    if config.task == "translate" and not config.no_test:
        _require(
            "sacrebleu",
            "the translator's held-out BLEU needs sacrebleu: pip install 'glassformer[data]' "
            "(or skip the held-out evaluation with --no-test)",
        )
    if config.framework == "keras":
        _require("keras", "--framework keras needs Keras 3: pip install 'glassformer[keras]'")
    if config.framework == "keras" and world.enabled:
        raise ValueError("--framework keras trains in one process; run it without torchrun")


def _resumed_inputs(
    resume_dir: Path,
) -> tuple[Tokenizer | ImageProcessor | None, list[str] | None]:
    """A resumed run's tokenizer (or image processor) and labels, from its checkpoint."""
    ckpt = resolve_checkpoint_dir(resume_dir)  # .checkpoint.old: killed between two renames
    tokenizer: Tokenizer | ImageProcessor
    if (ckpt / IMAGE_PROCESSOR_FILE).is_file():
        tokenizer = load_image_processor(ckpt)
    else:
        tokenizer = load_tokenizer(ckpt)
    labels = read_labels(resume_dir) if (ckpt / LABELS_FILE).is_file() else None
    return tokenizer, labels


def _build_task_on_all_ranks(
    config: RunConfig,
    tokenizer: Tokenizer | ImageProcessor | None,
    labels: list[str] | None,
    world: Distributed,
) -> Task:
    """The task, with one tokenizer for every rank: training a BPE or WordPiece vocabulary
    is not reproducible from process to process (ties between equally frequent merges), so
    rank 0 trains it and the other ranks load rank 0's. (Images need no tokenizer.)"""
    if not world.enabled or tokenizer is not None or config.task == "vision":
        return build_task(config, tokenizer=tokenizer, labels=labels, world=world)
    task = build_task(config, labels=labels, world=world) if world.is_main else None
    shared = world.broadcast_bytes(task.extra_files["tokenizer.json"] if task else None)
    if task is not None:
        return task
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "tokenizer.json").write_bytes(shared)
        tokenizer = load_tokenizer(tmp)
    return build_task(config, tokenizer=tokenizer, labels=labels, world=world)
