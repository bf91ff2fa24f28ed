"""Hugging Face GPT-NeoX (Pythia) directories read into GPT: every activation equal to
transformers' GPTNeoXForCausalLM.

Random small models: parallel and sequential residuals, a quarter and a half of each head
rotated, the whole head rotated, a tied head; every parameter drawn at random.
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
    "parallel-quarter": dict(use_parallel_residual=True, rotary_pct=0.25),
    "sequential-half-theta500": dict(
        use_parallel_residual=False, rotary_pct=0.5, rotary_emb_base=500
    ),
    "parallel-whole-tied-gelu-new": dict(
        use_parallel_residual=True, rotary_pct=1.0, tie_word_embeddings=True, hidden_act="gelu_new"
    ),
}
H, DH = 4, 16


def fused_qkv(cache, i):
    """glassformer's q, k, v as GPT-NeoX's fused projection lays them out: per head, q k v."""
    q, k, v = (cache[f"blocks.{i}.attn.hook_{x}"] for x in "qkv")  # each (B, T, H, Dh)
    return torch.stack([q, k, v], dim=3).flatten(2)  # (B, T, H·3·Dh)


MODULES = {
    "gpt_neox.layers.{i}.input_layernorm": "blocks.{i}.ln1.hook_normalized",
    "gpt_neox.layers.{i}.attention.query_key_value": fused_qkv,
    "gpt_neox.layers.{i}.attention": "blocks.{i}.hook_attn_out",
    "gpt_neox.layers.{i}.post_attention_layernorm": "blocks.{i}.ln2.hook_normalized",
    "gpt_neox.layers.{i}.mlp": "blocks.{i}.hook_mlp_out",
}


def _neox(tmp_path, name):
    config = transformers.GPTNeoXConfig(
        vocab_size=VOCAB,
        hidden_size=H * DH,
        num_hidden_layers=2,
        num_attention_heads=H,
        intermediate_size=96,
        max_position_embeddings=64,
        attn_implementation="eager",
        bos_token_id=None,
        eos_token_id=None,
        **CASES[name],
    )
    hf = transformers.GPTNeoXForCausalLM(config).eval()
    randomize(hf)
    return hf, save_and_open(hf, tmp_path / name), tmp_path / name


@pytest.mark.parametrize("name", sorted(CASES))
def test_every_activation_equals_transformers(tmp_path, name, support):
    hf, ours, _ = _neox(tmp_path, name)
    assert compare_activations(hf, ours, IDS, MODULES) == 2 + 2 * (2 + len(MODULES))
    support("GPT-NeoX", "load", "logits", "every activation")


@pytest.mark.parametrize("name", sorted(CASES))
def test_greedy_tokens_equal_and_cached_equals_uncached(tmp_path, name, support):
    hf, ours, _ = _neox(tmp_path, name)
    check_generation(hf, ours, IDS[:, :4])
    support("GPT-NeoX", "generate with cache")


def test_int8_int4_and_the_glass_box_tools_run_on_it(tmp_path, support):
    _, ours, _ = _neox(tmp_path, "parallel-quarter")
    check_precisions_and_tools(ours, (IDS,))
    support("GPT-NeoX", "int8/int4", "lens/patching/viewer")


def test_the_parts_follow_the_config(tmp_path):
    _, ours, _ = _neox(tmp_path, "parallel-quarter")
    assert ours.config.rotary_dim == 4 and ours.rotary.head_dim == 4
    assert ours.blocks[0].parallel and not hasattr(ours.blocks[0], "hook_resid_mid")
    _, ours, _ = _neox(tmp_path, "sequential-half-theta500")
    assert ours.config.rotary_dim == 8 and ours.config.rope_theta == 500
    assert not ours.blocks[0].parallel


@pytest.mark.parametrize(
    "changes, message",
    [
        (dict(hidden_act="silu"), "GPT-NeoX hidden_act='silu'"),
        (dict(attention_bias=False), "GPT-NeoX attention_bias=False"),
        (dict(rope_parameters={"rope_type": "linear", "factor": 2.0}), "rope_type='linear'"),
        (
            dict(rope_parameters={"rope_type": "default", "partial_rotary_factor": 0.1}),
            r"rotary_pct=0.1 is not supported \(1 of 16 features turned",
        ),
    ],
)
def test_what_glassformer_cannot_express_is_one_error(tmp_path, changes, message):
    _, _, path = _neox(tmp_path, "parallel-quarter")
    check_refused(path, message, **changes)
