"""The exceptions any layer of glassformer may raise, in one module that imports nothing.

Each is a subclass of the built-in a caller would already catch (``ValueError`` for bad
input, ``OSError`` for a failed write), and the CLI prints any of them as one line.
"""

from __future__ import annotations


class CheckpointError(ValueError):
    """A path that is not a loadable checkpoint (glassformer's own or a foreign format)."""


class CheckpointSaveError(OSError):
    """A checkpoint could not be written (full disk, no permission, ...); the previous
    checkpoint at that path, if any, is intact and no temporary files are left."""


class NonFiniteLossError(FloatingPointError):
    """The loss (or the gradient norm) was NaN or infinite; the weights were not updated."""

    def __init__(self, message: str, *, step: int) -> None:
        super().__init__(message)
        self.step = step  # the step that failed (1-based: the one that would have been taken)
