"""The C library behind the GGUF layers and the decoding step's attention: ``csrc/gguf.c``,
compiled on first use with the machine's C compiler (``-march=native``: AVX-512 where the CPU
has it, VNNI for 8-bit products), once per source, flags, CPU and compiler, and loaded with
``ctypes``. Where no compiler is found, or the library cannot be built, verified or loaded,
``kernels()`` is None (one warning) and the callers take their PyTorch paths.

Loading a library runs its code, so the file loaded must be the one this user built:

- it lives in a *private* folder: a directory of this user's that nobody else can write,
  under parents that only they or root can change (or sticky, as ``/tmp``), checked before
  every load. That is the cache folder's ``kernels/`` when the cache is private; where it is
  not (a ``$GLASSFORMER_CACHE`` shared with others), the user's own
  ``~/.cache/glassformer/kernels``, else ``<tmp>/glassformer-kernels-<uid>``, with a warning.
  A folder under one that others can write could be renamed away and replaced between the
  check and the load, which is why a per-user folder *inside* a shared cache is not enough;
- its bytes hash to what a ``.sha256`` file beside it recorded when it was built (written
  atomically after the library, so a build killed between the two is built again);
- its name carries a hash of everything the bytes depend on: the source, the flags, the
  CPU (every identifying line of ``/proc/cpuinfo``, its features included, the kernel's
  ``AT_HWCAP`` words, the architecture) and the compiler (its path and the macros it defines
  under these flags: its version, and the instruction sets ``-march=native`` turns on);
- it is written whole or not at all (a temporary file renamed in the same folder); the
  temporary files of builds killed mid-compile are removed once they are an hour old.

It also holds the operator ``glassformer::one_query_attention``: a decoding step's attention
over the filled cache slots, in C (``one_query_attention``, registered with
``glassformer.modules.sdpa``'s one-query paths); ``glassformer.kernels.gguf_linear``
registers ``glassformer::gguf_linear`` in the same namespace.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import hashlib
import os
import platform
import re
import shutil
import stat
import struct
import subprocess
import tempfile
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any, BinaryIO

import torch
from torch import Tensor

from glassformer.cache import cache_root
from glassformer.modules.one_query import register_one_query

SOURCE = Path(__file__).with_name("csrc") / "gguf.c"
FLAGS = ("-O3", "-march=native", "-fopenmp", "-ffp-contract=off", "-shared", "-fPIC")
CPUINFO = Path("/proc/cpuinfo")
AUXV = Path("/proc/self/auxv")
# the /proc/cpuinfo fields that say which CPU this is and what it can do, on x86, Arm,
# RISC-V and POWER (not those that change from moment to moment: MHz, bogomips)
CPU_FIELDS = frozenset(
    ("model name", "flags", "vendor_id", "cpu family", "model", "stepping", "features")
    + ("cpu implementer", "cpu architecture", "cpu variant", "cpu part", "cpu revision")
    + ("isa", "uarch", "mmu", "cpu", "cpu model", "hardware")
)
HWCAPS = (16, 26, 29, 30)  # AT_HWCAP, AT_HWCAP2, AT_HWCAP3, AT_HWCAP4 in the auxiliary vector
MAX_LIBRARY_BYTES = 1 << 26  # the library is ~50 KB; a larger file is not one we built
STALE_SECONDS = 3600.0  # a build takes seconds: a temporary file this old is a killed one's
TEMPORARY = re.compile(r"\.gguf-[0-9a-f]{16}-[a-z0-9_]{8}\.tmp")  # what _write_whole names

_READY: bool | None = None  # whether kernels() built the library; None: not asked yet


class _UnusableError(Exception):
    """Why the library cannot be used here: ``kernels()`` warns with it, once."""


def ready() -> bool:
    """Whether the library is built and loaded, as a compiled graph may ask: it reads a
    flag, never the disk (``kernels()`` sets it; ``compiled_step`` calls that first)."""
    return bool(_READY)


@functools.cache
def kernels() -> ctypes.CDLL | None:
    """The compiled ``csrc/gguf.c`` (built once per machine, source and compiler, in a
    private folder), or None where it cannot be built, verified or loaded (one warning)."""
    global _READY
    _READY = False
    try:
        lib = _load()
        _declare(lib)
    except _UnusableError as why:
        reason = str(why)
    except (OSError, AttributeError) as e:  # what else the disk refused, a symbol missing
        reason = f"the GGUF kernels could not be prepared ({e})"
    else:
        _READY = True
        return lib
    warnings.warn(f"{reason}; GGUF blocks are decoded in PyTorch (slow)", stacklevel=2)
    return None


def _load() -> ctypes.CDLL:
    """Find the library in its private folder, or build it there; verify, then load it."""
    compiler = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        raise _UnusableError("no C compiler")
    key = _key(compiler)
    folder = _private_folder()
    _remove_stale(folder)
    target = folder / f"gguf-{key}.so"
    if not _verified(target):  # none yet, or not the bytes we built: build it (again)
        _build(compiler, target, key)
        if not _verified(target):
            raise _UnusableError(f"the GGUF kernels at {target} changed while being built")
    try:
        return ctypes.CDLL(str(target))
    except OSError as e:
        raise _UnusableError(f"the GGUF kernels at {target} did not load ({e})") from None


def _declare(lib: ctypes.CDLL) -> None:
    """The C functions' argument types, so that ctypes passes 64-bit sizes and pointers."""
    pointer, size = ctypes.c_void_p, ctypes.c_int64
    parts: list[Any] = [ctypes.c_int, pointer, pointer, pointer]  # count, types, blocks, rows
    products = [*parts, pointer, pointer, size, size, ctypes.c_int]  # x, y, M, K, rounded
    lib.gguf_matmul.argtypes = lib.gguf_matmul_interleaved.argtypes = products
    lib.gguf_matmul_interleaved.restype = None
    for decoder in (lib.gguf_dequantize, lib.gguf_dequantize_interleaved):
        decoder.argtypes = [*parts, pointer, size, size, size]  # w, K, first, count
        decoder.restype = None
    lib.one_query_attention.argtypes = [*[pointer] * 5, *[size] * 6, ctypes.c_float]
    lib.gguf_matmul.restype = lib.one_query_attention.restype = None


# ---- what the library's bytes depend on --------------------------------------------------


def _key(compiler: str) -> str:
    """A hash of everything the built bytes depend on: the source, the flags, the CPU and
    the compiler."""
    digest = hashlib.sha256(SOURCE.read_bytes())
    for part in (" ".join(FLAGS), _machine(), _compiler_identity(compiler)):
        digest.update(b"\0" + part.encode())
    return digest.hexdigest()[:16]


def _machine() -> str:
    """What ``-march=native`` depends on: the architecture, every distinct identifying line
    of ``/proc/cpuinfo`` over all processors (x86's model and flags, Arm's implementer, part
    and Features, RISC-V's isa: a machine whose file lacks x86's lines still differs from
    the next), and the kernel's hardware capability words."""
    try:
        lines = CPUINFO.read_text(errors="replace").splitlines()
    except OSError:
        lines = []
    fields = {
        " ".join(line.split())
        for line in lines
        if line.split(":", 1)[0].strip().lower() in CPU_FIELDS
    }
    return "\n".join([platform.machine(), *sorted(fields), _hwcaps()])


def _hwcaps() -> str:
    """The ``AT_HWCAP`` words of this process's auxiliary vector (where Arm and others list
    the CPU's features), '' where it cannot be read."""
    try:
        data = AUXV.read_bytes()
    except OSError:
        return ""
    size = struct.calcsize("@LL")
    pairs = struct.iter_unpack("@LL", data[: len(data) - len(data) % size])
    return " ".join(f"{kind}={value:x}" for kind, value in pairs if kind in HWCAPS)


def _compiler_identity(compiler: str) -> str:
    """The compiler's path and the macros it defines under ``FLAGS``: its version, and the
    instruction sets ``-march=native`` turns on as this compiler sees this CPU."""
    command = [compiler, *FLAGS, "-dM", "-E", "-x", "c", os.devnull]
    out = _run(command, compiler)
    return os.path.realpath(shutil.which(compiler) or compiler) + "\n" + out


def _run(command: list[str], compiler: str) -> str:
    """The compiler's output, or ``_UnusableError`` with its last line."""
    try:
        out = subprocess.run(command, capture_output=True, text=True, timeout=600)
    except (OSError, subprocess.SubprocessError) as e:  # no such compiler, or it hung
        raise _UnusableError(
            f"the GGUF kernels did not build ({compiler}: {getattr(e, 'strerror', None) or e})"
        ) from None
    if out.returncode != 0:
        lines = (out.stderr or out.stdout).strip().splitlines()
        last = lines[-1] if lines else f"{compiler} exited with {out.returncode}"
        raise _UnusableError(f"the GGUF kernels did not build ({last})")
    return out.stdout


# ---- a private folder, a verified file ---------------------------------------------------


def _private_folder() -> Path:
    """The first private folder of ``_folders()`` (made if missing); a warning when it is
    not the cache folder's own."""
    if not hasattr(os, "getuid"):
        raise _UnusableError("the GGUF kernels need a system whose files have owners to check")
    first, *others = _folders()
    why = _not_private(first)
    if why is None:
        return first
    for folder in others:
        if _not_private(folder) is None:
            message = f"the kernel cache is not private ({why}): GGUF kernels built in {folder}"
            warnings.warn(message, stacklevel=4)
            return folder
    raise _UnusableError(f"the GGUF kernels have no private folder to be built in ({why})")


def _folders() -> list[Path]:
    """Where the library may live, in order: the cache folder's ``kernels/``, the user's
    own default cache (persistent), a per-user folder in the temporary directory."""
    folders = [cache_root() / "kernels"]
    with contextlib.suppress(RuntimeError, KeyError):  # no home directory to be found
        folders.append(Path.home() / ".cache" / "glassformer" / "kernels")
    folders.append(Path(tempfile.gettempdir()) / f"glassformer-kernels-{os.getuid()}")
    return list(dict.fromkeys(folders))


def _not_private(folder: Path) -> str | None:
    """None when ``folder`` is private (made 0700 if missing); else why not. A folder of this
    user's that others cannot write (an older glassformer's 0755) is narrowed to 0700: only
    this user can have put anything in it."""
    try:
        folder.mkdir(mode=0o700, parents=True, exist_ok=True)
        why = _changeable_parent(folder)
        if why:
            return why
        st = os.lstat(folder)
        if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid():
            return f"{folder} is not a directory of yours"
        if st.st_mode & 0o022:
            return f"{folder} can be written by others (mode {st.st_mode & 0o777:o})"
        if st.st_mode & 0o077:
            os.chmod(folder, st.st_mode & 0o700)
        if not os.access(folder, os.W_OK | os.X_OK):
            return f"{folder} cannot be written"
    except OSError as e:
        return f"{folder}: {e.strerror or e}"
    return None


def _changeable_parent(folder: Path) -> str | None:
    """The first parent of ``folder`` (symbolic links resolved) that someone other than this
    user or root could rename entries in, or None."""
    for parent in Path(os.path.realpath(folder)).parents:
        st = os.stat(parent)
        shared = st.st_mode & 0o022 and not st.st_mode & stat.S_ISVTX
        if st.st_uid not in (os.getuid(), 0) or shared:
            return f"{parent} can be changed by others"
    return None


def _verified(target: Path) -> bool:
    """Whether ``target`` is the library this user built: a file of theirs that nobody else
    can write, whose bytes hash to what its ``.sha256`` file recorded at build time."""
    try:
        st = os.lstat(target)
        if not stat.S_ISREG(st.st_mode) or st.st_uid != os.getuid() or st.st_mode & 0o022:
            return False
        if st.st_size > MAX_LIBRARY_BYTES:
            return False
        with _open_regular(_record(target)) as f:
            recorded = f.read(65)  # 64 hex digits and a newline
        return recorded.decode("ascii", "replace").strip() == _digest(target)
    except OSError:
        return False


def _record(target: Path) -> Path:
    return target.with_name(target.name + ".sha256")


def _open_regular(path: Path) -> BinaryIO:
    """``path`` opened to read, or OSError where it is not a regular file: opened without
    blocking or following a link (a FIFO in its place would wait forever), then checked."""
    flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_NOFOLLOW", 0)
    fd = os.open(path, flags)
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise OSError(f"{path} is not a regular file")
    return os.fdopen(fd, "rb")


def _digest(path: Path) -> str:
    digest = hashlib.sha256()
    with _open_regular(path) as f:
        while chunk := f.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


# ---- building --------------------------------------------------------------------------


def _build(compiler: str, target: Path, key: str) -> None:
    """Compile into ``target``, then record the hash of its bytes beside it (after it: a
    build killed between the two leaves a library without a record, built again)."""
    _write_whole(target, key, lambda path: _compile(compiler, path))
    digest = _digest(target)  # the folder is private: these are the bytes just built
    _write_whole(_record(target), key, lambda path: Path(path).write_text(digest + "\n"))


def _compile(compiler: str, output: str) -> None:
    _run([compiler, *FLAGS, "-o", output, str(SOURCE), "-lm"], compiler)


def _write_whole(path: Path, key: str, write: Callable[[str], object]) -> None:
    """``write(temporary)``, then the temporary file renamed to ``path``: whole or not at
    all. The temporary's name is one only this module gives (``TEMPORARY``): what
    ``_remove_stale`` may remove once a killed build has left it."""
    fd, temporary = tempfile.mkstemp(prefix=f".gguf-{key}-", suffix=".tmp", dir=path.parent)
    os.close(fd)
    try:
        write(temporary)
        os.replace(temporary, path)
    finally:
        if os.path.exists(temporary):
            os.unlink(temporary)


def _remove_stale(folder: Path) -> None:
    """Remove what builds killed mid-compile left in ``folder``: only files of this user
    named as ``_write_whole`` names them, and only those older than ``STALE_SECONDS`` (a build
    in progress in another process is minutes old at most). Nothing else is touched."""
    cutoff = time.time() - STALE_SECONDS
    with os.scandir(folder) as entries:
        for entry in entries:
            if not TEMPORARY.fullmatch(entry.name):
                continue
            try:
                st = entry.stat(follow_symlinks=False)
                if stat.S_ISREG(st.st_mode) and st.st_uid == os.getuid() and st.st_mtime < cutoff:
                    os.unlink(entry.path)
            except OSError:  # gone meanwhile: removed by another process
                pass


# ---- attention for one query (a decoding step) ------------------------------------------


def _one_query(q: Tensor, k: Tensor, v: Tensor, allowed: Tensor | None, scale: float) -> Tensor:
    """``glassformer::one_query_attention``: q (B, H, Dh), k (B, Hkv, Tk, Dh), v (B, Hkv, Tk,
    Dv), allowed (B, Tk) bool or None → (B, H, Dv), fp32, contiguous."""
    lib = kernels()
    assert lib is not None  # the caller checked
    B, H, Dh = q.shape
    Hkv, Tk, Dv = k.size(1), k.size(2), v.size(3)
    out = torch.empty(B, H, Dv, dtype=torch.float32, device="cpu")  # C writes fp32
    mask = 0 if allowed is None else allowed.data_ptr()
    lib.one_query_attention(
        q.data_ptr(), k.data_ptr(), v.data_ptr(), mask, out.data_ptr(), B, H, Hkv, Tk, Dh, Dv, scale
    )
    return out


_LIBRARY = torch.library.Library("glassformer", "DEF")
_LIBRARY.define(
    "one_query_attention(Tensor q, Tensor k, Tensor v, Tensor? allowed, float scale) -> Tensor"
)
_LIBRARY.impl("one_query_attention", _one_query, "CPU")


@torch.library.register_fake("glassformer::one_query_attention")
def _(q: Tensor, k: Tensor, v: Tensor, allowed: Tensor | None, scale: float) -> Tensor:
    return q.new_empty(q.shape[0], q.shape[1], v.shape[3])


@register_one_query
def one_query_attention(
    q: Tensor, k: Tensor, v: Tensor, allowed: Tensor | None, scale: float
) -> Tensor | None:
    """A decoding step's attention in C, (B, H, 1, Dh) queries → (B, H, 1, Dv), or None where
    it does not apply (not fp32 on the CPU, a mask other than one row of keys per sequence,
    no compiler); ``allowed`` (B, 1, 1, Tk) bool."""
    fp32_cpu = all(t.device.type == "cpu" and t.dtype == torch.float32 for t in (q, k, v))
    rows = allowed is None or (allowed.dim() == 4 and allowed.shape[1:3] == (1, 1))
    if not (fp32_cpu and rows and q.size(2) == 1 and ready()):
        return None
    B, H = q.shape[:2]
    flat = None if allowed is None else allowed.reshape(B, -1).contiguous()
    if flat is not None and (flat.dtype != torch.bool or flat.shape[1] != k.size(2)):
        return None
    out = torch.ops.glassformer.one_query_attention(
        q.reshape(B, H, -1).contiguous(), k.contiguous(), v.contiguous(), flat, scale
    )
    return out[:, :, None]
