"""Hugging Face GPT-Neo directories (EleutherAI's GPT-Neo, the TinyStories models) read into
GPT: every activation equal to transformers' GPTNeoForCausalLM.

Random small models with global and local layers in turn (windows shorter than the input),
the scores unscaled, tied and untied heads, every parameter drawn at random.
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

transformers = pytest.importorskip("transformers")

CASES = {  # IDS are 10 tokens: every window here is shorter
    "global-local-window4": dict(attention_types=[[["global", "local"], 2]], window_size=4),
    "local-first-window2-untied": dict(
        attention_types=[[["local", "global"], 1], [["local"], 2]],
        window_size=2,
        tie_word_embeddings=False,
    ),  # fmt: skip
    "all-global-wide-mlp": dict(attention_types=[[["global"], 4]], intermediate_size=80),
}
MODULES = {
    "transformer.h.{i}.ln_1": "blocks.{i}.ln1.hook_normalized",
    "transformer.h.{i}.attn.attention.q_proj": "blocks.{i}.attn.hook_q",
    "transformer.h.{i}.attn.attention.k_proj": "blocks.{i}.attn.hook_k",
    "transformer.h.{i}.attn.attention.v_proj": "blocks.{i}.attn.hook_v",
    "transformer.h.{i}.attn": "blocks.{i}.hook_attn_out",
    "transformer.h.{i}.ln_2": "blocks.{i}.ln2.hook_normalized",
    "transformer.h.{i}.mlp.c_fc": "blocks.{i}.mlp.hook_pre",
    "transformer.h.{i}.mlp": "blocks.{i}.hook_mlp_out",
}


def _neo(tmp_path, name):
    config = transformers.GPTNeoConfig(
        vocab_size=VOCAB, hidden_size=32, num_layers=4, num_heads=4, max_position_embeddings=64,
        attn_implementation="eager", bos_token_id=None, eos_token_id=None, **CASES[name],
    )  # fmt: skip
    hf = transformers.GPTNeoForCausalLM(config).eval()
    randomize(hf)
    return hf, save_and_open(hf, tmp_path / name), tmp_path / name


@pytest.mark.parametrize("name", sorted(CASES))
def test_every_activation_equals_transformers(tmp_path, name, support):
    hf, ours, _ = _neo(tmp_path, name)
    assert compare_activations(hf, ours, IDS, MODULES) == 2 + 4 * (2 + len(MODULES))
    support("GPT-Neo", "load", "logits", "every activation")


@pytest.mark.parametrize("name", sorted(CASES))
def test_greedy_tokens_equal_and_cached_equals_uncached(tmp_path, name, support):
    hf, ours, _ = _neo(tmp_path, name)
    check_generation(hf, ours, IDS[:, :4])
    support("GPT-Neo", "generate with cache")


def test_int8_int4_and_the_glass_box_tools_run_on_it(tmp_path, support):
    _, ours, _ = _neo(tmp_path, "global-local-window4")
    check_precisions_and_tools(ours, (IDS,))
    support("GPT-Neo", "int8/int4", "lens/patching/viewer")


def test_the_parts_follow_the_config(tmp_path):
    """Layers 1 and 3 slide (window 4: the query and 3 keys before it), the scores are
    unscaled, and q, k, v have no bias."""
    _, ours, _ = _neo(tmp_path, "global-local-window4")
    c = ours.config
    assert c.local_layers == (1, 3) and c.attention_window == 3
    windows = [block.attn.window for block in ours.blocks]
    assert windows == [None, (3, 0), None, (3, 0)]
    assert all(b.attn.scale == 1.0 and b.attn.qkv_proj.bias is None for b in ours.blocks)


def test_unscaled_scores_are_what_makes_it_gpt_neo(tmp_path):
    """With the usual 1/√Dh the logits move away from transformers': the scale is the
    family's, not a default."""
    import dataclasses

    hf, ours, _ = _neo(tmp_path, "all-global-wide-mlp")
    scaled = GPT(dataclasses.replace(ours.config)).eval()
    scaled.load_state_dict(ours.state_dict())
    for block in scaled.blocks:
        block.attn.scores = type(block.attn.scores)(None)  # the paper's 1/√Dh
    with torch.no_grad():
        expected = hf(IDS).logits
        assert (scaled(IDS).logits - expected).abs().max() > 1e-2
        torch.testing.assert_close(ours(IDS).logits, expected, atol=1e-4, rtol=0)


@pytest.mark.parametrize(
    "changes, message",
    [
        (dict(activation_function="relu"), "GPT-Neo activation_function='relu'"),
        (dict(attention_types=[[["global", "sparse"], 2]]), "attention_types"),
        (dict(attention_types=[[["global"], 3]]), "4 global or local"),
        (dict(attention_layers=["global"] * 4), "attention_layers"),
        (dict(window_size=1), "GPT-Neo sliding_window=1"),
        (dict(attention_types="global"), "attention_types"),
        (dict(attention_types=[[["local"] * 100000, 4]]), r"characters\) is not supported"),
    ],
)
def test_what_glassformer_cannot_express_is_one_error(tmp_path, changes, message):
    _, _, path = _neo(tmp_path, "global-local-window4")
    check_refused(path, message, **changes)


def test_a_config_written_by_transformers_4_with_its_summary_fields_loads(tmp_path):
    """Released GPT-Neo and TinyStories config.json files carry a sequence-summary head's
    fields (``summary_type``, ...), which transformers 5 no longer writes."""
    hf, _, path = _neo(tmp_path, "global-local-window4")
    _with_config(path, summary_type="cls_index", summary_use_proj=True,
                 summary_activation=None, summary_proj_to_labels=True,
                 summary_first_dropout=0.1)  # fmt: skip
    with torch.no_grad():
        torch.testing.assert_close(
            GPT.from_pretrained(path)(IDS).logits, hf(IDS).logits, atol=1e-4, rtol=0
        )
