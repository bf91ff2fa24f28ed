"""The fuzzing harness itself (``fuzzing``): each kind of failure it must see is seen — a
reader that allocates past the cap, hangs, crashes, raises a traceback's type, a message
of two lines, an empty one or one naming no file, a cache that stops the command or warns
twice — and what loads or is refused in one line passes, with its memory measured.

Then the corpus: every input kept in ``tests/data/fuzz/corpus/<reader>/`` (regressions the
fuzzers found; see its README) is read again by its reader.
"""

from __future__ import annotations

import os
import shutil
import signal
import warnings
from pathlib import Path

import fuzzing
import pytest
from fuzzing import register, session

CORPUS = Path(__file__).parent / "data" / "fuzz" / "corpus"


def fine(case: Path) -> None:
    pass


def refuses(case: Path) -> None:
    raise ValueError(f"{case / 'x.json'}: the field 'n' is -1, expected a positive count")


def allocates(case: Path) -> None:
    block = bytearray(int(case.joinpath("bytes").read_text()))
    block[::4096] = b"x" * len(block[::4096])  # touched: resident, not only reserved


def hangs(case: Path) -> None:
    while True:
        pass


def crashes(case: Path) -> None:
    os.kill(os.getpid(), signal.SIGSEGV)


def raises_key_error(case: Path) -> None:
    raise KeyError("n")


def two_lines(case: Path) -> None:
    raise ValueError(f"{case}: bad\nvery bad")


def names_nothing(case: Path) -> None:
    raise ValueError("bad value")


def echoes_everything(case: Path) -> None:
    raise ValueError(f"{case}: bad value {'x' * 5000}")


def warns_twice(case: Path) -> None:
    warnings.warn("the cache is bad", stacklevel=1)
    warnings.warn("the cache is bad again", stacklevel=1)


def hides_memory_error(case: Path) -> None:
    try:
        bytearray(1 << 40)
    except MemoryError as e:
        raise ValueError(f"{case}: {e!r}") from None


READERS = {name: register(f"harness {name}", globals()[name]) for name in [
    "fine", "refuses", "allocates", "hangs", "crashes", "raises_key_error", "two_lines",
    "names_nothing", "echoes_everything", "hides_memory_error",
]}  # fmt: skip
CACHE_READERS = {
    name: register(f"harness cache {name}", globals()[name], may_refuse=False, max_warnings=1)
    for name in ("refuses", "warns_twice")
}


@pytest.fixture(scope="module")
def fuzzer(request, tmp_path_factory):
    return session(request, tmp_path_factory)


def _run(fuzzer, reader: str, **options) -> dict:
    folder = fuzzer.folder(reader)
    (folder / "case").mkdir()
    (folder / "case" / "bytes").write_text(str(options.pop("allocate", 0)))
    return fuzzer.server.run(reader, folder / "case", **options)


@pytest.mark.parametrize(
    "name, failure",
    [
        ("allocates", "over the memory cap"),
        ("hangs", "over the time cap"),
        ("crashes", "killed by SIGSEGV"),
        ("raises_key_error", "traceback: KeyError"),
        ("two_lines", "multi-line message (ValueError)"),
        ("names_nothing", "the message names no file"),
        ("echoes_everything", "a message of"),
        ("hides_memory_error", "over the memory cap"),
    ],
)
def test_each_kind_of_failure_is_seen(fuzzer, name, failure):
    result = _run(fuzzer, READERS[name], allocate=1 << 31, seconds=2, memory_mb=256)
    assert result["outcome"] == "failed" and result["failure"].startswith(failure), result


def test_a_cache_that_stops_the_command_or_warns_twice_fails(fuzzer):
    result = _run(fuzzer, CACHE_READERS["refuses"])
    assert result["failure"].startswith("a cache stopped the command"), result
    result = _run(fuzzer, CACHE_READERS["warns_twice"])
    assert result["failure"] == "2 warnings (a bad cache is bypassed with one)", result


def test_loads_and_one_line_refusals_pass_and_memory_is_measured(fuzzer):
    assert _run(fuzzer, READERS["fine"])["outcome"] == "loaded"
    refused = _run(fuzzer, READERS["refuses"])
    assert refused["outcome"] == "refused" and refused["where"] == "test_fuzz_harness.refuses"
    check = fuzzing.check_of(refused, Path(refused["message"].split(": ")[0]).parent)
    assert (
        check
        == "ValueError in test_fuzz_harness.refuses: <case>/x.json: the field '…' is N, "
        + ("expected a positive count")
    )
    big = _run(fuzzer, READERS["allocates"], allocate=200 << 20, memory_mb=512)
    assert big["outcome"] == "loaded", big
    assert 200 << 10 <= big["rss_kb"] - big["start_rss_kb"] < 300 << 10, big


def _corpus() -> list[Path]:
    return sorted(p for p in CORPUS.glob("*/*") if p.is_dir()) if CORPUS.is_dir() else []


@pytest.mark.parametrize("case", _corpus(), ids=lambda p: f"{p.parent.name}/{p.name}")
def test_the_corpus_loads_or_is_refused_in_one_line(fuzzer, case, tmp_path):
    """Each kept input (a copy: a reader may write beside it), by its reader."""
    import test_fuzz_caches  # noqa: F401  (each registers its readers)
    import test_fuzz_chat  # noqa: F401
    import test_fuzz_gguf  # noqa: F401
    import test_fuzz_json  # noqa: F401
    import test_fuzz_runs  # noqa: F401

    reader = case.parent.name.replace("-", " ")
    copy = Path(shutil.copytree(case, tmp_path / "case", symlinks=True))
    env = {"GLASSFORMER_CACHE": str(copy), "HOME": str(tmp_path), "TMPDIR": str(tmp_path)}
    result = fuzzer.server.run(reader, copy, env=env)
    said = f"{result.get('where')}: {result.get('message', '')[:300]!r}"
    assert result["outcome"] != "failed", f"{reader} {case.name}: {result['failure']} ({said})"
