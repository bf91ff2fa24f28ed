"""Fuzzing the GGUF reader (issue 49): the seeds (``test_fuzz_gguf_file``: small real files
of the llama, qwen2, gemma3 and gptneox layouts, float and block types) parsed into their
fields, mutated structurally, written back, and opened as ``glassformer generate --model
x.gguf`` does (``read_gguf``), each in a forked child under the caps (``fuzzing``).

The mutations are the header's: the version and counts; each key's type, length and value
(numbers to 0, -1, huge, NaN; strings to empty, huge, non-UTF-8, another architecture;
arrays to other lengths and item types, a million empty strings); keys dropped, doubled,
renamed; each tensor's name, rank, dims, type and offset (aliasing another's bytes,
overlapping, past the end); tensors doubled under other names (hundreds of aliases),
dropped, reordered; truncation at a field boundary; now and then a few raw bytes.
"""

from __future__ import annotations

import copy
import math
from pathlib import Path
from typing import Any

import pytest
from fuzzing import fuzz, index, one_in, register, session, stage
from hypothesis import strategies as st
from test_fuzz_gguf_file import (
    ARRAY,
    FLOATS,
    LAYERS,
    SCALARS,
    STRING,
    Arr,
    File,
    Pair,
    Str,
    Tensor,
    as_int,
    gguf,
    make_seeds,
    serialize,
)

FAST, SLOW = 120, 700
Q = gguf.GGMLQuantizationType


@pytest.fixture(scope="module")
def seeds(fuzzer, tmp_path_factory) -> dict[str, File]:
    """The seeds, parsed; each written back and read once (the reader warmed on it)."""
    seeds = make_seeds(tmp_path_factory.mktemp("gguf-seeds"))
    for arch, f in seeds.items():
        result = fuzzer.try_seed(GGUF, lambda case: _write(case, serialize(f)))  # noqa: B023
        assert result["outcome"] == "loaded", (arch, result)
    return seeds


def _write(case: Path, blob: bytes) -> None:
    (case / "model.gguf").write_bytes(blob)


# ---- the mutations -----------------------------------------------------------------------------

INTS = [0, 1, -1, 2, 3, 7, 255, 2**15, 2**31 - 1, 2**31, 2**32 - 1, 2**62, 2**63 - 1, 2**64 - 1]
REALS = [0.0, -0.0, -1.0, math.nan, math.inf, -math.inf, 1e-45, 3.4e38, 1e30, 1e-30]
LENGTHS = [0, 1, 2**31, 2**32, 2**60, 2**63, 2**64 - 1]
ARCHS = [b"llama", b"qwen2", b"qwen3", b"gemma3", b"gptneox", b"bert", b"", b"llama\x00"]
TYPES = sorted({int(t) for t in Q} | {4, 5, 99, 2**31, 2**32 - 1})


def _pick(data: Any, options: list[Any], label: str) -> Any:
    return data.draw(st.sampled_from(options), label=label)


def _name(s: Str) -> str:
    return s.data[:60].decode("utf-8", "replace")


def _scalar(data: Any, vtype: int, old: Any) -> Any:
    if vtype in FLOATS:
        return _pick(data, [*REALS, float(old) * 2, -float(old)], "real")
    old = as_int(old)
    return _pick(data, [*INTS, old + 1, old - 1, old * 2, old * 1000], "int")


def _string(data: Any, s: Str) -> str:
    how = _pick(data, ["empty", "length", "utf8", "long", "arch", "nul"], "string")
    if how == "empty":
        s.data = b""
    elif how == "length":
        s.length = _pick(data, [*LENGTHS, len(s.data) + 1, len(s.data) - 1], "length")
    elif how == "utf8":
        s.data = b"\xff\xfe" + s.data[:-1] + b"\xc3"
    elif how == "long":
        s.data = (s.data or b"x") * data.draw(st.integers(100, 2**20 // max(len(s.data), 1)))
    elif how == "arch":
        s.data = _pick(data, ARCHS, "arch")
    else:
        s.data = s.data[:1] + b"\x00" + s.data[1:]
    return f"string {how} ({len(s.data)} bytes, length field {s.length})"


def _array(data: Any, a: Arr) -> str:
    how = _pick(
        data, ["count", "item type", "fewer", "twice", "empty", "item", "many", "nest"], "a"
    )
    if how == "count":
        a.count = _pick(data, [*LENGTHS, len(a.items) + 1, max(len(a.items) - 1, 0)], "count")
    elif how == "item type":
        a.declared = _pick(data, TYPES[:14] + [2**32 - 1], "item type")
    elif how == "fewer":
        a.items = a.items[: data.draw(st.integers(0, len(a.items)))]
    elif how == "twice":
        a.items = a.items + a.items
    elif how == "empty":
        a.items = []
    elif how == "item" and a.items:
        i = index(data, a.items, "item")
        if a.item == STRING:
            return f"item {i}: " + _string(data, a.items[i])
        a.items[i] = _scalar(data, a.item, a.items[i]) if a.item in SCALARS else a.items[i]
    elif how == "many":
        n = _pick(data, [1000, 10**4, 10**5], "many")  # items added
        a.items = a.items + [Str(b"") if a.item == STRING else 0] * n
    else:
        a.items, a.item = [copy.deepcopy(a)], ARRAY
    return f"array {how} (count {a.count}, item type {a.declared}, {len(a.items)} items)"


def m_header(data: Any, f: File) -> str:
    which = _pick(data, ["version", "tensor_count", "kv_count"], "field")
    actual = {"version": f.version, "tensor_count": len(f.tensors), "kv_count": len(f.kvs)}[which]
    value = _pick(data, [0, 1, 4, actual - 1, actual + 1, actual * 2, *LENGTHS], which)
    setattr(f, which, value)
    return f"{which} {actual} → {value}"


def m_value(data: Any, f: File) -> str:
    kv = f.kvs[index(data, f.kvs, "kv")]
    if one_in(data, 6, "lie about its type"):
        kv.declared = _pick(data, TYPES[:14] + [2**32 - 1], "declared")
        return f"{_name(kv.key)}: type {kv.vtype} declared as {kv.declared}"
    if kv.vtype in SCALARS:
        old, kv.value = kv.value, _scalar(data, kv.vtype, kv.value)
        return f"{_name(kv.key)}: {old} → {kv.value}"
    if kv.vtype == STRING:
        return f"{_name(kv.key)}: " + _string(data, kv.value)
    return f"{_name(kv.key)}: " + _array(data, kv.value)


def m_key(data: Any, f: File) -> str:
    i = index(data, f.kvs, "kv")
    how = _pick(data, ["drop", "twice", "rename", "string", "alignment", "strings"], "key")
    old = _name(f.kvs[i].key)
    if how == "drop":
        del f.kvs[i]
    elif how == "twice":
        f.kvs.insert(index(data, f.kvs, "at"), copy.deepcopy(f.kvs[i]))
    elif how == "rename":
        f.kvs[i].key = Str(_pick(data, [k.key.data for k in f.kvs], "as"))
    elif how == "string":
        return f"key {old}: " + _string(data, f.kvs[i].key)
    elif how == "alignment":
        value = _pick(data, [0, 1, 3, 8, 64, 4096, 2**31, 2**32 - 1], "alignment")
        f.kvs.append(Pair(Str(b"general.alignment"), _pick(data, [4, 5, 10, 8], "type"), value))
        return f"general.alignment {value}"
    else:
        n = _pick(data, [10**4, 10**4, 10**5, 10**5, 10**6], "empty strings")
        f.kvs.append(Pair(Str(b"fuzz.strings"), ARRAY, Arr(STRING, [Str(b"")] * n)))
        return f"an array of {n} empty strings"
    return f"key {old}: {how}"


def _nbytes(t: Tensor) -> int:
    block, size = gguf.GGML_QUANT_SIZES.get(t.ggml_type, (1, 4))
    return math.prod(t.dims) // block * size


def m_tensor(data: Any, f: File) -> str:
    i = index(data, f.tensors, "tensor")
    t, other = f.tensors[i], f.tensors[index(data, f.tensors, "other")]
    what = _pick(data, ["name", "rank", "dim", "dims", "type", "offset"], "tensor field")
    if what == "name":
        how = _pick(data, ["other's", "unknown", "string"], "name")
        if how == "string":
            return f"tensor {i} name: " + _string(data, t.name)
        t.name = Str(other.name.data) if how == "other's" else Str(_pick(data, STRANGERS, "as"))
        return f"tensor {i} renamed {_name(t.name)}"
    if what == "rank":
        t.rank = _pick(data, [0, 1, 3, 5, 2**32 - 1], "rank")
    elif what == "dim":
        j = index(data, t.dims, "dim")
        d = t.dims[j]
        t.dims[j] = _pick(data, [0, 1, d - 1, d + 1, d * 2, 2**31, 2**32, 2**62, 2**64 - 1], "to")
    elif what == "dims":
        how = _pick(data, ["overflow", "swap", "drop", "add"], "dims")
        t.dims = {"overflow": [2**32, 2**32], "swap": t.dims[::-1], "drop": t.dims[:-1],
                  "add": [*t.dims, _pick(data, [1, 2, 2**20], "added")]}[how]  # fmt: skip
    elif what == "type":
        t.ggml_type = _pick(data, TYPES, "type")
    else:
        end = len(f.data)
        half = other.offset + _nbytes(other) // 2
        options = [other.offset, other.offset + 32, half, t.offset + 1, end, end + 4096, 2**63,
                   2**64 - 1, 0]  # fmt: skip
        t.offset = _pick(data, options, "offset")
    return f"tensor {i} {_name(t.name)}: {what} → dims {t.dims} type {t.ggml_type} " + (
        f"offset {t.offset} rank {t.rank}"
    )


STRANGERS = [
    b"blk.0.attn_q.weight", b"blk.99.attn_q.weight", b"blk.-1.attn_q.weight",
    b"blk.0.nonsense.weight", b"token_embd.bias", b"output.weight", b"blk.0.attn_qkv.weight",
    b"blk.4294967296.ffn_up.weight", b"", b"x" * 300,
]  # fmt: skip


def m_tensors(data: Any, f: File) -> str:
    how = _pick(data, ["aliases", "drop", "reverse", "twice", "many"], "tensors")
    if how == "many":  # a long table: a check that is quadratic in it shows here
        n = _pick(data, [10**3, 10**4, 10**5], "infos")
        f.tensors += [Tensor(Str(b"fuzz.%d.weight" % k), [32], 0, 128 * k) for k in range(n)]
        return f"{n} more tensor infos"
    if how == "aliases":  # other names for the same bytes: the biggest tensor, many times
        t = max(f.tensors, key=_nbytes)
        n = _pick(data, [1, 10, 300], "aliases")
        part = t.name.data.decode().split(".")[-2]
        f.tensors += [
            Tensor(
                Str(f"blk.{LAYERS + k}.{part}.weight".encode()), list(t.dims), t.ggml_type, t.offset
            )
            for k in range(n)
        ]
        if data.draw(st.booleans(), label="layers use them"):
            for kv in f.kvs:
                if kv.key.data.endswith(b".block_count"):
                    kv.value = LAYERS + n
        return f"{n} aliases of {_name(t.name)}'s bytes"
    if how == "drop":
        i = index(data, f.tensors, "tensor")
        return f"tensor {_name(f.tensors.pop(i).name)} dropped"
    if how == "reverse":
        f.tensors.reverse()
        return "tensor infos in reverse order"
    f.tensors += copy.deepcopy(f.tensors)
    return "every tensor info twice"


def m_cut(data: Any, f: File) -> str:
    f.cut = data.draw(st.sampled_from(range(1000)), label="cut") / 1000
    return f"truncated at field boundary {f.cut:.3f} of the file"


# (a sampled element's first and last come more often: values first, the header inside)
MUTATIONS = [m_value, m_tensor, m_value, m_key, m_header, m_tensors, m_value, m_cut, m_tensor]


def make_case(seeds: dict[str, File], data: Any, folder: Path) -> tuple[str, None]:
    """One mutated file, ``folder/case/model.gguf``: one to three structural mutations of a
    seed, sometimes a few bytes of the header overwritten too."""
    arch = _pick(data, sorted(seeds), "seed")
    f = copy.deepcopy(seeds[arch])
    done = [arch]
    for _ in range(data.draw(st.integers(1, 3), label="mutations")):
        done.append(_pick(data, MUTATIONS, "mutation")(data, f))
    blob = bytearray(serialize(f))
    if blob and one_in(data, 10, "bytes"):
        at = data.draw(st.integers(0, min(len(blob), 4096) - 1), label="at")
        new = data.draw(st.binary(min_size=1, max_size=8), label="bytes")
        blob[at : at + len(new)] = new
        done.append(f"bytes {new.hex()} at {at}")
    (folder / "case").mkdir()
    (folder / "case" / "model.gguf").write_bytes(bytes(blob))
    return "; ".join(done), None


# ---- the reader and the tests ------------------------------------------------------------------


def read_gguf(case: Path) -> None:
    """``glassformer generate --model model.gguf``: the model and its tokenizer, two tokens
    greedy and two sampled, decoded."""
    import torch

    from glassformer import load_run

    model, tokenizer = load_run(case / "model.gguf")
    stage("generate")
    ids = tokenizer.encode("Hello 12") or [0]
    out = model.generate(torch.tensor([ids]), 2)
    sampled = model.generate(torch.tensor([ids]), 2, do_sample=True, generator=torch.Generator())
    stage("decode")
    tokenizer.decode(out[0].tolist() + sampled[0].tolist())


GGUF = register("gguf", read_gguf)


@pytest.fixture(scope="module")
def fuzzer(request, tmp_path_factory):
    return session(request, tmp_path_factory)


def test_fuzzed_gguf_files_load_or_are_refused_in_one_line(fuzzer, seeds):
    fuzz(fuzzer, GGUF, lambda data, folder: make_case(seeds, data, folder), FAST)


@pytest.mark.slow
def test_fuzzed_gguf_files_many(fuzzer, seeds):
    fuzz(fuzzer, GGUF, lambda data, folder: make_case(seeds, data, folder), SLOW)
