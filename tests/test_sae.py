"""Sparse autoencoders (glassformer.models.sae, interop.saelens, inspect.features and
`train sae`): the TopK code, the decoder norms folded into an equivalent SAE, SAELens's file
format field by field (both layouts) and back, splicing, training from the command line with
resume, and one-line errors."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file

from glassformer import GPT, GPTConfig, SAEConfig, SparseAutoencoder
from glassformer.cli import main
from glassformer.data.tokenizers import CharTokenizer
from glassformer.errors import CheckpointError
from glassformer.inspect.features import (
    feature_activations,
    hook_activations,
    reconstruction_metrics,
    splice_hook,
    spliced_losses,
)
from glassformer.training import runner


def sae(**changes) -> SparseAutoencoder:
    torch.manual_seed(0)
    config = dict(d_in=16, d_sae=64, k=4, rescale_acts_by_decoder_norm=True,
                  hook_name="blocks.1.hook_resid_post", model_name="tiny")  # fmt: skip
    model = SparseAutoencoder(SAEConfig(**{**config, **changes}))
    d_in, d_sae = model.config.d_in, model.config.d_sae
    with torch.no_grad():  # rows of different lengths, biases away from zero
        model.W_dec.mul_(torch.rand(d_sae, 1) * 3 + 0.2)
        model.b_dec.add_(torch.randn(d_in))
        model.b_enc.add_(torch.randn(d_sae) * 0.1)
    return model


def test_topk_keeps_the_k_largest_and_rebuilds_from_them():
    model = sae(rescale_acts_by_decoder_norm=False)
    x = torch.randn(5, 16)
    out = model(x)
    pre = (x - model.b_dec) @ model.W_enc + model.b_enc
    expected = torch.zeros_like(pre)
    top = pre.topk(4, dim=-1)
    expected.scatter_(-1, top.indices, top.values.relu())
    torch.testing.assert_close(out.features, expected)
    assert ((out.features > 0).sum(-1) <= 4).all()
    torch.testing.assert_close(out.reconstruction, expected @ model.W_dec + model.b_dec)


def test_the_decoder_norms_fold_into_an_equivalent_sae_with_unit_rows():
    """Trained with rescale_acts_by_decoder_norm, saved without it: the same features
    chosen, the same reconstruction, unit decoder rows."""
    model = sae()
    x = torch.randn(20, 16)
    folded = SparseAutoencoder(SAEConfig(d_in=16, d_sae=64, k=4))
    folded.load_state_dict({**model.folded(), "since_fired": model.since_fired}, strict=True)
    torch.testing.assert_close(folded(x).reconstruction, model(x).reconstruction, atol=1e-5, rtol=0)
    assert torch.equal(folded(x).features > 0, model(x).features > 0)
    torch.testing.assert_close(folded.W_dec.norm(dim=1), torch.ones(64))


# the fields SAELens reads (sae_lens 6: SAEConfig + TopKSAEConfig and SAEMetadata; 5: the
# flat SAEConfig.from_dict), from its source (sae_lens/saes/sae.py, topk_sae.py; v5.11.0
# sae_lens/sae.py); `benchmarks/saelens_check.py` loads the files with SAELens itself
V6_FIELDS = {"architecture", "d_in", "d_sae", "dtype", "device", "apply_b_dec_to_input",
             "normalize_activations", "reshape_activations", "metadata", "k",
             "rescale_acts_by_decoder_norm"}  # fmt: skip
V6_METADATA = {"model_name", "hook_name", "hook_head_index", "context_size", "prepend_bos",
               "dataset_path", "sae_lens_version", "seqpos_slice", "model_class_name"}  # fmt: skip
V5_FIELDS = {"architecture", "d_in", "d_sae", "activation_fn_str", "activation_fn_kwargs",
             "apply_b_dec_to_input", "finetuning_scaling_factor", "context_size", "model_name",
             "hook_name", "hook_layer", "hook_head_index", "prepend_bos", "dataset_path",
             "dataset_trust_remote_code", "normalize_activations", "dtype", "device"}  # fmt: skip


def test_the_checkpoint_holds_saelens_files_field_by_field(tmp_path):
    model = sae()
    model.save_pretrained(tmp_path)
    cfg = json.loads((tmp_path / "cfg.json").read_text())
    assert set(cfg) >= V6_FIELDS and set(cfg["metadata"]) >= V6_METADATA and set(cfg) >= V5_FIELDS
    assert (
        cfg["architecture"] == "topk" and cfg["k"] == 4 and cfg["activation_fn_kwargs"] == {"k": 4}
    )
    assert cfg["rescale_acts_by_decoder_norm"] is False  # the norms are folded in
    assert cfg["metadata"]["hook_name"] == cfg["hook_name"] == "blocks.1.hook_resid_post"
    assert cfg["hook_layer"] == 1 and cfg["metadata"]["sae_lens_version"] >= "6"
    assert cfg["normalize_activations"] == "none" and cfg["dtype"] == "float32"
    weights = load_file(str(tmp_path / "sae_weights.safetensors"))
    shapes = {name: tuple(t.shape) for name, t in weights.items()}
    assert shapes == {"W_enc": (16, 64), "b_enc": (64,), "W_dec": (64, 16), "b_dec": (16,)}
    assert all(t.dtype == torch.float32 and t.is_contiguous() for t in weights.values())


def test_saelens_directories_open_in_either_layout(tmp_path):
    """Only SAELens's two files (no glassformer config): read as SAELens 6 writes them, and
    as SAELens 5 did (flat, TopK as an activation function), to the same SAE."""
    model = sae()
    x = torch.randn(8, 16)
    model.save_pretrained(tmp_path / "g")
    v6 = tmp_path / "v6"
    v6.mkdir()
    for name in ("cfg.json", "sae_weights.safetensors"):
        (v6 / name).write_bytes((tmp_path / "g" / name).read_bytes())
    opened = SparseAutoencoder.from_pretrained(v6)
    torch.testing.assert_close(opened(x).reconstruction, model(x).reconstruction, atol=1e-5, rtol=0)
    assert opened.config.hook_name == "blocks.1.hook_resid_post" and opened.config.k == 4
    v5 = tmp_path / "v5"
    v5.mkdir()
    cfg = json.loads((v6 / "cfg.json").read_text())
    flat = {k: cfg[k] for k in V5_FIELDS} | {"architecture": "standard"}  # v5 TopK
    (v5 / "cfg.json").write_text(json.dumps(flat))
    (v5 / "sae_weights.safetensors").write_bytes((v6 / "sae_weights.safetensors").read_bytes())
    old = SparseAutoencoder.from_pretrained(v5)
    assert old.config.architecture == "topk" and old.config.k == 4
    torch.testing.assert_close(old(x).reconstruction, model(x).reconstruction, atol=1e-5, rtol=0)
    # ReLU and JumpReLU SAEs, and an architecture glassformer does not read
    relu = dict(flat, activation_fn_str="relu", activation_fn_kwargs={})
    (v5 / "cfg.json").write_text(json.dumps(relu))
    standard = SparseAutoencoder.from_pretrained(v5)
    expected = ((x - standard.b_dec) @ standard.W_enc + standard.b_enc).relu()
    torch.testing.assert_close(standard.encode(x), expected)
    (v5 / "cfg.json").write_text(json.dumps(dict(cfg, architecture="gated")))
    with pytest.raises(CheckpointError, match="'gated' SAE; glassformer reads topk"):
        SparseAutoencoder.from_pretrained(v5)


@pytest.mark.parametrize(
    "changes, message",
    [(dict(d_in=16.5), "d_in must be a positive integer, got 16.5"),
     (dict(d_sae=True), "d_sae must be a positive integer, got True"),
     (dict(k=0), "k must be a positive integer, got 0")],
)  # fmt: skip
def test_a_config_that_is_no_sae_names_the_value(changes, message):
    with pytest.raises(ValueError, match=message):
        SAEConfig(**{"d_in": 16, "d_sae": 64, **changes})


def _saelens_dir(tmp_path, **changes):
    """The SAELens files of ``sae()``, cfg.json's fields changed (a list value replaces the
    whole document)."""
    path = tmp_path / "saelens"
    sae().save_pretrained(tmp_path / "g")
    path.mkdir()
    (path / "sae_weights.safetensors").write_bytes(
        (tmp_path / "g/sae_weights.safetensors").read_bytes()
    )
    cfg = json.loads((tmp_path / "g/cfg.json").read_text())
    (path / "cfg.json").write_text(changes.pop("document", None) or json.dumps(cfg | changes))
    return path


@pytest.mark.parametrize(
    "changes, message",
    [
        (dict(d_in=float("inf")), "d_in must be a positive integer, got inf"),
        (dict(d_sae=float("nan")), "d_sae must be a positive integer, got nan"),
        (
            dict(metadata={"context_size": 1e309}),
            "context_size must be a positive integer, got inf",
        ),
        (dict(document="[1, 2]"), "not a JSON object"),
        (dict(document="[" * 100_000 + "]" * 100_000), "nested too deeply"),
        (dict(metadata=[1]), "not a JSON object"),
    ],
)
def test_a_saelens_config_no_sae_has_is_one_line(tmp_path, changes, message):
    """Infinity and NaN where sizes belong (int(inf) raised OverflowError), a document that
    is not an object, nested past what Python parses: one line naming cfg.json."""
    path = _saelens_dir(tmp_path, **changes)
    with pytest.raises(CheckpointError, match=message) as e:
        SparseAutoencoder.from_pretrained(path)
    assert str(e.value).startswith(str(path / "cfg.json")) and "\n" not in str(e.value)


LONG = "x" * 100_000  # a value no message should echo whole


def _long_name(path):
    """sae_weights.safetensors: one tensor with a 100,000-character name."""
    from safetensors.torch import save_file

    save_file({LONG: torch.zeros(1)}, str(path / "sae_weights.safetensors"))
    return "holds ['xxx"


def _long_dtype(path):
    """sae_weights.safetensors whose header names a 100,000-character dtype (safetensors'
    own error quotes it whole)."""
    header = json.dumps({"w": {"dtype": LONG, "shape": [1], "data_offsets": [0, 4]}}).encode()
    (path / "sae_weights.safetensors").write_bytes(
        len(header).to_bytes(8, "little") + header + bytes(4)
    )
    return "unknown variant `xxx"


@pytest.mark.parametrize(
    "changes, weights, says, file",
    [
        (dict(architecture=LONG), None, "holds a 'xxx", ""),
        (dict(normalize_activations=LONG), None, "normalize_activations 'xxx", ""),
        (dict(d_in=LONG), None, "d_in must be a positive integer, got 'xxx", "cfg.json"),
        (dict(architecture="topk", k=[LONG]), None, "k must be", "cfg.json"),
        ({}, _long_name, None, "sae_weights.safetensors"),
        ({}, _long_dtype, None, "sae_weights.safetensors"),
    ],
    ids=["architecture", "normalize", "d_in", "k", "tensor-name", "header"],
)
def test_a_long_saelens_value_is_cut_in_the_one_line(tmp_path, changes, weights, says, file):
    """A 100,000-character value in cfg.json or the weights' header was echoed whole: one
    line under 1,000 characters naming the file and the field."""
    path = _saelens_dir(tmp_path, **changes)
    if weights is not None:
        says = weights(path)
    with pytest.raises(CheckpointError) as e:
        SparseAutoencoder.from_pretrained(path)
    message = str(e.value)
    assert "\n" not in message and len(message) < 1000, message[:2000]
    assert str(path / file) in message and says in message, message
    assert "characters)" in message, message


def test_saelens_sizes_the_weights_do_not_hold_are_refused_before_the_sae_is_built(
    tmp_path, builds_on
):
    """cfg.json says d_sae 10^6, the weights hold 64 features: refused from the weights
    file's header, the SAE built on the meta device only (it was built for real first:
    d_in × d_sae twice over, which a larger number turns into a MemoryError)."""
    path = _saelens_dir(tmp_path, d_sae=10**6, k=4)
    devices = builds_on(SparseAutoencoder)
    with pytest.raises(
        CheckpointError, match=r"W_dec is \(64, 16\), but cfg.json \(d_in 16, d_sae 1000000\)"
    ):
        SparseAutoencoder.from_pretrained(path)
    assert devices == ["meta"]


def tiny_lm(tmp_path):
    torch.manual_seed(0)
    tok = CharTokenizer("abcdefghijklmnopqrstuvwxyz .")
    model = GPT(GPTConfig(vocab_size=tok.vocab_size, max_len=64, d_model=32, num_heads=4,
                          num_layers=2, d_ff=64, dropout=0.0)).eval()  # fmt: skip
    path = tmp_path / "lm"
    model.save_pretrained(path, extra_files={"tokenizer.json": tok.to_json().encode()})
    return model, tok, path


def test_splicing_puts_the_reconstruction_in_place(tmp_path):
    """The spliced run's hook point holds the SAE's reconstruction (but at the first
    position, which the SAE skips), and the loss with it is between clean and zero-ablated
    for an SAE that rebuilds well (here: its decoder given the activations' own directions)."""
    model, tok, _ = tiny_lm(tmp_path)
    ids = torch.tensor([tok.encode("the cat sat on the mat and the dog sat on the log")])
    hook = "blocks.1.hook_resid_post"
    acts = hook_activations(model, hook, ids)
    assert acts.shape == (ids.size(1) - 1, 32)
    identity = SparseAutoencoder(SAEConfig(d_in=32, d_sae=64, k=64, architecture="topk",
                                           hook_name=hook, apply_b_dec_to_input=False))  # fmt: skip
    with torch.no_grad():  # features ±e_i: an exact code of any activation
        eye = torch.eye(32)
        identity.W_dec.copy_(torch.cat([eye, -eye]))
        identity.W_enc.copy_(torch.cat([eye, -eye]).T)
        identity.b_enc.zero_()
        identity.b_dec.zero_()
    assert reconstruction_metrics(identity, acts)["explained_variance"] == pytest.approx(
        1.0, abs=1e-6
    )
    losses = spliced_losses(model, identity, ids)
    assert losses["ce_increase"] == pytest.approx(0.0, abs=1e-5)
    assert losses["ce_loss_score"] == pytest.approx(1.0, abs=1e-4)
    seen = {}
    noisy = sae(d_in=32, hook_name=hook)
    with model.hooks([(hook, splice_hook(noisy)), (hook, lambda v, n: seen.__setitem__(n, v))]):
        model(ids)
    with torch.no_grad():
        _, cache = model.run_with_cache(ids, names=[hook])
        expected = noisy(cache[hook]).reconstruction
    torch.testing.assert_close(seen[hook][:, 1:], expected[:, 1:])
    torch.testing.assert_close(seen[hook][:, :1], cache[hook][:, :1])
    assert feature_activations(model, noisy, ids).shape == (ids.size(1), 64)


def test_an_sae_of_another_width_or_hook_is_one_line(tmp_path):
    model, tok, _ = tiny_lm(tmp_path)
    ids = torch.tensor([tok.encode("the cat")])
    with pytest.raises(ValueError, match="reads activations 16 wide .* got 32"):
        spliced_losses(model, sae(), ids)
    with pytest.raises(ValueError, match="no hook point 'blocks.1.hook_resid_pots'"):
        hook_activations(model, "blocks.1.hook_resid_pots", ids)


FAST = ["--block-size", "16", "--batch-size", "64", "--features", "128", "--k", "8",
        "--eval-every", "4", "--log-every", "1", "--threads", "1"]  # fmt: skip


def rows(run):
    lines = (run / "metrics.jsonl").read_text().splitlines()
    return [{k: v for k, v in json.loads(line).items() if k not in ("elapsed_s", "tokens_per_s")}
            for line in lines]  # fmt: skip


def test_train_sae_runs_resumes_exactly_and_opens_in_features(tmp_path, capsys, monkeypatch):
    """`train sae` on a tiny GPT's residual stream: the run directory of every task (metrics,
    loss.png, results.json with the held-out figures, samples.txt, features.png), a checkpoint
    SAELens reads; interrupted and resumed, the same losses as the uninterrupted run; and
    `features` reads the run."""
    _, _, lm = tiny_lm(tmp_path)
    story = tmp_path / "story.txt"
    story.write_text("the cat sat on the mat. the dog sat on the log. " * 120)
    argv = ["train", "sae", "--model", str(lm), "--hook", "blocks.1.hook_resid_post",
            "--data", str(story), "--max-steps", "12", *FAST]  # fmt: skip
    run = tmp_path / "sae"
    assert main([*argv, "--out", str(run)]) == 0
    assert {"checkpoint", "metrics.jsonl", "loss.png", "results.json", "samples.txt",
            "features.png"} <= {p.name for p in run.iterdir()}  # fmt: skip
    results = json.loads((run / "results.json").read_text())
    assert results["test_l0"] <= 8 and 0 < results["test_explained_variance"] <= 1
    assert {"test_ce_clean", "test_ce_spliced", "test_ce_loss_score", "dead_share"} <= set(results)
    assert (run / "checkpoint" / "cfg.json").is_file()
    losses = [r["loss"] for r in rows(run) if r["event"] == "step"]
    assert losses[-1] < losses[0]

    cut = tmp_path / "cut"

    def ctrl_c(event, state, _):
        if event == "step" and state.step == 6:
            raise KeyboardInterrupt

    fit = runner.fit
    monkeypatch.setattr(runner, "fit", lambda *a, **kw: fit(*a, **kw, hooks=(ctrl_c,)))
    assert main([*argv, "--out", str(cut)]) == 130
    monkeypatch.undo()
    assert main(["train", "sae", "--resume", str(cut)]) == 0
    assert rows(cut) == rows(run)
    capsys.readouterr()
    page = tmp_path / "f.html"
    assert main(["features", "--sae", str(run), "the cat sat", "--data", str(story),
                 "--top", "3", "--out", str(page)]) == 0  # fmt: skip
    printed = capsys.readouterr().out
    assert "feature " in printed and "fires most on" in printed
    assert page.read_text().startswith("<!DOCTYPE html>")


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["train", "sae", "--hook", "blocks.0.hook_resid_post"], "model"),
        (["train", "lm", "--hook", "blocks.0.hook_resid_post"], "is for sae"),
        (["train", "sae", "--model", "x", "--hook", "h", "--tokenizer", "char"], "model's own"),
    ],
)
def test_bad_runs_are_one_line(argv, message, capsys):
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and message in err


def test_a_hook_the_model_does_not_have_is_one_line(tmp_path, capsys):
    _, _, lm = tiny_lm(tmp_path)
    argv = ["train", "sae", "--model", str(lm), "--hook", "blocks.1.hook_resid_pots",
            "--max-steps", "1", "--out", str(tmp_path / "s")]  # fmt: skip
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()  # after the line saying the data is being prepared
    assert "Traceback" not in err and err.splitlines()[0] == "preparing data for sae ..."
    assert len(err.splitlines()) == 2 and "did you mean 'blocks.1.hook_resid_post'" in err


def test_features_of_an_sae_on_another_models_width_is_one_line(tmp_path, capsys):
    _, _, lm = tiny_lm(tmp_path)
    sae().save_pretrained(tmp_path / "narrow")  # reads 16 wide; the model's stream is 32
    story = tmp_path / "story.txt"
    story.write_text("the cat sat on the mat. " * 40)
    argv = ["features", "--sae", str(tmp_path / "narrow"), "--model", str(lm), "the cat",
            "--data", str(story), "--out", str(tmp_path / "f.png")]  # fmt: skip
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "reads activations 16 wide" in err, err


def test_top_contexts_from_activations_at_hand_equal_running_the_model(tmp_path):
    from glassformer.inspect.features import top_contexts

    model, tok, _ = tiny_lm(tmp_path)
    noisy = sae(d_in=32)
    windows = torch.tensor([tok.encode("the cat sat on the mat and the dog")] * 3)
    windows[1, 4], windows[2, 7] = tok.encode("x")[0], tok.encode("z")[0]
    acts = hook_activations(model, noisy.config.hook_name, windows)
    found = top_contexts(model, noisy, windows, [3, 17, 40], n=4)
    assert any(found.values())
    assert top_contexts(model, noisy, windows, [3, 17, 40], n=4, activations=acts) == found
