"""The three training tasks: where their data comes from, how it is batched and scored.

Each task turns options (a corpus name or the user's file, a tokenizer kind, a preset)
into a ``Task``: the tokenizer, the model, the resumable training batches, the evaluation
and a function that shows a person what the model does. The training loop and the run
directory know nothing of tasks; the CLI joins them.
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from glassformer.models import (
    GPT,
    ClassifierConfig,
    GPTConfig,
    PretrainedModel,
    Seq2SeqConfig,
    Seq2SeqTransformer,
    TransformerClassifier,
)
from glassformer.training.evaluation import (
    bleu,
    classify_texts,
    device_of,
    mean_loss,
    score,
    translate_texts,
    truncate,
)
from glassformer.training.losses import loss_for

TASKS = ("lm", "translate", "classify")
DEFAULT_CORPUS = {"lm": "austen", "translate": "bible-en-es", "classify": "imdb"}
DEFAULT_TOKENIZER = {"lm": "char", "translate": "bpe", "classify": "wordpiece"}


@dataclass
class DataOptions:
    """Where the text comes from and how it becomes token ids."""

    task: str
    corpus: str | None = None  # a bundled corpus name
    data: str | None = None  # or the user's file
    tokenizer: str | None = None  # "char" | "bpe" | "wordpiece"; per-task default
    vocab_size: int = 8000  # for bpe / wordpiece
    lowercase: bool = False  # lower-case text before tokenizing (WordPiece also strips accents)
    src_column: str | int = 0
    tgt_column: str | int = 1
    text_column: str | int = "text"
    label_column: str | int = "label"
    validation_fraction: float = 0.1  # of a user's file, held out
    max_examples: int | None = None  # cap the training examples (quick runs)

    def __post_init__(self) -> None:
        if self.task not in TASKS:
            raise ValueError(f"task must be one of {list(TASKS)}, got {self.task!r}")
        if self.corpus and self.data:
            raise ValueError("give --corpus or --data, not both")
        if not self.data and not self.corpus:
            self.corpus = DEFAULT_CORPUS[self.task]
        self.tokenizer = self.tokenizer or DEFAULT_TOKENIZER[self.task]
        if not 0.0 < self.validation_fraction < 0.5:
            raise ValueError(
                f"validation fraction must be in (0, 0.5), got {self.validation_fraction}"
            )


@dataclass
class Task:
    """Everything the CLI needs to train and show one task."""

    name: str
    tokenizer: Any
    model: PretrainedModel
    batches: Any  # endless iterator with state_dict()/load_state_dict()
    loss_fn: Callable[[nn.Module, Any], tuple[torch.Tensor, int]]
    evaluate: Callable[[nn.Module], dict[str, float]]
    show: Callable[[nn.Module], str]
    unit: str = "tok"  # what tokens_per_s counts
    extra_files: dict[str, bytes] = field(default_factory=dict)
    description: str = ""
    test: Callable[[nn.Module], dict[str, float]] | None = None  # held-out figures, at the end


def load_splits(opts: DataOptions):
    """(train, validation, test) for the task, from the bundled corpus or the user's file."""
    from glassformer.data import corpora, files

    if opts.corpus:
        s = corpora.load_corpus(opts.corpus, opts.task)
        return s.train, s.validation, s.test, s.description
    if opts.task == "lm":
        text = files.read_text(opts.data)
        cut = int(len(text) * (1 - opts.validation_fraction))
        return text[:cut], text[cut:], "", f"{opts.data}: {len(text):,} characters"
    if opts.task == "translate":
        rows = files.read_pairs(opts.data, src_column=opts.src_column, tgt_column=opts.tgt_column)
    else:
        rows = files.read_labelled(
            opts.data, text_column=opts.text_column, label_column=opts.label_column
        )
    rows = list(rows)
    random.Random(0).shuffle(rows)  # a fixed split of the user's rows
    n_val = max(1, int(len(rows) * opts.validation_fraction))
    if len(rows) < 2:
        raise ValueError(f"{opts.data} has {len(rows)} usable row(s); need at least 2")
    return rows[n_val:], rows[:n_val], [], f"{opts.data}: {len(rows):,} rows"


def _tokenizer_bytes(tokenizer) -> bytes:
    import tempfile
    from pathlib import Path

    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "tokenizer.json"
        tokenizer.save(path)
        return path.read_bytes()


# ---- language modelling ---------------------------------------------------------------


def lm_task(
    opts: DataOptions,
    *,
    preset: str,
    block_size: int,
    batch_size: int,
    seed: int,
    model_overrides: dict[str, Any],
    rank: int = 0,
    world_size: int = 1,
    tokenizer=None,
    eval_batches: int = 50,
) -> Task:
    from glassformer.data.batching import LMBatches
    from glassformer.data.batching import eval_batches as eval_windows
    from glassformer.data.tokenizers import train_tokenizer

    train_text, val_text, test_text, description = load_splits(opts)
    if not val_text:
        raise ValueError("the validation split is empty; give more text")
    tok = tokenizer or train_tokenizer(
        opts.tokenizer, [train_text], vocab_size=opts.vocab_size, lowercase=opts.lowercase
    )
    train_ids = torch.tensor(tok.encode(train_text), dtype=torch.long)
    val_ids = torch.tensor(tok.encode(val_text), dtype=torch.long)
    if len(train_ids) <= block_size + 1 or len(val_ids) <= block_size + 1:
        raise ValueError(
            f"need more than {block_size + 1} tokens in each split for --block-size {block_size}; "
            f"got {len(train_ids)} training and {len(val_ids)} validation tokens"
        )
    config = GPTConfig.preset(
        preset,
        **{
            "vocab_size": tok.vocab_size,
            "max_len": block_size,
            "pad_id": tok.pad_id,
            **model_overrides,
        },
    )
    model = GPT(config)
    batches = LMBatches(
        train_ids, block_size, batch_size, seed=seed, rank=rank, world_size=world_size
    )
    # the same windows however many processes share the global batch
    global_batch = batch_size * world_size
    val_windows = list(eval_windows(val_ids, block_size, global_batch, max_batches=eval_batches))
    loss_fn = loss_for("lm")

    def evaluate(m: nn.Module) -> dict[str, float]:
        return {"val_loss": mean_loss(m, loss_fn, val_windows)}

    def test(m: nn.Module) -> dict[str, float]:
        """Loss over every window of the validation and test splits."""
        out = {"val_loss_full": mean_loss(m, loss_fn, eval_windows(val_ids, block_size, 64))}
        if len(test_text) > block_size + 1:
            test_ids = torch.tensor(tok.encode(test_text), dtype=torch.long)
            out["test_loss"] = mean_loss(m, loss_fn, eval_windows(test_ids, block_size, 64))
        return out

    def show(m: nn.Module) -> str:
        prompt = val_text[: min(32, len(val_text))]
        device = device_of(m)
        ids = torch.tensor([tok.encode(prompt)], device=device)
        g = torch.Generator(device).manual_seed(seed)
        out = m.generate(ids, 300, do_sample=True, temperature=0.8, top_k=50, generator=g)
        return f"prompt: {prompt!r}\n{tok.decode(out[0].tolist())}"

    return Task(
        "lm",
        tok,
        model,
        batches,
        loss_fn,
        evaluate,
        show,
        "tok",
        {"tokenizer.json": _tokenizer_bytes(tok)},
        description,
        test=test,
    )


# ---- translation ----------------------------------------------------------------------


def translate_task(
    opts: DataOptions,
    *,
    preset: str,
    batch_size: int,
    seed: int,
    model_overrides: dict[str, Any],
    rank: int = 0,
    world_size: int = 1,
    max_len: int = 128,
    tokenizer=None,
    label_smoothing: float = 0.1,
    show_count: int = 5,
) -> Task:
    from glassformer.data.batching import BucketBatches, collate_pairs
    from glassformer.data.tokenizers import train_tokenizer

    train_rows, val_rows, test_rows, description = load_splits(opts)
    if opts.max_examples:
        train_rows = train_rows[: opts.max_examples]
    texts = [s for pair in train_rows for s in pair]
    tok = tokenizer or train_tokenizer(
        opts.tokenizer, texts, vocab_size=opts.vocab_size, lowercase=opts.lowercase
    )

    def encode(rows):
        src = tok.encode_batch([s for s, _ in rows])
        tgt = tok.encode_batch([t for _, t in rows])
        # One position each side is for BOS/EOS; longer pairs are dropped, not cut.
        return [
            (s, t)
            for s, t in zip(src, tgt, strict=True)
            if 0 < len(s) <= max_len and 0 < len(t) < max_len
        ]

    train_pairs, val_pairs = encode(train_rows), encode(val_rows)
    if not train_pairs:
        raise ValueError(f"no training pair fits in max_len={max_len} tokens")
    config = Seq2SeqConfig.preset(
        preset,
        **{
            "src_vocab_size": tok.vocab_size,
            "tgt_vocab_size": tok.vocab_size,
            "max_len": max_len + 1,
            "pad_id": tok.pad_id,
            "bos_id": tok.bos_id,
            "eos_id": tok.eos_id,
            "share_embeddings": True,
            "tie_output": True,
            **model_overrides,
        },
    )
    model = Seq2SeqTransformer(config)

    def collate(pairs):
        return collate_pairs(pairs, tok.pad_id, tok.bos_id, tok.eos_id)

    buckets = BucketBatches(
        train_pairs,
        batch_size,
        key=lambda p: len(p[0]) + len(p[1]),
        seed=seed,
        rank=rank,
        world_size=world_size,
    )
    batches = _Mapped(buckets, collate)
    val_batches = [
        collate(b)
        for b in BucketBatches(
            val_pairs[:2000], batch_size, shuffle=False, key=lambda p: len(p[0]) + len(p[1]), seed=0
        )
    ]
    loss_fn = loss_for("translate", label_smoothing)
    plain_loss = loss_for("translate")

    def evaluate(m: nn.Module) -> dict[str, float]:
        return {"val_loss": mean_loss(m, plain_loss, val_batches)}

    def test(m: nn.Module) -> dict[str, float]:
        """sacreBLEU of greedy translations of the test split (or validation, if none)."""
        rows = test_rows or val_rows
        hyps = translate_texts(m, tok, [s for s, _ in rows], max_len=max_len)
        name = "test_bleu" if test_rows else "val_bleu"
        return {name: bleu(hyps, [t for _, t in rows]), f"{name}_sentences": len(rows)}

    def show(m: nn.Module) -> str:
        lines = []
        for src_text, tgt_text in val_rows[:show_count]:
            out = translate_texts(m, tok, [src_text], max_len=max_len)[0]
            lines += [f"source:    {src_text}", f"reference: {tgt_text}", f"model:     {out}", ""]
        return "\n".join(lines)

    return Task(
        "translate",
        tok,
        model,
        batches,
        loss_fn,
        evaluate,
        show,
        "tok",
        {"tokenizer.json": _tokenizer_bytes(tok)},
        description,
        test=test,
    )


# ---- classification -------------------------------------------------------------------


def classify_task(
    opts: DataOptions,
    *,
    preset: str,
    batch_size: int,
    seed: int,
    model_overrides: dict[str, Any],
    rank: int = 0,
    world_size: int = 1,
    max_len: int = 256,
    tokenizer=None,
    labels: list[str] | None = None,
    show_count: int = 6,
) -> Task:
    from glassformer.data.batching import BucketBatches, collate_labelled
    from glassformer.data.tokenizers import train_tokenizer

    train_rows, val_rows, test_rows, description = load_splits(opts)
    if opts.max_examples:
        train_rows = train_rows[: opts.max_examples]
    resumed = labels is not None
    labels = labels or sorted({label for _, label in train_rows})
    if len(labels) < 2:
        raise ValueError(f"classification needs at least 2 labels, found {labels}")
    label_id = {label: i for i, label in enumerate(labels)}
    _check_labels(opts, train_rows if resumed else val_rows, labels, resumed)
    tok = tokenizer or train_tokenizer(
        opts.tokenizer,
        [t for t, _ in train_rows],
        vocab_size=opts.vocab_size,
        lowercase=opts.lowercase,
    )

    def encode(rows):
        ids = tok.encode_batch([t for t, _ in rows])
        return [
            (truncate(i, max_len) or [tok.unk_id], label_id[y])
            for i, (_, y) in zip(ids, rows, strict=True)
        ]

    train_ex, val_ex = encode(train_rows), encode(val_rows)
    config = ClassifierConfig.preset(
        preset,
        **{
            "vocab_size": tok.vocab_size,
            "num_classes": len(labels),
            "max_len": max_len,
            "pad_id": tok.pad_id,
            **model_overrides,
        },
    )
    model = TransformerClassifier(config)

    def collate(examples):
        return collate_labelled([i for i, _ in examples], [y for _, y in examples], tok.pad_id)

    buckets = BucketBatches(
        train_ex, batch_size, key=lambda e: len(e[0]), seed=seed, rank=rank, world_size=world_size
    )
    batches = _Mapped(buckets, collate)
    val_batches = [
        collate(b)
        for b in BucketBatches(val_ex, 64, key=lambda e: len(e[0]), shuffle=False, seed=0)
    ]
    loss_fn = loss_for("classify")

    def evaluate(m: nn.Module) -> dict[str, float]:
        return score(m, val_batches, prefix="val_")

    def test(m: nn.Module) -> dict[str, float]:
        """Accuracy on the test split (or validation, if the data has none)."""
        prefix = "test_" if test_rows else "val_"
        rows = [r for r in (test_rows or val_rows) if r[1] in label_id]
        examples = encode(rows)
        batches = [
            collate(b)
            for b in BucketBatches(examples, 64, key=lambda e: len(e[0]), shuffle=False, seed=0)
        ]
        return {**score(m, batches, prefix=prefix), f"{prefix}examples": len(rows)}

    def show(m: nn.Module) -> str:
        lines = []
        texts = [t for t, _ in val_rows[:show_count]]
        for (text, gold), (pred, p) in zip(
            val_rows[:show_count],
            classify_texts(m, tok, labels, texts, max_len=max_len),
            strict=True,
        ):
            snippet = text[:90].replace("\n", " ") + ("..." if len(text) > 90 else "")
            mark = "ok" if pred == gold else "WRONG"
            lines.append(f"[{mark:>5}] {pred} ({p:.2f}) vs {gold}: {snippet}")
        return "\n".join(lines)

    extra = {
        "tokenizer.json": _tokenizer_bytes(tok),
        "labels.json": (json.dumps(labels, indent=1) + "\n").encode(),
    }
    return Task(
        "classify",
        tok,
        model,
        batches,
        loss_fn,
        evaluate,
        show,
        "ex",
        extra,
        description,
        test=test,
    )


def _check_labels(
    opts: DataOptions, rows: list[tuple[str, str]], labels: list[str], resumed: bool
) -> None:
    """Every label in ``rows`` must be one the classifier was (or is being) trained on."""
    unseen = sorted({label for _, label in rows} - set(labels))
    if not unseen:
        return
    source = opts.data or f"corpus {opts.corpus!r}"
    names = ", ".join(repr(label) for label in unseen)
    which = f"label {names}" if len(unseen) == 1 else f"labels {names}"
    where = (
        "was not seen in training" if resumed else "is only in the held-out rows, never in training"
    )
    if len(unseen) > 1:
        where = where.replace("was ", "were ").replace("is only", "are only")
    raise ValueError(f"{source}: {which} {where} (known: {', '.join(labels)})")


class _Mapped:
    """A resumable batch iterator with a collate function applied; endless (epochs repeat)."""

    def __init__(self, source, fn: Callable[[Any], Any]) -> None:
        self.source, self.fn = source, fn
        self._it: Iterator[Any] | None = None

    def __iter__(self):
        return self

    def __next__(self):
        while True:
            if self._it is None:
                self._it = iter(self.source)
            try:
                return self.fn(next(self._it))
            except StopIteration:
                self._it = None  # the source moves to its next epoch

    def state_dict(self) -> dict[str, Any]:
        return self.source.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.source.load_state_dict(state)
        self._it = None
