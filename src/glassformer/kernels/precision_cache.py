"""The measurement caches on disk (``precision.json``, and ``glassformer.kernels.fidelity``'s file),
read as files anyone may have edited or broken: a cache that cannot be used is measured
again, never a reason for a run to stop.

- ``load`` reads a whole file, refusing (with why) one larger than ``MAX_BYTES``, not a
  regular file, not JSON, nested more than ``MAX_DEPTH`` deep, or not a JSON object;
  ``read_cache`` is the same with one warning, and ``{}`` in its place;
- ``figures`` checks one precision entry field by field: the throughputs finite and
  positive (a zero would divide), the spreads and date finite and not negative, each a
  number, not a string, a list or a bool;
- ``shapes`` reads an entry's products back for ``--refresh``, within ``MAX_DIM``,
  ``MAX_PRODUCTS`` and the memory this machine has (a measurement allocates its operands);
- ``write_cache`` writes the whole file or nothing, so a half-written file never exists.
"""

from __future__ import annotations

import json
import math
import os
import platform
import stat
import warnings
from pathlib import Path
from typing import Any

from glassformer.atomic import write_atomic

Shape = tuple[int, int, int]  # (m, k, n): an (m, k) by (k, n) product

MAX_BYTES = 1 << 22  # 4 MiB: thousands of entries; a larger file is not one glassformer wrote
MAX_DEPTH = 8  # a precision file is 4 deep (file, entry, shapes, row), fidelity's 2
MAX_DIM = 1 << 20  # one side of a product (a model's widest layer is ~10^5)
MAX_PRODUCTS = 1 << 16  # products in one entry (a 100-layer model has ~700)
# each field's least value, and whether the value itself is allowed
FIGURES = {
    "fp32_gflops": (0.0, False),
    "bf16_gflops": (0.0, False),
    "fp32_spread": (0.0, True),
    "bf16_spread": (0.0, True),
    "measured_at": (0.0, True),
}
REQUIRED = ("fp32_gflops", "bf16_gflops")  # the others default (an older glassformer's file)


def load(path: Path) -> tuple[dict[str, Any], str | None]:
    """The JSON object in ``path`` and None; or ``{}`` and why it cannot be used (None as
    well where there is no file yet)."""
    try:  # non-blocking: a FIFO in its place must not hang the run
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    except FileNotFoundError:
        return {}, None
    except OSError as e:
        return {}, e.strerror or str(e)
    if not stat.S_ISREG(os.fstat(fd).st_mode):  # before fdopen, which refuses a directory
        os.close(fd)
        return {}, "not a regular file"
    with os.fdopen(fd, "rb") as f:
        raw = f.read(MAX_BYTES + 1)
    if len(raw) > MAX_BYTES:
        return {}, f"larger than {MAX_BYTES:,} bytes"
    try:
        data = json.loads(raw)
    except RecursionError:
        return {}, "JSON nested too deeply"
    except ValueError as e:  # not JSON, not UTF-8, an integer of thousands of digits
        return {}, f"not JSON ({e})"
    if not isinstance(data, dict):
        return {}, f"a JSON {type(data).__name__}, expected an object"
    if _nested_past(data, MAX_DEPTH):
        return {}, f"JSON nested more than {MAX_DEPTH} deep"
    return data, None


def _nested_past(data: Any, depth: int) -> bool:
    """Whether ``data`` holds containers more than ``depth`` deep (walked without recursion:
    the file is read, then written back, and neither may hit the interpreter's limit)."""
    level = [data]
    for _ in range(depth):
        level = [
            child
            for item in level
            for child in (item.values() if isinstance(item, dict) else item)
            if isinstance(child, (dict, list))
        ]
        if not level:
            return False
    return True


def read_cache(path: Path, *, warn: bool = True) -> dict[str, Any]:
    """The entries in ``path``: ``{}`` when there is none yet, or (one warning unless
    ``warn`` is False) when it cannot be used; the next measurement overwrites it."""
    data, problem = load(path)
    if problem and warn:
        warnings.warn(f"the cache {path} cannot be used ({problem}); measuring again", stacklevel=2)
    return data


def write_cache(path: Path, data: dict) -> None:
    """Write the cache whole or not at all (``write_atomic``: the user's umask, flushed); a
    folder that cannot be written is skipped."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(path, json.dumps(data, indent=1, sort_keys=True).encode())
    except OSError:
        pass


def figures(entry: Any) -> dict[str, Any]:
    """A precision entry's measured fields, checked, as finite floats (``Any`` to mypy: they
    are passed on as ``Measurement``'s keywords); ValueError naming the field, its value and
    what was expected."""
    if not isinstance(entry, dict):
        raise ValueError(f"an entry is {_shown(entry)}, expected an object")
    found: dict[str, Any] = {}
    for name, (least, inclusive) in FIGURES.items():
        if name not in entry:
            if name in REQUIRED:
                raise ValueError(f"{name} is missing")
            continue
        value = entry[name]
        expected = f"a finite number {'>=' if inclusive else '>'} {least:g}"
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ValueError(f"{name} is {_shown(value)}, expected {expected}")
        number = float(value) if abs(value) < 1e300 else math.inf  # no OverflowError
        if not (math.isfinite(number) and (number >= least if inclusive else number > least)):
            raise ValueError(f"{name} is {_shown(value)}, expected {expected}")
        found[name] = number
    return found


def shapes(entry: Any, memory: int | None = None) -> list[Shape]:
    """The products ``entry`` was measured on, from its ``(m, k, n, how many)`` rows, each
    repeat kept; ValueError where they cannot be read, or where their operands in fp32 and
    bf16 would take more than half of ``memory`` (this machine's, by default)."""
    rows = entry.get("shapes") if isinstance(entry, dict) else None
    if not isinstance(rows, list) or not 0 < len(rows) <= MAX_PRODUCTS:
        raise ValueError(f"shapes is {_shown(rows)}, expected a list of (m, k, n, count) rows")
    found: list[Shape] = []
    for row in rows:
        good = isinstance(row, list) and len(row) == 4
        if not good or not all(type(v) is int and 0 < v <= MAX_DIM for v in row):
            raise ValueError(f"shapes has a row {_shown(row)}, expected 4 integers 1..{MAX_DIM}")
        m, k, n, count = row
        if len(found) + count > MAX_PRODUCTS:
            raise ValueError(f"shapes has more than {MAX_PRODUCTS} products")
        found += [(m, k, n)] * count
    needed = sum((m * k + k * n) * 6 for m, k, n in found)  # 4 + 2 bytes: fp32 and bf16
    available = memory if memory is not None else _memory()
    if needed > available // 2:
        raise ValueError(
            f"shapes need {needed / 2**30:.1f} GiB of operands, "
            f"more than half of this machine's {available / 2**30:.1f} GiB"
        )
    return found


def processor() -> str:
    """The CPU's model name (/proc/cpuinfo on Linux), else what platform knows."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _memory() -> int:
    """This machine's physical memory in bytes (16 GiB where the system does not say)."""
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (AttributeError, OSError, ValueError):
        return 16 << 30


def _shown(value: Any) -> str:
    """A value as a message shows it: scalars as written (cut at 40 characters),
    containers by kind (a nested one has no short form)."""
    if isinstance(value, (dict, list)):
        return f"a JSON {'object' if isinstance(value, dict) else 'array'}"
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."
