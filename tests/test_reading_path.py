"""tools/reading_path.py: the files a forward runs, counted whole. The readable GPT forward
(GPT-2's shape, fp32) stays within what issue 44 brought it to (9 files, 1,854 lines, from
13 and 2,862; the goal is 8 and 1,600) and none of its lines names a backend (GGUF, int8/int4,
C)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

ROOT = Path(__file__).parents[1]
spec = importlib.util.spec_from_file_location("reading_path", ROOT / "tools" / "reading_path.py")
assert spec and spec.loader
reading_path = importlib.util.module_from_spec(spec)
spec.loader.exec_module(reading_path)

MAX_FILES, MAX_LINES = 9, 1900  # lower them as the path shortens; never raise them


def test_the_gpt_forward_reads_few_files_and_none_about_a_backend():
    result = reading_path.report("gpt")
    files = [row["file"] for row in result["by_file"]]
    assert "glassformer/models/gpt.py" in files and "glassformer/modules/attention.py" in files
    assert result["backend_lines"] == 0, [r for r in result["by_file"] if r["backend_lines"]]
    assert result["files"] <= MAX_FILES, files
    assert result["lines"] <= MAX_LINES, result["by_file"]
    assert not any(file.startswith("glassformer/kernels/") for file in files)


def test_only_the_files_a_step_runs_are_counted():
    """A function called from one file: that file alone, counted whole."""
    import glassformer.modules.sdpa as masks

    files = reading_path.files_run(lambda: masks.causal_mask(3, 3))
    assert files == [Path(masks.__file__).resolve()]
