"""The `glassformer` command: subcommands end to end, errors in one line."""

import re
import shlex
import subprocess
import sys

import pytest
import torch

from glassformer import Seq2SeqTransformer
from glassformer.cli import SUBCOMMANDS, build_parser, main
from glassformer.cli.demo import make_batch


def held_out_loss(model: Seq2SeqTransformer) -> float:
    """Teacher-forced loss on 256 digit strings the demo never trains on (another seed)."""
    src, tgt_in, labels = make_batch(256, 4, 12, torch.Generator().manual_seed(2024))
    with torch.no_grad():
        return model.eval()(src, tgt_in, labels=labels).loss.item()


def test_demo_trains_and_shows_held_out_answers(tmp_path, capsys, one_thread):
    """40 steps (2 s) teach the model which tokens come, not yet the reversal: its held-out
    loss falls from its starting weights' 3.60 to 2.45 (about ln 11, a uniform guess over
    the ten digits and the end). The slow test below checks that the full demo learns the
    task itself."""
    out = tmp_path / "demo-model"
    code = main(["demo", "--steps", "40", "--batch-size", "16", "--show", "3", "--out", str(out)])
    assert code == 0
    printed = capsys.readouterr().out
    assert "exact-match accuracy on 500 unseen strings" in printed
    assert printed.count(" -> ") == 3
    model = Seq2SeqTransformer.from_pretrained(out)
    assert model.config.src_vocab_size == 13
    torch.manual_seed(0)  # the demo's seed: the weights it started from
    start = held_out_loss(Seq2SeqTransformer(model.config))
    assert held_out_loss(model) < 0.8 * start


@pytest.mark.slow
def test_the_full_demo_learns_to_reverse_unseen_digit_strings(capsys, one_thread):
    """The demo's defaults (1,500 steps of 64 strings, 80 s on one thread): nearly every
    unseen string reversed exactly (measured 94.8% on one thread; chance is 1e-4 or less)."""
    assert main(["demo", "--show", "0"]) == 0
    printed = capsys.readouterr().out
    accuracy = re.search(r"exact-match accuracy on 500 unseen strings: ([\d.]+)%", printed)
    assert accuracy is not None and float(accuracy[1]) >= 80.0, printed


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


# ---- --dtype on generate, chat and translate ---------------------------------------------


@pytest.fixture
def char_lm_run(tmp_path):
    """A tiny GPT with a character tokenizer, saved as a run a user's `train lm` writes."""
    from glassformer import GPT, GPTConfig
    from glassformer.data.tokenizers import CharTokenizer

    tok = CharTokenizer.train(["the cat sat on the mat. a dog ran far."])
    torch.manual_seed(0)
    config = GPTConfig(vocab_size=tok.vocab_size, d_model=64, num_heads=2, num_layers=2, max_len=64)
    run = GPT(config).save_pretrained(tmp_path / "lm")
    tok.save(run / "tokenizer.json")
    return run


@pytest.mark.parametrize("dtype", ["fp32", "bf16", "int8", "int4"])
def test_generate_decodes_in_each_dtype(char_lm_run, dtype, capsys, monkeypatch):
    seen = []
    real = torch.nn.Module.eval

    def spy(model):
        seen.append(model.precision.dtype if hasattr(model, "precision") else None)
        return real(model)

    argv = ["generate", "--model", str(char_lm_run), "--prompt", "the ", "--greedy"]
    assert main([*argv, "--max-new-tokens", "12", "--dtype", dtype, "--no-stream"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("the ") and len(out.rstrip("\n")) >= 4
    monkeypatch.setattr(torch.nn.Module, "eval", spy)
    assert main([*argv, "--max-new-tokens", "2", "--dtype", dtype, "--no-stream"]) == 0
    assert dtype in seen  # generate ran the model that for_inference made


@pytest.mark.measures_this_machine
def test_dtype_auto_says_what_it_measured(char_lm_run, capsys, monkeypatch, tmp_path):
    monkeypatch.setenv("GLASSFORMER_CACHE", str(tmp_path / "cache"))
    argv = ["generate", "--model", str(char_lm_run), "--prompt", "the ", "--max-new-tokens", "3"]
    assert main([*argv, "--no-stream"]) == 0  # auto is the default
    err = capsys.readouterr().err
    figures = r"precision: (fp32|bf16) \(speed: bf16 [\d.,]+ ±\d+% vs fp32 [\d.,]+ ±\d+% GFLOP/s"
    assert re.search(figures, err), err
    # measured, then cached: unless this moment was too noisy to be the machine's answer
    noisy = "too noisy to cache" in err
    assert (tmp_path / "cache" / "precision.json").is_file() is not noisy, err


def test_a_bad_dtype_is_refused_naming_the_choices(char_lm_run, capsys):
    for command in (["translate", "x"], ["chat"], ["generate"]):
        with pytest.raises(SystemExit):
            main([*command, "--model", str(char_lm_run), "--dtype", "fp16"])
        assert "--dtype: invalid choice: 'fp16'" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exit_:
        main(["generate", "--model", str(char_lm_run), "--dtype", "fp16"])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert (
        "--dtype: invalid choice: 'fp16' (choose from 'auto', 'fp32', 'bf16', 'int8', 'int4', "
        "'gguf', 'gguf-q8')" in err
    )


@pytest.mark.parametrize("bf16_gflops, warned", [(50.0, True), (300.0, False)])
def test_an_explicit_bf16_measured_slower_warns_with_both_figures(
    char_lm_run, capsys, monkeypatch, bf16_gflops, warned
):
    from glassformer.kernels import precision
    from glassformer.kernels.precision import Measurement

    measured = Measurement(fp32_gflops=100.0, bf16_gflops=bf16_gflops)
    monkeypatch.setattr(precision, "bf16_measurement", lambda shapes, device, **kw: measured)
    argv = ["generate", "--model", str(char_lm_run), "--prompt", "the ", "--max-new-tokens", "2"]
    assert main([*argv, "--dtype", "bf16", "--no-stream"]) == 0
    err = capsys.readouterr().err
    expected = "warning: --dtype bf16 is slower than fp32 here: bf16 50 ±0% vs fp32 100 ±0% GFLOP/s"
    assert (expected in err) is warned


@pytest.mark.parametrize("name", sorted(SUBCOMMANDS))
def test_every_subcommands_help_ends_with_an_example_that_parses(name, capsys):
    with pytest.raises(SystemExit):
        main([name, "--help"])
    help_text = capsys.readouterr().out.rstrip()
    last = help_text.splitlines()[-1].strip()
    assert help_text.splitlines()[-2] == "example:" and last == SUBCOMMANDS[name].EXAMPLE
    argv = shlex.split(last)
    assert argv[:2] == ["glassformer", name]
    assert build_parser().parse_args(argv[1:]).command == name  # its flags exist


def test_the_top_level_help_names_every_task_train_takes(capsys):
    from glassformer.training.tasks import BUILDERS

    with pytest.raises(SystemExit):
        main(["--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert all(f"({task})" in text for task in BUILDERS), (sorted(BUILDERS), text)
