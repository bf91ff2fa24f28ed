"""RunConfig: one typed, frozen object for a whole run, the same for Python and the CLI."""

import dataclasses
import json
from pathlib import Path

import pytest

from glassformer import RunConfig
from glassformer.cli import build_parser
from glassformer.cli.train import config_from_args
from glassformer.training.config import TASK_DEFAULTS, RunConfigError

LEGACY = Path(__file__).parent / "data" / "legacy_runs" / "runs"


def parse(*argv):
    return config_from_args(build_parser().parse_args(["train", *argv]))[0]


# The per-task defaults `glassformer train` had before RunConfig (cli/train.py DEFAULTS and
# _options), written out here so that a change to them is seen.
OLD_DEFAULTS = {
    "lm": dict(batch_size=32, lr=2e-3, optimizer="adamw", schedule="cosine", warmup=100),
    "translate": dict(batch_size=64, lr=1e-3, optimizer="adamw", schedule="cosine", warmup=200),
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


@pytest.mark.parametrize("task", ["lm", "translate", "classify"])
def test_task_defaults_are_the_commands_defaults(task):
    config = RunConfig(task=task)
    for name, value in OLD_DEFAULTS[task].items():
        assert getattr(config, name) == value, name
    assert config.vocab_size == (16000 if task == "classify" else 8000)
    assert config.minutes == 5.0 and config.max_steps is None
    assert config.out == f"runs/{task}"
    assert config.corpus == {"lm": "austen", "translate": "bible-en-es", "classify": "imdb"}[task]
    # the command line without options is the same config
    assert parse(task) == config


def test_every_train_flag_is_a_field_of_the_same_name():
    parser = build_parser()
    train = parser._subparsers._group_actions[0].choices["train"]
    dests = {a.dest for a in train._actions} - {"help", "resume"}
    assert dests == {f.name for f in dataclasses.fields(RunConfig)}
    flags = {s for a in train._actions for s in a.option_strings if s.startswith("--")}
    for f in dataclasses.fields(RunConfig):
        if f.name != "task":
            assert "--" + f.name.replace("_", "-") in flags


def test_the_flat_form_equals_the_parsed_command_line():
    argv = ["lm", "--data", "x.txt", "--preset", "tiny", "--max-steps", "300", "--seed", "7"]
    argv += ["--threads", "1", "--no-bias", "--lr", "3e-3", "--src-column", "2", "--bf16"]
    config = RunConfig(
        task="lm",
        data="x.txt",
        preset="tiny",
        max_steps=300,
        seed=7,
        threads=1,
        bias=False,
        lr=3e-3,
        src_column=2,
        bf16=True,
    )
    assert parse(*argv) == config
    assert config.corpus is None  # a file was given: no bundled corpus
    assert config.src_column == 2 and parse(*argv).src_column == 2  # "2" from the CLI -> 2


def test_mlm_defaults_to_the_recipe_that_leaves_the_unigram_plateau():
    """Sinusoidal positions, pre-norm, lr 3e-3, no dropout (the comment on TASK_DEFAULTS
    has the measurement); the other tasks keep their models' own positions."""
    mlm = RunConfig(task="mlm")
    assert (mlm.positional, mlm.norm_first, mlm.lr, mlm.dropout) == ("sinusoidal", True, 3e-3, 0.0)
    assert RunConfig(task="classify").positional is None
    assert RunConfig(task="mlm", positional="learned").positional == "learned"


def test_frozen_and_keyword_only():
    config = RunConfig(task="lm")
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.lr = 1.0
    with pytest.raises(TypeError):
        RunConfig("lm")
    changed = config.replace(max_steps=10)
    assert changed.max_steps == 10 and config.max_steps is None


@pytest.mark.parametrize(
    "changes, field, message",
    [
        (dict(batch_size=0), "batch_size", "must be a positive integer, got 0"),
        (dict(max_steps=-1), "max_steps", "must be a positive integer, got -1"),
        (dict(minutes=-1.0), "minutes", "must be > 0, got -1.0"),
        (dict(lr=float("nan")), "lr", "must be > 0, got nan"),
        (dict(dropout=1.5), "dropout", "must be in [0, 1), got 1.5"),
        (dict(label_smoothing=1.0), "label_smoothing", "must be in [0, 1), got 1.0"),
        (dict(checkpoint_every=-1), "checkpoint_every", "must be 0 (only at the end) or more"),
        (dict(log_every=0), "log_every", "must be a positive integer, got 0"),
        (dict(threads=-2), "threads", "must be a positive integer, got -2"),
        (dict(batch_size=2.5), "batch_size", "must be a positive integer, got 2.5"),
        (dict(batch_size=True), "batch_size", "must be a positive integer, got True"),
        (
            dict(preset="huge"),
            "preset",
            "must be one of ['tiny', 'small', 'base', 'llama-tiny'], got 'huge'",
        ),
        (
            dict(positional="alibi"),
            "positional",
            "must be one of ['learned', 'sinusoidal', 'rope'], got 'alibi'",
        ),
        (dict(optimizer="sgd"), "optimizer", "must be one of ['adam', 'adamw'], got 'sgd'"),
        (dict(bf16="yes"), "bf16", "must be True, False or 'auto', got 'yes'"),
        (
            dict(task="summarise"),
            "task",
            "must be one of ['lm', 'translate', 'classify', 'mlm', 'vision', 'sae', 'transcoder']",
        ),
        (dict(task="classify", bias=False), "bias", "is for lm (a GPT), not 'classify'"),
        (dict(framework="keras"), "framework", "keras trains the classifier (classify) only"),
        (dict(arch="rnn"), "arch", "must be one of ['encoder', 'gpt'], got 'rnn'"),
        (dict(task="lm", arch="gpt"), "arch", "chooses a classifier's shape (classify), not 'lm'"),
        (dict(task="classify", arch="gpt", init="runs/lm"), "arch", "comes from --init runs/lm"),
        (dict(task="classify", arch="gpt", framework="keras"), "arch", "gpt is not in the Keras"),
    ],
)
def test_a_bad_value_is_one_error_naming_the_field(changes, field, message):
    values = {"task": "lm", **changes}
    with pytest.raises(RunConfigError) as e:
        RunConfig(**values)
    assert e.value.field == field and message in str(e.value)
    assert str(e.value).startswith(field)
    assert e.value.cli_message().startswith("--" + field.replace("_", "-") + " ")


def test_the_cli_names_the_flag(capsys):
    from glassformer.cli import main

    assert main(["train", "lm", "--batch-size", "0"]) == 2
    assert (
        capsys.readouterr()
        .err.strip()
        .endswith("error: --batch-size must be a positive integer, got 0")
    )


def test_corpus_and_data_together_is_an_error():
    with pytest.raises(ValueError, match="give --corpus or --data, not both"):
        RunConfig(task="lm", corpus="austen", data="x.txt")


def test_keras_refuses_the_pytorch_only_options():
    with pytest.raises(ValueError, match="--bf16, --compile cannot be used with --framework keras"):
        RunConfig(task="classify", framework="keras", bf16=True, compile=True)
    assert RunConfig(task="classify", framework="keras").framework == "keras"


def test_json_round_trip(tmp_path):
    config = RunConfig(task="translate", data="p.tsv", max_steps=5, src_column="en", seed=3)
    assert RunConfig.from_json(config.to_json()) == config
    (tmp_path / "run.json").write_text(config.to_json())
    assert RunConfig.from_run(tmp_path) == config


@pytest.mark.parametrize("task", ["lm", "translate", "classify"])
def test_run_files_written_before_runconfig_load(task):
    old = json.loads((LEGACY / task / "run.json").read_text())
    assert old["on_nonfinite"] is None and old["src_column"] == "0"  # the old spelling
    config = RunConfig.from_run(LEGACY / task)
    assert config.task == task and config.on_nonfinite == "stop" and config.src_column == 0
    for name, value in old.items():
        if name in ("processes", "on_nonfinite", "src_column", "tgt_column") or value is None:
            continue
        assert getattr(config, name) == value, name
    assert config.tokenizer == TASK_DEFAULTS[task]["tokenizer"]  # null then meant the default


@pytest.mark.parametrize(
    "text, message",
    [
        ("{not json", "is not valid JSON"),
        ("[1, 2]", "does not describe a training run"),
        ('{"task": "lm", "learning_rate": 1}', "RunConfig has no field(s) ['learning_rate']"),
    ],
)
def test_bad_run_files_are_one_error(text, message):
    with pytest.raises(ValueError) as e:
        RunConfig.from_json(text)
    assert message in str(e.value)


def test_a_translate_run_from_before_its_dropout_default_reads_the_dropout_it_trained_with():
    """Its run.json says null (the preset's 0.1, as its checkpoint's config holds); the task
    default (0) is for runs that start now."""
    old = Path(__file__).parent / "data" / "runs_7a7e08c" / "runs" / "translate"
    assert json.loads((old / "run.json").read_text())["dropout"] is None
    model_config = json.loads((old / "checkpoint" / "config.json").read_text())
    assert RunConfig.from_run(old).dropout == model_config["config"]["dropout"] == 0.1
    assert RunConfig(task="translate").dropout == 0.0


LONG = "x" * 100_000  # a value no message should echo whole


@pytest.mark.parametrize(
    "fields, said",
    [
        ({"schedule": LONG}, "schedule must be one of"),
        ({"positional": [LONG]}, "positional must be one of"),
        ({"bf16": LONG}, "bf16 must be True, False or 'auto'"),
        ({"compile": LONG}, "compile must be True or False"),
        ({"batch_size": LONG}, "batch_size must be a positive integer"),
        ({"task": LONG}, "task must be one of"),
        ({"task": "classify", "arch": "gpt", "init": LONG}, "arch comes from --init xxx"),
        ({"fuzz": 1}, "RunConfig has no field(s) ['fuzz']"),
        ({LONG: 1}, "RunConfig has no field(s)"),
        ({LONG: float("inf")}, "not finite"),
        ({"processes": LONG}, "processes is"),
        ({"corpus": "austen", "data": "x.txt"}, "give --corpus or --data"),
    ],
    ids=lambda v: v if isinstance(v, str) else None,
)
def test_a_hostile_run_json_is_one_short_line_naming_the_file_and_field(tmp_path, fields, said):
    """run.json with a 100,000-character value (or key) was refused with the value whole;
    a key no field has, or options that do not go together, named no file."""
    (tmp_path / "run.json").write_text(json.dumps({"task": "lm", **fields}, allow_nan=True))
    with pytest.raises(ValueError) as e:
        RunConfig.from_run(tmp_path)
    message = str(e.value)
    assert "\n" not in message and len(message) < 1000, message[:2000]
    assert said in message and str(tmp_path / "run.json") in message, message
