"""Fuzzing the caches glassformer reads back (issue 49): ``precision.json`` and the GGUF
kernel library's folder. A cache is never a reason to stop: whatever is in it, the reader
loads it or bypasses it with (at most) one warning, and never loads a library that is not
the one it built, let alone runs a planted one.

The seeds are made by glassformer's own code in a child: a precision entry written by
``bf16_measurement`` (its timing stubbed to a trusted answer), and the kernel folder as
``kernels()`` builds it, with ``$CC`` a stand-in compiler that copies a library compiled
once here (so that rebuilding after a refusal takes no time; the key, which hashes the
compiler's path, is the same in the seed and every case).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
from fuzzing import Violation, fuzz, one_in, register, session
from hypothesis import strategies as st
from test_fuzz_json import mutate_file, special_file

import glassformer.cli.bench  # noqa: F401  (imported once, in the server: children start warm)
import glassformer.kernels.gguf_kernels  # noqa: F401  (importing builds nothing)

PRECISION_SHAPES = [(8, 64, 64), (8, 64, 128)]
SOURCE = Path(__file__).parents[1] / "src" / "glassformer" / "kernels" / "csrc" / "gguf.c"
FLAGS = ["-O3", "-march=native", "-fopenmp", "-ffp-contract=off", "-shared", "-fPIC"]
PLANTED_C = """#include <stdio.h>
#include <stdlib.h>
__attribute__((constructor)) static void planted(void) {
    const char *marker = getenv("FUZZ_PLANTED");
    FILE *f = marker ? fopen(marker, "w") : NULL;
    if (f) { fputs("ran\\n", f); fclose(f); }
}
"""
FAKE_CC = """#!/bin/bash
# A compiler that "builds" the shared library by copying one built before; anything else
# (the compiler's version, its macros) is the real compiler's answer.
for ((i = 1; i <= $#; i++)); do
    if [ "${!i}" = "-o" ]; then j=$((i + 1)); out="${!j}"; fi
done
if [ -n "$out" ] && [[ " $* " == *" -shared "* ]]; then exec cp "BUILT" "$out"; fi
exec cc "$@"
"""


# ---- the readers -------------------------------------------------------------------------------


def read_precision_cache(case: Path) -> None:
    """``bench precision`` (its list, then ``--refresh``) and ``--dtype auto``'s look-up, with
    ``case`` the cache folder (``$GLASSFORMER_CACHE``)."""
    from glassformer.cli.bench import precision_report
    from glassformer.kernels import precision

    precision_report(False, None)
    precision.bf16_measurement(PRECISION_SHAPES, linear=True, seconds=0.002)
    precision.refresh(seconds=0.002)


def seed_precision_cache(case: Path) -> None:
    """A trusted entry, written by ``bf16_measurement`` itself (its timing stubbed)."""
    import time

    from glassformer.kernels import precision

    trusted = precision.Measurement(100.0, 150.0, 0.02, 0.03, round(time.time()))
    precision._measure = lambda *args, **kwargs: trusted  # noqa: SLF001 (the seed only)
    precision.bf16_measurement(PRECISION_SHAPES, linear=True, seconds=0.002)


def load_kernels(case: Path) -> str:
    """``kernels()``: the library it loads (mapped in this process from under the case's
    folder) must hash to the one built (``$FUZZ_BUILT_SHA``); a planted one must not run.
    Says whether it loaded the library as it was, or built one (again)."""
    from glassformer.kernels.gguf_kernels import kernels

    before = {p: _identity(p) for p in case.parent.rglob("*.so") if p.is_file()}
    try:
        lib = kernels()
    finally:
        if Path(os.environ["FUZZ_PLANTED"]).exists():
            raise Violation("a library planted in the kernel cache ran its code")
    folder = str(case.parent)
    mapped = {Path(p) for p in Path("/proc/self/maps").read_text().split() if p.startswith(folder)}
    for path in mapped:
        if _sha(path) != os.environ["FUZZ_BUILT_SHA"]:
            raise Violation(f"loaded {path.name}, which is not the library built")
    if lib is None:
        return "bypassed"
    where = "in the cache" if all(case in p.parents for p in mapped) else "elsewhere"
    as_it_was = all(before.get(p) == _identity(p) for p in mapped)
    return f"loaded {'as it was' if as_it_was else 'after building it'} ({where})"


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _identity(path: Path) -> tuple[int, int, str]:
    """The file and its bytes: a library built again has other ones (or another inode)."""
    info = path.stat()
    return info.st_ino, info.st_mtime_ns, _sha(path)


PRECISION = register("precision cache", read_precision_cache, may_refuse=False, max_warnings=1)
SEED_PRECISION = register("precision seed", seed_precision_cache)
KERNELS = register("kernel cache", load_kernels, may_refuse=False, max_warnings=1)
FAST = {PRECISION: 30, KERNELS: 30}
SLOW = {PRECISION: 150, KERNELS: 150}


def _env(folder: Path, case: Path, tools: dict[str, Any] | None = None) -> dict[str, str]:
    """The environment of a case: its own cache, home and temporary folder."""
    for name in ("home", "tmp"):
        (folder / name).mkdir(exist_ok=True)
    env = {"GLASSFORMER_CACHE": str(case), "HOME": str(folder / "home")}
    env["GLASSFORMER_FASTER"] = ""  # the precision is measured, not forced as elsewhere
    env |= {"TMPDIR": str(folder / "tmp"), "FUZZ_PLANTED": str(folder / "PLANTED")}
    if tools:
        env |= {"CC": str(tools["cc"]), "FUZZ_BUILT_SHA": tools["sha"]}
    return env


# ---- the seeds ---------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def fuzzer(request, tmp_path_factory):
    return session(request, tmp_path_factory)


@pytest.fixture(scope="module")
def precision_seed(fuzzer) -> Path:
    folder = fuzzer.folder(SEED_PRECISION)
    (folder / "case").mkdir(mode=0o700)
    result = fuzzer.server.run(SEED_PRECISION, folder / "case", env=_env(folder, folder / "case"))
    assert result["outcome"] == "loaded", result
    assert (folder / "case" / "precision.json").is_file()
    return folder / "case"


@pytest.fixture(scope="module")
def kernel_tools(tmp_path_factory) -> dict[str, Any]:
    """The library compiled once, a planted one (its constructor leaves a file), and a
    compiler that copies the first wherever a build asks."""
    compiler = shutil.which("cc") or pytest.skip("no C compiler: the kernels are not built here")
    folder = tmp_path_factory.mktemp("kernel-tools")
    built, planted = folder / "built.so", folder / "planted.so"
    subprocess.run([compiler, *FLAGS, "-o", built, SOURCE, "-lm"], check=True)
    (folder / "planted.c").write_text(PLANTED_C)
    subprocess.run([compiler, "-shared", "-fPIC", "-o", planted, folder / "planted.c"], check=True)
    cc = folder / "cc"
    cc.write_text(FAKE_CC.replace("BUILT", str(built)))
    cc.chmod(0o755)
    sha = hashlib.sha256(built.read_bytes()).hexdigest()
    return {"cc": cc, "sha": sha, "built": built, "planted": planted}


@pytest.fixture(scope="module")
def kernel_seed(fuzzer, kernel_tools) -> Path:
    """The kernel folder as ``kernels()`` leaves it after a build."""
    folder = fuzzer.folder(KERNELS)
    (folder / "case").mkdir(mode=0o700)
    env = _env(folder, folder / "case", kernel_tools)
    result = fuzzer.server.run(KERNELS, folder / "case", env=env)
    assert result["outcome"] == "loaded" and not result["warnings"], result
    assert list((folder / "case").rglob("*.so")), "kernels() built nothing in its cache folder"
    return folder / "case"


# ---- the mutations -------------------------------------------------------------------------------


def make_precision_case(seed: Path) -> Any:
    def make_case(data: Any, folder: Path) -> tuple[str, dict[str, str]]:
        case = Path(shutil.copytree(seed, folder / "case"))
        return mutate_file(data, case / "precision.json"), _env(folder, case)

    return make_case


MODES = [0o777, 0o775, 0o757, 0o766, 0o700, 0o500, 0o555, 0o1777]
NOT_PRIVATE = [0o777, 0o775, 0o757, 0o770]


def _library(data: Any, lib: Path, tools: dict[str, Any]) -> str:
    """The library's bytes spoiled or replaced (another library, text, nothing)."""
    how = data.draw(st.sampled_from(["cut", "bytes", "libm", "text", "empty", "special"]))
    blob = lib.read_bytes()
    if how == "special":
        return special_file(data, lib)
    if how == "cut":
        blob = blob[: data.draw(st.integers(0, len(blob) - 1), label="cut")]
    elif how == "bytes":
        at = data.draw(st.integers(0, len(blob) - 8), label="at")
        blob = blob[:at] + data.draw(st.binary(min_size=1, max_size=8)) + blob[at + 8 :]
    elif how == "libm":
        libm = Path("/lib/x86_64-linux-gnu/libm.so.6")
        blob = libm.read_bytes() if libm.exists() else b""
    else:
        blob = b"#!/bin/sh\necho hello\n" if how == "text" else b""
    lib.write_bytes(blob)
    return f"{lib.name}: {how}"


def _planted(data: Any, case: Path, lib: Path, tools: dict[str, Any]) -> str:
    """What another user could do to a cache folder they can write: a library of theirs in
    place of ours, with its hash where ours was recorded; a folder made writable by them."""
    lib.write_bytes(tools["planted"].read_bytes())
    forged = hashlib.sha256(lib.read_bytes()).hexdigest()
    for sidecar in case.rglob("*"):
        if sidecar.is_file() and sidecar != lib and tools["sha"] in sidecar.read_text("latin-1"):
            sidecar.write_text(sidecar.read_text("latin-1").replace(tools["sha"], forged))
    parents = [p for p in [lib.parent, *lib.parent.parents] if p == case or case in p.parents]
    where = parents[data.draw(st.sampled_from(range(len(parents))), label="opened")]
    how = _open_up(data, where)
    return f"{lib.name} planted (its hash recorded) and {where.name}/ {how}"


def _open_up(data: Any, where: Path) -> str:
    if os.geteuid() == 0 and one_in(data, 3, "chown"):
        os.chown(where, 65534, 65534)
        return "owned by another user"
    mode = data.draw(st.sampled_from(NOT_PRIVATE), label="mode")
    where.chmod(mode)
    return f"mode {oct(mode)}"


def _tree(data: Any, case: Path) -> str:
    """Modes and owners changed, files added or taken away."""
    paths = sorted(case.rglob("*")) + [case]
    path = paths[data.draw(st.sampled_from(range(len(paths))), label="path")]
    how = data.draw(st.sampled_from(["mode", "mode", "owner", "remove", "leftover"]), label="t")
    if how == "mode" and not path.is_symlink():
        path.chmod(mode := data.draw(st.sampled_from(MODES), label="mode"))
        return f"{path.name} mode {oct(mode)}"
    if how == "owner" and os.geteuid() == 0:
        os.lchown(path, 65534, 65534)
        return f"{path.name} owned by another user"
    if how == "remove" and path != case:
        shutil.rmtree(path) if path.is_dir() and not path.is_symlink() else path.unlink()
        return f"{path.name} removed"
    folder = path if path.is_dir() else path.parent
    leftover = folder / ".gguf-0123456789abcdef-abcdefgh.tmp"
    leftover.write_bytes(b"\x7fELF half a library")
    os.utime(leftover, (1, 1))
    return f"a killed build's leftover in {folder.name}/"


def make_kernel_case(seed: Path, tools: dict[str, Any]) -> Any:
    def make_case(data: Any, folder: Path) -> tuple[str, dict[str, str]]:
        case = Path(shutil.copytree(seed, folder / "case", symlinks=True))
        lib = sorted(case.rglob("*.so"))[0]
        sidecars = [p for p in case.rglob("*") if p.is_file() and p.suffix != ".so"]
        how = data.draw(st.sampled_from(["library", "planted", "sidecar", "tree", "tree"]))
        if how == "library":
            done = _library(data, lib, tools)
        elif how == "planted":
            done = _planted(data, case, lib, tools)
        elif how == "sidecar" and sidecars:
            done = _sidecar(data, sidecars[data.draw(st.sampled_from(range(len(sidecars))))])
        else:
            done = _tree(data, case)
        if how != "planted" and one_in(data, 4, "and the tree"):  # (it might close it again)
            done += "; " + _tree(data, case)
        return done, _env(folder, case, tools)

    return make_case


def _sidecar(data: Any, file: Path) -> str:
    """A file kernels() keeps beside the library (its hash): spoiled as text or as JSON."""
    text = file.read_bytes()
    try:
        json.loads(text)
    except ValueError:
        how = data.draw(st.sampled_from(["cut", "other", "empty", "long", "upper", "special"]))
        if how == "special":
            return special_file(data, file)
        new = {"cut": text[: len(text) // 2], "other": b"0" * 64 + b"\n", "empty": b"",
               "long": text * 10**5, "upper": text.upper()}[how]  # fmt: skip
        file.write_bytes(new)
        return f"{file.name}: {how}"
    return mutate_file(data, file)


# ---- the tests -------------------------------------------------------------------------------


def test_fuzzed_precision_caches_are_used_or_bypassed_with_one_warning(fuzzer, precision_seed):
    fuzz(fuzzer, PRECISION, make_precision_case(precision_seed), FAST[PRECISION])


def test_fuzzed_kernel_caches_never_load_another_library(fuzzer, kernel_seed, kernel_tools):
    fuzz(fuzzer, KERNELS, make_kernel_case(kernel_seed, kernel_tools), FAST[KERNELS])


@pytest.mark.slow
def test_fuzzed_precision_caches_many(fuzzer, precision_seed):
    fuzz(fuzzer, PRECISION, make_precision_case(precision_seed), SLOW[PRECISION])


@pytest.mark.slow
def test_fuzzed_kernel_caches_many(fuzzer, kernel_seed, kernel_tools):
    fuzz(fuzzer, KERNELS, make_kernel_case(kernel_seed, kernel_tools), SLOW[KERNELS])
