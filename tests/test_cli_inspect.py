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


def test_attribute_prints_the_estimates_and_draws_them(run, tmp_path, capsys):
    """`attribute` with --corrupt: integrated gradients (their shares summing to the metric's
    change), attribution patching's top places with attribution_patching's own numbers, the
    agreement with real patching (--check), the two pictures; without --corrupt, integrated
    gradients alone into --out; .html, the viewer on its attribution tab."""
    from glassformer.inspect import attribution_patching, integrated_gradients

    out = tmp_path / "attr.png"
    argv = ["attribute", "--model", str(run), "--clean", "abcd", "--corrupt", "abed",
            "--answer", "e", "--wrong", "f", "--check", "--out", str(out)]  # fmt: skip
    assert main(argv) == 0
    printed = capsys.readouterr().out
    model, tok = load_run(run)
    metric = logit_difference(tok.encode("e")[0], tok.encode("f")[0])
    clean, corrupt = torch.tensor([tok.encode("abcd")]), torch.tensor([tok.encode("abed")])
    pad = torch.full_like(clean, tok.pad_id)  # the default baseline: the pad token, but for
    pad[0, 0] = clean[0, 0]  # the first
    ig = integrated_gradients(model, clean, metric, steps=2048, method="adaptive", baseline=pad)
    assert f"completeness gap {ig.delta:+.4f}" in printed
    assert abs(ig.delta) <= 0.01 * abs(ig.value - ig.baseline_value)  # converged by default
    assert f"{ig.steps} points in " in printed
    assert f"'c' {ig.per_token[2]:+.3f}" in printed
    grid = attribution_patching(model, clean, corrupt, metric)
    with torch.no_grad():
        base = float(metric(model(corrupt).logits))
        top = float(metric(model(clean).logits))
    best = int(grid.flatten().argsort(descending=top >= base)[0])  # the first place printed
    layer, place = divmod(best, grid.size(1))
    share = (float(grid[layer, place]) - base) / (top - base)
    where = "abcd"[place]
    assert f"residual stream: layer {layer + 1}, {where}: {share:.0%} of the way back" in printed
    assert "check, residual grid: correlation with real activation patching" in printed
    assert out.stat().st_size > 0 and (tmp_path / "attr-tokens.png").stat().st_size > 0
    alone = tmp_path / "ig.png"
    assert main(["attribute", "--model", str(run), "--clean", "abcd", "--answer", "e",
                 "--out", str(alone)]) == 0  # fmt: skip
    assert alone.stat().st_size > 0 and "attribution patching" not in capsys.readouterr().out
    page = tmp_path / "attr.html"
    assert main([*argv[:-2], "--out", str(page)]) == 0
    assert '"open":"attribution"' in page.read_text()


def test_attribute_refuses_in_one_line(run, tmp_path, capsys):
    for extra, message in ((["--corrupt", "abcde", "--wrong", "f"], "same number of tokens"),
                           (["--corrupt", "abed"], "needs --wrong")):  # fmt: skip
        argv = ["attribute", "--model", str(run), "--clean", "abcd", "--answer", "e", *extra,
                "--out", str(tmp_path / "a.png")]  # fmt: skip
        assert main(argv) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and message in err, err
