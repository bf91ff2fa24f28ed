"""Hugging Face Gemma 3 (text) and Gemma 2 directories read into GPT: every activation
equal to transformers' Gemma3ForCausalLM / Gemma2ForCausalLM.

Random small models with sliding layers shorter than the input between global ones, both
rotary bases, a query scale unlike 1/√Dh, QK-norm, the four norms of a block (randomised:
Gemma's start at zero, which would hide a missing 1 + w), tied and untied heads, soft caps
small enough to bend the scores and logits.
"""

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
    with_config,
)

from glassformer import GPT

transformers = pytest.importorskip("transformers")

SMALL = {**SMALL_DECODER, "num_hidden_layers": 3, "rms_norm_eps": 1e-6}
GEMMA3 = {
    "gemma3-window4-softcap": dict(
        num_key_value_heads=2, head_dim=16, query_pre_attn_scalar=24, sliding_window=4,
        layer_types=["sliding_attention", "full_attention", "sliding_attention"],
        final_logit_softcapping=3.0,
    ),
    "gemma3-mqa-untied-pattern": dict(
        num_key_value_heads=1, head_dim=8, query_pre_attn_scalar=8, sliding_window=3,
        sliding_window_pattern=2, tie_word_embeddings=False,
        rope_parameters={"sliding_attention": {"rope_type": "default", "rope_theta": 100.0},
                         "full_attention": {"rope_type": "default", "rope_theta": 5e4}},
    ),
    "gemma3-linear-scaling": dict(  # Gemma 3 from 4B: the global layers' rotary × 1/8
        num_key_value_heads=2, head_dim=16, query_pre_attn_scalar=16, sliding_window=3,
        layer_types=["sliding_attention", "full_attention", "full_attention"],
        rope_parameters={"sliding_attention": {"rope_type": "default", "rope_theta": 1e4},
                         "full_attention": {"rope_type": "linear", "factor": 8.0,
                                            "rope_theta": 1e6}},
    ),
}  # fmt: skip
GEMMA2 = {
    "gemma2-softcaps": dict(
        num_key_value_heads=2,
        head_dim=16,
        query_pre_attn_scalar=16,
        sliding_window=4,
        final_logit_softcapping=3.0,
        attn_logit_softcapping=0.5,
    ),
}
CASES = {**GEMMA3, **GEMMA2}
MODULES = {
    "model.layers.{i}.input_layernorm": "blocks.{i}.ln1.hook_normalized",
    "model.layers.{i}.self_attn.q_proj": "blocks.{i}.attn.hook_q",
    "model.layers.{i}.self_attn.k_proj": "blocks.{i}.attn.hook_k",
    "model.layers.{i}.self_attn.v_proj": "blocks.{i}.attn.hook_v",
    "model.layers.{i}.post_attention_layernorm": "blocks.{i}.hook_attn_out",
    "model.layers.{i}.pre_feedforward_layernorm": "blocks.{i}.ln2.hook_normalized",
    "model.layers.{i}.post_feedforward_layernorm": "blocks.{i}.hook_mlp_out",
}


def heads_first(name):
    """glassformer's per-head values (B, T, H, Dh) as Gemma 3 normalises them: (B, H, T, Dh)."""
    return lambda cache, i: cache[name.format(i=i)].transpose(1, 2)


QK_NORM = {
    "model.layers.{i}.self_attn.q_norm": heads_first("blocks.{i}.attn.q_norm.hook_normalized"),
    "model.layers.{i}.self_attn.k_norm": heads_first("blocks.{i}.attn.k_norm.hook_normalized"),
}


def _gemma(tmp_path, name):
    if name in GEMMA3:
        config = transformers.Gemma3TextConfig(**SMALL, **GEMMA3[name])
        hf = transformers.Gemma3ForCausalLM(config)
    else:
        hf = transformers.Gemma2ForCausalLM(transformers.Gemma2Config(**SMALL, **GEMMA2[name]))
    randomize(hf.eval(), norms=(0.0, 0.3))  # Gemma's norm weights are offsets from 1
    return hf, save_and_open(hf, tmp_path / name), tmp_path / name


def family(name: str) -> str:
    return "Gemma 3" if name in GEMMA3 else "Gemma 2"


@pytest.mark.parametrize("name", sorted(CASES))
def test_every_activation_equals_transformers(tmp_path, name, support):
    hf, ours, _ = _gemma(tmp_path, name)
    modules = {**MODULES, **(QK_NORM if name in GEMMA3 else {})}
    assert compare_activations(hf, ours, IDS, modules) == 2 + 3 * (2 + len(modules))
    support(family(name), "load", "logits", "every activation")


@pytest.mark.parametrize("name", sorted(CASES))
def test_greedy_tokens_equal_and_cached_equals_uncached(tmp_path, name, support):
    hf, ours, _ = _gemma(tmp_path, name)
    check_generation(hf, ours, IDS[:, :4])
    support(family(name), "generate with cache")


@pytest.mark.parametrize("name", ["gemma3-window4-softcap", "gemma2-softcaps"])
def test_int8_int4_and_the_glass_box_tools_run_on_it(tmp_path, name, support):
    _, ours, _ = _gemma(tmp_path, name)
    check_precisions_and_tools(ours, (IDS,))
    support(family(name), "int8/int4", "lens/patching/viewer")


def test_the_parts_follow_the_config(tmp_path):
    _, ours, _ = _gemma(tmp_path, "gemma3-window4-softcap")
    c = ours.config
    assert c.attention_window == 3 and c.full_attention_layers == (1,)
    assert [b.attn.window for b in ours.blocks] == [(3, 0), None, (3, 0)]
    assert ours.blocks[0].attn.rotary.theta == 1e4 and ours.blocks[1].attn.rotary is None
    assert ours.rotary.theta == 1e6 and c.final_softcap == 3.0
    assert c.attention_scale == pytest.approx(24**-0.5)
    _, ours, _ = _gemma(tmp_path, "gemma3-mqa-untied-pattern")
    assert ours.config.full_attention_layers == (1,)  # every second layer global
    assert ours.blocks[0].attn.rotary.theta == 100.0 and ours.rotary.theta == 5e4
    _, gemma2, _ = _gemma(tmp_path, "gemma2-softcaps")
    assert gemma2.config.attention_softcap == 0.5 and gemma2.config.version == 2
    assert gemma2.blocks[0].attn.q_norm is None
    assert gemma2.config.full_attention_layers == (1,)  # Gemma 2: odd layers global


def test_the_logit_softcap_squashes_the_logits(tmp_path):
    import dataclasses

    _, ours, _ = _gemma(tmp_path, "gemma3-window4-softcap")
    uncapped = GPT(dataclasses.replace(ours.config, final_softcap=None)).eval()
    uncapped.load_state_dict(ours.state_dict())
    with torch.no_grad():
        raw, capped = uncapped(IDS).logits, ours(IDS).logits
    torch.testing.assert_close(capped, 3.0 * torch.tanh(raw / 3.0))
    assert (raw - capped).abs().max() > 0.1  # the cap bends these logits


@pytest.mark.parametrize(
    "changes, message",
    [
        (dict(hidden_activation="silu"), "Gemma 3 hidden_activation='silu'"),
        (
            dict(rope_scaling={"rope_type": "proportional", "factor": 8.0}),
            "Gemma 3 rope_scaling rope_type='proportional' is not supported",
        ),
        (
            dict(
                rope_parameters={
                    "full_attention": {"rope_type": "default"},
                    "sliding_attention": {"rope_type": "linear", "factor": 2.0},
                }
            ),
            "rope_scaling rope_type='linear' is not supported \\(only the default\\)",
        ),
        (dict(use_bidirectional_attention=True), "use_bidirectional_attention=True"),
        (
            dict(layer_types=["sliding_attention", "chunked_attention", "full_attention"]),
            "layer_types",
        ),
    ],
)
def test_what_glassformer_cannot_express_is_one_error(tmp_path, changes, message):
    _, _, path = _gemma(tmp_path, "gemma3-window4-softcap")
    check_refused(path, message, **changes)


def test_gemma3s_scaling_reads_the_same_in_transformers_4s_spelling(tmp_path):
    """A Gemma 3 config.json as transformers 4 wrote it (``rope_scaling`` for the global
    layers beside ``rope_theta`` and ``rope_local_base_freq``) is the same model as
    transformers 5's nested ``rope_parameters``."""
    hf, ours, path = _gemma(tmp_path, "gemma3-linear-scaling")
    assert ours.config.rope_scaling.rope_type == "linear" and ours.config.rope_local_theta == 1e4
    with_config(path, rope_parameters=None, rope_theta=1e6, rope_local_base_freq=1e4,
                rope_scaling={"rope_type": "linear", "factor": 8.0})  # fmt: skip
    again = GPT.from_pretrained(path)
    assert again.config == ours.config
    with torch.no_grad():
        torch.testing.assert_close(again(IDS).logits, hf(IDS).logits, atol=1e-4, rtol=0)
