"""Hugging Face BERT directories: glassformer's BertEncoder, built from its own blocks,
gives BertModel's hidden states and pooled output with the same weights, padding included.

The comparisons run on small randomly initialised BERT models (nothing is downloaded);
``test_the_released_bert_base_uncased_gives_transformers_hidden_states`` (marked network and
slow) compares the released bert-base-uncased where it is already in the Hugging Face cache."""

import pytest
import torch

from glassformer import BertEncoder, load_checkpoint
from glassformer.checkpoint import CheckpointError

transformers = pytest.importorskip("transformers")

CONFIGS = [
    dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128),
    dict(hidden_size=48, num_hidden_layers=3, num_attention_heads=3, intermediate_size=96),
]


def hf_bert(seed=0, **kwargs):
    torch.manual_seed(seed)
    config = transformers.BertConfig(
        vocab_size=120,
        max_position_embeddings=40,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
        initializer_range=0.1,  # activations wide enough for the GELU variants to differ
        **kwargs,
    )
    model = transformers.BertModel(config).eval()
    with torch.no_grad():  # BERT's init leaves LayerNorms at 1 and 0: make them count
        for name, p in model.named_parameters():
            if "LayerNorm" in name:
                p.add_(0.2 * torch.randn_like(p))
    return model


@pytest.mark.parametrize("kwargs", CONFIGS)
def test_bert_hidden_states_match_transformers_with_padding(kwargs, tmp_path):
    hf = hf_bert(**kwargs)
    hf.save_pretrained(tmp_path)
    ours = BertEncoder.from_pretrained(tmp_path)
    ids = torch.randint(1, 120, (3, 11))
    ids[0, 7:] = 0  # padded rows of different lengths
    ids[1, 4:] = 0
    types = torch.zeros_like(ids)
    types[:, 3:] = 1
    mask = (ids != 0).long()
    with torch.no_grad():
        expected = hf(input_ids=ids, attention_mask=mask, token_type_ids=types)
        got = ours(ids, token_type_ids=types)
    torch.testing.assert_close(got.hidden, expected.last_hidden_state, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(got.pooled, expected.pooler_output, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("kwargs", CONFIGS)
def test_bert_with_attention_mask_matches_transformers(kwargs, tmp_path):
    hf = hf_bert(**kwargs)
    hf.save_pretrained(tmp_path)
    ours = BertEncoder.from_pretrained(tmp_path)
    ids = torch.randint(1, 120, (3, 11))  # after each row's end: filler tokens, not pads
    ids[2, 5] = 0  # and a pad id that the attention_mask calls a real token
    am = (torch.arange(11) < torch.tensor([[7], [4], [11]])).long()
    with torch.no_grad():
        expected = hf(input_ids=ids, attention_mask=am)
        got = ours(ids, attention_mask=am)
        unmasked = ours(ids)
    torch.testing.assert_close(got.hidden, expected.last_hidden_state, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(got.pooled, expected.pooler_output, atol=1e-5, rtol=1e-5)
    assert not torch.allclose(unmasked.hidden, got.hidden, atol=1e-3)  # the mask mattered


def test_a_bert_directory_without_its_pooler_loads_without_one(tmp_path):
    hf = hf_bert(**CONFIGS[0])
    hf.save_pretrained(tmp_path)
    from safetensors.torch import load_file, save_file

    state = load_file(str(tmp_path / "model.safetensors"))
    state = {k: v for k, v in state.items() if not k.startswith("pooler.")}
    save_file(state, str(tmp_path / "model.safetensors"), metadata={"format": "pt"})
    model = load_checkpoint(tmp_path, kind="bert")
    assert model.pooler is None and model(torch.tensor([[5, 6, 7]])).pooled is None


def test_the_released_checkpoints_names_load_bert_prefix_and_layernorm_gamma_beta(tmp_path):
    """bert-base-uncased's files name the weights as BertForPreTraining did when ported
    from TensorFlow: ``bert.`` first, LayerNorm ``gamma``/``beta``, and a ``cls.`` head."""
    from safetensors.torch import save_file

    hf = hf_bert(**CONFIGS[0])
    hf.save_pretrained(tmp_path)
    renamed = {}
    for name, value in hf.state_dict().items():
        if "LayerNorm" in name:
            name = name.replace(".weight", ".gamma").replace(".bias", ".beta")
        renamed[f"bert.{name}"] = value.contiguous()
    renamed["cls.predictions.bias"] = torch.zeros(120)
    save_file(renamed, str(tmp_path / "model.safetensors"), metadata={"format": "pt"})
    ours = BertEncoder.from_pretrained(tmp_path)
    ids = torch.randint(1, 120, (2, 9))
    with torch.no_grad():
        expected = hf(input_ids=ids)
        got = ours(ids)
    torch.testing.assert_close(got.hidden, expected.last_hidden_state, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(got.pooled, expected.pooler_output, atol=1e-5, rtol=1e-5)


@pytest.mark.network
@pytest.mark.slow
def test_the_released_bert_base_uncased_gives_transformers_hidden_states(released_checkpoint):
    """Google's bert-base-uncased from the Hugging Face cache, in both implementations: the
    same hidden states and pooled outputs for a padded batch of sentences."""
    folder = released_checkpoint("google-bert/bert-base-uncased", "bert-base-uncased")
    hf = transformers.BertModel.from_pretrained(folder).eval()
    tokenizer = transformers.AutoTokenizer.from_pretrained(folder)
    ours = BertEncoder.from_pretrained(folder)
    sentences = [
        "The quick brown fox jumps over the lazy dog.",
        "A glass box: every part of the Transformer can be read.",
        "Short one.",
    ]
    batch = tokenizer(sentences, padding=True, return_tensors="pt")
    assert not batch.attention_mask.all()  # the batch is padded
    with torch.no_grad():
        expected = hf(**batch)
        got = ours(
            batch.input_ids,
            attention_mask=batch.attention_mask,
            token_type_ids=batch.token_type_ids,
        )
    torch.testing.assert_close(got.hidden, expected.last_hidden_state, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(got.pooled, expected.pooler_output, atol=1e-4, rtol=1e-4)


def test_bert_options_glassformer_cannot_express_are_refused(tmp_path):
    hf = hf_bert(**CONFIGS[0])
    hf.config.position_embedding_type = "relative_key"
    hf.save_pretrained(tmp_path)
    with pytest.raises(CheckpointError, match="position_embedding_type 'relative_key'"):
        load_checkpoint(tmp_path)


def test_a_config_the_weights_do_not_hold_is_refused_before_the_model_is_built(tmp_path, builds_on):
    """max_position_embeddings 10^6 in config.json, 40 rows in the weights: refused with the
    model built on the meta device only, never for real."""
    import json

    hf_bert(**CONFIGS[0]).save_pretrained(tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps(config | {"max_position_embeddings": 10**6}))
    devices = builds_on(BertEncoder)
    with pytest.raises(CheckpointError, match=r"has shape \(40, 64\), .* \(1000000"):
        BertEncoder.from_pretrained(tmp_path)
    assert devices == ["meta"]
