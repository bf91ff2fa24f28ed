"""`glassformer lens` and `glassformer patch` on a run directory: the table and images,
the lens's last row the model's own guess, and one-line errors."""

import pytest
import torch

from glassformer import GPT, GPTConfig, load_run
from glassformer.cli import main
from glassformer.data.tokenizers import CharTokenizer
from glassformer.inspect import activation_patching, logit_difference


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """A random tiny GPT over characters, saved as a run's checkpoint would be."""
    folder = tmp_path_factory.mktemp("gpt")
    tok = CharTokenizer(list("abcdefghij "))
    torch.manual_seed(0)
    config = GPTConfig(vocab_size=tok.vocab_size, max_len=16, d_model=32, num_heads=4,
                       num_layers=2, dropout=0.0)  # fmt: skip
    GPT(config).save_pretrained(folder)
    tok.save(folder)
    return folder


def test_lens_prints_a_row_per_stage_ending_in_the_models_guess(run, tmp_path, capsys):
    out = tmp_path / "lens.png"
    assert main(["lens", "--model", str(run), "abc", "--out", str(out)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[1].strip().startswith("embeddings") and lines[3].strip().startswith("layer 2")
    model, tok = (
        GPT.from_pretrained(run),
        CharTokenizer.load(run) if hasattr(CharTokenizer, "load") else None,
    )
    from glassformer import load_run

    model, tok = load_run(run)
    with torch.no_grad():
        guess = model(torch.tensor([tok.encode("abc")])).logits[0, -1].argmax()
    assert lines[3].split()[-2] == tok.id_to_token(int(guess)).replace(" ", "␣")
    assert out.stat().st_size > 0 and "3 stages × 3 tokens" in lines[-1]


def test_patch_prints_the_metrics_and_draws_the_effect(run, tmp_path, capsys):
    out = tmp_path / "patch.png"
    argv = ["patch", "--model", str(run), "--clean", "abcd", "--corrupt", "abed",
            "--answer", "e", "--wrong", "f", "--out", str(out)]  # fmt: skip
    assert main(argv) == 0
    printed = capsys.readouterr().out
    model, tok = load_run(run)
    metric = logit_difference(tok.encode("e")[0], tok.encode("f")[0])
    with torch.no_grad():
        clean = float(metric(model(torch.tensor([tok.encode("abcd")])).logits))
    assert f"clean {clean:.3f}" in printed and "2 layers × 4 positions" in printed
    effect = activation_patching(
        model, torch.tensor([tok.encode("abcd")]), torch.tensor([tok.encode("abed")]), metric
    )
    assert f"layer 1, c: {effect[0, 2]:.3f}" in printed  # the changed position restores all
    assert out.stat().st_size > 0
    assert main([*argv[:-2], "--what", "z", "--out", str(tmp_path / "z.png")]) == 0
    assert "2 layers × 4 heads" in capsys.readouterr().out


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--corrupt", "abcde"], "the same number of tokens, got 4 and 5"),
        (["--answer", "ef"], "--answer 'ef' must be one token, but it encodes to 2"),
    ],
)
def test_patch_errors_are_one_line(run, extra, message, capsys):
    argv = {"--clean": "abcd", "--corrupt": "abed", "--answer": "e", "--wrong": "f"}
    argv.update(dict(zip(extra[::2], extra[1::2], strict=True)))
    flat = [x for kv in argv.items() for x in kv]
    assert main(["patch", "--model", str(run), *flat]) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1


def test_lens_refuses_a_model_without_a_head_in_one_line(tmp_path, capsys):
    from glassformer import BertConfig, BertEncoder

    tok = CharTokenizer(list("abc"))
    config = BertConfig(vocab_size=tok.vocab_size, max_len=8, d_model=16, num_heads=2,
                        num_layers=1, d_ff=32)  # fmt: skip
    BertEncoder(config).save_pretrained(tmp_path)
    tok.save(tmp_path)
    assert main(["lens", "--model", str(tmp_path), "abc"]) == 2
    err = capsys.readouterr().err
    assert "through a vocabulary or class head, which a 'bert' model does not have" in err
    assert len(err.strip().splitlines()) == 1
