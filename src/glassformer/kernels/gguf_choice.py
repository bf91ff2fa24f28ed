"""A GGUF product's choice that differs between CPUs, measured on this one: from how many
rows of input to stop multiplying from the rows interleaved and decode the weight instead.

A prompt's rows are multiplied either from a layer's rows interleaved 16 at a time
(``csrc/gguf.c``: integers under ``gguf-q8``, fp32 multiply-adds exact) or by decoding the
weight a tile at a time into PyTorch's fp32 GEMM. Which is faster at a given count of rows
is the machine's: its integer against its fp32 throughput, the width its vectors execute at
(a Zen 4 runs AVX-512 as two 256-bit halves), its caches. On a 2-core Intel Xeon, a SmolLM2
forward of 512 rows took 790 ms interleaved against 911 decoded under ``gguf-q8``, and
1,639 against 834 exact. So the count is measured at first use, not fixed for one chip:

- per block type (a 5-bit type's rows cost more than a 4-bit one's), a product of SmolLM2's
  MLP shape (1,536 × 576) in that type, each count of ``CANDIDATES`` rows timed both ways in
  interleaved rounds, each figure the fastest tenth of its rounds, with its spread
  (``kernels.precision``'s method: other work only ever slows a round down);
- the choice: the fewest candidate rows from which decoding is faster at that count and at
  every larger one; None where the interleaved rows are faster at the largest;
- trusted only when every spread is at most ``MAX_SPREAD``, else measured again
  (``ATTEMPTS`` in all); an untrusted measurement serves this run only, never cached;
- cached in the cache folder's ``kernels.json`` per processor, threads, torch, C source and
  type, for ``EXPIRES_DAYS`` days; ``glassformer bench kernels --refresh`` measures again.

``GLASSFORMER_MANY_ROWS`` (a count of rows, or ``never``) forces the choice, unmeasured and
uncached: the test suite does, so that its products do not depend on this machine's timing.
"""

from __future__ import annotations

import functools
import hashlib
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from glassformer.cache import cache_root
from glassformer.kernels.gguf_blocks import BLOCK_BYTES, BLOCK_VALUES, NAMES, Q4_1, Q4_K, Q5_1, Q6_K
from glassformer.kernels.gguf_kernels import SOURCE
from glassformer.kernels.precision import (
    ATTEMPTS,
    EXPIRES_DAYS,
    MAX_SPREAD,
    MIN_ROUNDS,
    fastest_tenth,
)
from glassformer.kernels.precision_cache import processor, read_cache, write_cache

CACHE_FILE = "kernels.json"
FORCE_ENV = "GLASSFORMER_MANY_ROWS"  # a count of rows, or "never": forced, unmeasured
CANDIDATES = (72, 96, 128, 192, 256, 384, 512)  # 72: ``gguf_linear.MANY_ROWS``
OUT, IN = 1536, 576  # SmolLM2's gate/up: a product of its shape (a K-quant's: the down's)
HOWS = ("interleaved", "decoded")
SCALES = {Q4_1: (0, 2), Q5_1: (0, 2), Q4_K: (0, 2), Q6_K: (208,)}  # fp16 fields; else d at 0

_CHOSEN: dict[tuple[int, bool], int | None] = {}  # this process's, per type and precision


@dataclass(frozen=True)
class Crossover:
    """A measurement: per candidate count of rows, the fastest tenth of a product's time from
    the interleaved rows and from the weight decoded (seconds), and the choice they make."""

    interleaved_s: tuple[float, ...]
    decoded_s: tuple[float, ...]
    spread: float  # the largest interquartile range over median of any figure
    measured_at: int = 0
    trusted: bool = True  # spreads within MAX_SPREAD (not stored: a cached one was)

    @property
    def rows(self) -> int | None:
        """From this many rows the weight is decoded; None: never."""
        chosen = None
        for count, rows, decoded in reversed(
            list(zip(CANDIDATES, self.interleaved_s, self.decoded_s, strict=True))
        ):
            if decoded >= rows:
                break
            chosen = count
        return chosen

    def describe(self) -> str:
        choice = f"from {self.rows} rows" if self.rows else "never (up to 512 rows measured)"
        times = ", ".join(
            f"{count}: {a * 1e3:.2f}/{b * 1e3:.2f}"
            for count, a, b in zip(CANDIDATES, self.interleaved_s, self.decoded_s, strict=True)
        )
        said = f"weight decoded {choice}; ms interleaved/decoded at {times}"
        said += f"; spread {self.spread:.0%}"
        return said if self.trusted else said + "; too noisy to cache"

    def stored(self) -> dict[str, Any]:
        return {
            "interleaved_s": list(self.interleaved_s),
            "decoded_s": list(self.decoded_s),
            "spread": self.spread,
            "measured_at": self.measured_at,
        }


def many_rows(kind: int, rounded: bool) -> int | None:
    """From how many rows of input a product of interleaved rows of type ``kind`` decodes its
    weight instead (None: never), under ``rounded`` (``gguf-q8``) or exact: forced by
    ``FORCE_ENV``, else this machine's measurement (once a process; cached)."""
    forced = os.environ.get(FORCE_ENV)
    if forced:
        return _forced(forced)
    if (kind, rounded) not in _CHOSEN:
        _CHOSEN[kind, rounded] = crossover(kind, rounded).rows
    return _CHOSEN[kind, rounded]


def _forced(value: str) -> int | None:
    if value == "never":
        return None
    if value.isdigit() and int(value) >= 1:
        return int(value)
    raise ValueError(f"{FORCE_ENV}={value!r}: expected a count of rows (1 or more) or 'never'")


def crossover(
    kind: int, rounded: bool, cache_dir: str | Path | None = None, refresh: bool = False
) -> Crossover:
    """This machine's measurement for type ``kind``'s ``rounded`` or exact products: the cached
    one, unless ``refresh``, it has expired or it cannot be read; else measured (and cached
    if trusted)."""
    path = cache_root(cache_dir) / CACHE_FILE
    key = cache_key(kind, rounded)
    if not refresh:
        known = _entry(read_cache(path).get(key))
        if known is not None and time.time() - known.measured_at < EXPIRES_DAYS * 86400:
            return known
    best: Crossover | None = None
    for _ in range(ATTEMPTS):
        measured = _measure(kind, rounded)
        if measured.trusted:
            entries = read_cache(path, warn=False)
            entries[key] = measured.stored()
            write_cache(path, entries)
            return measured
        if best is None or measured.spread < best.spread:
            best = measured
    assert best is not None
    return best


@functools.cache
def _source() -> str:
    """The C source's hash, read once a process."""
    return hashlib.sha256(SOURCE.read_bytes()).hexdigest()[:12]


def cache_key(kind: int, rounded: bool) -> str:
    source = _source()
    precision = "gguf-q8" if rounded else "gguf"
    where = f"{processor()}, {torch.get_num_threads()} threads"
    return f"{where}; torch {torch.__version__}; gguf.c {source}; {NAMES[kind]} {precision}"


def cached(cache_dir: str | Path | None = None) -> list[tuple[str, Crossover | str]]:
    """Every entry of the cache file: its key, and its measurement or why it is unusable."""
    path = cache_root(cache_dir) / CACHE_FILE
    return [(key, _entry(entry) or "unreadable") for key, entry in read_cache(path).items()]


def _entry(entry: Any) -> Crossover | None:
    """A cached entry as a measurement, or None where it is not one (a hand-edited or
    hostile file is measured again, never trusted)."""
    if not isinstance(entry, dict):
        return None
    times = [entry.get(name) for name in ("interleaved_s", "decoded_s")]
    numbers = [entry.get(name) for name in ("spread", "measured_at")]
    lists = [t for t in times if isinstance(t, list) and len(t) == len(CANDIDATES)]
    values = [v for t in lists for v in t] + numbers
    if len(lists) != 2 or not all(type(v) in (int, float) and 0 <= v < 1e12 for v in values):
        return None
    interleaved, decoded = (tuple(float(v) for v in t) for t in lists)
    spread, at = float(numbers[0]), int(numbers[1])  # type: ignore[arg-type]  # checked above
    if spread > MAX_SPREAD or at > time.time() + 60:  # noisy, or written in the future
        return None
    return Crossover(interleaved, decoded, spread, at)


def _measure(kind: int, rounded: bool) -> Crossover:
    """Interleaved rounds, at least ``MIN_ROUNDS`` of each way: per count of rows, each
    way's fastest tenth, and the largest spread."""
    one_round = _round_timer(kind, rounded)
    for how in HOWS:  # warm-up: memory touched, threads started
        one_round(how)
    rounds: dict[str, list[list[float]]] = {how: [] for how in HOWS}
    for _ in range(MIN_ROUNDS):
        for how in HOWS:
            rounds[how].append(one_round(how))
    figures = {
        how: [fastest_tenth([r[i] for r in rounds[how]]) for i in range(len(CANDIDATES))]
        for how in HOWS
    }
    spread = max(s for how in HOWS for _, s in figures[how])
    return Crossover(
        interleaved_s=tuple(f for f, _ in figures["interleaved"]),
        decoded_s=tuple(f for f, _ in figures["decoded"]),
        spread=round(spread, 3),
        measured_at=round(time.time()),
        trusted=spread <= MAX_SPREAD,
    )


def _round_timer(kind: int, rounded: bool) -> Callable[[str], list[float]]:
    """A function timing one round of products one way ("interleaved" or "decoded"): one
    product per candidate count of rows, each time in seconds; operands made once."""
    from glassformer.kernels.gguf_linear import GGUFLinear, _from_decoded, _from_rows

    generator = torch.Generator().manual_seed(0)
    scale = torch.tensor([0.01], dtype=torch.float16).view(torch.uint8)
    out, k = (OUT, IN) if BLOCK_VALUES[kind] == 32 else (IN, OUT)  # a K-quant: the down's
    shape = (out, k // BLOCK_VALUES[kind], BLOCK_BYTES[kind])
    blocks = torch.randint(0, 256, shape, dtype=torch.uint8, generator=generator)
    for at in SCALES.get(kind, (0,)):  # d (and m, dmin): small, finite
        blocks[..., at : at + 2] = scale
    layer = GGUFLinear([(kind, blocks.reshape(out, -1))], k, rounded=rounded)
    if not layer.interleaved:
        raise RuntimeError("the GGUF kernels are not built here: there is nothing to choose")
    inputs = [torch.randn(count, k, generator=generator) for count in CANDIDATES]
    ways = {"interleaved": _from_rows, "decoded": _from_decoded}

    def one_round(how: str) -> list[float]:
        product, args, times = ways[how], layer.calls(), []
        for x in inputs:
            start = time.perf_counter()
            product(x, args, out, rounded)
            times.append(time.perf_counter() - start)
        return times

    return one_round
