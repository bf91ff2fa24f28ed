"""The support matrix (glassformer.interop.support, `glassformer models`): written by the
test run, printed by the command, every family in it opened by a registered reader; and a
family's Hugging Face directory used from the command line as the docs show."""

import json

import pytest

from glassformer.checkpoint import FOREIGN_FORMATS
from glassformer.cli import main
from glassformer.interop import support as support_module
from glassformer.interop.support import CAPABILITIES, FAMILIES, support_matrix, write_support


def test_every_family_of_the_matrix_has_a_reader_for_its_model_type():
    for family, model_type, cls in FAMILIES:
        readers = FOREIGN_FORMATS.get(model_type, {})
        assert readers, family
        kind = "seq2seq" if cls == "Seq2SeqTransformer" else "gpt"
        assert kind in readers, family


def test_glassformer_models_prints_what_the_file_holds(tmp_path, monkeypatch, capsys):
    file = tmp_path / "support.json"
    monkeypatch.setattr(support_module, "SUPPORT_FILE", file)
    assert write_support({"Qwen3": {"load", "logits"}, "T5": {"GGUF"}})
    assert not write_support({"Qwen3": {"load", "logits"}, "T5": {"GGUF"}})  # unchanged
    saved = json.loads(file.read_text())
    assert set(saved["families"]) == {f for f, _, _ in FAMILIES}
    matrix = support_matrix()
    assert matrix["Qwen3"]["load"] and not matrix["Qwen3"]["GGUF"] and matrix["T5"]["GGUF"]
    assert main(["models"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split()[:3] == [
        "family",
        "model_type",
        "opens",
    ]
    qwen3 = next(line for line in lines if line.startswith("Qwen3"))
    assert qwen3.split()[3:5] == ["yes", "yes"] and qwen3.split().count("yes") == 2
    assert main(["models", "--markdown"]) == 0
    table = capsys.readouterr().out
    assert table.startswith("| family | model_type | opens as | load |")
    with pytest.raises(ValueError, match="unknown families"):
        write_support({"Bloom": {"load"}})


def test_the_committed_matrix_names_every_capability_for_every_family():
    """What the last full passing run wrote: every family, every capability a boolean, and
    at least what this suite proves for every family (load, logits, every activation)."""
    saved = json.loads(support_module.SUPPORT_FILE.read_text())["families"]
    for family, _, _ in FAMILIES:
        assert set(saved[family]) == set(CAPABILITIES)
        assert saved[family]["load"] and saved[family]["every activation"], family


def test_a_family_directory_runs_from_the_command_line(tmp_path, capsys):
    """A Hugging Face Qwen2 directory with its tokenizer.json, as the families page uses
    one: `generate` and `trace` on it."""
    transformers = pytest.importorskip("transformers")
    from hf_families import SMALL_DECODER, randomize
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=300, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    tokenizer.train_from_iterator(["The capital of France is Paris."] * 20, trainer)
    fields = {**SMALL_DECODER, "vocab_size": tokenizer.get_vocab_size()}  # bytes and merges
    hf = transformers.Qwen2ForCausalLM(transformers.Qwen2Config(**fields, num_key_value_heads=2))
    randomize(hf.eval())
    path = tmp_path / "qwen2"
    hf.save_pretrained(path)
    tokenizer.save(str(path / "tokenizer.json"))
    argv = ["generate", "--model", str(path), "--prompt", "The capital", "--max-new-tokens", "5"]
    assert main(argv) == 0
    assert capsys.readouterr().out.startswith("The capital")
    assert main(["trace", "--model", str(path), "The capital"]) == 0
    out = capsys.readouterr().out
    assert "Q = x·W_q + b_q, in 4 heads of 8" in out and out.strip().splitlines()[
        -1
    ].lstrip().startswith("logits")
