"""What ``make lint`` enforces fails where it should, naming the offender: a file over 400
lines, a function over 60 lines of code (tools/check_sizes.py), a private member used from
outside its object (ruff's SLF001, selected in pyproject.toml), the import contracts (the
rooms' layers; modules/ importing nothing outside itself) and a textbook naming no backend."""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).parents[1]


def tool(name: str) -> ModuleType:
    """The module ``tools/<name>.py`` (tools/ is not a package)."""
    spec = importlib.util.spec_from_file_location(name, ROOT / "tools" / f"{name}.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


check_sizes = tool("check_sizes")


def function(name: str, lines: int, *, docstring: int = 0, comments: int = 0) -> str:
    body = ['    """' + "\n    ".join(["doc"] * max(docstring, 1)) + '"""'] if docstring else []
    body += ["    # a comment"] * comments + [""] * 2
    body += [f"    x{i} = {i}" for i in range(lines - 1)] + ["    return x0"]
    return f"def {name}():\n" + "\n".join(body) + "\n"


def test_a_function_over_60_lines_of_code_is_named(tmp_path, capsys):
    (tmp_path / "ok.py").write_text(function("fits", 60, docstring=30, comments=20))
    assert check_sizes.main([str(tmp_path)]) == 0
    (tmp_path / "long.py").write_text(function("too_long", 61))
    assert check_sizes.main([str(tmp_path)]) == 1
    err = capsys.readouterr().err
    assert "long.py:1: too_long has 61 lines of code (at most 60)" in err and "fits" not in err


def test_a_file_over_400_lines_is_named(tmp_path, capsys):
    (tmp_path / "big.py").write_text("x = 1\n" * 401)
    assert check_sizes.main([str(tmp_path)]) == 1
    assert "big.py: 401 lines (at most 400)" in capsys.readouterr().err


def test_nested_functions_count_in_the_one_that_holds_them(tmp_path, capsys):
    inner = function("inner", 40).replace("\n", "\n    ")
    (tmp_path / "nest.py").write_text("def outer():\n    " + inner + "\n    x = 1\n" * 25)
    assert check_sizes.main([str(tmp_path)]) == 1
    assert "outer has" in capsys.readouterr().err


def test_the_package_keeps_to_the_limits(capsys):
    assert check_sizes.main([str(ROOT / "src")]) == 0, capsys.readouterr().err


RUFF = shutil.which("ruff", path=str(Path(sys.executable).parent)) or shutil.which("ruff")


@pytest.mark.skipif(RUFF is None, reason="ruff is not installed (the dev extra)")
def test_a_private_member_used_from_outside_fails_ruff(tmp_path):
    ruff = str(RUFF)
    file = tmp_path / "reach.py"
    file.write_text(
        "def f(layer):\n    return layer._in(1)\n\n\ndef g(self):\n    return self._in\n"
    )
    done = subprocess.run(
        [ruff, "check", "--config", str(ROOT / "pyproject.toml"), "--no-cache", str(file)],
        capture_output=True, text=True,
    )  # fmt: skip
    assert done.returncode == 1
    assert (
        "SLF001" in done.stdout
        and "reach.py:2:" in done.stdout
        and "reach.py:6:" not in done.stdout
    )


reading_path = tool("reading_path")
BACKEND = reading_path.BACKEND_WORDS  # a line about a backend, as the reading path counts it


def test_the_textbook_names_no_backend():
    """modules/ holds the textbook: no line of it names GGUF, int8/int4, quantisation or C
    (those live in glassformer/kernels/)."""
    modules = ROOT / "src" / "glassformer" / "modules"
    offenders = [
        f"{path.name}:{number}: {line.strip()}"
        for path in sorted(modules.glob("*.py"))
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if BACKEND.search(line)
    ]
    assert offenders == []


LINT_IMPORTS = shutil.which("lint-imports", path=str(Path(sys.executable).parent))


@pytest.mark.skipif(LINT_IMPORTS is None, reason="import-linter is not installed (the dev extra)")
@pytest.mark.parametrize(
    ("module", "line", "contract"),
    [
        ("modules/norms.py", "import glassformer.kernels.quantized", "Layers"),
        ("modules/norms.py", "import glassformer.cache", "The textbook imports nothing"),
        ("modules/norms.py", "import glassformer.data.files", "The textbook imports nothing"),
        ("kernels/quantized.py", "import glassformer.models.gpt", "Layers"),
    ],
)
def test_an_import_across_the_rooms_breaks_a_contract(tmp_path, module, line, contract):
    """A copy of the package with one import added: lint-imports fails and names the
    contract (and passes on the copy as it was)."""
    shutil.copytree(ROOT / "src" / "glassformer", tmp_path / "glassformer")
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    command = [str(LINT_IMPORTS), "--no-cache", "--config", str(tmp_path / "pyproject.toml")]
    env = {**os.environ, "PYTHONPATH": str(tmp_path)}
    clean = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True)
    assert clean.returncode == 0, clean.stdout
    target = tmp_path / "glassformer" / module
    target.write_text(target.read_text().replace("import torch\n", f"import torch\n{line}\n", 1))
    broken = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True)
    assert broken.returncode == 1, broken.stdout
    assert f"{contract}" in broken.stdout and "BROKEN" in broken.stdout


check_seams = tool("check_seams")


def test_the_package_keeps_to_its_seam_limits(capsys):
    assert check_seams.main([str(ROOT / "src" / "glassformer")]) == 0, capsys.readouterr().err


@pytest.mark.parametrize(
    ("where", "code", "rule"),
    [
        ("models/family.py", "def f(c):\n    return getattr(c, 'theta', 1)\n", "config-getattr"),
        ("models/family.py", "def f(s):\n    return getattr(s.config, 'b', 1)\n", "config-getattr"),
        ("viz/page.py", "from typing import Any\n\n\ndef f(model: Any):\n    pass\n", "model-any"),
        ("kernels/swap.py", "def f(model):\n    model.inference_dtype = 'bf16'\n", "model-writes"),
        ("kernels/swap.py", "def f(model):\n    setattr(model, 'x', 1)\n", "model-writes"),
        ("generation/step.py", "def f(model):\n    model.__dict__['step'] = 1\n", "model-writes"),
    ],
)  # fmt: skip
def test_each_seam_rule_counts_what_it_names(tmp_path, capsys, where, code, rule):
    """One offender in an otherwise empty package: over a limit of 0, named with its line;
    within a limit of 1."""
    (tmp_path / where).parent.mkdir(parents=True)
    (tmp_path / where).write_text(code)
    zero = [f"--max-{name}=0" for name in check_seams.LIMITS]
    assert check_seams.main([str(tmp_path), *zero]) == 1
    err = capsys.readouterr().err
    assert f"{rule}: 1 (at most 0" in err and f"{where}:" in err
    assert check_seams.main([str(tmp_path), *zero, f"--max-{rule}=1"]) == 0


def test_getattr_of_other_objects_and_writes_inside_models_are_not_counted(tmp_path, capsys):
    (tmp_path / "models").mkdir()
    (tmp_path / "models" / "gpt.py").write_text(
        "def f(model, layer):\n    model.x = getattr(layer, 'bias', None)\n"
    )
    zero = [f"--max-{name}=0" for name in check_seams.LIMITS]
    assert check_seams.main([str(tmp_path), *zero]) == 0, capsys.readouterr().err
