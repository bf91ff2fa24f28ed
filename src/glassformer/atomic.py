"""Writing a file or a directory so that its name holds the old contents or the new, whole.

Everything glassformer writes goes through here: run files, pages, pictures, tokenizers,
embeddings (``write_atomic``) and checkpoints (``write_directory_atomically``). Each is
written beside its place under a temporary name, flushed to disk, given the mode the
user's umask gives new files (``tempfile`` creates them 0600 and a rename keeps that), and
renamed into place. A write that fails leaves no temporary behind.

A directory replacing an existing one takes two renames (old → ``.NAME.old``, new →
NAME); a crash between them is repaired by the next save, and readers find the previous
directory in ``.NAME.old`` meanwhile (``previous_name``). A killed save's temporary
directory (``.NAME.partial-XXXXXXXX``, exactly as ``tempfile.mkdtemp`` names it) is removed
by the next save; nothing else beside NAME is ever touched, whatever characters the name
holds (``runs/*`` is a name, not a pattern).
"""

from __future__ import annotations

import errno
import glob
import os
import re
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

from glassformer.errors import CheckpointSaveError

PARTIAL = ".partial-"  # between ".NAME" and mkdtemp's random part: a save's own temporary
_RANDOM = re.compile(r"[a-z0-9_]{8}")  # tempfile's eight characters


def umask() -> int:
    """The process's umask, read where Linux shows it; elsewhere set and put back at once."""
    try:
        with open("/proc/self/status", encoding="ascii") as status:
            for line in status:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def write_atomic(path: str | os.PathLike, data: bytes | bytearray | memoryview) -> None:
    """Write ``data`` to ``path`` through a temporary file beside it, flushed, given the
    mode ``0o666 & ~umask`` and renamed into place. The folder must exist."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".partial", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            os.fchmod(f.fileno(), 0o666 & ~umask())
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def remove_partial_files(path: str | os.PathLike) -> None:
    """Remove the temporaries that writes of ``path`` killed mid-way left beside it: only
    names of the exact form ``write_atomic`` gives them. For a file with one writer (a run's
    own files); where several processes may write the same file, one's could be another's
    write in progress."""
    path = Path(path)
    prefix = f".{path.name}."
    for leftover in path.parent.glob(glob.escape(prefix) + "*.partial"):
        if _RANDOM.fullmatch(leftover.name[len(prefix) : -len(".partial")]) and (
            leftover.is_file() and not leftover.is_symlink()
        ):
            leftover.unlink(missing_ok=True)


def _above(count: int) -> str:
    return {0: "nothing above it", 1: "its parent"}.get(count, f"{count} folders above it")


def make_folder(folder: str | os.PathLike, *, new_parents: int = 1, create: bool = True) -> Path:
    """Create ``folder`` and at most ``new_parents`` missing folders above it; a path that
    needs more (a typo in ``--out``) is refused instead of growing a tree silently. With
    ``create=False`` only check (before hours of work that would end in that refusal).

    Raises:
        FileNotFoundError: naming the highest missing folder, in one line.
    """
    folder = Path(folder)
    missing = []
    for level in (folder, *folder.parents):
        if level.exists():
            break
        missing.append(level)
    if len(missing) > 1 + new_parents:
        top = missing[-1]
        raise FileNotFoundError(
            f"cannot write {folder}: {top} does not exist (glassformer creates the output "
            f"folder and at most {_above(new_parents)}; create {top} first)"
        )
    if create:
        folder.mkdir(parents=True, exist_ok=True)
    return folder


def previous_name(path: Path) -> Path:
    """Where the previous directory waits while the new one is renamed into place."""
    return path.with_name(f".{path.name}.old")


def write_directory_atomically(path: Path, write: Callable[[Path], None]) -> Path:
    """Fill a temporary directory beside ``path`` with ``write(tmp)``, flush it to disk,
    then rename it into place: ``path`` is either the old directory or the complete new one.
    ``path``'s folder may be created, not the one above it (``make_folder``).

    Raises:
        CheckpointSaveError: writing failed with an ``OSError`` (a full disk, ...).
    """
    try:
        make_folder(path.parent, new_parents=0)
        tidy_directory(path)  # a killed save's temporaries: free their space first
        tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}{PARTIAL}", dir=path.parent))
    except OSError as e:
        raise _save_error(path, e) from None
    try:
        write(tmp)
        mask = umask()
        for f in tmp.iterdir():
            with open(f, "rb") as fh:
                os.fchmod(fh.fileno(), 0o666 & ~mask)
                os.fsync(fh.fileno())
        tmp.chmod(0o777 & ~mask)
        _swap_into_place(tmp, path)
    except OSError as e:
        shutil.rmtree(tmp, ignore_errors=True)
        raise _save_error(path, e) from None
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return path


def tidy_directory(path: Path) -> None:
    """Repair what saves of ``path`` killed mid-way left: the previous directory put back
    where the new one never arrived, the temporaries and the copy moved aside removed. For
    the one process that writes ``path`` (a run: its checkpoint), before it reads it."""
    _recover(path)
    _remove_leftovers(path)
    if path.is_dir():  # killed after the second rename: the new one is whole
        shutil.rmtree(previous_name(path), ignore_errors=True)


def _recover(path: Path) -> None:
    """Put the previous directory back if a save was killed between its two renames."""
    old = previous_name(path)
    if not path.exists() and old.is_dir() and not old.is_symlink():
        os.replace(old, path)


def _remove_leftovers(path: Path) -> None:
    """Remove the temporary directories killed saves of ``path`` left: only names of the
    exact form this module gives them (the name escaped: ``*``, ``?`` and ``[`` in it are
    characters, not patterns)."""
    prefix = f".{path.name}{PARTIAL}"
    for leftover in path.parent.glob(glob.escape(prefix) + "*"):
        ours = leftover.name.startswith(prefix) and _RANDOM.fullmatch(leftover.name[len(prefix) :])
        if ours and leftover.is_dir() and not leftover.is_symlink():
            shutil.rmtree(leftover, ignore_errors=True)


def _save_error(path: Path, e: OSError) -> CheckpointSaveError:
    if e.errno in (errno.ENOSPC, errno.EDQUOT):
        reason = "no space left on device" if e.errno == errno.ENOSPC else "disk quota exceeded"
        message = f"{reason} while saving checkpoint to {path}"
    else:
        message = f"cannot save checkpoint to {path}: {e.strerror or e}"
    if path.exists():
        message += "; the previous checkpoint there is intact"
    error = CheckpointSaveError(message)
    error.errno = e.errno
    return error


def _swap_into_place(tmp: Path, path: Path) -> None:
    """Rename ``tmp`` to ``path``; an existing ``path`` is moved aside, then removed."""
    if not path.exists():
        os.replace(tmp, path)
        _fsync_dir(path.parent)
        return
    old = previous_name(path)
    shutil.rmtree(old, ignore_errors=True)  # a crash after the second rename left it
    os.replace(path, old)
    os.replace(tmp, path)
    _fsync_dir(path.parent)
    shutil.rmtree(old, ignore_errors=True)


def _fsync_dir(directory: Path) -> None:
    """Make the renames durable (POSIX; a no-op where directories cannot be opened)."""
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


__all__ = [
    "make_folder",
    "previous_name",
    "remove_partial_files",
    "tidy_directory",
    "umask",
    "write_atomic",
    "write_directory_atomically",
]
