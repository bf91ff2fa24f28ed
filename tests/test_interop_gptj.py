"""Hugging Face GPT-J directories read into GPT: every activation equal to transformers'
GPTJForCausalLM.

Random small models: rotary on part of each head and on all of it, neighbouring features
paired (GPT-J's layout, not Llama's), tied and untied heads, a wider MLP.
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
from hf_families import with_config as _with_config

from glassformer import GPT
from glassformer.modules.rotary import RotaryEmbedding

transformers = pytest.importorskip("transformers")

CASES = {  # hidden 32 over 4 heads: 8 features a head
    "rotary-4-of-8-untied": dict(rotary_dim=4),
    "rotary-whole-head-tied": dict(rotary_dim=8, tie_word_embeddings=True),
    "rotary-2-wide-mlp": dict(rotary_dim=2, n_inner=80),
}
MODULES = {
    "transformer.h.{i}.ln_1": "blocks.{i}.ln1.hook_normalized",
    "transformer.h.{i}.attn.q_proj": "blocks.{i}.attn.hook_q",
    "transformer.h.{i}.attn.k_proj": "blocks.{i}.attn.hook_k",
    "transformer.h.{i}.attn.v_proj": "blocks.{i}.attn.hook_v",
    "transformer.h.{i}.attn": "blocks.{i}.hook_attn_out",
    "transformer.h.{i}.mlp.fc_in": "blocks.{i}.mlp.hook_pre",
    "transformer.h.{i}.mlp": "blocks.{i}.hook_mlp_out",
}


def _gptj(tmp_path, name):
    config = transformers.GPTJConfig(
        vocab_size=VOCAB, n_positions=64, n_embd=32, n_layer=2, n_head=4,
        attn_implementation="eager", bos_token_id=None, eos_token_id=None,
        **{"tie_word_embeddings": False, **CASES[name]},
    )  # fmt: skip
    hf = transformers.GPTJForCausalLM(config).eval()
    randomize(hf)
    return hf, save_and_open(hf, tmp_path / name), tmp_path / name


@pytest.mark.parametrize("name", sorted(CASES))
def test_every_activation_equals_transformers(tmp_path, name, support):
    hf, ours, _ = _gptj(tmp_path, name)
    assert compare_activations(hf, ours, IDS, MODULES) == 2 + 2 * (2 + len(MODULES))
    support("GPT-J", "load", "logits", "every activation")


@pytest.mark.parametrize("name", sorted(CASES))
def test_greedy_tokens_equal_and_cached_equals_uncached(tmp_path, name, support):
    hf, ours, _ = _gptj(tmp_path, name)
    check_generation(hf, ours, IDS[:, :4])
    support("GPT-J", "generate with cache")


def test_int8_int4_and_the_glass_box_tools_run_on_it(tmp_path, support):
    _, ours, _ = _gptj(tmp_path, "rotary-4-of-8-untied")
    check_precisions_and_tools(ours, (IDS,))
    support("GPT-J", "int8/int4", "lens/patching/viewer")


def test_the_parts_follow_the_config(tmp_path):
    """4 of each head's 8 features turned, in neighbouring pairs; one norm; head bias."""
    _, ours, _ = _gptj(tmp_path, "rotary-4-of-8-untied")
    assert ours.config.rotary_dim == 4 and ours.rotary.head_dim == 4 and ours.rotary.interleaved
    block = ours.blocks[0]
    assert block.parallel and block.ln2 is None and block.attn.qkv_proj.bias is None
    assert ours.lm_head.bias is not None and block.mlp.linear1.bias is not None


def test_neighbouring_pairs_are_what_makes_it_gptj(tmp_path):
    """Turned as Llama pairs features (i with i + Dh/2), the same weights give other logits:
    the pairing is the family's."""
    hf, ours, _ = _gptj(tmp_path, "rotary-whole-head-tied")
    with torch.no_grad():
        expected = hf(IDS).logits
        torch.testing.assert_close(ours(IDS).logits, expected, atol=1e-4, rtol=0)
        ours.rotary = RotaryEmbedding(8)  # rotate_half's pairing
        assert (ours(IDS).logits - expected).abs().max() > 1e-2


def test_interleaved_rotation_keeps_relative_positions():
    """Neighbouring pairs are still a rotation: q·k depends on the distance only."""
    rotary = RotaryEmbedding(8, interleaved=True)
    q, k = torch.randn(1, 1, 1, 8), torch.randn(1, 1, 1, 8)

    def score(i, j):
        return float((rotary(q, torch.tensor([i])) * rotary(k, torch.tensor([j]))).sum())

    assert score(3, 1) == pytest.approx(score(7, 5), abs=1e-5)
    assert score(3, 1) != pytest.approx(score(3, 2), abs=1e-3)


@pytest.mark.parametrize(
    "changes, message",
    [
        (dict(activation_function="swish"), "GPT-J activation_function='swish'"),
        (dict(rotary_dim=3), "rotary_dim must be an even number"),
        (dict(rotary_dim=None), "GPT-J rotary_dim=None"),
        (dict(rotary_dim=16), "rotary_dim must be an even number in 2..8"),
        (dict(rope_scaling={"rope_type": "linear", "factor": 2.0}), "rope_scaling"),
    ],
)
def test_what_glassformer_cannot_express_is_one_error(tmp_path, changes, message):
    _, _, path = _gptj(tmp_path, "rotary-4-of-8-untied")
    check_refused(path, message, **changes)


def test_gpt_j_6b_config_json_as_released_reads(tmp_path):
    """GPT-J-6B's config.json carries fields transformers 5 no longer writes (``rotary``,
    ``scale_attn_weights``, the summary head's): they are read, to the same logits."""
    hf, _, path = _gptj(tmp_path, "rotary-4-of-8-untied")
    _with_config(path, rotary=True, scale_attn_weights=True, summary_type="cls_index",
                 summary_use_proj=True, summary_activation=None, summary_proj_to_labels=True,
                 summary_first_dropout=0.1, gradient_checkpointing=False)  # fmt: skip
    with torch.no_grad():
        torch.testing.assert_close(
            GPT.from_pretrained(path)(IDS).logits, hf(IDS).logits, atol=1e-4, rtol=0
        )
