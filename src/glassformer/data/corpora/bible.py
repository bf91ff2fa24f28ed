"""The bible-en-es corpus (translate): English-Spanish Bible verse pairs, King James 1769 /
Reina-Valera 1909, from the Debian packages `sword-text-kjv` and `sword-text-sparv` (SWORD
modules, read with ``glassformer.data.corpora.sword``), paired verse by verse by ``align_verses``
and split by a seeded shuffle (see the package notes, ``glassformer.data.corpora``).
"""

from __future__ import annotations

import csv
import shutil
from collections import Counter
from pathlib import Path

from glassformer.cache import prepared, read_about, write_about
from glassformer.data.corpora._fetch import debian_files, package_version
from glassformer.data.corpora._splits import Splits, seeded_shuffle
from glassformer.data.corpora.sword import (
    VerseKey,
    open_module,
    plain_text,
    read_verses,
    strongs_numbers,
)

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


def load(root: Path, task: str) -> Splits:
    """The bible-en-es splits under cache ``root`` (fetched first if need be).

    Args:
        root: the cache folder.
        task: ``"translate"``, the only task this corpus serves: each split is a list of
            (English, Spanish) pairs.
    """
    folder = prepared(root, "bible-en-es", _build)
    with open(folder / "pairs.tsv", encoding="utf-8", newline="") as f:
        rows = [(en, es) for _, en, es in csv.reader(f, delimiter="\t")]
    order = seeded_shuffle(list(range(len(rows))))
    test, validation = set(order[:BIBLE_HELD_OUT]), set(order[BIBLE_HELD_OUT : 2 * BIBLE_HELD_OUT])
    splits: tuple[list, list, list] = ([], [], [])  # train, validation, test
    for i, row in enumerate(rows):
        splits[1 if i in validation else 2 if i in test else 0].append(row)
    about = read_about(folder)
    description = (
        f"bible-en-es: {len(rows):,} verse pairs, King James 1769 -> Reina-Valera 1909 "
        f"(Debian {', '.join(about['packages'])}, public domain), "
        f"{len(splits[0]):,} / {len(splits[1]):,} / {len(splits[2]):,} train / validation / test"
    )
    return Splits(*splits, description)


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


def _jaccard(a: frozenset[str], b: frozenset[str]) -> float:
    return len(a & b) / len(a | b) if a or b else 0.0


def _build(work: Path) -> None:
    confs = [f"usr/share/sword/mods.d/{module}.conf" for module in BIBLE_MODULES.values()]
    root = debian_files(list(BIBLE_MODULES), confs, work, "translate")
    english, spanish = (read_verses(open_module(root / conf)) for conf in confs)
    pairs, counts = align_verses(english, spanish)
    with open(work / "pairs.tsv", "w", encoding="utf-8", newline="") as f:
        writer = csv.writer(f, delimiter="\t")
        writer.writerows((f"{b}.{c}.{v}", en, es) for (b, c, v), en, es in pairs)
    versions = [f"{p} {package_version(root, p)}" for p in BIBLE_MODULES]
    write_about(work, packages=versions, **counts)
    shutil.rmtree(work / "debs", ignore_errors=True)
    shutil.rmtree(work / "root", ignore_errors=True)
