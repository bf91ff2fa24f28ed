"""glassformer.inspect: the logit lens ends in the model's own logits, the attribution's
parts add up to the logits, patching restores what it should, ablation equals removing the
head's weights."""

import pytest
import torch

from glassformer import GPT, GPTConfig
from glassformer.inspect import (
    ablate_heads,
    activation_patching,
    direct_logit_attribution,
    logit_difference,
    logit_lens,
)
from glassformer.models.families import GemmaConfig

V = 40


def gpt(modern: bool) -> GPT:
    torch.manual_seed(0)
    if modern:
        return GPT(
            GPTConfig.preset("llama-tiny", vocab_size=V, max_len=32, d_model=32, d_ff=48)
        ).eval()
    config = GPTConfig(vocab_size=V, max_len=32, d_model=32, num_heads=4, num_layers=3,
                       dropout=0.0, pad_id=None)  # fmt: skip
    model = GPT(config).eval()
    with torch.no_grad():  # norms away from 1 and 0, so that their scale and bias count
        for name, p in model.named_parameters():
            if "norm" in name:
                p.add_(0.3 * torch.randn_like(p))
    return model


@pytest.mark.parametrize("modern", [False, True])
def test_the_lens_reads_each_layer_and_ends_in_the_models_logits(modern):
    model = gpt(modern)
    ids = torch.randint(1, V, (1, 8))
    lens = logit_lens(model, ids)
    assert lens.stages[0] == "embeddings" and len(lens.stages) == model.config.num_layers + 1
    torch.testing.assert_close(lens.logits[-1], model(ids).logits[0], atol=1e-5, rtol=0)
    _, cache = model.run_with_cache(ids, names=["blocks.0.hook_resid_post"])
    after_1 = model.lm_head(model.ln_final(cache["blocks.0.hook_resid_post"]))[0]
    torch.testing.assert_close(lens.logits[1], after_1, atol=1e-5, rtol=0)
    top, p = lens.top(3)
    assert top.shape == (model.config.num_layers + 1, 8, 3) and (p[..., 0] >= p[..., 1]).all()


@pytest.mark.parametrize("modern", [False, True])
def test_attribution_parts_add_up_to_the_logits(modern):
    model = gpt(modern)
    ids = torch.randint(1, V, (1, 8))
    for position in (-1, 3):
        parts = direct_logit_attribution(model, ids, position=position)
        total = parts.logits.sum(0)
        torch.testing.assert_close(total, model(ids).logits[0, position], atol=1e-4, rtol=0)
    H, L = model.config.num_heads, model.config.num_layers
    heads = [p for p in parts.parts if p.startswith("L") and "H" in p]
    assert len(heads) == H * L and f"L{L} MLP" in parts.parts
    assert ("final norm bias" in parts.parts) == (not modern)
    shares = parts.of(5)
    assert sum(shares.values()) == pytest.approx(
        float(model(ids).logits[0, 3, 5].detach()), abs=1e-4
    )


def test_the_lens_and_attribution_of_a_gemma_shaped_gpt():
    """Four norms a block (1 + w), a soft cap on the logits: the lens ends in the model's
    (capped) logits; attribution's parts add up to the logits before the cap, each block's
    normalised attention one part."""
    torch.manual_seed(0)
    config = GemmaConfig(
        version=2, vocab_size=V, max_len=32, d_model=128, num_heads=4, num_kv_heads=2,
        head_dim=None, num_layers=4, d_ff=344, final_softcap=2.0, attention_scale=32**-0.5,
    )  # fmt: skip
    model = GPT(config).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "ln" in name or "norm" in name:
                p.normal_(0.0, 0.3)
    ids = torch.randint(1, V, (1, 8))
    lens = logit_lens(model, ids)
    torch.testing.assert_close(lens.logits[-1], model(ids).logits[0], atol=1e-5, rtol=0)
    parts = direct_logit_attribution(model, ids)
    uncapped = model.lm_head(model.run_with_cache(ids)[1]["ln_final.hook_normalized"])[0, -1]
    torch.testing.assert_close(parts.logits.sum(0), uncapped, atol=1e-4, rtol=0)
    assert "L1 attention" in parts.parts and not any("H1" in p for p in parts.parts)


def test_patching_the_clean_stream_back_in_everywhere_restores_the_clean_answer():
    model = gpt(False)
    clean = torch.randint(1, V, (1, 6))
    corrupt = clean.clone()
    corrupt[0, 1] = (clean[0, 1] + 7) % V
    metric = logit_difference(answer_id=3, wrong_id=4)
    clean_value = float(metric(model(clean).logits))
    corrupt_value = float(metric(model(corrupt).logits))
    effect = activation_patching(model, clean, corrupt, metric)  # (layers, positions)
    assert effect.shape == (3, 6)
    # the first layer's input at the changed position is the whole difference...
    assert effect[0, 1] == pytest.approx(clean_value, abs=1e-5)
    # ...and before the last token has read it, an unchanged position carries nothing
    assert effect[0, 0] == pytest.approx(corrupt_value, abs=1e-5)
    # later, the change has spread: no single place of the last layer's input restores it
    assert effect[2, 5] != pytest.approx(clean_value, abs=1e-5)
    assert activation_patching(model, clean, corrupt, metric, what="mlp_out").shape == (3, 6)
    heads = activation_patching(model, clean, corrupt, metric, what="z")
    assert heads.shape == (3, 4)
    same = activation_patching(model, clean, clean, metric)
    torch.testing.assert_close(same, torch.full_like(same, clean_value), atol=1e-5, rtol=0)


@pytest.mark.parametrize("what", ["resid_pre", "z"])
@pytest.mark.parametrize("tokens", [4096, 13])  # one batch; batches of two rows across layers
def test_patching_side_by_side_equals_one_run_per_place(what, tokens, monkeypatch):
    from glassformer.inspect import patching

    monkeypatch.setattr(patching, "PATCH_TOKENS", tokens)
    model = gpt(True)
    clean, corrupt = torch.randint(1, V, (1, 6)), torch.randint(1, V, (1, 6))
    metric = logit_difference(answer_id=3, wrong_id=4)
    effect = activation_patching(model, clean, corrupt, metric, what=what)
    names = patching.per_layer(model, patching.PATCHABLE[what])
    _, cache = model.run_with_cache(clean, names=names)
    for layer, name in enumerate(names):
        for i in range(effect.size(1)):

            def patch(value, _, i=i, name=name):
                value = value.clone()
                index = (slice(None), slice(None), i) if what == "z" else (slice(None), i)
                value[index] = cache[name][index]
                return value

            with torch.no_grad():
                alone = metric(model.run_with_hooks(corrupt, hooks=[(name, patch)]).logits)
            assert effect[layer, i] == pytest.approx(alone, abs=1e-5), (name, i)


def test_ablating_a_head_equals_removing_its_output_weights():
    model = gpt(False)
    ids = torch.randint(1, V, (2, 7))
    ablated = ablate_heads(model, ids, [(1, 2), (2, 0)]).logits
    with torch.no_grad():
        model.blocks[1].attn.out_proj.weight[:, 16:24] = 0
        model.blocks[2].attn.out_proj.weight[:, 0:8] = 0
    torch.testing.assert_close(ablated, model(ids).logits, atol=1e-6, rtol=0)


def test_bad_requests_are_one_line():
    model = gpt(False)
    ids = torch.randint(1, V, (1, 5))
    with pytest.raises(ValueError, match="the same shapes"):
        activation_patching(model, ids, ids[:, :4], logit_difference(1, 2))
    with pytest.raises(ValueError, match="what must be"):
        activation_patching(model, ids, ids, logit_difference(1, 2), what="q")
    with pytest.raises(ValueError, match="layer 7 does not exist"):
        ablate_heads(model, ids, [(7, 0)])
    with pytest.raises(TypeError, match="through a vocabulary or class head"):
        logit_lens(torch.nn.Linear(2, 2), ids)
    with pytest.raises(TypeError, match="through a vocabulary or class head"):
        direct_logit_attribution(torch.nn.Linear(2, 2), ids)


@pytest.mark.parametrize("norm_first", [False, True])
def test_the_lens_reads_a_translators_decoder_and_an_encoder_lm(norm_first):
    """Post-norm streams are read as they are (already normalised), pre-norm ones through
    the stack's final norm; either way the last stage is the model's own logits."""
    from glassformer import EncoderLM, EncoderLMConfig, Seq2SeqConfig, Seq2SeqTransformer

    torch.manual_seed(0)
    shape = dict(d_model=32, num_heads=4, d_ff=64, dropout=0.0, norm_first=norm_first)
    translator = Seq2SeqTransformer(
        Seq2SeqConfig(src_vocab_size=V, tgt_vocab_size=V, max_len=16, num_encoder_layers=2,
                      num_decoder_layers=3, **shape)
    ).eval()  # fmt: skip
    src, tgt = torch.randint(1, V, (1, 7)), torch.randint(1, V, (1, 5))
    lens = logit_lens(translator, src, tgt)
    assert len(lens.stages) == 4
    torch.testing.assert_close(lens.logits[-1], translator(src, tgt).logits[0], atol=1e-5, rtol=0)
    encoder_lm = EncoderLM(EncoderLMConfig(vocab_size=V, max_len=16, num_layers=2, **shape)).eval()
    ids = torch.randint(1, V, (1, 6))
    lens = logit_lens(encoder_lm, ids)
    torch.testing.assert_close(lens.logits[-1], encoder_lm(ids).logits[0], atol=1e-5, rtol=0)


def test_attribution_splits_a_translators_decoder_cross_attention_heads_included():
    """A pre-norm translator's decoder stream holds its cross-attention's outputs too, and its
    head has a bias: every part, each cross-attention head among them, adds up to the logits."""
    from glassformer import Seq2SeqConfig, Seq2SeqTransformer

    torch.manual_seed(0)
    model = Seq2SeqTransformer(
        Seq2SeqConfig(src_vocab_size=V, tgt_vocab_size=V, max_len=16, d_model=32, num_heads=4,
                      num_encoder_layers=1, num_decoder_layers=2, d_ff=64, dropout=0.0,
                      norm_first=True)
    ).eval()  # fmt: skip
    src, tgt = torch.randint(3, V, (1, 7)), torch.randint(3, V, (1, 5))
    parts = direct_logit_attribution(model, src, tgt, position=2)
    torch.testing.assert_close(parts.logits.sum(0), model(src, tgt).logits[0, 2], atol=1e-4, rtol=0)
    assert {"L2 crossH4", "L1 cross attention bias", "head bias"} <= set(parts.parts)
    post_norm = Seq2SeqTransformer(Seq2SeqConfig(src_vocab_size=V, tgt_vocab_size=V, d_model=32,
                                                 num_heads=4, d_ff=64))  # fmt: skip
    with pytest.raises(ValueError, match="needs pre-norm blocks"):
        direct_logit_attribution(post_norm, src, tgt)
