"""Hugging Face GPT-2 directories: glassformer's GPT gives transformers' numbers with their
weights, writes directories transformers opens, and refuses what it cannot read.

The comparisons run on small randomly initialised GPT-2 models (nothing is downloaded);
``test_the_released_gpt2_gives_transformers_logits_and_greedy_text`` (marked network and
slow) compares the released gpt2 checkpoint where it is already in the Hugging Face cache."""

import json
import pickle

import pytest
import torch

from glassformer import GPT, GPTConfig, load_checkpoint
from glassformer.checkpoint import CheckpointError
from glassformer.interop import load_gpt2, save_gpt2

transformers = pytest.importorskip("transformers")

CONFIGS = [
    dict(n_layer=2, n_head=4, n_embd=64, n_positions=32, vocab_size=97),
    dict(n_layer=3, n_head=2, n_embd=48, n_positions=40, vocab_size=50, n_inner=80),
    dict(n_layer=1, n_head=6, n_embd=96, n_positions=24, vocab_size=120, tie_word_embeddings=False),
    dict(n_layer=2, n_head=2, n_embd=32, n_positions=20, vocab_size=64, activation_function="relu"),
]

RELEASED_SENTENCES = [
    "The quick brown fox jumps over the lazy dog.",
    "In the beginning God created the heaven and the earth.",
    "It is a truth universally acknowledged, that a single man",
]


def hf_gpt2(seed=0, **kwargs):
    torch.manual_seed(seed)
    config = transformers.GPT2Config(
        **kwargs,
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        attn_pdrop=0.0,
        layer_norm_epsilon=1e-5,
        initializer_range=0.1,  # activations wide enough for the GELU variants to differ
        bos_token_id=None,
        eos_token_id=None,
    )
    model = transformers.GPT2LMHeadModel(config).eval()
    with torch.no_grad():  # GPT-2's init leaves LayerNorms at 1 and 0: make them count
        for name, p in model.named_parameters():
            if "ln_" in name:
                p.add_(0.2 * torch.randn_like(p))
    return model


@pytest.mark.parametrize("kwargs", CONFIGS)
def test_gpt2_logits_and_greedy_continuations_match_transformers(kwargs, tmp_path, support):
    hf = hf_gpt2(**kwargs)
    hf.save_pretrained(tmp_path)
    ours = GPT.from_pretrained(tmp_path)
    ids = torch.randint(0, kwargs["vocab_size"], (3, 12))
    with torch.no_grad():
        expected = hf(ids).logits
    torch.testing.assert_close(ours(ids).logits, expected, atol=1e-4, rtol=1e-4)
    prompt = ids[:, :4]
    hf_out = hf.generate(
        prompt,
        attention_mask=torch.ones_like(prompt),
        max_new_tokens=10,
        do_sample=False,
        pad_token_id=0,
        eos_token_id=None,
    )
    assert torch.equal(ours.generate(prompt, 10), hf_out)
    assert len({tuple(row) for row in hf_out[:, 4:].tolist()}) > 1  # they depend on the prompt
    assert torch.equal(ours.generate(prompt, 10, use_cache=False), hf_out)
    support("GPT-2", "load", "logits", "generate with cache")


def fused_qkv(cache, i):
    """glassformer's q, k, v as GPT-2's c_attn lays them out: all q, then k, then v."""
    return torch.cat([cache[f"blocks.{i}.attn.hook_{x}"].flatten(2) for x in "qkv"], dim=-1)


GPT2_MODULES = {
    "transformer.h.{i}.ln_1": "blocks.{i}.ln1.hook_normalized",
    "transformer.h.{i}.attn.c_attn": fused_qkv,
    "transformer.h.{i}.attn": "blocks.{i}.hook_attn_out",
    "transformer.h.{i}.ln_2": "blocks.{i}.ln2.hook_normalized",
    "transformer.h.{i}.mlp.c_fc": "blocks.{i}.mlp.hook_pre",
    "transformer.h.{i}.mlp": "blocks.{i}.hook_mlp_out",
}


def test_gpt2_every_activation_equals_transformers_and_the_tools_run(tmp_path, support):
    from hf_families import check_precisions_and_tools, compare_activations

    hf = hf_gpt2(**CONFIGS[0])
    hf.save_pretrained(tmp_path)
    ours = GPT.from_pretrained(tmp_path)
    ids = torch.randint(0, CONFIGS[0]["vocab_size"], (2, 12))
    assert compare_activations(hf, ours, ids, GPT2_MODULES) == 2 + ours.config.num_layers * 8
    support("GPT-2", "every activation")
    check_precisions_and_tools(ours, (ids,))
    support("GPT-2", "int8/int4", "lens/patching/viewer")


@pytest.mark.parametrize("kwargs", CONFIGS[:2])
def test_gpt2_with_attention_mask_matches_transformers_on_real_positions(kwargs, tmp_path):
    hf = hf_gpt2(**kwargs)
    hf.save_pretrained(tmp_path)
    ours = GPT.from_pretrained(tmp_path)
    ids = torch.randint(0, kwargs["vocab_size"], (3, 10))  # the padding is filler tokens
    am = torch.ones_like(ids)
    am[0, :4] = 0  # left-padded rows: the masked keys come before the real ones
    am[1, :7] = 0
    am[2, 8:] = 0  # and a right-padded one
    positions = (am.cumsum(dim=1) - 1).clamp(min=0)
    with torch.no_grad():
        expected = hf(input_ids=ids, attention_mask=am, position_ids=positions).logits
        got = ours(ids, attention_mask=am, positions=positions).logits
        unmasked = ours(ids, positions=positions).logits
    real = am.bool()  # at padded positions Hugging Face's outputs mean nothing
    torch.testing.assert_close(got[real], expected[real], atol=1e-4, rtol=1e-4)
    assert not torch.allclose(unmasked[real], expected[real], atol=1e-2)  # the mask mattered
    # With a cache, the attention_mask covers the cached tokens and the new ones, as in HF.
    cache = ours.new_cache()
    with torch.no_grad():
        ours(ids[:, :6], attention_mask=am[:, :6], cache=cache, positions=positions[:, :6])
        got = ours(ids[:, 6:], attention_mask=am, cache=cache, positions=positions[:, 6:])
        hf_first = hf(ids[:, :6], attention_mask=am[:, :6], position_ids=positions[:, :6])
        hf_next = hf(
            ids[:, 6:],
            attention_mask=am,
            position_ids=positions[:, 6:],
            past_key_values=hf_first.past_key_values,
        )
    new = real[:, 6:]
    torch.testing.assert_close(got.logits[new], hf_next.logits[new], atol=1e-4, rtol=1e-4)


def test_the_released_checkpoints_layout_loads_without_prefix_or_lm_head(tmp_path):
    """The released gpt2 files name the weights without ``transformer.``, hold no
    ``lm_head`` (it is tied) and keep each layer's causal mask as ``h.N.attn.bias``."""
    from safetensors.torch import save_file

    hf = hf_gpt2(**CONFIGS[0])
    hf.save_pretrained(tmp_path)
    state = {
        k.removeprefix("transformer."): v.contiguous()
        for k, v in hf.state_dict().items()
        if k != "lm_head.weight"
    }
    causal = torch.tril(torch.ones(32, 32)).view(1, 1, 32, 32)
    state.update({f"h.{i}.attn.bias": causal.clone() for i in range(CONFIGS[0]["n_layer"])})
    save_file(state, str(tmp_path / "model.safetensors"), metadata={"format": "pt"})
    ours = GPT.from_pretrained(tmp_path)
    ids = torch.randint(0, 97, (2, 12))
    with torch.no_grad():
        torch.testing.assert_close(ours(ids).logits, hf(ids).logits, atol=1e-4, rtol=1e-4)


@pytest.mark.network
@pytest.mark.slow
def test_the_released_gpt2_gives_transformers_logits_and_greedy_text(released_checkpoint):
    """OpenAI's GPT-2 (124M) from the Hugging Face cache, in both implementations: the
    same logits on a few sentences and the same greedy continuations."""
    folder = released_checkpoint("openai-community/gpt2", "gpt2")
    hf = transformers.GPT2LMHeadModel.from_pretrained(folder).eval()
    tokenizer = transformers.AutoTokenizer.from_pretrained(folder)
    ours = GPT.from_pretrained(folder)
    for sentence in RELEASED_SENTENCES:
        ids = tokenizer(sentence, return_tensors="pt").input_ids
        with torch.no_grad():
            expected = hf(ids).logits
            got = ours(ids).logits
        torch.testing.assert_close(got, expected, atol=1e-3, rtol=1e-4)
        hf_out = hf.generate(
            ids,
            attention_mask=torch.ones_like(ids),
            max_new_tokens=12,
            do_sample=False,
            pad_token_id=tokenizer.eos_token_id,
            eos_token_id=None,
        )
        assert torch.equal(ours.generate(ids, 12), hf_out), tokenizer.decode(hf_out[0])


def test_pytorch_model_bin_is_read_without_running_code(tmp_path):
    hf = hf_gpt2(**CONFIGS[0])
    hf.config.save_pretrained(tmp_path)
    torch.save(hf.state_dict(), tmp_path / "pytorch_model.bin")
    ids = torch.randint(0, 97, (2, 9))
    with torch.no_grad():
        torch.testing.assert_close(
            load_gpt2(tmp_path)(ids).logits, hf(ids).logits, atol=1e-4, rtol=1e-4
        )

    class Exploit:
        def __reduce__(self):
            return (print, ("this ran",))

    with open(tmp_path / "pytorch_model.bin", "wb") as f:
        pickle.dump({"transformer.wte.weight": Exploit()}, f)
    with pytest.raises(CheckpointError, match="cannot load .*pytorch_model.bin"):
        load_gpt2(tmp_path)


@pytest.mark.parametrize("tie", [True, False])
def test_a_glassformer_gpt_round_trips_through_transformers(tie, tmp_path):
    torch.manual_seed(0)
    ours = GPT(
        GPTConfig(
            vocab_size=70,
            max_len=24,
            d_model=48,
            num_heads=4,
            num_layers=2,
            activation="gelu_tanh",
            tie_weights=tie,
            pad_id=None,
        )
    ).eval()
    save_gpt2(ours, tmp_path / "exported")
    hf = transformers.GPT2LMHeadModel.from_pretrained(tmp_path / "exported").eval()
    ids = torch.randint(0, 70, (2, 15))
    with torch.no_grad():
        torch.testing.assert_close(hf(ids).logits, ours(ids).logits, atol=1e-4, rtol=1e-4)
    back = load_checkpoint(tmp_path / "exported")
    for name, value in ours.state_dict().items():
        assert torch.equal(back.state_dict()[name], value), name


def test_a_bias_free_gpt_is_gpt2_with_every_bias_at_zero(tmp_path):
    """``bias=False`` (nanoGPT's block): the same numbers as GPT-2 whose linear and LayerNorm
    biases are all zero, and exactly nanoGPT's parameter counts at its two CPU sizes."""
    hf = hf_gpt2(n_layer=2, n_head=4, n_embd=64, n_positions=32, vocab_size=97)
    with torch.no_grad():
        for name, p in hf.named_parameters():
            if name.endswith(".bias"):
                p.zero_()
    hf.save_pretrained(tmp_path)
    with_zeros = GPT.from_pretrained(tmp_path)
    config = GPTConfig(**{**with_zeros.config.to_dict(), "bias": False})
    ours = GPT(config)
    weights = {k: v for k, v in with_zeros.state_dict().items() if not k.endswith(".bias")}
    ours.load_state_dict(weights)  # strict: a bias-free model has exactly the other keys
    assert not any(name.endswith(".bias") for name, _ in ours.named_parameters())
    ids = torch.randint(0, 97, (3, 12))
    with torch.no_grad():
        torch.testing.assert_close(ours(ids).logits, hf(ids).logits, atol=1e-4, rtol=1e-4)
    # nanoGPT prints these for its shakespeare-char (6 x 384) and README CPU (4 x 128) models
    for layers, heads, width, context, count in (
        (6, 6, 384, 256, 10_745_088),
        (4, 4, 128, 64, 804_096),
    ):
        nano_like = GPTConfig(
            vocab_size=65, max_len=context, d_model=width, num_heads=heads, num_layers=layers,
            bias=False,
        )  # fmt: skip
        assert GPT(nano_like).num_parameters() == count
    with pytest.raises(ValueError, match="without bias"):
        save_gpt2(ours, tmp_path / "out")


def test_what_gpt2_cannot_express_is_refused(tmp_path):
    post_norm = GPT(
        GPTConfig(vocab_size=30, d_model=16, num_heads=2, num_layers=1, norm_first=False)
    )
    with pytest.raises(ValueError, match="cannot be written as GPT-2: post-norm"):
        save_gpt2(post_norm, tmp_path / "x")
    assert not (tmp_path / "x").exists()


def _write(path, config, weights=None):
    path.mkdir()
    (path / "config.json").write_text(json.dumps(config))
    if weights is not None:
        from safetensors.torch import save_file

        save_file(weights, str(path / "model.safetensors"), metadata={"format": "pt"})
    return path


def test_bad_gpt2_directories_give_one_clear_error(tmp_path):
    hf = hf_gpt2(**CONFIGS[0])
    hf.save_pretrained(tmp_path / "good")
    good = json.loads((tmp_path / "good" / "config.json").read_text())
    weights = {k: v.contiguous() for k, v in hf.state_dict().items() if "lm_head" not in k}
    cases = [
        (_write(tmp_path / "noweights", good), "has no model.safetensors or pytorch_model.bin"),
        (
            _write(tmp_path / "act", good | {"activation_function": "swish"}, weights),
            "activation_function 'swish' has no glassformer equivalent",
        ),
        (
            _write(tmp_path / "shape", good | {"n_embd": 32}, weights),
            r"has shape \(97, 64\), the config asks for \(97, 32\)",
        ),
        (
            _write(tmp_path / "nofield", {"model_type": "gpt2"}),
            "lacks the field 'n_embd'",
        ),
        (_write(tmp_path / "bert", {"model_type": "bloom"}), "Hugging Face 'bloom' checkpoint"),
    ]
    (tmp_path / "corrupt").mkdir()
    (tmp_path / "corrupt" / "config.json").write_text(json.dumps(good))
    (tmp_path / "corrupt" / "model.safetensors").write_bytes(b"\x00" * 100)
    cases.append((tmp_path / "corrupt", "cannot load .*model.safetensors"))
    for path, message in cases:
        with pytest.raises(CheckpointError, match=message):
            load_checkpoint(path)
    with pytest.raises(CheckpointError, match="holds a 'gpt2' model, expected 'classifier'"):
        load_checkpoint(tmp_path / "good", kind="classifier")


def test_sharded_safetensors_are_read(tmp_path):
    hf = hf_gpt2(**CONFIGS[1])
    hf.save_pretrained(tmp_path, max_shard_size="60KB")
    assert (tmp_path / "model.safetensors.index.json").is_file()
    ids = torch.randint(0, 50, (2, 7))
    with torch.no_grad():
        expected = hf(ids).logits
    torch.testing.assert_close(load_gpt2(tmp_path)(ids).logits, expected, atol=1e-4, rtol=1e-4)


def test_a_config_the_weights_do_not_hold_is_refused_before_the_model_is_built(tmp_path, builds_on):
    """A vocabulary of 10^6 in config.json, 97 rows in the weights: refused with the model
    built on the meta device only (it was built for real first: 10^6 × n_embd floats drawn
    at random, an allocation a larger number turns into a MemoryError)."""
    hf_gpt2(**CONFIGS[0]).save_pretrained(tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps(config | {"vocab_size": 10**6}))
    devices = builds_on(GPT)
    with pytest.raises(CheckpointError, match=r"has shape \(97, 64\).*\(1000000, 64\)"):
        load_gpt2(tmp_path)
    assert devices == ["meta"]
