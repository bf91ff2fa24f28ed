"""Fuzzing Hugging Face directories (issue 49): ``config.json``, the shard index and the
safetensors headers of real small checkpoints (written by ``transformers``, kept in
``tests/data/fuzz/seeds/hf``) mutated by type, then opened with ``glassformer.load_checkpoint``.

The JSON mutations here serve every fuzzed JSON file (SAELens, runs, the caches): a value
becomes another by its type (a number 0, -1, huge, NaN, Infinity, a float where an int was,
a string, a list, null; a string empty, huge, a path out of the folder, a lone surrogate; a
list shorter, longer, nested thousands deep; an object with a key dropped, added or given
twice), or the file as a whole is cut, nested, not UTF-8, or not a file at all (a symlink to
``/dev/zero``, a directory, a FIFO).
"""

from __future__ import annotations

import json
import math
import os
import shutil
import struct
from pathlib import Path
from typing import Any

import pytest
from fuzzing import fuzz, index, one_in, register, session
from hypothesis import strategies as st

FAST, SLOW = 60, 300
SEEDS = Path(__file__).parent / "data" / "fuzz" / "seeds"


# ---- JSON written as a file would hold it ----------------------------------------------------


class Pairs(list):
    """An object written as these (key, value) pairs: a key may come twice."""


class Raw(bytes):
    """Bytes written into the text as they are (not UTF-8, not JSON)."""


class Deep(int):
    """A list nested this deep, ``[[[...]]]``."""


def dump(v: Any) -> bytes:
    """JSON text of ``v``, with NaN and Infinity as Python writes them."""
    if isinstance(v, Raw):
        return bytes(v)
    if isinstance(v, Deep):
        return b"[" * v + b"]" * v
    if isinstance(v, dict):
        v = Pairs(v.items())
    if isinstance(v, Pairs):
        return b"{" + b", ".join(dump(k) + b": " + dump(x) for k, x in v) + b"}"
    if isinstance(v, list):
        return b"[" + b", ".join(dump(x) for x in v) + b"]"
    return json.dumps(v).encode()  # str (surrogates escaped), numbers, NaN, bool, null


def _paths(v: Any, at: tuple = ()) -> list[tuple]:
    """Every place in ``v``: () the whole, then each key or index on the way down."""
    out = [at]
    plain_list = isinstance(v, list) and not isinstance(v, Pairs)
    items = v.items() if isinstance(v, dict) else enumerate(v) if plain_list else ()
    for k, x in items:
        out += _paths(x, (*at, k))
    return out


def _get(v: Any, path: tuple) -> Any:
    for k in path:
        v = v[k]
    return v


def _set(v: Any, path: tuple, new: Any) -> Any:
    if not path:
        return new
    _get(v, path[:-1])[path[-1]] = new
    return v


def _short(v: Any) -> str:
    text = repr(v)
    return text if len(text) < 60 else f"{text[:40]}… ({len(text)} chars)"


HOSTILE = [0, -1, 1, 2**31, 2**63, 10**30, 0.5, math.nan, math.inf, -math.inf, True, None]
HOSTILE += ["", "x" * 10**5, "../../outside", "/etc/passwd", "\ud800", [], {}, Deep(10**5)]


def _replacement(data: Any, old: Any) -> Any:
    """A value of the kind that would trip a reader of ``old``."""
    if isinstance(old, bool) or old is None:
        options = [0, 1, 2, "true", [], {}, "yes"]
    elif isinstance(old, (int, float)):
        options = [0, -1, 1, old + 1, old - 1, -old, old * 2**20, 2**31, 2**63, 10**30,
                   1e308, 0.5, old + 0.5, math.nan, math.inf, -math.inf, str(old), [old],
                   True]  # fmt: skip
    elif isinstance(old, str):
        options = ["", old * 1000, old.upper(), old + "\x00", "../../" + old, "/" + old,
                   "\ud800", 12, [old], Raw(b'"\xff\xfe"'), old + "x"]  # fmt: skip
    elif isinstance(old, list):
        options = [[], old[:-1], old + old[-1:], old[::-1], old * 100, [*old, None],
                   Deep(10**4), {"0": old}]  # fmt: skip
    else:
        return _object(data, old)
    return data.draw(st.sampled_from(options + HOSTILE), label="new value")


def _object(data: Any, old: dict) -> Any:
    how = data.draw(st.sampled_from(["drop", "add", "twice", "other"]), label="object")
    keys = list(old)
    if how == "drop" and keys:
        key = data.draw(st.sampled_from(keys), label="key")
        return {k: v for k, v in old.items() if k != key}
    if how == "twice" and keys:
        key = data.draw(st.sampled_from(keys), label="key")
        hostile = data.draw(st.sampled_from(HOSTILE), label="second value")
        return Pairs([*old.items(), (key, hostile)])
    if how == "add":
        return {**old, "fuzz": data.draw(st.sampled_from(HOSTILE), label="added")}
    return data.draw(st.sampled_from([[], "x", 0, None, Deep(10**5), [old]]), label="not one")


def mutate_json(data: Any, value: Any, name: str) -> tuple[bytes, str]:
    """The text of ``value`` with one to three of its values replaced, or (now and then)
    the whole file spoiled; and what was done."""
    if one_in(data, 10, "whole file"):
        return _spoil(data, dump(value), name)
    value = json.loads(json.dumps(value))  # a copy
    done = []
    for _ in range(data.draw(st.integers(1, 3), label="changes")):
        paths = _paths(value)
        path = paths[index(data, paths, "where")]
        try:
            old = _get(value, path)
        except (KeyError, IndexError, TypeError):
            continue  # a place an earlier change took away
        new = _replacement(data, old)
        value = _set(value, path, new)
        done.append(f"{name}{''.join(f'[{k!r}]' for k in path)}: {_short(old)} → {_short(new)}")
    return dump(value), "; ".join(done)


def _spoil(data: Any, text: bytes, name: str) -> tuple[bytes, str]:
    how = data.draw(st.sampled_from(["cut", "utf8", "nested", "empty", "bom", "list"]), label="how")
    if how == "cut":
        at = data.draw(st.integers(0, max(len(text) - 1, 0)), label="at")
        return text[:at], f"{name} cut at byte {at} of {len(text)}"
    spoiled = {
        "utf8": text[:1] + b"\xff\xfe" + text[1:],
        "nested": dump(Deep(10**5)),
        "empty": b"",
        "bom": b"\xef\xbb\xbf" + text,
        "list": b"[" + text + b"]",
    }[how]
    return spoiled, f"{name}: {how}"


def special_file(data: Any, file: Path) -> str:
    """``file`` replaced by what is not a regular file: a symlink to ``/dev/zero`` or out of
    the folder, a dangling one, a loop, a directory, a FIFO."""
    how = data.draw(
        st.sampled_from(["/dev/zero", "outside", "dangling", "loop", "directory", "fifo"]),
        label="special",
    )
    if file.is_dir():
        shutil.rmtree(file)
    else:
        file.unlink(missing_ok=True)
    if how == "directory":
        file.mkdir()
    elif how == "fifo":
        os.mkfifo(file)
    else:
        target = {"/dev/zero": "/dev/zero", "outside": "../../outside.json",
                  "dangling": "nowhere", "loop": file.name}[how]  # fmt: skip
        file.symlink_to(target)
    return f"{file.name} is {how}"


def mutate_safetensors(data: Any, blob: bytes, name: str) -> tuple[bytes, str]:
    """A safetensors file (8-byte header length, JSON header, data) with its header's values
    mutated, its length field lying, or its data cut."""
    how = data.draw(st.sampled_from(["header", "header", "length", "cut"]), label="safetensors")
    try:
        n = struct.unpack_from("<Q", blob)[0]
        header, body = json.loads(blob[8 : 8 + n]), blob[8 + n :]
    except (ValueError, RecursionError, struct.error):  # spoiled by an earlier change
        how, n = "cut", 0
    if how == "header":
        text, what = mutate_json(data, header, name)
        return struct.pack("<Q", len(text)) + text + body, what
    if how == "length":
        lie = data.draw(st.sampled_from([0, 1, n - 1, n + 1, len(blob), 2**32, 2**63]), label="n")
        return struct.pack("<Q", lie) + blob[8:], f"{name}: header length {n} → {lie}"
    at = data.draw(st.integers(0, max(len(blob) - 1, 0)), label="cut")
    return blob[:at], f"{name} cut at byte {at} of {len(blob)}"


def mutate_file(data: Any, file: Path) -> str:
    """``file`` mutated as what it is: JSON, JSON lines, safetensors; or made special."""
    if one_in(data, 20, "special"):
        return special_file(data, file)
    blob = file.read_bytes()
    try:
        json.loads(blob) if file.suffix == ".json" else None
    except (ValueError, RecursionError):  # spoiled by an earlier change: spoil it further
        new, what = _spoil(data, blob, file.name)
        file.write_bytes(new)
        return what
    if file.suffix == ".safetensors":
        new, what = mutate_safetensors(data, blob, file.name)
    elif file.suffix == ".jsonl":
        new, what = _mutate_lines(data, blob, file.name)
    else:
        new, what = mutate_json(data, json.loads(blob), file.name)
    file.write_bytes(new)
    return what


def _mutate_lines(data: Any, blob: bytes, name: str) -> tuple[bytes, str]:
    lines = blob.splitlines() or [b"{}"]
    i = index(data, lines, "line")
    how = data.draw(st.sampled_from(["row", "row", "drop", "twice", "garbage", "cut"]), label="l")
    if how == "row":
        try:
            row = json.loads(lines[i])
        except (ValueError, RecursionError):
            row = {}
        lines[i], what = mutate_json(data, row, f"{name} line {i + 1}")
        return b"\n".join(lines) + b"\n", what
    if how == "drop":
        del lines[i]
    elif how == "twice":
        lines.insert(i, lines[i])
    elif how == "garbage":
        lines.insert(i, data.draw(st.sampled_from([b"[1, 2]", b"17", b'"x"', b"null", b"{"])))
    else:
        return b"\n".join(lines)[: -data.draw(st.integers(1, 20), label="cut")], f"{name} cut"
    return b"\n".join(lines) + b"\n", f"{name} line {i + 1}: {how}"


# ---- Hugging Face directories -------------------------------------------------------------------


def load_directory(case: Path) -> None:
    """``glassformer.load_checkpoint(dir)``: a Hugging Face, SAELens or glassformer folder."""
    from glassformer import load_checkpoint

    load_checkpoint(case)


DIRECTORY = register("directory", load_directory)
HF_SEEDS = sorted(p.name for p in (SEEDS / "hf").iterdir())


def make_hf_case(data: Any, folder: Path) -> tuple[str, dict[str, str] | None]:
    """A seed's copy with one or two of its files mutated: config.json most often, else the
    shard index, a safetensors file (its header), or one taken away; or a sharded seed laid
    out as huggingface_hub's cache (``hub_layout``)."""
    seed = data.draw(st.sampled_from(HF_SEEDS + ["llama-sharded"] * 3), label="seed")
    case = Path(shutil.copytree(SEEDS / "hf" / seed, folder / "case"))
    if seed == "llama-sharded" and one_in(data, 3, "hub layout"):
        return hub_layout(data, folder, case)
    done = [seed]
    files = sorted(p.name for p in case.iterdir() if p.name != "generation_config.json")
    weights = ["config.json"] * 6 + files + [f for f in files if f.endswith("index.json")] * 5
    for _ in range(data.draw(st.integers(1, 2), label="files")):
        name = data.draw(st.sampled_from(weights), label="file")
        if not (case / name).is_file():
            continue
        if one_in(data, 15, "remove"):
            (case / name).unlink()
            done.append(f"{name} removed")
        else:
            done.append(mutate_file(data, case / name))
    return "; ".join(done), None


def hub_layout(data: Any, folder: Path, files: Path) -> tuple[str, dict[str, str] | None]:
    """The folder as huggingface_hub caches it: ``case`` a link to
    ``models--fuzz--tiny/snapshots/<rev>``, whose files link to ``../../blobs/<hash>``; it
    must load. Or one shard's link leaves for another repository's blobs, or further."""
    repo = folder / "models--fuzz--tiny"
    snapshot = repo / "snapshots" / "0123abcd"
    snapshot.mkdir(parents=True)
    (repo / "blobs").mkdir()
    for i, file in enumerate(sorted(files.iterdir())):
        (repo / "blobs" / f"blob{i}").write_bytes(file.read_bytes())
        (snapshot / file.name).symlink_to(f"../../blobs/blob{i}")
    shutil.rmtree(files)
    files.symlink_to(snapshot.relative_to(folder))
    how = data.draw(st.sampled_from(["as it is", "as it is", "other repository", "outside"]))
    if how == "as it is":
        return "llama-sharded in a hub cache's layout", {"FUZZ_EXPECT": "loaded"}
    shard = next(snapshot.glob("model-00001-*"))
    other = folder / ("models--other--x/blobs" if how == "other repository" else "elsewhere")
    other.mkdir(parents=True)
    (other / "shard").write_bytes(shard.resolve().read_bytes())
    shard.unlink()
    shard.symlink_to(os.path.relpath(other / "shard", snapshot))
    return f"llama-sharded in a hub cache's layout, a shard's link to {how}", None


@pytest.fixture(scope="module")
def fuzzer(request, tmp_path_factory):
    return session(request, tmp_path_factory)


@pytest.fixture(scope="module")
def seeds_load(fuzzer) -> None:
    """Each seed loads (and each family's reader is warmed on it)."""
    for seed in HF_SEEDS:
        assert fuzzer.try_seed(DIRECTORY, SEEDS / "hf" / seed)["outcome"] == "loaded", seed


def test_fuzzed_hugging_face_directories_load_or_are_refused_in_one_line(fuzzer, seeds_load):
    fuzz(fuzzer, DIRECTORY, make_hf_case, FAST)


@pytest.mark.slow
def test_fuzzed_hugging_face_directories_many(fuzzer, seeds_load):
    fuzz(fuzzer, DIRECTORY, make_hf_case, SLOW)
