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


class ChatTemplateError(ValueError):
    """A chat template that does not render, or passes a limit of its rendering (time, loop
    steps, size); ``source`` names the file it came from (None: not known), ``problem``
    says what went wrong, in one line."""

    def __init__(self, source: str | None, problem: str) -> None:
        where = f"{source}: " if source else ""
        super().__init__(f"{where}the chat template does not render: {problem}")
        self.source, self.problem = source, problem


class NonFiniteLogitsError(FloatingPointError):
    """A model's logits at a decoding step were NaN or infinite (a NaN weight, scale or
    norm epsilon, or an overflow), so no token can be chosen from them."""

    def __init__(self, message: str, *, step: int | None) -> None:
        super().__init__(message)
        self.step = step  # the decoding step (1-based: the new token it would have chosen)


# ---- a file's value or a library's message, in a message of one line -----------------------


def shown(value: object, limit: int = 80) -> str:
    """``repr(value)`` for a message, at most about ``limit`` characters: cut in the middle
    with "…" and its full length noted when longer (``'xxxx…xxxx' (100,000 characters)``).

    Every reader's refusal names the value it refuses; a file can make that value a
    100,000-character string or a list of a million items, and a line that echoes it whole
    is no use to anyone (and no longer one line on a terminal)."""
    try:
        text = " ".join(repr(value).splitlines())
    except (ValueError, RecursionError):  # an int past 4,300 digits, lists nested deeply
        return f"a value of type {type(value).__name__} too large to show"
    if len(text) <= limit:
        return text
    if isinstance(value, (str, bytes)):  # its own length, else the length of its repr
        size = f"{len(value):,} {'characters' if isinstance(value, str) else 'bytes'}"
    else:
        size = f"{len(text):,} characters"
    return f"{_cut(text, limit)} ({size})"


def one_line(error: BaseException | str, limit: int = 500) -> str:
    """``error``'s message on one line (its whitespace runs made one space), cut in the
    middle at ``limit`` characters: a library's message can list every missing name of a
    state dict, one a line, or quote a 100 KB header string it could not parse."""
    text = " ".join(str(error).split())
    return text if len(text) <= limit else f"{_cut(text, limit)} ({len(text):,} characters)"


def _cut(text: str, limit: int) -> str:
    """``text``'s first and last characters around "…", ``limit`` characters in all."""
    head = max(limit - 1, 2) // 2
    tail = max(limit - 1 - head, 1)
    return f"{text[:head]}…{text[-tail:]}"


class LiveError(ValueError):
    """A model or tokenizer the live page (``glassformer.viz.live``) cannot run, and why."""
