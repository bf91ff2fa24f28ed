"""Hugging Face MarianMT directories (Helsinki-NLP's opus-mt translators) read into
Seq2SeqTransformer: the encoder's and decoder's states, every layer's self- and
cross-attention, and the logits equal to transformers' MarianMTModel.

Random small translators: shared and separate vocabularies, SiLU and GELU, scaled and
unscaled embeddings; every parameter drawn at random, ``final_logits_bias`` included.
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
from glassformer.checkpoint import CheckpointError

transformers = pytest.importorskip("transformers")

VOCAB, PAD = 61, 60
CASES = {
    "shared-swish-scaled": dict(activation_function="swish", scale_embedding=True),
    "separate-gelu-untied": dict(
        activation_function="gelu",
        share_encoder_decoder_embeddings=False,
        decoder_vocab_size=63,
        tie_word_embeddings=False,
        scale_embedding=False,
    ),  # fmt: skip
}
SRC = torch.tensor([[5, 17, 3, 50, 42, 9, 0], [7, 7, 30, 2, 0, PAD, PAD]])
TGT = torch.tensor([[PAD, 4, 12, 33, 8], [PAD, 9, 9, 1, 40]])
MASK = (SRC != PAD).long()


def _marian(tmp_path, name):
    torch.manual_seed(2)  # one random model whatever ran before: its greedy run is > 4 long
    config = transformers.MarianConfig(
        vocab_size=VOCAB, d_model=32, encoder_layers=2, decoder_layers=2,
        encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=64,
        decoder_ffn_dim=64, max_position_embeddings=64, pad_token_id=PAD,
        decoder_start_token_id=PAD, eos_token_id=0, forced_eos_token_id=None, dropout=0.0,
        attn_implementation="eager", **CASES[name],
    )  # fmt: skip
    hf = transformers.MarianMTModel(config).eval()
    randomize(hf, keep=("embed_positions",))  # Marian's sinusoids: computed, never saved
    with torch.no_grad():
        hf.final_logits_bias.normal_(0.0, 0.5)
    return hf, save_and_open(hf, tmp_path / name, Seq2SeqTransformer), tmp_path / name


@pytest.mark.parametrize("name", sorted(CASES))
def test_every_state_and_attention_equals_marian(tmp_path, name, support):
    hf, ours, _ = _marian(tmp_path, name)
    tgt = TGT.clamp(max=ours.config.tgt_vocab_size - 1)
    with torch.no_grad():
        out = hf(SRC, attention_mask=MASK, decoder_input_ids=tgt, output_hidden_states=True,
                 output_attentions=True)  # fmt: skip
    mine, cache = ours.run_with_cache(SRC, tgt, attention_mask=MASK)
    real = MASK.bool()
    torch.testing.assert_close(mine.logits, out.logits, atol=1e-4, rtol=0)
    for side, hidden in (
        ("encoder", out.encoder_hidden_states),
        ("decoder", out.decoder_hidden_states),
    ):
        for i in range(2):
            got = cache[f"{side}.blocks.{i}.hook_resid_post"]
            expected = hidden[i + 1]
            if side == "encoder":  # padded source positions are never read
                got, expected = got[real], expected[real]
            torch.testing.assert_close(got, expected, atol=1e-4, rtol=0, msg=f"{side} {i}")
    for i in range(2):
        names = ("encoder.blocks.{}.attn", "decoder.blocks.{}.attn", "decoder.blocks.{}.cross_attn")
        theirs = (out.encoder_attentions, out.decoder_attentions, out.cross_attentions)
        for name, expected in zip(names, theirs, strict=True):
            got = cache[name.format(i) + ".hook_pattern"]
            rows = real[:, None, :, None] if name.startswith("encoder") else True  # real queries
            torch.testing.assert_close(got * rows, expected[i] * rows, atol=1e-4, rtol=0)
    support("MarianMT", "load", "logits", "every activation")


@pytest.mark.parametrize("name", sorted(CASES))
def test_greedy_translations_equal_marian(tmp_path, name, support):
    """As opus-mt's generation config does, transformers is told never to choose the pad
    id (glassformer's translator never chooses its pad or start token)."""
    hf, ours, _ = _marian(tmp_path, name)
    expected = hf.generate(SRC, attention_mask=MASK, max_new_tokens=12, num_beams=1,
                           do_sample=False, bad_words_ids=[[PAD]])  # fmt: skip
    src_mask = MASK.bool()[:, None, None, :]
    assert expected.size(1) > 4  # not stopped at once
    for use_cache in (True, False):
        got = ours.generate(SRC, 12, src_mask=src_mask, use_cache=use_cache)
        assert torch.equal(got[:, : expected.size(1)], expected)
    support("MarianMT", "generate with cache")


def test_int8_int4_and_the_glass_box_tools_run_on_it(tmp_path, support):
    _, ours, _ = _marian(tmp_path, "shared-swish-scaled")
    check_precisions_and_tools(ours, (SRC, TGT))
    support("MarianMT", "int8/int4", "lens/patching/viewer")


def test_the_parts_follow_the_config(tmp_path):
    _, ours, _ = _marian(tmp_path, "shared-swish-scaled")
    c = ours.config
    assert c.family == "marian" and c.activation == "silu" and ours.encoder.ln_final is None
    assert not ours.encoder.blocks[0].norm_first  # the paper's post-norm
    assert c.bos_id == c.pad_id == PAD and c.scale_embeddings
    assert ours.decoder.embed.weight.data_ptr() == ours.encoder.embed.weight.data_ptr()


@pytest.mark.parametrize(
    "changes, message",
    [
        (dict(activation_function="tanh"), "Marian activation_function='tanh'"),
        (dict(decoder_ffn_dim=32), "different heads or widths"),
    ],
)
def test_what_glassformer_cannot_express_is_one_error(tmp_path, changes, message):
    _, _, path = _marian(tmp_path, "shared-swish-scaled")
    check_refused(path, message, Seq2SeqTransformer, **changes)


def test_a_position_table_larger_than_the_weights_is_refused_before_it_is_computed(
    tmp_path, monkeypatch
):
    """Marian's sinusoids are computed from the config, not stored: max_position_embeddings
    2^20 makes a table of 2^20 × d_model (it was computed, in float64: at the limit of 2^26
    positions, 8 GB a table). Refused where it is larger than the weights and the allowance
    (here 1 MB, to keep the test small)."""
    from glassformer.interop import _hf

    _, _, path = _marian(tmp_path, "shared-swish-scaled")
    with_config(path, max_position_embeddings=2**20)
    monkeypatch.setattr(_hf, "TABLE_BYTES", 1 << 20)
    with pytest.raises(CheckpointError, match=r"the config makes .*pe of shape \(1048576, 32\)"):
        Seq2SeqTransformer.from_pretrained(path)
