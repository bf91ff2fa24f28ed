"""The austen corpus (lm): Jane Austen's six novels, about 4 M characters, from the Debian
package `r-cran-janeaustenr` (an R lazy-load database, read with ``rdata`` beside this
module), each novel cut into train, validation and test by ``split_text``.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from glassformer.cache import prepared, read_about, write_about
from glassformer.data.corpora._fetch import debian_files, package_version
from glassformer.data.corpora._splits import Splits
from glassformer.data.corpora.rdata import read_lazyload_db

AUSTEN_PACKAGE = "r-cran-janeaustenr"
AUSTEN_DATA = "usr/lib/R/site-library/janeaustenr/data"  # an R lazy-load database, Rdata.rd[bx]
AUSTEN_BOOKS = (  # the package's object names, in order of publication
    "sensesensibility",
    "prideprejudice",
    "mansfieldpark",
    "emma",
    "northangerabbey",
    "persuasion",
)
AUSTEN_CUTS = (0.90, 0.95)  # train up to 90% of each novel, validation to 95%, test the rest


def load(root: Path, task: str) -> Splits:
    """The austen splits under cache ``root`` (fetched first if need be): one string each.

    Args:
        root: the cache folder.
        task: ``"lm"``, the only task this corpus serves.
    """
    folder = prepared(root, "austen", _build)
    parts = [
        split_text((folder / f"{name}.txt").read_text(encoding="utf-8"), AUSTEN_CUTS)
        for name in AUSTEN_BOOKS
    ]
    train, validation, test = ("\n".join(book[i] for book in parts) for i in range(3))
    total = sum(len(part) for book in parts for part in book)
    description = (
        f"austen: Jane Austen's six novels (Debian {read_about(folder)['package']}, public "
        f"domain text, MIT packaging), {total:,} characters, {len(train):,} / "
        f"{len(validation):,} / {len(test):,} train / validation / test"
    )
    return Splits(train, validation, test, description)


def cut_at_line(text: str, fraction: float) -> int:
    """Where the first line that starts at or after ``fraction`` of ``text`` starts."""
    at = int(len(text) * fraction)
    if at == 0:
        return 0
    end_of_line = text.find("\n", at - 1)  # the line break ending the line ``at`` is on
    return len(text) if end_of_line == -1 else end_of_line + 1


def split_text(text: str, cuts: tuple[float, float]) -> tuple[str, str, str]:
    """(train, validation, test) parts of one text, cut at line breaks after ``cuts``."""
    a, b = cut_at_line(text, cuts[0]), cut_at_line(text, cuts[1])
    return text[:a], text[a:b], text[b:]


def _build(work: Path) -> None:
    wanted = [f"{AUSTEN_DATA}/Rdata.rdx", f"{AUSTEN_DATA}/Rdata.rdb"]
    root = debian_files([AUSTEN_PACKAGE], wanted, work, "lm")
    data = root / AUSTEN_DATA
    novels = read_lazyload_db(data / "Rdata.rdx", data / "Rdata.rdb")
    for name in AUSTEN_BOOKS:
        lines = novels[name]  # a character vector: one element a line, NA for none
        text = "\n".join(line or "" for line in lines).strip("\n") + "\n"
        (work / f"{name}.txt").write_text(text, encoding="utf-8")
    write_about(work, package=f"{AUSTEN_PACKAGE} {package_version(root, AUSTEN_PACKAGE)}")
    shutil.rmtree(work / "debs", ignore_errors=True)
    shutil.rmtree(work / "root", ignore_errors=True)
