"""The training loop: exact accumulation, schedules, exact resume, failure on NaN."""

import math

import pytest
import torch

from glassformer import GPT, GPTConfig, Seq2SeqConfig, Seq2SeqTransformer, load_checkpoint
from glassformer.training import Schedule, TrainConfig, loss_for, make_optimizer, train
from glassformer.training.run import Checkpointer, MetricsLog, plot_loss, read_metrics, restore


class CountingBatches:
    """A resumable endless stream: batch i is a pure function of (seed, i)."""

    def __init__(self, make, seed=0):
        self.make, self.seed, self.i = make, seed, 0

    def __iter__(self):
        return self

    def __next__(self):
        batch = self.make(torch.Generator().manual_seed(self.seed * 100_003 + self.i))
        self.i += 1
        return batch

    def state_dict(self):
        return {"i": self.i}

    def load_state_dict(self, state):
        self.i = state["i"]


def lm_batch(g, B=4, T=16, V=20):
    ids = torch.randint(3, V, (B, T + 1), generator=g)
    return ids[:, :-1], ids[:, 1:]


def tiny_gpt(dropout=0.0, seed=0):
    torch.manual_seed(seed)
    return GPT(
        GPTConfig(vocab_size=20, max_len=16, d_model=32, num_heads=4, num_layers=2, dropout=dropout)
    )


def padded_pairs(g, n=6):
    """Source/target pairs with different numbers of real tokens per row."""
    src = torch.randint(3, 15, (n, 7), generator=g)
    tgt = torch.randint(3, 15, (n, 6), generator=g)
    for i in range(n):
        src[i, 2 + i % 5 :] = 0
        tgt[i, 1 + (i * 2) % 5 :] = 0
    tgt_in = torch.cat([torch.ones(n, 1, dtype=torch.long), tgt[:, :-1]], dim=1)
    return src, tgt_in, tgt


def test_accumulating_k_micro_batches_equals_one_big_batch():
    torch.manual_seed(0)
    cfg = Seq2SeqConfig.preset("tiny", src_vocab_size=15, tgt_vocab_size=15, dropout=0.0)
    big, small = Seq2SeqTransformer(cfg), Seq2SeqTransformer(cfg)
    small.load_state_dict(big.state_dict())
    src, tgt_in, labels = padded_pairs(torch.Generator().manual_seed(1))
    counts = [(labels[i : i + 2] != 0).sum().item() for i in range(0, 6, 2)]
    assert len(set(counts)) > 1  # the micro-batches really hold different token counts
    micro = [(src[i : i + 2], tgt_in[i : i + 2], labels[i : i + 2]) for i in range(0, 6, 2)]
    loss_fn = loss_for("translate", label_smoothing=0.1)
    schedule = Schedule("constant", lr=1e-2, warmup=0)
    for model, batches, accumulation in ((big, [(src, tgt_in, labels)], 1), (small, micro, 3)):
        # SGD: the update is the gradient itself (Adam would blow rounding noise up to ±lr
        # for parameters whose true gradient is zero, such as the key bias).
        opt = torch.optim.SGD(model.parameters(), lr=1.0)
        config = TrainConfig(max_steps=1, accumulation=accumulation, clip_norm=None)
        train(model, opt, schedule, iter(batches), loss_fn, config)
    for a, b in zip(big.state_dict().values(), small.state_dict().values(), strict=True):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-5)


def test_noam_schedule_is_the_papers_formula():
    s = Schedule("noam", lr=1.0, warmup=4000, d_model=512)
    for step in (0, 99, 3999, 4000, 20000):
        n = step + 1
        assert s.lr_at(step) == pytest.approx(512**-0.5 * min(n**-0.5, n * 4000**-1.5))
    peak = max(range(8000), key=s.lr_at)
    assert peak in (3998, 3999)


def test_cosine_schedule_warms_up_then_decays_to_the_floor():
    s = Schedule("cosine", lr=1e-3, warmup=10, total_steps=110, min_lr=1e-4)
    assert s.lr_at(0) == pytest.approx(1e-4)
    assert s.lr_at(9) == pytest.approx(1e-3)
    assert s.lr_at(59) == pytest.approx(1e-4 + 0.5 * 9e-4)
    assert s.lr_at(109) == pytest.approx(1e-4)
    assert s.lr_at(500) == pytest.approx(1e-4)


def run_steps(run_dir, steps, *, resume, checkpoint_every=3, dropout=0.1):
    """Train a tiny GPT with dropout (so RNG state matters) to ``steps`` steps; return losses."""
    model = tiny_gpt(dropout=dropout)
    batches = CountingBatches(lm_batch, seed=7)
    opt = make_optimizer(model, "adamw", lr=3e-3)
    state = None
    if resume:
        model = load_checkpoint(run_dir)
        opt = make_optimizer(model, "adamw", lr=3e-3)
        state = restore(run_dir, opt, batches)
    losses = []
    hooks = (
        lambda event, st, m: losses.append(m["loss"]) if event == "step" else None,
        Checkpointer(run_dir, model, opt, batches, every=checkpoint_every, extra_files={}),
    )
    schedule = Schedule("cosine", lr=3e-3, warmup=2, total_steps=10)
    train(
        model,
        opt,
        schedule,
        batches,
        loss_for("lm"),
        TrainConfig(max_steps=steps),
        state=state,
        hooks=hooks,
    )
    return losses


def test_resume_continues_with_the_same_losses(tmp_path):
    straight = run_steps(tmp_path / "a", 10, resume=False)
    # The "crashed" run stopped after step 6 (its last checkpoint), then resumed.
    first = run_steps(tmp_path / "b", 6, resume=False)
    second = run_steps(tmp_path / "b", 10, resume=True)
    assert first == straight[:6]
    assert len(second) == 4
    torch.testing.assert_close(torch.tensor(second), torch.tensor(straight[6:]), atol=0, rtol=0)


def test_non_finite_loss_stops_with_the_step_named():
    model = tiny_gpt()
    calls = {"n": 0}

    def loss_fn(model, batch):
        calls["n"] += 1
        loss, count = loss_for("lm")(model, batch)
        return (loss * math.nan if calls["n"] == 3 else loss), count

    opt = make_optimizer(model, "adam", lr=1e-3)
    with pytest.raises(FloatingPointError, match="loss is nan at step 3"):
        train(
            model,
            opt,
            Schedule("constant", lr=1e-3, warmup=0),
            CountingBatches(lm_batch),
            loss_fn,
            TrainConfig(max_steps=5),
        )


def test_bf16_autocast_trains_and_evaluates(tmp_path):
    model = tiny_gpt()
    fixed = lm_batch(torch.Generator().manual_seed(0))
    opt = make_optimizer(model, "adamw", lr=1e-2)
    log = MetricsLog(tmp_path / "metrics.jsonl", every=1)

    def evaluate(m):
        loss, count = loss_for("lm")(m, fixed)
        return {"val_loss": loss.item() / count}

    state = train(
        model,
        opt,
        Schedule("constant", lr=1e-2, warmup=0),
        iter([fixed] * 40),
        loss_for("lm"),
        TrainConfig(max_steps=40, bf16=True, eval_every=20),
        evaluate=evaluate,
        hooks=(log,),
    )
    rows = read_metrics(tmp_path / "metrics.jsonl")
    assert [r["step"] for r in rows if r["event"] == "eval"] == [20, 40]
    assert state.history[-1]["val_loss"] < 0.5 * rows[0]["loss"]
    png = plot_loss(tmp_path / "metrics.jsonl", tmp_path / "loss.png")
    assert png.stat().st_size > 5000


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(), "give max_steps or minutes"),
        (dict(max_steps=0), "max_steps must be a positive integer, got 0"),
        (dict(minutes=-1), "minutes must be > 0, got -1"),
        (dict(max_steps=1, accumulation=0), "accumulation must be a positive integer, got 0"),
    ],
)
def test_bad_train_config(kwargs, message):
    with pytest.raises(ValueError, match=message):
        TrainConfig(**kwargs)


def test_mlm_loss_scores_only_the_masked_positions():
    """The masked-LM loss is the cross-entropy of the full model's logits at the masked
    positions, summed; the logits it computes are those rows only (labelled_only)."""
    from glassformer import EncoderLM, EncoderLMConfig
    from glassformer.data.masking import mask_tokens

    torch.manual_seed(0)
    model = EncoderLM(EncoderLMConfig.preset("tiny", vocab_size=50, max_len=24, dropout=0.0))
    ids = torch.randint(5, 50, (3, 24))
    inputs, labels = mask_tokens(ids, mask_id=4, vocab_size=50, special_ids=[0, 1, 2, 3])
    loss, count = loss_for("mlm")(model, (inputs, labels))
    full = model(inputs).logits  # (B, T, V)
    scored = labels != -100
    expected = torch.nn.functional.cross_entropy(full[scored], labels[scored], reduction="sum")
    assert count == int(scored.sum()) and 0 < count < ids.numel()
    torch.testing.assert_close(loss, expected, rtol=1e-6, atol=1e-5)
    rows = model(inputs, labels=labels, labelled_only=True).logits
    torch.testing.assert_close(rows, full[scored], rtol=1e-6, atol=1e-6)
