"""glassformer.kernels.gguf_kernels: the C library is loaded only from a private folder of
this user's and only with the bytes it was built with, keyed by the whole CPU and the
compiler; any failure to build, verify or load it is one warning and the PyTorch path.

The library here is a stub (the four functions, doing nothing, and ``stub_id``) that a
stand-in for the compiler copies into place: what is tested is which file gets loaded, not
the kernels (tests/test_gguf_linear.py builds and checks those). A planted library writes a
marker file from its constructor, the moment it is loaded."""

from __future__ import annotations

import ctypes
import functools
import os
import shutil
import subprocess
import threading
import time
import warnings
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from glassformer.kernels import gguf_kernels, gguf_linear
from glassformer.kernels.gguf_blocks import Q8_0

COMPILER = shutil.which("cc") or shutil.which("gcc")
pytestmark = pytest.mark.skipif(COMPILER is None, reason="no C compiler here")

STUB = r"""
#include <stdio.h>
int stub_id(void) { return ID; }
void gguf_matmul(void) {}
void gguf_matmul_interleaved(void) {}
void gguf_dequantize(void) {}
void gguf_dequantize_interleaved(void) {}
void one_query_attention(void) {}
#ifdef MARKER
__attribute__((constructor)) static void planted(void) {
    FILE *f = fopen(MARKER, "w");
    if (f) { fputs("ran\n", f); fclose(f); }
}
#endif
"""


def stub(folder: Path, name: str, *defines: str) -> Path:
    source, library = folder / "stub.c", folder / name
    source.write_text(STUB)
    command = [COMPILER, "-shared", "-fPIC", *defines, "-o", str(library), str(source)]
    subprocess.run(command, check=True, capture_output=True)
    return library


@pytest.fixture(scope="module")
def good(tmp_path_factory) -> Path:
    return stub(tmp_path_factory.mktemp("stub"), "good.so", "-DID=1")


@pytest.fixture
def planted(tmp_path) -> Path:
    """A library that writes ``tmp_path / 'marker'`` when it is loaded."""
    marker = tmp_path / "marker"
    return stub(tmp_path, "planted.so", "-DID=2", f'-DMARKER="{marker}"')


@pytest.fixture
def builds(monkeypatch, tmp_path, good):
    """A cache, home and temporary folder of this test's own; the compiler's step stood in
    for by a copy of the good stub (``builds`` lists the files it wrote); ``kernels()``
    fresh, the one the rest of the suite holds left alone."""
    monkeypatch.setenv("GLASSFORMER_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setenv("CC", COMPILER)
    (tmp_path / "tmp").mkdir()
    monkeypatch.setattr("tempfile.tempdir", str(tmp_path / "tmp"))
    written: list[str] = []

    def copy(compiler: str, output: str) -> None:
        written.append(output)
        shutil.copyfile(good, output)

    monkeypatch.setattr(gguf_kernels, "_compile", copy)
    fresh = functools.cache(gguf_kernels.kernels.__wrapped__)
    for module in (gguf_kernels, gguf_linear):
        monkeypatch.setattr(module, "kernels", fresh)
    monkeypatch.setattr(gguf_kernels, "_READY", gguf_kernels._READY)
    return written


def target(folder: Path) -> Path:
    return folder / f"gguf-{gguf_kernels._key(COMPILER)}.so"


def plant(library: Path, at: Path) -> None:
    """``library`` at ``at`` with a record of its own bytes beside it: all that anyone who
    can write the folder can do."""
    at.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(library, at)
    Path(str(at) + ".sha256").write_text(gguf_kernels._digest(at) + "\n")


def loaded() -> tuple[int, Path]:
    """Which stub ``kernels()`` loaded, and from where."""
    lib = gguf_kernels.kernels()
    assert lib is not None
    lib.stub_id.restype = ctypes.c_int
    return lib.stub_id(), Path(lib._name)


def test_a_correct_build_in_a_private_folder_is_reused(builds, tmp_path):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert loaded() == (1, target(tmp_path / "cache" / "kernels"))
        gguf_kernels.kernels.cache_clear()
        assert loaded()[0] == 1
    assert len(builds) == 1  # built once, then found and verified
    assert (tmp_path / "cache" / "kernels").stat().st_mode & 0o777 == 0o700


def test_an_older_glassformers_0755_folder_is_narrowed_to_0700(builds, tmp_path):
    (tmp_path / "cache" / "kernels").mkdir(parents=True, mode=0o755)
    os.chmod(tmp_path / "cache" / "kernels", 0o755)
    assert loaded() == (1, target(tmp_path / "cache" / "kernels"))
    assert (tmp_path / "cache" / "kernels").stat().st_mode & 0o777 == 0o700


@pytest.mark.parametrize("how", ["writable-by-all", "another-users"])
def test_a_library_planted_in_a_cache_others_can_write_is_never_loaded(
    builds, tmp_path, planted, how
):
    """A cache whose kernels/ all can write, or another user's: the library someone put
    there (with a record of its own bytes) is not loaded; the user's own folder is used,
    with a warning."""
    kernels = tmp_path / "cache" / "kernels"
    plant(planted, target(kernels))
    if how == "writable-by-all":
        os.chmod(kernels, 0o777)
        why = "can be written by others"
    else:
        if os.geteuid() != 0:
            pytest.skip("only root can give a folder to another user")
        os.chmod(kernels, 0o700)
        for path in (kernels, *kernels.iterdir()):
            os.chown(path, 12345, 12345)
        why = "is not a directory of yours"
    with pytest.warns(UserWarning, match=f"kernel cache is not private.*{why}"):
        which, path = loaded()
    assert not (tmp_path / "marker").exists()
    assert (which, path.parent) == (1, tmp_path / "home" / ".cache" / "glassformer" / "kernels")
    assert path.parent.stat().st_mode & 0o777 == 0o700


def test_a_private_folder_under_a_parent_others_can_change_is_not_used(
    builds, tmp_path, planted, good
):
    """kernels/ is this user's and 0700, but its parent is writable by all (not sticky):
    anyone could swap it between the check and the load. A sticky parent (as /tmp) is fine."""
    kernels = tmp_path / "cache" / "kernels"
    kernels.mkdir(parents=True, mode=0o700)
    plant(planted, target(kernels))
    os.chmod(tmp_path / "cache", 0o777)
    with pytest.warns(UserWarning, match=f"{tmp_path / 'cache'} can be changed by others"):
        assert loaded()[0] == 1
    assert not (tmp_path / "marker").exists()
    os.chmod(tmp_path / "cache", 0o1777)
    plant(good, target(kernels))
    gguf_kernels.kernels.cache_clear()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert loaded() == (1, target(kernels))


@pytest.mark.parametrize("record", ["wrong", "missing", "garbled"])
def test_a_library_whose_bytes_do_not_match_its_record_is_rebuilt_not_loaded(
    builds, tmp_path, good, planted, record
):
    """In the private folder, an earlier build's library replaced (a corrupt file, or one
    written there by other means) while its record stays: built again, never loaded."""
    kernels = tmp_path / "cache" / "kernels"
    kernels.mkdir(parents=True, mode=0o700)
    plant(good, target(kernels))
    shutil.copyfile(planted, target(kernels))
    sidecar = Path(str(target(kernels)) + ".sha256")
    if record == "missing":
        sidecar.unlink()
    if record == "garbled":
        sidecar.write_bytes(b"\xff" * 10_000)
    assert loaded() == (1, target(kernels)) and len(builds) == 1
    assert not (tmp_path / "marker").exists()


def test_a_fifo_in_place_of_the_record_is_rebuilt_not_waited_on(builds, tmp_path, good):
    """A FIFO as the ``.sha256`` record once made ``kernels()`` wait forever on its open:
    now it is not verified, and the library is built again."""
    kernels = tmp_path / "cache" / "kernels"
    plant(good, target(kernels))
    record = Path(str(target(kernels)) + ".sha256")
    record.unlink()
    os.mkfifo(record)
    assert finishes(gguf_kernels.kernels, record) is not None
    assert len(builds) == 1 and record.is_file()


def test_a_fifo_in_place_of_the_library_is_refused_when_hashing(tmp_path):
    """The library's hash (after its ``lstat``: a FIFO swapped in between) opens it
    without waiting, and refuses what is not a regular file."""
    os.mkfifo(tmp_path / "fifo")
    with pytest.raises(OSError, match="not a regular file"):
        finishes(lambda: gguf_kernels._digest(tmp_path / "fifo"), tmp_path / "fifo")


def finishes(call, fifo: Path):
    """``call()``'s result (or exception); a test failure if it waits on ``fifo`` for 5 s
    (the FIFO then opened and closed by a writer, so that the blocked reader ends)."""
    outcome: list = []

    def run() -> None:
        try:
            outcome.append((call(), None))
        except Exception as e:
            outcome.append((None, e))

    worker = threading.Thread(target=run, daemon=True)
    worker.start()
    worker.join(timeout=5)
    if worker.is_alive():
        os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
        worker.join()
        pytest.fail(f"waited on the FIFO {fifo.name}")
    result, error = outcome[0]
    if error is not None:
        raise error
    return result


def test_the_key_holds_every_cpu_feature_and_the_compiler(builds, tmp_path, monkeypatch):
    """Two Arm machines (no "model name" or "flags" lines), one with SVE: different keys.
    A compiler at the same path, another version: a different key."""
    arm = "processor\t: 0\nBogoMIPS\t: 50.00\nFeatures\t: fp asimd {}\nCPU part\t: 0xd0c\n"
    keys = set()
    for features in ("aes", "aes sve"):
        (tmp_path / "cpuinfo").write_text(arm.format(features))
        monkeypatch.setattr(gguf_kernels, "CPUINFO", tmp_path / "cpuinfo")
        keys.add(gguf_kernels._key(COMPILER))
    assert len(keys) == 2
    fake = tmp_path / "cc"
    for version in ("12.2.0", "13.1.0"):
        fake.write_text(f"#!/bin/sh\necho '#define __VERSION__ \"{version}\"'\n")
        fake.chmod(0o755)
        keys.add(gguf_kernels._key(str(fake)))
    assert len(keys) == 4


def q8_layer() -> gguf_linear.GGUFLinear:
    """Eight rows of 64 in Q8_0: per 32 values a fp16 scale, then 32 int8 codes."""
    g = torch.Generator().manual_seed(0)
    scales = (torch.rand(8, 2, 1, generator=g) * 0.02).half().view(torch.uint8)  # (8, 2, 2)
    codes = torch.randint(-128, 128, (8, 2, 32), generator=g, dtype=torch.int8)
    blocks = torch.cat([scales, codes.view(torch.uint8)], dim=2).reshape(8, 68)
    return gguf_linear.GGUFLinear([(Q8_0, blocks)], in_features=64)


def computes_in_pytorch(layer: gguf_linear.GGUFLinear) -> None:
    assert not layer.fast
    x = torch.randn(3, 64)
    assert torch.equal(layer(x), F.linear(x, layer.dequantized()))


@pytest.mark.parametrize("how", ["not-a-folder", "read-only"])
def test_a_cache_that_cannot_be_written_is_one_warning_and_the_pytorch_path(
    builds, tmp_path, monkeypatch, how
):
    """No folder the library could be built in (the cache, home and temporary folder all
    files, or all read-only): one warning, the layers compute in PyTorch."""
    places = [tmp_path / name for name in ("cache", "home", "tmp")]
    for place in places:
        if how == "not-a-folder":
            shutil.rmtree(place, ignore_errors=True)
            place.write_text("")
        else:
            if os.geteuid() == 0:
                pytest.skip("root writes into read-only folders")
            place.mkdir(exist_ok=True)
            place.chmod(0o555)
    monkeypatch.setattr("tempfile.tempdir", str(tmp_path / "tmp"))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        layer = q8_layer()
    assert [str(w.message) for w in caught] == [
        f"the GGUF kernels have no private folder to be built in ({caught_reason(caught)}); "
        "GGUF blocks are decoded in PyTorch (slow)"
    ]
    computes_in_pytorch(layer)
    assert builds == []


def caught_reason(caught) -> str:
    text = str(caught[0].message)
    return text[text.index("(") + 1 : text.rindex(");")]


@pytest.mark.parametrize("what", ["not-a-library", "missing-a-function"])
def test_a_built_library_that_does_not_load_is_one_warning_and_the_pytorch_path(
    builds, tmp_path, monkeypatch, what
):
    """The compiler wrote a file that is not a library (a full disk, a broken toolchain), or
    one without a kernel: its record matches, the load fails: one warning, PyTorch."""
    if what == "not-a-library":
        written, why = b"\0" * 64, "did not load"
    else:
        written, why = (
            stub(tmp_path, "partial.so", "-DID=3", "-Dgguf_matmul=x").read_bytes(),
            ("undefined symbol: gguf_matmul"),
        )
    monkeypatch.setattr(
        gguf_kernels, "_compile", lambda compiler, output: Path(output).write_bytes(written)
    )
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        layer = q8_layer()
    assert len(caught) == 1 and why in str(caught[0].message)
    assert "GGUF blocks are decoded in PyTorch" in str(caught[0].message)
    computes_in_pytorch(layer)


def test_killed_builds_temporary_files_are_removed_and_nothing_else(builds, tmp_path):
    """What a build killed mid-compile leaves (a temporary named as the build names them,
    an hour old) is removed; a build running now in another process, files named otherwise
    and folders are kept."""
    kernels = tmp_path / "cache" / "kernels"
    kernels.mkdir(parents=True, mode=0o700)
    old = time.time() - 2 * gguf_kernels.STALE_SECONDS
    names = {
        ".gguf-0123456789abcdef-k2j_x9a0.tmp": True,  # a killed build's: removed
        ".gguf-0123456789abcdef-run_now1.tmp": False,  # fresh: another build, now
        ".gguf-0123456789abcdef.tmp": True,  # not the pattern
        "notes.txt": True,
        "gguf-0123456789abcdef.so": True,
    }
    for name, aged in names.items():
        (kernels / name).write_text("x")
        if aged:
            os.utime(kernels / name, (old, old))
    (kernels / ".gguf-0123456789abcdef-dir_0000.tmp").mkdir()
    os.utime(kernels / ".gguf-0123456789abcdef-dir_0000.tmp", (old, old))
    assert loaded()[0] == 1
    left = {p.name for p in kernels.iterdir()}
    assert ".gguf-0123456789abcdef-k2j_x9a0.tmp" not in left
    assert set(names) - {".gguf-0123456789abcdef-k2j_x9a0.tmp"} <= left
    assert ".gguf-0123456789abcdef-dir_0000.tmp" in left
    assert all(gguf_kernels.TEMPORARY.fullmatch(Path(p).name) for p in builds)
