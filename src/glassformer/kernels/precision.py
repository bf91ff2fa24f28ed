"""Precision chosen by measurement: is bfloat16 faster than float32 on this machine?

A CPU's flags do not say (``torch.mm`` in bf16 against fp32: 147 against 276 GFLOP/s on a
2-core Intel Xeon reporting AVX512-BF16, 1,000 against 177 on a 2-core AMD EPYC). So
glassformer times the model's own products in both dtypes, alternating, and keeps the answer
in the cache folder's ``precision.json``, keyed by processor, torch, threads and shapes.

A busy machine must not write a wrong answer there for good (one run beside other work
measured bf16 at 0.2 GFLOP/s against fp32's 4.2, and every later run decoded in fp32). So:

- each dtype is timed over many interleaved rounds; its figure comes from the fastest tenth
  of its rounds (other work only ever slows a round down), and its *spread* (the
  interquartile range over the median) is kept with it;
- a measurement is *trusted* only when both spreads are at most ``MAX_SPREAD`` and bf16's
  figure is within ``PLAUSIBLE``x of fp32's either way; an untrusted one is measured again
  (``ATTEMPTS`` in all), and if none is trusted the best is used for this run only, never
  cached; an implausible one never chooses bf16;
- a cached entry expires after ``EXPIRES_DAYS`` days, and ``glassformer bench precision
  --refresh`` measures every entry of this machine again.

``GLASSFORMER_FASTER=bf16`` (or ``fp32``) forces the verdict unmeasured and uncached (a test
suite then covers the other machines). ``resolve_bf16(setting, shapes)`` is what ``train
--bf16 auto|on|off`` does with it, ``resolve_dtype(model, "auto")`` the speed half of
``--dtype auto`` (the other: bf16's fidelity, ``kernels.fidelity``)."""

from __future__ import annotations

import os
import time
import warnings
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from glassformer.cache import cache_root
from glassformer.kernels.precision_cache import (
    Shape,
    figures,
    load,
    processor,
    read_cache,
    write_cache,
)
from glassformer.kernels.precision_cache import shapes as entry_shapes
from glassformer.kernels.quantized import VOCABULARY_HEADS

CACHE_FILE = "precision.json"
FORCE_ENV = "GLASSFORMER_FASTER"  # bf16 | fp32: the verdict, forced (tests); unset: measured
# bf16 must be at least this much faster to be chosen: a product that is only as fast
# in bf16 costs accuracy for nothing.
MARGIN = 1.1
# interquartile range over median: above it, a figure is noise. SmolLM2's decoding products,
# 2-core Intel Xeon: 1-4% quiet, 14-19% beside a compiler using both cores.
MAX_SPREAD = 0.10
# bf16 against fp32 on the same products has measured 0.53x to 5.6x on real machines; a
# ratio outside 1/PLAUSIBLE..PLAUSIBLE says the timing was disturbed, not the hardware.
PLAUSIBLE = 12.0
ATTEMPTS = 3  # measurements tried before an untrusted one is used, uncached
MIN_ROUNDS = 15  # rounds of each dtype in one measurement, at least
EXPIRES_DAYS = 30.0


@dataclass(frozen=True)
class Measurement:
    """Matrix-product throughput of the same shapes in fp32 and bf16 (GFLOP/s), each with
    its spread over the rounds (interquartile range over median), when it was measured
    (Unix time) and whether it came from the cache."""

    fp32_gflops: float
    bf16_gflops: float
    fp32_spread: float = 0.0
    bf16_spread: float = 0.0
    measured_at: float = 0.0
    cached: bool = False
    forced: bool = False

    @property
    def speedup(self) -> float:
        """bf16's throughput over fp32's (> 1: bf16 faster)."""
        return self.bf16_gflops / self.fp32_gflops

    @property
    def plausible(self) -> bool:
        return 1 / PLAUSIBLE <= self.speedup <= PLAUSIBLE

    @property
    def trusted(self) -> bool:
        """Quiet enough and plausible enough to keep as this machine's answer."""
        return self.plausible and max(self.fp32_spread, self.bf16_spread) <= MAX_SPREAD

    @property
    def bf16_faster(self) -> bool:
        return self.plausible and self.speedup >= MARGIN

    def describe(self) -> str:
        if self.forced:
            faster = "bf16" if self.bf16_faster else "fp32"
            return f"{faster} taken as faster, not measured: {FORCE_ENV}={faster}"
        when = "cached from " + time.strftime("%Y-%m-%d", time.localtime(self.measured_at))
        if not self.cached:
            when = "measured here" + ("" if self.trusted else "; too noisy to cache")
        return (
            f"bf16 {_figure(self.bf16_gflops)} ±{self.bf16_spread:.0%} vs fp32 "
            f"{_figure(self.fp32_gflops)} ±{self.fp32_spread:.0%} GFLOP/s "
            f"({self.speedup:.2f}x), {when}"
        )


def _figure(gflops: float) -> str:
    """1,000 and 681 as they are, 12.7 and 1.4 with the digits that matter."""
    return f"{gflops:,.0f}" if gflops >= 100 else f"{gflops:.3g}"


def bf16_measurement(
    shapes: Sequence[Shape],
    device: str | torch.device = "cpu",
    *,
    seconds: float = 0.25,
    cache_dir: str | Path | None = None,
    linear: bool = False,
    refresh: bool = False,
) -> Measurement:
    """Time ``shapes`` in fp32 and bf16 on ``device``; a trusted answer is cached per
    machine for ``EXPIRES_DAYS`` (``refresh=True`` measures again regardless).

    ``linear=True`` times them as a linear layer does, ``F.linear(x, w)`` with the weight
    stored (n, k), the layout decoding reads; bf16's gain differs by layout (SmolLM2's
    decoding products, 2-core AMD EPYC: 1.44x fp32 as (k, n), 2.24x as (n, k))."""
    if not shapes or any(len(s) != 3 or min(s) < 1 for s in shapes):
        raise ValueError(f"shapes must be (m, k, n) triples of positive sizes, got {shapes!r}")
    device = torch.device(device)
    forced = forced_verdict()
    if forced is not None:
        return forced
    key = _cache_key(shapes, device) + ("; linear" if linear else "")
    path = cache_root(cache_dir) / CACHE_FILE
    cached = read_cache(path)
    entry = None if refresh else _cached_entry(cached, key, path)
    if entry is not None:
        return entry
    tries = []
    for _ in range(ATTEMPTS):
        tries.append(_measure(shapes, device, seconds, linear))
        if tries[-1].trusted:
            cached = read_cache(path, warn=False)  # another process may have written meanwhile
            counts = Counter(tuple(s) for s in shapes)
            shapes_field = [[*s, n] for s, n in counts.items()]  # (m, k, n, how many)
            cached[key] = {**asdict(tries[-1]), "shapes": shapes_field}
            del cached[key]["cached"], cached[key]["forced"]
            write_cache(path, cached)
            return tries[-1]
    # none trusted: the plausible one of least spread, for this run only
    return min(tries, key=lambda m: (not m.plausible, max(m.fp32_spread, m.bf16_spread)))


def forced_verdict() -> Measurement | None:
    """The verdict ``$GLASSFORMER_FASTER`` forces, or None when it is unset."""
    value = os.environ.get(FORCE_ENV, "")
    if value not in ("", "bf16", "fp32"):
        raise ValueError(f"{FORCE_ENV} must be bf16 or fp32 (or unset), got {value!r}")
    bf16 = 2.0 if value == "bf16" else 0.5
    return Measurement(1.0, bf16, measured_at=time.time(), forced=True) if value else None


def refresh(
    cache_dir: str | Path | None = None, seconds: float = 0.25
) -> list[tuple[str, Measurement | None, Measurement]]:
    """Measure every cached entry of this machine again: ``(key, cached, new)`` for each
    (``cached`` None where the old entry was expired or untrusted). Entries of other
    machines, torch versions or thread counts are left as they are."""
    path = cache_root(cache_dir) / CACHE_FILE
    here = _this_machine()
    done: list[tuple[str, Measurement | None, Measurement]] = []
    for key, entry in read_cache(path, warn=False).items():
        if not key.startswith(here):
            continue  # another machine's
        try:
            shapes = entry_shapes(entry)
        except ValueError:
            continue  # no shapes to measure again: ``skipped`` names it
        new = bf16_measurement(
            shapes,
            seconds=seconds,
            cache_dir=cache_dir,
            linear=key.endswith("; linear"),
            refresh=True,
        )
        done.append((key, _usable(entry), new))
    return done


def cached(cache_dir: str | Path | None = None) -> list[tuple[str, Measurement]]:
    """This machine's cached entries that are still trusted and unexpired, by key."""
    here = _this_machine()
    entries = read_cache(cache_root(cache_dir) / CACHE_FILE, warn=False).items()
    usable = ((key, _usable(entry)) for key, entry in entries if key.startswith(here))
    return [(key, m) for key, m in usable if m is not None]


def skipped(cache_dir: str | Path | None = None) -> list[tuple[str, str]]:
    """What ``cached`` and ``refresh`` leave out, and why: ``("", why)`` for a file that
    cannot be used, else each of this machine's entries that is garbled, expired, untrusted
    or (once measured) cannot be measured again."""
    data, problem = load(cache_root(cache_dir) / CACHE_FILE)
    if problem:
        return [("", problem)]
    found, here = [], _this_machine()
    for key, entry in data.items():
        if not key.startswith(here):
            continue
        read = _read(entry)
        if isinstance(read, str):
            found.append((key, read))
            continue
        try:
            entry_shapes(entry)
        except ValueError as why:
            found.append((key, f"cannot be measured again: {why}"))
    return found


def _usable(entry: Any) -> Measurement | None:
    """A cached entry as a Measurement, or None when it is unusable (``_read``)."""
    read = _read(entry)
    return read if isinstance(read, Measurement) else None


def _read(entry: Any) -> Measurement | str:
    """A cached entry as a Measurement, or why it is not used: garbled (a field of the wrong
    type or out of range: ``precision_cache.figures``), expired or untrusted (written by an
    older glassformer that cached any answer, or edited by hand)."""
    try:
        m = Measurement(**figures(entry), cached=True)
    except ValueError as why:
        return str(why)
    age_days = (time.time() - m.measured_at) / 86400
    if not 0 <= age_days <= EXPIRES_DAYS:
        return f"measured {age_days:.0f} days ago, expected 0 to {EXPIRES_DAYS:g}"
    return m if m.trusted else f"untrusted ({m.describe()})"


def _cached_entry(cached: dict[str, Any], key: str, path: Path) -> Measurement | None:
    """The usable entry under ``key``; a garbled one is named in one warning (then measured
    again and overwritten), an expired or untrusted one is just measured again."""
    if key not in cached:
        return None
    try:
        figures(cached[key])
    except ValueError as why:
        warnings.warn(f"the precision cache {path}: {why}; measuring again", stacklevel=3)
        return None
    return _usable(cached[key])


def resolve_bf16(
    setting: bool | str,
    shapes: Sequence[Shape],
    device: str | torch.device = "cpu",
    **options,
) -> tuple[bool, Measurement | None, str | None]:
    """``(use_bf16, measurement, warning)`` for ``setting`` True, False or ``"auto"``.

    ``"auto"`` measures and uses bf16 when it is faster. True uses it regardless, with a
    warning that gives both figures when the measurement says it is slower. False measures
    nothing.
    """
    if setting is False:
        return False, None, None
    if setting not in (True, "auto"):
        raise ValueError(f"bf16 must be True, False or 'auto', got {setting!r}")
    measured = bf16_measurement(shapes, device, **options)
    if setting == "auto":
        return measured.bf16_faster, measured, None
    warning = None
    if measured.speedup < 1.0:
        warning = f"--bf16 is slower than fp32 on this machine: {measured.describe()}"
    return True, measured, warning


# ---- the precision a model decodes in: for_inference(dtype), --dtype -------------------
DTYPES = ("auto", "fp32", "bf16", "int8", "int4", "gguf", "gguf-q8")


def check_dtype(dtype: str) -> str:
    if dtype not in DTYPES:
        raise ValueError(f"dtype must be one of {', '.join(DTYPES)}; got {dtype!r}")
    return dtype


def decoding_shapes(model: nn.Module, batch: int = 1) -> list[tuple[int, int, int]]:
    """The (m, k, n) products of one decoding step at ``batch`` that ``bf16`` runs in bf16:
    one per linear layer but the vocabulary head (fp32 in both), in the model's order, repeats
    kept. Measured as they come (each with its own weights), they read as many bytes as a step
    does, so they meet the memory limits a step meets (a model larger than the cache reads its
    weights from memory: there bf16's half the bytes counts)."""
    linears = (m for name, m in model.named_modules() if name not in VOCABULARY_HEADS)
    return [(batch, m.in_features, m.out_features) for m in linears if isinstance(m, nn.Linear)]


def decoding_measurement(
    model: nn.Module, device: str | torch.device = "cpu", **options: Any
) -> Measurement:
    """bf16 against fp32 on ``model``'s decoding products, timed as its linear layers run
    them (measured once per machine, then cached)."""
    return bf16_measurement(decoding_shapes(model), device, linear=True, **options)


def resolve_dtype(
    model: nn.Module, dtype: str, device: str | torch.device = "cpu", **options: Any
) -> tuple[str, Measurement | None]:
    """The precision ``dtype`` means for ``model`` here: ``auto`` becomes fp32 or bf16 by
    measurement (returned with it); any other is itself."""
    check_dtype(dtype)
    if dtype != "auto":
        return dtype, None
    measured = decoding_measurement(model, device, **options)
    return ("bf16" if measured.bf16_faster else "fp32"), measured


def _measure(
    shapes: Sequence[Shape], device: torch.device, seconds: float, linear: bool = False
) -> Measurement:
    """Interleaved rounds of every shape in each dtype, at least ``MIN_ROUNDS`` each and for
    about ``2 * seconds``: each dtype's figure from its fastest tenth of rounds, with its
    spread."""
    one_round = _round_timer(shapes, device, linear)
    dtypes = (torch.float32, torch.bfloat16)
    for dtype in dtypes:  # warm-up: kernels chosen, memory touched
        one_round(dtype)
    rounds: dict[torch.dtype, list[float]] = {dtype: [] for dtype in dtypes}
    deadline = time.perf_counter() + 2 * seconds
    while time.perf_counter() < deadline or len(rounds[torch.bfloat16]) < MIN_ROUNDS:
        for dtype in dtypes:
            rounds[dtype].append(one_round(dtype))
    flops = sum(2 * m * k * n for m, k, n in shapes)
    (fp32, fp32_spread), (bf16, bf16_spread) = (fastest_tenth(rounds[d]) for d in dtypes)
    return Measurement(
        fp32_gflops=float(f"{flops / fp32 / 1e9:.3g}"),  # three digits: tiny products too
        bf16_gflops=float(f"{flops / bf16 / 1e9:.3g}"),
        fp32_spread=round(fp32_spread, 3),
        bf16_spread=round(bf16_spread, 3),
        measured_at=round(time.time()),
    )


def fastest_tenth(times: list[float]) -> tuple[float, float]:
    """(the tenth percentile of ``times``, interquartile range over median)."""
    q = sorted(times)
    n = len(q) - 1
    fast, q1, q2, q3 = (q[round(n * f)] for f in (0.1, 0.25, 0.5, 0.75))
    return fast, (q3 - q1) / q2


def _round_timer(
    shapes: Sequence[Shape], device: torch.device, linear: bool
) -> Callable[[torch.dtype], float]:
    """A function timing one round of ``shapes`` in a dtype (seconds), operands made once."""

    def operands(m: int, k: int, n: int, dtype: torch.dtype) -> tuple[torch.Tensor, ...]:
        second = (n, k) if linear else (k, n)  # a linear layer's weight is stored (n, k)
        return (
            torch.randn(m, k, device=device, dtype=dtype),
            torch.randn(*second, device=device, dtype=dtype),
        )

    product = torch.nn.functional.linear if linear else torch.matmul
    pairs = {
        dtype: [operands(m, k, n, dtype) for m, k, n in shapes]
        for dtype in (torch.float32, torch.bfloat16)
    }

    def one_round(dtype: torch.dtype) -> float:
        start = time.perf_counter()
        for a, b in pairs[dtype]:
            product(a, b)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        return time.perf_counter() - start

    return one_round


def _cache_key(shapes: Sequence[Shape], device: torch.device) -> str:
    if device.type == "cuda":
        where = torch.cuda.get_device_name(device)
    else:
        where = f"{processor()}, {torch.get_num_threads()} threads"
    counts = Counter(tuple(s) for s in shapes)  # in first-seen order
    dims = " ".join("x".join(map(str, s)) + (f"*{n}" if n > 1 else "") for s, n in counts.items())
    return f"{where}; torch {torch.__version__}; {dims}"


def _this_machine() -> str:
    """The start of this machine's CPU cache keys: processor, threads, torch version."""
    return _cache_key([(1, 1, 1)], torch.device("cpu")).rsplit("; ", 1)[0] + "; "
