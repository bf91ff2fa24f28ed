"""Hugging Face T5 directories read into Seq2SeqTransformer: the encoder's and decoder's
states, every self- and cross-attention pattern and the logits equal to transformers'
T5ForConditionalGeneration, and the same greedy outputs.

Random small models: T5's ReLU MLP with a tied, scaled head; v1.1/Flan-T5's gated GELU with
an untied head and heads 48 wide in all against a 32-wide model; inputs longer than the
largest bucket distance (the log buckets and their clamp); every parameter at random.
"""

import pytest
import torch
from hf_families import (
    check_precisions_and_tools,
    check_refused,
    randomize,
    save_and_open,
    with_config,
)

from glassformer import Seq2SeqTransformer
from glassformer.modules.relative import relative_bucket

transformers = pytest.importorskip("transformers")

VOCAB = 97
CASES = {
    "t5-relu-tied": dict(feed_forward_proj="relu", num_heads=4, d_kv=8),
    "flan-gated-untied-wide-heads": dict(
        feed_forward_proj="gated-gelu", num_heads=6, d_kv=8, tie_word_embeddings=False
    ),
}
torch.manual_seed(0)
SRC = torch.randint(2, VOCAB, (2, 22))
SRC[1, 17:] = 0  # padding
MASK = (SRC != 0).long()
TGT = torch.cat([torch.zeros(2, 1, dtype=torch.long), torch.randint(2, VOCAB, (2, 19))], 1)


def _t5(tmp_path, name):
    config = transformers.T5Config(
        vocab_size=VOCAB, d_model=32, d_ff=64, num_layers=2, num_decoder_layers=2,
        relative_attention_num_buckets=8, relative_attention_max_distance=16, dropout_rate=0.0,
        pad_token_id=0, eos_token_id=1, decoder_start_token_id=0, attn_implementation="eager",
        **CASES[name],
    )  # fmt: skip
    hf = transformers.T5ForConditionalGeneration(config).eval()
    randomize(hf)
    path = tmp_path / name
    if CASES[name].get("tie_word_embeddings") is False:
        hf = _untied(hf, path)
    return hf, save_and_open(hf, path, Seq2SeqTransformer), path


def _untied(hf, path):
    """A T5 whose head is its own, as v1.1 and Flan-T5 files hold it: transformers 5 ties
    every T5 it builds, so the head is written into the saved file and read back."""
    from safetensors.torch import load_file, save_file

    hf.save_pretrained(path)
    tensors = load_file(path / "model.safetensors")
    tensors["lm_head.weight"] = 0.1 * torch.randn_like(tensors["shared.weight"])
    save_file(tensors, path / "model.safetensors", metadata={"format": "pt"})
    with_config(path, tie_word_embeddings=False)
    hf = transformers.T5ForConditionalGeneration.from_pretrained(path, attn_implementation="eager")
    assert not torch.equal(hf.lm_head.weight, hf.shared.weight)
    return hf.eval()


def test_the_buckets_equal_t5s():
    from transformers.models.t5.modeling_t5 import T5Attention

    distance = torch.arange(-40, 41)[None, :]
    for bidirectional in (True, False):
        theirs = T5Attention._relative_position_bucket(
            distance, bidirectional=bidirectional, num_buckets=32, max_distance=128
        )
        mine = relative_bucket(distance, bidirectional=bidirectional, num_buckets=32,
                               max_distance=128)  # fmt: skip
        assert torch.equal(mine, theirs)


@pytest.mark.parametrize("name", sorted(CASES))
def test_every_state_and_attention_equals_t5(tmp_path, name, support):
    hf, ours, _ = _t5(tmp_path, name)
    with torch.no_grad():
        out = hf(SRC, attention_mask=MASK, decoder_input_ids=TGT, output_hidden_states=True,
                 output_attentions=True)  # fmt: skip
    mine, cache = ours.run_with_cache(SRC, TGT, attention_mask=MASK)
    real = MASK.bool()
    assert out.logits.abs().max() > 0.2  # (a tied head reads the states × d^-½)
    torch.testing.assert_close(mine.logits, out.logits, atol=1e-4, rtol=0)
    for side, hidden in (
        ("encoder", out.encoder_hidden_states),
        ("decoder", out.decoder_hidden_states),
    ):
        for i in range(2):  # the stream before each block; the last, after the final norm
            got, expected = cache[f"{side}.blocks.{i}.hook_resid_pre"], hidden[i]
            if side == "encoder":
                got, expected = got[real], expected[real]
            torch.testing.assert_close(got, expected, atol=1e-4, rtol=0, msg=f"{side} {i}")
        final = cache[f"{side}.ln_final.hook_normalized"]
        if side == "encoder":
            final, last = final[real], hidden[2][real]
        else:
            last = hidden[2]
        torch.testing.assert_close(final, last, atol=1e-4, rtol=0)
    names = ("encoder.blocks.{}.attn", "decoder.blocks.{}.attn", "decoder.blocks.{}.cross_attn")
    theirs = (out.encoder_attentions, out.decoder_attentions, out.cross_attentions)
    for i in range(2):
        for name, expected in zip(names, theirs, strict=True):
            got = cache[name.format(i) + ".hook_pattern"]
            rows = real[:, None, :, None] if name.startswith("encoder") else True
            torch.testing.assert_close(got * rows, expected[i] * rows, atol=1e-4, rtol=0)
    support("T5", "load", "logits", "every activation")


@pytest.mark.parametrize("name", sorted(CASES))
def test_greedy_outputs_equal_t5_cached_and_not(tmp_path, name, support):
    hf, ours, _ = _t5(tmp_path, name)
    expected = hf.generate(SRC, attention_mask=MASK, max_new_tokens=20, num_beams=1,
                           do_sample=False, bad_words_ids=[[0]])  # fmt: skip
    src_mask = MASK.bool()[:, None, None, :]
    assert expected.size(1) > 5
    for use_cache in (True, False):
        got = ours.generate(SRC, 20, src_mask=src_mask, use_cache=use_cache)
        assert torch.equal(got[:, : expected.size(1)], expected)
    support("T5", "generate with cache")


def test_int8_int4_and_the_glass_box_tools_run_on_it(tmp_path, support):
    _, ours, _ = _t5(tmp_path, "flan-gated-untied-wide-heads")
    check_precisions_and_tools(ours, (SRC, TGT))
    support("T5", "int8/int4", "lens/patching/viewer")


def test_the_parts_follow_the_config(tmp_path):
    _, ours, _ = _t5(tmp_path, "flan-gated-untied-wide-heads")
    c = ours.config
    assert c.family == "t5" and c.head_dim == 8 and c.num_heads == 6
    assert c.activation == "geglu_tanh" and not c.tie_output and not c.scale_output
    assert ours.encoder.relative_bias.bidirectional and not ours.decoder.relative_bias.bidirectional
    _, tied, _ = _t5(tmp_path, "t5-relu-tied")
    assert tied.config.scale_output and tied.config.tie_output


@pytest.mark.parametrize(
    "changes, message",
    [
        (dict(feed_forward_proj="gated-silu"), "T5 feed_forward_proj='gated-silu'"),
        (dict(is_encoder_decoder=False), "is_encoder_decoder=False"),
    ],
)
def test_what_glassformer_cannot_express_is_one_error(tmp_path, changes, message):
    _, _, path = _t5(tmp_path, "t5-relu-tied")
    check_refused(path, message, Seq2SeqTransformer, **changes)
