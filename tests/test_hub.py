"""glassformer.hub: models by their Hugging Face Hub id, through a Hub cache made here in the
layout huggingface_hub writes (``models--org--name/snapshots/<commit>/``, ``refs/<branch>``),
offline: nothing is downloaded."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from glassformer import GPT, GPTConfig, load_run
from glassformer.cli import main
from glassformer.errors import CheckpointError
from glassformer.hub import is_hub_id

pytest.importorskip("huggingface_hub")

MAIN, V2 = "a" * 40, "b" * 40  # two commits of the repository


def _model(seed: int, vocab_size: int) -> GPT:
    torch.manual_seed(seed)
    config = GPTConfig(vocab_size=vocab_size, d_model=32, num_heads=2, num_layers=1, max_len=64)
    return GPT(config).eval()


@pytest.fixture
def hub_cache(tmp_path, monkeypatch, chat_bpe):
    """``HF_HOME`` holding ``org/tiny`` at two commits (main and the tag v2), each a
    glassformer checkpoint with a tokenizer; offline. Returns {commit: model}."""
    from glassformer.data.tokenizers import load_tokenizer

    home = tmp_path / "hf"
    repo = home / "hub" / "models--org--tiny"
    vocab = load_tokenizer(chat_bpe(tmp_path / "tokenizer")).vocab_size
    models = {}
    (repo / "snapshots").mkdir(parents=True)
    for seed, commit in enumerate((MAIN, V2)):
        models[commit] = _model(seed, vocab)
        chat_bpe(models[commit].save_pretrained(repo / "snapshots" / commit))
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(MAIN)
    (repo / "refs" / "v2").write_text(V2)
    monkeypatch.setenv("HF_HOME", str(home))
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.chdir(tmp_path)
    return models


def _same(a: GPT, b: GPT) -> bool:
    return all(torch.equal(v, b.state_dict()[k]) for k, v in a.state_dict().items())


def test_a_hub_id_loads_from_the_cache_at_main_a_tag_or_a_commit(hub_cache):
    assert _same(GPT.from_pretrained("org/tiny"), hub_cache[MAIN])
    assert _same(GPT.from_pretrained("org/tiny", revision="v2"), hub_cache[V2])
    assert _same(GPT.from_pretrained("org/tiny", revision=V2), hub_cache[V2])
    assert not _same(hub_cache[MAIN], hub_cache[V2])  # the two commits differ


def test_load_run_and_the_cli_take_a_hub_id(hub_cache, capsys):
    model, tokenizer = load_run("org/tiny")
    assert _same(model, hub_cache[MAIN]) and tokenizer.vocab_size == model.config.vocab_size
    code = main(["generate", "--model", "org/tiny", "--prompt", "Hi", "--max-new-tokens", "3"])
    assert code == 0, capsys.readouterr().err


def test_a_local_folder_of_that_name_wins(hub_cache, tmp_path):
    """``org/tiny`` that exists on disk is that folder, not the Hub's."""
    local = _model(7, hub_cache[MAIN].config.vocab_size)
    local.save_pretrained(tmp_path / "org" / "tiny")
    assert not is_hub_id("org/tiny")
    assert _same(GPT.from_pretrained("org/tiny"), local)


def test_offline_an_id_not_in_the_cache_is_one_line_saying_how_to_get_it(hub_cache):
    with pytest.raises(CheckpointError) as e:
        GPT.from_pretrained("org/absent")
    message = str(e.value)
    assert "\n" not in message
    assert "'org/absent' is not in the Hugging Face cache" in message
    assert "huggingface-cli download org/absent" in message and "HF_HUB_OFFLINE" in message
    with pytest.raises(CheckpointError, match="at revision 'v9'"):
        GPT.from_pretrained("org/tiny", revision="v9")


def test_what_is_not_a_hub_id_is_left_to_the_loaders(hub_cache):
    for name in ("tiny", "../org/tiny", "org/tiny/extra", "/abs/path", "org/..", "-org/x"):
        assert not is_hub_id(name), name
    with pytest.raises(CheckpointError, match="tiny"):
        GPT.from_pretrained("tiny")
    with pytest.raises(ValueError, match="revision='v2' applies to a Hub id"):
        GPT.from_pretrained("somewhere/else.gguf/x", revision="v2")


def test_without_huggingface_hub_a_hub_id_says_how_to_install(hub_cache, monkeypatch):
    import sys

    from glassformer.errors import MissingDependencyError

    monkeypatch.setitem(sys.modules, "huggingface_hub", None)
    with pytest.raises(MissingDependencyError, match=r"pip install 'glassformer\[hub\]'"):
        GPT.from_pretrained("org/tiny")


def test_a_commands_default_model_and_a_mistyped_path_are_never_looked_up(hub_cache, capsys):
    """``glassformer generate`` with its default ``runs/lm`` says no such run, as before;
    ``runs/lm2`` beside a ``runs`` folder is a mistyped path, not a Hub id."""
    assert main(["generate", "--prompt", "Hi"]) == 2
    assert "Hugging Face" not in capsys.readouterr().err
    Path("runs").mkdir()
    assert not is_hub_id("runs/lm2") and is_hub_id("org/tiny")
