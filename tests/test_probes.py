"""Probes and steering (glassformer.inspect.probes): the logistic regression equals
scikit-learn's LogisticRegression on the same features; the features are the hook's own
values, padded texts the same as alone; a planted label is found at every layer; the class
difference is the steering vector, and adding it at alpha 0 is no hook at all, to the bit;
the probes file, `glassformer probe`, `generate --steer`; bad input in one line."""

from __future__ import annotations

import pytest
import torch

from glassformer import GPT, GPTConfig
from glassformer.cli import main
from glassformer.data.tokenizers import CharTokenizer
from glassformer.inspect.probes import (
    add,
    fit_logistic,
    projections,
    read_vector,
    steering_vector,
    text_features,
    train_probe,
)

TOK = CharTokenizer("abcdefghijklmnopqrstuvwxyz .,")


def tiny() -> GPT:
    torch.manual_seed(0)
    return GPT(GPTConfig(vocab_size=TOK.vocab_size, max_len=64, d_model=32, num_heads=4,
                         num_layers=2, d_ff=64, dropout=0.0)).eval()  # fmt: skip


def labelled(n: int, seed: int) -> list[tuple[str, str]]:
    """Texts of random words; the "yes" ones hold more x's and z's than the "no" ones."""
    g = torch.Generator().manual_seed(seed)
    rows = []
    for i in range(n):
        label = ("no", "yes")[i % 2]
        letters = "abcdefghijklmnopqrstuvw" + ("xzxzxz" if label == "yes" else "")
        length = int(torch.randint(8, 30, (1,), generator=g))
        picks = torch.randint(0, len(letters), (length,), generator=g).tolist()
        rows.append(("".join(letters[k] for k in picks), label))
    return rows


def test_the_logistic_regression_equals_scikit_learns():
    linear = pytest.importorskip("sklearn.linear_model")
    g = torch.Generator().manual_seed(0)
    x = torch.randn(300, 12, generator=g, dtype=torch.float64)
    y = ((x @ torch.randn(12, generator=g, dtype=torch.float64) + 0.3 * torch.randn(
        300, generator=g, dtype=torch.float64)) > 0.4).long()  # fmt: skip
    for c in (0.01, 1.0, 100.0):
        w, b = fit_logistic(x, y, c)
        theirs = linear.LogisticRegression(C=c, tol=1e-12, max_iter=100_000).fit(x, y)
        ours = torch.sigmoid(x @ w + b)
        torch.testing.assert_close(ours, torch.tensor(theirs.predict_proba(x)[:, 1]),
                                   atol=1e-6, rtol=0)  # fmt: skip


def test_features_are_the_hooks_own_values_and_padding_changes_none():
    model = tiny()
    texts = ["the cat sat", "a much longer text than that one", "b"]
    found = text_features(model, TOK, texts, "blocks.*.hook_resid_post", max_tokens=20)
    assert list(found) == ["blocks.0.hook_resid_post", "blocks.1.hook_resid_post"]
    for i, text in enumerate(texts):
        ids = torch.tensor([TOK.encode(text)[-20:]])
        _, cache = model.run_with_cache(ids, names=["blocks.1.hook_resid_post"])
        alone = cache["blocks.1.hook_resid_post"][0]
        torch.testing.assert_close(found["blocks.1.hook_resid_post"][i], alone.mean(0),
                                   atol=1e-6, rtol=0)  # fmt: skip
    last = text_features(model, TOK, texts, ["hook_embed"], features="last", max_tokens=20)
    assert torch.equal(last["hook_embed"][2], model.embed.weight[TOK.encode("b")[0]].detach())


def test_a_planted_label_is_found_and_the_probabilities_are_scikit_learns():
    linear = pytest.importorskip("sklearn.linear_model")
    model = tiny()
    train, test = labelled(120, 0), labelled(60, 1)
    probes = train_probe(model, TOK, train, test, hook="blocks.*.hook_resid_post", c=0.5)
    assert probes.best.accuracy >= 0.9 and probes.best.labels == ("no", "yes")
    probe = probes.probes["blocks.1.hook_resid_post"]
    x = text_features(model, TOK, [t for t, _ in train + test], [probe.hook])[probe.hook].double()
    z = (x - probe.mean) / probe.scale
    y = torch.tensor([label == "yes" for _, label in train]).long()
    theirs = linear.LogisticRegression(C=0.5, tol=1e-12, max_iter=100_000).fit(z[:120], y)
    torch.testing.assert_close(probe.probabilities(x[120:]),
                               torch.tensor(theirs.predict_proba(z[120:])[:, 1]),
                               atol=1e-4, rtol=0)  # fmt: skip


def test_steering_adds_the_class_difference_and_alpha_zero_is_no_hook():
    model = tiny()
    train = labelled(40, 0)
    hook = "blocks.0.hook_resid_post"
    yes = [t for t, label in train if label == "yes"]
    no = [t for t, label in train if label == "no"]
    vector = steering_vector(model, TOK, yes, no, hook)
    probes = train_probe(model, TOK, train, hook=hook)
    torch.testing.assert_close(vector, probes.differences[hook], atol=1e-5, rtol=0)
    ids = torch.tensor([TOK.encode("the cat sat on")])
    plain = model(ids).logits
    with model.hooks([(hook, add(vector, 0.0))]):
        assert torch.equal(model(ids).logits, plain)
    _, cache = model.run_with_cache(ids, names=[hook])
    with model.hooks([(hook, add(vector, 3.0))]):
        _, moved = model.run_with_cache(ids, names=[hook])
    torch.testing.assert_close(moved[hook] - cache[hook], 3.0 * vector.expand_as(cache[hook]))
    wrong = pytest.raises(ValueError, match="the vector has 5 values; blocks.0.hook_resid_post")
    with wrong, model.hooks([(hook, add(torch.ones(5), 1.0))]):
        model(ids)


def test_probe_and_generate_steer_from_the_command_line(tmp_path, capsys):
    model = tiny()
    lm = tmp_path / "lm"
    model.save_pretrained(lm, extra_files={"tokenizer.json": TOK.to_json().encode()})
    data = tmp_path / "texts.csv"
    data.write_text("text,label\n" + "".join(f"{t},{label}\n" for t, label in labelled(80, 0)))
    out = tmp_path / "p.safetensors"
    argv = ["probe", "--model", str(lm), "--csv", str(data), "--train", "60", "--test", "20",
            "--out", str(out)]  # fmt: skip
    assert main(argv) == 0
    printed = capsys.readouterr().out
    assert "blocks.1.hook_resid_post" in printed and "best: " in printed
    hook, vector, meta = read_vector(out)
    assert meta["model"] == str(lm) and meta["labels"] == ["no", "yes"] and vector.shape == (32,)
    assert hook == max(meta["accuracy"], key=lambda h: meta["accuracy"][h])
    common = ["generate", "--model", str(lm), "--prompt", "the ", "--max-new-tokens", "12",
              "--seed", "3", "--no-stream"]  # fmt: skip
    texts = {}
    for alpha in ("0", "40"):
        assert main([*common, "--steer", str(out), "--alpha", alpha]) == 0
        texts[alpha] = capsys.readouterr()
    assert main(common) == 0
    assert capsys.readouterr().out == texts["0"].out  # alpha 0: as if not steered
    assert texts["40"].out != texts["0"].out and "steering: 40.0 ×" in texts["40"].err


def test_the_projection_track_is_each_tokens_side_of_the_class_difference(tmp_path):
    """Averaged over a text's tokens, each hook's projection is the text's mean feature
    measured from the training mean along the unit class difference; its sign tells the
    held-out texts' labels apart as the probe does."""
    model = tiny()
    probes = train_probe(model, TOK, labelled(120, 0), labelled(40, 1),
                         hook="blocks.*.hook_resid_post", c=0.5)  # fmt: skip
    path = probes.save(tmp_path / "p.safetensors")
    right = 0
    for text, label in labelled(40, 2):
        found = projections(model, torch.tensor([TOK.encode(text)]), path)
        assert found["hooks"] == list(probes.probes) and found["labels"] == ["no", "yes"]
        assert found["best"] == probes.best.hook
        for h, hook in enumerate(found["hooks"]):
            mean = text_features(model, TOK, [text], [hook], max_tokens=64)[hook][0]
            d = probes.differences[hook]
            expected = float((mean - probes.probes[hook].mean.float()) @ (d / d.norm()))
            assert float(found["values"][h].mean()) == pytest.approx(expected, abs=1e-4)
        right += (float(found["values"][-1].mean()) > 0) == (label == "yes")
    assert right >= 30  # of 40 (33 seen): the side of the mean is mostly the label


def test_attention_vector_writes_the_directions_page(tmp_path, capsys):
    model = tiny()
    lm = tmp_path / "lm"
    model.save_pretrained(lm, extra_files={"tokenizer.json": TOK.to_json().encode()})
    probes = train_probe(model, TOK, labelled(60, 0), labelled(20, 1), hook="hook_embed")
    path = probes.save(tmp_path / "p.safetensors")
    out = tmp_path / "d.html"
    argv = ["attention", "--model", str(lm), "the cat sat", "--out", str(out)]
    assert main([*argv, "--vector", str(path)]) == 0
    assert "directions" in out.read_text() and out.stat().st_size > 0
    for extra, message in (
        (["--vector", str(path), "--vector-hook", "blocks.0.hook_q"], "holds no vector at"),
        (["--vector-hook", "hook_embed"], "give --vector FILE"),
    ):
        assert main([*argv, *extra]) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and message in err, err
    assert main([*argv[:-1], str(tmp_path / "a.png"), "--vector", str(path)]) == 2
    assert "for the page" in capsys.readouterr().err


def test_a_hostile_probes_file_is_refused_in_one_line(tmp_path):
    """Metadata that is not what glassformer probe writes, a vector of another width, a
    hook the model does not have: one line each, never a traceback or a half page."""
    import json

    from safetensors.torch import save_file

    model = tiny()
    ids = torch.tensor([TOK.encode("the cat")])
    cases = {
        "no hooks": ({"accuracy": {}}, {}, "not a probes file written by"),
        "hooks not strings": ({"hooks": [1, 2]}, {}, "not a probes file written by"),
        "accuracy a list": ({"hooks": ["hook_embed"], "accuracy": [0.5]}, {}, "not a probes"),
        "wrong width": (
            {"hooks": ["hook_embed"]},
            {"hook_embed.difference": torch.ones(5), "hook_embed.mean": torch.ones(5)},
            "has 5 values; the model's hook_embed is 32",
        ),
        "unknown hook": (
            {"hooks": ["blocks.9.hook_resid_post"]},
            {
                "blocks.9.hook_resid_post.difference": torch.ones(32),
                "blocks.9.hook_resid_post.mean": torch.ones(32),
            },
            "no hook point",
        ),
        "no vectors": ({"hooks": ["hook_embed"]}, {"x": torch.ones(1)}, "no class difference"),
    }
    for name, (meta, tensors, message) in cases.items():
        path = tmp_path / f"{name}.safetensors"
        save_file(tensors or {"x": torch.ones(1)}, str(path),
                  metadata={"glassformer": json.dumps(meta)})  # fmt: skip
        with pytest.raises(ValueError, match=message):
            projections(model, ids, path)


def test_bad_input_is_one_line(tmp_path, capsys):
    model = tiny()
    with pytest.raises(ValueError, match="no hook point matches 'blocks.\\*.hook_nope'"):
        text_features(model, TOK, ["abc"], "blocks.*.hook_nope")
    with pytest.raises(ValueError, match="a probe learns two labels; the training texts have 3"):
        train_probe(model, TOK, [("a", "x"), ("b", "y"), ("c", "z")])
    with pytest.raises(ValueError, match="text 1 has no tokens"):
        text_features(model, TOK, ["abc", ""], "hook_embed")
    with pytest.raises(ValueError, match="features must be one of mean, last"):
        text_features(model, TOK, ["abc"], "hook_embed", features="max")
    (tmp_path / "junk.safetensors").write_bytes(b"not a file at all")
    with pytest.raises(ValueError, match="is not a probes file"):
        read_vector(tmp_path / "junk.safetensors")
    lm = tmp_path / "lm"
    model.save_pretrained(lm, extra_files={"tokenizer.json": TOK.to_json().encode()})
    data = tmp_path / "t.csv"
    data.write_text("text\nabc\n")
    assert main(["probe", "--model", str(lm), "--csv", str(data)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "label" in err
