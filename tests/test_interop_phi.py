"""Hugging Face Phi directories (Phi-1, Phi-1.5, Phi-2) read into GPT: every activation
equal to transformers' PhiForCausalLM.

Random small models: Phi-2's 0.4 of each head turned (10 features, 4 turned), Phi-1.5's
half, grouped-query heads, a tied head, and the optional per-head q/k LayerNorm.
"""

import dataclasses

import pytest
import torch
from hf_families import (
    IDS,
    SMALL_DECODER,
    check_generation,
    check_precisions_and_tools,
    check_refused,
    compare_activations,
    randomize,
    save_and_open,
)

from glassformer import GPT

transformers = pytest.importorskip("transformers")

CASES = {
    "phi2-shape-0.4-of-10": dict(hidden_size=40, partial_rotary_factor=0.4),
    "half-rotary-gqa-tied": dict(num_key_value_heads=2, tie_word_embeddings=True),
    "qk-layernorm": dict(qk_layernorm=True, partial_rotary_factor=0.75),
}
MODULES = {
    "model.layers.{i}.input_layernorm": "blocks.{i}.ln1.hook_normalized",
    "model.layers.{i}.self_attn.q_proj": "blocks.{i}.attn.hook_q",
    "model.layers.{i}.self_attn.k_proj": "blocks.{i}.attn.hook_k",
    "model.layers.{i}.self_attn.v_proj": "blocks.{i}.attn.hook_v",
    "model.layers.{i}.self_attn": "blocks.{i}.hook_attn_out",
    "model.layers.{i}.mlp.fc1": "blocks.{i}.mlp.hook_pre",
    "model.layers.{i}.mlp": "blocks.{i}.hook_mlp_out",
}
HEAD_NORMS = {  # per head: (B, H, T, Dh) in transformers, (B, T, H, Dh) here
    f"model.layers.{{i}}.self_attn.{p}_layernorm": (
        lambda cache, i, p=p: cache[f"blocks.{i}.attn.{p}_norm.hook_normalized"].transpose(1, 2)
    )
    for p in "qk"
}


def _phi(tmp_path, name):
    size = {k: v for k, v in SMALL_DECODER.items() if k != "rms_norm_eps"}
    config = transformers.PhiConfig(**{**size, **CASES[name]})
    hf = transformers.PhiForCausalLM(config).eval()
    randomize(hf)
    return hf, save_and_open(hf, tmp_path / name), tmp_path / name


@pytest.mark.parametrize("name", sorted(CASES))
def test_every_activation_equals_transformers(tmp_path, name, support):
    hf, ours, _ = _phi(tmp_path, name)
    modules = {**MODULES, **(HEAD_NORMS if ours.config.qk_norm else {})}
    assert compare_activations(hf, ours, IDS, modules) == 2 + 2 * (2 + len(modules))
    support("Phi", "load", "logits", "every activation")


@pytest.mark.parametrize("name", sorted(CASES))
def test_greedy_tokens_equal_and_cached_equals_uncached(tmp_path, name, support):
    hf, ours, _ = _phi(tmp_path, name)
    check_generation(hf, ours, IDS[:, :4])
    support("Phi", "generate with cache")


def test_int8_int4_and_the_glass_box_tools_run_on_it(tmp_path, support):
    _, ours, _ = _phi(tmp_path, "phi2-shape-0.4-of-10")
    check_precisions_and_tools(ours, (IDS,))
    support("Phi", "int8/int4", "lens/patching/viewer")


def test_the_parts_follow_the_config(tmp_path):
    """4 of each head's 10 features turned, one norm read by both sub-layers, a head bias."""
    _, ours, _ = _phi(tmp_path, "phi2-shape-0.4-of-10")
    assert ours.config.rotary_dim == 4 and ours.rotary.head_dim == 4
    block = ours.blocks[0]
    assert block.parallel and block.ln2 is None and block.attn.qkv_proj.bias is not None
    assert ours.lm_head.bias is not None
    assert "blocks.0.ln2.hook_normalized" not in ours.hook_names()


def test_one_norm_for_both_sublayers_is_what_makes_it_phi(tmp_path):
    """The MLP reads ln1's output: given a norm of its own (a second LayerNorm, as
    GPT-NeoX's blocks have), the logits move away from transformers'."""
    from glassformer.modules.norms import LayerNorm

    hf, ours, _ = _phi(tmp_path, "half-rotary-gqa-tied")
    twin = GPT(dataclasses.replace(ours.config)).eval()
    twin.load_state_dict(ours.state_dict())
    for block in twin.blocks:
        block.ln2 = LayerNorm(32)  # unit weight, zero bias: not ln1's learned scale
    with torch.no_grad():
        expected = hf(IDS).logits
        torch.testing.assert_close(ours(IDS).logits, expected, atol=1e-4, rtol=0)
        assert (twin(IDS).logits - expected).abs().max() > 1e-2


@pytest.mark.parametrize(
    "changes, message",
    [
        (dict(hidden_act="silu"), "Phi hidden_act='silu'"),
        (dict(rope_parameters={"partial_rotary_factor": 0.1}), "partial_rotary_factor"),
        (dict(rope_parameters={"rope_type": "wobble", "rope_theta": 1e4}), "'wobble'"),
        (dict(resid_pdrop=0.1, parallel_residual=False), "parallel_residual"),
    ],
)
def test_what_glassformer_cannot_express_is_one_error(tmp_path, changes, message):
    _, _, path = _phi(tmp_path, "half-rotary-gqa-tied")
    check_refused(path, message, **changes)
