"""Hugging Face Llama directories read into GPT: the same numbers as LlamaForCausalLM.

Random small Llama models (GQA with 1, 2 and 4 KV heads of 4, a non-default rope_theta,
tied and untied heads, one sharded) are saved by transformers and loaded with
``GPT.from_pretrained``; weights are drawn with std 0.1 so small slips show.
"""

import pytest
import torch

from glassformer import GPT

transformers = pytest.importorskip("transformers")
from hf_families import IDS as IDS_LONG  # noqa: E402  (after the skip: it needs transformers)
from hf_families import (  # noqa: E402
    LLAMA_SHAPED,
    SMALL_DECODER,
    check_generation,
    check_precisions_and_tools,
    check_refused,
    compare_activations,
    randomize,
    save_and_open,
)

VOCAB = 97
CASES = {
    "mha-untied": dict(num_key_value_heads=4, tie_word_embeddings=False),
    "gqa2-theta50000": dict(num_key_value_heads=2, rope_theta=50000.0),
    "mqa-tied": dict(num_key_value_heads=1, tie_word_embeddings=True),
}


def _llama(tmp_path, name, *, shard=False):
    overrides = dict(CASES[name])
    theta = overrides.pop("rope_theta", 10000.0)
    config = transformers.LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=32,
        intermediate_size=72,
        num_hidden_layers=2,
        num_attention_heads=4,
        max_position_embeddings=64,
        rms_norm_eps=1e-5,
        initializer_range=0.1,
        bos_token_id=None,
        eos_token_id=None,  # no early stop: 20 tokens on both sides
        rope_parameters={"rope_type": "default", "rope_theta": theta},
        **overrides,
    )
    torch.manual_seed(0)
    hf = transformers.LlamaForCausalLM(config).eval()
    with torch.no_grad():  # the norms start at ones: make them matter too
        for n, p in hf.named_parameters():
            if "norm" in n:
                p.normal_(1.0, 0.2)
    path = tmp_path / name
    hf.save_pretrained(path, **({"max_shard_size": "20KB"} if shard else {}))
    return hf, GPT.from_pretrained(path), path


IDS = torch.tensor([[5, 17, 3, 88, 42, 9, 60, 1], [7, 7, 30, 2, 96, 11, 4, 8]])


@pytest.mark.parametrize("name", sorted(CASES))
def test_logits_equal_llama(tmp_path, name, support):
    hf, ours, _ = _llama(tmp_path, name)
    with torch.no_grad():
        expected = hf(IDS).logits
    assert expected.abs().max() > 1.0  # the weights are not negligible
    torch.testing.assert_close(ours(IDS).logits, expected, atol=1e-4, rtol=0)
    support("Llama", "load", "logits")


def test_sharded_directory_loads(tmp_path):
    hf, ours, path = _llama(tmp_path, "gqa2-theta50000", shard=True)
    assert (path / "model.safetensors.index.json").is_file()
    assert ours.config.rope_theta == 50000.0 and ours.config.num_kv_heads == 2
    with torch.no_grad():
        torch.testing.assert_close(ours(IDS).logits, hf(IDS).logits, atol=1e-4, rtol=0)


@pytest.mark.parametrize("name", sorted(CASES))
def test_greedy_continuations_equal_and_cached_equals_uncached(tmp_path, name, support):
    hf, ours, _ = _llama(tmp_path, name)
    prompt = IDS[:, :4]
    ref = hf.generate(prompt, max_new_tokens=20, do_sample=False, pad_token_id=0)
    cached = ours.generate(prompt, 20)
    uncached = ours.generate(prompt, 20, use_cache=False)
    assert torch.equal(cached, ref)
    assert torch.equal(uncached, ref)
    support("Llama", "generate with cache")


def test_left_padded_batch_matches_llama_on_real_positions(tmp_path):
    hf, ours, _ = _llama(tmp_path, "gqa2-theta50000")
    ids = IDS.clone()
    ids[1, :3] = 0
    attention_mask = torch.ones_like(ids)
    attention_mask[1, :3] = 0
    positions = (attention_mask.cumsum(-1) - 1).clamp(min=0)
    with torch.no_grad():
        expected = hf(ids, attention_mask=attention_mask, position_ids=positions).logits
    got = ours(ids, attention_mask=attention_mask, positions=positions).logits
    real = attention_mask.bool()
    torch.testing.assert_close(got[real], expected[real], atol=1e-4, rtol=0)
    # and the padded row's real tokens equal that row alone
    alone = ours(ids[1:, 3:]).logits
    torch.testing.assert_close(got[1, 3:], alone[0], atol=1e-4, rtol=0)


@pytest.mark.parametrize(
    "changes, message",
    [
        (
            dict(rope_scaling={"rope_type": "proportional", "factor": 2.0}),
            "rope_scaling rope_type='proportional' is not supported",
        ),
        (
            dict(rope_parameters={"rope_type": "llama3", "rope_theta": 1e4}),
            "llama3 scaling needs a factor > 0, got None",
        ),
        (
            dict(rope_scaling={"type": "linear", "factor": 2.0, "wobble": 1}),
            r"linear rope_scaling field\(s\)=\['wobble'\]",
        ),
        (
            dict(rope_parameters={"rope_type": "default", "partial_rotary_factor": 0.5}),
            "partial_rotary_factor=0.5",
        ),
        (
            dict(rope_theta=1.0, rope_scaling={"rope_type": "yarn", "factor": 4.0}),
            "yarn scaling with base 1.0",
        ),
        (dict(attention_bias=True, mlp_bias=False), "attention_bias=True with mlp_bias=False"),
        (dict(hidden_act="gelu"), "hidden_act='gelu'"),
        (dict(pretraining_tp=2), "pretraining_tp=2"),
        (dict(num_key_value_heads=3), "num_kv_heads"),
    ],
)
def test_configs_glassformer_cannot_express_are_one_error(tmp_path, changes, message):
    _, _, path = _llama(tmp_path, "mqa-tied")
    check_refused(path, message, **changes)


def test_a_loaded_llama_round_trips_through_glassformer_checkpoints(tmp_path):
    _, ours, _ = _llama(tmp_path, "mha-untied")
    again = GPT.from_pretrained(ours.save_pretrained(tmp_path / "ours"))
    assert again.config == ours.config
    torch.testing.assert_close(again(IDS).logits, ours(IDS).logits, atol=0, rtol=0)


def test_left_padded_generation_equals_llama(tmp_path):
    hf, ours, _ = _llama(tmp_path, "gqa2-theta50000")
    ids = IDS[:, :6].clone()
    attention_mask = torch.ones_like(ids)
    ids[1, :2], attention_mask[1, :2] = 0, 0  # the second prompt is two tokens shorter
    ref = hf.generate(
        ids, attention_mask=attention_mask, max_new_tokens=12, do_sample=False, pad_token_id=0
    )
    assert torch.equal(ours.generate(ids, 12, attention_mask=attention_mask), ref)


def test_a_llama_is_built_around_the_weights_read_not_a_copy_of_them():
    """model_holding builds on the meta device and takes the tensors themselves: no random
    initial weights, no second copy; the rotary frequencies and the tie are made again, and
    the model computes what one built the ordinary way computes."""
    from glassformer import GPT, GPTConfig
    from glassformer.interop._hf import model_holding

    torch.manual_seed(0)
    config = GPTConfig.preset("llama-tiny", vocab_size=64, rope_theta=50000.0)
    reference = GPT(config).eval()
    state = {k: v.clone() for k, v in reference.state_dict().items()}
    model = model_holding(GPT, config, state)
    name = "blocks.1.mlp.gate_proj.weight"
    assert model.get_parameter(name).data_ptr() == state[name].data_ptr()  # not copied
    assert model.lm_head.weight is model.embed.weight  # tied again
    rotary = model.rotary
    assert not rotary.inv_freq.is_meta
    torch.testing.assert_close(rotary.inv_freq, reference.rotary.inv_freq)
    ids = torch.randint(0, 64, (2, 12))
    torch.testing.assert_close(model(ids).logits, reference(ids).logits, rtol=0, atol=0)
    assert not model.training


MISTRAL = {
    "mistral-window4-gqa2": dict(num_key_value_heads=2, sliding_window=4),
    "mistral-nowindow-untied": dict(
        num_key_value_heads=4, sliding_window=None, tie_word_embeddings=False
    ),
}


def _mistral(tmp_path, name):

    config = transformers.MistralConfig(**SMALL_DECODER, **MISTRAL[name])
    hf = transformers.MistralForCausalLM(config).eval()
    randomize(hf)
    return hf, save_and_open(hf, tmp_path / name)


@pytest.mark.parametrize("name", sorted(MISTRAL))
def test_mistral_every_activation_equals_transformers(tmp_path, name, support):

    hf, ours = _mistral(tmp_path, name)
    window = MISTRAL[name]["sliding_window"]
    assert ours.config.attention_window == (None if window is None else window - 1)
    compare_activations(hf, ours, IDS_LONG, LLAMA_SHAPED)  # 10 tokens: longer than the window
    support("Mistral", "load", "logits", "every activation")


@pytest.mark.parametrize("name", sorted(MISTRAL))
def test_mistral_greedy_tokens_equal_cached_and_uncached(tmp_path, name, support):

    hf, ours = _mistral(tmp_path, name)
    check_generation(hf, ours, IDS_LONG[:, :3])  # 23 tokens: the rolling cache wraps
    support("Mistral", "generate with cache")


def test_llama_every_activation_equals_transformers(tmp_path, support):

    hf, ours, _ = _llama(tmp_path, "gqa2-theta50000")
    compare_activations(hf, ours, IDS_LONG, LLAMA_SHAPED)
    support("Llama", "every activation")


def test_int8_int4_and_the_glass_box_tools_run_on_llama_and_mistral(tmp_path, support):
    _, llama, _ = _llama(tmp_path, "gqa2-theta50000")
    check_precisions_and_tools(llama, (IDS_LONG,))
    support("Llama", "int8/int4", "lens/patching/viewer")
    _, mistral = _mistral(tmp_path, "mistral-window4-gqa2")
    check_precisions_and_tools(mistral, (IDS_LONG,))
    support("Mistral", "int8/int4", "lens/patching/viewer")


# Llama 3.x and the rope scaling rules every Llama-shaped family reads: a short trained
# context (16) so that the scaling moves every position the tests use.
SCALED = {
    "llama3": dict(rope_type="llama3", factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
                   original_max_position_embeddings=16, rope_theta=500000.0),
    "linear": dict(rope_type="linear", factor=4.0, rope_theta=10000.0),
    "yarn": dict(rope_type="yarn", factor=4.0, original_max_position_embeddings=16,
                 rope_theta=10000.0),
    "dynamic": dict(rope_type="dynamic", factor=2.0, rope_theta=10000.0),
}  # fmt: skip


def _scaled_llama(tmp_path, name):
    dynamic = name == "dynamic"  # trained on 16: decoding to 28 tokens grows the base
    config = transformers.LlamaConfig(
        **{**SMALL_DECODER, "max_position_embeddings": 16 if dynamic else 64},
        num_key_value_heads=2,
        head_dim=16,
        tie_word_embeddings=name == "llama3",
        rope_parameters=SCALED[name],
    )
    hf = transformers.LlamaForCausalLM(config).eval()
    randomize(hf)
    return hf, save_and_open(hf, tmp_path / name)


@pytest.mark.parametrize("name", sorted(SCALED))
def test_scaled_rotary_llamas_equal_transformers_in_every_activation(tmp_path, name):
    """Llama 3.x's llama3 rule, linear, YaRN and dynamic NTK scaling: logits and every
    shared activation within 1e-4 of transformers'."""
    hf, ours = _scaled_llama(tmp_path, name)
    assert ours.config.rope_scaling.rope_type == name
    compared = compare_activations(hf, ours, IDS_LONG, LLAMA_SHAPED)
    assert compared > 10


@pytest.mark.parametrize("name", sorted(SCALED))
def test_scaled_rotary_llamas_decode_transformers_tokens(tmp_path, name):
    """20 greedy tokens equal transformers', with the cache and without (dynamic NTK's
    cached keys keep the base they were turned with, in both libraries, so each mode is
    held against the same mode)."""
    hf, ours = _scaled_llama(tmp_path, name)
    prompt = IDS_LONG[:, :8]
    for cache in (True, False):
        ref = hf.generate(prompt, max_new_tokens=20, do_sample=False, use_cache=cache)
        assert torch.equal(ours.generate(prompt, 20, use_cache=cache), ref), cache


def test_a_scaled_llama_saves_and_loads_its_scaling(tmp_path):
    """The rule is part of the saved config: the model read back is the same model."""
    _, ours = _scaled_llama(tmp_path, "llama3")
    ours.save_pretrained(tmp_path / "saved")
    again = GPT.from_pretrained(tmp_path / "saved")
    assert again.config == ours.config
    with torch.no_grad():
        assert torch.equal(again(IDS_LONG).logits, ours(IDS_LONG).logits)
