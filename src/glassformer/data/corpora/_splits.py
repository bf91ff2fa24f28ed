"""What loading a corpus gives (``Splits``), and the seed that fixes every split.

The splits are the same on every machine: where a corpus is shuffled to pick its held-out
parts, the shuffle is seeded with ``SEED`` (see ``seeded_shuffle``).
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any

SEED = 1729  # fixes every split of every corpus; changing it changes every published figure


@dataclass(frozen=True)
class Splits:
    """One corpus split three ways, and a one-line description (source, licence, sizes)."""

    train: Any
    validation: Any
    test: Any
    description: str


def seeded_shuffle(items: list[Any], salt: str = "") -> list[Any]:
    """A shuffled copy of ``items``, the same on every machine.

    Args:
        items: what to shuffle (left as it is).
        salt: added to ``SEED``, for independent shuffles of different lists.
    """
    items = list(items)
    random.Random(f"{SEED}{salt}").shuffle(items)
    return items
