"""The tutorial (docs/tutorial/, its chapters in order, as one session) runs: every >>> line
executes and prints exactly what the page shows, and every chapter ends with exercises whose
solutions are run the same way."""

import doctest
import re
from pathlib import Path

TUTORIAL = Path(__file__).resolve().parents[1] / "docs" / "tutorial"
CHAPTERS = [TUTORIAL / "index.md", *sorted(TUTORIAL.glob("[0-9][0-9]-*.md"))]


def test_the_tutorial_runs_and_prints_what_it_says():
    text = "\n".join(chapter.read_text(encoding="utf-8") for chapter in CHAPTERS)
    test = doctest.DocTestParser().get_doctest(text, {}, "tutorial", str(TUTORIAL), 0)
    runner = doctest.DocTestRunner(
        optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE, verbose=False
    )
    result = runner.run(test)
    assert result.attempted > 60
    assert result.failed == 0, f"{result.failed} of {result.attempted} tutorial examples failed"


def test_every_chapter_ends_with_exercises_and_their_checked_solutions():
    assert len(CHAPTERS) == 8
    for chapter in CHAPTERS[1:]:
        text = chapter.read_text(encoding="utf-8")
        assert "\n## Exercises\n" in text, chapter.name
        exercises = text.split("\n## Exercises\n", 1)[1]
        solutions = re.findall(r'\?\?\? success "Solution', exercises)
        assert len(solutions) >= 2, chapter.name
        assert exercises.count(">>> ") >= 3, chapter.name  # the solutions are run
