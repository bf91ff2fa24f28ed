"""The cache of prepared corpora: where it is (``cache_root``), and how a corpus folder
gets there whole (``prepared``): built beside its place, marked with a ``COMPLETE`` file
holding ``FORMAT``, then renamed into place. Each folder's ``about.json`` (``write_about``)
records where its text came from.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

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
