"""Clean/corrupted pairs for finding circuits: three classic tasks, or pairs of your own.

Each task is a set of prompts the model completes (the clean run) beside the same prompts
with the one thing the answer depends on changed (the corrupted run), tokenised for the
model at hand and checked to be of equal lengths:

- ``ioi_pairs``: indirect object identification (Wang et al., 2022). "When Mary and John
  went to the park, John gave a book to" → " Mary", against " John"; corrupted, the second
  mention of John is a third name (the "ABC" set), so nothing says who the object is.
  Metric: logit(IO) − logit(S).
- ``greater_than_pairs`` (Hanna, Liu and Variengien, 2023). "The war lasted from the year
  1732 to the year 17" → a year after 32; corrupted, the start year is ..01. Metric: the
  probability of the years after the start minus that of the years up to it. Where the
  tokenizer has a token for each two-digit number (GPT-2's) those are the years; where it
  writes numbers digit by digit (SmolLM2's, Llama's) the next token is the tens digit, and
  the metric is that of the tens digits above the start's minus those below it.
- ``capital_pairs``: "The capital of France is" → " Paris", against " Madrid" for the
  corrupted "The capital of Spain is" (countries of as many tokens, capitals whose first
  tokens differ). Metric: the logit difference of the two capitals' first tokens.
- ``pairs_from_csv``: a CSV with the columns clean, corrupt, answer, wrong (the metric is
  the logit difference of answer's and wrong's first tokens).

``Pairs.batches`` groups pairs of one length; ``Pairs.metric(rows, scale)`` is the metric of
those rows' logits.
"""

from __future__ import annotations

import csv
import io
import random
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from glassformer.inspect.patching import Metric

TASKS = ("ioi", "greater-than", "capitals")
MAX_CSV_BYTES = 16 * 1024 * 1024  # a pairs file larger than this is refused
MAX_PAIRS = 100_000


@dataclass(frozen=True)
class Pairs:
    """Prompts, their corrupted twins (token ids, equal lengths pair by pair) and, per pair,
    the tokens for and against the answer. ``measure``: ``"logit"`` (logit of the first
    answer − logit of the first wrong one) or ``"probability"`` (the sums of their
    probabilities), at the last position."""

    task: str
    clean: list[list[int]]
    corrupt: list[list[int]]
    answers: list[list[int]]
    wrongs: list[list[int]]
    texts: list[tuple[str, str]]
    measure: str = "logit"

    def __len__(self) -> int:
        return len(self.clean)

    def batches(self, size: int = 16) -> Iterator[tuple[list[int], Tensor, Tensor]]:
        """(rows, clean (b, T), corrupt (b, T)): pairs of one length, at most ``size``."""
        by_length: dict[int, list[int]] = {}
        for i, ids in enumerate(self.clean):
            by_length.setdefault(len(ids), []).append(i)
        for length in sorted(by_length):
            rows = by_length[length]
            for lo in range(0, len(rows), size):
                part = rows[lo : lo + size]
                yield (part, torch.tensor([self.clean[i] for i in part]),
                       torch.tensor([self.corrupt[i] for i in part]))  # fmt: skip

    def values(self, logits: Tensor, rows: list[int]) -> Tensor:
        """Each row's metric, (b,), from the logits (b, T, V) of a batch of those rows."""
        last = logits[:, -1].float()
        if self.measure == "probability":
            last = last.softmax(-1)
            return torch.stack([
                last[j, self.answers[i]].sum() - last[j, self.wrongs[i]].sum()
                for j, i in enumerate(rows)
            ])  # fmt: skip
        return torch.stack([
            last[j, self.answers[i][0]] - last[j, self.wrongs[i][0]] for j, i in enumerate(rows)
        ])  # fmt: skip

    def metric(self, rows: list[int], scale: float = 1.0) -> Metric:
        """A metric of those rows' logits: the sum of their values divided by ``scale``
        (the number of pairs: then the batches' metrics add up to the mean)."""

        def tensor(logits: Tensor) -> Tensor:
            return self.values(logits, rows).sum() / scale

        def metric(logits: Tensor) -> float:
            return float(tensor(logits).detach())

        metric.tensor = tensor  # type: ignore[attr-defined]
        return metric

    def subset(self, n: int) -> Pairs:
        return Pairs(self.task, self.clean[:n], self.corrupt[:n], self.answers[:n],
                     self.wrongs[:n], self.texts[:n], self.measure)  # fmt: skip


def task_pairs(task: str, tokenizer: Any, n: int = 100, seed: int = 0) -> Pairs:
    """One of ``TASKS`` by name."""
    makers = {"ioi": ioi_pairs, "greater-than": greater_than_pairs, "capitals": capital_pairs}
    if task not in makers:
        raise ValueError(f"task must be one of {', '.join(TASKS)}, got {task!r}")
    return makers[task](tokenizer, n=n, seed=seed)


# ---- IOI -----------------------------------------------------------------------------------

# fmt: off
NAMES = (
    "Mary", "John", "Alice", "Bob", "Sarah", "David", "Emma", "James", "Anna", "Michael",
    "Laura", "Paul", "Kate", "Peter", "Lucy", "Mark", "Susan", "Tom", "Helen", "George",
    "Rachel", "Daniel", "Linda", "Steven", "Karen", "Brian", "Julia", "Kevin", "Amy", "Jason",
    "Rose", "Eric", "Grace", "Adam", "Jane", "Robert", "Emily", "Frank", "Nancy", "Oscar",
)
# fmt: on
IOI_TEMPLATES = (
    "When {A} and {B} went to the park, {C} gave a book to",
    "After {A} and {B} arrived at the office, {C} handed a letter to",
    "While {A} and {B} were at the market, {C} sold an apple to",
    "Then {A} and {B} had lunch at the cafe. {C} passed the salt to",
    "Yesterday {A} and {B} went to the beach. {C} threw a ball to",
    "Once {A} and {B} visited the museum, {C} showed a painting to",
    "When {A} and {B} got to the party, {C} gave a present to",
    "After {A} and {B} finished the game, {C} sent a message to",
)


def ioi_pairs(tokenizer: Any, n: int = 100, seed: int = 0) -> Pairs:
    """``n`` IOI prompts over the templates, half naming the indirect object first (ABB),
    half second (BAB), with names of one token each."""
    names = [name for name in NAMES if len(tokenizer.encode(" " + name)) == 1]
    if len(names) < 3:
        raise ValueError("IOI needs names of one token each; this tokenizer has fewer than 3")
    rng = random.Random(seed)
    made = _Made("ioi")
    tries = 0
    while len(made) < n and tries < 20 * n:
        tries += 1
        template = IOI_TEMPLATES[tries % len(IOI_TEMPLATES)]
        io, s, c = rng.sample(names, 3)
        first, second = (io, s) if tries % 2 else (s, io)
        clean = template.format(A=first, B=second, C=s)
        corrupt = template.format(A=first, B=second, C=c)
        made.add(tokenizer, clean, corrupt, [" " + io], [" " + s])
    return made.pairs(n)


# ---- greater-than --------------------------------------------------------------------------

NOUNS = ("war", "siege", "drought", "strike", "voyage", "reign", "expedition", "famine",
         "occupation", "dispute")  # fmt: skip


def greater_than_pairs(tokenizer: Any, n: int = 100, seed: int = 0) -> Pairs:
    """``n`` greater-than prompts; see the module's docstring for the two tokenizations."""
    rng = random.Random(seed)
    made = _Made("greater-than", measure="probability")
    digits = _year_tokens(tokenizer)
    tries = 0
    while len(made) < n and tries < 20 * n:
        tries += 1
        century, year = rng.randint(11, 17), rng.randint(10, 89)
        prompt = "The {noun} lasted from the year {c}{yy} to the year {c}"
        noun = NOUNS[tries % len(NOUNS)]
        clean = prompt.format(noun=noun, c=century, yy=f"{year:02d}")
        corrupt = prompt.format(noun=noun, c=century, yy="01")
        if digits:  # the tens digit decides, except on a tie
            tens = year // 10
            after, before = [str(d) for d in range(tens + 1, 10)], [str(d) for d in range(tens)]
        else:
            after = [f"{y:02d}" for y in range(year + 1, 100)]
            before = [f"{y:02d}" for y in range(0, year + 1)]
        made.add(tokenizer, clean, corrupt, after, before, whole=True)
    return made.pairs(n)


def _year_tokens(tokenizer: Any) -> bool:
    """True where numbers are written digit by digit, False where two digits are one token;
    anything else is refused."""
    head = tokenizer.encode("The year 17")
    whole = tokenizer.encode("The year 1732")
    if whole[: len(head)] == head and len(whole) == len(head) + 1:
        return False
    if whole[: len(head)] == head and len(whole) == len(head) + 2:
        return True
    raise ValueError(
        "greater-than needs years written as '17' then two digits, as one token or two; "
        "this tokenizer splits '1732' another way"
    )


# ---- capitals ------------------------------------------------------------------------------

CAPITALS = {
    "France": "Paris", "Spain": "Madrid", "Italy": "Rome", "Germany": "Berlin",
    "Japan": "Tokyo", "Russia": "Moscow", "Egypt": "Cairo", "Greece": "Athens",
    "Austria": "Vienna", "Portugal": "Lisbon", "Poland": "Warsaw", "Ireland": "Dublin",
    "Norway": "Oslo", "Sweden": "Stockholm", "Finland": "Helsinki", "Denmark": "Copenhagen",
    "Hungary": "Budapest", "Kenya": "Nairobi", "Peru": "Lima", "Chile": "Santiago",
    "Canada": "Ottawa", "Australia": "Canberra", "China": "Beijing", "India": "Delhi",
    "Turkey": "Ankara", "Iran": "Tehran", "Cuba": "Havana", "Mexico": "Mexico City",
    "Argentina": "Buenos Aires", "Thailand": "Bangkok", "Vietnam": "Hanoi",
    "Belgium": "Brussels", "Netherlands": "Amsterdam", "Switzerland": "Bern",
}  # fmt: skip


def capital_pairs(tokenizer: Any, n: int = 100, seed: int = 0) -> Pairs:
    """Up to ``n`` pairs of countries of as many tokens whose capitals' first tokens differ."""
    rng = random.Random(seed)
    countries = sorted(CAPITALS)
    combos = [(a, b) for a in countries for b in countries if a != b]
    rng.shuffle(combos)
    made = _Made("capitals")
    for a, b in combos:
        if len(made) >= n:
            break
        made.add(tokenizer, f"The capital of {a} is", f"The capital of {b} is",
                 [" " + CAPITALS[a]], [" " + CAPITALS[b]])  # fmt: skip
    return made.pairs(n)


# ---- a CSV of your own ---------------------------------------------------------------------

COLUMNS = ("clean", "corrupt", "answer", "wrong")


def pairs_from_csv(path: str | Path, tokenizer: Any) -> Pairs:
    """Pairs from a CSV with a header naming the columns clean, corrupt, answer, wrong."""
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"{path} is not a file")
    if path.stat().st_size > MAX_CSV_BYTES:
        raise ValueError(f"{path} is larger than {MAX_CSV_BYTES // 2**20} MiB: not a pairs file")
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as err:
        raise ValueError(f"{path} is not UTF-8 text: {err.reason} at byte {err.start}") from None
    try:
        reader = csv.DictReader(io.StringIO(text))
        rows = list(reader)
    except csv.Error as err:
        raise ValueError(f"{path} is not a CSV file: {err}") from None
    header = list(reader.fieldnames or [])
    missing = [c for c in COLUMNS if c not in header]
    if missing:
        raise ValueError(
            f"{path} has no column {missing[0]!r}: a pairs file has the columns "
            f"{', '.join(COLUMNS)} (found {', '.join(str(h) for h in header) or 'none'})"
        )
    if len(rows) > MAX_PAIRS:
        raise ValueError(f"{path} has {len(rows)} rows; at most {MAX_PAIRS} pairs")
    made = _Made(path.stem)
    for number, row in enumerate(rows, start=2):  # the header is line 1
        values = [row.get(c) or "" for c in COLUMNS]
        if not all(values):
            empty = COLUMNS[values.index("")]
            raise ValueError(f"{path} line {number}: the column {empty!r} is empty")
        made.add(tokenizer, values[0], values[1], [values[2]], [values[3]],
                 strict=f"{path} line {number}")  # fmt: skip
    if not len(made):
        raise ValueError(f"{path} holds no pairs")
    return made.pairs(len(made))


class _Made:
    """Pairs as they are made: each tokenised and checked."""

    def __init__(self, task: str, measure: str = "logit") -> None:
        self.task, self.measure = task, measure
        self.rows: list[tuple[list[int], list[int], list[int], list[int], tuple[str, str]]] = []

    def __len__(self) -> int:
        return len(self.rows)

    def add(self, tokenizer: Any, clean: str, corrupt: str, answers: list[str],
            wrongs: list[str], *, whole: bool = False, strict: str = "") -> None:  # fmt: skip
        """Tokenise a pair; one whose lengths differ, or whose answer and wrong tokens
        are the same, is skipped (``strict``: refused, naming where it came from)."""
        a, b = tokenizer.encode(clean), tokenizer.encode(corrupt)
        yes = [_first(tokenizer, t, whole) for t in answers]
        no = [_first(tokenizer, t, whole) for t in wrongs]
        problem = ""
        if len(a) != len(b):
            problem = (f"the clean text is {len(a)} tokens and the corrupted {len(b)}: "
                       "a pair must have equal lengths")  # fmt: skip
        elif None in yes or None in no:
            problem = "an answer is not one token" if whole else "an answer is empty"
        elif set(yes) & set(no):
            problem = "the answer and the wrong answer begin with the same token"
        if problem and strict:
            raise ValueError(f"{strict}: {problem}")
        if not problem:
            self.rows.append((a, b, yes, no, (clean, corrupt)))  # type: ignore[arg-type]

    def pairs(self, n: int) -> Pairs:
        if not self.rows:
            raise ValueError(f"no {self.task} pair tokenises to equal lengths for this model")
        rows = self.rows[:n]
        return Pairs(self.task, [r[0] for r in rows], [r[1] for r in rows],
                     [r[2] for r in rows], [r[3] for r in rows], [r[4] for r in rows],
                     self.measure)  # fmt: skip


def _first(tokenizer: Any, text: str, whole: bool) -> int | None:
    """The first token of ``text`` (``whole``: its only token, else None)."""
    ids = tokenizer.encode(text)
    if not ids or (whole and len(ids) != 1):
        return None
    return int(ids[0])
