"""`glassformer train` and the commands that use its runs, end to end on tiny files."""

import json

import pytest
import torch

import glassformer.training.runner as runner
from glassformer import GPT, RunConfig, load_checkpoint, load_run
from glassformer.cli import main
from glassformer.inference import fill_mask
from glassformer.kernels.precision import MARGIN

FAST = ["--preset", "tiny", "--eval-every", "4", "--checkpoint-every", "4", "--threads", "1"]


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("data")
    (d / "story.txt").write_text("the cat sat on the mat. the dog sat on the log. " * 200)
    words = [("one", "uno"), ("two", "dos"), ("three", "tres"), ("cat", "gato"), ("dog", "perro")]
    rows = [f"{a} {b}\t{x} {y}" for a, x in words for b, y in words]
    (d / "pairs.tsv").write_text("\n".join(rows * 4) + "\n")
    good = ["a great fun film", "wonderful and moving", "great acting, loved it"]
    bad = ["a dull boring mess", "awful and slow", "boring, hated it"]
    lines = ["text,label"] + [f'"{t}",pos' for t in good * 10] + [f'"{t}",neg' for t in bad * 10]
    (d / "reviews.csv").write_text("\n".join(lines) + "\n")
    return d


def train(task, data, out, *extra):
    return main(["train", task, "--data", str(data), "--out", str(out), *FAST, *extra])


def metrics(run):
    """metrics.jsonl without the wall-clock fields (they differ from one run to the next)."""
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in r.items() if k not in ("elapsed_s", "tokens_per_s")} for r in rows]


def interrupt_after(step: int, monkeypatch) -> None:
    """Make the next `fit` stop as Ctrl-C would after ``step`` (its checkpoint saved)."""

    def ctrl_c(event, state, _):
        if event == "step" and state.step == step:
            raise KeyboardInterrupt

    fit = runner.fit
    monkeypatch.setattr(runner, "fit", lambda *a, **kw: fit(*a, **kw, hooks=(ctrl_c,)))


def test_lm_trains_resumes_with_the_uninterrupted_losses_and_generates(
    files, tmp_path, capsys, monkeypatch
):
    """An interrupted `train lm`, then `--resume`, logs exactly the uninterrupted run's
    losses, learning rates, gradient norms and evaluations (the README's resume claim)."""
    lm = ("--max-steps", "12", "--block-size", "16", "--log-every", "1")
    run = tmp_path / "lm"
    assert train("lm", files / "story.txt", run, *lm) == 0
    printed = capsys.readouterr().out
    assert "held-out: " in printed and "val_loss_full" in printed
    assert {p.name for p in run.iterdir()} >= {
        "checkpoint",
        "metrics.jsonl",
        "loss.png",
        "samples.txt",
        "run.json",
        "results.json",
    }
    assert [r["step"] for r in metrics(run) if r["event"] == "eval"] == [4, 8, 12]

    # the same run, stopped by Ctrl-C after step 6 (its checkpoint is saved as it stops)...
    cut = tmp_path / "cut"
    interrupt_after(6, monkeypatch)
    assert train("lm", files / "story.txt", cut, *lm) == 130
    monkeypatch.undo()
    assert [r["step"] for r in metrics(cut) if r["event"] == "step"] == list(range(1, 7))
    # ...and resumed: every row after the checkpoint equals the uninterrupted run's, exactly
    assert main(["train", "lm", "--resume", str(cut)]) == 0
    assert [r["step"] for r in metrics(cut) if r["event"] == "step"] == list(range(1, 13))
    assert metrics(cut) == metrics(run)
    assert isinstance(load_checkpoint(run), GPT)
    capsys.readouterr()
    assert (
        main(
            [
                "generate",
                "--model",
                str(run),
                "--prompt",
                "the cat",
                "--max-new-tokens",
                "10",
                "--seed",
                "1",
            ]
        )
        == 0
    )
    first = capsys.readouterr().out
    main(
        [
            "generate",
            "--model",
            str(run),
            "--prompt",
            "the cat",
            "--max-new-tokens",
            "10",
            "--seed",
            "1",
        ]
    )
    assert first.startswith("the cat") and capsys.readouterr().out == first
    # greedy with and without the cache, printed whole or streamed: the same text
    greedy = ["generate", "--model", str(run), "--prompt", "the", "--greedy"]
    texts = []
    for extra in ([], ["--no-cache"], ["--no-stream"], ["--repetition-penalty", "1.0"]):
        assert main(greedy + ["--max-new-tokens", "12", *extra]) == 0
        texts.append(capsys.readouterr().out)
    assert len(set(texts)) == 1 and texts[0].startswith("the")
    # a stop token ends the text; a strong repetition penalty changes it
    first_new = texts[0][len("the")]
    assert main(greedy + ["--max-new-tokens", "12", "--stop", first_new]) == 0
    assert capsys.readouterr().out == "the" + first_new + "\n"
    assert main(greedy + ["--max-new-tokens", "12", "--repetition-penalty", "50"]) == 0
    assert capsys.readouterr().out != texts[0]
    assert main(greedy + ["--stop", "cat"]) == 2
    assert "--stop 'cat' must be one token" in capsys.readouterr().err


def test_lm_trains_the_modern_block(files, tmp_path, capsys):
    run = tmp_path / "modern"
    assert train("lm", files / "story.txt", run, "--preset", "llama-tiny", "--max-steps", "3") == 0
    model = load_checkpoint(run / "checkpoint")
    assert isinstance(model, GPT)
    c = model.config
    assert (c.positional, c.norm, c.activation, c.num_kv_heads) == ("rope", "rms", "swiglu", 2)
    assert (
        main(["generate", "--model", str(run), "--prompt", "the cat", "--max-new-tokens", "5"]) == 0
    )


def test_mlm_pretrains_resumes_exactly_and_fills_masks(files, tmp_path, capsys, monkeypatch):
    """`train mlm` on a text file: held-out masked-token accuracy in results.json, a resumed
    run logs the uninterrupted one's rows exactly (the same windows and the same masks), and
    `fill-mask` shows the guesses of the trained model."""
    mlm = ("--max-steps", "8", "--max-len", "16", "--vocab-size", "60", "--log-every", "1")
    run = tmp_path / "mlm"
    assert train("mlm", files / "story.txt", run, *mlm, "--whole-word-mask") == 0
    results = json.loads((run / "results.json").read_text())
    assert 0.0 <= results["val_masked_accuracy_full"] <= 1.0  # a file has no test split
    assert "[MASK] = " in capsys.readouterr().out

    cut = tmp_path / "cut"
    interrupt_after(3, monkeypatch)
    assert train("mlm", files / "story.txt", cut, *mlm, "--whole-word-mask") == 130
    monkeypatch.undo()
    assert main(["train", "mlm", "--resume", str(cut)]) == 0
    assert metrics(cut) == metrics(run)
    capsys.readouterr()
    assert (
        main(["fill-mask", "--model", str(run), "the cat [MASK] on the mat.", "--top-k", "3"]) == 0
    )
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "[MASK] 1:" and len(out) == 5 and out[-1].startswith("the cat ")
    model, tokenizer = load_run(run)
    assert (model.config.positional, model.config.norm_first) == ("sinusoidal", True)
    guesses = fill_mask(model, tokenizer, "the cat [MASK] on the mat.", top_k=3)[0]
    assert [line.split()[1] for line in out[1:4]] == [token for token, _ in guesses]
    assert sum(p for _, p in guesses) <= 1.0 and guesses[0][1] >= guesses[1][1]


def test_translate_trains_and_translates(files, tmp_path, capsys):
    run = tmp_path / "tr"
    assert (
        train("translate", files / "pairs.tsv", run, "--max-steps", "4", "--vocab-size", "60") == 0
    )
    assert "test_bleu" not in capsys.readouterr().out  # a user file has no test split...
    assert "val_bleu" in json.loads((run / "results.json").read_text())  # ...so validation
    assert main(["translate", "--model", str(run), "one cat", "two dogs"]) == 0
    greedy = capsys.readouterr().out.splitlines()
    assert len(greedy) == 2
    # the decoding options: beam search, sampling under a seed, the reference path
    assert main(["translate", "--model", str(run), "--beam", "3", "one cat", "two dogs"]) == 0
    assert len(capsys.readouterr().out.splitlines()) == 2
    sample = ["translate", "--model", str(run), "--sample", "--seed", "3", "one cat", "two dogs"]
    assert main(sample) == 0
    first = capsys.readouterr().out
    assert main(sample) == 0 and capsys.readouterr().out == first
    assert main(["translate", "--model", str(run), "--no-cache", "one cat", "two dogs"]) == 0
    assert capsys.readouterr().out.splitlines() == greedy
    for dtype in ("fp32", "bf16", "int8", "int4"):  # weight-only quantisation too
        assert (
            main(["translate", "--model", str(run), "--dtype", dtype, "one cat", "two dogs"]) == 0
        )
        assert len(capsys.readouterr().out.splitlines()) == 2
    # BLEU of the run's held-out split, for comparing decoding options
    assert main(["translate", "--model", str(run), "--bleu", "validation", "--beam", "2"]) == 0
    assert "sacreBLEU" in capsys.readouterr().out
    assert main(["translate", "--model", str(run), "--bleu", "test"]) == 2
    assert "the run's data has no test split" in capsys.readouterr().err


def test_classify_learns_the_reviews(files, tmp_path, capsys):
    run = tmp_path / "cls"
    assert (
        train(
            "classify",
            files / "reviews.csv",
            run,
            "--max-steps",
            "40",
            "--lr",
            "3e-3",
            "--vocab-size",
            "80",
            "--batch-size",
            "16",
        )
        == 0
    )
    results = json.loads((run / "results.json").read_text())
    assert results["val_examples"] == 6 and results["val_accuracy"] == 1.0  # no test split here
    capsys.readouterr()
    assert main(["classify", "--model", str(run), "great fun", "boring mess"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert [line.split("\t")[0] for line in out] == ["pos", "neg"]


@pytest.mark.parametrize(
    "argv, message",
    [
        (["train", "lm", "--data", "nowhere.txt", "--max-steps", "1"], "nowhere.txt: no such file"),
        (["train", "lm", "--corpus", "wiki", "--max-steps", "1"], "unknown corpus 'wiki'"),
        (["train", "lm", "--corpus", "austen", "--data", "x.txt"], "give --corpus or --data"),
        (["train", "lm", "--resume", "."], "is not a training run"),
        (["generate", "--model", "nowhere"], "nowhere does not exist"),
        (
            ["train", "mlm", "--data", "README.md", "--tokenizer", "bpe", "--max-steps", "1"],
            "needs a tokenizer with a [MASK] token (wordpiece), not 'bpe'",
        ),
        (["train", "mlm", "--mask-prob", "0", "--max-steps", "1"], "--mask-prob must be in (0, 1)"),
    ],
)
def test_user_errors_are_one_line(argv, message, capsys):
    assert main(argv) == 2
    err = capsys.readouterr().err
    errors = [line for line in err.splitlines() if "error:" in line]
    assert len(errors) == 1 and message in errors[0] and "Traceback" not in err


def test_wrong_model_kind_for_the_command(files, tmp_path, capsys):
    run = tmp_path / "lm"
    train("lm", files / "story.txt", run, "--max-steps", "1", "--block-size", "16", "--no-test")
    capsys.readouterr()
    assert main(["classify", "--model", str(run), "hello"]) == 2
    assert "holds a 'gpt' model, expected 'classifier'" in capsys.readouterr().err


@pytest.mark.measures_this_machine
@pytest.mark.parametrize("faster", [True, False])
def test_bf16_warns_only_where_it_measures_slower(faster, files, tmp_path, capsys, monkeypatch):
    from glassformer.kernels import precision

    measured = precision.Measurement(fp32_gflops=200.0, bf16_gflops=400.0 if faster else 100.0)
    monkeypatch.setenv("GLASSFORMER_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(precision, "_measure", lambda *args: measured)
    run = tmp_path / "lm"
    argv = ("--max-steps", "2", "--block-size", "16", "--bf16")
    assert train("lm", files / "story.txt", run, *argv) == 0
    warnings = [line for line in capsys.readouterr().err.splitlines() if "warning:" in line]
    expected = ["warning: --bf16 is slower than fp32 on this machine: bf16 100 ±0% vs fp32 200"]
    assert [w[: len(expected[0])] for w in warnings] == ([] if faster else expected)


@pytest.mark.measures_this_machine
def test_bf16_auto_times_this_machine_and_says_what_it_chose(files, tmp_path, capsys, monkeypatch):
    """The real measurement, logged in the run's output; the run trains with its choice."""
    import re

    monkeypatch.setenv("GLASSFORMER_CACHE", str(tmp_path / "cache"))
    run = tmp_path / "lm"
    argv = ("--max-steps", "2", "--block-size", "16", "--bf16", "auto", "--no-test")
    assert train("lm", files / "story.txt", run, *argv) == 0
    err = capsys.readouterr().err
    found = re.search(
        r"bf16 autocast (on|off) \(--bf16 auto\): bf16 ([\d,.]+) ±\d+% vs fp32 ([\d,.]+)", err
    )
    assert found, err
    bf16, fp32 = (float(found.group(i).replace(",", "")) for i in (2, 3))
    if bf16 / fp32 < MARGIN:  # on: also needs the short runs' losses to agree
        assert found.group(1) == "off"
    if found.group(1) == "on":
        assert bf16 / fp32 >= MARGIN
    assert json.loads((run / "run.json").read_text())["bf16"] == "auto"
    with capsys.disabled():
        print(f"\n--bf16 auto on this machine: {found.group(0)}")


def test_bf16_takes_auto_on_or_off_and_nothing_else(files, tmp_path, capsys):
    with pytest.raises(SystemExit) as exited:
        main(["train", "lm", "--data", str(files / "story.txt"), "--bf16", "maybe"])
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert "argument --bf16: expected auto, on or off, got 'maybe'" in err
    assert "Traceback" not in err


@pytest.mark.slow
def test_a_compiled_run_saves_the_plain_models_keys(files, tmp_path):
    run = tmp_path / "lm"
    assert (
        train("lm", files / "story.txt", run, "--max-steps", "3", "--block-size", "16", "--compile")
        == 0
    )
    model = load_checkpoint(run)
    assert not any("_orig_mod" in k for k in model.state_dict())
    assert isinstance(model, GPT)


@pytest.fixture(scope="module")
def mlm_run(files, tmp_path_factory):
    """A tiny masked-LM pretrained on the story, its tokenizer WordPiece."""
    run = tmp_path_factory.mktemp("pretrained") / "mlm"
    extra = ("--max-steps", "4", "--max-len", "32", "--vocab-size", "80", "--no-test")
    assert train("mlm", files / "story.txt", run, *extra) == 0
    return run


def encoder_state(model):
    return {k: v.clone() for k, v in model.state_dict().items() if not k.startswith("head.")}


def test_classify_init_starts_from_exactly_the_pretrained_encoder(files, mlm_run):
    from glassformer import RunConfig
    from glassformer.training.tasks import build_task

    source, source_tok = load_run(mlm_run)
    config = RunConfig(task="classify", data=str(files / "reviews.csv"), init=str(mlm_run),
                       max_len=32, max_steps=1)  # fmt: skip
    task = build_task(config)
    mine = encoder_state(task.model)
    theirs = {k: v for k, v in source.state_dict().items() if not k.startswith("lm_head.")}
    assert mine.keys() == theirs.keys()
    assert all(torch.equal(mine[k], theirs[k]) for k in mine)
    assert task.tokenizer.to_json() == source_tok.to_json()
    assert task.model.head.out_features == 2


@pytest.mark.parametrize(
    "options, encoder_moves",
    [
        ((), True),
        (("--linear-probe",), False),
        (("--freeze-encoder-steps", "6"), False),  # frozen for the whole (6-step) run
        (("--encoder-lr", "1e-4"), True),
    ],
)
def test_classify_init_fine_tunes_or_freezes_the_encoder(files, mlm_run, tmp_path, options,
                                                         encoder_moves):  # fmt: skip
    run = tmp_path / "clf"
    argv = ("--init", str(mlm_run), "--max-len", "32", "--max-steps", "6", "--no-test")
    assert train("classify", files / "reviews.csv", run, *argv, *options) == 0
    before = encoder_state(build_task_model(files, mlm_run))
    after = encoder_state(load_checkpoint(run))
    moved = any(not torch.equal(before[k], after[k]) for k in before)
    assert moved == encoder_moves
    assert main(["classify", "--model", str(run), "a great fun film"]) == 0


def build_task_model(files, mlm_run):
    from glassformer import RunConfig
    from glassformer.training.tasks import build_task

    config = RunConfig(task="classify", data=str(files / "reviews.csv"), init=str(mlm_run),
                       max_len=32, max_steps=1)  # fmt: skip
    return build_task(config).model


def test_the_encoders_rate_is_its_own_and_zero_while_frozen():
    from glassformer.training.optim import group_lr, make_optimizer

    model = torch.nn.ModuleDict({"encoder": torch.nn.Linear(3, 3), "head": torch.nn.Linear(3, 2)})
    parts = {"encoder.": {"lr_scale": 0.1, "frozen_until": 5}}
    optimizer = make_optimizer(model, lr=1e-3, parts=parts)
    rates = {
        (id(p), step): group_lr(g, 1e-3, step)
        for g in optimizer.param_groups
        for p in g["params"]
        for step in (4, 5)
    }
    enc, head = model["encoder"].weight, model["head"].weight
    assert rates[(id(enc), 4)] == 0.0 and rates[(id(enc), 5)] == pytest.approx(1e-4)
    assert rates[(id(head), 4)] == rates[(id(head), 5)] == 1e-3
    assert sum(len(g["params"]) for g in optimizer.param_groups) == 4


def test_init_errors_are_one_line(files, mlm_run, tmp_path, capsys):
    translator = tmp_path / "translate"
    train("translate", files / "pairs.tsv", translator, "--max-steps", "1", "--no-test")
    reviews = ["train", "classify", "--data", str(files / "reviews.csv"), "--max-steps", "1"]
    cases = [
        (["--init", str(translator)], "holds a 'seq2seq' model; a classifier starts from a"),
        (
            ["--init", str(mlm_run), "--d-model", "64"],
            "gives the model's shape; leave out --d-model",
        ),
        (["--init", str(mlm_run), "--max-len", "64"], "--max-len 64 is longer than --init"),
        (["--linear-probe"], "--linear-probe is for fine-tuning a pretrained encoder: give --init"),
        (["--init", str(mlm_run), "--framework", "keras"], "--init cannot be used with"),
    ]
    capsys.readouterr()
    for extra, message in cases:
        assert main([*reviews, *extra]) == 2, extra
        errors = [line for line in capsys.readouterr().err.splitlines() if "error:" in line]
        assert len(errors) == 1 and message in errors[0], errors
    assert main(["train", "lm", "--init", str(mlm_run), "--max-steps", "1"]) == 2
    assert "--init starts a classifier (classify), not 'lm'" in capsys.readouterr().err


def test_classify_init_from_minilm_reads_minilms_own_features(files):
    """--init all-MiniLM-L6-v2: a BertClassifier whose pooled features (the head's input)
    are MiniLM's sentence embeddings before normalisation, from the same framed ids."""
    from glassformer import BertClassifier, RunConfig, SentenceEncoder
    from glassformer.data.batching import pad_batch
    from glassformer.inference import classifier_inputs
    from glassformer.training.tasks import build_task

    config = RunConfig(task="classify", data=str(files / "reviews.csv"), init="all-MiniLM-L6-v2",
                       max_len=32, max_steps=1)  # fmt: skip
    task = build_task(config)
    model, tok = task.model.eval(), task.tokenizer
    assert isinstance(model, BertClassifier) and model.config.num_layers == 6
    minilm = SentenceEncoder.from_pretrained("all-MiniLM-L6-v2")
    texts = ["a great fun film, I loved every minute", "awful and slow"]
    rows = classifier_inputs(model, tok, texts, 32)
    assert rows == minilm.tokenize(texts)  # [CLS] ... [SEP]
    seen = []
    model.head.register_forward_hook(lambda m, args, out: seen.append(args[0]))
    with torch.no_grad():
        model(pad_batch(rows, tok.pad_id))
    features = torch.nn.functional.normalize(seen[0], dim=-1)
    torch.testing.assert_close(features, minilm.encode(texts), rtol=0, atol=1e-5)


def test_classify_init_from_minilm_trains_saves_and_classifies(files, tmp_path, capsys):
    run = tmp_path / "minilm-clf"
    argv = ("--init", "all-MiniLM-L6-v2", "--max-len", "32", "--max-steps", "3")
    assert train("classify", files / "reviews.csv", run, *argv, "--encoder-lr", "5e-5") == 0
    capsys.readouterr()
    assert main(["classify", "--model", str(run), "a great fun film"]) == 0
    label, p, text = capsys.readouterr().out.strip().split("\t")
    assert label in ("pos", "neg") and 0.5 <= float(p) <= 1.0 and text == "a great fun film"
    assert load_checkpoint(run).kind == "bert_classifier"


def test_classify_init_from_a_hugging_face_bert_directory(files, tmp_path, capsys):
    transformers = pytest.importorskip("transformers")
    words = "a great fun film wonderful and moving acting , loved it dull boring mess awful slow"
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *sorted(set(words.split()))]
    bert = tmp_path / "bert"
    torch.manual_seed(0)
    config = transformers.BertConfig(vocab_size=len(vocab), hidden_size=32, num_hidden_layers=2,
                                     num_attention_heads=4, intermediate_size=64,
                                     max_position_embeddings=40)  # fmt: skip
    transformers.BertModel(config).save_pretrained(bert)
    (bert / "vocab.txt").write_text("\n".join(vocab) + "\n")
    run = tmp_path / "clf"
    assert train("classify", files / "reviews.csv", run, "--init", str(bert), "--max-len", "32",
                 "--max-steps", "2") == 0  # fmt: skip
    model = load_checkpoint(run)
    assert model.kind == "bert_classifier" and model.config.num_layers == 2
    capsys.readouterr()
    assert main(["classify", "--model", str(run), "a great fun film"]) == 0
    assert capsys.readouterr().out.split("\t")[0] in ("pos", "neg")


def test_classify_init_from_an_lm_run_reads_the_last_real_token(files, tmp_path, capsys):
    """--init RUN of `train lm`: a GPTClassifier with exactly the run's embeddings and blocks,
    whose head reads each text's last real token (right padding leaves it unchanged)."""
    from glassformer import GPTClassifier, RunConfig
    from glassformer.data.batching import pad_batch
    from glassformer.training.tasks import build_task

    lm = tmp_path / "lm"
    train("lm", files / "story.txt", lm, "--max-steps", "2", "--block-size", "32", "--no-test")
    source, tok = load_run(lm)
    config = RunConfig(task="classify", data=str(files / "reviews.csv"), init=str(lm),
                       max_len=32, max_steps=1, tokenizer="char")  # fmt: skip
    model = build_task(config).model.eval()
    assert isinstance(model, GPTClassifier)
    mine, theirs = model.state_dict(), source.state_dict()
    shared = [k for k in theirs if not k.startswith("lm_head.")]
    assert all(torch.equal(mine[k], theirs[k]) for k in shared) and "lm_head.weight" not in mine
    texts = [tok.encode("a great fun film"), tok.encode("awful")]
    with torch.no_grad():
        batched = model(pad_batch(texts, tok.pad_id)).logits
        alone = torch.cat([model(torch.tensor([t])).logits for t in texts])
    torch.testing.assert_close(batched, alone, atol=1e-5, rtol=0)
    run = tmp_path / "clf"
    assert train("classify", files / "reviews.csv", run, "--init", str(lm), "--max-len", "32",
                 "--max-steps", "3", "--tokenizer", "char") == 0  # fmt: skip
    capsys.readouterr()
    assert main(["classify", "--model", str(run), "a great fun film"]) == 0
    assert capsys.readouterr().out.split("\t")[0] in ("pos", "neg")


def test_classify_arch_gpt_trains_a_gpt_shaped_classifier_from_random_weights(
    files, tmp_path, capsys
):
    """--arch gpt: the demo's classifier in one command (no language-model detour): causal
    pre-norm blocks of the GPT classifier's small preset, the head on the last real token."""
    from glassformer import GPTClassifier

    run = tmp_path / "gpt-clf"
    assert train("classify", files / "reviews.csv", run, "--arch", "gpt", "--preset", "small",
                 "--max-steps", "40", "--lr", "3e-3", "--vocab-size", "80",
                 "--batch-size", "16") == 0  # fmt: skip
    capsys.readouterr()
    model, _ = load_run(run)
    assert isinstance(model, GPTClassifier) and model.config.pooling == "last"
    assert (model.config.num_layers, model.config.d_model, model.config.d_ff) == (2, 128, 256)
    assert all(block.attn.causal for block in model.blocks)
    assert json.loads((run / "results.json").read_text())["val_accuracy"] == 1.0
    assert main(["classify", "--model", str(run), "great fun", "boring mess"]) == 0
    assert [line.split("\t")[0] for line in capsys.readouterr().out.splitlines()] == ["pos", "neg"]


def test_out_creates_the_run_folder_and_at_most_its_parent(files, tmp_path, capsys, monkeypatch):
    """A typo deep in --out once grew a tree of folders silently; now the run folder and
    at most its parent are created, and a deeper path is refused before any work."""
    monkeypatch.setattr(runner, "build_task", lambda *a, **kw: pytest.fail("did work first"))
    deep = tmp_path / "exp" / "2024" / "run1"
    assert train("lm", files / "story.txt", deep, "--max-steps", "2") == 2
    err = capsys.readouterr().err.strip()
    assert err == (
        f"glassformer train: error: cannot write {deep}: {tmp_path / 'exp'} does not exist "
        f"(glassformer creates the output folder and at most its parent; create "
        f"{tmp_path / 'exp'} first)"
    )
    assert not (tmp_path / "exp").exists()
    monkeypatch.undo()
    ok = tmp_path / "runs" / "demo"
    small = ("--max-steps", "2", "--block-size", "16", "--d-model", "32", "--num-layers", "1")
    assert train("lm", files / "story.txt", ok, *small, "--no-test") == 0
    assert (ok / "run.json").is_file()


@pytest.mark.parametrize(
    "field, text, says",
    [
        ("processes", "Infinity", "processes is inf, not"),  # once an OverflowError traceback
        ("processes", "NaN", "processes is nan, not"),
        ("processes", '"two"', "processes is 'two', not"),
        ("processes", "0", "processes is 0, not"),
        ("lr", "Infinity", "lr is inf, not finite"),
        ("lr", "NaN", "lr is nan, not finite"),
        ("lr", "1e999", "lr is inf, not finite"),
        ("max_steps", "9" * 5000, "is not valid JSON"),  # past int()'s 4300 digits
        ("corpus", "[" * 100_000 + "]" * 100_000, "nested too deeply"),  # a RecursionError
    ],
)
def test_a_hostile_run_json_is_one_line_naming_it(field, text, says, tmp_path, capsys):
    run = tmp_path / "run"
    run.mkdir()
    values = {**RunConfig(task="lm", data="story.txt").to_dict(), "processes": 1}
    saved = f'"{field}": {json.dumps(values[field])}'
    (run / "run.json").write_text(json.dumps(values).replace(saved, f'"{field}": {text}'))
    assert main(["train", "lm", "--resume", str(run)]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and str(run / "run.json") in err and says in err, err
