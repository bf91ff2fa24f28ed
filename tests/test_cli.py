"""The `glassformer` command: subcommands end to end, errors in one line."""

import subprocess
import sys

import pytest

from glassformer import Seq2SeqTransformer
from glassformer.cli import main


def test_demo_trains_and_shows_held_out_answers(tmp_path, capsys):
    out = tmp_path / "demo-model"
    code = main(["demo", "--steps", "40", "--batch-size", "16", "--show", "3", "--out", str(out)])
    assert code == 0
    printed = capsys.readouterr().out
    assert "exact-match accuracy on 500 unseen strings" in printed
    assert printed.count(" -> ") == 3
    model = Seq2SeqTransformer.from_pretrained(out)
    assert model.config.src_vocab_size == 13


@pytest.mark.parametrize(
    "argv, message",
    [
        (["demo", "--steps", "0"], "--steps and --batch-size must be positive, got 0"),
        (["demo", "--min-len", "9", "--max-len", "3"], "got 9, 3"),
    ],
)
def test_user_errors_are_one_line_and_exit_non_zero(argv, message, capsys):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message in err and "Traceback" not in err


def test_python_dash_m_has_help():
    result = subprocess.run(
        [sys.executable, "-m", "glassformer", "demo", "--help"], capture_output=True, text=True
    )
    assert result.returncode == 0
    assert "--steps" in result.stdout and "reverse" in result.stdout
