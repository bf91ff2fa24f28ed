"""Train a language model, a translator or a classifier.

    glassformer train lm        --corpus austen        (char-level GPT)
    glassformer train translate --corpus bible-en-es   (English → Spanish, shared BPE)
    glassformer train classify  --corpus imdb          (sentiment, WordPiece)

Everything goes into one run directory (--out): the checkpoint, metrics.jsonl, loss.png
and samples.txt. --resume DIR continues an interrupted run exactly where it stopped.
Training stops at --max-steps or after --minutes of training, whichever comes first.

The same command runs data-parallel under torchrun (gloo on CPU, NCCL on GPUs):

    torchrun --nproc_per_node 2 -m glassformer train lm --corpus austen --batch-size 16

--batch-size is per process: the global batch is batch-size × processes × accumulation.
Rank 0 shows progress and writes the run directory; --resume works with any number of
processes.

--framework keras trains the classifier's Keras 3 twin with model.fit (extra `keras`): the
same data, initial weights, optimiser and schedule; the run directory then also holds
model.keras, and its checkpoint/ is the trained weights moved to PyTorch, so every other
command takes the run as usual.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import torch

from glassformer.checkpoint import load_checkpoint
from glassformer.cli._checks import check_train_options
from glassformer.training import Schedule, TrainConfig, distributed
from glassformer.training.memory import keep_freed_memory
from glassformer.training.run import (
    plot_loss,
    write_atomic,
)
from glassformer.training.tasks import DataOptions, classify_task, lm_task, translate_task

HELP = "train a GPT (lm), a translator (translate) or a classifier (classify)"
RUN_FILE = "run.json"
FRAMEWORKS = ("torch", "keras")

# Per task: (default batch size, learning rate, optimizer, schedule, warm-up steps).
DEFAULTS = {
    "lm": dict(batch_size=32, lr=2e-3, optimizer="adamw", schedule="cosine", warmup=100),
    # The paper's Adam + noam warm-up (--optimizer adam --schedule noam --lr 1.0) spends too
    # much of a CPU-minutes budget warming up; AdamW + cosine learns faster here.
    "translate": dict(batch_size=64, lr=1e-3, optimizer="adamw", schedule="cosine", warmup=200),
    # Lower-cased WordPiece (16k tokens), lr 1e-3 and the one-layer small preset: 0.84 test
    # accuracy on IMDb after 4 minutes; cased, lr 5e-4 and four layers: 0.81 after 20.
    "classify": dict(
        batch_size=32,
        lr=1e-3,
        optimizer="adamw",
        schedule="cosine",
        warmup=200,
        vocab_size=16000,
        lowercase=True,
    ),
}


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("task", choices=sorted(DEFAULTS), help="what to train")
    data = p.add_argument_group("data")
    data.add_argument(
        "--corpus",
        help="a bundled corpus: austen, imdb (lm/classify), bible-en-es "
        "(default: austen for lm, bible-en-es for translate, imdb for classify)",
    )
    data.add_argument(
        "--data",
        help="your own file: text (lm), TSV/CSV pairs (translate), CSV/TSV text+label (classify)",
    )
    data.add_argument(
        "--tokenizer",
        choices=["char", "bpe", "wordpiece"],
        help="default: char (lm), bpe (translate), wordpiece (classify)",
    )
    data.add_argument(
        "--vocab-size", type=int, help="for bpe and wordpiece (8000; classify: 16000)"
    )
    data.add_argument(
        "--lowercase",
        action=argparse.BooleanOptionalAction,
        help="lower-case the text before training the tokenizer and encoding "
        "(default: on for classify, off otherwise)",
    )
    data.add_argument("--src-column", default="0", help="translate: source column (index or name)")
    data.add_argument("--tgt-column", default="1", help="translate: target column")
    data.add_argument("--text-column", default="text", help="classify: text column")
    data.add_argument("--label-column", default="label", help="classify: label column")
    data.add_argument("--max-examples", type=int, help="use at most this many training examples")
    model = p.add_argument_group("model")
    model.add_argument("--preset", default="small", choices=["tiny", "small", "base"])
    model.add_argument("--block-size", type=int, default=256, help="lm: context length")
    model.add_argument(
        "--max-len",
        type=int,
        default=None,
        help="translate/classify: longest sequence in tokens (128 / 256)",
    )
    model.add_argument("--d-model", type=int)
    model.add_argument("--num-heads", type=int)
    model.add_argument(
        "--num-layers", type=int, help="lm/classify; translate uses it for both stacks"
    )
    model.add_argument("--d-ff", type=int)
    model.add_argument("--dropout", type=float)
    model.add_argument(
        "--bias",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="lm: biases in the linear layers and LayerNorms (default: yes, as GPT-2; "
        "--no-bias is nanoGPT's block, a little faster)",
    )
    model.add_argument(
        "--norm-first",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="pre-norm (default: GPT yes, the others as the paper: no)",
    )
    opt = p.add_argument_group("training")
    opt.add_argument(
        "--framework",
        choices=list(FRAMEWORKS),
        default="torch",
        help="keras: train the Keras 3 twin with model.fit (classify only)",
    )
    opt.add_argument("--out", help="run directory (default: runs/<task>)")
    opt.add_argument("--resume", metavar="DIR", help="continue the run in DIR")
    opt.add_argument("--minutes", type=float, help="training time budget")
    opt.add_argument("--max-steps", type=int, help="optimizer steps")
    opt.add_argument("--batch-size", type=int)
    opt.add_argument("--accumulation", type=int, default=1, help="micro-batches per step")
    opt.add_argument("--lr", type=float, help="peak learning rate (noam: the paper's scale factor)")
    opt.add_argument("--optimizer", choices=["adam", "adamw"])
    opt.add_argument("--schedule", choices=["noam", "cosine", "constant"])
    opt.add_argument("--warmup", type=int, help="warm-up steps")
    opt.add_argument("--weight-decay", type=float, default=0.1)
    opt.add_argument("--label-smoothing", type=float, default=0.1, help="translate only")
    opt.add_argument("--clip-norm", type=float, default=1.0)
    opt.add_argument("--bf16", action="store_true", help="bfloat16 autocast")
    opt.add_argument(
        "--compile",
        action="store_true",
        help="train through torch.compile (needs a C++ compiler on CPU; same checkpoints)",
    )
    opt.add_argument("--eval-every", type=int, default=250, help="steps between evaluations")
    opt.add_argument("--checkpoint-every", type=int, default=250, help="steps between checkpoints")
    opt.add_argument("--log-every", type=int, default=10, help="steps between metrics.jsonl rows")
    opt.add_argument(
        "--on-nonfinite",
        choices=["stop", "skip"],
        help="a NaN/inf loss stops training (stop, the default) or its batch is skipped and "
        "counted in metrics.jsonl (skip)",
    )
    opt.add_argument("--seed", type=int, default=1337)
    opt.add_argument("--threads", type=int, help="torch threads (default: all cores)")
    opt.add_argument(
        "--strategy",
        default="ddp",
        choices=list(distributed.STRATEGIES),
        help="under torchrun: replicate the model (ddp) or shard parameters, gradients and "
        "optimizer state across the processes (fsdp)",
    )
    opt.add_argument(
        "--device",
        default="auto",
        choices=["auto", "cpu", "cuda"],
        help="auto: a CUDA GPU if there is one (under torchrun: cuda:LOCAL_RANK), else the CPU",
    )
    opt.add_argument(
        "--no-test",
        action="store_true",
        help="skip the held-out evaluation (BLEU, accuracy) at the end",
    )


def _column(value: str) -> str | int:
    return int(value) if value.isdigit() else value


def _options(args: argparse.Namespace) -> dict[str, Any]:
    """The run's options with the task's defaults filled in; saved as run.json."""
    opts = {
        k: v
        for k, v in vars(args).items()
        if k not in ("run", "command", "resume", "device", "strategy")
    }
    for key, value in DEFAULTS[args.task].items():
        if opts.get(key) is None:
            opts[key] = value
    opts["vocab_size"] = 8000 if opts["vocab_size"] is None else opts["vocab_size"]
    opts["lowercase"] = bool(opts["lowercase"])
    if opts["max_steps"] is None and opts["minutes"] is None:
        opts["minutes"] = 5.0
    opts["out"] = opts["out"] or f"runs/{args.task}"
    return opts


def data_options(o: dict[str, Any]) -> DataOptions:
    """The data part of a run's options (run.json)."""
    return DataOptions(
        task=o["task"],
        corpus=o["corpus"],
        data=o["data"],
        tokenizer=o["tokenizer"],
        vocab_size=o["vocab_size"],
        lowercase=bool(o.get("lowercase")),
        src_column=_column(str(o["src_column"])),
        tgt_column=_column(str(o["tgt_column"])),
        text_column=_column(str(o["text_column"])),
        label_column=_column(str(o["label_column"])),
        max_examples=o["max_examples"],
    )


def build_task(o: dict[str, Any], tokenizer=None, labels=None, world=None):
    overrides = {
        k: o[k]
        for k in ("d_model", "num_heads", "d_ff", "dropout", "norm_first")
        if o.get(k) is not None
    }
    data = data_options(o)
    world = world or distributed.Distributed()
    common = dict(
        preset=o["preset"],
        batch_size=o["batch_size"],
        seed=o["seed"],
        tokenizer=tokenizer,
        rank=world.rank,
        world_size=world.world_size,
    )
    if o.get("bias") is not None:
        if o["task"] != "lm":
            raise ValueError(f"--bias/--no-bias is for lm (a GPT), not {o['task']}")
        overrides["bias"] = o["bias"]
    if o["task"] == "lm":
        if o.get("num_layers"):
            overrides["num_layers"] = o["num_layers"]
        return lm_task(data, block_size=o["block_size"], model_overrides=overrides, **common)
    if o["task"] == "translate":
        if o.get("num_layers"):
            overrides["num_encoder_layers"] = overrides["num_decoder_layers"] = o["num_layers"]
        return translate_task(
            data,
            max_len=o["max_len"] or 128,
            model_overrides=overrides,
            label_smoothing=o["label_smoothing"],
            **common,
        )
    if o.get("num_layers"):
        overrides["num_layers"] = o["num_layers"]
    return classify_task(
        data, max_len=o["max_len"] or 256, model_overrides=overrides, labels=labels, **common
    )


def run(args: argparse.Namespace) -> int:
    keep_freed_memory()  # no page faults for the tensors every step allocates again
    world = distributed.setup(getattr(args, "device", "auto"))
    try:
        return _train(args, world)
    finally:
        distributed.teardown(world)


def _say(world, message: str) -> None:
    """A line on stderr, from rank 0 only."""
    if world.is_main:
        print(message, file=sys.stderr)


def _train(args: argparse.Namespace, world) -> int:
    resume_dir = Path(args.resume) if args.resume else None
    if resume_dir is not None:
        run_file = resume_dir / RUN_FILE
        if not run_file.is_file():
            raise ValueError(f"{resume_dir} is not a training run: no {RUN_FILE} in it")
        o = _read_run_file(run_file)
        if o.get("framework", "torch") != "torch":
            raise ValueError(f"{resume_dir} was trained with Keras; only PyTorch runs resume")
        # the budget may be extended on resume, the non-finite policy and threads changed
        for key in ("minutes", "max_steps", "on_nonfinite", "threads"):
            if getattr(args, key) is not None:
                o[key] = getattr(args, key)
        o["out"] = str(resume_dir)
        _rescale_batch(o, world)
    else:
        o = _options(args)
        o["processes"] = world.world_size
    check_train_options(o)
    keras = o.get("framework") == "keras"
    if keras:
        check_keras_options(o, world)
    out = Path(o["out"])
    if o.get("threads"):  # the run's own on resume: sums in another order differ in the last bit
        torch.set_num_threads(o["threads"])
    torch.manual_seed(o["seed"])

    tokenizer = labels = None
    if resume_dir is not None:
        from glassformer.data.tokenizers import load_tokenizer

        tokenizer = load_tokenizer(resume_dir / "checkpoint")
        labels_file = resume_dir / "checkpoint" / "labels.json"
        labels = json.loads(labels_file.read_text()) if labels_file.is_file() else None
    _say(world, f"preparing data for {o['task']} ...")
    task = _build_task_on_all_ranks(o, tokenizer, labels, world)
    model = task.model
    if resume_dir is not None:
        model = load_checkpoint(resume_dir)
    model.to(world.device)
    _say(world, f"data: {task.description}")
    _say(
        world,
        f"model: {type(model).__name__}, {model.num_parameters():,} parameters, "
        f"tokenizer {task.tokenizer.kind} ({task.tokenizer.vocab_size:,} tokens)"
        + (
            f"; {world.world_size} processes, global batch "
            f"{o['batch_size'] * world.world_size * o['accumulation']}"
            if world.enabled
            else ""
        )
        + (", Keras twin" if keras else ""),
    )

    schedule, config = schedule_and_config(o, model)
    if keras:
        from glassformer.cli._keras_train import train_keras

        start_run_dir(o, fresh=True)
        model, state = train_keras(o, task, schedule, config, out)
    else:
        from glassformer.cli._torch_train import train_torch

        model, state = train_torch(args, o, task, model, schedule, config, world)
        if not world.is_main:
            return 0
    _finish(o, task, model, state, out)
    return 0


def start_run_dir(o: dict[str, Any], *, fresh: bool) -> None:
    """Create the run directory and write run.json; a fresh run starts a new metrics.jsonl."""
    out = Path(o["out"])
    out.mkdir(parents=True, exist_ok=True)
    if fresh:
        (out / "metrics.jsonl").unlink(missing_ok=True)
    write_atomic(out / RUN_FILE, (json.dumps(o, indent=2) + "\n").encode())


def _finish(o: dict[str, Any], task, model, state, out: Path) -> None:
    """The loss plot, the held-out figures (results.json) and the samples, for any framework."""
    plot_loss(out / "metrics.jsonl", out / "loss.png", title=f"glassformer train {o['task']}")
    final = state.history[-1] if state.history else {}
    summary = ", ".join(f"{k} {v:.4f}" for k, v in final.items() if k != "step")
    print(f"\nstep {state.step}, {state.elapsed / 60:.1f} min of training: {summary}")
    model.eval()
    if task.test is not None and not o.get("no_test"):
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
    files = "checkpoint/, metrics.jsonl, loss.png, samples.txt, results.json"
    if o.get("framework") == "keras":
        files += ", model.keras"
    print(f"run directory: {out} ({files})")


def schedule_and_config(o: dict[str, Any], model) -> tuple[Schedule, TrainConfig]:
    """The learning-rate schedule and the loop's configuration, from a run's options."""
    # Under a pure time budget the cosine decays over the time (see Schedule.lr_at).
    schedule = Schedule(
        o["schedule"],
        lr=o["lr"],
        warmup=o["warmup"],
        total_steps=o["max_steps"] or 1,
        min_lr=o["lr"] / 10,
        d_model=model.config.d_model,
    )
    config = TrainConfig(
        max_steps=o["max_steps"],
        minutes=o["minutes"],
        accumulation=o["accumulation"],
        clip_norm=o["clip_norm"],
        bf16=o["bf16"],
        eval_every=o["eval_every"],
        on_nonfinite=o.get("on_nonfinite") or "stop",
    )
    return schedule, config


def check_keras_options(o: dict[str, Any], world) -> None:
    """--framework keras trains the classifier only, without the PyTorch-only options."""
    if o["task"] != "classify":
        raise ValueError(
            f"--framework keras trains the classifier (classify) only, not {o['task']!r}"
        )
    if world.enabled:
        raise ValueError("--framework keras trains in one process; run it without torchrun")
    unsupported = {
        "--bf16": o["bf16"],
        "--compile": o.get("compile"),
        "--accumulation": o["accumulation"] != 1,
        "--optimizer adam": o["optimizer"] != "adamw",
    }
    given = [name for name, value in unsupported.items() if value]
    if given:
        raise ValueError(f"{', '.join(given)} cannot be used with --framework keras")


def _build_task_on_all_ranks(o: dict[str, Any], tokenizer, labels, world):
    """The task, with one tokenizer for every rank: training a BPE or WordPiece vocabulary
    is not reproducible from process to process (ties between equally frequent merges), so
    rank 0 trains it and the other ranks load rank 0's."""
    if not world.enabled or tokenizer is not None:
        return build_task(o, tokenizer, labels, world)
    task = build_task(o, None, labels, world) if world.is_main else None
    shared = world.broadcast_bytes(task.extra_files["tokenizer.json"] if task else None)
    if task is not None:
        return task
    import tempfile

    from glassformer.data.tokenizers import load_tokenizer

    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "tokenizer.json").write_bytes(shared)
        tokenizer = load_tokenizer(tmp)
    return build_task(o, tokenizer, labels, world)


def _rescale_batch(o: dict[str, Any], world) -> None:
    """Resuming with another number of processes keeps the global batch: each process
    takes global / processes examples (or windows) per micro-batch."""
    saved = int(o.get("processes", 1))
    if saved == world.world_size:
        return
    global_batch = o["batch_size"] * saved
    if global_batch % world.world_size:
        raise ValueError(
            f"the run's global batch of {global_batch} ({saved} processes × {o['batch_size']}) "
            f"does not split evenly over {world.world_size} processes"
        )
    o["batch_size"], o["processes"] = global_batch // world.world_size, world.world_size
    _say(world, f"resuming on {world.world_size} processes: batch {o['batch_size']} each")


def _read_run_file(path: Path) -> dict[str, Any]:
    try:
        options = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ValueError(f"{path} is not valid JSON ({e}); it cannot be resumed") from None
    if not isinstance(options, dict) or "task" not in options:
        raise ValueError(f"{path} does not describe a training run; it cannot be resumed")
    return options
