"""Checkpoints: round trips, tied weights, clear errors, atomic replacement, safe loading."""

import json
import os
import pickle

import pytest
import torch

from glassformer import (
    GPT,
    ClassifierConfig,
    EncoderLM,
    EncoderLMConfig,
    GPTConfig,
    Seq2SeqConfig,
    Seq2SeqTransformer,
    TransformerClassifier,
    load_checkpoint,
    save_checkpoint,
)
from glassformer.checkpoint import CheckpointError, load_training_state

MODELS = {
    "classifier": (
        lambda: TransformerClassifier(
            ClassifierConfig.preset("tiny", vocab_size=30, num_classes=3)
        ),
        lambda m, ids: m(ids).logits,
    ),
    "seq2seq": (
        lambda: Seq2SeqTransformer(
            Seq2SeqConfig.preset(
                "tiny", src_vocab_size=30, tgt_vocab_size=30, share_embeddings=True, tie_output=True
            )
        ),
        lambda m, ids: m(ids, ids[:, :5]).logits,
    ),
    "gpt": (
        lambda: GPT(GPTConfig.preset("tiny", vocab_size=30, num_layers=2)),
        lambda m, ids: m(ids).logits,
    ),
    "encoder_lm": (
        lambda: EncoderLM(EncoderLMConfig.preset("tiny", vocab_size=30)),
        lambda m, ids: m(ids).logits,
    ),
}
IDS = torch.tensor([[4, 5, 6, 7, 8, 9], [4, 5, 6, 7, 0, 0]])


@pytest.mark.parametrize("kind", sorted(MODELS))
def test_round_trip_gives_identical_outputs(kind, tmp_path):
    make, call = MODELS[kind]
    torch.manual_seed(0)
    model = make().eval()
    model.save_pretrained(tmp_path / "ckpt")
    loaded = type(model).from_pretrained(tmp_path / "ckpt")
    assert loaded.config == model.config
    assert torch.equal(call(loaded, IDS), call(model, IDS))
    assert json.loads((tmp_path / "ckpt" / "config.json").read_text())["kind"] == kind


def test_tied_weights_stay_tied_after_loading(tmp_path):
    make, _ = MODELS["seq2seq"]
    make().save_pretrained(tmp_path / "s")
    m = load_checkpoint(tmp_path / "s")
    assert m.output_proj.weight is m.src_embed.token.embedding.weight
    GPT(GPTConfig.preset("tiny", vocab_size=30)).save_pretrained(tmp_path / "g")
    g = GPT.from_pretrained(tmp_path / "g")
    assert g.lm_head.weight is g.embed.token.embedding.weight


def test_a_compiled_model_saves_the_same_keys(tmp_path):
    model = GPT(GPTConfig.preset("tiny", vocab_size=30, num_layers=1))
    compiled = torch.compile(model)  # not run: wrapping alone is what adds the prefix
    save_checkpoint(compiled, tmp_path / "c")
    assert torch.equal(load_checkpoint(tmp_path / "c").lm_head.weight, model.lm_head.weight)


def test_wrong_kind_names_both(tmp_path):
    MODELS["gpt"][0]().save_pretrained(tmp_path / "g")
    with pytest.raises(CheckpointError, match="holds a 'gpt' model, expected 'classifier'"):
        TransformerClassifier.from_pretrained(tmp_path / "g")


def test_not_a_checkpoint(tmp_path):
    with pytest.raises(CheckpointError, match="does not exist"):
        load_checkpoint(tmp_path / "nowhere")
    (tmp_path / "empty").mkdir()
    with pytest.raises(CheckpointError, match="no config.json"):
        load_checkpoint(tmp_path / "empty")


def test_garbage_config_and_truncated_weights(tmp_path):
    MODELS["gpt"][0]().save_pretrained(tmp_path / "g")
    weights = tmp_path / "g" / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    with pytest.raises(CheckpointError, match="cannot load"):
        load_checkpoint(tmp_path / "g")
    (tmp_path / "g" / "config.json").write_text("{not json")
    with pytest.raises(CheckpointError, match="not a glassformer config"):
        load_checkpoint(tmp_path / "g")


def test_weights_from_another_config_are_refused(tmp_path):
    GPT(GPTConfig.preset("tiny", vocab_size=30, num_layers=2)).save_pretrained(tmp_path / "g")
    meta = json.loads((tmp_path / "g" / "config.json").read_text())
    meta["config"]["num_layers"] = 3
    (tmp_path / "g" / "config.json").write_text(json.dumps(meta))
    with pytest.raises(CheckpointError, match="missing .*blocks.layers.2"):
        load_checkpoint(tmp_path / "g")


def test_saving_over_a_checkpoint_replaces_it_and_leaves_no_temporaries(tmp_path):
    first, second = MODELS["gpt"][0](), MODELS["gpt"][0]()
    first.save_pretrained(tmp_path / "ckpt")
    second.save_pretrained(tmp_path / "ckpt")
    loaded = load_checkpoint(tmp_path / "ckpt")
    assert torch.equal(loaded.lm_head.weight, second.lm_head.weight)
    assert sorted(os.listdir(tmp_path)) == ["ckpt"]


def test_a_failed_save_keeps_the_previous_checkpoint(tmp_path, monkeypatch):
    model = MODELS["gpt"][0]()
    model.save_pretrained(tmp_path / "ckpt")
    before = (tmp_path / "ckpt" / "model.safetensors").read_bytes()

    def boom(*args, **kwargs):
        raise OSError("No space left on device")

    monkeypatch.setattr("glassformer.checkpoint.save_model", boom)
    with pytest.raises(OSError, match="No space left"):
        MODELS["gpt"][0]().save_pretrained(tmp_path / "ckpt")
    assert (tmp_path / "ckpt" / "model.safetensors").read_bytes() == before
    assert sorted(os.listdir(tmp_path)) == ["ckpt"]


class _Exploit:
    def __reduce__(self):
        return (os.system, ("echo pwned > /dev/null",))


def test_training_state_with_code_in_it_is_refused(tmp_path):
    model = MODELS["gpt"][0]()
    save_checkpoint(model, tmp_path / "ckpt", training_state={"step": torch.tensor(3)})
    assert load_training_state(tmp_path / "ckpt")["step"].item() == 3
    with open(tmp_path / "ckpt" / "training_state.pt", "wb") as f:
        pickle.dump({"evil": _Exploit()}, f)
    with pytest.raises(CheckpointError, match="cannot load"):
        load_training_state(tmp_path / "ckpt")


def test_a_run_directory_resolves_to_its_checkpoint(tmp_path):
    MODELS["gpt"][0]().save_pretrained(tmp_path / "run" / "checkpoint")
    assert isinstance(load_checkpoint(tmp_path / "run"), GPT)
