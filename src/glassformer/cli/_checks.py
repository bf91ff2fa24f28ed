"""`glassformer train`'s option values, checked before any data is read.

A value no run could use (``--batch-size 0``, ``--lr -1``, ``--log-every 0``) is one
``ValueError`` naming the option as the user typed it, in the first second rather than
after minutes of data preparation (or, for some, never: a negative ``--checkpoint-every``
would have saved at every step).
"""

from __future__ import annotations

import math
from typing import Any

# option (run.json key) -> (what it must be, the test); None values are not checked.
_RULES: dict[str, tuple[str, Any]] = {
    "max_steps": ("a positive integer", lambda v: v > 0),
    "minutes": ("> 0", lambda v: v > 0),
    "batch_size": ("a positive integer", lambda v: v > 0),
    "accumulation": ("a positive integer", lambda v: v > 0),
    "lr": ("> 0", lambda v: v > 0),
    "warmup": ("0 or more", lambda v: v >= 0),
    "weight_decay": ("0 or more", lambda v: v >= 0),
    "clip_norm": ("> 0", lambda v: v > 0),
    "label_smoothing": ("in [0, 1)", lambda v: 0 <= v < 1),
    "dropout": ("in [0, 1)", lambda v: 0 <= v < 1),
    "block_size": ("a positive integer", lambda v: v > 0),
    "max_len": ("a positive integer", lambda v: v > 0),
    "vocab_size": ("a positive integer", lambda v: v > 0),
    "max_examples": ("a positive integer", lambda v: v > 0),
    "d_model": ("a positive integer", lambda v: v > 0),
    "num_heads": ("a positive integer", lambda v: v > 0),
    "num_layers": ("a positive integer", lambda v: v > 0),
    "d_ff": ("a positive integer", lambda v: v > 0),
    "eval_every": ("0 (only at the end) or more", lambda v: v >= 0),
    "checkpoint_every": ("0 (only at the end) or more", lambda v: v >= 0),
    "log_every": ("a positive integer", lambda v: v > 0),
    "threads": ("a positive integer", lambda v: v > 0),
}


def check_train_options(options: dict[str, Any]) -> None:
    """Raise a ``ValueError`` for the first option whose value no run can use."""
    for key, (expected, ok) in _RULES.items():
        value = options.get(key)
        if value is None:
            continue
        if isinstance(value, float) and not math.isfinite(value) or not ok(value):
            flag = "--" + key.replace("_", "-")
            raise ValueError(f"{flag} must be {expected}, got {value}")
