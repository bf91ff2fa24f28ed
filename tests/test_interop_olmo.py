"""Hugging Face OLMo and OLMo 2 directories read into GPT: every activation equal to
transformers' OlmoForCausalLM and Olmo2ForCausalLM.

Random small models: grouped-query and not, tied and untied heads, heads wider than
hidden / heads (so OLMo 2's QK-norm, H·Dh wide, is not D wide), Llama 3's scaled rotary,
and OLMo 1's q/k/v clamped tightly enough that most values are cut.
"""

import dataclasses

import pytest
import torch
from hf_families import (
    IDS,
    LLAMA_SHAPED,
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
from glassformer.modules.norms import AllHeadsRMSNorm

transformers = pytest.importorskip("transformers")

LLAMA3 = dict(rope_type="llama3", factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
              original_max_position_embeddings=16, rope_theta=500000.0)  # fmt: skip
OLMO2 = {
    "gqa-untied": dict(num_key_value_heads=2, tie_word_embeddings=False),
    "wide-heads-tied": dict(head_dim=16, tie_word_embeddings=True),
    "llama3-scaling-gqa": dict(num_key_value_heads=1, rope_parameters=LLAMA3),
}
OLMO1 = {
    "clip-untied": dict(clip_qkv=0.3, tie_word_embeddings=False),
    "gqa-tied": dict(num_key_value_heads=2, tie_word_embeddings=True),
}


def _attn_raw(cache, i, ours):
    """The attention's output before OLMo 2's norm: the heads' z through o_proj."""
    return ours.blocks[i].attn.out_proj(cache[f"blocks.{i}.attn.hook_z"].flatten(2))


def _mlp_raw(cache, i, ours):
    """The MLP's output before OLMo 2's norm."""
    return ours.blocks[i].mlp.down_proj(cache[f"blocks.{i}.mlp.hook_post"])


def _olmo2_modules(ours):
    return {
        "model.layers.{i}.self_attn.q_proj": "blocks.{i}.attn.hook_q",
        "model.layers.{i}.self_attn.k_proj": "blocks.{i}.attn.hook_k",
        "model.layers.{i}.self_attn.v_proj": "blocks.{i}.attn.hook_v",
        "model.layers.{i}.self_attn.q_norm": "blocks.{i}.attn.q_norm.hook_normalized",
        "model.layers.{i}.self_attn.k_norm": "blocks.{i}.attn.k_norm.hook_normalized",
        "model.layers.{i}.self_attn": lambda cache, i: _attn_raw(cache, i, ours),
        "model.layers.{i}.post_attention_layernorm": "blocks.{i}.hook_attn_out",
        "model.layers.{i}.mlp": lambda cache, i: _mlp_raw(cache, i, ours),
        "model.layers.{i}.post_feedforward_layernorm": "blocks.{i}.hook_mlp_out",
    }


OLMO1_MODULES = LLAMA_SHAPED  # OLMo 1's modules are Llama's


def _olmo(tmp_path, name):
    version = 2 if name in OLMO2 else 1
    changes = (OLMO2 if version == 2 else OLMO1)[name]
    size = dict(SMALL_DECODER)
    if version == 1:
        size.pop("rms_norm_eps")  # OLMo 1's LayerNorm has a fixed eps
    if "rope_parameters" in changes:
        size["max_position_embeddings"] = 64
    make = transformers.Olmo2Config if version == 2 else transformers.OlmoConfig
    config = make(**size, pad_token_id=None, **changes)
    cls = transformers.Olmo2ForCausalLM if version == 2 else transformers.OlmoForCausalLM
    hf = cls(config).eval()
    randomize(hf)
    return hf, save_and_open(hf, tmp_path / name), tmp_path / name


@pytest.mark.parametrize("name", sorted(OLMO2))
def test_olmo2_every_activation_equals_transformers(tmp_path, name, support):
    hf, ours, _ = _olmo(tmp_path, name)
    modules = _olmo2_modules(ours)
    assert compare_activations(hf, ours, IDS, modules) == 2 + 2 * (2 + len(modules))
    support("OLMo 2", "load", "logits", "every activation")


@pytest.mark.parametrize("name", sorted(OLMO1))
def test_olmo1_every_activation_equals_transformers(tmp_path, name, support):
    hf, ours, _ = _olmo(tmp_path, name)
    assert compare_activations(hf, ours, IDS, OLMO1_MODULES) == 2 + 2 * (2 + len(OLMO1_MODULES))
    support("OLMo", "load", "logits", "every activation")


@pytest.mark.parametrize("name", sorted(OLMO2) + sorted(OLMO1))
def test_greedy_tokens_equal_and_cached_equals_uncached(tmp_path, name, support):
    hf, ours, _ = _olmo(tmp_path, name)
    check_generation(hf, ours, IDS[:, :4])
    support("OLMo 2" if name in OLMO2 else "OLMo", "generate with cache")


@pytest.mark.parametrize(("name", "family"), [("gqa-untied", "OLMo 2"), ("clip-untied", "OLMo")])
def test_int8_int4_and_the_glass_box_tools_run_on_it(tmp_path, name, family, support):
    _, ours, _ = _olmo(tmp_path, name)
    check_precisions_and_tools(ours, (IDS,))
    support(family, "int8/int4", "lens/patching/viewer")


def test_olmo2_norms_follow_the_sublayers_and_span_every_head(tmp_path):
    """No norm before a sub-layer, one after each; QK-norm weights H·Dh and Hkv·Dh wide."""
    _, ours, _ = _olmo(tmp_path, "gqa-untied")
    block = ours.blocks[0]
    assert block.ln1 is None and block.ln2 is None
    assert block.ln1_post is not None and block.ln2_post is not None
    assert isinstance(block.attn.q_norm, AllHeadsRMSNorm)
    assert block.attn.q_norm.weight.shape == (4 * 8,)
    assert block.attn.k_norm.weight.shape == (2 * 8,)
    assert "blocks.0.ln1.hook_normalized" not in ours.hook_names()


def test_olmo2_norm_placement_is_what_makes_it_olmo2(tmp_path):
    """The same weights with the norms before the sub-layers (Gemma's sandwich without
    its outer norms is OLMo 2; Llama's placement is not) move the logits: the placement is
    the family's, not a default."""
    from glassformer.models.families import LlamaConfig

    hf, ours, _ = _olmo(tmp_path, "gqa-untied")
    c = ours.config
    fields = {f.name: getattr(c, f.name) for f in dataclasses.fields(LlamaConfig)}
    llama = GPT(LlamaConfig(**fields)).eval()
    state = ours.state_dict()
    for i in range(c.num_layers):  # OLMo 2's post-norms as Llama's pre-norms
        state[f"blocks.{i}.ln1.weight"] = state.pop(f"blocks.{i}.ln1_post.weight")
        state[f"blocks.{i}.ln2.weight"] = state.pop(f"blocks.{i}.ln2_post.weight")
        del state[f"blocks.{i}.attn.q_norm.weight"], state[f"blocks.{i}.attn.k_norm.weight"]
    llama.load_state_dict(state)
    with torch.no_grad():
        expected = hf(IDS).logits
        assert (llama(IDS).logits - expected).abs().max() > 1e-2
        torch.testing.assert_close(ours(IDS).logits, expected, atol=1e-4, rtol=0)


def test_olmo1_clip_is_applied_and_matters(tmp_path):
    """clip_qkv=0.3 cuts q, k and v (most values here are wider): without the clamp the
    logits move away from transformers'."""
    hf, ours, _ = _olmo(tmp_path, "clip-untied")
    assert all(block.attn.clip == 0.3 for block in ours.blocks)
    _, cache = ours.run_with_cache(IDS)
    q = cache["blocks.0.attn.hook_q"]
    assert q.abs().max() <= 0.3 and (q.abs() == 0.3).float().mean() > 0.2
    unclipped = GPT(dataclasses.replace(ours.config, clip_qkv=None)).eval()
    unclipped.load_state_dict(ours.state_dict())
    with torch.no_grad():
        assert (unclipped(IDS).logits - hf(IDS).logits).abs().max() > 1e-2


def test_olmo1_norms_learn_nothing(tmp_path):
    """OLMo 1's LayerNorms have no weight or bias; the checkpoint has none to give."""
    _, ours, _ = _olmo(tmp_path, "gqa-tied")
    assert not any("ln" in name for name, _ in ours.named_parameters())


@pytest.mark.parametrize("name", ["gqa-untied", "clip-untied"])
def test_an_olmo_saves_and_loads_as_itself(tmp_path, name):
    _, ours, _ = _olmo(tmp_path, name)
    ours.save_pretrained(tmp_path / "saved")
    again = GPT.from_pretrained(tmp_path / "saved")
    assert again.config == ours.config and type(again.config) is type(ours.config)
    with torch.no_grad():
        assert torch.equal(again(IDS).logits, ours(IDS).logits)


@pytest.mark.parametrize(
    "name, changes, message",
    [
        ("gqa-untied", dict(attention_bias=True), "OLMo 2 attention_bias=True"),
        ("gqa-untied", dict(hidden_act="gelu"), "OLMo 2 hidden_act='gelu'"),
        ("gqa-untied", dict(rope_parameters={"rope_type": "su", "rope_theta": 1.0}), "'su'"),
        ("gqa-untied", dict(qk_layernorm_type="per_head"), "qk_layernorm_type"),
        ("clip-untied", dict(clip_qkv=-1.0), "clip_qkv"),
        ("clip-untied", dict(clip_qkv="8"), "clip_qkv"),
    ],
)
def test_what_glassformer_cannot_express_is_one_error(tmp_path, name, changes, message):
    _, _, path = _olmo(tmp_path, name)
    check_refused(path, message, **changes)


def test_fields_transformers_leaves_alone_are_read_and_left(tmp_path):
    """transformers' OLMo reads neither ``mlp_bias`` (its MLP has no bias) nor, in OLMo 1,
    ``rms_norm_eps`` (its LayerNorm's epsilon is 1e-5): a config carrying them gives the
    same logits."""
    for name, changes in (("clip-untied", dict(rms_norm_eps=0.5, mlp_bias=True)),
                          ("gqa-untied", dict(mlp_bias=True))):  # fmt: skip
        hf, _, path = _olmo(tmp_path, name)
        _with_config(path, **changes)
        with torch.no_grad():
            torch.testing.assert_close(
                GPT.from_pretrained(path)(IDS).logits, hf(IDS).logits, atol=1e-4, rtol=0
            )


def test_olmo2_norms_round_in_bf16_as_transformers_does(tmp_path):
    """OLMo 2's RMSNorm applies its weight in float32 and casts once: in bfloat16 every norm
    (the stream's and the all-heads QK-norm) gives transformers' values bit for bit, which
    the cast-then-scale rounding of Llama's norm does not."""
    hf, ours, _ = _olmo(tmp_path, "gqa-untied")
    hf, ours = hf.to(torch.bfloat16), ours.to(torch.bfloat16)
    x = torch.randn(2, 5, 32, generator=torch.Generator().manual_seed(3)).to(torch.bfloat16)
    q = torch.randn(2, 5, 4, 8, generator=torch.Generator().manual_seed(4)).to(torch.bfloat16)
    theirs, mine = hf.model.layers[0], ours.blocks[0]
    with torch.no_grad():
        assert torch.equal(mine.ln1_post(x), theirs.post_attention_layernorm(x))
        assert torch.equal(mine.attn.q_norm(q), theirs.self_attn.q_norm(q.flatten(-2)).view_as(q))
        mine.ln1_post.float_weight = False  # Llama's rounding: cast, then scale
        assert not torch.equal(mine.ln1_post(x), theirs.post_attention_layernorm(x))
