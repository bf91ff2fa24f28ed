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


class CorpusUnavailableError(ValueError):
    """A bundled corpus cannot be fetched here (no network, no apt-get, ...)."""


class MissingDependencyError(ImportError, ValueError):
    """An optional package is not installed (a ValueError too, so the CLI prints one line)."""


class RunConfigError(ValueError):
    """A RunConfig value no run can use; ``field`` names it, ``str()`` says why in one line
    (``cli_message()`` says it with the flag the user typed)."""

    def __init__(self, field: str, problem: str) -> None:
        super().__init__(f"{field} {problem}")
        self.field, self.problem = field, problem

    def cli_message(self) -> str:
        return f"--{self.field.replace('_', '-')} {self.problem}"


class NonFiniteLossError(FloatingPointError):
    """The loss (or the gradient norm) was NaN or infinite; the weights were not updated."""

    def __init__(self, message: str, *, step: int) -> None:
        super().__init__(message)
        self.step = step  # the step that failed (1-based: the one that would have been taken)


class ImageError(ValueError):
    """An image file or folder glassformer cannot use (not an image, the wrong size, an
    empty class folder, a folder with one class), named in one line."""
