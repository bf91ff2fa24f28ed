"""Hugging Face Phi-3 directories (Phi-3-mini/medium, Phi-3.5-mini, Phi-4-mini) read into
GPT: every activation equal to transformers' Phi3ForCausalLM.

Random small models: grouped-query and not, tied (Phi-4-mini) and untied heads, a sliding
window shorter than the input, rotary on part of each head, and LongRoPE whose switch from
the short to the long factors falls inside the input and inside generation.
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
from hf_families import with_config as _with_config

from glassformer import GPT
from glassformer.generation.sampling import rope_switch

transformers = pytest.importorskip("transformers")

HEAD = 8  # hidden 32 over 4 heads


def _factors(n, seed):
    return [round(1.0 + 0.5 * i + 0.25 * seed, 3) for i in range(n)]


def _longrope(rotary_dim, original=6):
    """LongRoPE turning ``rotary_dim`` features; its switch (6) inside the 10-token input."""
    return dict(rope_type="longrope", rope_theta=10000.0, short_factor=_factors(rotary_dim // 2, 0),
                long_factor=_factors(rotary_dim // 2, 3)), original  # fmt: skip


CASES = {
    "mini-gqa-window-untied": dict(num_key_value_heads=2, sliding_window=4),
    "longrope-full-rotary": dict(num_key_value_heads=4),
    "longrope-partial-tied": dict(
        num_key_value_heads=2, partial_rotary_factor=0.5, tie_word_embeddings=True
    ),  # fmt: skip (Phi-4-mini's shape)
}
MODULES = {
    "model.layers.{i}.input_layernorm": "blocks.{i}.ln1.hook_normalized",
    "model.layers.{i}.self_attn": "blocks.{i}.hook_attn_out",
    "model.layers.{i}.post_attention_layernorm": "blocks.{i}.ln2.hook_normalized",
    "model.layers.{i}.mlp.down_proj": "blocks.{i}.hook_mlp_out",
    "model.layers.{i}.mlp": "blocks.{i}.hook_mlp_out",
}


def _qkv(cache, i):
    """glassformer's q, k and v side by side, as Phi-3's fused qkv_proj lays them out."""
    return torch.cat([cache[f"blocks.{i}.attn.hook_{p}"].flatten(2) for p in "qkv"], dim=-1)


def _up(cache, i):
    """gate and up side by side, as gate_up_proj lays them out."""
    return torch.cat([cache[f"blocks.{i}.mlp.hook_pre"], cache[f"blocks.{i}.mlp.hook_pre_linear"]],
                     dim=-1)  # fmt: skip


def _phi3(tmp_path, name):
    changes = dict(CASES[name])
    size = dict(SMALL_DECODER)
    if name.startswith("longrope"):
        rotary = int(HEAD * changes.get("partial_rotary_factor", 1.0))
        rope, original = _longrope(rotary)
        changes.update(rope_parameters=rope, original_max_position_embeddings=original)
    config = transformers.Phi3Config(**size, pad_token_id=None, **changes)
    hf = transformers.Phi3ForCausalLM(config).eval()
    randomize(hf)
    return hf, save_and_open(hf, tmp_path / name), tmp_path / name


@pytest.mark.parametrize("name", sorted(CASES))
def test_every_activation_equals_transformers(tmp_path, name, support):
    hf, ours, _ = _phi3(tmp_path, name)
    modules = {
        **MODULES,
        "model.layers.{i}.self_attn.qkv_proj": _qkv,
        "model.layers.{i}.mlp.gate_up_proj": _up,
    }
    assert compare_activations(hf, ours, IDS, modules) == 2 + 2 * (2 + len(modules))
    support("Phi-3", "load", "logits", "every activation")


@pytest.mark.parametrize("name", sorted(CASES))
def test_greedy_tokens_equal_and_cached_equals_uncached(tmp_path, name, support):
    """20 greedy tokens equal transformers'; with LongRoPE the prompt (4 tokens) is within
    the short factors' reach and generation crosses into the long ones, where both
    libraries turn the cached keys anew."""
    hf, ours, _ = _phi3(tmp_path, name)
    check_generation(hf, ours, IDS[:, :4])
    support("Phi-3", "generate with cache")


def test_int8_int4_and_the_glass_box_tools_run_on_it(tmp_path, support):
    _, ours, _ = _phi3(tmp_path, "longrope-partial-tied")
    check_precisions_and_tools(ours, (IDS,))
    support("Phi-3", "int8/int4", "lens/patching/viewer")


def test_the_parts_follow_the_config(tmp_path):
    """Half of each head turned by LongRoPE switching after 6 positions; a window of 4
    (the query and 3 keys before it) on every layer of the windowed model."""
    _, ours, _ = _phi3(tmp_path, "longrope-partial-tied")
    c = ours.config
    assert c.rotary_dim == 4 and ours.rotary.head_dim == 4
    assert c.rope_scaling.rope_type == "longrope" and rope_switch(ours) == 6
    assert ours.lm_head.weight is ours.embed.weight
    _, windowed, _ = _phi3(tmp_path, "mini-gqa-window-untied")
    assert [b.attn.window for b in windowed.blocks] == [(3, 0), (3, 0)]
    assert windowed.config.rotary_dim is None and rope_switch(windowed) is None


def test_the_long_factors_are_what_longrope_adds(tmp_path):
    """Past the switch the long factors turn the positions: the same model with the short
    factors everywhere moves away from transformers' logits there, not before."""
    hf, ours, _ = _phi3(tmp_path, "longrope-full-rotary")
    scaling = ours.config.rope_scaling
    short = dataclasses.replace(scaling, long_factor=scaling.short_factor)
    shorter = GPT(dataclasses.replace(ours.config, rope_scaling=short)).eval()
    shorter.load_state_dict(ours.state_dict())
    with torch.no_grad():
        expected = hf(IDS).logits
        torch.testing.assert_close(ours(IDS).logits, expected, atol=1e-4, rtol=0)
        torch.testing.assert_close(shorter(IDS[:, :6]).logits, hf(IDS[:, :6]).logits,
                                   atol=1e-4, rtol=0)  # fmt: skip
        assert (shorter(IDS).logits - expected).abs().max() > 1e-3


def test_a_generation_crossing_the_switch_recomputes_its_cache(tmp_path):
    """Cached keys turned by the short factors are turned anew when the sequence grows past
    the switch (as transformers does): without that, the cached tokens differ from the
    uncached ones once the switch is crossed."""
    import glassformer.generation.sampling as sampling

    hf, ours, _ = _phi3(tmp_path, "longrope-full-rotary")
    prompt = IDS[:, :4]
    ref = hf.generate(prompt, max_new_tokens=20, do_sample=False, pad_token_id=0)
    assert torch.equal(ours.generate(prompt, 20), ref)
    original = sampling.rope_switch
    try:
        sampling.rope_switch = lambda model: None  # the cache kept across the switch
        kept = ours.generate(prompt, 20)
    finally:
        sampling.rope_switch = original
    assert not torch.equal(kept, ref)


def test_phi3_earlier_spellings_of_longrope_read_as_longrope(tmp_path):
    """Phi-3's released configs say rope_scaling {"type": "su"} (or "yarn"), which
    transformers reads as LongRoPE: so does glassformer, to the same logits."""
    hf, _, path = _phi3(tmp_path, "longrope-partial-tied")
    config = hf.config.to_dict()
    rope = {k: v for k, v in config["rope_parameters"].items() if k != "rope_theta"}
    for spelling in ("su", "yarn"):
        _with_config(path, rope_parameters=None,
                     rope_scaling={**rope, "type": spelling, "rope_type": spelling})  # fmt: skip
        ours = GPT.from_pretrained(path)
        assert ours.config.rope_scaling.rope_type == "longrope"
        with torch.no_grad():
            torch.testing.assert_close(ours(IDS).logits, hf(IDS).logits, atol=1e-4, rtol=0)


@pytest.mark.parametrize(
    "changes, message",
    [
        (dict(hidden_act="gelu"), "Phi-3 hidden_act='gelu'"),
        (dict(rope_parameters={"partial_rotary_factor": 0.1}), "partial_rotary_factor"),
        (dict(sliding_window=1), "Phi-3 sliding_window=1"),
        (dict(rope_parameters={"rope_type": "wobble", "rope_theta": 1e4}), "'wobble'"),
        (dict(dense_attention_every_n_layers=2), "dense_attention_every_n_layers"),
    ],
)
def test_what_glassformer_cannot_express_is_one_error(tmp_path, changes, message):
    _, _, path = _phi3(tmp_path, "mini-gqa-window-untied")
    check_refused(path, message, **changes)


def test_bias_fields_transformers_leaves_alone_are_read_and_left(tmp_path):
    """transformers' Phi-3 has no biases whatever ``attention_bias`` and ``mlp_bias`` say:
    a config carrying them true gives the same logits."""
    hf, _, path = _phi3(tmp_path, "mini-gqa-window-untied")
    _with_config(path, attention_bias=True, mlp_bias=True)
    with torch.no_grad():
        torch.testing.assert_close(
            GPT.from_pretrained(path)(IDS).logits, hf(IDS).logits, atol=1e-4, rtol=0
        )
