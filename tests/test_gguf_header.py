"""GGUF headers a hostile file could amplify (issue 49): the header walk, its cache, the
tensor table's placement, and the metadata numbers checked before a model is built.

Files are a clean one written by ``gguf.GGUFWriter`` (``test_gguf.write_gguf``), then
``rebuilt`` byte by byte with fields replaced or added and its tensor table rewritten.
"""

from __future__ import annotations

import math
import struct
import time
import tracemalloc
from pathlib import Path

import pytest

gguf = pytest.importorskip("gguf")

from test_gguf import Q, hf_tensors, one_line_error, write_gguf  # noqa: E402

from glassformer.interop.gguf import header, read_gguf, read_gguf_tokenizer  # noqa: E402

Field = tuple[int, bytes]  # (GGUF value type, the value's bytes)
Tensor = tuple[str, tuple[int, ...], int, int]  # name, dims innermost first, type, offset


def text(s: str) -> bytes:
    return struct.pack("<Q", len(s.encode())) + s.encode()


def u32(v: int) -> Field:
    return 4, struct.pack("<I", v)


def f32(v: float) -> Field:
    return 6, struct.pack("<f", v)


def string(s: str) -> Field:
    return 8, text(s)


def strings(items: list[str]) -> Field:
    return 9, struct.pack("<IQ", 8, len(items)) + b"".join(text(s) for s in items)


def rebuilt(
    src: Path,
    dst: Path,
    fields: dict[str, Field | None] | None = None,
    tensors: list[Tensor] | None = None,
    rename: tuple[str, str] | None = None,
    data: bytes = b"",
) -> Path:
    """``src`` written again: its metadata with ``fields`` replaced, added or (None)
    dropped, keys' prefix ``rename[0]`` turned into ``rename[1]``; its tensor table
    ``tensors`` if given (offsets from the start of the data section), its data as it was
    and ``data`` after it (from ``data_end(src)`` on)."""
    reader = gguf.GGUFReader(src)
    blob = src.read_bytes()
    kv: dict[str, bytes] = {}
    for f in reader.fields.values():
        if not f.name.startswith("GGUF."):
            raw = blob[f.offset : f.offset + sum(p.nbytes for p in f.parts)]
            name = f.name
            if rename and name.startswith(rename[0]):
                name = rename[1] + name[len(rename[0]) :]
            kv[name] = raw[8 + len(f.name.encode()) :]  # the type and the value
    for key, value in (fields or {}).items():
        kv.pop(key, None)
        if value is not None:
            kv[key] = struct.pack("<I", value[0]) + value[1]
    if tensors is None:
        tensors = [(t.name, tuple(int(d) for d in t.shape), int(t.tensor_type),
                    t.data_offset - reader.data_offset) for t in reader.tensors]  # fmt: skip
    out = bytearray(b"GGUF" + struct.pack("<IQQ", 3, len(tensors), len(kv)))
    for key, value in kv.items():
        out += text(key) + value
    for name, dims, kind, offset in tensors:
        out += text(name) + struct.pack(f"<I{len(dims)}QIQ", len(dims), *dims, kind, offset)
    out += bytes(-len(out) % 32)
    old = blob[reader.data_offset :]
    dst.write_bytes(bytes(out) + old + bytes(-len(old) % 32) + data)
    return dst


def data_end(path: Path) -> int:
    """Where ``rebuilt`` appends data to ``path``'s data section (an offset in it)."""
    reader = gguf.GGUFReader(path)
    size = path.stat().st_size - reader.data_offset
    return size + -size % 32


def table(path: Path) -> list[Tensor]:
    """The tensor table of ``path`` as ``rebuilt`` takes it."""
    reader = gguf.GGUFReader(path)
    return [(t.name, tuple(int(d) for d in t.shape), int(t.tensor_type),
             t.data_offset - reader.data_offset) for t in reader.tensors]  # fmt: skip


@pytest.fixture(scope="module")
def clean(tmp_path_factory) -> Path:
    return write_gguf(tmp_path_factory.mktemp("gguf") / "m.gguf", hf_tensors(), qtype=Q.Q8_0)


def test_rebuilt_unchanged_reads_as_the_original(clean, tmp_path):
    config, state, _ = read_gguf(clean)
    again, state_again, _ = read_gguf(rebuilt(clean, tmp_path / "same.gguf"))
    assert again == config and all(state[k].equal(state_again[k]) for k in state)


@pytest.mark.parametrize("chunk", [1, 7, 64])
def test_the_walk_reads_the_same_header_whatever_its_chunk(clean, tmp_path, monkeypatch, chunk):
    """The header is read a chunk at a time (1 MiB); values that straddle two chunks read as
    values inside one (a length read from the chunk before was a bug found on a 1.2 MB header)."""
    path = rebuilt(
        clean, tmp_path / "m.gguf", fields={"general.junk": strings(["ab", "", "c"] * 9)}
    )
    with open(path, "rb") as f:
        expected = header._Walker(f, path.stat().st_size).walk(BLOCK_SIZES)
    monkeypatch.setattr(header, "CHUNK", chunk)
    with open(path, "rb") as f:
        assert header._Walker(f, path.stat().st_size).walk(BLOCK_SIZES) == expected
    config, state, tokenizer = read_gguf(path)
    assert (
        tokenizer.encode("the 12")
        and config["vocab_size"] == state["model.embed_tokens.weight"].shape[0]
    )


def test_a_million_empty_strings_cost_one_pass_over_their_lengths(clean, tmp_path):
    """One array of 10**6 empty strings (8 MB) under a key nobody reads: gguf's reader took
    43 s and 2 GB for it (3.3 s and 169 MB for 10**5); the walk steps over their lengths
    (0.5 s for the whole read here) and decodes no item. Some memory is traced, on 10**5."""
    for n in (10**5, 10**6):
        empty = (9, struct.pack("<IQ", 8, n) + bytes(8 * n))  # each: its length, 0
        path = rebuilt(clean, tmp_path / f"{n}.gguf", fields={"general.junk": empty})
        if n == 10**5:
            tracemalloc.start()
        start = time.perf_counter()
        try:
            read_gguf(path)
        finally:
            seconds, peak = time.perf_counter() - start, tracemalloc.get_traced_memory()[1]
            tracemalloc.stop()
        assert seconds < 8 and (n > 10**5 or peak < 5_000_000), (n, seconds, peak)


def test_a_duplicate_among_many_tensor_names_is_found_in_linear_time(clean, tmp_path):
    """30,000 tensor names and the last one again: 16.7 s with the quadratic search for the
    duplicate (names.count for each name), 0.2 s with a set."""
    n = 30_000
    many = [(f"x{i}", (1,), 0, 0) for i in range(n)] + [(f"x{n - 1}", (1,), 0, 0)]
    path = rebuilt(clean, tmp_path / "m.gguf", tensors=many)
    start = time.perf_counter()
    one_line_error(path, f"'x{n - 1}' appears twice")
    assert time.perf_counter() - start < 4
    more = [(f"x{i}", (1,), 0, 0) for i in range(2**16 + 1)]  # each kept as a Python object
    one_line_error(rebuilt(clean, tmp_path / "m.gguf", tensors=more), "65537 tensors")


BLOCK_SIZES = {int(t): sizes for t, sizes in gguf.GGML_QUANT_SIZES.items()}


def test_tensors_that_share_bytes_are_refused_before_any_is_read(clean, tmp_path, monkeypatch):
    """Aliases of one tensor's bytes, or a tensor overlapping another's: a 160 kB file of
    3,000 aliases of its token table took 227 MB decoded (the issue's 4 MB file, 2.4 GB);
    llama.cpp requires every tensor to start where the one before it ends."""
    import glassformer.interop.gguf.tensors as tensors

    monkeypatch.setattr(tensors, "read_blocks", lambda *a: pytest.fail("a tensor was read"))
    t = table(clean)
    embd = next(x for x in t if x[0] == "token_embd.weight")
    aliases = [(f"blk.{i}.ffn_up.weight", embd[1], embd[2], embd[3]) for i in range(1, 200)]
    path = rebuilt(clean, tmp_path / "alias.gguf", tensors=t + aliases)
    one_line_error(path, "'blk.1.ffn_up.weight'", "shares bytes with 'token_embd.weight'")
    norm = next(x for x in t if x[0] == "blk.0.attn_norm.weight")  # 64 floats
    overlap = [(n, d, k, norm[3] + 4 if n == "output_norm.weight" else o) for n, d, k, o in t]
    path = rebuilt(clean, tmp_path / "overlap.gguf", tensors=overlap)
    one_line_error(path, "'output_norm.weight'", "shares bytes with 'blk.0.attn_norm.weight'")


def test_the_header_is_walked_once_per_command_and_again_when_the_file_changes(
    clean, tmp_path, monkeypatch
):
    """Weights, tokenizer and the blocks of ``for_inference("gguf")`` each read the header
    (SmolLM2's took 2.5 s each through gguf's reader; the walk takes 0.04 s, once)."""
    from glassformer import GPT

    path = rebuilt(clean, tmp_path / "m.gguf")
    walks = []
    walk = header._Walker.walk
    monkeypatch.setattr(
        header._Walker, "walk", lambda self, sizes: walks.append(1) or walk(self, sizes)
    )
    model = GPT.from_pretrained(path)
    read_gguf_tokenizer(path)
    model.for_inference("gguf")
    assert len(walks) == 1
    rebuilt(clean, path, fields={"general.name": string("changed")})
    read_gguf_tokenizer(path)
    assert len(walks) == 2


NAN = float("nan")
CORRUPT = [  # (architecture, key, value, what the line says after the path)
    ("llama", "llama.attention.head_count", u32(0), "'llama.attention.head_count' is 0;"),
    ("llama", "llama.attention.head_count", u32(3), "'llama.attention.head_count' is 3;"),
    ("llama", "llama.attention.head_count_kv", u32(3), "'llama.attention.head_count_kv' is 3;"),
    ("llama", "llama.attention.key_length", u32(0), "'llama.attention.key_length' is 0;"),
    ("llama", "llama.block_count", u32(10**9), "llama.block_count is 1000000000; the file"),
    ("llama", "llama.context_length", u32(0), "'llama.context_length' is 0;"),
    ("llama", "llama.embedding_length", u32(2**31), "'llama.embedding_length' is 2147483648;"),
    ("llama", "llama.attention.layer_norm_rms_epsilon", f32(NAN), "_epsilon' is nan;"),
    ("llama", "llama.attention.layer_norm_rms_epsilon", f32(0.0), "_epsilon' is 0.0;"),
    ("llama", "llama.rope.freq_base", f32(-1.0), "'llama.rope.freq_base' is -1.0;"),
    ("llama", "llama.rope.freq_base", f32(math.inf), "'llama.rope.freq_base' is inf;"),
    ("llama", "llama.vocab_size", u32(10**6), "'llama.vocab_size' is 1000000; the tensor"),
    ("llama", "tokenizer.ggml.eos_token_id", u32(10**6), "'tokenizer.ggml.eos_token_id' is 10"),
    ("llama", "llama.feed_forward_length", u32(10**6), "blk.0.ffn_gate.weight has shape"),
    ("gemma3", "gemma3.attention.sliding_window_pattern", u32(0), "_pattern' is 0;"),
    ("gemma3", "gemma3.attention.query_pre_attn_scalar", u32(0), "_scalar' is 0;"),
    ("gemma3", "gemma3.final_logit_softcapping", f32(0.0), "_softcapping' is 0.0;"),
    ("gemma3", "gemma3.attention.sliding_window", u32(1), "'gemma3.attention.sliding_window' is 1"),
    ("gptneox", "gptneox.rope.dimension_count", u32(3), "'gptneox.rope.dimension_count' is 3;"),
    ("gptneox", "gptneox.attention.layer_norm_epsilon", f32(-1.5), "_epsilon' is -1.5;"),
]


@pytest.mark.parametrize(("arch", "key", "value", "said"), CORRUPT, ids=[c[1] for c in CORRUPT])
def test_metadata_numbers_out_of_range_are_one_line_before_a_model_is_built(
    clean, tmp_path, arch, key, value, said
):
    """Heads 0, Gemma's window pattern or query scale 0, a NaN epsilon, an absurd block
    count...: one line naming the file, the key and the value (they were a division by zero,
    a huge allocation or NaN logits later)."""
    from glassformer import GPT

    fields = {key: value, "general.architecture": string(arch)}
    path = rebuilt(clean, tmp_path / "m.gguf", fields=fields, rename=("llama.", f"{arch}."))
    one_line_error(path, said)
    with pytest.raises(ValueError, match="^" + str(path)):
        GPT.from_pretrained(path)


def test_token_lists_are_checked_strings_whose_lengths_fit(clean, tmp_path):
    """A token list of integers was read as the numbers' text (and the tokenizers library's
    error was several lines); a string inside an array whose length runs past the end is
    refused by the walk (not looped over)."""
    numbers = (9, struct.pack("<IQ", 4, 3) + struct.pack("<3I", 1, 2, 3))
    path = rebuilt(clean, tmp_path / "ints.gguf", fields={"tokenizer.ggml.tokens": numbers})
    with pytest.raises(ValueError, match="tokenizer.ggml.tokens' is not an array of strings"):
        read_gguf_tokenizer(path)
    unknown = {"tokenizer.ggml.merges": strings(["zz qq"])}  # tokens the list does not hold
    path = rebuilt(clean, tmp_path / "merges.gguf", fields=unknown)
    one_line_error(path, "not a BPE vocabulary")
    data = bytearray(clean.read_bytes())  # the length of the first merge, after the count
    at = data.index(b"tokenizer.ggml.merges") + len("tokenizer.ggml.merges") + 4 + 4 + 8
    struct.pack_into("<Q", data, at, 2**40)
    (tmp_path / "long.gguf").write_bytes(data)
    one_line_error(tmp_path / "long.gguf", "'tokenizer.ggml.merges'", "runs past the end")


LONG = "x" * 100_000  # a value no message should echo whole
ODD = "\x01" * 1000  # a name at the 1 KB limit whose repr is 4 KB
ECHOED = [  # (fields replaced, tensor names renamed, what the line says after the path)
    ({"tokenizer.ggml.pre": string(LONG)}, {}, "' (100,000 characters) is not supported"),
    ({"tokenizer.ggml.model": string(LONG)}, {}, "' (100,000 characters) is not supported"),
    ({"general.architecture": string(LONG)}, {}, "' (100,000 characters); glassformer reads"),
    ({"llama.rope.scaling.type": string(LONG)}, {}, "' (100,000 characters) is not supported"),
    ({"tokenizer.ggml.merges": strings([LONG + " x"])}, {}, "not a BPE vocabulary"),
    ({}, {"output.weight": ODD}, "' (1,000 characters) has no place"),
    ({}, {"output.weight": ODD, "output_norm.weight": ODD}, "' (1,000 characters) appears twice"),
]


@pytest.mark.parametrize(
    ("fields", "names", "said"),
    ECHOED,
    ids=["pre", "model", "architecture", "rope-scaling", "merges", "tensor", "tensor-twice"],
)
def test_a_long_value_or_name_is_cut_in_the_one_line(clean, tmp_path, fields, names, said):
    """A 100,000-character value (or a 1 KB name of unprintable characters) was echoed
    whole: the line (up to 400 KB) names the file and the field, and shows a cut value."""
    t = [(names.get(n, n), *rest) for n, *rest in table(clean)]
    path = rebuilt(clean, tmp_path / "m.gguf", fields=fields, tensors=t)
    message = one_line_error(path, said)  # each cut where it is shown (not the line after)
    assert len(message) < len(str(path)) + 400 and "characters)" in message, message
