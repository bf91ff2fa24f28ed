"""The README and the docs say nothing that is not there: every test they cite
(`tests/FILE.py::NAME`, and `::NAME` in the file named last before it) is a test function in
that file, and every glassformer import in their Python examples resolves."""

import importlib
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCUMENTS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


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


def test_every_test_the_readme_cites_exists():
    section = (ROOT / "README.md").read_text(encoding="utf-8").split("## What the tests prove")[1]
    assert len(cited_tests(section.split("\n## ", 1)[0])) > 30
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
