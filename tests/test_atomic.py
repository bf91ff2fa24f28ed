"""glassformer.atomic: files follow the user's umask, a failed write leaves nothing, a
save removes only its own temporaries (whatever its name holds), and an output path grows
at most two new folders."""

import os
import stat

import pytest

from glassformer.atomic import (
    make_folder,
    remove_partial_files,
    tidy_directory,
    umask,
    write_atomic,
    write_directory_atomically,
)


@pytest.fixture
def set_umask():
    """``set_umask(mask)`` for this test; the process's own is put back after it."""
    before = os.umask(0o022)
    os.umask(before)
    yield os.umask
    os.umask(before)


def mode(path):
    return stat.S_IMODE(path.stat().st_mode)


@pytest.mark.parametrize("mask, expected", [(0o022, 0o644), (0o077, 0o600), (0o002, 0o664)])
def test_a_written_file_follows_the_umask(mask, expected, tmp_path, set_umask):
    set_umask(mask)
    assert umask() == mask
    write_atomic(tmp_path / "page.html", b"<p>hi</p>")
    assert (tmp_path / "page.html").read_bytes() == b"<p>hi</p>"
    assert mode(tmp_path / "page.html") == expected
    write_atomic(tmp_path / "page.html", b"again")  # a replaced file too
    assert mode(tmp_path / "page.html") == expected
    assert os.listdir(tmp_path) == ["page.html"]


@pytest.mark.parametrize("mask, files, folder", [(0o022, 0o644, 0o755), (0o077, 0o600, 0o700)])
def test_a_written_directory_follows_the_umask(mask, files, folder, tmp_path, set_umask):
    set_umask(mask)

    def write(tmp):
        (tmp / "a.json").write_text("{}")
        fd = os.open(tmp / "b.bin", os.O_WRONLY | os.O_CREAT, 0o600)  # as tempfile makes them
        os.close(fd)

    write_directory_atomically(tmp_path / "ckpt", write)
    assert mode(tmp_path / "ckpt") == folder
    assert {p.name: mode(p) for p in (tmp_path / "ckpt").iterdir()} == {
        "a.json": files,
        "b.bin": files,
    }


def test_a_failed_write_leaves_no_temporary_and_the_old_file(tmp_path, monkeypatch):
    target = tmp_path / "results.json"
    write_atomic(target, b"old")

    def refuse(src, dst):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", refuse)
    with pytest.raises(OSError, match="No space"):
        write_atomic(target, b"new")
    monkeypatch.undo()
    assert target.read_bytes() == b"old" and os.listdir(tmp_path) == ["results.json"]


@pytest.mark.parametrize("name", ["*", "?", "[ab]", "ckpt", "a*b?[c]"])
def test_a_save_removes_only_its_own_temporaries_whatever_its_name(name, tmp_path):
    """A killed save's temporary of NAME goes; a glob made of NAME would have taken the
    hidden folders of other names and the user's own ``.NAME.something`` with it."""
    beside = [
        f".{name}.settings",  # the user's: eight letters, like tempfile's random part
        f".{name}.partial-notours!",  # not what tempfile makes
        ".a.settings",  # matches ".[ab].*"
        ".b.partial-abcdefgh",  # another checkpoint's temporary: matches ".[ab].partial-*"
        ".other.partial-abcdefgh",  # matches ".*.partial-*" and ".?????.partial-*"
        ".x.old",  # matches ".?.old" and ".*.*"
    ]
    for folder in beside:
        (tmp_path / folder).mkdir()
        (tmp_path / folder / "keep.txt").write_text("mine")
    ours = tmp_path / f".{name}.partial-k1ll3d_0"
    ours.mkdir()
    (ours / "model.safetensors").write_bytes(b"half")
    write_directory_atomically(tmp_path / name, lambda tmp: (tmp / "x").write_text("1"))
    assert not ours.exists()
    for folder in beside:
        assert (tmp_path / folder / "keep.txt").read_text() == "mine", folder
    assert sorted(os.listdir(tmp_path)) == sorted([*beside, name])


def test_make_folder_creates_the_folder_and_at_most_its_parent(tmp_path):
    assert make_folder(tmp_path / "runs" / "demo") == tmp_path / "runs" / "demo"
    assert (tmp_path / "runs" / "demo").is_dir()
    with pytest.raises(FileNotFoundError) as e:
        make_folder(tmp_path / "exp" / "2024" / "run1")
    message = str(e.value)
    assert "\n" not in message and f"{tmp_path / 'exp'} does not exist" in message
    assert "at most its parent" in message
    assert not (tmp_path / "exp").exists()
    make_folder(tmp_path / "new" / "run", create=False)  # only checked
    assert not (tmp_path / "new").exists()
    with pytest.raises(FileNotFoundError):
        make_folder(tmp_path / "a" / "b" / "c", create=False)


def test_tidy_directory_repairs_what_killed_saves_left(tmp_path):
    ckpt, old = tmp_path / "ckpt", tmp_path / ".ckpt.old"
    old.mkdir()
    (old / "config.json").write_text("previous")
    tidy_directory(ckpt)  # killed between the two renames: the previous one comes back
    assert (ckpt / "config.json").read_text() == "previous" and not old.exists()
    old.mkdir()  # killed after the second rename, before the copy moved aside was removed
    (tmp_path / ".ckpt.partial-abcdefgh").mkdir()
    (tmp_path / ".ckpt.settings").mkdir()  # not a name a save gives
    tidy_directory(ckpt)
    assert sorted(os.listdir(tmp_path)) == [".ckpt.settings", "ckpt"]


def test_remove_partial_files_takes_only_write_atomics_own(tmp_path):
    target = tmp_path / "run.json"
    names = [".run.json.k1ll3d_0.partial", ".run.json.notes.partial", ".run.json.bak", "x"]
    for name in names:
        (tmp_path / name).write_text("")
    remove_partial_files(target)
    assert sorted(os.listdir(tmp_path)) == sorted(names[1:])
