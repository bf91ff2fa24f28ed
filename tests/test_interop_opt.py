"""Hugging Face OPT directories read into GPT: every activation equal to transformers'
OPTForCausalLM.

Random small models (tied and untied heads, ReLU and GELU), every parameter drawn at random,
the position table's two leading rows included; a left-padded batch against OPT's own
positions (it counts them from the attention mask).
"""

import pytest
import torch
from hf_families import (
    IDS,
    VOCAB,
    check_generation,
    check_precisions_and_tools,
    check_refused,
    compare_activations,
    randomize,
    save_and_open,
)

transformers = pytest.importorskip("transformers")

CASES = {
    "relu-tied": dict(tie_word_embeddings=True),
    "gelu-untied": dict(activation_function="gelu", tie_word_embeddings=False),
    "350m-post-norm-projected": dict(word_embed_proj_dim=16, do_layer_norm_before=False),
}
MODULES = {
    "model.decoder.layers.{i}.self_attn_layer_norm": "blocks.{i}.ln1.hook_normalized",
    "model.decoder.layers.{i}.self_attn.q_proj": "blocks.{i}.attn.hook_q",
    "model.decoder.layers.{i}.self_attn.k_proj": "blocks.{i}.attn.hook_k",
    "model.decoder.layers.{i}.self_attn.v_proj": "blocks.{i}.attn.hook_v",
    "model.decoder.layers.{i}.self_attn": "blocks.{i}.hook_attn_out",
    "model.decoder.layers.{i}.final_layer_norm": "blocks.{i}.ln2.hook_normalized",
    "model.decoder.layers.{i}.fc1": "blocks.{i}.mlp.hook_pre",
    "model.decoder.layers.{i}.fc2": "blocks.{i}.hook_mlp_out",
}


def _opt(tmp_path, name):
    config = transformers.OPTConfig(
        vocab_size=VOCAB,
        hidden_size=32,
        num_hidden_layers=2,
        ffn_dim=64,
        num_attention_heads=4,
        max_position_embeddings=64,
        dropout=0.0,
        attn_implementation="eager",
        pad_token_id=1,
        bos_token_id=None,
        eos_token_id=None,
        **CASES[name],
    )
    hf = transformers.OPTForCausalLM(config).eval()
    randomize(hf)
    return hf, save_and_open(hf, tmp_path / name), tmp_path / name


@pytest.mark.parametrize("name", sorted(CASES))
def test_every_activation_equals_transformers(tmp_path, name, support):
    hf, ours, _ = _opt(tmp_path, name)
    final = 0 if "350m" in name else 1  # OPT-350m has no final norm
    assert compare_activations(hf, ours, IDS, MODULES) == 1 + final + 2 * (2 + len(MODULES))
    support("OPT", "load", "logits", "every activation")


@pytest.mark.parametrize("name", sorted(CASES))
def test_greedy_tokens_equal_and_cached_equals_uncached(tmp_path, name, support):
    hf, ours, _ = _opt(tmp_path, name)
    check_generation(hf, ours, IDS[:, :4])
    support("OPT", "generate with cache")


@pytest.mark.parametrize("name", ["relu-tied", "350m-post-norm-projected"])
def test_int8_int4_and_the_glass_box_tools_run_on_it(tmp_path, name, support):
    _, ours, _ = _opt(tmp_path, name)
    check_precisions_and_tools(ours, (IDS,))
    support("OPT", "int8/int4", "lens/patching/viewer")


def test_a_left_padded_batch_equals_opt_on_its_real_tokens(tmp_path):
    hf, ours, _ = _opt(tmp_path, "relu-tied")
    ids = IDS.clone()
    attention_mask = torch.ones_like(ids)
    ids[1, :3], attention_mask[1, :3] = 1, 0
    with torch.no_grad():  # OPT counts positions from the mask; glassformer is told them
        expected = hf(ids, attention_mask=attention_mask).logits
    positions = (attention_mask.cumsum(-1) - 1).clamp(min=0)
    got = ours(ids, attention_mask=attention_mask, positions=positions).logits
    real = attention_mask.bool()
    torch.testing.assert_close(got[real], expected[real], atol=1e-4, rtol=0)
    ref = hf.generate(
        ids, attention_mask=attention_mask, max_new_tokens=10, do_sample=False, pad_token_id=1
    )
    assert torch.equal(ours.generate(ids, 10, attention_mask=attention_mask), ref)


def test_opt_350m_is_post_norm_with_projected_embeddings(tmp_path):
    _, ours, _ = _opt(tmp_path, "350m-post-norm-projected")
    c = ours.config
    assert not c.norm_first and not c.final_norm and c.embed_dim == 16
    assert ours.embed.weight.shape == (VOCAB, 16) and ours.ln_final is None
    assert ours.project_in.weight.shape == (32, 16) and ours.project_out.weight.shape == (16, 32)


@pytest.mark.parametrize(
    "changes, message",
    [
        (dict(enable_bias=False), "OPT enable_bias=False"),
        (dict(activation_function="silu"), "OPT activation_function='silu'"),
    ],
)
def test_what_glassformer_cannot_express_is_one_error(tmp_path, changes, message):
    _, _, path = _opt(tmp_path, "relu-tied")
    check_refused(path, message, **changes)
