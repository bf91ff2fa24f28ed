"""glassformer.kernels.gguf_linear: layers that compute from GGUF blocks. The C path (a
step's rows from the rows interleaved, a few rows straight from the blocks, many rows
decoded then PyTorch's GEMM) against the readable one (the reference-equal decoder, then
``F.linear``), for every block type; the input rounded to 8 bits (``rounded``); the token
table; compiled graphs; bad input; a machine without a C compiler."""

from __future__ import annotations

import subprocess
import warnings

import pytest
import torch
import torch.nn.functional as F

pytest.importorskip("gguf")

from test_gguf_blocks import random_blocks  # noqa: E402  (tests/ is on the path)

from glassformer.kernels import gguf_linear  # noqa: E402
from glassformer.kernels.gguf_blocks import (  # noqa: E402
    BLOCK_BYTES,
    BLOCK_VALUES,
    NAMES,
    Q4_K,
    Q5_0,
    Q6_K,
    Q8_0,
)
from glassformer.kernels.gguf_linear import (  # noqa: E402
    GGUFEmbedding,
    GGUFLinear,
    interleave,
    rounded_to_8_bits,
)


def relative(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a.double() - b.double()).norm() / b.double().norm()).item()


@pytest.mark.parametrize("kind", sorted(BLOCK_BYTES), ids=lambda k: NAMES[k])
@pytest.mark.parametrize("rows_of_input", [1, 3, 6, 80])  # 6: four rows, then two; 80: decoded
def test_the_c_product_equals_a_dequantised_fp32_matmul(kind, rows_of_input):
    """Within 1e-5 relative (the issue asks 1e-3; both sum in fp32, in other orders)."""
    layer = GGUFLinear([(kind, random_blocks(kind, 48, 512, seed=kind))], in_features=512)
    assert layer.fast, "the C kernels did not build on this machine"
    x = torch.randn(rows_of_input, 512, generator=torch.Generator().manual_seed(1))
    reference = x.double() @ layer.dequantized().double().t()
    assert relative(layer(x), reference) < 1e-5


def test_many_rows_use_the_c_decoder_which_equals_the_readable_one_bit_for_bit():
    parts = [(Q4_K, random_blocks(Q4_K, 16, 256)), (Q6_K, random_blocks(Q6_K, 8, 256))]
    layer = GGUFLinear(parts, in_features=256)
    w = gguf_linear.decoded(layer)
    assert torch.equal(w.view(torch.int32), layer.dequantized().view(torch.int32))


def test_parts_of_different_types_stack_their_rows():
    """A fused q/k/v whose tensors the file stores as Q4_K, Q6_K and Q5_0 (a Q4_K_M file's
    mix): rows in part order; a bias added; 3-D input."""
    parts = [(Q4_K, random_blocks(Q4_K, 32, 256)), (Q6_K, random_blocks(Q6_K, 16, 256))]
    parts.append((Q5_0, random_blocks(Q5_0, 16, 256)))
    bias = torch.randn(64)
    layer = GGUFLinear(parts, in_features=256, bias=bias)
    assert layer.out_features == 64 and "Q4_K+Q6_K+Q5_0" in repr(layer)
    x = torch.randn(2, 3, 256)
    expected = F.linear(x.double(), layer.dequantized().double(), bias.double())
    assert relative(layer(x), expected) < 1e-5
    assert torch.equal(layer.forward_rows(x, 32, 48), layer(x)[..., 32:48])


@pytest.mark.parametrize("rounded", [False, True], ids=["exact", "rounded"])
def test_a_compiled_graph_calls_the_product_as_one_operator(rounded):
    layer = GGUFLinear([(Q8_0, random_blocks(Q8_0, 32, 64))], in_features=64, rounded=rounded)
    x = torch.randn(1, 64)
    compiled = torch.compile(lambda t: torch.relu(layer(t)), fullgraph=True)  # no graph break
    assert torch.allclose(compiled(x), torch.relu(layer(x)), rtol=0, atol=1e-6)


def test_the_token_table_looks_rows_up_in_the_blocks():
    table = GGUFEmbedding((Q8_0, random_blocks(Q8_0, 50, 64)), embedding_dim=64, scale=2.0)
    ids = torch.tensor([[3, 0, 49], [7, 7, 1]])
    assert torch.equal(table(ids), 2.0 * F.embedding(ids, table.weight))
    with pytest.raises(ValueError, match=r"token id 50 is outside the vocabulary \[0, 50\)"):
        table(torch.tensor([[1, 50]]))


def test_the_token_table_reads_a_tied_heads_interleaved_rows():
    blocks = random_blocks(Q8_0, 64, 64)
    head = GGUFLinear([(Q8_0, blocks)], in_features=64)
    assert head.interleaved
    table = GGUFEmbedding(head.stored()[0], embedding_dim=64)
    plain = GGUFEmbedding((Q8_0, blocks), embedding_dim=64)
    ids = torch.tensor([[3, 0, 63], [17, 17, 40]])
    assert table.num_embeddings == 64 and table.table.data_ptr() == head.packed()[0].data_ptr()
    assert torch.equal(table(ids), plain(ids)) and torch.equal(table.weight, plain.weight)


def test_bad_parts_are_one_line():
    blocks = random_blocks(Q8_0, 4, 64)
    with pytest.raises(
        ValueError, match=r"Q8_0 blocks for 96 input features must be \(rows, 102\)"
    ):
        GGUFLinear([(Q8_0, blocks)], in_features=96)
    with pytest.raises(ValueError, match="GGUF type F16 is not computed from its blocks"):
        GGUFLinear([(1, blocks)], in_features=64)
    with pytest.raises(ValueError, match="at least one part"):
        GGUFLinear([], in_features=64)


def test_without_a_c_compiler_the_readable_path_runs_with_one_warning(monkeypatch, tmp_path):
    monkeypatch.setenv("CC", str(tmp_path / "no-such-compiler"))
    monkeypatch.setenv("GLASSFORMER_CACHE", str(tmp_path))  # nothing built there yet
    gguf_linear.kernels.cache_clear()
    try:
        with pytest.warns(UserWarning, match="the GGUF kernels did not build"):
            layer = GGUFLinear([(Q8_0, random_blocks(Q8_0, 8, 64))], in_features=64)
        assert not layer.fast
        x = torch.randn(2, 64)
        assert torch.equal(layer(x), F.linear(x, layer.dequantized()))
        assert not list((tmp_path / "kernels").glob("*.so"))  # nothing half-written kept
    finally:
        gguf_linear.kernels.cache_clear()
        monkeypatch.undo()
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            assert gguf_linear.kernels() is not None


def test_many_rows_go_through_the_weight_a_tile_at_a_time(monkeypatch):
    """A prompt's rows meet the weight decoded TILE rows at a time: 48 rows in tiles of 20
    (the last one short) give the whole product."""
    monkeypatch.setattr(gguf_linear, "TILE", 20)
    layer = GGUFLinear([(Q4_K, random_blocks(Q4_K, 48, 256))], in_features=256)
    x = torch.randn(gguf_linear.MANY_ROWS + 1, 256)
    assert relative(layer(x), x.double() @ layer.dequantized().double().t()) < 1e-5


@pytest.mark.parametrize(
    "flags",
    [(), ("-mno-avx512vnni",), ("-mno-avx512bw",), ("-mno-avx512f",)],
    ids=["this-cpu", "without-vnni", "without-avx512bw", "without-avx512"],
)
def test_the_c_source_built_with_and_without_avx512_multiplies_alike(tmp_path, flags):
    """The portable path (each block decoded, then multiplied: CPUs without AVX-512) and the
    AVX-512 one, built from the same source, against the readable decoder, every type, one
    row of input and five (a group of four, then one); the interleaved rows, exact and with
    the input rounded to 8 bits (in integers with VNNI, else in plain C), and decoded from
    them bit for bit."""
    import ctypes
    import shutil

    compiler = shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        pytest.skip("no C compiler here")
    library = tmp_path / "gguf.so"
    command = [compiler, *gguf_linear.FLAGS, *flags, "-o", str(library), str(gguf_linear.SOURCE)]
    subprocess.run([*command, "-lm"], check=True, capture_output=True)
    lib = ctypes.CDLL(str(library))
    size = ctypes.c_int64
    for kind in sorted(BLOCK_BYTES):
        blocks = random_blocks(kind, 32, 256, seed=kind)
        weight = GGUFLinear([(kind, blocks)], in_features=256).dequantized()
        _, *args = gguf_linear._arguments([(kind, blocks)])
        for rows in (1, 5):
            x = torch.randn(rows, 256, generator=torch.Generator().manual_seed(rows))
            y = torch.empty(rows, 32)
            pointers = [ctypes.c_void_p(t.data_ptr()) for t in (x, y)]
            lib.gguf_matmul(*args, *pointers, size(rows), size(256), 0)
            reference = x.double() @ weight.double().t()
            assert relative(y, reference) < 1e-5, (NAMES[kind], rows, flags)
            if kind not in gguf_linear.INTERLEAVED:
                continue
            rows16 = interleave(kind, blocks)  # kept alive while C reads it
            _, *packed = gguf_linear._arguments([(kind, rows16)])
            for rounded in (0, 1):
                lib.gguf_matmul_interleaved(*packed, *pointers, size(rows), size(256), rounded)
                expected = rounded_to_8_bits(x).double() if rounded else x.double()
                reference = expected @ weight.double().t()
                assert relative(y, reference) < 1e-5, (NAMES[kind], rows, flags, rounded)
            w = torch.empty(32, 256)
            lib.gguf_dequantize_interleaved(
                *packed, ctypes.c_void_p(w.data_ptr()), size(256), size(0), size(32)
            )
            assert torch.equal(w.view(torch.int32), weight.view(torch.int32)), (NAMES[kind], flags)


@pytest.mark.parametrize("kind", [3, 7], ids=["Q4_1", "Q5_1"])
def test_interleaving_lays_sixteen_rows_blocks_side_by_side_byte_for_byte(kind):
    """For each 16 rows and block: the rows' d, their m, their fifth bits (Q5_1: a word
    each, column i's bit moved to bit 8 (i % 4) + i // 4), then four value bytes of each row in
    turn; every byte of the blocks once, and every fifth bit."""
    blocks = random_blocks(kind, 32, 64)  # two groups of 16 rows, two blocks a row
    size, fifth = BLOCK_BYTES[kind], kind == 7
    packed = interleave(kind, blocks)
    assert packed.shape == (2, 2, 16 * size)
    if not fifth:
        assert torch.equal(packed.flatten().sort().values, blocks.flatten().sort().values)
    for row, block in [(0, 0), (17, 1), (31, 0)]:
        group, r = divmod(row, 16)
        ours, theirs = packed[group, block], blocks[row, size * block : size * (block + 1)]
        assert torch.equal(ours[2 * r : 2 * r + 2], theirs[0:2])  # d
        assert torch.equal(ours[32 + 2 * r : 34 + 2 * r], theirs[2:4])  # m
        if fifth:
            word = int.from_bytes(bytes(ours[64 + 4 * r : 68 + 4 * r].tolist()), "little")
            file_word = int.from_bytes(bytes(theirs[4:8].tolist()), "little")
            for i in range(32):
                assert (word >> (8 * (i % 4) + i // 4)) & 1 == (file_word >> i) & 1, i
        values, theirs_values = 64 + 64 * fifth, 4 + 4 * fifth
        for i in range(16):
            at = values + 64 * (i // 4) + 4 * r + i % 4
            assert ours[at] == theirs[theirs_values + i]


def test_rounding_to_8_bits_gives_each_32_values_their_own_scale():
    """d = max|x| / 127, ties to even; a block of zeros stays zeros (no 0/0)."""
    x = torch.zeros(1, 64)
    x[0, :4] = torch.tensor([127.0, 63.5, 0.25, -1.5])  # d = 1
    x[0, 32:34] = torch.tensor([0.5, -0.25])  # d = 0.5 / 127
    expected = torch.zeros(1, 64)
    expected[0, :4] = torch.tensor([127.0, 64.0, 0.0, -2.0])
    expected[0, 32:34] = torch.tensor([127, -64]) * (0.5 / 127)
    assert torch.allclose(rounded_to_8_bits(x), expected, rtol=1e-6, atol=0)


@pytest.mark.parametrize("kind", sorted(BLOCK_BYTES), ids=lambda k: NAMES[k])
def test_a_rounded_layer_multiplies_its_input_rounded_to_8_bits(kind):
    """Every path (a step's rows in integers from the rows interleaved; more rows, and other
    types, rounded first then exact) equals the rounded input's exact product (1e-5), and
    is not the exact product of the input itself."""
    layer = GGUFLinear([(kind, random_blocks(kind, 48, 512, seed=kind))], 512, rounded=True)
    assert layer.interleaved == (kind in gguf_linear.INTERLEAVED)
    weight = layer.dequantized().double().t()
    for rows in (1, 3, 6, 80):
        x = torch.randn(rows, 512, generator=torch.Generator().manual_seed(rows))
        y = layer(x)
        assert relative(y, rounded_to_8_bits(x).double() @ weight) < 1e-5, rows
        assert relative(y, x.double() @ weight) > 1e-4, rows


def test_rounding_keeps_nan_and_infinity_and_zeroes_blocks_too_small_to_scale():
    """A block holding NaN or an infinity makes its row's products NaN, as the exact ones
    are; a block whose 1 / d overflows rounds to zeros (C and PyTorch alike, every path)."""
    layer = GGUFLinear([(Q8_0, random_blocks(Q8_0, 32, 64))], in_features=64, rounded=True)
    for bad in (float("nan"), float("inf")):
        for rows in (1, 6):  # interleaved in integers; from the blocks
            x = torch.randn(rows, 64)
            x[0, 3] = bad
            y = layer(x)
            assert y[0].isnan().all() and y[1:].isfinite().all(), (bad, rows)
    tiny = torch.full((1, 64), 1e-39)
    assert torch.equal(rounded_to_8_bits(tiny), torch.zeros(1, 64))
    for rows in (1, 6):
        assert torch.equal(layer(tiny.expand(rows, 64).contiguous()), torch.zeros(rows, 32))


def test_a_layer_after_a_call_deep_copies_with_a_handle_of_its_own():
    """A copy computes from its own rows (a compiled graph calls a layer by its handle);
    a freed layer's handle is one line, not a crash."""
    import copy
    import gc

    layer = GGUFLinear([(Q8_0, random_blocks(Q8_0, 32, 64))], in_features=64)
    x = torch.randn(1, 64)
    twin = copy.deepcopy(layer.eval())
    layer(x)  # the C call's arrays are made
    copied = copy.deepcopy(layer)
    assert copied.handle not in (layer.handle, twin.handle)
    copied.packed()[0].zero_()  # its own rows: the original's product is unchanged
    op = torch.ops.glassformer.gguf_linear
    assert torch.equal(op(x, layer.handle, 32, False), twin(x))
    assert torch.equal(op(x, copied.handle, 32, False), torch.zeros(1, 32))
    handle = copied.handle
    del copied
    gc.collect()
    with pytest.raises(RuntimeError, match=f"no GGUF layer of 32 outputs has handle {handle}"):
        op(x, handle, 32, False)
    with pytest.raises(RuntimeError, match="no GGUF layer of 48 outputs"):  # not this layer's
        op(x, layer.handle, 48, False)


@pytest.mark.parametrize("rounded", [False, True], ids=["exact", "rounded"])
@pytest.mark.parametrize("kind", sorted(gguf_linear.INTERLEAVED), ids=lambda k: NAMES[k])
def test_a_layer_keeps_its_rows_interleaved_instead_of_the_blocks(kind, rounded):
    """One copy of the weight: the interleaved rows replace the blocks (no ``blocks0``);
    ``parts()`` lays the file's blocks out again byte for byte, and every path (a step's
    rows, a prompt's, many rows decoded) computes from the interleaved copy what the blocks
    give; a layer given that copy shares it."""
    blocks = random_blocks(kind, 48, 256, seed=kind)
    layer = GGUFLinear([(kind, blocks)], in_features=256, rounded=rounded)
    assert layer.interleaved and not hasattr(layer, "blocks0")
    blocks_per_row = 256 // BLOCK_VALUES[kind]
    assert layer.packed()[0].shape == (3, blocks_per_row, gguf_linear.group_bytes(kind))
    assert torch.equal(layer.parts()[0][1], blocks)
    twin = GGUFLinear(layer.stored(), in_features=256, rounded=rounded)
    assert twin.packed()[0].data_ptr() == layer.packed()[0].data_ptr()
    weight = GGUFLinear([(kind, blocks)], 256).dequantized()  # from the blocks, readable
    assert torch.equal(layer.dequantized(), weight)
    assert torch.equal(gguf_linear.decoded(layer).view(torch.int32), weight.view(torch.int32))
    for rows in (1, 30, 80):
        x = torch.randn(rows, 256, generator=torch.Generator().manual_seed(rows))
        x = rounded_to_8_bits(x) if rounded else x
        assert relative(layer(x), x.double() @ weight.double().t()) < 1e-5, rows


@pytest.mark.parametrize("kind", sorted(gguf_linear.INTERLEAVED), ids=lambda k: NAMES[k])
def test_interleaving_in_place_rearranges_the_blocks_own_memory(monkeypatch, kind):
    """The same bytes as the copy, in the blocks' own memory, a few groups at a time (here
    2, over 5 groups: 2, 2, then 1); a layer given ``in_place`` keeps that view."""
    from glassformer.kernels import gguf_interleave

    monkeypatch.setattr(gguf_interleave, "CHUNK", 2)
    blocks = random_blocks(kind, 80, 256, seed=kind)
    copied = interleave(kind, blocks)
    moved = interleave(kind, blocks.clone(), in_place=True)
    assert torch.equal(moved, copied)
    mine = blocks.clone()
    layer = GGUFLinear([(kind, mine)], in_features=256, rounded=True, in_place=True)
    same = layer.packed()[0].data_ptr() == mine.data_ptr()
    assert same == (kind != Q4_K)  # Q4_K's scales unpacked: larger, so a copy
    assert torch.equal(layer.parts()[0][1], blocks)


def test_deinterleaving_picks_one_row_of_each_group():
    blocks = random_blocks(Q8_0, 64, 64)
    packed = interleave(Q8_0, blocks)
    which = torch.tensor([5, 0, 15, 9])
    picked = gguf_linear.deinterleave(Q8_0, packed, which)
    assert torch.equal(picked, blocks[torch.arange(4) * 16 + which])
