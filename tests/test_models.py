"""The four models: exact sizes from the source material, overfitting, padding, tying,
attention maps, causality and config checks."""

import pytest
import torch
import torch.nn.functional as F

from glassformer import (
    GPT,
    ClassifierConfig,
    EncoderLM,
    EncoderLMConfig,
    GPTConfig,
    Seq2SeqConfig,
    Seq2SeqTransformer,
    TransformerClassifier,
)

TOL = dict(atol=1e-5, rtol=1e-5)


def n_params(model):
    return sum(p.numel() for p in model.parameters())


# ---- the source material's sizes -------------------------------------------------------


def test_bloem_classifier_has_4_081_930_parameters_and_maps_4x100_to_4x10():
    model = TransformerClassifier(ClassifierConfig.preset("bloem"))
    assert model.num_parameters() == n_params(model) == 4_081_930
    ids = torch.randint(0, 1000, (4, 100), generator=torch.Generator().manual_seed(0))
    assert model.eval()(ids).logits.shape == (4, 10)


def test_paper_translator_has_59_508_496_parameters():
    model = Seq2SeqTransformer(Seq2SeqConfig(src_vocab_size=10000, tgt_vocab_size=10000))
    assert model.num_parameters() == n_params(model) == 59_508_496


def test_encoder_lm_has_2_898_960_parameters():
    model = EncoderLM(EncoderLMConfig())
    assert model.num_parameters() == n_params(model) == 2_898_960
    assert model.eval()(torch.randint(1, 10000, (2, 500))).logits.shape == (2, 500, 10000)


# ---- every kind learns ------------------------------------------------------------------


def overfit(model, step_loss, steps=300, lr=3e-3):
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
    return loss.item()


def test_classifier_overfits_a_fixed_batch():
    torch.manual_seed(0)
    model = TransformerClassifier(
        ClassifierConfig.preset("tiny", vocab_size=30, num_classes=3, max_len=12, dropout=0.0)
    )
    ids = torch.randint(1, 30, (8, 12))
    ids[::2, 9:] = 0  # some padding
    labels = torch.tensor([0, 1, 2, 0, 1, 2, 0, 1])
    assert overfit(model, lambda m: m(ids, labels=labels).loss) < 0.05


def test_seq2seq_overfits_a_fixed_batch_with_teacher_forcing():
    torch.manual_seed(0)
    model = Seq2SeqTransformer(
        Seq2SeqConfig.preset("tiny", src_vocab_size=20, tgt_vocab_size=20, dropout=0.0, max_len=16)
    )
    src = torch.randint(3, 20, (6, 8))
    tgt = torch.randint(3, 20, (6, 7))
    src[0, 5:] = tgt[1, 4:] = 0
    tgt_in = torch.cat([torch.ones(6, 1, dtype=torch.long), tgt[:, :-1]], dim=1)
    assert overfit(model, lambda m: m(src, tgt_in, labels=tgt).loss) < 0.05


def test_gpt_overfits_a_fixed_batch():
    torch.manual_seed(0)
    model = GPT(GPTConfig.preset("tiny", vocab_size=20, max_len=16, num_layers=2))
    ids = torch.randint(1, 20, (4, 17))
    assert overfit(model, lambda m: m(ids[:, :-1], labels=ids[:, 1:]).loss) < 0.05


def test_encoder_lm_overfits_a_fixed_batch():
    torch.manual_seed(0)
    model = EncoderLM(EncoderLMConfig.preset("tiny", vocab_size=25, max_len=16, dropout=0.0))
    ids = torch.randint(1, 25, (4, 16))
    labels = torch.full_like(ids, -100)
    labels[:, ::3] = ids[:, ::3]
    masked = ids.masked_fill(labels != -100, 24)  # a [MASK] id
    assert overfit(model, lambda m: m(masked, labels=labels).loss) < 0.05


# ---- padding is invisible ---------------------------------------------------------------


@pytest.mark.parametrize("pooling", ["mean", "max"])
def test_classifier_ignores_trailing_pads(pooling):
    torch.manual_seed(0)
    model = TransformerClassifier(
        ClassifierConfig.preset("tiny", vocab_size=30, num_classes=4, max_len=20, pooling=pooling)
    ).eval()
    ids = torch.randint(1, 30, (3, 9))
    padded = torch.cat([ids, torch.zeros(3, 6, dtype=torch.long)], dim=1)
    torch.testing.assert_close(model(padded).logits, model(ids).logits, **TOL)


def test_seq2seq_ignores_source_and_target_pads():
    torch.manual_seed(0)
    model = Seq2SeqTransformer(
        Seq2SeqConfig.preset("tiny", src_vocab_size=20, tgt_vocab_size=20, max_len=20)
    ).eval()
    src, tgt = torch.randint(3, 20, (2, 7)), torch.randint(3, 20, (2, 5))
    pad = torch.zeros(2, 4, dtype=torch.long)
    reference = model(src, tgt).logits
    torch.testing.assert_close(model(torch.cat([src, pad], 1), tgt).logits, reference, **TOL)
    longer = model(src, torch.cat([tgt, pad], 1)).logits
    torch.testing.assert_close(longer[:, :5], reference, **TOL)


def test_gpt_ignores_right_padding_on_real_positions():
    torch.manual_seed(0)
    model = GPT(GPTConfig.preset("tiny", vocab_size=20, num_layers=2)).eval()
    ids = torch.randint(1, 20, (2, 10))
    padded = torch.cat([ids, torch.zeros(2, 5, dtype=torch.long)], dim=1)
    torch.testing.assert_close(model(padded).logits[:, :10], model(ids).logits, **TOL)


def test_gpt_is_causal():
    torch.manual_seed(0)
    model = GPT(GPTConfig.preset("tiny", vocab_size=20, num_layers=2)).eval()
    ids = torch.randint(1, 20, (1, 12))
    changed = ids.clone()
    changed[0, 8] = (ids[0, 8] % 19) + 1
    a, b = model(ids).logits, model(changed).logits
    torch.testing.assert_close(a[:, :8], b[:, :8], atol=0, rtol=0)
    assert not torch.allclose(a[:, 8:], b[:, 8:])


# ---- weight tying ------------------------------------------------------------------------


def test_gpt_head_is_tied_to_the_embedding():
    model = GPT(GPTConfig.preset("tiny", vocab_size=50))
    assert model.lm_head.weight is model.embed.token.embedding.weight
    untied = GPT(GPTConfig.preset("tiny", vocab_size=50, tie_weights=False))
    assert untied.num_parameters() == model.num_parameters() + 50 * 128


def test_seq2seq_sharing_and_tying_remove_exactly_one_matrix_each():
    base = dict(src_vocab_size=40, tgt_vocab_size=40)
    plain = Seq2SeqTransformer(Seq2SeqConfig.preset("tiny", **base))
    shared = Seq2SeqTransformer(Seq2SeqConfig.preset("tiny", **base, share_embeddings=True))
    both = Seq2SeqTransformer(
        Seq2SeqConfig.preset("tiny", **base, share_embeddings=True, tie_output=True)
    )
    matrix = 40 * 64
    assert plain.num_parameters() - shared.num_parameters() == matrix
    assert shared.num_parameters() - both.num_parameters() == matrix
    assert both.output_proj.weight is both.src_embed.token.embedding.weight
    assert both.tgt_embed.token.embedding.weight is both.src_embed.token.embedding.weight


# ---- attention maps ----------------------------------------------------------------------


def test_seq2seq_returns_every_attention_map_and_the_same_logits():
    torch.manual_seed(0)
    model = Seq2SeqTransformer(
        Seq2SeqConfig.preset("tiny", src_vocab_size=20, tgt_vocab_size=20, max_len=20)
    ).eval()
    src = torch.tensor([[5, 6, 7, 8, 9], [5, 6, 7, 0, 0]])
    tgt = torch.tensor([[1, 4, 5, 6], [1, 4, 0, 0]])
    out = model(src, tgt, need_weights=True)
    assert len(out.encoder_attentions) == len(out.decoder_attentions) == 2
    assert len(out.cross_attentions) == 2
    assert out.encoder_attentions[0].shape == (2, 4, 5, 5)
    assert out.decoder_attentions[0].shape == (2, 4, 4, 4)
    assert out.cross_attentions[0].shape == (2, 4, 4, 5)
    for maps in (out.encoder_attentions, out.decoder_attentions, out.cross_attentions):
        for w in maps:
            torch.testing.assert_close(w.sum(-1), torch.ones(w.shape[:-1]), **TOL)
    assert (out.cross_attentions[1][1, :, :, 3:] == 0).all()  # padded source keys get nothing
    torch.testing.assert_close(model(src, tgt).logits, out.logits, **TOL)
    assert model(src, tgt).encoder_attentions is None


@pytest.mark.parametrize("kind", ["classifier", "gpt", "encoder_lm"])
def test_single_stack_models_return_their_maps(kind):
    torch.manual_seed(0)
    model = {
        "classifier": lambda: TransformerClassifier(
            ClassifierConfig.preset("tiny", vocab_size=20, num_classes=2)
        ),
        "gpt": lambda: GPT(GPTConfig.preset("tiny", vocab_size=20, num_layers=3)),
        "encoder_lm": lambda: EncoderLM(EncoderLMConfig.preset("tiny", vocab_size=20)),
    }[kind]().eval()
    ids = torch.randint(1, 20, (2, 6))
    out = model(ids, need_weights=True)
    maps = out.decoder_attentions if kind == "gpt" else out.encoder_attentions
    assert len(maps) == len(model.blocks.layers if kind == "gpt" else model.encoder.layers)
    assert maps[0].shape == (2, 4, 6, 6)
    if kind == "gpt":
        assert (maps[-1].triu(diagonal=1) == 0).all()
    torch.testing.assert_close(model(ids).logits, out.logits, **TOL)


# ---- losses ------------------------------------------------------------------------------


def test_seq2seq_loss_ignores_pad_labels():
    torch.manual_seed(0)
    model = Seq2SeqTransformer(
        Seq2SeqConfig.preset("tiny", src_vocab_size=20, tgt_vocab_size=20)
    ).eval()
    src, tgt_in = torch.randint(3, 20, (2, 6)), torch.randint(3, 20, (2, 5))
    labels = torch.randint(3, 20, (2, 5))
    labels[1, 2:] = 0
    out = model(src, tgt_in, labels=labels)
    real = labels != 0
    by_hand = F.cross_entropy(out.logits[real], labels[real])
    torch.testing.assert_close(out.loss, by_hand, **TOL)


# ---- configs -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "make, message",
    [
        (lambda: GPTConfig(vocab_size=10, d_model=10, num_heads=3), r"d_model=10 .* num_heads=3"),
        (lambda: GPTConfig(vocab_size=10, dropout=-0.1), "-0.1"),
        (lambda: GPTConfig(vocab_size=10, attention_dropout=1.5), "attention_dropout .* 1.5"),
        (lambda: ClassifierConfig(vocab_size=10, num_classes=2, activation="swish"), "'swish'"),
        (lambda: EncoderLMConfig(positional="rotary"), "'rotary'"),
        (lambda: ClassifierConfig(vocab_size=10, num_classes=2, pooling="sum"), "'sum'"),
        (lambda: GPTConfig(vocab_size=0), "vocab_size must be a positive integer, got 0"),
        (
            lambda: Seq2SeqConfig(src_vocab_size=10, tgt_vocab_size=12, share_embeddings=True),
            "10 and 12",
        ),
        (lambda: Seq2SeqConfig(src_vocab_size=10, tgt_vocab_size=10, eos_id=10), "eos_id=10"),
        (lambda: GPTConfig.preset("huge", vocab_size=10), "'huge'"),
        (lambda: GPTConfig.from_dict({"vocab_size": 10, "n_embd": 4}), "n_embd"),
    ],
)
def test_bad_configs_name_the_value(make, message):
    with pytest.raises(ValueError, match=message):
        make()


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
    for name in config_cls.PRESETS:
        config = config_cls.preset(name, **required)
        assert config_cls.from_dict(config.to_dict()) == config
        if name != "base":
            assert model_cls(config).num_parameters() > 0
