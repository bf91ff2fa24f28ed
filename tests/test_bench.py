"""`glassformer bench`: runs the benchmark scripts in turn; every script answers --help."""

import subprocess
import sys
from pathlib import Path

import pytest

from glassformer.cli import main
from glassformer.cli.bench import SCRIPTS

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


@pytest.mark.parametrize("script", sorted(s for s in SCRIPTS.values() if s))
def test_every_benchmark_script_imports_and_has_help(script):
    result = subprocess.run(
        [sys.executable, str(BENCHMARKS / script), "--help"], capture_output=True, text=True
    )
    assert result.returncode == 0, result.stderr
    assert "usage:" in result.stdout


def test_bench_runs_the_named_scripts_with_the_options(tmp_path, capfd):
    for script in ("attention.py", "gpt_train.py"):
        (tmp_path / script).write_text("import sys\nprint('ran', sys.argv[1:])\n")
    argv = ["bench", "attention", "gpt-train", "--benchmarks", str(tmp_path), "--repeats", "2"]
    assert main([*argv, "--nanogpt", str(tmp_path)]) == 0
    out = capfd.readouterr().out
    assert "ran ['--repeats', '2']" in out
    assert f"ran ['--nanogpt', '{tmp_path}', '--repeats', '2']" in out


def test_bench_scaling_gets_its_out_folder(tmp_path, capfd):
    (tmp_path / "attention.py").write_text("")
    (tmp_path / "scaling.py").write_text("import sys\nprint('ran', sys.argv[1:])\n")
    assert main(["bench", "scaling", "--benchmarks", str(tmp_path), "--out", "here"]) == 0
    assert "ran ['--out', 'here']" in capfd.readouterr().out


def test_bench_smollm2_gets_the_llama_cpp_python(tmp_path, capfd):
    (tmp_path / "attention.py").write_text("")
    (tmp_path / "smollm2.py").write_text("import sys\nprint('ran', sys.argv[1:])\n")
    argv = ["bench", "smollm2", "--benchmarks", str(tmp_path), "--llama-cpp", "/venv/bin/python"]
    assert main(argv) == 0
    assert "ran ['--llama-cpp', '/venv/bin/python']" in capfd.readouterr().out


def test_a_failing_benchmark_makes_bench_fail(tmp_path, capfd):
    (tmp_path / "attention.py").write_text("raise SystemExit(3)\n")
    assert main(["bench", "attention", "--benchmarks", str(tmp_path)]) == 1
    assert "failed: attention" in capfd.readouterr().err


@pytest.mark.parametrize(
    "argv, message",
    [
        (["bench", "speedy"], "unknown benchmark 'speedy'; known: attention"),
        (["bench", "--repeats", "0"], "--repeats must be a positive integer, got 0"),
        (["bench", "nanogpt-lm"], "nanogpt-lm needs --nanogpt PATH"),
        (["bench", "--nanogpt", "no/such/dir"], "--nanogpt no/such/dir: no such directory"),
        (["bench", "--benchmarks", "elsewhere"], "no benchmarks in elsewhere"),
    ],
)
def test_user_errors_are_one_line(argv, message, capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message in err


def test_bench_llama_cpp_needs_a_llama_cpp_python_and_passes_it_on(tmp_path, capfd):
    assert main(["bench", "llama-cpp"]) == 2
    assert "llama-cpp needs --llama-cpp PYTHON" in capfd.readouterr().err
    (tmp_path / "attention.py").write_text("")
    (tmp_path / "vs_llama_cpp.py").write_text("import sys\nprint('ran', sys.argv[1:])\n")
    argv = ["bench", "llama-cpp", "--benchmarks", str(tmp_path), "--llama-cpp", "/py"]
    assert main([*argv, "--llama-perplexity", "/bin/ppl"]) == 0
    assert "ran ['--llama-cpp', '/py', '--llama-perplexity', '/bin/ppl']" in capfd.readouterr().out
