"""A GGUF file as the fields a fuzzer mutates (``test_fuzz_gguf``), and the seeds: small
real files written with the ``gguf`` package, as llama.cpp lays them out (llama, qwen2,
gemma3 and gptneox; tensors of every type glassformer decodes).

``parse`` reads a well-formed file into ``File``: the header's version and counts, each
key/value (``Pair``: key, type, value; strings as ``Str``, arrays as ``Arr``), each tensor
info (``Tensor``: name, dims, type, offset), and the data. ``serialize`` writes one back,
with whatever a mutation made its fields say: a length, count, rank or type field may lie
(``Str.length``, ``Arr.count``, ``Arr.declared``, ``Pair.declared``, ``Tensor.rank``,
``File.tensor_count``, ...), and ``File.cut`` truncates it at a field boundary.
"""

from __future__ import annotations

import math
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pytest

gguf = pytest.importorskip("gguf")

STRING, ARRAY = 8, 9
# the fixed-size value types: struct's letter for each
SCALARS = {
    0: "B",
    1: "b",
    2: "H",
    3: "h",
    4: "I",
    5: "i",
    6: "f",
    7: "B",
    10: "Q",
    11: "q",
    12: "d",
}
FLOATS = (6, 12)
D, H, KV_HEADS, DH, FF, LAYERS = 32, 4, 2, 8, 64, 2  # the seeds' shapes


# ---- the file as fields ----------------------------------------------------------------------


@dataclass
class Str:
    data: bytes
    length: int | None = None  # a length field that lies


@dataclass
class Arr:
    item: int
    items: list[Any]
    count: int | None = None  # a count field that lies
    declared: int | None = None  # an item type that lies


@dataclass
class Pair:
    key: Str
    vtype: int
    value: Any
    declared: int | None = None  # a type field that lies


@dataclass
class Tensor:
    name: Str
    dims: list[int]
    ggml_type: int
    offset: int
    rank: int | None = None  # a rank field that lies


@dataclass
class File:
    version: int
    kvs: list[Pair]
    tensors: list[Tensor]
    data: bytes
    tensor_count: int | None = None
    kv_count: int | None = None
    cut: float | None = None  # truncate at this fraction of the field boundaries
    marks: list[int] = field(default_factory=list)


class _Cursor:
    def __init__(self, blob: bytes) -> None:
        self.blob, self.pos = blob, 0

    def take(self, fmt: str) -> Any:
        value = struct.unpack_from("<" + fmt, self.blob, self.pos)[0]
        self.pos += struct.calcsize(fmt)
        return value

    def string(self) -> Str:
        n = self.take("Q")
        self.pos += n
        return Str(self.blob[self.pos - n : self.pos])

    def value(self, vtype: int) -> Any:
        if vtype in SCALARS:
            return self.take(SCALARS[vtype])
        if vtype == STRING:
            return self.string()
        item, count = self.take("I"), self.take("Q")
        return Arr(item, [self.value(item) for _ in range(count)])


def parse(blob: bytes) -> File:
    """The fields of a well-formed GGUF file (the seeds)."""
    c = _Cursor(blob)
    assert blob[:4] == b"GGUF"
    c.pos = 4
    version, n_tensors, n_kv = c.take("I"), c.take("Q"), c.take("Q")
    kvs = []
    for _ in range(n_kv):
        key = c.string()
        vtype = c.take("I")
        kvs.append(Pair(key, vtype, c.value(vtype)))
    tensors = []
    for _ in range(n_tensors):
        name, rank = c.string(), c.take("I")
        dims = [c.take("Q") for _ in range(rank)]
        tensors.append(Tensor(name, dims, c.take("I"), c.take("Q")))
    start = -(-c.pos // _alignment(kvs)) * _alignment(kvs)
    return File(version, kvs, tensors, blob[start:])


def _alignment(kvs: list[Pair]) -> int:
    for kv in kvs:
        n = kv.value  # a power of two, as the reader wants: else the default
        if kv.key.data == b"general.alignment" and isinstance(n, int) and 0 < n <= 4096:
            return n if n & (n - 1) == 0 else 32
    return 32


def serialize(f: File) -> bytes:
    """The file's bytes (lying fields as they lie), truncated where ``f.cut`` says."""
    out = bytearray(b"GGUF")
    marks = [4]

    def put(fmt: str, value: Any) -> None:
        if fmt not in "fd":
            bits = 8 * struct.calcsize(fmt)
            value = int(value) % 2**bits
            fmt = fmt.upper() if fmt != "?" else "B"
        out.extend(struct.pack("<" + fmt, value))
        marks.append(len(out))

    def string(s: Str) -> None:
        put("Q", len(s.data) if s.length is None else s.length)
        out.extend(s.data)
        marks.append(len(out))

    def value(vtype: int, v: Any) -> None:
        if vtype in SCALARS:
            put(SCALARS[vtype], v if vtype in FLOATS else as_int(v))
        elif vtype == STRING:
            string(v if isinstance(v, Str) else Str(str(v).encode()))
        elif isinstance(v, Arr):
            put("I", v.item if v.declared is None else v.declared)
            put("Q", len(v.items) if v.count is None else v.count)
            if v.item == STRING and all(isinstance(i, Str) for i in v.items):
                out.extend(_strings(v.items))  # fast: a million strings is a mutation here
                marks.append(len(out))
            else:
                for item in v.items:
                    value(v.item, item)
        else:  # a type that lies about a value of another kind: its bytes as they were
            put("Q", as_int(v))

    put("I", f.version)
    put("Q", len(f.tensors) if f.tensor_count is None else f.tensor_count)
    put("Q", len(f.kvs) if f.kv_count is None else f.kv_count)
    for kv in f.kvs:
        string(kv.key)
        put("I", kv.vtype if kv.declared is None else kv.declared)
        value(kv.vtype, kv.value)
    for t in f.tensors:
        string(t.name)
        put("I", len(t.dims) if t.rank is None else t.rank)
        for d in t.dims:
            put("Q", d)
        put("I", t.ggml_type)
        put("Q", t.offset)
    out.extend(bytes(-len(out) % _alignment(f.kvs)))
    out.extend(f.data)
    marks.append(len(out))
    if f.cut is not None:
        return bytes(out[: marks[int(f.cut * (len(marks) - 1))]])
    return bytes(out)


def _strings(items: list[Str]) -> bytes:
    """Strings as an array holds them, each distinct one packed once."""
    packed: dict[int, bytes] = {}
    for s in items:
        if id(s) not in packed:
            n = len(s.data) if s.length is None else s.length
            packed[id(s)] = struct.pack("<Q", n % 2**64) + s.data
    return b"".join(packed[id(s)] for s in items)


def as_int(v: Any) -> int:
    """A value as the integer a field that lies about its type will hold."""
    if isinstance(v, float):
        return int(v) if math.isfinite(v) else 2**63
    return (
        int(v) if isinstance(v, (int, bool)) else len(getattr(v, "items", getattr(v, "data", b"")))
    )


# ---- the seeds: small real files ---------------------------------------------------------------

SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
MERGES = ["Ġ t", "h e", "Ġt he", "1 2", "l l"]
CHATML = "{% for m in messages %}<|im_start|>{{ m['content'] }}<|im_end|>{% endfor %}"
Q = gguf.GGMLQuantizationType
MATRIX_TYPES = [Q.Q8_0, Q.Q4_1, Q.Q4_0, Q.F16, Q.BF16, Q.F32]


def _tokens() -> list[str]:
    from tokenizers.pre_tokenizers import ByteLevel

    return SPECIALS + sorted(ByteLevel.alphabet()) + [m.replace(" ", "") for m in MERGES]


def _shapes(arch: str) -> dict[str, tuple[int, ...]]:
    """llama.cpp's tensor names of a two-layer ``arch`` file and their (rows, columns)."""
    V = len(_tokens())
    per_layer = {
        "attn_norm.weight": (D,),
        "attn_q.weight": (H * DH, D),
        "attn_k.weight": (KV_HEADS * DH, D),
        "attn_v.weight": (KV_HEADS * DH, D),
        "attn_output.weight": (D, H * DH),
        "ffn_norm.weight": (D,),
        "ffn_gate.weight": (FF, D),
        "ffn_up.weight": (FF, D),
        "ffn_down.weight": (D, FF),
    }
    if arch == "qwen2":
        per_layer |= {
            "attn_q.bias": (H * DH,),
            "attn_k.bias": (KV_HEADS * DH,),
            "attn_v.bias": (KV_HEADS * DH,),
        }
    if arch == "gemma3":
        per_layer |= {"attn_q_norm.weight": (DH,), "attn_k_norm.weight": (DH,)}
        per_layer |= {"post_attention_norm.weight": (D,), "post_ffw_norm.weight": (D,)}
    if arch == "gptneox":
        per_layer = {
            "attn_norm.weight": (D,), "attn_norm.bias": (D,),
            "attn_qkv.weight": (3 * D, D), "attn_qkv.bias": (3 * D,),
            "attn_output.weight": (D, D), "attn_output.bias": (D,),
            "ffn_norm.weight": (D,), "ffn_norm.bias": (D,),
            "ffn_up.weight": (FF, D), "ffn_up.bias": (FF,),
            "ffn_down.weight": (D, FF), "ffn_down.bias": (D,),
        }  # fmt: skip
    shapes = {"token_embd.weight": (V, D)}
    shapes |= {f"blk.{i}.{n}": s for i in range(LAYERS) for n, s in per_layer.items()}
    shapes |= {"output_norm.weight": (D,), "output.weight": (V, D)}
    if arch == "gptneox":
        shapes["output_norm.bias"] = (D,)
    return shapes


def write_seed(path: Path, arch: str) -> Path:
    """A small ``arch`` GGUF file as llama.cpp lays one out: metadata, tokenizer, tensors of
    every type glassformer decodes."""
    w = gguf.GGUFWriter(str(path), arch)
    w.add_block_count(LAYERS)
    w.add_context_length(64)
    w.add_embedding_length(D)
    w.add_feed_forward_length(FF)
    w.add_head_count(H if arch != "gptneox" else 4)
    if arch != "gptneox":
        w.add_head_count_kv(KV_HEADS)
        w.add_layer_norm_rms_eps(1e-5)
        w.add_rope_freq_base(10000.0)
        w.add_key_length(DH)
    else:
        w.add_rope_dimension_count(4)
        w.add_parallel_residual(True)
        w.add_layer_norm_eps(1e-5)
    if arch == "gemma3":
        w.add_sliding_window(8)
    tokens = _tokens()
    w.add_vocab_size(len(tokens))
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("smollm")
    w.add_token_list(tokens)
    w.add_token_types([3] * len(SPECIALS) + [1] * (len(tokens) - len(SPECIALS)))
    w.add_token_merges(MERGES)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_pad_token_id(0)
    w.add_chat_template(CHATML)
    rng = np.random.default_rng(0)
    for i, (name, shape) in enumerate(_shapes(arch).items()):
        array = rng.standard_normal(shape).astype(np.float32) * 0.2
        kind = MATRIX_TYPES[i % len(MATRIX_TYPES)] if len(shape) == 2 else Q.F32
        w.add_tensor(name, gguf.quants.quantize(array, kind), raw_dtype=kind)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def make_seeds(folder: Path) -> dict[str, File]:
    """The seeds, parsed: one file of each layout."""
    archs = ("llama", "qwen2", "gemma3", "gptneox")
    return {a: parse(write_seed(folder / f"{a}.gguf", a).read_bytes()) for a in archs}


def test_the_codec_writes_back_every_seed_byte_for_byte(tmp_path):
    for arch, f in make_seeds(tmp_path).items():
        assert serialize(f) == (tmp_path / f"{arch}.gguf").read_bytes(), arch
