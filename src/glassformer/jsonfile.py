"""Reading the JSON files a tokenizer, checkpoint or cache folder holds (``tokenizer.json``,
``tokenizer_config.json``, ``image_processor.json``), as files anyone may have made: whatever
is in one, the reader gets its document or one ``ValueError`` naming the file and what is
wrong with it, never a hang, all of memory or a traceback.

- ``read_text``: opened without blocking and checked to be a regular file before a byte is
  read (a FIFO would wait forever, ``/dev/zero`` never end), at most ``max_bytes`` of it,
  UTF-8 (a byte-order mark dropped);
- ``parse_json``: JSON, not nested past what Python's parser takes (it raises
  ``RecursionError`` there, which is no ``ValueError``: it would end the run in a traceback);
- ``read_json``: the two.

A value from such a file is shown in a message by ``glassformer.errors.shown``.
"""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path
from typing import Any

# the largest tokenizer.json published (Gemma 3's, 262,144 tokens) is ~33 MB
MAX_BYTES = 1 << 28


def read_text(path: Path, what: str, max_bytes: int = MAX_BYTES) -> str:
    """The UTF-8 text of ``path`` (``what`` it should be: "a tokenizer file"); ValueError
    naming it where it cannot be opened, is not a regular file, is larger than ``max_bytes``
    or is not UTF-8."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    except OSError as e:
        raise ValueError(f"{path} is not {what}: {e.strerror or e}") from None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise ValueError(f"{path} is not {what}: not a regular file")
        with os.fdopen(fd, "rb", closefd=False) as f:
            data = f.read(max_bytes + 1)
    except OSError as e:
        raise ValueError(f"{path} is not {what}: {e.strerror or e}") from None
    finally:
        os.close(fd)
    if len(data) > max_bytes:
        raise ValueError(f"{path} is not {what}: larger than {max_bytes:,} bytes")
    try:
        return data.decode("utf-8").removeprefix("\ufeff")
    except UnicodeDecodeError as e:
        raise ValueError(f"{path} is not UTF-8 text (bad byte at offset {e.start})") from None


def parse_json(path: Path, text: str, what: str) -> Any:
    """The JSON document ``text`` (read from ``path``); ValueError naming the file where it
    is not JSON or is nested too deeply for the parser."""
    try:
        return json.loads(text)
    except RecursionError:
        problem = "JSON nested too deeply"
    except ValueError as e:  # JSONDecodeError; an integer of thousands of digits
        problem = f"invalid JSON ({e})"
    raise ValueError(f"{path} is not {what}: {problem}")


def read_json(path: Path, what: str, max_bytes: int = MAX_BYTES) -> Any:
    """``parse_json(read_text(path))``: the JSON document in ``path``, or one ValueError."""
    return parse_json(path, read_text(path, what, max_bytes), what)
