"""``RunConfig``: everything one training run takes, typed, checked and saved as run.json.

The same object drives ``glassformer train`` and ``glassformer.fit``: each CLI flag
``--foo-bar`` is the field ``foo_bar`` (the CLI's parser is generated from these fields),
with the same defaults. A field left at ``None`` takes its task's default when the config
is built, so a built config says exactly what the run does:

    >>> from glassformer import RunConfig
    >>> c = RunConfig(task="classify", data="reviews.csv", max_steps=300)
    >>> c.batch_size, c.lr, c.tokenizer, c.vocab_size, c.lowercase, c.max_len
    (32, 0.001, 'wordpiece', 16000, True, 256)

A value no run could use is one ``RunConfigError`` (a ``ValueError``) when the config is
built, before any data is read.
"""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, TypeVar

from glassformer.errors import RunConfigError, one_line, shown
from glassformer.training.checks import (
    EVERY,
    FRACTION,
    NOT_NEGATIVE,
    POSITIVE,
    POSITIVE_INT,
    Rule,
    check_run,
    on_off_auto,
)
from glassformer.training.defaults import BEFORE_TASK_DEFAULT, COMMON_DEFAULTS, TASK_DEFAULTS

Task = Literal["lm", "translate", "classify", "mlm", "vision", "sae", "transcoder"]
T = TypeVar("T")
TASKS: tuple[Task, ...] = ("lm", "translate", "classify", "mlm", "vision", "sae", "transcoder")
RUN_FILE = "run.json"  # a run directory's config, written by fit
PROCESSES_KEY = "processes"  # beside the fields in run.json: how many processes trained it

# What may differ between a run and its resumption: the budget, the policy for NaNs and
# where and how it runs. Everything else must be the run's own.
RESUMABLE = ("minutes", "max_steps", "on_nonfinite", "threads", "device", "strategy", "out")


def _opt(default: Any, group: str, help: str, rule: Rule | None = None, **cli: Any) -> Any:
    """A field with its rule (checked when a config is built) and what the CLI shows for it:
    its option group, help and argparse extras."""
    return field(default=default, metadata={"group": group, "help": help, "rule": rule, **cli})


@dataclass(frozen=True, kw_only=True)
class RunConfig:
    """One training run: its task, data, model, optimisation, budget and output.

    Fields documented ``(task default)`` are None until the config is built, then hold
    the task's value (``TASK_DEFAULTS``).
    """

    task: Task = field(metadata={"group": "positional", "help": "what to train"})
    # ---- data
    corpus: str | None = _opt(
        None,
        "data",
        "a bundled corpus: austen, imdb (lm/classify/mlm), bible-en-es, digits (vision) (task "
        "default: austen for lm, bible-en-es for translate, imdb for classify and mlm, digits "
        "for vision)",
    )
    data: str | None = _opt(
        None,
        "data",
        "your own file: text (lm, mlm), TSV/CSV pairs (translate), CSV/TSV text+label "
        "(classify); vision: a folder with one sub-folder of images per class",
    )
    tokenizer: Literal["char", "bpe", "wordpiece"] | None = _opt(
        None, "data", "task default: char (lm), bpe (translate), wordpiece (classify, mlm)"
    )
    vocab_size: int | None = _opt(
        None,
        "data",
        "for bpe and wordpiece (task default: 8000; classify: 16000)",
        rule=POSITIVE_INT,
    )
    lowercase: bool | None = _opt(
        None,
        "data",
        "lower-case the text before training the tokenizer and encoding "
        "(task default: on for classify, off otherwise)",
        tristate=True,
    )
    src_column: str | int = _opt(0, "data", "translate: source column (index or name)")
    tgt_column: str | int = _opt(1, "data", "translate: target column")
    text_column: str | int = _opt("text", "data", "classify: text column")
    label_column: str | int = _opt("label", "data", "classify: label column")
    max_examples: int | None = _opt(
        None, "data", "use at most this many training examples", rule=POSITIVE_INT
    )
    mask_prob: float = _opt(
        0.15,
        "data",
        "mlm: the share of tokens hidden and predicted (BERT: 80/10/10 of them "
        "replaced by [MASK] / a random token / kept)",
        rule=Rule("in (0, 1)", lambda v: 0 < v < 1),
    )
    whole_word_mask: bool = _opt(False, "data", "mlm: hide whole words (all their ## pieces)")
    # ---- model
    preset: Literal["tiny", "small", "base", "llama-tiny"] = _opt(
        "small", "model", "the model's size; lm also takes llama-tiny (the modern block)"
    )
    block_size: int = _opt(256, "model", "lm: context length", rule=POSITIVE_INT)
    max_len: int | None = _opt(
        None,
        "model",
        "translate/classify/mlm: longest sequence in tokens (task default: 128 / 256 / 256)",
        rule=POSITIVE_INT,
    )
    patch_size: int | None = _opt(
        None,
        "model",
        "vision: the side of a square patch, in pixels (task default: 2)",
        rule=POSITIVE_INT,
    )
    d_model: int | None = _opt(None, "model", "width (default: the preset's)", rule=POSITIVE_INT)
    num_heads: int | None = _opt(
        None, "model", "attention heads (default: the preset's)", rule=POSITIVE_INT
    )
    num_layers: int | None = _opt(
        None,
        "model",
        "layers; translate uses it for both stacks (default: the preset's)",
        rule=POSITIVE_INT,
    )
    d_ff: int | None = _opt(
        None, "model", "feed-forward width (default: the preset's)", rule=POSITIVE_INT
    )
    dropout: float | None = _opt(
        None, "model", "dropout (default: the preset's; mlm and translate: 0)", rule=FRACTION
    )
    positional: Literal["learned", "sinusoidal", "rope"] | None = _opt(
        None,
        "model",
        "positions: learned, sinusoidal (the paper's) or rope (GPT only) "
        "(default: the model's; mlm: sinusoidal)",
    )
    bias: bool | None = _opt(
        None,
        "model",
        "lm: biases in the linear layers and LayerNorms (default: yes, as GPT-2; "
        "--no-bias is nanoGPT's block, a little faster)",
        tristate=True,
    )
    norm_first: bool | None = _opt(
        None, "model", "pre-norm (default: GPT yes, the others as the paper: no)", tristate=True
    )
    attention_window: int | None = _opt(
        None,
        "model",
        "local attention: each token attends the W tokens before it (and, in an encoder, "
        "the W after it), so cost grows linearly with --max-len (default: all tokens)",
        rule=POSITIVE_INT,
    )
    global_tokens: int | None = _opt(
        None,
        "model",
        "with --attention-window: the first N tokens see and are seen by all (default: 0)",
        rule=Rule("an integer, 0 or more", lambda v: v >= 0),
    )
    arch: Literal["encoder", "gpt"] = _opt(
        "encoder",
        "model",
        "classify: the classifier's shape: encoder (the paper's encoder, mean pooling) or gpt "
        "(causal pre-norm blocks, the head on the last real token), from random weights",
    )
    # ---- fine-tuning
    init: str | None = _opt(
        None,
        "fine-tuning",
        "classify: start the encoder (and take the tokenizer) from a pretrained one: an mlm "
        "or lm run directory, all-MiniLM-L6-v2, a sentence-transformers or BERT directory, "
        "or a Hugging Face Hub id (org/name)",
    )
    encoder_lr: float | None = _opt(
        None,
        "fine-tuning",
        "classify --init: the pretrained encoder's peak learning rate (default: --lr, which "
        "the new head always takes)",
        rule=POSITIVE,
    )
    freeze_encoder_steps: int = _opt(
        0,
        "fine-tuning",
        "classify --init: train only the new head for the first N steps",
        rule=NOT_NEGATIVE,
    )
    linear_probe: bool = _opt(False, "fine-tuning", "classify --init: train only the new head")
    # ---- sparse autoencoders and transcoders
    model: str | None = _opt(None, "sae", "sae, transcoder: the model read (a run directory, a "
                             "packaged name: SmolLM2-135M-Instruct, or a Hub id)")  # fmt: skip
    hook: str | None = _opt(None, "sae", "sae: the hook point it reads (blocks.15.hook_resid_post)")
    layers: str | None = _opt(None, "sae", 'transcoder: the blocks: "all", "a-b" or "a,b,c"')
    skip: bool = _opt(False, "sae", "transcoder: a linear skip term beside the features")
    cross_layer: bool = _opt(False, "sae", "transcoder: each feature writes every later MLP too")
    store: str | None = _opt(None, "sae", "transcoder: keep the MLP activations in this folder "
                             "(safetensors shards), read on later passes and runs")  # fmt: skip
    features: int | None = _opt(None, "sae", "sae, transcoder: how many features (per layer; "
                                "default: 8 × the width read)", rule=POSITIVE_INT)  # fmt: skip
    k: int | None = _opt(None, "sae", "sae, transcoder: features per token (TopK; task default)",
                         rule=POSITIVE_INT)  # fmt: skip
    # ---- training
    framework: Literal["torch", "keras"] = _opt(
        "torch", "training", "keras: train the Keras 3 twin with model.fit (classify only)"
    )
    out: str | None = _opt(None, "training", "run directory (default: runs/<task>)")
    minutes: float | None = _opt(None, "training", "training time budget (default: 5 when "
                                 "--max-steps is not given)", rule=POSITIVE)  # fmt: skip
    max_steps: int | None = _opt(None, "training", "optimizer steps", rule=POSITIVE_INT)
    batch_size: int | None = _opt(
        None,
        "training",
        "examples (or windows) per micro-batch and process (task default)",
        rule=POSITIVE_INT,
    )
    accumulation: int = _opt(1, "training", "micro-batches per step", rule=POSITIVE_INT)
    lr: float | None = _opt(None, "training", "peak learning rate (noam: the paper's scale "
                            "factor) (task default)", rule=POSITIVE)  # fmt: skip
    optimizer: Literal["adam", "adamw"] | None = _opt(None, "training", "default: adamw")
    schedule: Literal["noam", "cosine", "constant"] | None = _opt(
        None, "training", "default: cosine"
    )
    warmup: int | None = _opt(None, "training", "warm-up steps (task default)", rule=NOT_NEGATIVE)
    weight_decay: float = _opt(0.1, "training", "AdamW's decoupled weight decay", rule=NOT_NEGATIVE)
    label_smoothing: float = _opt(0.1, "training", "translate only", rule=FRACTION)
    clip_norm: float = _opt(1.0, "training", "clip the gradient norm to this", rule=POSITIVE)
    bf16: bool | Literal["auto"] = _opt(
        "auto",
        "training",
        "bfloat16 autocast: auto (the default), --bf16 (or on), or off. auto: taken where "
        "the model's matrix products measure faster in bf16 (timed once per machine, "
        "cached) and a few steps on the run's first batches keep fp32's losses; --bf16 "
        "warns where it measures slower",
        cli=dict(nargs="?", const=True, type=on_off_auto, metavar="auto|on|off"),
    )
    compile: bool = _opt(
        False,
        "training",
        "train through torch.compile (needs a C++ compiler on CPU; same checkpoints)",
    )
    eval_every: int = _opt(250, "training", "steps between evaluations", rule=EVERY)
    checkpoint_every: int = _opt(250, "training", "steps between checkpoints", rule=EVERY)
    log_every: int = _opt(10, "training", "steps between metrics.jsonl rows", rule=POSITIVE_INT)
    on_nonfinite: Literal["stop", "skip"] = _opt(
        "stop",
        "training",
        "a NaN/inf loss stops training (stop) or its batch is skipped and counted in "
        "metrics.jsonl (skip)",
    )
    seed: int = _opt(
        1337,
        "training",
        "seeds the model, the data order and dropout",
        rule=Rule("an integer", lambda v: True),
    )
    threads: int | None = _opt(
        None, "training", "torch threads (default: all cores)", rule=POSITIVE_INT
    )
    strategy: Literal["ddp", "fsdp"] = _opt(
        "ddp",
        "training",
        "under torchrun: replicate the model (ddp) or shard parameters, gradients and "
        "optimizer state across the processes (fsdp)",
    )
    device: Literal["auto", "cpu", "cuda"] = _opt(
        "auto",
        "training",
        "auto: a CUDA GPU if there is one (under torchrun: cuda:LOCAL_RANK), else the CPU",
    )
    no_test: bool = _opt(
        False, "training", "skip the held-out evaluation (BLEU, accuracy) at the end"
    )

    def __post_init__(self) -> None:
        if self.task not in TASKS:
            raise RunConfigError("task", f"must be one of {list(TASKS)}, got {shown(self.task)}")
        self._fill_defaults()
        check_run(self)

    def _fill_defaults(self) -> None:
        """Give the None-defaulted fields their task's values (frozen: through object)."""
        defaults = {**COMMON_DEFAULTS, **TASK_DEFAULTS[self.task]}
        if self.data is not None:
            defaults.pop("corpus")
        for name, value in defaults.items():
            if getattr(self, name) is None:
                object.__setattr__(self, name, value)
        if self.max_steps is None and self.minutes is None:
            object.__setattr__(self, "minutes", 5.0)
        if self.out is None:
            object.__setattr__(self, "out", f"runs/{self.task}")
        for name in ("src_column", "tgt_column", "text_column", "label_column"):
            value = getattr(self, name)
            if isinstance(value, str) and value.isdigit():  # a column index, as typed
                object.__setattr__(self, name, int(value))

    # ---- the run's JSON file

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2) + "\n"

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> RunConfig:
        """A config from a dict of fields (run.json's keys; bookkeeping keys are left out)."""
        fields = {f.name: f for f in dataclasses.fields(cls)}
        # What an older run.json's None meant: the value the field had before it took a
        # task default (translate's dropout: the preset's 0.1), or, for a field that now
        # has a default of its own, that default (on_nonfinite: null meant "stop").
        meant_then = BEFORE_TASK_DEFAULT.get(str(values.get("task")), {})
        kept = {}
        for k, v in values.items():
            if v is None and k in meant_then:
                v = meant_then[k]
            elif k == PROCESSES_KEY:
                continue  # bookkeeping beside the fields
            elif v is None and k in fields and fields[k].default is not None:
                continue  # the field's own default
            kept[k] = v
        values = kept
        unknown = sorted(set(values) - set(fields))
        if unknown:
            raise ValueError(f"RunConfig has no field(s) {shown(unknown)}")
        return cls(**values)

    @classmethod
    def from_json(cls, text: str, *, source: str = "run.json") -> RunConfig:
        """The config a run's JSON file holds (``to_json``'s output, or the run.json of a
        run trained before RunConfig existed)."""
        return cls.from_dict(_run_values(text, source))

    @classmethod
    def from_run(cls, run_dir: str | Path) -> RunConfig:
        """The config of the run in ``run_dir`` (its run.json)."""
        return read_run(run_dir)[0]

    def replace(self, **changes: Any) -> RunConfig:
        """A copy with ``changes`` (checked again, and task defaults filled again)."""
        return dataclasses.replace(self, **changes)


def read_run(run_dir: str | Path) -> tuple[RunConfig, int]:
    """The run in ``run_dir``: its config and how many processes trained it (run.json)."""
    file = Path(run_dir) / RUN_FILE
    if not file.is_file():
        raise ValueError(f"{run_dir} is not a training run: no {RUN_FILE} in it")
    values = _run_values(file.read_bytes(), str(file))  # bytes not UTF-8: not valid JSON
    processes = values.get(PROCESSES_KEY, 1)
    if type(processes) is not int or processes < 1:  # bool is an int: not one here
        raise ValueError(f"{file}: {PROCESSES_KEY} is {shown(processes)}, not a whole number >= 1")
    try:
        return RunConfig.from_dict(values), processes
    except RunConfigError as e:  # a field no run can use: named with its file
        raise RunConfigError(e.field, f"{e.problem} (in {file}: it cannot be resumed)") from None
    except ValueError as e:  # a key no field has, options that do not go together
        raise ValueError(f"{file}: {one_line(e)}; it cannot be resumed") from None


def _run_values(text: str | bytes, source: str) -> dict[str, Any]:
    """run.json's fields: a JSON object with a task, each number finite (JSON has no
    Infinity or NaN; Python's reader takes them, and 1e999, as floats)."""
    try:
        values = json.loads(text)
    except RecursionError:
        raise ValueError(f"{source} is nested too deeply for a run; it cannot be resumed") from None
    except ValueError as e:  # JSONDecodeError, or an integer of thousands of digits
        raise ValueError(f"{source} is not valid JSON ({e}); it cannot be resumed") from None
    if not isinstance(values, dict) or "task" not in values:
        raise ValueError(f"{source} does not describe a training run; it cannot be resumed")
    for name, value in values.items():
        if isinstance(value, float) and not math.isfinite(value):
            raise ValueError(  # the key as it is (lr), or cut short (one_line) if long
                f"{source}: {one_line(name, 80)} is {value}, not finite; it cannot be resumed"
            )
    return values


def filled(value: T | None) -> T:
    """A field the config fills when it is built (a task default): never None after that."""
    if value is None:
        raise ValueError("a RunConfig field that is filled when the config is built is None")
    return value
