"""The README and the docs (docs/**.md) say nothing that is not there: every test they cite
(`tests/FILE.py::NAME`, and `::NAME` in the file named last before it) is a test function in
that file, and every glassformer import in their Python examples resolves."""

import importlib
import re
import shlex

import pytest
from doc_pages import DOCUMENTS, ROOT, glassformer_commands


def cited_tests(text: str) -> list[tuple[str, str]]:
    cited, current = [], None
    for match in re.finditer(r"`(tests/[\w/]+\.py)?(?:::(\w+))?`", text):
        path, name = match.groups()
        if path:
            current = path
        if name:
            assert current is not None, f"::{name} is cited before any test file"
            cited.append((current, name))
    return cited


def glassformer_imports(text: str) -> list[str]:
    """The `import glassformer...` and `from glassformer... import ...` lines of the Python
    examples (``` python blocks and >>> lines), joined where parentheses continue them."""
    blocks = re.findall(r"```python\n(.*?)```", text, re.S)
    lines = [line for block in blocks for line in block.splitlines()]
    lines += [m for m in re.findall(r"^>>> (.*)$", text, re.M)]
    found = []
    for line in lines:
        line = line.split("#")[0].strip()
        if re.match(r"(from glassformer[\w.]* import |import glassformer)", line):
            found.append(line)
    return found


def test_every_test_the_docs_cite_exists():
    proofs = (ROOT / "docs" / "tests.md").read_text(encoding="utf-8")
    assert len(cited_tests(proofs)) > 30
    missing = []
    for document in DOCUMENTS:
        for path, name in cited_tests(document.read_text(encoding="utf-8")):
            source = (ROOT / path).read_text(encoding="utf-8") if (ROOT / path).is_file() else ""
            if not re.search(rf"^def {name}\(", source, re.MULTILINE):
                missing.append(f"{document.name}: {path}::{name}")
    assert not missing, f"the docs cite tests that do not exist: {missing}"


def test_every_glassformer_import_in_the_examples_resolves():
    imports = [line for d in DOCUMENTS for line in glassformer_imports(d.read_text("utf-8"))]
    assert len(imports) > 10
    if any("glassformer.keras" in line for line in imports):
        pytest.importorskip("keras")
    broken = []
    for line in imports:
        match = re.match(r"from (glassformer[\w.]*) import (.+)", line)
        if match is None:
            module = line.split()[1].split(" as ")[0]
            names: list[str] = []
        else:
            module, names = match[1], [n.split(" as ")[0].strip("() ") for n in match[2].split(",")]
        try:
            loaded = importlib.import_module(module)
        except ImportError as error:
            broken.append(f"{line}: {error}")
            continue
        broken += [f"{line}: no {n}" for n in names if n and not hasattr(loaded, n)]
    assert not broken, f"the examples import what does not exist: {broken}"


def readme_block(after: str, language: str) -> str:
    """The first ```language block of the README after the line that starts ``after``."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    return re.findall(rf"```{language}\n(.*?)```", text.split(after, 1)[1], re.S)[0]


def quick_start_commands() -> list[list[str]]:
    block = readme_block("Three commands", "bash")
    return [shlex.split(line)[1:] for line in block.splitlines() if line.startswith("glassformer ")]


def test_the_quick_start_commands_run(tmp_path, monkeypatch, capsys):
    """The README's three commands as written, but for the budget (3 steps, not 3 minutes)
    and the corpus: Jane Austen's novels come from Debian's archive on first use, so a
    text of hers stands in (the slow test below runs them exactly)."""
    from glassformer.cli import main

    monkeypatch.chdir(tmp_path)
    (tmp_path / "pride.txt").write_text(
        "It is a truth universally acknowledged, that a single man in possession of a good "
        "fortune, must be in want of a wife.\n" * 60
    )
    commands = quick_start_commands()
    assert [c[0] for c in commands] == ["train", "generate", "attention"]
    train = commands[0]
    i = train.index("--minutes")
    train[i : i + 2] = ["--max-steps", "3", "--threads", "1"]
    i = train.index("--corpus")
    train[i : i + 2] = ["--data", "pride.txt"]
    for command in commands:
        assert main(command) == 0, command
    assert (tmp_path / "runs" / "austen" / "checkpoint" / "model.safetensors").is_file()
    assert "<html" in (tmp_path / "austen.html").read_text(encoding="utf-8").lower()
    assert capsys.readouterr().out.count("It is a truth") >= 1


@pytest.mark.slow
@pytest.mark.network
def test_the_quick_start_commands_run_exactly_as_written(tmp_path, monkeypatch):
    from glassformer.cli import main

    monkeypatch.chdir(tmp_path)
    for command in quick_start_commands():
        assert main(command) == 0, command


def test_the_quick_start_python_prints_what_its_comments_say(capsys):
    pytest.importorskip("gguf", reason="SmolLM2 by name needs the gguf extra")
    code = readme_block("Ten lines of Python", "python")
    exec(compile(code, "README.md", "exec"), {})
    printed = capsys.readouterr().out.splitlines()
    said = [
        re.search(r"# (.*)$", line)[1] for line in code.splitlines() if line.startswith("print(")
    ]
    assert printed[0] == " Paris" and said[0] == '" Paris"'
    assert printed[1] == "torch.Size([1, 9, 5, 5])" and said[1].startswith("(1, 9, 5, 5)")
    assert said[2].startswith(f"{printed[2]} names")


def test_every_cited_test_file_exists():
    missing = []
    for document in DOCUMENTS:
        for path in re.findall(r"`(tests/[\w/]+\.py)", document.read_text(encoding="utf-8")):
            if not (ROOT / path).is_file():
                missing.append(f"{document.relative_to(ROOT)}: {path}")
    assert not missing, f"the docs cite test files that do not exist: {missing}"


def test_every_glassformer_command_in_the_docs_parses():
    """Each command the README and the docs show names a real subcommand and real flags
    (argparse accepts it), so a reader who types it is not refused for a flag that is gone.
    Placeholders (RUN, TEXT, ...) are values, which argparse takes as they are."""
    from glassformer.cli import build_parser

    parser = build_parser()
    refused = []
    checked = 0
    for document in DOCUMENTS:
        for command in glassformer_commands(document.read_text(encoding="utf-8")):
            if any(part in command for part in ("...", "|", "--help", "{")):
                continue  # an elided or piped command: not a whole command line
            try:
                argv = shlex.split(command)[1:]
            except ValueError:
                refused.append(f"{document.relative_to(ROOT)}: {command} (unbalanced quotes)")
                continue
            checked += 1
            try:
                parser.parse_args(argv)
            except SystemExit:
                refused.append(f"{document.relative_to(ROOT)}: {command}")
    assert checked > 50
    assert not refused, "commands the docs show that argparse refuses:\n" + "\n".join(refused)
