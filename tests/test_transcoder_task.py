"""Training transcoders (glassformer.training.tasks.transcoder) and their work on a model
(glassformer.inspect.transcoders): the sparse loss and its gradients equal the dense
forward's, every MLP activation is the model's own, splicing puts each transcoder's
prediction in place, and `train transcoder` runs, resumes exactly and refuses bad input in
one line."""

from __future__ import annotations

import dataclasses
import json
import math

import pytest
import torch

from glassformer import GPT, GPTConfig, TranscoderConfig, Transcoders
from glassformer.cli import main
from glassformer.data.tokenizers import CharTokenizer
from glassformer.inspect.transcoders import mlp_activations, splice_hooks, spliced_losses
from glassformer.training import runner
from glassformer.training.tasks.transcoder import (
    AUX_WEIGHT,
    MLPBatches,
    parse_layers,
    ridge,
    sparse_loss,
)


def tiny_lm(tmp_path):
    torch.manual_seed(0)
    tok = CharTokenizer("abcdefghijklmnopqrstuvwxyz .")
    model = GPT(GPTConfig(vocab_size=tok.vocab_size, max_len=64, d_model=32, num_heads=4,
                          num_layers=3, d_ff=64, dropout=0.0)).eval()  # fmt: skip
    path = tmp_path / "lm"
    model.save_pretrained(path, extra_files={"tokenizer.json": tok.to_json().encode()})
    return model, tok, path


def uneven(config: TranscoderConfig) -> Transcoders:
    torch.manual_seed(3)
    tc = Transcoders(config)
    with torch.no_grad():
        for p in tc.parameters():
            p.mul_(torch.rand_like(p) + 0.5).add_(torch.randn_like(p) * 0.01)
    return tc


@pytest.mark.parametrize(("cross", "skip"), [(False, False), (False, True), (True, False)])
def test_the_sparse_loss_and_its_gradients_equal_the_dense_forwards(cross: bool, skip: bool):
    """The loss trained on (chosen rows only) against the model's own forward: the same
    value and the same gradient for every parameter, decoder norms and all."""
    config = TranscoderConfig(d_model=16, d_transcoder=48, layers=(0, 1, 2), k=5, skip=skip,
                              cross_layer=cross, rescale_acts_by_decoder_norm=True)  # fmt: skip
    tc = uneven(config)
    x, y = torch.randn(3, 20, 16), torch.randn(3, 20, 16)
    variance = torch.tensor([1.0, 2.0, 0.5])
    sparse = sparse_loss(tc, x, y, variance)
    sparse.backward()
    got = {name: p.grad.clone() for name, p in tc.named_parameters()}
    tc.zero_grad()
    dense = ((y - tc(x).outputs).pow(2).sum((1, 2)) / variance).sum()
    dense.backward()
    torch.testing.assert_close(sparse, dense)
    for name, p in tc.named_parameters():
        torch.testing.assert_close(got[name], p.grad, atol=1e-5, rtol=1e-4, msg=name)


def test_the_aux_loss_is_the_dead_features_rebuilding_the_error():
    """With features marked dead, the loss gains AuxK: the dead features' top k_aux (by
    evidence × decoder norm), ReLU'd, decoding what the live ones missed; value and
    gradients against that written out densely."""
    config = TranscoderConfig(d_model=16, d_transcoder=48, layers=(0, 1), k=5,
                              rescale_acts_by_decoder_norm=True)  # fmt: skip
    tc = uneven(config)
    with torch.no_grad():
        tc.since_fired[:, ::3] = tc.DEAD_AFTER + 1  # a third of each layer's features dead
    x, y = torch.randn(2, 20, 16), torch.randn(2, 20, 16)
    variance = torch.tensor([1.0, 2.0])
    sparse = sparse_loss(tc, x, y, variance)
    sparse.backward()
    got = {name: p.grad.clone() for name, p in tc.named_parameters()}
    tc.zero_grad()
    dead = tc.since_fired > tc.DEAD_AFTER  # those that fired in the batch are alive again
    assert int(dead.sum(1).min()) > 0 and int(dead.sum(1).max()) < 16
    out = tc(x)
    error = y - out.outputs
    loss = (error.pow(2).sum((1, 2)) / variance).sum()
    norms = tc.decoder_norms()
    k_aux = min(int(dead.sum(1).max()), 8)  # at most d_model // 2
    aux = 0
    for i in range(2):
        pre = (x[i] @ tc.W_enc[i].T + tc.b_enc[i]) * norms[i]
        values, index = pre.masked_fill(~dead[i], float("-inf")).topk(k_aux, dim=-1)
        codes = torch.zeros_like(pre).scatter(-1, index, values.relu())
        guess = (codes / norms[i]) @ tc.W_dec[i]
        aux = aux + (guess - error[i].detach()).pow(2).sum() / variance[i]
    (loss + AUX_WEIGHT * aux).backward()
    torch.testing.assert_close(sparse, loss + AUX_WEIGHT * aux)
    for name, p in tc.named_parameters():
        torch.testing.assert_close(got[name], p.grad, atol=1e-5, rtol=1e-4, msg=name)


def test_mlp_activations_are_the_models_own(tmp_path):
    model, tok, _ = tiny_lm(tmp_path)
    windows = torch.tensor(
        [tok.encode("the cat sat on the mat"), tok.encode("a dog sat on a log ...")]
    )
    config = TranscoderConfig(d_model=32, d_transcoder=8, layers=(0, 2), k=2)
    x, y = mlp_activations(model, config, windows, batch=1)
    names = [config.hook(i, w) for i in range(2) for w in ("input", "output")]
    _, cache = model.run_with_cache(windows, names=names)
    for i in range(2):
        torch.testing.assert_close(x[i], cache[config.hook(i)][:, 1:].flatten(0, 1))
        torch.testing.assert_close(y[i], cache[config.hook(i, "output")][:, 1:].flatten(0, 1))


@pytest.mark.parametrize(("cross", "skip"), [(False, True), (True, False)])
def test_splicing_puts_each_prediction_in_place(tmp_path, cross: bool, skip: bool):
    """In the spliced run, every layer's MLP output is the transcoders' prediction from
    the MLP inputs of that same run (the first position the model's own)."""
    model, tok, _ = tiny_lm(tmp_path)
    ids = torch.tensor([tok.encode("the cat sat on the mat and the dog")])
    tc = uneven(TranscoderConfig(d_model=32, d_transcoder=48, layers=(0, 1, 2), k=6,
                                 cross_layer=cross, skip=skip))  # fmt: skip
    config = tc.config
    seen = {}
    keep = lambda value, name: seen.__setitem__(name, value)  # noqa: E731
    names = [config.hook(i, w) for i in range(3) for w in ("input", "output")]
    with torch.no_grad(), model.hooks([*splice_hooks(tc), (names, keep)]):
        model(ids)
        x = torch.stack([seen[config.hook(i)][0] for i in range(3)])
        expected = tc(x).outputs
    for i in range(3):
        torch.testing.assert_close(seen[config.hook(i, "output")][0, 1:], expected[i, 1:])
    losses = spliced_losses(model, tc, ids)
    assert losses["ce_increase"] == pytest.approx(losses["ce_spliced"] - losses["ce_clean"])


def test_ridge_recovers_a_linear_map():
    torch.manual_seed(0)
    x = torch.randn(2, 500, 8)
    w = torch.randn(2, 8, 8)
    y = torch.bmm(x, w) + 3.0
    torch.testing.assert_close(ridge(x, y, strength=0.0), w, atol=1e-4, rtol=1e-4)


def test_layers_are_parsed_and_checked():
    assert parse_layers(None, 4) == (0, 1, 2, 3)
    assert parse_layers("1-2,0", 4) == (0, 1, 2)
    with pytest.raises(ValueError, match="the model has blocks 0 … 3"):
        parse_layers("2-5", 4)
    with pytest.raises(ValueError, match='takes "all", "a-b" or "a,b,c", got \'x\''):
        parse_layers("x", 4)


FAST = ["--block-size", "16", "--batch-size", "64", "--features", "96", "--k", "6",
        "--eval-every", "4", "--log-every", "1", "--threads", "1"]  # fmt: skip


def rows(run):
    lines = (run / "metrics.jsonl").read_text().splitlines()
    return [{k: v for k, v in json.loads(line).items() if k not in ("elapsed_s", "tokens_per_s")}
            for line in lines]  # fmt: skip


def test_train_transcoder_runs_and_resumes_exactly(tmp_path, capsys, monkeypatch):
    """`train transcoder` on a tiny GPT's three MLPs: the run directory, per-layer held-out
    figures, a checkpoint that opens as Transcoders; interrupted and resumed, the same
    losses as the uninterrupted run."""
    _, _, lm = tiny_lm(tmp_path)
    story = tmp_path / "story.txt"
    story.write_text("the cat sat on the mat. the dog sat on the log. " * 160)
    argv = ["train", "transcoder", "--model", str(lm), "--skip", "--data", str(story),
            "--max-steps", "12", *FAST]  # fmt: skip
    run = tmp_path / "tc"
    assert main([*argv, "--out", str(run)]) == 0
    results = json.loads((run / "results.json").read_text())
    assert len(results["test_nmse_per_layer"]) == 3 and results["test_l0"] <= 6
    assert {"test_ce_clean", "test_ce_spliced", "test_ce_increase", "dead_share"} <= set(results)
    losses = [r["loss"] for r in rows(run) if r["event"] == "step"]
    assert losses[-1] < losses[0]
    tc = Transcoders.from_pretrained(run / "checkpoint")
    assert tc.config.layers == (0, 1, 2) and tc.config.skip and tc.config.k == 6

    cut = tmp_path / "cut"

    def ctrl_c(event, state, _):
        if event == "step" and state.step == 6:
            raise KeyboardInterrupt

    fit = runner.fit
    monkeypatch.setattr(runner, "fit", lambda *a, **kw: fit(*a, **kw, hooks=(ctrl_c,)))
    assert main([*argv, "--out", str(cut)]) == 130
    monkeypatch.undo()
    assert main(["train", "transcoder", "--resume", str(cut)]) == 0
    assert rows(cut) == rows(run)


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--layers", "1-7"], "the model has blocks 0 … 2"),
        (["--hook", "blocks.0.hook_resid_post"], "is for sae"),
    ],
)
def test_bad_transcoder_runs_are_one_line(tmp_path, capsys, extra, message):
    _, _, lm = tiny_lm(tmp_path)
    assert main(["train", "transcoder", "--model", str(lm), "--max-steps", "1", *extra]) == 2
    err = capsys.readouterr().err.strip()
    assert message in err.splitlines()[-1] and "Traceback" not in err


def test_a_cross_layer_set_trains_from_the_command_line(tmp_path):
    _, _, lm = tiny_lm(tmp_path)
    story = tmp_path / "story.txt"
    story.write_text("the cat sat on the mat. the dog sat on the log. " * 160)
    run = tmp_path / "clt"
    assert main(["train", "transcoder", "--model", str(lm), "--cross-layer", "--data", str(story),
                 "--max-steps", "6", *FAST, "--out", str(run)]) == 0  # fmt: skip
    losses = [r["loss"] for r in rows(run) if r["event"] == "step"]
    assert len(losses) == 6 and all(math.isfinite(v) for v in losses)
    tc = Transcoders.from_pretrained(run / "checkpoint")
    assert tc.config.cross_layer and tuple(tc.decoder(0).shape) == (96, 3, 32)


def test_skip_is_for_transcoders_only(capsys):
    assert main(["train", "lm", "--skip"]) == 2
    assert "is for transcoder, not 'lm'" in capsys.readouterr().err


def test_a_post_norm_model_is_refused_in_one_line(tmp_path, capsys):
    model, tok, _ = tiny_lm(tmp_path)
    post = GPT(dataclasses.replace(model.config, norm_first=False))
    path = tmp_path / "post"
    post.save_pretrained(path, extra_files={"tokenizer.json": tok.to_json().encode()})
    assert main(["train", "transcoder", "--model", str(path), "--max-steps", "1"]) == 2
    assert "post-norm" in capsys.readouterr().err


def test_training_from_the_store_gives_what_the_stream_gives(tmp_path, monkeypatch):
    """The same run three times: streamed, writing the activation store, and reading it
    (no model run for them): the same losses and figures, step by step."""
    _, _, lm = tiny_lm(tmp_path)
    story = tmp_path / "story.txt"
    story.write_text("the cat sat on the mat. the dog sat on the log. " * 160)
    argv = ["train", "transcoder", "--model", str(lm), "--data", str(story), "--max-steps",
            "10", *FAST]  # fmt: skip
    assert main([*argv, "--out", str(tmp_path / "stream")]) == 0
    store = tmp_path / "store"
    assert main([*argv, "--out", str(tmp_path / "writes"), "--store", str(store)]) == 0
    assert list(store.glob("region-*.safetensors"))

    def no_model(self, place):
        raise AssertionError("the store was not read")

    monkeypatch.setattr(MLPBatches, "compute", no_model)
    assert main([*argv, "--out", str(tmp_path / "reads"), "--store", str(store)]) == 0
    assert rows(tmp_path / "writes") == rows(tmp_path / "stream")
    assert rows(tmp_path / "reads") == rows(tmp_path / "stream")
