"""Hugging Face BERT directories: glassformer's BertEncoder, built from its own blocks,
gives BertModel's hidden states and pooled output with the same weights, padding included."""

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


def test_bert_options_glassformer_cannot_express_are_refused(tmp_path):
    hf = hf_bert(**CONFIGS[0])
    hf.config.position_embedding_type = "relative_key"
    hf.save_pretrained(tmp_path)
    with pytest.raises(CheckpointError, match="position_embedding_type 'relative_key'"):
        load_checkpoint(tmp_path)
