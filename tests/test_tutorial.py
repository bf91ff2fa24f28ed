"""docs/tutorial.md runs: every >>> line executes and prints exactly what the page shows."""

import doctest
from pathlib import Path

TUTORIAL = Path(__file__).resolve().parents[1] / "docs" / "tutorial.md"


def test_the_tutorial_runs_and_prints_what_it_says():
    result = doctest.testfile(
        str(TUTORIAL),
        module_relative=False,
        optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE,
        verbose=False,
    )
    assert result.attempted > 40
    assert result.failed == 0, f"{result.failed} of {result.attempted} tutorial examples failed"
