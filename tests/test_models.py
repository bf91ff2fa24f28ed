"""The four models: exact sizes from the source material, overfitting, padding, tying,
attention maps, causality, losses and config checks."""

import pytest
import torch
import torch.nn.functional as F

from glassformer import (
    GPT,
    BertConfig,
    BertEncoder,
    ClassifierConfig,
    EncoderLM,
    EncoderLMConfig,
    GPTConfig,
    Seq2SeqConfig,
    Seq2SeqTransformer,
    TransformerClassifier,
)
from glassformer.models.families import GemmaConfig, T5Config

TOL = dict(atol=1e-5, rtol=1e-5)


def n_params(model):
    return sum(p.numel() for p in model.parameters())


def classifier(**overrides):
    config = dict(vocab_size=30, num_classes=3, max_len=24) | overrides
    return TransformerClassifier(ClassifierConfig.preset("tiny", **config))


def seq2seq(**overrides):
    config = dict(src_vocab_size=30, tgt_vocab_size=30, max_len=24) | overrides
    return Seq2SeqTransformer(Seq2SeqConfig.preset("tiny", **config))


def gpt(**overrides):
    return GPT(
        GPTConfig.preset("tiny", **(dict(vocab_size=30, max_len=24, num_layers=2) | overrides))
    )


def encoder_lm(**overrides):
    return EncoderLM(
        EncoderLMConfig.preset("tiny", **(dict(vocab_size=30, max_len=24) | overrides))
    )


def right_padded(ids, lengths, extra=0):
    """``ids`` (B, T) with row i cut to lengths[i] real tokens, then ``extra`` more pads."""
    out = ids.clone()
    for i, n in enumerate(lengths):
        out[i, n:] = 0
    return torch.cat([out, torch.zeros(len(ids), extra, dtype=torch.long)], dim=1)


# ---- the source material's sizes -------------------------------------------------------


def test_bloem_classifier_has_4_081_930_parameters_and_maps_4x100_to_4x10():
    torch.manual_seed(0)
    model = TransformerClassifier(ClassifierConfig.preset("bloem")).eval()
    assert model.num_parameters() == n_params(model) == 4_081_930
    ids = torch.randint(0, 1000, (4, 100), generator=torch.Generator().manual_seed(0))
    ids[:, 0] = 5  # a row of all pads would be a different test
    logits = model(ids).logits
    assert logits.shape == (4, 10)
    assert logits.isfinite().all()
    # Each row is classified on its own: batching does not mix rows.
    for i in range(4):
        torch.testing.assert_close(logits[i], model(ids[i : i + 1]).logits[0], **TOL)


def test_paper_translator_has_59_508_496_parameters():
    model = Seq2SeqTransformer(Seq2SeqConfig(src_vocab_size=10000, tgt_vocab_size=10000))
    assert model.num_parameters() == n_params(model) == 59_508_496


def test_encoder_lm_has_2_898_960_parameters():
    model = EncoderLM(EncoderLMConfig())
    assert model.num_parameters() == n_params(model) == 2_898_960
    ids = torch.randint(1, 10000, (2, 500), generator=torch.Generator().manual_seed(0))
    logits = model.eval()(ids).logits
    assert logits.shape == (2, 500, 10000)
    torch.testing.assert_close(logits[1:], model(ids[1:]).logits, **TOL)


# ---- every kind learns ------------------------------------------------------------------


def overfit(model, step_loss, steps=300, lr=3e-3):
    """Adam on one fixed batch until the loss is below 0.05 (or ``steps`` run out)."""
    torch.manual_seed(0)
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    model.train()
    for _ in range(steps):
        loss = step_loss(model)
        opt.zero_grad()
        loss.backward()
        opt.step()
        if loss.item() < 0.05:
            break
    model.eval()
    return step_loss(model).item()


def test_classifier_overfits_a_fixed_batch():
    torch.manual_seed(0)
    model = classifier(max_len=12, dropout=0.0)
    ids = torch.randint(1, 30, (8, 12))
    ids[::2, 9:] = 0  # some padding
    labels = torch.tensor([0, 1, 2, 0, 1, 2, 0, 1])
    assert overfit(model, lambda m: m(ids, labels=labels).loss) < 0.05
    assert torch.equal(model(ids).logits.argmax(-1), labels)


def test_seq2seq_overfits_a_fixed_batch_with_teacher_forcing():
    torch.manual_seed(0)
    model = seq2seq(src_vocab_size=20, tgt_vocab_size=20, dropout=0.0, max_len=16)
    src = torch.randint(3, 20, (6, 8))
    labels = torch.randint(3, 20, (6, 7))
    src[0, 5:] = 0
    labels[1, 4] = 2  # eos, then pads that the loss must ignore
    labels[1, 5:] = 0
    tgt_in = torch.cat([torch.ones(6, 1, dtype=torch.long), labels[:, :-1]], dim=1)  # bos first
    assert overfit(model, lambda m: m(src, tgt_in, labels=labels).loss) < 0.05
    predicted = model(src, tgt_in).logits.argmax(-1)
    real = labels != 0
    assert torch.equal(predicted[real], labels[real])


def test_gpt_overfits_a_fixed_batch():
    torch.manual_seed(0)
    model = gpt(vocab_size=20, max_len=16)
    assert model.config.dropout == 0.0
    ids = torch.randint(1, 20, (4, 17))
    assert overfit(model, lambda m: m(ids[:, :-1], labels=ids[:, 1:]).loss) < 0.05
    assert torch.equal(model(ids[:, :-1]).logits.argmax(-1), ids[:, 1:])


def test_encoder_lm_overfits_a_fixed_batch():
    torch.manual_seed(0)
    model = encoder_lm(vocab_size=25, max_len=16, dropout=0.0)
    ids = torch.randint(1, 24, (4, 16))
    labels = torch.full_like(ids, -100)
    labels[:, ::3] = ids[:, ::3]
    masked = ids.masked_fill(labels != -100, 24)  # a [MASK] id
    assert overfit(model, lambda m: m(masked, labels=labels).loss) < 0.05
    scored = labels != -100
    assert torch.equal(model(masked).logits.argmax(-1)[scored], ids[scored])


# ---- padding is invisible ---------------------------------------------------------------


@pytest.mark.parametrize("pooling", ["mean", "max", "cls"])
def test_classifier_ignores_trailing_pads(pooling):
    torch.manual_seed(0)
    model = classifier(num_classes=4, pooling=pooling).eval()
    assert model.config.positional == "learned"
    ids = torch.randint(1, 30, (3, 9))
    # all rows padded by the same amount
    padded = torch.cat([ids, torch.zeros(3, 6, dtype=torch.long)], dim=1)
    torch.testing.assert_close(model(padded).logits, model(ids).logits, **TOL)
    # rows of different lengths in one batch: each as if alone and unpadded
    lengths = [9, 6, 2]
    logits = model(right_padded(ids, lengths, extra=4)).logits
    for i, n in enumerate(lengths):
        torch.testing.assert_close(logits[i], model(ids[i : i + 1, :n]).logits[0], **TOL)


@pytest.mark.parametrize(
    "pooling",
    [
        "mean",
        "max",
    ],
)
def test_classifier_all_padding_row_pools_to_zeros_and_leaves_others_alone(pooling):
    torch.manual_seed(0)
    model = classifier(pooling=pooling).eval()
    ids = torch.tensor([[3, 4, 5, 6, 0], [0, 0, 0, 0, 0]])
    logits = model(ids).logits
    torch.testing.assert_close(logits[0], model(ids[:1, :4]).logits[0], **TOL)
    # nothing to pool: the pooled vector is zero, as attention gives zeros for empty rows
    torch.testing.assert_close(logits[1], model.head.bias, **TOL)


def test_seq2seq_ignores_source_and_target_pads():
    torch.manual_seed(0)
    model = seq2seq(src_vocab_size=20, tgt_vocab_size=20).eval()
    src, tgt = torch.randint(3, 20, (2, 7)), torch.randint(3, 20, (2, 5))
    tgt[:, 0] = 1
    pad = torch.zeros(2, 4, dtype=torch.long)
    reference = model(src, tgt).logits
    torch.testing.assert_close(model(torch.cat([src, pad], 1), tgt).logits, reference, **TOL)
    longer = model(src, torch.cat([tgt, pad], 1)).logits
    torch.testing.assert_close(longer[:, :5], reference, **TOL)


def test_seq2seq_rows_of_different_lengths_decode_as_if_alone():
    torch.manual_seed(0)
    model = seq2seq(src_vocab_size=20, tgt_vocab_size=20).eval()
    src, tgt = torch.randint(3, 20, (3, 8)), torch.randint(3, 20, (3, 6))
    tgt[:, 0] = 1
    src_len, tgt_len = [8, 5, 2], [6, 3, 4]
    logits = model(right_padded(src, src_len, 3), right_padded(tgt, tgt_len, 2)).logits
    for i in range(3):
        alone = model(src[i : i + 1, : src_len[i]], tgt[i : i + 1, : tgt_len[i]]).logits[0]
        torch.testing.assert_close(logits[i, : tgt_len[i]], alone, **TOL)


@pytest.mark.parametrize("make", [gpt, encoder_lm], ids=["gpt", "encoder_lm"])
def test_language_models_ignore_right_padding_on_real_positions(make):
    torch.manual_seed(0)
    model = make().eval()
    ids = torch.randint(1, 30, (3, 10))
    padded = torch.cat([ids, torch.zeros(3, 5, dtype=torch.long)], dim=1)
    torch.testing.assert_close(model(padded).logits[:, :10], model(ids).logits, **TOL)
    lengths = [10, 7, 3]
    logits = model(right_padded(ids, lengths, extra=2)).logits
    for i, n in enumerate(lengths):
        torch.testing.assert_close(logits[i, :n], model(ids[i : i + 1, :n]).logits[0], **TOL)


def test_gpt_is_causal():
    torch.manual_seed(0)
    model = gpt().eval()
    ids = torch.randint(1, 30, (1, 12))
    changed = ids.clone()
    changed[0, 8] = (ids[0, 8] % 29) + 1
    a, b = model(ids).logits, model(changed).logits
    torch.testing.assert_close(a[:, :8], b[:, :8], atol=0, rtol=0)
    assert not torch.allclose(a[:, 8:], b[:, 8:])
    # The same stack of tokens through the bidirectional EncoderLM does see the future.
    lm = encoder_lm().eval()
    assert not torch.allclose(lm(ids).logits[:, :8], lm(changed).logits[:, :8])


def test_inputs_outside_the_model_are_refused_with_the_value():
    model = gpt(max_len=8).eval()
    with pytest.raises(ValueError, match="length 9 .*max_len=8"):
        model(torch.ones(1, 9, dtype=torch.long))
    with pytest.raises(ValueError, match="token id 30 .*vocabulary"):
        model(torch.tensor([[1, 2, 30]]))


# ---- Hugging Face's attention_mask ------------------------------------------------------


def bert(**overrides):
    return BertEncoder(BertConfig.preset("tiny", **(dict(vocab_size=30, max_len=24) | overrides)))


# kind: (model factory, the output to compare)
ONE_STACK = {
    "classifier-mean": (lambda: classifier(pooling="mean"), lambda out: out.logits),
    "classifier-max": (lambda: classifier(pooling="max"), lambda out: out.logits),
    "encoder_lm": (encoder_lm, lambda out: out.logits),
    "gpt": (gpt, lambda out: out.logits),
    "bert": (bert, lambda out: out.hidden),
}


def filler_padded(lengths, width, low=1, high=30):
    """ids (B, width) with no pad id anywhere (rows end in filler tokens) and the
    attention_mask (B, width) that marks each row's first lengths[i] tokens real."""
    ids = torch.randint(low, high, (len(lengths), width))
    return ids, (torch.arange(width) < torch.tensor(lengths)[:, None]).long()


@pytest.mark.parametrize("kind", list(ONE_STACK))
def test_attention_mask_masks_what_the_equivalent_boolean_mask_masks(kind):
    torch.manual_seed(0)
    make, output = ONE_STACK[kind]
    model = make().eval()
    lengths = [9, 6, 2]
    ids, am = filler_padded(lengths, 9)
    expected = output(model(ids, mask=am.bool()[:, None, None, :]))
    for dtype in (torch.long, torch.bool, torch.float32):  # Hugging Face takes all three
        got = output(model(ids, attention_mask=am.to(dtype)))
        torch.testing.assert_close(got, expected, **TOL)
    # The filler is no pad id: only the attention_mask makes each row read as if alone.
    for i, n in enumerate(lengths):
        alone = output(model(ids[i : i + 1, :n]))[0]
        torch.testing.assert_close(got[i] if got.dim() == 2 else got[i, :n], alone, **TOL)
    # And pad ids that the attention_mask marks real are attended, not guessed away.
    ids[:, 1] = 0
    everything = torch.ones_like(ids)
    torch.testing.assert_close(
        output(model(ids, attention_mask=everything)),
        output(model(ids, mask=everything.bool()[:, None, None, :])),
        **TOL,
    )
    assert not torch.allclose(output(model(ids, attention_mask=everything)), output(model(ids)))


def test_seq2seq_attention_masks_mask_source_target_and_cross_attention_keys():
    torch.manual_seed(0)
    model = seq2seq(src_vocab_size=20, tgt_vocab_size=20).eval()
    src_len, tgt_len = [8, 5, 2], [6, 3, 4]
    src, src_am = filler_padded(src_len, 8, low=3, high=20)
    tgt, tgt_am = filler_padded(tgt_len, 6, low=3, high=20)
    tgt[:, 0] = 1
    out = model(src, tgt, attention_mask=src_am, decoder_attention_mask=tgt_am, need_weights=True)
    src_mask, tgt_mask = src_am.bool()[:, None, None, :], tgt_am.bool()[:, None, None, :]
    expected = model(src, tgt, src_mask=src_mask, tgt_mask=tgt_mask).logits
    torch.testing.assert_close(out.logits, expected, **TOL)
    check_maps(out.cross_attentions, 2, (3, 4, 6, 8), src_am.bool())
    for i in range(3):
        alone = model(src[i : i + 1, : src_len[i]], tgt[i : i + 1, : tgt_len[i]]).logits[0]
        torch.testing.assert_close(out.logits[i, : tgt_len[i]], alone, **TOL)


def test_gpt_attention_mask_covers_cached_and_new_tokens():
    torch.manual_seed(0)
    model = gpt().eval()
    ids = torch.randint(1, 30, (2, 7))
    am = torch.tensor([[0, 0, 0, 1, 1, 1, 1], [1, 1, 1, 1, 1, 1, 1]])  # row 0 left-padded
    positions = (am.cumsum(dim=1) - 1).clamp(min=0)
    full = model(ids, attention_mask=am, positions=positions).logits
    alone = model(ids[:1, 3:]).logits[0]
    torch.testing.assert_close(full[0, 3:], alone, **TOL)
    torch.testing.assert_close(full[1], model(ids[1:]).logits[0], **TOL)
    cache = model.new_cache()
    first = model(ids[:, :5], attention_mask=am[:, :5], cache=cache, positions=positions[:, :5])
    rest = model(ids[:, 5:], attention_mask=am, cache=cache, positions=positions[:, 5:])
    torch.testing.assert_close(torch.cat([first.logits, rest.logits], dim=1), full, **TOL)
    with pytest.raises(ValueError, match=r"\(batch, 7 cached \+ 1 new tokens\) \(2, 8\), got"):
        model(ids[:, :1], attention_mask=am, cache=cache)


BAD_ATTENTION_MASKS = [
    (dict(attention_mask=torch.ones(2, 4)), r"attention_mask must have the ids' shape \(2, 5\)"),
    (dict(attention_mask=torch.ones(2, 5, 1)), r"shape \(2, 5\), got \(2, 5, 1\)"),
    (dict(attention_mask=torch.tensor([[1, 1, 2, 0, 0]] * 2)), r"only 1 .* and 0 .*, got 2$"),
    (dict(attention_mask=torch.full((2, 5), 0.5)), r"only 1 .* and 0 .*, got 0\.5$"),
    (dict(attention_mask=torch.ones(2, 5), mask=torch.ones(2, 1, 1, 5).bool()), "not both"),
]


@pytest.mark.parametrize("kind", list(ONE_STACK))
@pytest.mark.parametrize(
    "bad, message", BAD_ATTENTION_MASKS, ids=["short", "3d", "2", "0.5", "both"]
)
def test_bad_attention_masks_are_refused_with_the_value(kind, bad, message):
    model = ONE_STACK[kind][0]().eval()
    with pytest.raises(ValueError, match=message):
        model(torch.ones(2, 5, dtype=torch.long), **bad)


def test_bad_seq2seq_attention_masks_name_the_argument():
    model = seq2seq().eval()
    src, tgt = torch.ones(2, 5, dtype=torch.long), torch.ones(2, 3, dtype=torch.long)
    with pytest.raises(ValueError, match=r"^attention_mask must have the ids' shape \(2, 5\)"):
        model(src, tgt, attention_mask=torch.ones(2, 3))
    with pytest.raises(ValueError, match=r"^decoder_attention_mask must hold only .*, got 2$"):
        model(src, tgt, decoder_attention_mask=torch.tensor([[1, 2, 1]] * 2))
    with pytest.raises(ValueError, match="give src_mask or attention_mask, not both"):
        model(src, tgt, attention_mask=torch.ones(2, 5), src_mask=torch.ones(2, 1, 1, 5).bool())
    with pytest.raises(ValueError, match="give tgt_mask or decoder_attention_mask, not both"):
        model(
            src,
            tgt,
            decoder_attention_mask=torch.ones(2, 3),
            tgt_mask=torch.ones(2, 1, 1, 3).bool(),
        )


# ---- weight tying ------------------------------------------------------------------------


def test_gpt_head_is_tied_to_the_embedding():
    model = gpt(vocab_size=50)
    assert model.config.tie_weights
    assert model.lm_head.weight is model.embed.weight
    untied = gpt(vocab_size=50, tie_weights=False)
    assert untied.lm_head.weight is not untied.embed.weight
    assert untied.num_parameters() == n_params(untied)
    assert untied.num_parameters() - model.num_parameters() == 50 * 128


def test_encoder_lm_head_can_be_tied_to_the_embedding():
    plain, tied = encoder_lm(vocab_size=50), encoder_lm(vocab_size=50, tie_weights=True)
    assert tied.lm_head.weight is tied.embed.weight
    assert plain.num_parameters() - tied.num_parameters() == 50 * 64


def test_seq2seq_sharing_and_tying_remove_exactly_one_matrix_each():
    base = dict(src_vocab_size=40, tgt_vocab_size=40)
    plain = seq2seq(**base)
    shared = seq2seq(**base, share_embeddings=True)
    tied = seq2seq(**base, tie_output=True)
    both = seq2seq(**base, share_embeddings=True, tie_output=True)
    matrix = 40 * 64
    for m in (plain, shared, tied, both):
        assert m.num_parameters() == n_params(m)
    assert plain.num_parameters() - shared.num_parameters() == matrix
    assert plain.num_parameters() - tied.num_parameters() == matrix
    assert shared.num_parameters() - both.num_parameters() == matrix
    assert shared.decoder.embed.weight is shared.encoder.embed.weight
    assert shared.output_proj.weight is not shared.decoder.embed.weight
    assert tied.output_proj.weight is tied.decoder.embed.weight
    assert tied.decoder.embed.weight is not tied.encoder.embed.weight
    assert both.output_proj.weight is both.encoder.embed.weight
    assert both.decoder.embed.weight is both.encoder.embed.weight


def test_a_tied_matrix_gets_the_sum_of_both_gradients():
    torch.manual_seed(0)
    tied = gpt()
    untied = gpt(tie_weights=False)
    state = tied.state_dict()
    state["lm_head.weight"] = state["embed.weight"].clone()
    untied.load_state_dict(state)
    ids = torch.randint(1, 30, (2, 6))
    tied(ids, labels=ids).loss.backward()
    untied(ids, labels=ids).loss.backward()
    expected = untied.lm_head.weight.grad + untied.embed.weight.grad
    torch.testing.assert_close(tied.embed.weight.grad, expected)


# ---- attention maps ----------------------------------------------------------------------


def check_maps(maps, count, shape, key_mask=None):
    """Per-layer maps: ``count`` of them, each ``shape``, rows summing to 1 (0 where no key
    may be attended), zero weight on masked keys (``key_mask`` (B, Tk), True = real)."""
    assert isinstance(maps, tuple) and len(maps) == count
    for w in maps:
        assert w.shape == shape
        sums = w.sum(-1)
        if key_mask is None:
            torch.testing.assert_close(sums, torch.ones_like(sums), **TOL)
            continue
        torch.testing.assert_close(w * ~key_mask[:, None, None, :], torch.zeros_like(w))
        has_key = key_mask.any(-1)[:, None, None].expand_as(sums)
        torch.testing.assert_close(sums, has_key.to(sums.dtype), **TOL)


def test_seq2seq_returns_every_attention_map_and_the_same_logits():
    torch.manual_seed(0)
    model = seq2seq(src_vocab_size=20, tgt_vocab_size=20, num_encoder_layers=3).eval()
    src = torch.tensor([[5, 6, 7, 8, 9], [5, 6, 7, 0, 0]])
    tgt = torch.tensor([[1, 4, 5, 6], [1, 4, 0, 0]])
    out = model(src, tgt, need_weights=True)
    check_maps(out.encoder_attentions, 3, (2, 4, 5, 5), src != 0)
    check_maps(out.decoder_attentions, 2, (2, 4, 4, 4), tgt != 0)
    check_maps(out.cross_attentions, 2, (2, 4, 4, 5), src != 0)
    for w in out.decoder_attentions:
        assert (w.triu(diagonal=1) == 0).all()  # no query sees a later target token
    fast = model(src, tgt)
    torch.testing.assert_close(fast.logits, out.logits, **TOL)
    assert fast.encoder_attentions is fast.decoder_attentions is fast.cross_attentions is None


@pytest.mark.parametrize("kind", ["classifier", "gpt", "encoder_lm"])
def test_single_stack_models_return_their_maps_and_the_same_logits(kind):
    torch.manual_seed(0)
    model = {
        # Bloem's wide heads: every head is d_model wide, no q/k/v bias.
        "classifier": lambda: classifier(num_layers=3, head_dim=64, qkv_bias=False),
        "gpt": lambda: gpt(num_layers=3),
        "encoder_lm": lambda: encoder_lm(num_layers=3),
    }[kind]().eval()
    ids = torch.randint(1, 30, (2, 6))
    ids[1, 4:] = 0
    out = model(ids, need_weights=True)
    if kind == "gpt":
        maps, others = out.decoder_attentions, (out.encoder_attentions, out.cross_attentions)
    else:
        maps, others = out.encoder_attentions, (out.decoder_attentions, out.cross_attentions)
    assert others == (None, None)
    check_maps(maps, 3, (2, 4, 6, 6), ids != 0)
    if kind == "gpt":
        for w in maps:
            assert (w.triu(diagonal=1) == 0).all()
    fast = model(ids)
    torch.testing.assert_close(fast.logits, out.logits, **TOL)
    assert fast.encoder_attentions is fast.decoder_attentions is None


def test_a_row_of_only_pads_gives_zero_maps_and_finite_logits_on_both_paths():
    torch.manual_seed(0)
    model = classifier(num_layers=2).eval()
    ids = torch.tensor([[3, 4, 5, 0], [0, 0, 0, 0]])
    out = model(ids, need_weights=True)
    check_maps(out.encoder_attentions, 2, (2, 4, 4, 4), ids != 0)
    assert (out.encoder_attentions[0][1] == 0).all()
    assert out.logits.isfinite().all()
    torch.testing.assert_close(model(ids).logits, out.logits, **TOL)


# ---- losses ------------------------------------------------------------------------------


def test_seq2seq_loss_ignores_pad_labels():
    torch.manual_seed(0)
    model = seq2seq(src_vocab_size=20, tgt_vocab_size=20).eval()
    src, tgt_in = torch.randint(3, 20, (2, 6)), torch.randint(3, 20, (2, 5))
    labels = torch.randint(3, 20, (2, 5))
    labels[1, 2:] = 0
    out = model(src, tgt_in, labels=labels)
    real = labels != 0
    by_hand = F.cross_entropy(out.logits[real], labels[real])
    torch.testing.assert_close(out.loss, by_hand, **TOL)
    everything = F.cross_entropy(out.logits.flatten(0, 1), labels.flatten())
    assert abs(out.loss.item() - everything.item()) > 1e-3  # the pads did matter


def test_gpt_loss_ignores_pad_labels():
    torch.manual_seed(0)
    model = gpt().eval()
    ids = torch.randint(1, 30, (2, 8))
    labels = torch.randint(1, 30, (2, 8))
    labels[0, 5:] = 0
    out = model(ids, labels=labels)
    real = labels != 0
    torch.testing.assert_close(out.loss, F.cross_entropy(out.logits[real], labels[real]), **TOL)


def test_encoder_lm_loss_scores_only_labelled_positions():
    torch.manual_seed(0)
    model = encoder_lm().eval()
    ids = torch.randint(1, 30, (2, 8))
    labels = torch.full_like(ids, -100)
    labels[:, 1::3] = ids[:, 1::3]
    out = model(ids, labels=labels)
    scored = labels != -100
    by_hand = F.cross_entropy(out.logits[scored], labels[scored])
    torch.testing.assert_close(out.loss, by_hand, **TOL)


def test_classifier_loss_is_cross_entropy_of_its_logits():
    torch.manual_seed(0)
    model = classifier().eval()
    ids, labels = torch.randint(1, 30, (5, 7)), torch.tensor([0, 2, 1, 0, 2])
    out = model(ids, labels=labels)
    torch.testing.assert_close(out.loss, F.cross_entropy(out.logits, labels), **TOL)
    assert model(ids).loss is None


# ---- configs -----------------------------------------------------------------------------

REQUIRED = {
    ClassifierConfig: dict(vocab_size=10, num_classes=2),
    Seq2SeqConfig: dict(src_vocab_size=10, tgt_vocab_size=10),
    GPTConfig: dict(vocab_size=10),
    EncoderLMConfig: dict(vocab_size=10),
}
BAD_FOR_EVERY_CONFIG = [
    (dict(d_model=10, num_heads=3), r"d_model=10 .*num_heads=3"),
    (dict(dropout=-0.1), r"dropout .*-0\.1"),
    (dict(attention_dropout=1.5), r"attention_dropout .*1\.5"),
    (dict(activation="swish"), "activation .*'swish'"),
    (dict(positional="rotary"), "positional .*'rotary'"),
    (dict(num_heads=0), "num_heads .*0"),
    (dict(max_len=-3), "max_len .*-3"),
]


@pytest.mark.parametrize("config_cls", list(REQUIRED), ids=lambda c: c.__name__)
@pytest.mark.parametrize("bad, message", BAD_FOR_EVERY_CONFIG, ids=lambda v: str(v)[:30])
def test_every_config_names_a_bad_common_value(config_cls, bad, message):
    with pytest.raises(ValueError, match=message):
        config_cls(**(REQUIRED[config_cls] | bad))


@pytest.mark.parametrize(
    "make, message",
    [
        (lambda: GPTConfig(vocab_size=0), "vocab_size must be a positive integer, got 0"),
        (lambda: EncoderLMConfig(vocab_size=0), "vocab_size .*got 0"),
        (lambda: ClassifierConfig(vocab_size=0, num_classes=2), "vocab_size .*got 0"),
        (lambda: Seq2SeqConfig(src_vocab_size=0, tgt_vocab_size=10), "src_vocab_size .*got 0"),
        (lambda: ClassifierConfig(vocab_size=10, num_classes=0), "num_classes .*got 0"),
        (lambda: ClassifierConfig(vocab_size=10, num_classes=2, pooling="sum"), "'sum'"),
        (
            lambda: Seq2SeqConfig(src_vocab_size=10, tgt_vocab_size=12, share_embeddings=True),
            "10 and 12",
        ),
        (lambda: Seq2SeqConfig(src_vocab_size=10, tgt_vocab_size=10, eos_id=10), "eos_id=10"),
        (lambda: GPTConfig(vocab_size=10, pad_id=10), "pad_id=10"),
        (
            lambda: GPTConfig(vocab_size=10, d_model=9, num_heads=3, positional="sinusoidal"),
            "even d_model, got 9",
        ),
        (lambda: GPTConfig.preset("huge", vocab_size=10), "'huge'"),
        (lambda: ClassifierConfig.preset("bert", vocab_size=10, num_classes=2), "'bert'"),
        (lambda: Seq2SeqConfig.preset("large", src_vocab_size=9, tgt_vocab_size=9), "'large'"),
        (lambda: EncoderLMConfig.preset("xl"), "'xl'"),
        (lambda: GPTConfig.from_dict({"vocab_size": 10, "n_embd": 4}), "n_embd"),
        # numbers a config file may hold that would take the memory or poison every output
        (
            lambda: GPTConfig(vocab_size=10, num_layers=4_000_000_000),
            "num_layers must be at most 10000",
        ),
        (
            lambda: Seq2SeqConfig(src_vocab_size=9, tgt_vocab_size=9, num_decoder_layers=10**6),
            "num_decoder_layers must be at most 10000, got 1000000",
        ),
        (
            lambda: GPTConfig(vocab_size=10, rope_theta=float("nan")),
            "rope_theta must be a finite number > 0, got nan",
        ),
        (
            lambda: GPTConfig(vocab_size=10, layer_norm_eps=float("inf")),
            "layer_norm_eps .* got inf",
        ),
        (
            lambda: GemmaConfig(
                vocab_size=10,
                d_model=8,
                num_heads=2,
                num_layers=1,
                d_ff=8,
                final_softcap=float("inf"),
            ),  # fmt: skip
            "final_softcap .* got inf",
        ),
        (
            lambda: Seq2SeqConfig(src_vocab_size=9, tgt_vocab_size=9, positional="relative"),
            "positional must be one of .* got 'relative'",  # T5's: a family of its own
        ),
        (
            lambda: Seq2SeqConfig(src_vocab_size=9, tgt_vocab_size=9, eos_id=[1]),
            r"eos_id=\[1\] is outside",
        ),
        (
            lambda: T5Config(
                src_vocab_size=9,
                tgt_vocab_size=9,
                d_model=8,
                num_heads=2,
                num_encoder_layers=1,
                num_decoder_layers=1,
                d_ff=8,
                relative_buckets=0,
            ),  # fmt: skip
            "relative_buckets must be a positive integer, got 0",
        ),
    ],
)
def test_bad_configs_name_the_value(make, message):
    with pytest.raises(ValueError, match=message):
        make()


LONG = "x" * 100_000  # a value a config file may hold, which no message should echo whole


@pytest.mark.parametrize(
    "make, field",
    [
        (lambda: GPTConfig(vocab_size=10, num_layers=LONG), "num_layers"),
        (lambda: GPTConfig(vocab_size=10, num_layers=10**4000), "num_layers"),
        (lambda: GPTConfig(vocab_size=10, layer_norm_eps=LONG), "layer_norm_eps"),
        (lambda: GPTConfig(vocab_size=10, positional=LONG), "positional"),
        (lambda: GPTConfig(vocab_size=10, norm=LONG), "norm"),
        (lambda: GPTConfig(vocab_size=10, attention_window=LONG), "attention_window"),
        (lambda: GPTConfig.from_dict({"vocab_size": 10, LONG: 1}), "no field(s)"),
        (lambda: Seq2SeqConfig(src_vocab_size=9, tgt_vocab_size=9, eos_id=LONG), "eos_id"),
        (lambda: ClassifierConfig(vocab_size=10, num_classes=2, pooling=LONG), "pooling"),
    ],
    ids=lambda v: v if isinstance(v, str) else None,
)
def test_a_long_config_value_is_cut_in_the_one_line(make, field):
    """A 100,000-character string (or an int of 4,000 digits) where a config value belongs
    was echoed whole (models/base.py _check_sizes first): the line names the field and a
    cut value."""
    with pytest.raises(ValueError) as e:
        make()
    message = str(e.value)
    assert "\n" not in message and len(message) < 1000, message[:2000]
    assert field in message and "characters)" in message, message


@pytest.mark.parametrize(
    "config_cls, model_cls, required",
    [
        (ClassifierConfig, TransformerClassifier, dict(vocab_size=50, num_classes=3)),
        (Seq2SeqConfig, Seq2SeqTransformer, dict(src_vocab_size=50, tgt_vocab_size=50)),
        (GPTConfig, GPT, dict(vocab_size=50)),
        (EncoderLMConfig, EncoderLM, dict(vocab_size=50)),
    ],
)
def test_every_preset_builds_and_round_trips_its_config(config_cls, model_cls, required):
    assert "tiny" in config_cls.PRESETS and "base" in config_cls.PRESETS
    for name, values in config_cls.PRESETS.items():
        config = config_cls.preset(name, **required)
        for field, value in (values | required).items():
            assert getattr(config, field) == value, (name, field)
        assert config_cls.from_dict(config.to_dict()) == config
        if name != "base":  # the base models take seconds to build; their configs are checked
            model = model_cls(config)
            assert model.num_parameters() == n_params(model) > 0
            assert model.config is config


def test_modern_gpt_preset_decodes_with_a_cache_like_without():
    torch.manual_seed(0)
    config = GPTConfig.preset("llama-tiny", vocab_size=50, pad_id=None, num_layers=2)
    model = GPT(config).eval()
    names = set(model.state_dict())
    assert "pos_embed.weight" not in names  # rope: no position table
    assert "blocks.0.mlp.gate_proj.weight" in names
    assert model.blocks[0].attn.qkv_proj.weight.shape == ((4 + 2 * 2) * 32, 128)
    ids = torch.randint(0, 50, (2, 9))
    with torch.no_grad():
        whole = model(ids).logits
        cache = model.new_cache()
        steps = [model(ids[:, :5], cache=cache).logits]
        steps += [model(ids[:, t : t + 1], cache=cache).logits for t in range(5, 9)]
    torch.testing.assert_close(torch.cat(steps, 1), whole, atol=1e-5, rtol=0)
    assert GPTConfig.from_dict(config.to_dict()) == config


def test_gpt_config_norm_eps_and_layer_norm_eps_agree():
    assert GPTConfig(vocab_size=10, layer_norm_eps=1e-6).norm_eps == 1e-6
    assert GPTConfig(vocab_size=10, norm_eps=1e-6).layer_norm_eps == 1e-6
    with pytest.raises(ValueError, match="norm must be one of"):
        GPTConfig(vocab_size=10, norm="batch")
    with pytest.raises(ValueError, match="num_kv_heads.*got 4"):
        GPTConfig(vocab_size=10, d_model=48, num_heads=6, num_kv_heads=4)
    with pytest.raises(ValueError, match="positional must be one of"):
        ClassifierConfig(vocab_size=10, num_classes=2, positional="rope")
