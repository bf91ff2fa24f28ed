"""The README's "What the tests prove" names real tests: every `tests/FILE.py::NAME` (and
`::NAME`, in the file named last before it) is a test function in that file."""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def cited_tests() -> list[tuple[str, str]]:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    section = text.split("## What the tests prove", 1)[1].split("\n## ", 1)[0]
    cited, current = [], None
    for match in re.finditer(r"`(tests/[\w/]+\.py)?(?:::(\w+))?`", section):
        path, name = match.groups()
        if path:
            current = path
        if name:
            assert current is not None, f"::{name} is cited before any test file"
            cited.append((current, name))
    return cited


def test_every_test_the_readme_cites_exists():
    cited = cited_tests()
    assert len(cited) > 30
    missing = []
    for path, name in cited:
        source = (ROOT / path).read_text(encoding="utf-8")
        if not re.search(rf"^def {name}\(", source, re.MULTILINE):
            missing.append(f"{path}::{name}")
    assert not missing, f"the README cites tests that do not exist: {missing}"
